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
    /// `cuMemHostAlloc` with `CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP`: usable
    /// from every context, and mapped so the device reads it in place.
    CudaHostAlloc,
    /// `mmap`, pre-faulted, then `cuMemHostRegister` with `CU_MEMHOSTREGISTER_PORTABLE |
    /// CU_MEMHOSTREGISTER_DEVICEMAP`.
    CudaHostRegister,
    /// Ordinary heap memory, *not* page-locked: the test double the pool's own tests (and Miri)
    /// run on. Never chosen by a [`BackendChoice`].
    #[doc(hidden)]
    Heap,
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::Mlock => "mlock",
            BackendKind::CudaHostAlloc => "cuMemHostAlloc",
            BackendKind::CudaHostRegister => "cuMemHostRegister",
            BackendKind::Heap => "heap (test double)",
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

/// The backends a pool uses, resolved from its [`BackendChoice`].
pub(crate) struct Backends {
    choice: Source,
    /// Blocks at least this large use `cuMemHostRegister` under [`BackendChoice::Auto`].
    register_threshold: usize,
    /// The NUMA node fresh mappings are placed on, when set.
    node: Option<usize>,
}

#[derive(Clone, Copy)]
enum Source {
    Choice(BackendChoice),
    /// The heap test double (unit tests, Miri).
    #[cfg_attr(not(test), allow(dead_code))]
    Heap,
}

impl Backends {
    pub(crate) fn new(
        choice: BackendChoice,
        register_threshold: usize,
        node: Option<usize>,
    ) -> Self {
        Backends {
            choice: Source::Choice(choice),
            // The driver places `cuMemHostAlloc`'s memory where it likes: a pool bound to a
            // node maps (and places) all of its memory itself.
            register_threshold: if node.is_some() {
                0
            } else {
                register_threshold
            },
            node,
        }
    }

    /// Backends that hand out ordinary heap memory: the pool's logic without any OS or driver
    /// call, so it runs under Miri.
    #[cfg(test)]
    pub(crate) fn heap() -> Self {
        Backends {
            choice: Source::Heap,
            register_threshold: usize::MAX,
            node: None,
        }
    }

    /// Which backend a block of `capacity` bytes comes from. Never panics without a driver:
    /// `Auto` probes for CUDA (cached) before any driver call.
    pub(crate) fn kind_for(&self, capacity: usize) -> BackendKind {
        match self.choice {
            Source::Heap => BackendKind::Heap,
            Source::Choice(BackendChoice::Mlock) => BackendKind::Mlock,
            Source::Choice(BackendChoice::CudaHostAlloc) => BackendKind::CudaHostAlloc,
            Source::Choice(BackendChoice::CudaHostRegister) => BackendKind::CudaHostRegister,
            Source::Choice(BackendChoice::Auto) => {
                if !crate::cuda::is_available() {
                    BackendKind::Mlock
                } else if capacity >= self.register_threshold {
                    BackendKind::CudaHostRegister
                } else {
                    BackendKind::CudaHostAlloc
                }
            }
        }
    }

    /// A fresh page-locked region of `capacity` bytes (a multiple of the page size) from the
    /// backend of kind `kind`. Makes OS and driver calls: never call it while holding a lock.
    pub(crate) fn alloc(&self, kind: BackendKind, capacity: usize) -> Result<NonNull<u8>> {
        match kind {
            BackendKind::Mlock => mlock_alloc(capacity, self.node),
            BackendKind::CudaHostAlloc => cuda_host_alloc(capacity),
            BackendKind::CudaHostRegister => cuda_host_register(capacity, self.node),
            BackendKind::Heap => heap_alloc(capacity),
        }
    }

    /// Frees a region. Makes OS and driver calls: never call it while holding a lock.
    ///
    /// # Safety
    ///
    /// 1. `ptr` came from `alloc` with this `kind` and `capacity`.
    /// 2. It is freed once, and nothing uses it afterwards.
    pub(crate) unsafe fn free(&self, kind: BackendKind, ptr: NonNull<u8>, capacity: usize) {
        match kind {
            // SAFETY: forwarded from the caller (mlock blocks are whole mappings; munmap
            // unlocks them).
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
                // SAFETY: the mapping came from `mmap_anonymous` with this capacity.
                unsafe { munmap(ptr, capacity) };
            }
            // SAFETY: forwarded from the caller: `heap_alloc` made it with this capacity.
            BackendKind::Heap => unsafe { heap_free(ptr, capacity) },
        }
    }
}

