use crate::cuda::{Device, peer_access};
use crate::error::Result;
use crate::pin::Pinnable;
use crate::transfer::ToDevice;

/// How [`ToDevices`] reaches several devices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FanoutRoute {
    /// [`HostToEach`](FanoutRoute::HostToEach) for up to four devices; beyond, when
    /// every device can reach the first directly, [`HostThenPeer`](FanoutRoute::HostThenPeer), so
    /// host memory is not read once per device.
    #[default]
    Auto,
    /// One host-to-device copy per device, all at once.
    HostToEach,
    /// One host-to-device copy to the first device, then device-to-device copies from it.
    HostThenPeer,
}

/// Up to this many devices, [`FanoutRoute::Auto`] copies from the host to each. Measured at two
/// devices only (two H200s, NVLink between them, each on its own PCIe Gen5 x16 link: see
/// BENCHMARKS.md); the cut-over at four is not, and `benches/fanout` compares both routes at
/// every GPU of a machine.
pub(crate) const HOST_TO_EACH_MAX: usize = 4;

impl FanoutRoute {
    /// The route [`Auto`](FanoutRoute::Auto) takes for `devices`; other routes are returned as they are.
    pub fn resolve(self, devices: &[Device]) -> FanoutRoute {
        match self {
            FanoutRoute::Auto if devices.len() <= HOST_TO_EACH_MAX => FanoutRoute::HostToEach,
            FanoutRoute::Auto => {
                let first = devices[0].cuda_device("to_devices").ok();
                let all_peers =
                    devices[1..]
                        .iter()
                        .all(|d| match (first, d.cuda_device("to_devices")) {
                            (Some(f), Ok(d)) => peer_access(d, f),
                            _ => false,
                        });
                if all_peers {
                    FanoutRoute::HostThenPeer
                } else {
                    FanoutRoute::HostToEach
                }
            }
            other => other,
        }
    }
}

/// Moving one value to several devices. Implemented for every value that is both
/// [`Pinnable`] and [`ToDevice`] (a derived batch, the std containers, tensors).
///
/// # Routes
///
/// One batch to several devices: pinned once, then copied to each.
///
/// [`ToDevices::to_devices`] pins the batch once (already-pinned tensors are shared, so a
/// pinned batch costs nothing here) and then takes one of two [`FanoutRoute`]s:
/// - [`FanoutRoute::HostToEach`]: one host-to-device copy per device from the one pinned block, all at
///   once, each on its own device's copy stream. Every GPU has its own PCIe link, so the copies
///   run side by side until host memory bandwidth binds.
/// - [`FanoutRoute::HostThenPeer`]: one host-to-device copy to the first device, then
///   device-to-device copies from it, over NVLink where the devices can reach each other.
///
/// Every result's tensors carry their own ready event, on their own device. The pinned block is
/// not reused until every copy reading it has finished.
///
/// ```
/// use pinnable::{Device, Tensor, ToDevices};
///
/// let batch = vec![Tensor::from_vec(vec![1.5f32; 1024], &[32, 32])?];
/// let devices: Vec<Device> = (0..pinnable::Device::count())
///     .map(Device::cuda)
///     .collect::<pinnable::Result<_>>()?;
/// let copies = batch.to_devices(&devices, true)?;
/// assert_eq!(copies.len(), devices.len());
/// # Ok::<(), pinnable::Error>(())
/// ```
pub trait ToDevices: Pinnable + ToDevice {
    /// A copy of `self` on each of `devices`, in order, by [`FanoutRoute::Auto`].
    ///
    /// With `non_blocking = false` this returns once every copy is on its device; with `true`
    /// it returns at once, and every consumer waits for its own device's copy first. The source
    /// is untouched and may be overwritten as soon as this returns.
    ///
    /// # Errors
    ///
    /// As [`Pinnable::pin_memory`] and [`ToDevice::to_device`]. An error on one device drops
    /// the copies already made to the others; the source is intact.
    fn to_devices(&self, devices: &[Device], non_blocking: bool) -> Result<Vec<Self>> {
        self.to_devices_by(devices, non_blocking, FanoutRoute::Auto)
    }

    /// As [`to_devices`](Self::to_devices), by the given route.
    ///
    /// # Errors
    ///
    /// As [`to_devices`](Self::to_devices).
    fn to_devices_by(
        &self,
        devices: &[Device],
        non_blocking: bool,
        route: FanoutRoute,
    ) -> Result<Vec<Self>> {
        let Some(first) = devices.first() else {
            return Ok(Vec::new());
        };
        let pinned = self.pin_memory()?;
        let out: Vec<Self> = match route.resolve(devices) {
            FanoutRoute::HostThenPeer => {
                let on_first = pinned.to_device(first, true)?;
                let mut out = Vec::with_capacity(devices.len());
                for d in &devices[1..] {
                    if let (Ok(a), Ok(b)) =
                        (d.cuda_device("to_devices"), first.cuda_device("to_devices"))
                    {
                        peer_access(a, b);
                    }
                    out.push(on_first.to_device(d, true)?);
                }
                out.insert(0, on_first);
                out
            }
            _ => devices
                .iter()
                .map(|d| pinned.to_device(d, true))
                .collect::<Result<_>>()?,
        };
        if !non_blocking {
            for d in devices {
                d.synchronize()?;
            }
        }
        Ok(out)
    }
}

impl<T: Pinnable + ToDevice> ToDevices for T {}
