//! Issuing a move's copies on the copy stream, once the whole batch is reserved and placed.
//!
//! Direct copies (from registered pinned memory or another device) go first, merged where they
//! read and write neighbouring bytes. Staged bytes are gathered into the staging block by the
//! copy threads; as pieces land in order, they are sent to the device in runs of at least
//! [`chunk`] bytes, so the device copies start while staging goes on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;

use super::MoveContext;
use crate::alloc::{Fence, PinnedBlock};
use crate::batch::PART_ALIGN;
use crate::copy::{self, HostCopy};
use crate::cuda::{CudaDevice, Event};
use crate::error::{Error, Result};
use crate::tensor::{DeviceBuffer, Storage};

/// Staged bytes are sent to the device in copies of at least this many bytes (the last one
/// excepted): a quarter of the batch's staged bytes, between 1 and 8 MiB, so a small batch's
/// device copies also start while it is staged; or `PINNABLE_STAGE_CHUNK` bytes.
fn chunk(staged_bytes: usize) -> usize {
    static CHUNK: OnceLock<Option<usize>> = OnceLock::new();
    let forced = *CHUNK.get_or_init(|| {
        std::env::var("PINNABLE_STAGE_CHUNK")
            .ok()
            .and_then(|v| v.parse().ok())
    });
    forced.unwrap_or((staged_bytes / 4).clamp(1 << 20, 8 << 20))
}

/// Which way a direct copy goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Dir {
    /// From registered pinned memory to the target device.
    HtoD,
    /// From a device to pinned memory.
    DtoH,
    /// From another device to the target device.
    DtoD,
}

/// A copy the copy engine makes without staging.
pub(super) struct DirectCopy {
    pub(super) dir: Dir,
    pub(super) src: u64,
    pub(super) dst: u64,
    pub(super) bytes: usize,
    /// Identifies the source buffer: only copies from one buffer merge (two allocations may
    /// happen to be neighbours in memory, but no copy may span both).
    pub(super) src_id: usize,
    /// The source buffer, for device sources: peer copies name its device, and a copy issued on
    /// another device's stream is recorded as a reader of it.
    pub(super) src_buffer: Option<Arc<DeviceBuffer>>,
}

impl DirectCopy {
    fn src_device(&self) -> Option<&Arc<CudaDevice>> {
        self.src_buffer.as_ref().map(|b| &b.device)
    }

    /// Extends `self` over `next` when `next` continues it in both source and destination
    /// memory (with at most alignment padding between them).
    fn absorb(&mut self, next: &DirectCopy) -> bool {
        let end = self.src + self.bytes as u64;
        let mergeable = self.dir == next.dir
            && self.src_id == next.src_id
            && next.src >= end
            && next.src - end < PART_ALIGN as u64
            && next.src.wrapping_sub(self.src) == next.dst.wrapping_sub(self.dst);
        if mergeable {
            self.bytes = (next.src + next.bytes as u64 - self.src) as usize;
        }
        mergeable
    }
}

/// Everything a move will copy, and what must stay alive or wait for it.
#[derive(Default)]
pub(super) struct Copies {
    pub(super) direct: Vec<DirectCopy>,
    pub(super) staged: Vec<HostCopy>,
    /// Device address of each staged copy, and whether it lies in the arena (mergeable).
    pub(super) staged_dst: Vec<(u64, bool)>,
    /// Events the copy stream waits on first (sources still being filled).
    pub(super) waits: Vec<Arc<Event>>,
    /// Sources kept alive until the copies are issued.
    pub(super) keep: Vec<Arc<Storage>>,
    /// Pinned blocks the copies read or write: each gets the ready event.
    pub(super) blocks: Vec<Arc<PinnedBlock>>,
    /// How many of `direct` and `waits` are already issued.
    pub(super) direct_issued: usize,
    pub(super) waits_issued: usize,
}

