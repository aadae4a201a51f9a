//! The benches' kernels (`bench/kernels/batch.cu`), loaded from the PTX that the bundle's
//! `run.sh` compiles on the GPU machine and names in `PINNABLE_KERNELS_PTX`.

use std::ffi::{CString, c_void};

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, result, sys};
use pinnable::Device;

/// The loaded kernels of one device.
pub struct Kernels {
    read_sum: sys::CUfunction,
    spin: sys::CUfunction,
    busy: sys::CUfunction,
}

impl Kernels {
    /// Loads the kernels into `dev`'s context, or `None` (printing why) when
    /// `PINNABLE_KERNELS_PTX` is unset or the PTX does not load.
    pub fn load(dev: &Device) -> Option<Kernels> {
        let path = std::env::var("PINNABLE_KERNELS_PTX").ok()?;
        let ptx = match std::fs::read(&path) {
            Ok(mut bytes) => {
                bytes.push(0);
                bytes
            }
            Err(e) => {
                println!("kernels: cannot read {path}: {e}");
                return None;
            }
        };
        dev.cuda_context()?.bind_to_thread().ok()?;
        // SAFETY: `ptx` is a NUL-terminated PTX image; the module lives for the process.
        let module = match unsafe { result::module::load_data(ptx.as_ptr().cast()) } {
            Ok(m) => m,
            Err(e) => {
                println!("kernels: the PTX did not load: {:?}", e.0);
                return None;
            }
        };
        let get = |name: &str| {
            // SAFETY: the module was just loaded and is never unloaded.
            unsafe { result::module::get_function(module, CString::new(name).ok()?) }.ok()
        };
        Some(Kernels {
            read_sum: get("read_sum")?,
            spin: get("spin")?,
            busy: get("busy")?,
        })
    }

    /// Enqueues a read of `n` f32 values at `x` on `stream`, summed into the f32 at `out`.
    ///
    /// # Panics
    ///
    /// If the launch fails (a bench failure).
    pub fn read_sum(
        &self,
        stream: &CudaStream,
        x: sys::CUdeviceptr,
        n: usize,
        out: sys::CUdeviceptr,
    ) {
        let (mut x, mut n, mut out) = (x, n as u64, out);
        let mut params: [*mut c_void; 3] = [
            (&raw mut x).cast(),
            (&raw mut n).cast(),
            (&raw mut out).cast(),
        ];
        let blocks = (n as usize).div_ceil(256 * 8).clamp(1, 132 * 8) as u32;
        // SAFETY: the parameters match the kernel's signature and outlive the launch call; the
        // caller passes device addresses valid for `n` reads and one write.
        unsafe {
            result::launch_kernel(
                self.read_sum,
                (blocks, 1, 1),
                (256, 1, 1),
                0,
                stream.cu_stream(),
                &mut params,
            )
        }
        .expect("launch read_sum");
    }

    /// Enqueues `ns` nanoseconds of busy GPU time on `stream`.
    ///
    /// # Panics
    ///
    /// If the launch fails (a bench failure).
    pub fn spin(&self, stream: &CudaStream, ns: u64) {
        let mut ns = ns;
        let mut params: [*mut c_void; 1] = [(&raw mut ns).cast()];
        // SAFETY: one u64 parameter, as the kernel declares, alive during the call.
        unsafe {
            result::launch_kernel(
                self.spin,
                (1, 1, 1),
                (1, 1, 1),
                0,
                stream.cu_stream(),
                &mut params,
            )
        }
        .expect("launch spin");
    }

    /// Enqueues `iters` rounds of arithmetic on every thread of `blocks_per_sm` blocks of 256
    /// threads on each of `sms` multiprocessors, on `stream`.
    ///
    /// # Panics
    ///
    /// If the launch fails (a bench failure).
    pub fn busy(
        &self,
        stream: &CudaStream,
        sms: u32,
        blocks_per_sm: u32,
        iters: u64,
        out: sys::CUdeviceptr,
    ) {
        let (mut iters, mut out) = (iters, out);
        let mut params: [*mut c_void; 2] = [(&raw mut iters).cast(), (&raw mut out).cast()];
        // SAFETY: a u64 and a device address, as the kernel declares, alive during the call;
        // the kernel writes `out` only in a case that never happens, and it is a valid f32.
        unsafe {
            result::launch_kernel(
                self.busy,
                (sms * blocks_per_sm, 1, 1),
                (256, 1, 1),
                0,
                stream.cu_stream(),
                &mut params,
            )
        }
        .expect("launch busy");
    }
}

/// A consumer's side of a bench: the bench kernels (when they load), a compute stream of the
/// device's context, and the one f32 the reading kernel sums into (never read back).
pub struct Consumer {
    /// The kernels, or `None` without a PTX (the consumer then only waits and syncs).
    pub kernels: Option<Kernels>,
    /// The stream the consumer's work goes on.
    pub stream: Arc<CudaStream>,
    sum: CudaSlice<f32>,
}

impl Consumer {
    /// A fresh compute stream on `dev`, and the kernels if they load.
    ///
    /// # Panics
    ///
    /// If `dev` is not a CUDA device or the driver refuses (a bench failure).
    pub fn new(dev: &Device) -> Consumer {
        let ctx = dev.cuda_context().expect("context");
        ctx.bind_to_thread().expect("bind");
        let stream = ctx.new_stream().expect("stream");
        // SAFETY: one f32 the reading kernel sums into; never read back.
        let sum = unsafe { stream.alloc::<f32>(1) }.expect("alloc");
        Consumer {
            kernels: Kernels::load(dev),
            stream,
            sum,
        }
    }

    /// The device address `read_sum` adds into.
    pub fn sum_ptr(&self) -> sys::CUdeviceptr {
        self.sum.device_ptr(&self.stream).0
    }
}
