//! CUDA: whether a driver and a device are there, devices with their copy stream, and events.
//!
//! Without a driver library every cudarc call panics, so nothing here calls into cudarc before
//! [`is_available`]'s probe (cached for the life of the process) has found the library, initialised
//! it and counted at least one device.

use std::fmt;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DriverError, result, sys};

use crate::error::{Error, Result};

#[cfg(feature = "dlpack")]
mod current;
mod event;
mod kernels;
mod pool;
mod probe;

#[cfg(feature = "dlpack")]
pub(crate) use current::KeepCurrent;
pub use event::Event;
pub(crate) use kernels::gather_kernels;
#[cfg(feature = "image")]
pub(crate) use kernels::image_kernels;
pub(crate) use kernels::{Function, Kernels, kernels, pack_kernels};
#[cfg(test)]
pub(crate) use probe::cuda_or_skip;
use probe::probed;
pub(crate) use probe::{device_count, is_available, unavailable_reason};

/// Where a value lives: host or a device. Cheap to clone.
#[derive(Clone)]
pub struct Device {
    kind: DeviceKind,
    /// candle's handle on the same GPU, when the `Device` was made from one: results that
    /// must be its tensors are made on it.
    #[cfg(feature = "candle-cuda")]
    pub(crate) framework: Option<candle_core::CudaDevice>,
}

#[derive(Clone)]
enum DeviceKind {
    Cpu,
    Cuda(Arc<CudaDevice>),
}

/// One CUDA device as this crate uses it: its primary context and a dedicated non-blocking
/// copy stream, shared by every `Device` handle with the same ordinal.
///
/// Two cudarc handles on the one primary context: `ctx`, the crate's own, with cudarc's event
/// tracking off (the crate orders every use of its buffers itself, and tracking would record
/// events on every copy and allocation); and `user`, cudarc's default with tracking on, the
/// only one handed out. cudarc keeps the tracking switch per handle, not per driver context, so
/// nothing a user reaches through [`Device::cuda_context`] or [`Device::copy_stream`] (or
/// another library's own handle, such as candle's) is untracked.
pub(crate) struct CudaDevice {
    pub(crate) ordinal: usize,
    /// Never handed out: its tracking is off.
    pub(crate) ctx: Arc<CudaContext>,
    /// Never handed out: a stream of `ctx`.
    pub(crate) copy_stream: Arc<CudaStream>,
    /// Never handed out: a stream of `ctx` that only waits and frees, where the device
    /// decoder's batches are freed (so that its streams never wait on another stream).
    #[cfg(feature = "image")]
    pub(crate) release_stream: Arc<CudaStream>,
    /// What users get.
    user: UserHandles,
    /// Where batch arenas come from; `None` where the driver refused a pool of our own (then
    /// the device's default pool, left as found).
    pool: Option<pool::MemPool>,
    name: String,
    total_memory: usize,
    events: Mutex<Vec<CudaEvent>>,
}

/// One `CudaDevice` per ordinal for the whole process.
static DEVICES: Mutex<Vec<Option<Arc<CudaDevice>>>> = Mutex::new(Vec::new());

/// Caches of device memory kept outside the device's pool (the device decoder's parked
/// states), each freed for an ordinal by [`Device::empty_cache`]. The parts that keep one
/// register it here, so this module names none of them.
static CACHES: Mutex<Vec<fn(usize)>> = Mutex::new(Vec::new());

/// Has [`Device::empty_cache`] call `free` with the device's ordinal, after the device's work
/// is done and before its pool is trimmed.
#[cfg(feature = "image")]
pub(crate) fn on_empty_cache(free: fn(usize)) {
    let mut caches = CACHES.lock().unwrap_or_else(|e| e.into_inner());
    if !caches.contains(&free) {
        caches.push(free);
    }
}

impl Device {
    /// The host.
    pub fn cpu() -> Device {
        Device {
            kind: DeviceKind::Cpu,
            #[cfg(feature = "candle-cuda")]
            framework: None,
        }
    }

