//! Issuing a move's copies on the copy stream, once the whole batch is reserved and placed.
//!
//! Pieces read in place go first: merged where they read and write neighbouring bytes, then
//! each given to the copy engine or the SMs ([`engine::assign`]). Staged bytes are gathered into
//! the staging block by the copy threads and sent as they land ([`engine::host`]); conversions
//! of staged bytes run on the SMs once staging is done. One event recorded after all of it is
//! the move's ready event.

use std::sync::Arc;

use super::MoveContext;
use super::engine::sm::{SmJob, SmOp, SmWork};
use super::engine::{self, dma, host};
use crate::alloc::{Fence, PinnedBlock};
use crate::copy::HostCopy;
use crate::cuda::{CudaDevice, Event, Kernels};
use crate::error::{Error, Result};
use crate::tensor::{DeviceBuffer, Storage};

/// Everything a move will copy, and what must stay alive or wait for it.
#[derive(Default)]
pub(super) struct Copies {
    /// Pieces read in place, by the copy engine or the SMs.
    pub(super) direct: Vec<dma::DirectCopy>,
    /// Conversions read in place: the SMs' alone.
    pub(super) sm: Vec<SmJob>,
    pub(super) staged: Vec<HostCopy>,
    /// Device address of each staged copy, and whether it lies in the arena (mergeable); `None`
    /// for bytes that stay in staging for `after_staging` to convert.
    pub(super) staged_dst: Vec<Option<(u64, bool)>>,
    /// Conversions of staged bytes, run once staging is done.
    pub(super) after_staging: Vec<SmJob>,
    /// Device buffers the SMs read: recorded as read once their kernels are queued.
    pub(super) sm_reads: Vec<Arc<DeviceBuffer>>,
    /// Events the copy stream waits on first (sources still being filled).
    pub(super) waits: Vec<Arc<Event>>,
    /// Sources kept alive until the copies are issued.
    pub(super) keep: Vec<Arc<Storage>>,
    /// Pinned blocks the copies read or write: each gets the ready event.
    pub(super) blocks: Vec<Arc<PinnedBlock>>,
    /// How many of `direct` and `waits` are already issued, and how many SM jobs were
    /// launched (`sm` itself holds only those not launched yet).
    pub(super) direct_issued: usize,
    pub(super) sm_issued: usize,
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
        self.direct.is_empty()
            && self.sm.is_empty()
            && self.sm_issued == 0
            && self.staged.is_empty()
            && self.after_staging.is_empty()
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
        // `sm` holds the jobs not yet launched (each launch takes them): compare with nothing,
        // not with `sm_issued`, which counts every launch of the move. (Compared with it, a
        // move whose first launch ran SM work skipped a later launch of as many jobs: a
        // gather read in place beside a mirrored batch was never written.)
        if c.direct_issued == c.direct.len() && c.sm.is_empty() && c.waits_issued == c.waits.len() {
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
        // Counted as issued before the calls: on an error some may have been enqueued, and
        // `fence_launched` must then guard every block they might read.
        let from = std::mem::replace(&mut c.direct_issued, c.direct.len());
        let pending = std::mem::take(&mut c.sm);
        c.sm_issued += pending.len();
        let mut jobs = engine::sm::merged(pending);
        let kernels = self.kernels(&dev);
        let merged = dma::merge(&self.copies.direct[from..]);
        let (dma_runs, sm_pieces) = engine::assign(merged, kernels.is_some());
        dma::issue(&dev, &dma_runs)?;
        if !sm_pieces.is_empty() {
            self.copies.sm_issued += 1;
            jobs.push(SmJob {
                op: SmOp::Copy,
                work: SmWork::Pieces(sm_pieces),
            });
        }
        self.run_sm(&dev, kernels.as_deref(), &jobs)
    }

    /// The gather kernels of the device carrying this move, if they run there.
    pub(super) fn kernels(&self, dev: &CudaDevice) -> Option<Arc<Kernels>> {
        crate::cuda::kernels(dev)
    }