impl Copies {
    /// Notes a pinned block a copy reads, once however many of its tensors move.
    pub(super) fn note_block(&mut self, block: &Arc<PinnedBlock>) {
        if !self.blocks.iter().rev().any(|b| Arc::ptr_eq(b, block)) {
            self.blocks.push(block.clone());
        }
    }

    fn is_empty(&self) -> bool {
        self.direct.is_empty() && self.staged.is_empty()
    }
}

impl MoveContext<'_> {
    /// The device whose copy stream carries this move: the target's, or for a move to the
    /// host, the first source's (`None` before any copy to the host is planned).
    fn stream_device(&self) -> Result<Option<Arc<CudaDevice>>> {
        Ok(match self.target.ordinal() {
            Some(_) => Some(self.target.cuda_device("to_device")?.clone()),
            None => self
                .copies
                .direct
                .first()
                .and_then(|c| c.src_device().cloned()),
        })
    }

    /// Issues the waits and direct copies planned so far and not yet issued. Called right
    /// after the reservation, it starts the mirrors' copies, which then run while the second
    /// walk places the tensors.
    pub(super) fn launch(&mut self) -> Result<()> {
        let c = &self.copies;
        if c.direct_issued == c.direct.len() && c.waits_issued == c.waits.len() {
            return Ok(());
        }
        let Some(dev) = self.stream_device()? else {
            return Ok(());
        };
        dev.ctx
            .bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        let c = &mut self.copies;
        for w in &c.waits[c.waits_issued..] {
            w.wait_on(&dev.copy_stream)?;
        }
        c.waits_issued = c.waits.len();
        // Counted as issued before the call: on an error some may have been enqueued, and
        // `fence_launched` must then guard every block they might read.
        let from = std::mem::replace(&mut c.direct_issued, c.direct.len());
        issue_direct(&dev, &c.direct[from..])
    }

    /// After an error once copies were launched: records their completion on every block they
    /// read or write, so the pool neither reuses nor hands out those blocks while they run.
    pub(super) fn fence_launched(&self) {
        if self.copies.direct_issued == 0 && self.copies.staged.is_empty() {
            return;
        }
        let Ok(Some(dev)) = self.stream_device() else {
            return;
        };
        match dev.record() {
            Ok(event) => {
                let event = Arc::new(event);
                for b in &self.copies.blocks {
                    b.record_use(event.clone() as Arc<dyn Fence>);
                }
                // Consumers may free what was moved apart once the failed batch is dropped.
                if self.consumers.iter().any(|s| event.wait_on(s).is_err()) {
                    let _ = dev.copy_stream.synchronize();
                }
            }
            // Without an event to record, wait for the copies here instead.
            Err(_) => {
                let _ = dev.copy_stream.synchronize();
            }
        }
    }

    /// Issues every copy not yet issued, records the ready event and hands it to the results.
    pub(super) fn issue(mut self) -> Result<()> {
        if self.copies.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.launch() {
            self.fence_launched();
            return Err(e);
        }
        let dev = self.stream_device()?.expect("copies are planned");
        let copies = &self.copies;
        if !copies.staged.is_empty()
            && let Err(e) = stage_and_send(&dev, &copies.staged, &copies.staged_dst)
        {
            self.fence_launched();
            return Err(e);
        }
        let event = match dev.record() {
            Ok(event) => Arc::new(event),
            Err(e) => {
                // The copies cannot be fenced by an event: wait for them before the blocks
                // they read go back to the pool.
                let _ = dev.copy_stream.synchronize();
                return Err(e);
            }
        };
        for b in &copies.blocks {
            b.record_use(event.clone() as Arc<dyn Fence>);
        }
        let _ = self.ready.set(event.clone());
        for s in &self.consumers {
            if let Err(e) = event.wait_on(s) {
                // The results exist but a consumer cannot be ordered after them: wait here.
                event.synchronize()?;
                return Err(e);
            }
        }
        if !self.non_blocking {
            event.synchronize()?;
        }
        Ok(())
    }
}

