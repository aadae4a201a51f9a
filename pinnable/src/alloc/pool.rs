//! The caching pool: per-class free lists, the pending list of blocks still used by copies,
//! and the byte budget.
//!
//! Locks are held only to push or pop a list; every backend call (OS or driver) and every
//! fence poll happens with no lock held.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::backend::{BackendKind, Backends};
use super::block::PinnedBlock;
use super::size_class::{CLASS_COUNT, SizeClass};
use super::stats::{Counters, PoolStats};
use super::{Fence, PoolConfig};
use crate::error::{Error, Result};

/// A pool of page-locked host memory. Cheap to clone (clones share one cache).
///
/// # How it works
///
/// - [size classes](PinnedPool::rounded_size): requests round to whole pages, then to one of 8 classes per
///   power of two (at most 1/8 waste); a reused block is never smaller than asked.
/// - backends: `cuMemHostAlloc`, `cuMemHostRegister` over `mmap`'d memory pre-faulted by
///   several threads (for blocks of at least [`PoolConfig::register_threshold`]), and, without
///   CUDA, `mmap` + `mlock` (page-locked, but registered with no device).
/// - the pool: per-class LIFO free lists, each behind its own mutex; no OS or driver call
///   (`mmap`, `mlock`, `cuMemHostAlloc`, `cuMemHostRegister`, frees) while any lock is held.
/// - stream safety: a dropped block whose recorded [`Fence`]s are incomplete waits on a pending
///   list, polled on allocation, on every block's return, on [`stats`](PinnedPool::stats) and
///   when a loader's epoch ends, and is reused only once they complete; dropping never blocks.
/// - limits: a byte budget ([`PoolConfig::max_bytes`]) with a bounded wait, a cap on cached
///   bytes, [`PinnedPool::trim`] and [`PinnedPool::empty_cache`].
/// - [`PoolStats`]: in use, cached, pending, peak, hits, misses, backend calls and their times.
///
/// # Examples
///
/// ```
/// use pinnable::{PinnedPool, PoolConfig};
///
/// let pool = PinnedPool::new(PoolConfig::default().max_cached_bytes(1 << 30));
/// let block = pool.alloc(3000)?;
/// // SAFETY: nothing else reads or writes the fresh block.
/// unsafe { block.as_mut_slice() }.fill(7);
/// assert_eq!(block.len(), 3000);
/// drop(block);
/// pool.trim(); // give the idle block back to the OS
/// assert_eq!(pool.stats().reserved_bytes, 0);
/// # Ok::<(), pinnable::Error>(())
/// ```
#[derive(Clone)]
pub struct PinnedPool {
    pub(super) inner: Arc<PoolInner>,
}

/// A block's memory while the pool owns it.
pub(crate) struct RawBlock {
    pub(crate) ptr: NonNull<u8>,
    pub(crate) kind: BackendKind,
}

// SAFETY: a raw block is plain ownership of a backend allocation; whichever thread holds it
// may use or free it.
unsafe impl Send for RawBlock {}

/// A dropped block whose copies may still run.
struct Pending {
    raw: RawBlock,
    class: SizeClass,
    fences: Vec<Arc<dyn Fence>>,
}

/// Hit-path polls of the pending list happen on every this-many allocations.
const POLL_EVERY: usize = 16;