    /// Launches `jobs` on the SMs, and records the device buffers they read as read.
    fn run_sm(
        &mut self,
        dev: &Arc<CudaDevice>,
        kernels: Option<&Kernels>,
        jobs: &[SmJob],
    ) -> Result<()> {
        if jobs.iter().all(SmJob::is_empty) {
            self.copies.sm_reads.clear();
            return Ok(());
        }
        let kernels = kernels.ok_or_else(|| Error::Config {
            setting: "convert",
            problem: format!(
                "converting while moving needs the gather kernels, which are off on {}: {}",
                self.target,
                crate::cuda::gather_kernels(self.target)
                    .err()
                    .unwrap_or_default()
            ),
        })?;
        // SAFETY: every piece was planned from a live source this move holds (its storage is in
        // `keep`, its block in `blocks`) that the device reads in place (mapped pinned memory or
        // device memory, chosen by `engine`), into this move's reservation, which nothing reads
        // before the ready event recorded after these kernels. The launch notes the blocks its
        // own work reads in `blocks` before enqueuing it: an error from here on is fenced by
        // `fence_launched`, which covers every block in `blocks`.
        let launched =
            unsafe { engine::sm::launch(dev, kernels, self.pool, jobs, &mut self.copies.blocks) };
        // Device sources the kernels read: a later free or in-place write waits for them,
        // for the kernels already queued when a later launch failed as well.
        for b in std::mem::take(&mut self.copies.sm_reads) {
            let read = dev
                .copy_stream
                .record_event(None)
                .map_err(|e| Error::driver("cuEventRecord", e))?;
            b.add_reader(read);
        }
        launched
    }

    /// After an error once copies were launched: records their completion on every block they
    /// read or write, so the pool neither reuses nor hands out those blocks while they run.
    /// Every engine notes a block in `blocks` before it enqueues work that reads it, so this
    /// covers the work of a launch that failed half-way as well.
    pub(super) fn fence_launched(&self) {
        let c = &self.copies;
        if c.direct_issued == 0 && c.sm_issued == 0 && c.staged.is_empty() {
            return;
        }
        let Ok(Some(dev)) = self.stream_device() else {
            return;
        };
        let sync = || {
            let _ = dev.copy_stream.synchronize();
        };
        // Without an event to record, `fence_blocks` waits for the copies here instead.
        if let Ok(event) = fence_blocks(&self.copies.blocks, || dev.record(), sync) {
            // Consumers may free what was moved apart once the failed batch is dropped.
            if self.consumers.iter().any(|s| event.wait_on(s).is_err()) {
                sync();
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
            && let Err(e) = host::stage_and_send(&dev, &copies.staged, &copies.staged_dst)
        {
            self.fence_launched();
            return Err(e);
        }
        if !self.copies.after_staging.is_empty() {
            let after = std::mem::take(&mut self.copies.after_staging);
            self.copies.sm_issued += after.len();
            let kernels = self.kernels(&dev);
            if let Err(e) = self.run_sm(&dev, kernels.as_deref(), &after) {
                self.fence_launched();
                return Err(e);
            }
        }
        // If the copies cannot be fenced by an event, this waits for them before the blocks
        // they read go back to the pool.
        let event = fence_blocks(
            &self.copies.blocks,
            || dev.record(),
            || {
                let _ = dev.copy_stream.synchronize();
            },
        )?;
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

/// Fences `blocks` with the fence `record` makes (an event recorded after the last enqueued
/// operation that may read them): none of them returns to the pool, or is written in place,
/// before it completes. When no fence can be made, calls `wait`, which must return only once
/// that work is done, and returns the error.
///
/// # Errors
///
/// `record`'s.
pub(super) fn fence_blocks<F: Fence + 'static>(
    blocks: &[Arc<PinnedBlock>],
    record: impl FnOnce() -> Result<F>,
    wait: impl FnOnce(),
) -> Result<Arc<F>> {
    match record() {
        Ok(fence) => {
            let fence = Arc::new(fence);
            for b in blocks {
                b.record_use(fence.clone() as Arc<dyn Fence>);
            }
            Ok(fence)
        }
        Err(e) => {
            wait();
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests;
