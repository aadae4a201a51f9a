//! The pinned host allocator: page-locked blocks from a backend, cached for reuse.
//!
//! - [`size_class`](rounded_size): requests round to whole pages, then to one of 8 classes per
//!   power of two (at most 1/8 waste); a reused block is never smaller than asked.
//! - backends: `cuMemHostAlloc`, `cuMemHostRegister` over `mmap`'d memory pre-faulted by
//!   several threads (for blocks of at least [`PoolConfig::register_threshold`]), and, without
//!   CUDA, `mmap` + `mlock` (page-locked, but registered with no device).
//! - the pool: per-class LIFO free lists, each behind its own mutex; no OS or driver call
//!   (`mmap`, `mlock`, `cuMemHostAlloc`, `cuMemHostRegister`, frees) while any lock is held.
//! - stream safety: a dropped block whose recorded [`Fence`]s are incomplete waits on a pending
//!   list, polled on allocation, on every block's return and on [`PinnedPool::stats`], and is
//!   reused only once they complete; dropping never blocks.
//! - limits: a byte budget ([`PoolConfig::max_bytes`]) with a bounded wait, a cap on cached
//!   bytes, [`PinnedPool::trim`] and [`PinnedPool::empty_cache`].
//! - [`PoolStats`]: in use, cached, pending, peak, hits, misses, backend calls and their times.
//!
//! ```
//! use pinnable::{PinnedPool, PoolConfig};
//!
//! let pool = PinnedPool::new(PoolConfig::default().max_bytes(64 << 20));
//! let block = pool.alloc(16 << 10)?;
//! assert!(block.capacity() >= block.len());
//! drop(block);
//! let again = pool.alloc(16 << 10)?; // served from the cache
//! assert_eq!(pool.stats().hits, 1);
//! # drop(again);
//! # Ok::<(), pinnable::Error>(())
//! ```

mod backend;
mod block;
mod pool;
mod size_class;
mod stats;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use backend::BackendKind;
pub(crate) use backend::{memlock_limit, raise_memlock_limit};
pub use block::PinnedBlock;
pub use pool::PinnedPool;
pub(crate) use size_class::rounded_size;
pub use stats::PoolStats;

/// Something that completes later, such as a CUDA event recorded after a copy. A pinned block
/// is not reused or written while a fence recorded on it is incomplete.
pub trait Fence: Send + Sync {
    /// Whether the work is done. Must be cheap: it is polled.
    fn is_complete(&self) -> bool;
    /// Blocks until the work is done.
    fn wait(&self);
}

/// A CUDA event is the fence of the copy recorded before it.
impl Fence for crate::cuda::Event {
    fn is_complete(&self) -> bool {
        crate::cuda::Event::is_complete(self)
    }

    fn wait(&self) {
        // A failed copy is reported by the call that issued it or by the next synchronisation;
        // here only the ordering matters.
        let _ = self.synchronize();
    }
}

/// Which backend a pool takes page-locked memory from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendChoice {
    /// CUDA when a driver and device are present (`cuMemHostRegister` for blocks of at least
    /// [`PoolConfig::register_threshold`], `cuMemHostAlloc` below), `mlock` otherwise.
    #[default]
    Auto,
    /// Always `mmap` + `mlock`: page-locked, but not registered with any device.
    Mlock,
    /// Always `cuMemHostAlloc` (flags `PORTABLE`; never write-combined).
    CudaHostAlloc,
    /// Always `mmap`, pre-fault in parallel, `cuMemHostRegister` (flags `PORTABLE`).
    CudaHostRegister,
}

/// How a [`PinnedPool`] behaves. Build it from [`PoolConfig::default`] with the setters:
///
/// ```
/// use std::time::Duration;
/// use pinnable::{BackendChoice, PoolConfig};
///
/// let config = PoolConfig::default()
///     .max_bytes(8 << 30)
///     .max_cached_bytes(2 << 30)
///     .wait(Duration::from_millis(500))
///     .backend(BackendChoice::Auto);
/// assert_eq!(config.max_bytes, Some(8 << 30));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PoolConfig {
    /// Most bytes the pool holds from its backends at once (handed out, pending and cached);
    /// `None` for no budget. The pool never exceeds it.
    pub max_bytes: Option<usize>,
    /// Most bytes kept cached for reuse; blocks coming back beyond it are freed. `None` for
    /// no cap.
    pub max_cached_bytes: Option<usize>,
    /// How long an allocation over budget waits for blocks to come back before failing.
    pub wait: Duration,
    /// Where page-locked memory comes from.
    pub backend: BackendChoice,
    /// Under [`BackendChoice::Auto`] with CUDA, blocks of at least this many bytes use
    /// `cuMemHostRegister`, smaller ones `cuMemHostAlloc`. Default 8 MiB.
    pub register_threshold: usize,
    /// The NUMA node whose memory the pool's blocks should use (the node of the GPU they feed;
    /// see [`numa`](crate::numa)); `None` (the default) leaves placement to the OS. A pool
    /// placed on a node maps all of its memory itself (never `cuMemHostAlloc`, whose memory
    /// the driver places) and asks the kernel to prefer that node for it; where the kernel
    /// refuses (no NUMA support, or no such node), the memory is placed as usual.
    pub numa_node: Option<usize>,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_bytes: None,
            max_cached_bytes: None,
            wait: Duration::from_secs(10),
            backend: BackendChoice::Auto,
            register_threshold: 8 << 20,
            numa_node: None,
        }
    }
}

impl PoolConfig {
    /// The default configuration: no budget, no cache cap, a 10 s wait, [`BackendChoice::Auto`],
    /// an 8 MiB register threshold.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the byte budget ([`max_bytes`](PoolConfig#structfield.max_bytes)).
    pub fn max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = Some(bytes);
        self
    }

    /// Sets the cap on cached bytes ([`max_cached_bytes`](PoolConfig#structfield.max_cached_bytes)).
    pub fn max_cached_bytes(mut self, bytes: usize) -> Self {
        self.max_cached_bytes = Some(bytes);
        self
    }

    /// Sets how long an allocation over budget waits.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Sets the backend.
    pub fn backend(mut self, backend: BackendChoice) -> Self {
        self.backend = backend;
        self
    }

    /// Sets the size from which [`BackendChoice::Auto`] uses `cuMemHostRegister`.
    pub fn register_threshold(mut self, bytes: usize) -> Self {
        self.register_threshold = bytes;
        self
    }

    /// Places the pool's memory on NUMA node `node` ([`numa_node`](PoolConfig#structfield.numa_node)).
    pub fn numa_node(mut self, node: usize) -> Self {
        self.numa_node = Some(node);
        self
    }
}