fn heap_layout(capacity: usize) -> Result<std::alloc::Layout> {
    std::alloc::Layout::from_size_align(capacity.max(1), page_size()).map_err(|_| {
        Error::HostAlloc {
            requested: capacity,
            source: std::io::Error::other("size overflows a heap layout"),
        }
    })
}

fn heap_alloc(capacity: usize) -> Result<NonNull<u8>> {
    let layout = heap_layout(capacity)?;
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    NonNull::new(p).ok_or_else(|| Error::HostAlloc {
        requested: capacity,
        source: std::io::Error::from(std::io::ErrorKind::OutOfMemory),
    })
}

/// # Safety
///
/// 1. `ptr` came from `heap_alloc(capacity)` and is freed once.
unsafe fn heap_free(ptr: NonNull<u8>, capacity: usize) {
    let layout = heap_layout(capacity).expect("the layout was valid when allocated");
    // SAFETY: forwarded from the caller; same layout as the allocation.
    unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
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

/// An anonymous private read-write mapping; `MAP_POPULATE` faults every page in now.
fn mmap_anonymous(capacity: usize, populate: bool) -> Result<NonNull<u8>> {
    let populate = if populate { libc::MAP_POPULATE } else { 0 };
    // SAFETY: an anonymous private mapping with no address hint has no preconditions.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            capacity,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | populate,
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
/// 1. `ptr`/`capacity` is a live mapping from `mmap_anonymous`, unmapped once.
unsafe fn munmap(ptr: NonNull<u8>, capacity: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { libc::munmap(ptr.as_ptr().cast(), capacity) };
}

fn memlock_rlimit() -> Option<libc::rlimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid out-pointer.
    (unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } == 0).then_some(lim)
}

/// The soft locked-memory limit (`ulimit -l`) in bytes, `None` when unlimited or unknown.
///
/// The [`Mlock`](BackendKind::Mlock) backend can lock at most this much (unless the process
/// has `CAP_IPC_LOCK`); CUDA's backends are not bound by it.
pub(crate) fn memlock_limit() -> Option<u64> {
    memlock_rlimit()
        .filter(|l| l.rlim_cur != libc::RLIM_INFINITY)
        // `rlim_t` is `u64` on 64-bit Linux but narrower elsewhere.
        .map(|l| {
            #[allow(clippy::unnecessary_cast)]
            let cur = l.rlim_cur as u64;
            cur
        })
}

/// Raises the soft locked-memory limit to the hard limit, which any process may do, and
/// returns the new soft limit (`None` when unlimited).
///
/// # Errors
///
/// [`Error::HostAlloc`] with the OS error when the limit cannot be read or set.
pub(crate) fn raise_memlock_limit() -> Result<Option<u64>> {
    let os_err = |source| Error::HostAlloc {
        requested: 0,
        source,
    };
    let mut lim = memlock_rlimit().ok_or_else(|| os_err(std::io::Error::last_os_error()))?;
    if lim.rlim_cur != lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: `lim` is a valid, initialised rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) } != 0 {
            return Err(os_err(std::io::Error::last_os_error()));
        }
    }
    Ok(memlock_limit())
}

fn memlock_limit_words() -> String {
    match memlock_rlimit() {
        None => "unknown".into(),
        Some(l) if l.rlim_cur == libc::RLIM_INFINITY => "unlimited".into(),
        Some(l) => format!("{} bytes", l.rlim_cur),
    }
}