    /// CUDA device `ordinal`, with its copy stream.
    ///
    /// # Errors
    ///
    /// [`Error::CudaUnavailable`] without a driver, without devices, or when `ordinal` is out of
    /// range; [`Error::Driver`] when the context or stream cannot be created.
    pub fn cuda(ordinal: usize) -> Result<Device> {
        let count = probed()?;
        if ordinal >= count {
            return Err(Error::CudaUnavailable {
                reason: format!("cuda:{ordinal} does not exist; the driver sees {count} device(s)"),
            });
        }
        let mut devices = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
        if devices.len() < count {
            devices.resize(count, None);
        }
        if let Some(dev) = &devices[ordinal] {
            return Ok(Device::from_cuda(dev.clone()));
        }
        let dev = Arc::new(CudaDevice::open(ordinal)?);
        devices[ordinal] = Some(dev.clone());
        Ok(Device::from_cuda(dev))
    }

    /// Whether this is the host.
    pub fn is_cpu(&self) -> bool {
        matches!(self.kind, DeviceKind::Cpu)
    }

    /// The CUDA ordinal, or `None` for the host.
    pub fn ordinal(&self) -> Option<usize> {
        match &self.kind {
            DeviceKind::Cpu => None,
            DeviceKind::Cuda(d) => Some(d.ordinal),
        }
    }

    /// The device's name as the driver reports it (`NVIDIA H200`), or `cpu`.
    pub fn name(&self) -> &str {
        match &self.kind {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda(d) => &d.name,
        }
    }

    /// Total device memory in bytes (0 for the host).
    pub fn total_memory(&self) -> usize {
        match &self.kind {
            DeviceKind::Cpu => 0,
            DeviceKind::Cuda(d) => d.total_memory,
        }
    }

    /// Free device memory in bytes as the driver reports it now.
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] if the query fails; [`Error::WrongPlacement`] for the host.
    pub fn free_memory(&self) -> Result<usize> {
        let dev = self.cuda_device("free_memory")?;
        dev.ctx
            .mem_get_info()
            .map(|(free, _)| free)
            .map_err(|e| Error::driver("cuMemGetInfo", e))
    }

    /// Bytes of device memory in the pool batches are allocated from (batches moved here,
    /// pictures decoded here, packed batches built here): `(in use, reserved from the driver)`,
    /// where reserved counts what freed batches left cached for the next ones
    /// ([`empty_cache`](Self::empty_cache) returns it). Every loader of the process that
    /// delivers to this device draws from this pool, and no other library does. `(0, 0)` for
    /// the host.
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] if the query fails.
    pub fn pool_memory(&self) -> Result<(usize, usize)> {
        let DeviceKind::Cuda(d) = &self.kind else {
            return Ok((0, 0));
        };
        let Some(pool) = d.mem_pool() else {
            return Ok((0, 0));
        };
        let read = |attr| {
            let mut value = 0u64;
            // SAFETY: a live pool of this device; the byte-count attributes are u64s, written
            // into `value`, which outlives the call.
            unsafe { result::mem_pool::get_attribute(pool, attr, (&raw mut value).cast()) }
                .map(|()| value as usize)
                .map_err(|e| Error::driver("cuMemPoolGetAttribute", e))
        };
        Ok((
            read(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            read(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
        ))
    }

    /// The device's PCI address (`0000:17:00.0`), for reports; `None` for the host.
    pub fn pcie_bus_id(&self) -> Option<String> {
        let DeviceKind::Cuda(d) = &self.kind else {
            return None;
        };
        let bus = d.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?;
        let dev = d.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?;
        let dom = d.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?;
        Some(format!("{dom:04x}:{bus:02x}:{dev:02x}.0"))
    }

    /// A cudarc context of this device (its primary context), for cudarc work of your own:
    /// streams for [`Tensor::cuda_view`](crate::Tensor::cuda_view), kernels, allocations.
    ///
    /// It is cudarc's default kind of handle, with cudarc's event tracking on and already more
    /// than one stream: safe cudarc calls through it (and through streams and slices made from
    /// it) are ordered between streams by cudarc, as they would be in a program without this
    /// crate. The crate's own copies go through a handle of their own, which is never handed
    /// out (see `SAFETY.md`).
    pub fn cuda_context(&self) -> Option<&Arc<CudaContext>> {
        match &self.kind {
            DeviceKind::Cpu => None,
            DeviceKind::Cuda(d) => Some(&d.user.ctx),
        }
    }

    /// The dedicated copy stream that every transfer to or from this device is issued on, as a
    /// stream of [`cuda_context`](Self::cuda_context): work enqueued on it runs in order with
    /// the copies (a wait on it waits for them; a kernel on it delays them).
    pub fn copy_stream(&self) -> Option<&Arc<CudaStream>> {
        match &self.kind {
            DeviceKind::Cpu => None,
            DeviceKind::Cuda(d) => Some(&d.user.copy_stream),
        }
    }

    /// Blocks until every copy issued to this device so far has completed.
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] if the stream reports an error.
    pub fn synchronize(&self) -> Result<()> {
        match &self.kind {
            DeviceKind::Cpu => Ok(()),
            DeviceKind::Cuda(d) => d
                .copy_stream
                .synchronize()
                .map_err(|e| Error::driver("cuStreamSynchronize", e)),
        }
    }

    /// Returns device memory that freed batches left cached in the device's memory pool to the
    /// driver (like `torch.cuda.empty_cache()`), with the decoding state the device decoder
    /// keeps for the next epoch's threads; memory still in use is untouched. Waits for the
    /// context's work first (batches are freed in the order of the stream that made them).
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] if the driver refuses; [`Error::WrongPlacement`] for the host.
    pub fn empty_cache(&self) -> Result<()> {
        let dev = self.cuda_device("empty_cache")?;
        // Batches are freed in the order of the stream that made them (the copy stream, or a
        // device decoder's): wait for every stream of the context, so that those frees are done.
        dev.ctx
            .synchronize()
            .map_err(|e| Error::driver("cuCtxSynchronize", e))?;
        let caches = CACHES.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if !caches.is_empty() {
            for free in caches {
                free(dev.ordinal);
            }
            // What they freed is freed in their streams' order.
            dev.ctx
                .synchronize()
                .map_err(|e| Error::driver("cuCtxSynchronize", e))?;
        }
        if let Some(pool) = dev.mem_pool() {
            // SAFETY: the pool belongs to this device and outlives the call.
            unsafe { result::mem_pool::trim_to(pool, 0) }
                .map_err(|e| Error::driver("cuMemPoolTrimTo", e))?;
        }
        Ok(())
    }

    pub(crate) fn cuda_device(&self, op: &'static str) -> Result<&Arc<CudaDevice>> {
        match &self.kind {
            DeviceKind::Cuda(d) => Ok(d),
            DeviceKind::Cpu => Err(Error::WrongPlacement {
                op,
                needs: "a CUDA device",
                placement: "cpu".into(),
            }),
        }
    }

    pub(crate) fn from_cuda(dev: Arc<CudaDevice>) -> Device {
        Device {
            kind: DeviceKind::Cuda(dev),
            #[cfg(feature = "candle-cuda")]
            framework: None,
        }
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.ordinal() == other.ordinal()
    }
}