pub(crate) struct PoolInner {
    config: PoolConfig,
    backends: Backends,
    /// One LIFO free list per size class, each behind its own mutex.
    classes: Box<[Mutex<Vec<RawBlock>>]>,
    /// Dropped blocks waiting for their fences.
    pending: Mutex<Vec<Pending>>,
    /// Held while pending blocks are polled: the list is out of `pending` then, so a reader of
    /// the counters who must not see polled-but-done blocks as pending waits for it.
    polling: Mutex<()>,
    pub(crate) counters: Counters,
    tick: AtomicUsize,
    /// Bumped whenever memory comes back (a block dropped or cached, budget released), so a
    /// waiter can tell whether it missed a wake-up.
    returned: AtomicU64,
    waiters: AtomicUsize,
    wait_lock: Mutex<()>,
    wakeup: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl PinnedPool {
    /// A new pool with its own cache.
    pub fn new(config: PoolConfig) -> PinnedPool {
        let backends = Backends::new(config.backend, config.register_threshold, config.numa_node);
        Self::with_backends(config, backends)
    }

    /// A pool over the heap test double: every bit of the pool's logic, no OS or driver call.
    #[cfg(test)]
    pub(crate) fn heap(config: PoolConfig) -> PinnedPool {
        Self::with_backends(config, Backends::heap())
    }

    fn with_backends(config: PoolConfig, backends: Backends) -> PinnedPool {
        PinnedPool {
            inner: Arc::new(PoolInner {
                config,
                backends,
                classes: (0..CLASS_COUNT).map(|_| Mutex::new(Vec::new())).collect(),
                pending: Mutex::new(Vec::new()),
                polling: Mutex::new(()),
                counters: Counters::default(),
                tick: AtomicUsize::new(0),
                returned: AtomicU64::new(0),
                waiters: AtomicUsize::new(0),
                wait_lock: Mutex::new(()),
                wakeup: Condvar::new(),
            }),
        }
    }

    /// The process-wide pool that [`Pinnable::pin_memory`](crate::Pinnable::pin_memory) uses,
    /// with [`PoolConfig::default`].
    pub fn global() -> &'static PinnedPool {
        static GLOBAL: OnceLock<PinnedPool> = OnceLock::new();
        GLOBAL.get_or_init(|| PinnedPool::new(PoolConfig::default()))
    }

    /// The pool's configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.inner.config
    }

    /// A page-locked block of at least `bytes` bytes ([`len`](PinnedBlock::len) is `bytes`,
    /// [`capacity`](PinnedBlock::capacity) its [size class](PinnedPool::rounded_size)).
    ///
    /// A cached block of the class is reused (last freed first) when there is one; otherwise
    /// the backend allocates. Over the budget, completed pending blocks and then cached blocks
    /// are reclaimed, and then the call waits up to [`PoolConfig::wait`] for blocks to come
    /// back. Fresh blocks are zeroed by the OS or driver; reused blocks hold old data.
    ///
    /// # Errors
    ///
    /// [`Error::BudgetExceeded`] when the block does not fit in
    /// [`PoolConfig::max_bytes`] even after waiting;
    /// [`Error::MemlockLimit`] when `mlock` hits `ulimit -l`;
    /// [`Error::HostAlloc`] when the OS refuses memory; [`Error::Driver`] when CUDA does;
    /// [`Error::CudaUnavailable`] when a CUDA backend was chosen without a driver or device.
    pub fn alloc(&self, bytes: usize) -> Result<PinnedBlock> {
        let inner = &self.inner;
        let class = SizeClass::of(bytes).ok_or_else(|| Error::HostAlloc {
            requested: bytes,
            source: std::io::Error::other("request too large for a size class"),
        })?;
        if inner.counters.pending_blocks.load(Relaxed) > 0
            && inner.tick.fetch_add(1, Relaxed).is_multiple_of(POLL_EVERY)
        {
            inner.poll_pending(false);
        }
        let raw = match inner.pop(class) {
            Some(raw) => raw,
            None => inner.obtain(class)?,
        };
        inner.counters.hand_out(class.capacity, bytes);
        Ok(PinnedBlock::new(raw, bytes, class, self.inner.clone()))
    }

    /// A snapshot of the counters, taken after every pending block whose copies have completed
    /// has moved to the cache, so `pending_bytes` counts only blocks a copy may still read.
    /// Never waits on a copy: the poll asks each pending fence once (a poll another thread is
    /// running finishes first).
    pub fn stats(&self) -> PoolStats {
        {
            let _polling = lock(&self.inner.polling);
            self.inner.poll_pending_locked(false);
        }
        self.counters_now()
    }

    /// The counters as they are, without polling the pending list.
    fn counters_now(&self) -> PoolStats {
        let c = &self.inner.config;
        self.inner
            .counters
            .snapshot(c.max_bytes, c.max_cached_bytes)
    }

    /// Moves pending blocks whose copies completed to the cache, without waiting on a copy or
    /// on a poll another thread is running. The loader calls it when an epoch's threads end.
    pub(crate) fn reclaim(&self) {
        self.inner.poll_pending(false);
    }

    /// Frees every idle cached block (after moving pending blocks whose copies completed to the
    /// cache). Blocks still in use or still read by copies stay.
    pub fn trim(&self) {
        self.inner.poll_pending(false);
        self.inner.free_cached(usize::MAX);
    }

    /// Waits for every pending block's copies to complete, then frees every cached block.
    /// Afterwards the pool holds only the blocks handed out now.
    pub fn empty_cache(&self) {
        self.inner.drain_pending();
        self.inner.free_cached(usize::MAX);
    }
}

