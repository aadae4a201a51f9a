//! Issuing a move's copies on the copy stream, once the whole batch is reserved and placed.
//!
//! Direct copies (from registered pinned memory or another device) go first, merged where they
//! read and write neighbouring bytes. Staged bytes are gathered into the staging block by the
//! copy threads; as pieces land in order, they are sent to the device in runs of at least
//! [`chunk`] bytes, so the device copies start while staging goes on.

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
/// excepted): 8 MiB, or `PINNABLE_STAGE_CHUNK` bytes.
fn chunk() -> usize {
    static CHUNK: OnceLock<usize> = OnceLock::new();
    *CHUNK.get_or_init(|| {
        std::env::var("PINNABLE_STAGE_CHUNK")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(8 << 20)
    })
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
        let same_source = match (self.src_device(), next.src_device()) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        let end = self.src + self.bytes as u64;
        let mergeable = self.dir == next.dir
            && same_source
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
    /// Issues every planned copy, records the ready event and hands it to the results.
    pub(super) fn issue(self) -> Result<()> {
        let copies = self.copies;
        if copies.is_empty() {
            return Ok(());
        }
        // Copies to the host run on the source device's copy stream; everything else on the
        // target's.
        let dev: Arc<CudaDevice> = match self.target.ordinal() {
            Some(_) => self.target.cuda_device("to_device")?.clone(),
            None => copies.direct[0]
                .src_device()
                .expect("a copy to the host reads a device")
                .clone(),
        };
        let stream = &dev.copy_stream;
        dev.ctx
            .bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        for w in &copies.waits {
            w.wait_on(stream)?;
        }
        issue_direct(&dev, &copies.direct)?;
        if !copies.staged.is_empty() {
            stage_and_send(&dev, &copies.staged, &copies.staged_dst)?;
        }
        let event = Arc::new(dev.record()?);
        for b in &copies.blocks {
            b.record_use(event.clone() as Arc<dyn Fence>);
        }
        let _ = self.ready.set(event.clone());
        if !self.non_blocking {
            event.synchronize()?;
        }
        Ok(())
    }
}

/// Issues the direct copies on `dev`'s copy stream, merged where they continue each other.
fn issue_direct(dev: &Arc<CudaDevice>, direct: &[DirectCopy]) -> Result<()> {
    let stream = &dev.copy_stream;
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
        if run.bytes == 0 {
            continue;
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
                if f.pending.as_ref().is_some_and(|r| r.bytes >= chunk()) {
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