impl Eq for Device {}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            DeviceKind::Cpu => f.write_str("cpu"),
            DeviceKind::Cuda(d) => write!(f, "cuda:{}", d.ordinal),
        }
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            DeviceKind::Cpu => f.write_str("Device(cpu)"),
            DeviceKind::Cuda(d) => write!(f, "Device(cuda:{}, {:?})", d.ordinal, d.name),
        }
    }
}

impl CudaDevice {
    fn open(ordinal: usize) -> Result<CudaDevice> {
        let ctx =
            CudaContext::new(ordinal).map_err(|e| Error::driver("cuDevicePrimaryCtxRetain", e))?;
        // SAFETY: this handle is the crate's alone (`CudaDevice::ctx`, never handed out, nor
        // anything made through it: the copy stream, device buffers' slices), and the crate
        // orders every use of its device buffers itself: copies record a ready event that
        // consumers wait on, views are ordered on their one stream, and a buffer is freed on
        // the copy stream only after that stream has waited on every recorded reader (see
        // `tensor::DeviceBuffer`). Other handles on the same primary context, ours for users
        // included, keep cudarc's tracking: the switch belongs to this handle only.
        unsafe { ctx.disable_event_tracking() };
        let copy_stream = ctx
            .new_stream()
            .map_err(|e| Error::driver("cuStreamCreate", e))?;
        #[cfg(feature = "image")]
        let release_stream = ctx
            .new_stream()
            .map_err(|e| Error::driver("cuStreamCreate", e))?;
        let user = UserHandles::open(ordinal, &copy_stream)?;
        let name = ctx.name().unwrap_or_else(|_| format!("cuda:{ordinal}"));
        let total_memory = ctx.total_mem().unwrap_or(0);
        Ok(CudaDevice {
            #[cfg(feature = "image")]
            release_stream,
            ordinal,
            ctx,
            copy_stream,
            user,
            pool: pool::MemPool::create(ordinal),
            name,
            total_memory,
            events: Mutex::new(Vec::new()),
        })
    }