impl std::fmt::Debug for PinnedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedPool")
            .field("config", &self.inner.config)
            .field("stats", &self.counters_now())
            .finish()
    }
}

impl PoolInner {
    /// A cached block of `class`, last freed first.
    fn pop(&self, class: SizeClass) -> Option<RawBlock> {
        let raw = lock(&self.classes[class.index]).pop()?;
        self.counters.cached.fetch_sub(class.capacity, Relaxed);
        self.counters.hits.fetch_add(1, Relaxed);
        Some(raw)
    }

    /// A block for `class` after a cache miss: from the pending list, a fresh backend block
    /// within the budget, or one that came back while waiting.
    fn obtain(&self, class: SizeClass) -> Result<RawBlock> {
        if self.counters.pending_blocks.load(Relaxed) > 0 {
            self.poll_pending(false);
            if let Some(raw) = self.pop(class) {
                return Ok(raw);
            }
        }
        let cap = class.capacity;
        let Some(budget) = self.config.max_bytes else {
            self.counters.reserved.fetch_add(cap, Relaxed);
            return self.fresh(class);
        };
        let over = |waited| Error::BudgetExceeded {
            requested: cap,
            in_use: self.counters.reserved.load(Relaxed),
            budget,
            waited,
        };
        if cap > budget {
            return Err(over(Duration::ZERO));
        }
        let start = Instant::now();
        let mut waited = false;
        loop {
            let seen = self.returned.load(SeqCst);
            if self.try_reserve(cap, budget) {
                return self.fresh(class);
            }
            // Reclaim: pending blocks whose copies completed, then idle cached blocks.
            self.poll_pending(false);
            if let Some(raw) = self.pop(class) {
                return Ok(raw);
            }
            self.free_cached(budget.saturating_sub(cap));
            if self.try_reserve(cap, budget) {
                return self.fresh(class);
            }
            let elapsed = start.elapsed();
            if elapsed >= self.config.wait {
                return Err(over(elapsed));
            }
            if !waited {
                waited = true;
                self.counters.budget_waits.fetch_add(1, Relaxed);
            }
            // Pending blocks complete without telling anyone: poll them every millisecond.
            let mut slice = self.config.wait - elapsed;
            if self.counters.pending_blocks.load(Relaxed) > 0 {
                slice = slice.min(Duration::from_millis(1));
            }
            self.waiters.fetch_add(1, SeqCst);
            {
                let guard = lock(&self.wait_lock);
                if self.returned.load(SeqCst) == seen {
                    let _ = self.wakeup.wait_timeout(guard, slice);
                }
            }
            self.waiters.fetch_sub(1, SeqCst);
        }
    }

    /// Reserves `cap` bytes of the budget if they fit.
    fn try_reserve(&self, cap: usize, budget: usize) -> bool {
        self.counters
            .reserved
            .fetch_update(SeqCst, SeqCst, |r| {
                r.checked_add(cap).filter(|&n| n <= budget)
            })
            .is_ok()
    }

