//! A block handed out by the pool: page-locked bytes plus the fences of copies using them.

use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use super::Fence;
use super::backend::BackendKind;
use super::pool::{PoolInner, RawBlock};
use super::size_class::SizeClass;

/// A page-locked block handed out by a [`PinnedPool`](super::PinnedPool). Dropping it gives it
/// back to the pool, which reuses it only once every [`Fence`] recorded on it has completed.
/// Dropping never waits for those fences.
pub struct PinnedBlock {
    ptr: NonNull<u8>,
    len: usize,
    class: SizeClass,
    kind: BackendKind,
    uses: Mutex<Uses>,
    pool: Arc<PoolInner>,
}

/// The fences recorded on a block, and the count at which the completed ones are pruned next.
#[derive(Default)]
struct Uses {
    fences: Vec<Arc<dyn Fence>>,
    prune_at: usize,
}

// SAFETY: the block owns its memory exclusively; the raw pointer is only a handle to it, and the
// list of fences is behind a mutex.
unsafe impl Send for PinnedBlock {}
// SAFETY: shared access hands out only the pointer and the fence list (mutex-guarded); reading or
// writing the bytes goes through `unsafe` methods whose callers uphold exclusivity.
unsafe impl Sync for PinnedBlock {}

/// Completed fences are pruned when a block has recorded this many, or twice as many as the
/// last pruning left running: each pruning asks every fence, so a block read by many copies at
/// once (a pinned array that several devices gather from) costs at most two questions a copy
/// on average, not one for every copy still running.
const PRUNE_AT: usize = 8;

impl PinnedBlock {
    pub(crate) fn new(raw: RawBlock, len: usize, class: SizeClass, pool: Arc<PoolInner>) -> Self {
        PinnedBlock {
            ptr: raw.ptr,
            len,
            class,
            kind: raw.kind,
            uses: Mutex::new(Uses::default()),
            pool,
        }
    }

    fn uses(&self) -> std::sync::MutexGuard<'_, Uses> {
        self.uses.lock().unwrap_or_else(|e| e.into_inner())
    }

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
        self.class.capacity
    }

    /// Which backend the memory came from.
    pub fn backend(&self) -> BackendKind {
        self.kind
    }

    /// Whether the device can read the block in place, at its host address, through the
    /// driver's mapping of it (blocks of both CUDA backends; not `mlock`ed ones). The gather
    /// kernels read such blocks without a copy.
    pub fn is_device_mapped(&self) -> bool {
        matches!(
            self.kind,
            BackendKind::CudaHostAlloc | BackendKind::CudaHostRegister
        )
    }

    /// Records work (a copy) that reads or writes this block; the block is not reused, and
    /// [`wait_uses`](Self::wait_uses) does not return, until it completes.
    pub fn record_use(&self, fence: Arc<dyn Fence>) {
        let mut uses = self.uses();
        if uses.fences.len() >= uses.prune_at.max(PRUNE_AT) {
            uses.fences.retain(|f| !f.is_complete());
            uses.prune_at = 2 * uses.fences.len();
        }
        uses.fences.push(fence);
    }

    /// Blocks until every recorded use has completed.
    pub fn wait_uses(&self) {
        let uses = std::mem::take(&mut *self.uses());
        for f in uses.fences {
            f.wait();
        }
    }

    /// How many recorded uses are still running.
    pub fn pending_uses(&self) -> usize {
        let uses = self.uses().fences.clone();
        uses.iter().filter(|f| !f.is_complete()).count()
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
        let mut fences = std::mem::take(
            &mut self
                .uses
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .fences,
        );
        fences.retain(|f| !f.is_complete());
        self.pool.counters.take_back(self.class.capacity, self.len);
        let raw = RawBlock {
            ptr: self.ptr,
            kind: self.kind,
        };
        self.pool.give_back(raw, self.class, fences);
    }
}

impl fmt::Debug for PinnedBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBlock")
            .field("len", &self.len)
            .field("capacity", &self.class.capacity)
            .field("backend", &self.kind)
            .field("pending_uses", &self.pending_uses())
            .finish()
    }
}
