//! The pinned host allocator: page-locked blocks from a backend, cached for reuse.
//!
//! PLACEHOLDER IMPLEMENTATION: every `alloc` goes to the backend and every drop frees.
//! The public interface below is the one the rest of the crate relies on.

mod backend;

use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

pub use backend::BackendKind;

use crate::error::Result;

/// Something that completes later, such as a CUDA event recorded after a copy. A pinned block
/// is not reused or written while a fence recorded on it is incomplete.
pub trait Fence: Send + Sync {
    /// Whether the work is done. Must be cheap: it is polled.
    fn is_complete(&self) -> bool;
    /// Blocks until the work is done.
    fn wait(&self);
}

/// Which backend a pool takes page-locked memory from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendChoice {
    /// CUDA when a driver and device are present (chosen by size), `mlock` otherwise.
    #[default]
    Auto,
    /// Always `mmap` + `mlock`: page-locked, but not registered with any device.
    Mlock,
    /// Always `cuMemHostAlloc`.
    CudaHostAlloc,
    /// Always `mmap`, pre-fault, `cuMemHostRegister`.
    CudaHostRegister,
}

/// How a [`PinnedPool`] behaves.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PoolConfig {
    /// Most bytes handed out at once; `None` for no budget.
    pub max_bytes: Option<usize>,
    /// Most bytes kept cached for reuse; `None` for no cap.
    pub max_cached_bytes: Option<usize>,
    /// How long an allocation over budget waits for blocks to come back before failing.
    pub wait: Duration,
    /// Where page-locked memory comes from.
    pub backend: BackendChoice,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_bytes: None,
            max_cached_bytes: None,
            wait: Duration::from_secs(10),
            backend: BackendChoice::Auto,
        }
    }
}

/// A pool of page-locked host memory. Cheap to clone (shared).
#[derive(Clone)]
pub struct PinnedPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    config: PoolConfig,
    backends: backend::Backends,
    stats: Mutex<PoolStats>,
}

/// Counters of a [`PinnedPool`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Bytes in blocks handed out now (their capacities).
    pub in_use_bytes: usize,
    /// Bytes requested by the blocks handed out now.
    pub requested_bytes: usize,
}

impl fmt::Display for PoolStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "in use {} B (requested {} B)", self.in_use_bytes, self.requested_bytes)
    }
}

impl PinnedPool {
    /// A new pool with its own cache.
    pub fn new(config: PoolConfig) -> PinnedPool {
        PinnedPool {
            inner: Arc::new(PoolInner {
                backends: backend::Backends::new(config.backend),
                config,
                stats: Mutex::new(PoolStats::default()),
            }),
        }
    }

    /// The process-wide pool that [`Pinnable::pin_memory`](crate::Pinnable::pin_memory) uses.
    pub fn global() -> &'static PinnedPool {
        static GLOBAL: OnceLock<PinnedPool> = OnceLock::new();
        GLOBAL.get_or_init(|| PinnedPool::new(PoolConfig::default()))
    }

    /// The pool's configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.inner.config
    }

    /// A page-locked block of at least `bytes` bytes.
    ///
    /// # Errors
    ///
    /// [`Error::BudgetExceeded`](crate::Error::BudgetExceeded),
    /// [`Error::MemlockLimit`](crate::Error::MemlockLimit),
    /// [`Error::HostAlloc`](crate::Error::HostAlloc) or [`Error::Driver`](crate::Error::Driver).
    pub fn alloc(&self, bytes: usize) -> Result<PinnedBlock> {
        let capacity = backend::page_round(bytes.max(1));
        let (ptr, kind) = self.inner.backends.alloc(capacity)?;
        let mut s = self.inner.stats.lock().unwrap_or_else(|e| e.into_inner());
        s.in_use_bytes += capacity;
        s.requested_bytes += bytes;
        Ok(PinnedBlock {
            ptr,
            len: bytes,
            capacity,
            kind,
            uses: Mutex::new(Vec::new()),
            pool: self.inner.clone(),
        })
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PoolStats {
        self.inner.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Frees cached blocks whose uses have completed.
    pub fn trim(&self) {}

    /// Frees every cached block, waiting for pending uses first.
    pub fn empty_cache(&self) {}
}

/// A page-locked block handed out by a [`PinnedPool`]. Dropping it gives it back to the pool,
/// which reuses it only once every [`Fence`] recorded on it has completed.
pub struct PinnedBlock {
    ptr: NonNull<u8>,
    len: usize,
    capacity: usize,
    kind: BackendKind,
    uses: Mutex<Vec<Arc<dyn Fence>>>,
    pool: Arc<PoolInner>,
}

// SAFETY: the block owns its memory exclusively; the raw pointer is only a handle to it, and the
// list of fences is behind a mutex.
unsafe impl Send for PinnedBlock {}
// SAFETY: shared access hands out only the pointer and the fence list (mutex-guarded); reading or
// writing the bytes goes through `unsafe` methods whose callers uphold exclusivity.
unsafe impl Sync for PinnedBlock {}

impl PinnedBlock {
    /// The start of the block (page-aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes requested.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether zero bytes were requested.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes reserved (the size class), at least [`len`](Self::len).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Which backend the memory came from.
    pub fn backend(&self) -> BackendKind {
        self.kind
    }

    /// Records work (a copy) that reads or writes this block; the block is not reused, and
    /// [`wait_uses`](Self::wait_uses) does not return, until it completes.
    pub fn record_use(&self, fence: Arc<dyn Fence>) {
        let mut uses = self.uses.lock().unwrap_or_else(|e| e.into_inner());
        uses.retain(|f| !f.is_complete());
        uses.push(fence);
    }

    /// Blocks until every recorded use has completed.
    pub fn wait_uses(&self) {
        let uses = std::mem::take(&mut *self.uses.lock().unwrap_or_else(|e| e.into_inner()));
        for f in uses {
            f.wait();
        }
    }

    /// How many recorded uses are still running.
    pub fn pending_uses(&self) -> usize {
        let mut uses = self.uses.lock().unwrap_or_else(|e| e.into_inner());
        uses.retain(|f| !f.is_complete());
        uses.len()
    }

    /// The first `len` bytes.
    ///
    /// # Safety
    ///
    /// 1. Nothing writes the block while the slice lives (no `as_mut_slice`, no copy into it).
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `capacity >= len` bytes for the block's life; the caller
        // guarantees no concurrent writer.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The first `len` bytes, writable. Waits for recorded uses first.
    ///
    /// # Safety
    ///
    /// 1. No other reference to the bytes exists while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        self.wait_uses();
        // SAFETY: as `as_slice`; the caller guarantees exclusivity and pending copies are done.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PinnedBlock {
    fn drop(&mut self) {
        self.wait_uses();
        {
            let mut s = self.pool.stats.lock().unwrap_or_else(|e| e.into_inner());
            s.in_use_bytes -= self.capacity;
            s.requested_bytes -= self.len;
        }
        // SAFETY: the block came from this backend with this capacity and is freed once.
        unsafe { self.pool.backends.free(self.kind, self.ptr, self.capacity) };
    }
}

impl fmt::Debug for PinnedBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBlock")
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .field("backend", &self.kind)
            .finish()
    }
}