/// Issues the direct copies on `dev`'s copy stream, merged where they continue each other.
/// Several host-to-device runs in a row (rows of a gather, tensors of separate pinned blocks)
/// go in one batched call where the driver has it.
fn issue_direct(dev: &Arc<CudaDevice>, direct: &[DirectCopy]) -> Result<()> {
    let mut runs: Vec<DirectCopy> = Vec::new();
    let mut i = 0;
    while i < direct.len() {
        let first = &direct[i];
        let mut run = DirectCopy {
            src_buffer: first.src_buffer.clone(),
            ..*first
        };
        i += 1;
        while i < direct.len() && run.absorb(&direct[i]) {
            i += 1;
        }
        if run.bytes > 0 {
            runs.push(run);
        }
    }
    let mut at = 0;
    while at < runs.len() {
        let htod = runs[at..].iter().take_while(|r| r.dir == Dir::HtoD).count();
        if let Some(batch) = batch_copies().filter(|_| htod >= 2) {
            issue_htod_batch(dev, &runs[at..at + htod], batch)?;
            at += htod;
        } else {
            issue_one(dev, &runs[at])?;
            at += 1;
        }
    }
    Ok(())
}

/// `cuMemcpyBatchAsync` as CUDA 12.8 defines it.
type BatchFn = unsafe extern "C" fn(
    *mut sys::CUdeviceptr,
    *mut sys::CUdeviceptr,
    *mut usize,
    usize,
    *mut sys::CUmemcpyAttributes,
    *mut usize,
    usize,
    *mut usize,
    sys::CUstream,
) -> sys::CUresult;

/// Whether batching is off: `PINNABLE_COPY_BATCH=0`, or a batched call failed once.
static BATCH_OFF: AtomicBool = AtomicBool::new(false);

/// The driver's `cuMemcpyBatchAsync` (CUDA 12.8 and later), looked up at run time so a binary
/// that links the driver still starts on older ones; `None` without it, or when batching is
/// off.
fn batch_copies() -> Option<BatchFn> {
    static BATCH: OnceLock<Option<BatchFn>> = OnceLock::new();
    if BATCH_OFF.load(Ordering::Relaxed) {
        return None;
    }
    *BATCH.get_or_init(|| {
        if std::env::var("PINNABLE_COPY_BATCH").as_deref() == Ok("0") {
            return None;
        }
        let mut pfn: *mut std::ffi::c_void = std::ptr::null_mut();
        let mut found = sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        // SAFETY: the name is a C string; `pfn` and `found` are plain out-parameters. The
        // driver returns the entry point with the 12.8 ABI (the one `BatchFn` spells) or none.
        let r = unsafe {
            sys::cuGetProcAddress_v2(
                c"cuMemcpyBatchAsync".as_ptr(),
                &mut pfn,
                12080,
                sys::CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_DEFAULT as u64,
                &mut found,
            )
        };
        let ok = r == sys::CUresult::CUDA_SUCCESS
            && found == sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS;
        if !ok || pfn.is_null() {
            return None;
        }
        // SAFETY: a non-null entry point of `cuMemcpyBatchAsync` for CUDA 12.8, whose C
        // signature `BatchFn` matches.
        Some(unsafe { std::mem::transmute::<*mut std::ffi::c_void, BatchFn>(pfn) })
    })
}

