//! One epoch's iterator: [`Epoch`], over an indexed source (its length known) or a stream.

use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use super::pipeline::Pipeline;
use super::position::{Position, Progress};
use super::stats::{Counters, EpochStats};
use crate::error::{Error, Result};

/// One epoch of a [`Loader`](super::Loader): its batches in order, each an `Ok(batch)` or, in
/// place of a batch that could not be made, the `Err` that ended the epoch.
///
/// Over an indexed source, the batches still to come are known ([`remaining`](Self::remaining),
/// and an exact `size_hint`, so a progress bar can wrap it); after an error none remain and
/// the iterator ends. Over a stream they are not known until it ends.
///
/// The epoch's threads run while it lives. Dropping it — after its last batch, or at any point
/// before — stops and joins them and drops every batch in flight, whose blocks go back to the
/// pool; the batches already taken stay valid.
///
/// [`position`](Self::position) says where the consumer is, to resume from after a restart.
pub struct Epoch<T> {
    pipeline: Pipeline<T>,
    /// The batches still to come, when known (`None` for a stream).
    remaining: Option<usize>,
    /// Whether the epoch ended (an error, or its last batch).
    over: bool,
    epoch: u64,
    progress: Arc<Progress>,
    /// Why the epoch cannot run: its one item.
    refused: Option<Error>,
}

impl<T> Epoch<T> {
    pub(crate) fn new(
        pipeline: Pipeline<T>,
        batches: Option<usize>,
        epoch: u64,
        progress: Arc<Progress>,
    ) -> Self {
        Epoch {
            pipeline,
            remaining: batches,
            over: false,
            epoch,
            progress,
            refused: None,
        }
    }

    /// An epoch that cannot run (its pipeline has no job): it yields `error`, then ends.
    pub(crate) fn refused(mut self, error: Error) -> Self {
        self.remaining = Some(0);
        self.refused = Some(error);
        self
    }

    /// The epoch number (which decided the shuffle; passed to a stream's closure).
    pub fn number(&self) -> u64 {
        self.epoch
    }

    /// The batches still to come, when the source says how many (`None` over a stream).
    pub fn remaining(&self) -> Option<usize> {
        self.remaining
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
            self.over = true;
            return Some(Err(e));
        }
        if self.remaining == Some(0) || self.over {
            self.remaining = self.remaining.map(|_| 0);
            if let Some(e) = self.pipeline.shutdown() {
                return Some(Err(e));
            }
            return None;
        }
        let item = self.pipeline.next();
        self.took(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self.remaining {
            Some(n) => (n, Some(n)),
            None => (0, None),
        }
    }
}

impl<T> Epoch<T> {
    /// The next item if it is already there, without waiting: `Poll::Ready` with what
    /// [`next`](Iterator::next) would return, or `Poll::Pending` (nothing taken) when `next`
    /// would wait for a batch. For a consumer that must not block where a batch is ready, e.g. a
    /// binding that gives up a language lock only to wait. Like `next`, taking the epoch's
    /// last batch or an error stops and joins its threads.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::task::Poll;
    /// use pinnable::loader::{Loader, Stack};
    /// use pinnable::Tensor;
    ///
    /// let data: Vec<Tensor> = (0..8).map(|i| Tensor::from_vec1(vec![i as f32; 4])).collect();
    /// let loader = Loader::builder(data).batch_size(4).build(Stack)?;
    /// let mut epoch = loader.iter();
    /// let mut batches = 0;
    /// loop {
    ///     match epoch.try_next() {
    ///         Poll::Ready(Some(batch)) => { batch?; batches += 1 }
    ///         Poll::Ready(None) => break,
    ///         Poll::Pending => std::thread::yield_now(), // or block in `next()`
    ///     }
    /// }
    /// assert_eq!(batches, 2);
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn try_next(&mut self) -> Poll<Option<Result<T>>> {
        self.next_before(Some(Instant::now()))
    }

    /// As [`next`](Iterator::next), waiting `timeout` at most: `Poll::Pending` (nothing taken)
    /// when no batch came in that time. For a consumer that must do something while it waits,
    /// e.g. a binding that checks for an interrupt; the wait still counts whole in the
    /// epoch's [`stats`](Self::stats).
    pub fn next_within(&mut self, timeout: Duration) -> Poll<Option<Result<T>>> {
        self.next_before(Some(Instant::now() + timeout))
    }

    fn next_before(&mut self, deadline: Option<Instant>) -> Poll<Option<Result<T>>> {
        if self.refused.is_some() || self.remaining == Some(0) || self.over {
            return Poll::Ready(self.next());
        }
        match self.pipeline.next_before(deadline) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(item) => Poll::Ready(self.took(item)),
        }
    }

    /// Counts an item the pipeline delivered, and joins the threads after the last one.
    fn took(&mut self, item: Option<Result<T>>) -> Option<Result<T>> {
        match &item {
            Some(Ok(_)) => {
                if let Some(r) = &mut self.remaining {
                    *r -= 1;
                }
                self.progress.received(self.pipeline.last_batch());
            }
            Some(Err(_)) => {
                self.over = true;
                self.remaining = self.remaining.map(|_| 0);
            }
            None => {
                // A stream ended without an error: the epoch is over.
                if self.remaining.is_none() {
                    self.progress.ended();
                }
                self.over = true;
                self.remaining = self.remaining.map(|_| 0);
            }
        }
        if self.remaining == Some(0) || self.over {
            // The last batch: join the threads now rather than at the next call.
            let _ = self.pipeline.shutdown();
        }
        item
    }
}

impl<T> std::fmt::Debug for Epoch<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Epoch")
            .field("number", &self.epoch)
            .field("remaining", &self.remaining)
            .finish()
    }
}
