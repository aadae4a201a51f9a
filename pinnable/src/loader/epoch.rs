//! The iterators of one epoch: [`Epoch`] over a dataset (its length is known) and
//! [`StreamEpoch`] over a stream.

use std::sync::Arc;

use super::pipeline::Pipeline;
use super::position::{Position, Progress};
use super::stats::{Counters, EpochStats};
use crate::error::{Error, Result};

/// One epoch of a [`Loader`](super::Loader): its batches in order, each an `Ok(batch)` or, in
/// place of a batch that could not be made, the `Err` that ended the epoch.
///
/// An `ExactSizeIterator`: [`len`](ExactSizeIterator::len) is the batches still to come (so a
/// progress bar can wrap it); after an error it is 0 and the iterator ends.
///
/// The epoch's threads run while it lives. Dropping it — after its last batch, or at any point
/// before — stops and joins them and drops every batch in flight, whose blocks go back to the
/// pool; the batches already taken stay valid.
///
/// [`position`](Self::position) says where the consumer is, to resume from after a restart.
pub struct Epoch<T> {
    pipeline: Pipeline<T>,
    remaining: usize,
    epoch: u64,
    progress: Arc<Progress>,
    /// Why the epoch cannot run: its one item.
    refused: Option<Error>,
}

impl<T> Epoch<T> {
    pub(crate) fn new(
        pipeline: Pipeline<T>,
        batches: usize,
        epoch: u64,
        progress: Arc<Progress>,
    ) -> Self {
        Epoch {
            pipeline,
            remaining: batches,
            epoch,
            progress,
            refused: None,
        }
    }

    /// An epoch that cannot run (its pipeline has no job): it yields `error`, then ends.
    pub(crate) fn refused(mut self, error: Error) -> Self {
        self.remaining = 0;
        self.refused = Some(error);
        self
    }

    /// The epoch number (which decided the shuffle).
    pub fn number(&self) -> u64 {
        self.epoch
    }

    /// Where the consumer is: after the last batch it received from this epoch, or the start
    /// of the next epoch once every batch of this one was received. Batches the loader has
    /// made ahead but not delivered do not count. See [`Position`].
    pub fn position(&self) -> Position {
        self.progress.position()
    }

    /// The figures so far (see [`EpochStats`]).
    pub fn stats(&self) -> EpochStats {
        self.pipeline.counters().snapshot()
    }

    pub(crate) fn counters(&self) -> Arc<Counters> {
        self.pipeline.counters().clone()
    }
}

impl<T> Iterator for Epoch<T> {
    type Item = Result<T>;

    fn next(&mut self) -> Option<Result<T>> {
        if let Some(e) = self.refused.take() {
            return Some(Err(e));
        }
        if self.remaining == 0 {
            if let Some(e) = self.pipeline.shutdown() {
                return Some(Err(e));
            }
            return None;
        }
        let item = self.pipeline.next();
        match &item {
            Some(Ok(_)) => {
                self.remaining -= 1;
                self.progress.received(self.pipeline.last_batch());
            }
            Some(Err(_)) | None => self.remaining = 0,
        }
        if self.remaining == 0 {
            // The last batch: join the threads now rather than at the next call.
            let _ = self.pipeline.shutdown();
        }
        item
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl<T> ExactSizeIterator for Epoch<T> {}

impl<T> std::fmt::Debug for Epoch<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Epoch")
            .field("number", &self.epoch)
            .field("remaining", &self.remaining)
            .finish()
    }
}

/// One epoch of a [`StreamLoader`](super::StreamLoader): as [`Epoch`], but a plain
/// `Iterator`, since a stream's length is not known until it ends.
pub struct StreamEpoch<T> {
    pipeline: Pipeline<T>,
    epoch: u64,
    progress: Arc<Progress>,
    failed: bool,
    /// Why the epoch cannot run: its one item.
    refused: Option<Error>,
}

impl<T> StreamEpoch<T> {
    pub(crate) fn new(pipeline: Pipeline<T>, epoch: u64, progress: Arc<Progress>) -> Self {
        StreamEpoch {
            pipeline,
            epoch,
            progress,
            failed: false,
            refused: None,
        }
    }

    /// An epoch that cannot run (its pipeline has no job): it yields `error`, then ends.
    pub(crate) fn refused(mut self, error: Error) -> Self {
        self.failed = true;
        self.refused = Some(error);
        self
    }

    /// The epoch number (passed to the stream's closure).
    pub fn number(&self) -> u64 {
        self.epoch
    }

    /// Where the consumer is, as [`Epoch::position`] says; the epoch is over once the stream
    /// has ended without an error.
    pub fn position(&self) -> Position {
        self.progress.position()
    }

    /// The figures so far (see [`EpochStats`]).
    pub fn stats(&self) -> EpochStats {
        self.pipeline.counters().snapshot()
    }

    pub(crate) fn counters(&self) -> Arc<Counters> {
        self.pipeline.counters().clone()
    }
}

impl<T> Iterator for StreamEpoch<T> {
    type Item = Result<T>;

    fn next(&mut self) -> Option<Result<T>> {
        if let Some(e) = self.refused.take() {
            return Some(Err(e));
        }
        let item = self.pipeline.next();
        match &item {
            Some(Ok(_)) => self.progress.received(self.pipeline.last_batch()),
            Some(Err(_)) => self.failed = true,
            None if !self.failed => self.progress.ended(),
            None => {}
        }
        item
    }
}

impl<T> std::fmt::Debug for StreamEpoch<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamEpoch")
            .field("number", &self.epoch)
            .finish()
    }
}