/// Issues host-to-device runs as one `cuMemcpyBatchAsync`, each read in stream order. If the
/// driver refuses the batch, batching is turned off for the process and the runs go one by one
/// (a copy the batch may already have enqueued is then made twice, with the same bytes).
fn issue_htod_batch(dev: &Arc<CudaDevice>, runs: &[DirectCopy], batch: BatchFn) -> Result<()> {
    let mut dsts: Vec<sys::CUdeviceptr> = runs.iter().map(|r| r.dst).collect();
    let mut srcs: Vec<sys::CUdeviceptr> = runs.iter().map(|r| r.src).collect();
    let mut sizes: Vec<usize> = runs.iter().map(|r| r.bytes).collect();
    let mut attrs = [sys::CUmemcpyAttributes {
        srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
        srcLocHint: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        },
        dstLocHint: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: dev.ordinal as i32,
        },
        flags: 0,
    }];
    let mut attr_at = [0usize];
    let mut failed_at = usize::MAX;
    // SAFETY: the arrays hold `runs.len()` entries and outlive the call; every range lies
    // within a live buffer, as for single copies (see `issue_one`); one attribute applies to
    // every copy from index 0; sources are read in stream order.
    let r = unsafe {
        batch(
            dsts.as_mut_ptr(),
            srcs.as_mut_ptr(),
            sizes.as_mut_ptr(),
            runs.len(),
            attrs.as_mut_ptr(),
            attr_at.as_mut_ptr(),
            1,
            &mut failed_at,
            dev.copy_stream.cu_stream(),
        )
    };
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    BATCH_OFF.store(true, Ordering::Relaxed);
    runs.iter().try_for_each(|run| issue_one(dev, run))
}

/// Issues one merged run.
fn issue_one(dev: &Arc<CudaDevice>, run: &DirectCopy) -> Result<()> {
    let stream = &dev.copy_stream;
    if let (Dir::DtoD, Some(src)) = (run.dir, run.src_device()) {
        // Over the direct link when there is one; the driver stages through the host else.
        crate::cuda::peer_access(dev, src);
    }
    // SAFETY: source and destination ranges lie within live buffers (sources are held by
    // the move until issued and then by the ready event or their owners; destinations are
    // fresh allocations of this move), and the stream waited for sources still being filled.
    let r = unsafe {
        match run.dir {
            Dir::HtoD => sys::cuMemcpyHtoDAsync_v2(
                run.dst,
                run.src as *const std::ffi::c_void,
                run.bytes,
                stream.cu_stream(),
            ),
            Dir::DtoH => sys::cuMemcpyDtoHAsync_v2(
                run.dst as *mut std::ffi::c_void,
                run.src,
                run.bytes,
                stream.cu_stream(),
            ),
            Dir::DtoD => sys::cuMemcpyPeerAsync(
                run.dst,
                dev.ctx.cu_ctx(),
                run.src,
                run.src_device().expect("a device source").ctx.cu_ctx(),
                run.bytes,
                stream.cu_stream(),
            ),
        }
    };
    check_cu(r, "cuMemcpyAsync")?;
    // Any device source is recorded as read until this point: on another device so its
    // free waits, and on this one so a later in-place write (`cuda_view_mut`) waits too.
    if let Some(src) = &run.src_buffer {
        let read = stream
            .record_event(None)
            .map_err(|e| Error::driver("cuEventRecord", e))?;
        src.add_reader(read);
    }
    Ok(())
}

/// A run of staged bytes to send to the device in one copy.
struct Run {
    src: *const u8,
    dst: u64,
    bytes: usize,
    /// Whether neighbouring runs may be merged with this one (both in the batch's arena, where
    /// the staging block and the device mirror each other, padding included).
    mergeable: bool,
}

impl Run {
    /// Extends `self` over `next` when `next` follows it in both host and device memory (with
    /// at most the arena's alignment padding between them).
    fn absorb(&mut self, next: &Run) -> bool {
        let end = self.src as usize + self.bytes;
        let gap = (next.src as usize).wrapping_sub(end);
        let same_shift = (next.src as usize).wrapping_sub(self.src as usize) as u64
            == next.dst.wrapping_sub(self.dst);
        if self.mergeable && next.mergeable && gap < PART_ALIGN && same_shift {
            self.bytes = next.src as usize + next.bytes - self.src as usize;
            true
        } else {
            false
        }
    }
}

/// Which staged pieces have landed, and the run not yet sent.
struct Frontier {
    done: Vec<bool>,
    next: usize,
    pending: Option<Run>,
}

