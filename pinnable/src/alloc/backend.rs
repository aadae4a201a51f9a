//! Where page-locked memory comes from: `mmap` + `mlock`, `cuMemHostAlloc`, or `mmap` +
//! `cuMemHostRegister`.

use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{CudaContext, sys};

use super::BackendChoice;
use crate::cuda::Device;
use crate::error::{Error, Result};

/// The backend a block came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendKind {
    /// `mmap` + `mlock`: page-locked, but not registered with any CUDA device, so copies from it
    /// are staged by the driver. Used where there is no CUDA driver.
    Mlock,
    /// `cuMemHostAlloc` with `CU_MEMHOSTALLOC_PORTABLE`.
    CudaHostAlloc,
    /// `mmap`, pre-faulted, then `cuMemHostRegister` with `CU_MEMHOSTREGISTER_PORTABLE`.
    CudaHostRegister,
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::Mlock => "mlock",
            BackendKind::CudaHostAlloc => "cuMemHostAlloc",
            BackendKind::CudaHostRegister => "cuMemHostRegister",
        })
    }
}

/// The operating system's page size.
pub(crate) fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 { p as usize } else { 4096 }
    })
}

/// `bytes` rounded up to whole pages.
pub(crate) fn page_round(bytes: usize) -> usize {
    let p = page_size();
    bytes.div_ceil(p) * p
}

/// The backends a pool uses, resolved from its [`BackendChoice`].
pub(crate) struct Backends {
    choice: BackendChoice,
}

impl Backends {
    pub(crate) fn new(choice: BackendChoice) -> Self {
        Backends { choice }
    }

    fn resolve(&self) -> Result<BackendKind> {
        Ok(match self.choice {
            BackendChoice::Mlock => BackendKind::Mlock,
            BackendChoice::CudaHostAlloc => BackendKind::CudaHostAlloc,
            BackendChoice::CudaHostRegister => BackendKind::CudaHostRegister,
            BackendChoice::Auto if crate::cuda::is_available() => BackendKind::CudaHostAlloc,
            BackendChoice::Auto => BackendKind::Mlock,
        })
    }

    /// A fresh page-locked region of `capacity` bytes (a multiple of the page size).
    pub(crate) fn alloc(&self, capacity: usize) -> Result<(NonNull<u8>, BackendKind)> {
        let kind = self.resolve()?;
        let ptr = match kind {
            BackendKind::Mlock => mlock_alloc(capacity)?,
            BackendKind::CudaHostAlloc => cuda_host_alloc(capacity)?,
            BackendKind::CudaHostRegister => cuda_host_register(capacity)?,
        };
        Ok((ptr, kind))
    }

    /// Frees a region.
    ///
    /// # Safety
    ///
    /// 1. `ptr` came from `alloc` on a backend of kind `kind` with this `capacity`.
    /// 2. It is freed once, and nothing uses it afterwards.
    pub(crate) unsafe fn free(&self, kind: BackendKind, ptr: NonNull<u8>, capacity: usize) {
        match kind {
            // SAFETY: forwarded from the caller.
            BackendKind::Mlock => unsafe { munmap(ptr, capacity) },
            BackendKind::CudaHostAlloc => {
                if let Ok(ctx) = context() {
                    let _ = ctx.bind_to_thread();
                    // SAFETY: `ptr` came from cuMemHostAlloc and is freed once.
                    let _ = unsafe { cudarc::driver::result::free_host(ptr.as_ptr().cast()) };
                }
            }
            BackendKind::CudaHostRegister => {
                if let Ok(ctx) = context() {
                    let _ = ctx.bind_to_thread();
                    // SAFETY: `ptr` was registered by `cuda_host_register` and is unregistered once.
                    let _ = unsafe { sys::cuMemHostUnregister(ptr.as_ptr().cast()) };
                }
                // SAFETY: the mapping came from `mmap_populated` with this capacity.
                unsafe { munmap(ptr, capacity) };
            }
        }
    }
}

/// The context CUDA host allocations are made in (device 0's primary context; the memory is
/// portable to every context).
fn context() -> Result<Arc<CudaContext>> {
    let dev = Device::cuda(0)?;
    Ok(dev
        .cuda_context()
        .expect("a CUDA device has a context")
        .clone())
}

fn mmap_populated(capacity: usize) -> Result<NonNull<u8>> {
    // SAFETY: an anonymous private mapping with no address hint has no preconditions.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            capacity,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::HostAlloc {
            requested: capacity,
            source: std::io::Error::last_os_error(),
        });
    }
    NonNull::new(p.cast()).ok_or_else(|| Error::HostAlloc {
        requested: capacity,
        source: std::io::Error::other("mmap returned null"),
    })
}

/// # Safety
///
/// 1. `ptr`/`capacity` is a live mapping from `mmap_populated`, unmapped once.
unsafe fn munmap(ptr: NonNull<u8>, capacity: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { libc::munmap(ptr.as_ptr().cast(), capacity) };
}

fn memlock_limit() -> String {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return "unknown".into();
    }
    if lim.rlim_cur == libc::RLIM_INFINITY {
        "unlimited".into()
    } else {
        format!("{} bytes", lim.rlim_cur)
    }
}

fn mlock_alloc(capacity: usize) -> Result<NonNull<u8>> {
    let ptr = mmap_populated(capacity)?;
    // SAFETY: the range is the mapping just made.
    if unsafe { libc::mlock(ptr.as_ptr().cast(), capacity) } != 0 {
        let err = std::io::Error::last_os_error();
        // SAFETY: the mapping was just made and is not used elsewhere.
        unsafe { munmap(ptr, capacity) };
        return Err(match err.raw_os_error() {
            Some(libc::ENOMEM) | Some(libc::EPERM) | Some(libc::EAGAIN) => Error::MemlockLimit {
                requested: capacity,
                limit: memlock_limit(),
            },
            _ => Error::HostAlloc {
                requested: capacity,
                source: err,
            },
        });
    }
    Ok(ptr)
}

fn cuda_host_alloc(capacity: usize) -> Result<NonNull<u8>> {
    let ctx = context()?;
    ctx.bind_to_thread()
        .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
    // SAFETY: a context is current; PORTABLE makes the block usable from every context.
    let p = unsafe { cudarc::driver::result::malloc_host(capacity, sys::CU_MEMHOSTALLOC_PORTABLE) }
        .map_err(|e| Error::driver("cuMemHostAlloc", e))?;
    NonNull::new(p.cast()).ok_or_else(|| Error::HostAlloc {
        requested: capacity,
        source: std::io::Error::other("cuMemHostAlloc returned null"),
    })
}

fn cuda_host_register(capacity: usize) -> Result<NonNull<u8>> {
    let ctx = context()?;
    let ptr = mmap_populated(capacity)?;
    ctx.bind_to_thread()
        .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
    // SAFETY: the range is a live, page-aligned mapping of `capacity` bytes.
    let r = unsafe {
        sys::cuMemHostRegister_v2(
            ptr.as_ptr().cast(),
            capacity,
            sys::CU_MEMHOSTREGISTER_PORTABLE,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        // SAFETY: the mapping was just made and is not used elsewhere.
        unsafe { munmap(ptr, capacity) };
        return Err(Error::driver("cuMemHostRegister", cudarc::driver::DriverError(r)));
    }
    Ok(ptr)
}
