//! Host staging: the copy threads gather pageable (or otherwise unreachable) sources into the
//! move's pinned staging block; as pieces land in order, they are sent to the device in runs of
//! at least [`chunk`] bytes, so the device copies start while staging goes on.

use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;

use super::dma::check_cu;
use crate::batch::PART_ALIGN;
use crate::copy::{self, HostCopy};
use crate::cuda::CudaDevice;
use crate::error::{Error, Result};

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
/// run to the device (each copy to its `staged_dst`, or nowhere for `None`).
pub(in crate::transfer) fn stage_and_send(
    dev: &Arc<CudaDevice>,
    staged: &[HostCopy],
    staged_dst: &[Option<(u64, bool)>],
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
                // Bytes that stay in staging (the SMs convert them from there) are not sent.
                let Some((dst, mergeable)) = staged_dst[c] else {
                    continue;
                };
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