    /// A new stream of the crate's context for the calling thread's own work (a worker's
    /// decoding or packing), the context bound to the thread first.
    pub(crate) fn thread_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        self.ctx
            .new_stream()
            .map_err(|e| Error::driver("cuStreamCreate", e))
    }

    /// The stream-ordered memory pool batch arenas come from: the crate's own, or the
    /// device's default one where the driver refused ours.
    fn mem_pool(&self) -> Option<sys::CUmemoryPool> {
        if let Some(pool) = &self.pool {
            return Some(pool.raw());
        }
        // SAFETY: the device handle is valid for the context's life.
        unsafe { result::device::get_default_mem_pool(self.ctx.cu_device()) }.ok()
    }

    /// `bytes` of device memory for a batch, allocated and later freed in the copy stream's
    /// order, from the crate's own pool (which keeps freed batches' memory cached for the next
    /// one) or the default pool.
    ///
    /// # Safety
    ///
    /// 1. The memory is uninitialised: nothing reads it before something writes it.
    pub(crate) unsafe fn alloc(
        &self,
        bytes: usize,
    ) -> std::result::Result<CudaSlice<u8>, DriverError> {
        match &self.pool {
            Some(pool) => {
                self.ctx.bind_to_thread()?;
                // SAFETY: the copy stream's context is current and is the pool's device's;
                // forwarded: nothing reads the memory before it is written.
                unsafe { pool.alloc(&self.copy_stream, bytes) }
            }
            // SAFETY: forwarded.
            None => unsafe { self.copy_stream.alloc::<u8>(bytes) },
        }
    }

    /// `bytes` of device memory allocated, and later freed, in `stream`'s order (a stream of
    /// this device's context that is not the copy stream: work that owns its own order), from
    /// the crate's pool or the default pool.
    ///
    /// # Safety
    ///
    /// 1. `stream` belongs to this device's context.
    /// 2. The memory is uninitialised: nothing reads it before something writes it.
    #[cfg(feature = "image")]
    pub(crate) unsafe fn alloc_on(
        &self,
        stream: &Arc<CudaStream>,
        bytes: usize,
    ) -> std::result::Result<CudaSlice<u8>, DriverError> {
        self.ctx.bind_to_thread()?;
        match &self.pool {
            // SAFETY: the context is current and the stream is its (caller); forwarded.
            Some(pool) => unsafe { pool.alloc(stream, bytes) },
            // SAFETY: forwarded.
            None => unsafe { stream.alloc::<u8>(bytes) },
        }
    }

    fn attribute(&self, attr: sys::CUdevice_attribute) -> Option<i32> {
        self.ctx.attribute(attr).ok()
    }

    /// An event recording a raw stream's current work (a stream another library owns).
    ///
    /// # Safety
    ///
    /// 1. As for [`Event::wait_on_raw`].
    #[cfg(feature = "dlpack")]
    pub(crate) unsafe fn record_raw(&self, stream: sys::CUstream) -> Result<CudaEvent> {
        let _current =
            KeepCurrent::bind(&self.ctx).map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        let event = self
            .ctx
            .new_event(None)
            .map_err(|e| Error::driver("cuEventCreate", e))?;
        // SAFETY: the event is live and of this context; the stream is valid (caller).
        unsafe { result::event::record(event.cu_event(), stream) }
            .map_err(|e| Error::driver("cuEventRecord", e))?;
        Ok(event)
    }
}

/// The handles on a device that users get: a cudarc context of the primary context with
/// cudarc's event tracking on, and the crate's copy stream as one of its streams.
struct UserHandles {
    ctx: Arc<CudaContext>,
    copy_stream: Arc<CudaStream>,
    /// A stream of `ctx` kept open, so that cudarc is in its multi-stream mode from the start
    /// and orders every slice made through `ctx` between streams (in its single-stream mode it
    /// orders nothing, assuming all work is on one stream, which the copy stream is not).
    _second: Arc<CudaStream>,
}