fn mlock_alloc(capacity: usize, node: Option<usize>) -> Result<NonNull<u8>> {
    // Placed on a node, the mapping is faulted in by `mlock`, after the placement.
    let ptr = mmap_anonymous(capacity, node.is_none())?;
    if let Some(node) = node {
        crate::numa::place(ptr.as_ptr(), capacity, node);
    }
    // SAFETY: the range is the mapping just made.
    if unsafe { libc::mlock(ptr.as_ptr().cast(), capacity) } != 0 {
        let err = std::io::Error::last_os_error();
        // SAFETY: the mapping was just made and is not used elsewhere.
        unsafe { munmap(ptr, capacity) };
        return Err(match err.raw_os_error() {
            Some(libc::ENOMEM) | Some(libc::EPERM) | Some(libc::EAGAIN) => Error::MemlockLimit {
                requested: capacity,
                limit: memlock_limit_words(),
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
    // PORTABLE makes the block usable from every context, and DEVICEMAP maps it for the device
    // (at the host address, on devices with unified addressing), so kernels can read it in
    // place. Never write-combined.
    let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
    // SAFETY: a context is current; the flags are valid for cuMemHostAlloc.
    let p = unsafe { cudarc::driver::result::malloc_host(capacity, flags) }
        .map_err(|e| Error::driver("cuMemHostAlloc", e))?;
    NonNull::new(p.cast()).ok_or_else(|| Error::HostAlloc {
        requested: capacity,
        source: std::io::Error::other("cuMemHostAlloc returned null"),
    })
}

/// Transparent huge pages are 2 MiB on x86-64 and most arm64 kernels.
const HUGE_PAGE: usize = 2 << 20;

/// A fresh mapping of `capacity` bytes starting on a 2 MiB boundary, marked for transparent huge
/// pages when it is at least that large: faulting it in then takes one fault per 2 MiB instead
/// of one per 4 KiB page, which is most of a large miss's cost. Falls back to a plain mapping.
fn mmap_huge(capacity: usize) -> Result<NonNull<u8>> {
    if capacity < HUGE_PAGE {
        return mmap_anonymous(capacity, false);
    }
    let Some(padded) = capacity.checked_add(HUGE_PAGE) else {
        return mmap_anonymous(capacity, false);
    };
    let raw = mmap_anonymous(padded, false)?;
    let start = raw.as_ptr() as usize;
    let aligned = start.next_multiple_of(HUGE_PAGE);
    let head = aligned - start;
    let tail = padded - head - capacity;
    // SAFETY: the head and tail are whole pages of the mapping just made, outside the part kept;
    // advising the kept part changes no contents.
    unsafe {
        if head > 0 {
            libc::munmap(start as *mut libc::c_void, head);
        }
        if tail > 0 {
            libc::munmap((aligned + capacity) as *mut libc::c_void, tail);
        }
        libc::madvise(aligned as *mut libc::c_void, capacity, libc::MADV_HUGEPAGE);
    }
    // SAFETY: `aligned` lies inside a live mapping, so it is not null.
    Ok(unsafe { NonNull::new_unchecked(aligned as *mut u8) })
}

fn cuda_host_register(capacity: usize, node: Option<usize>) -> Result<NonNull<u8>> {
    let ctx = context()?;
    let ptr = mmap_huge(capacity)?;
    if let Some(node) = node {
        crate::numa::place(ptr.as_ptr(), capacity, node);
    }
    // SAFETY: the mapping was just made, is `capacity` bytes and nothing else uses it.
    unsafe { prefault_parallel(ptr, capacity) };
    ctx.bind_to_thread()
        .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
    // SAFETY: the range is a live, page-aligned mapping of `capacity` bytes.
    let r = unsafe {
        sys::cuMemHostRegister_v2(
            ptr.as_ptr().cast(),
            capacity,
            sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        // SAFETY: the mapping was just made and is not used elsewhere.
        unsafe { munmap(ptr, capacity) };
        return Err(Error::driver(
            "cuMemHostRegister",
            cudarc::driver::DriverError(r),
        ));
    }
    Ok(ptr)
}

/// Below this a mapping is faulted in by one thread.
const PREFAULT_CHUNK: usize = 4 << 20;

/// Faults every page of a fresh mapping in, with several threads for large mappings (page
/// faults of one range serialise on little; the kernel zeroes pages in parallel). Registering
/// faulted memory with the driver is several times cheaper than letting it fault the pages.
///
/// # Safety
///
/// 1. `ptr`/`capacity` is a live, writable mapping that nothing else reads or writes yet.
unsafe fn prefault_parallel(ptr: NonNull<u8>, capacity: usize) {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(16)
        .min(capacity.div_ceil(PREFAULT_CHUNK))
        .max(1);
    let page = page_size();
    let per = capacity.div_ceil(threads).div_ceil(page) * page;
    let base = ptr.as_ptr() as usize;
    let touch = move |start: usize| {
        if start >= capacity {
            return;
        }
        let end = (start + per).min(capacity);
        // Ask the kernel to populate the range (Linux 5.14+); touch each page otherwise.
        // SAFETY: the range lies inside the caller's mapping.
        let r = unsafe {
            libc::madvise(
                (base + start) as *mut libc::c_void,
                end - start,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if r != 0 {
            for off in (start..end).step_by(page) {
                // SAFETY: inside the caller's writable mapping, which nothing else uses yet;
                // a volatile write makes sure the page is faulted in.
                unsafe { std::ptr::write_volatile((base + off) as *mut u8, 0) };
            }
        }
    };
    if threads == 1 {
        touch(0);
        return;
    }
    std::thread::scope(|s| {
        for t in 1..threads {
            s.spawn(move || touch(t * per));
        }
        touch(0);
    });
}
