//! The loader over a stream: [`StreamLoader`], and the cutting of a stream into batch jobs.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Run;
use crate::alloc::PinnedPool;
use crate::cuda::Device;
use crate::error::Result;
use crate::loader::batcher::Batcher;
use crate::loader::collate::EpochSeed;
use crate::loader::epoch::StreamEpoch;
use crate::loader::pipeline::{Job, Jobs, Pipeline};
use crate::loader::position::{Position, Progress, check_epoch};
use crate::loader::stats::EpochStats;
use crate::loader::stream::{IterSource, NotSeekable, Seekable, shard_stream};
use crate::transfer::ToDevice;

/// A loader over a stream ([`IterSource`]): as [`Loader`](super::Loader), without shuffling,
/// and its epochs are plain iterators ([`StreamEpoch`]).
///
/// # Examples
///
/// ```
/// use pinnable::loader::{IterSource, Loader, Stack};
/// use pinnable::Tensor;
///
/// let source = IterSource::new(|_epoch| (0..10).map(|i| Ok(Tensor::from_vec1(vec![i as f32; 4]))));
/// let loader = Loader::builder(source).batch_size(4).workers(2).build(Stack)?;
/// let shapes: Vec<Vec<usize>> = loader.iter().map(|b| Ok(b?.shape().to_vec())).collect::<pinnable::Result<_>>()?;
/// assert_eq!(shapes, vec![vec![4, 4], vec![4, 4], vec![2, 4]]);
/// # Ok::<(), pinnable::Error>(())
/// ```
pub struct StreamLoader<F, B, G = NotSeekable> {
    source: Arc<IterSource<F, G>>,
    batcher: Arc<B>,
    batch_size: usize,
    drop_last: bool,
    shard: (usize, usize),
    run: Run,
}

impl<F, I, S, B, G> StreamLoader<F, B, G>
where
    F: Fn(u64) -> I + Send + Sync + 'static,
    I: Iterator<Item = Result<S>> + Send + 'static,
    S: Send + 'static,
    B: Batcher<S> + 'static,
    B::Batch: ToDevice + 'static,
    G: Seekable<S> + 'static,
{
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_parts(
        source: Arc<IterSource<F, G>>,
        batcher: Arc<B>,
        batch_size: usize,
        drop_last: bool,
        shard: (usize, usize),
        workers: usize,
        prefetch: usize,
        device: Device,
        pool: PinnedPool,
    ) -> Self {
        StreamLoader {
            source,
            batcher,
            batch_size,
            drop_last,
            shard,
            run: Run::new(workers, prefetch, device, pool),
        }
    }

    /// Runs epoch `epoch`: opens its stream and starts its threads. Does not change
    /// [`next_epoch`](Self::next_epoch). The epoch of a position given to
    /// [`resume`](crate::loader::LoaderBuilder::resume) starts, the first time it runs, at the
    /// batch after the last one received: its stream is opened there ([`Seekable`]).
    pub fn run_epoch(&self, epoch: u64) -> StreamEpoch<B::Batch> {
        let (rank, world) = self.shard;
        let first = self.run.first_batch(epoch);
        // Every rank's first `first` batches came from the stream's first
        // `first * batch_size * world` items.
        let skip = first
            .saturating_mul(self.batch_size as u64)
            .saturating_mul(world as u64);
        let (batch_size, drop_last) = (self.batch_size, self.drop_last);
        let refused = check_epoch(epoch).err();
        let jobs: Jobs<S> = if refused.is_some() {
            Box::new(std::iter::empty())
        } else if skip == 0 {
            Box::new(Chunks {
                items: shard_stream(self.source.open(epoch), 0, rank, world),
                batch_size,
                drop_last,
            })
        } else {
            // A position past batch 0 is only taken by a source that can seek (checked when
            // given), so `seek` gives a stream.
            match self.source.seek(epoch, skip) {
                Some(stream) => Box::new(Chunks {
                    items: shard_stream(stream, skip as usize, rank, world),
                    batch_size,
                    drop_last,
                }),
                None => Box::new(std::iter::empty()),
            }
        };
        let seed = EpochSeed { seed: None, epoch };
        let spec = self.run.spec(jobs, None, self.batcher.clone(), seed);
        let progress = Progress::new(self.position_at(epoch, first), None);
        let mut e = StreamEpoch::new(Pipeline::start(spec), epoch, progress.clone());
        if let Some(error) = refused {
            e = e.refused(error);
        }
        self.run.started(e.counters(), progress);
        e
    }

    /// Whether the source can start a stream mid-epoch.
    pub(crate) fn can_seek(&self) -> bool {
        self.source.can_seek::<S>()
    }

    /// Runs epoch [`next_epoch`](Self::next_epoch) and advances it: what `for batch in
    /// &loader` does.
    pub fn iter(&self) -> StreamEpoch<B::Batch> {
        self.run_epoch(self.run.take_epoch())
    }
}