impl UserHandles {
    fn open(ordinal: usize, copy_stream: &CudaStream) -> Result<UserHandles> {
        let ctx =
            CudaContext::new(ordinal).map_err(|e| Error::driver("cuDevicePrimaryCtxRetain", e))?;
        let second = ctx
            .new_stream()
            .map_err(|e| Error::driver("cuStreamCreate", e))?;
        // SAFETY: the copy stream is a stream of this same primary context, and it lives for
        // the rest of the process: the `CudaDevice` that owns it is only ever made by
        // `Device::cuda`, which keeps it in `DEVICES` for good. Work through the wrapper runs on
        // that stream in order with the crate's copies, which is all the sharing there is.
        let copy_stream = unsafe { ctx.wrap_borrowed_stream(copy_stream.cu_stream()) };
        Ok(UserHandles {
            ctx,
            copy_stream,
            _second: second,
        })
    }
}

/// Whether `from` can read `to`'s memory directly (NVLink or PCIe peer to peer), enabling it the
/// first time it is asked for a pair: for the context, and for `to`'s memory pool. Peer copies work without it, staged through the host by
/// the driver; with it they take the direct link.
pub(crate) fn peer_access(from: &CudaDevice, to: &CudaDevice) -> bool {
    static ENABLED: Mutex<Vec<(usize, usize, bool)>> = Mutex::new(Vec::new());
    let key = (from.ordinal, to.ordinal);
    let mut known = ENABLED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, _, ok)) = known.iter().find(|k| (k.0, k.1) == key) {
        return ok;
    }
    let mut can = 0;
    // SAFETY: both device handles are valid for the contexts' lives; `can` outlives the call.
    let asked =
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, from.ctx.cu_device(), to.ctx.cu_device()) };
    let enable = || {
        // SAFETY: `from`'s context is current (bound just before); `to`'s context is alive;
        // the flags must be 0.
        let r = unsafe { sys::cuCtxEnablePeerAccess(to.ctx.cu_ctx(), 0) };
        matches!(
            r,
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        )
    };
    // Batch arenas come from `to`'s stream-ordered memory pool, whose memory peers may read
    // only once the pool grants them access (the context-wide switch above does not cover it).
    let grant_pool = || {
        let Some(pool) = to.mem_pool() else {
            return false;
        };
        let desc = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: from.ordinal as i32,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the pool belongs to `to`'s device and outlives the call; one descriptor.
        let r = unsafe { sys::cuMemPoolSetAccess(pool, &desc, 1) };
        r == sys::CUresult::CUDA_SUCCESS
    };
    let ok = asked == sys::CUresult::CUDA_SUCCESS
        && can == 1
        && from.ctx.bind_to_thread().is_ok()
        && enable()
        && grant_pool();
    known.push((key.0, key.1, ok));
    ok
}

/// The driver and its devices, asked without a device in hand.
impl Device {
    /// Whether a CUDA driver is loaded and sees at least one device. Never panics: without
    /// a driver library it is `false`.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::Device;
    ///
    /// let device = if Device::is_available() { Device::cuda(0)? } else { Device::cpu() };
    /// println!("{} CUDA device(s); batches go to {device}", Device::count());
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn is_available() -> bool {
        is_available()
    }

    /// How many CUDA devices the driver sees; 0 without a driver.
    pub fn count() -> usize {
        device_count()
    }

    /// Why CUDA is unavailable (no driver library, no device, a driver error), or `None` when
    /// it is available.
    pub fn unavailable_reason() -> Option<String> {
        unavailable_reason()
    }

    /// Whether the gather kernels run on this device: `Ok(())`, or why not (loading them if no
    /// move has yet). Moves never fail for their absence; they take the copy engine and host
    /// staging. `PINNABLE_GATHER_KERNELS=0` turns them off.
    ///
    /// # Errors
    ///
    /// The reason, for the host, for a device without the kernels.
    ///
    /// # Examples
    ///
    /// ```
    /// if let Ok(device) = pinnable::Device::cuda(0) {
    ///     match device.gather_kernels() {
    ///         Ok(()) => println!("small pieces are gathered by the GPU's SMs"),
    ///         Err(why) => println!("no gather kernels: {why}"),
    ///     }
    /// }
    /// ```
    pub fn gather_kernels(&self) -> std::result::Result<(), String> {
        gather_kernels(self)
    }
}