// SAFETY: the raw pointers in a pending run point into the staging block, which outlives the
// move; the frontier is only touched under its mutex.
unsafe impl Send for Frontier {}

/// Gathers the staged sources into pinned memory on the copy threads and sends each landed
/// run to the device.
fn stage_and_send(
    dev: &Arc<CudaDevice>,
    staged: &[HostCopy],
    staged_dst: &[(u64, bool)],
) -> Result<()> {
    let stream = &dev.copy_stream;
    let pieces = copy::plan(staged);
    let chunk = chunk(staged.iter().map(|c| c.src.bytes()).sum());
    let frontier = Mutex::new(Frontier {
        done: vec![false; pieces.len()],
        next: 0,
        pending: None,
    });
    let send = |run: Run| -> Result<()> {
        // SAFETY: the run's staging bytes were written by finished pieces (and are guarded by the
        // ready event from here on); its device range lies in a live allocation.
        let r = unsafe {
            sys::cuMemcpyHtoDAsync_v2(run.dst, run.src.cast(), run.bytes, stream.cu_stream())
        };
        check_cu(r, "cuMemcpyHtoDAsync")
    };
    let on_piece = |i: usize| -> Result<()> {
        dev.ctx
            .bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        // The lock orders the device copies by staging address so runs can be merged; only
        // this move's copy threads contend for it.
        let mut f = frontier.lock().unwrap_or_else(|e| e.into_inner());
        f.done[i] = true;
        while f.next < pieces.len() && f.done[f.next] {
            for (c, range) in pieces[f.next].writes(staged) {
                let (dst, mergeable) = staged_dst[c];
                let piece = Run {
                    // SAFETY: within the copy's staging destination.
                    src: unsafe { staged[c].dst.add(range.start) },
                    dst: dst + range.start as u64,
                    bytes: range.len(),
                    mergeable,
                };
                let merged = f.pending.as_mut().is_some_and(|run| run.absorb(&piece));
                if !merged && let Some(run) = f.pending.replace(piece) {
                    send(run)?;
                }
                if f.pending.as_ref().is_some_and(|r| r.bytes >= chunk) {
                    send(f.pending.take().expect("checked"))?;
                }
            }
            f.next += 1;
        }
        if f.next == pieces.len()
            && let Some(run) = f.pending.take()
        {
            send(run)?;
        }
        Ok(())
    };
    // SAFETY: sources are held by the move; each destination is a staging block written by
    // nothing else.
    unsafe { copy::run_pieces(staged, &pieces, copy::Share::ThreeQuarters, Some(&on_piece)) }
}

fn check_cu(r: sys::CUresult, call: &'static str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::driver(call, cudarc::driver::DriverError(r)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(src: u64, dst: u64, bytes: usize, src_id: usize) -> DirectCopy {
        DirectCopy {
            dir: Dir::HtoD,
            src,
            dst,
            bytes,
            src_id,
            src_buffer: None,
        }
    }

    #[test]
    fn neighbouring_copies_of_one_buffer_merge_across_padding() {
        let mut a = copy(4096, 1 << 20, 1000, 7);
        assert!(a.absorb(&copy(4096 + 1024, (1 << 20) + 1024, 500, 7)));
        assert_eq!(a.bytes, 1524);
        // A different shift between source and destination: no merge.
        assert!(!a.absorb(&copy(4096 + 1536, (1 << 20) + 2048, 10, 7)));
        // A gap of a whole alignment unit or more: no merge.
        assert!(!a.absorb(&copy(4096 + 1524 + 256, (1 << 20) + 1524 + 256, 10, 7)));
    }

    #[test]
    fn copies_of_two_buffers_never_merge_even_when_adjacent() {
        let mut a = copy(4096, 1 << 20, 4096, 1);
        assert!(!a.absorb(&copy(8192, (1 << 20) + 4096, 4096, 2)));
        assert_eq!(a.bytes, 4096);
    }
}