impl<F, B, G> StreamLoader<F, B, G> {
    /// Starts at `position` (whose settings the builder checked).
    pub(crate) fn resume_at(self, position: &Position) -> Self {
        self.run.resume_at(position.epoch(), position.batch());
        self
    }

    /// Delivers out of order as the builder says.
    pub(crate) fn delivery(mut self, in_order: bool) -> Self {
        self.run.delivery(in_order, None);
        self
    }

    /// The position at batch `batch` of epoch `epoch` under this loader's settings.
    pub(crate) fn position_at(&self, epoch: u64, batch: u64) -> Position {
        Position::new(
            (epoch, batch),
            None,
            self.shard,
            None,
            self.batch_size,
            self.drop_last,
        )
    }

    /// Where the consumer is, as [`Loader::position`](super::Loader::position) says; to resume,
    /// the source must be [`Seekable`].
    pub fn position(&self) -> Position {
        self.run
            .position(|epoch, batch| self.position_at(epoch, batch))
    }

    /// Sets the epoch the next [`iter`](Self::iter) runs.
    pub fn set_epoch(&self, epoch: u64) {
        self.run.next_epoch.store(epoch, Ordering::Relaxed);
    }

    /// The epoch the next [`iter`](Self::iter) runs.
    pub fn next_epoch(&self) -> u64 {
        self.run.next_epoch.load(Ordering::Relaxed)
    }

    /// The pool batch blocks come from.
    pub fn pool(&self) -> &PinnedPool {
        &self.run.pool
    }

    /// The most batches whose pinned memory the loader holds at once: `prefetch + workers + 1`.
    pub fn bound(&self) -> usize {
        self.run.prefetch + self.run.workers + 1
    }

    /// The figures of the epoch started last, `None` before the first.
    pub fn stats(&self) -> Option<EpochStats> {
        self.run.stats()
    }
}

impl<F, I, S, B, G> IntoIterator for &StreamLoader<F, B, G>
where
    F: Fn(u64) -> I + Send + Sync + 'static,
    I: Iterator<Item = Result<S>> + Send + 'static,
    S: Send + 'static,
    B: Batcher<S> + 'static,
    B::Batch: ToDevice + 'static,
    G: Seekable<S> + 'static,
{
    type Item = Result<B::Batch>;
    type IntoIter = StreamEpoch<B::Batch>;

    fn into_iter(self) -> StreamEpoch<B::Batch> {
        self.iter()
    }
}

impl<F, B, G> std::fmt::Debug for StreamLoader<F, B, G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamLoader")
            .field("batch_size", &self.batch_size)
            .field("shard", &self.shard)
            .field("workers", &self.run.workers)
            .finish()
    }
}

/// A stream's items cut into batch jobs.
struct Chunks<It> {
    items: It,
    batch_size: usize,
    drop_last: bool,
}

impl<It, S> Iterator for Chunks<It>
where
    It: Iterator<Item = (usize, Result<S>)>,
{
    type Item = Job<S>;

    fn next(&mut self) -> Option<Job<S>> {
        let chunk: Vec<_> = self.items.by_ref().take(self.batch_size).collect();
        if chunk.is_empty() || (self.drop_last && chunk.len() < self.batch_size) {
            return None;
        }
        Some(Job::Read(chunk))
    }
}