    /// A fresh block from the backend, its bytes already reserved. On failure the reservation
    /// is released; an OS refusal (e.g. the `mlock` limit) with blocks cached frees the cache
    /// and tries once more.
    fn fresh(&self, class: SizeClass) -> Result<RawBlock> {
        let cap = class.capacity;
        self.counters.misses.fetch_add(1, Relaxed);
        let kind = self.backends.kind_for(cap);
        let mut retried = false;
        loop {
            let start = Instant::now();
            match self.backends.alloc(kind, cap) {
                Ok(ptr) => {
                    self.counters.backend_alloc(start.elapsed());
                    return Ok(RawBlock { ptr, kind });
                }
                Err(Error::MemlockLimit { .. } | Error::HostAlloc { .. })
                    if !retried && self.counters.cached.load(Relaxed) > 0 =>
                {
                    retried = true;
                    self.free_cached(0);
                }
                Err(e) => {
                    self.counters.reserved.fetch_sub(cap, SeqCst);
                    self.signal();
                    return Err(e);
                }
            }
        }
    }

    /// A handed-out block came back (its counters already updated): cached, or pending while
    /// `fences` (already pruned of completed ones) run. Never blocks on a fence.
    /// Blocks returned earlier whose copies have completed since are polled here too (unless
    /// another thread is polling), so a pool that hands out nothing more still notices them.
    pub(crate) fn give_back(&self, raw: RawBlock, class: SizeClass, fences: Vec<Arc<dyn Fence>>) {
        let earlier = self.counters.pending_blocks.load(Relaxed) > 0;
        if fences.is_empty() {
            self.cache(raw, class);
        } else {
            self.counters.pending.fetch_add(class.capacity, Relaxed);
            self.counters.pending_blocks.fetch_add(1, Relaxed);
            lock(&self.pending).push(Pending { raw, class, fences });
        }
        if earlier {
            self.poll_pending(false);
        }
        self.signal();
    }

    /// Puts an idle block on its class's free list, or frees it beyond `max_cached_bytes`.
    fn cache(&self, raw: RawBlock, class: SizeClass) {
        let cap = class.capacity;
        let now = self.counters.cached.fetch_add(cap, Relaxed) + cap;
        if self.config.max_cached_bytes.is_some_and(|max| now > max) {
            self.counters.cached.fetch_sub(cap, Relaxed);
            self.release(raw, cap);
        } else {
            lock(&self.classes[class.index]).push(raw);
        }
        self.signal();
    }

    /// Wakes allocations waiting for the budget.
    fn signal(&self) {
        self.returned.fetch_add(1, SeqCst);
        if self.waiters.load(SeqCst) > 0 {
            let _guard = lock(&self.wait_lock);
            self.wakeup.notify_all();
        }
    }

    /// Returns a block's memory to its backend (no lock held) and its bytes to the budget.
    fn release(&self, raw: RawBlock, cap: usize) {
        let start = Instant::now();
        // SAFETY: the block came from this pool's backends with this capacity (its class),
        // and the pool owned it exclusively: it is freed once and never used again.
        unsafe { self.backends.free(raw.kind, raw.ptr, cap) };
        self.counters.backend_free(start.elapsed());
        self.counters.reserved.fetch_sub(cap, SeqCst);
    }

    /// Frees cached blocks, largest classes first, until at most `target` bytes are reserved
    /// (`usize::MAX`: every cached block). Pops under each list's lock, frees outside it.
    fn free_cached(&self, target: usize) {
        let everything = target == usize::MAX;
        let mut freed = false;
        for index in (0..CLASS_COUNT).rev() {
            if self.counters.cached.load(Relaxed) == 0 {
                break;
            }
            if !everything && self.counters.reserved.load(SeqCst) <= target {
                break;
            }
            let taken: Vec<RawBlock> = {
                let mut list = lock(&self.classes[index]);
                if list.is_empty() {
                    continue;
                }
                if everything {
                    std::mem::take(&mut *list)
                } else {
                    vec![list.remove(0)] // the coldest block of the class
                }
            };
            let cap = SizeClass::from_index(index).capacity;
            for raw in taken {
                self.counters.cached.fetch_sub(cap, Relaxed);
                self.release(raw, cap);
                freed = true;
            }
        }
        if freed {
            self.signal();
        }
    }

    /// Moves pending blocks whose fences all completed to the cache. Polls with no lock on the
    /// list held: the list is taken out, polled, and what still runs is put back. Skipped
    /// (unless `wait`) when another thread is polling.
    fn poll_pending(&self, wait: bool) {
        if self.counters.pending_blocks.load(Relaxed) == 0 {
            return;
        }
        let _polling = match self.polling.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) if wait => lock(&self.polling),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        self.poll_pending_locked(wait);
    }

    /// [`poll_pending`](Self::poll_pending) with the polling lock held.
    fn poll_pending_locked(&self, wait: bool) {
        if self.counters.pending_blocks.load(Relaxed) == 0 {
            return;
        }
        let list = match self.pending.try_lock() {
            Ok(mut g) => std::mem::take(&mut *g),
            Err(std::sync::TryLockError::Poisoned(e)) => std::mem::take(&mut *e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if wait => {
                std::mem::take(&mut *lock(&self.pending))
            }
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        let mut running = Vec::new();
        let mut done = Vec::new();
        for mut p in list {
            if wait {
                for f in p.fences.drain(..) {
                    f.wait();
                }
            } else {
                p.fences.retain(|f| !f.is_complete());
            }
            if p.fences.is_empty() {
                done.push(p);
            } else {
                running.push(p);
            }
        }
        if !running.is_empty() {
            lock(&self.pending).extend(running);
        }
        for p in done {
            self.counters.pending.fetch_sub(p.class.capacity, Relaxed);
            self.counters.pending_blocks.fetch_sub(1, Relaxed);
            self.cache(p.raw, p.class);
        }
    }

    /// Waits until no block is pending.
    fn drain_pending(&self) {
        while self.counters.pending_blocks.load(Relaxed) > 0 {
            self.poll_pending(true);
            if self.counters.pending_blocks.load(Relaxed) > 0 {
                // Another thread is polling the list it took out; let it put it back.
                std::thread::yield_now();
            }
        }
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        // Every block handed out holds the pool, so none is out now; pending blocks wait for
        // their copies (a pool is dropped rarely, and their memory must not be freed early).
        self.drain_pending();
        self.free_cached(usize::MAX);
    }
}

/// Sizes and limits, asked without a pool in hand.
impl PinnedPool {
    /// The bytes a pool reserves for a request of `bytes`: whole pages, then at most 1/8 more
    /// (8 size classes per power of two). Useful to size a
    /// [`PoolConfig::max_bytes`] budget.
    ///
    /// # Panics
    ///
    /// When the rounded size does not fit in `usize` (requests within a few pages of
    /// `usize::MAX`).
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::PinnedPool;
    ///
    /// let images = 33 * 3 * 224 * 224 * 4; // a batch of 33 f32 images
    /// let reserved = PinnedPool::rounded_size(images);
    /// assert!(reserved >= images && reserved <= images + images / 8 + 65536);
    /// ```
    pub fn rounded_size(bytes: usize) -> usize {
        super::rounded_size(bytes)
    }

    /// The soft locked-memory limit (`ulimit -l`) in bytes, `None` when unlimited or unknown.
    ///
    /// The [`Mlock`](BackendKind::Mlock) backend can lock at most this much (unless the
    /// process has `CAP_IPC_LOCK`); CUDA's backends are not bound by it.
    pub fn memlock_limit() -> Option<u64> {
        super::memlock_limit()
    }

    /// Raises the soft locked-memory limit to the hard limit, which any process may do, and
    /// returns the new soft limit (`None` when unlimited).
    ///
    /// # Errors
    ///
    /// [`Error::HostAlloc`] with the OS error when the limit cannot be read or set.
    pub fn raise_memlock_limit() -> Result<Option<u64>> {
        super::raise_memlock_limit()
    }
}
