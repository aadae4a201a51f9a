//! The two loaders: [`Loader`] over a [`Dataset`] and [`StreamLoader`] over an [`IterSource`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::batcher::Batcher;
use super::builder::LoaderBuilder;
use super::collate::EpochSeed;
use super::dataset::Dataset;
use super::epoch::{Epoch, StreamEpoch};
use super::pipeline::{Job, Jobs, Pipeline, Spec};
use super::sampler::Sampler;
use super::stats::{Counters, EpochStats};
use super::stream::{IterSource, shard_stream};
use crate::alloc::PinnedPool;
use crate::cuda::Device;
use crate::error::Result;
use crate::transfer::ToDevice;

/// The settings both loaders share once built.
struct Run {
    workers: usize,
    prefetch: usize,
    device: Device,
    pool: PinnedPool,
    /// The epoch the next `for batch in &loader` runs.
    next_epoch: AtomicU64,
    /// The counters of the epoch started last.
    last: Mutex<Option<Arc<Counters>>>,
}

impl Run {
    fn new(workers: usize, prefetch: usize, device: Device, pool: PinnedPool) -> Run {
        Run {
            workers,
            prefetch,
            device,
            pool,
            next_epoch: AtomicU64::new(0),
            last: Mutex::new(None),
        }
    }

    fn spec<S, T>(
        &self,
        jobs: Jobs<S>,
        dataset: Option<Arc<dyn Dataset<Sample = S>>>,
        batcher: Arc<dyn Batcher<S, Batch = T>>,
        seed: EpochSeed,
    ) -> Spec<S, T> {
        Spec {
            jobs,
            dataset,
            batcher,
            workers: self.workers,
            prefetch: self.prefetch,
            device: self.device.clone(),
            pool: self.pool.clone(),
            seed,
        }
    }

    fn started(&self, counters: Arc<Counters>) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(counters);
    }

    fn stats(&self) -> Option<EpochStats> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.as_ref().map(|c| c.snapshot())
    }

    fn take_epoch(&self) -> u64 {
        self.next_epoch.fetch_add(1, Ordering::Relaxed)
    }
}

/// A prefetching loader: a dataset's samples in, batches out — collated by worker threads
/// straight into pinned memory, moved to the device without blocking, in sampler order.
///
/// Each epoch runs its own threads ([`Epoch`]): `workers` threads load and collate, one thread
/// moves batches to the device in order. Pinned memory held stays at or below
/// [`bound`](Self::bound) batches, provided the consumer drops each batch before taking the
/// next one (batches kept longer are the consumer's own memory).
///
/// `for batch in &loader` runs epoch [`next_epoch`](Self::next_epoch) and advances it, so
/// consecutive loops see different shuffles; [`set_epoch`](Self::set_epoch) sets it, and
/// [`epoch`](Self::epoch) runs a given epoch without touching it.
///
/// # Examples
///
/// ```
/// use pinnable::loader::{Loader, Rows};
/// use pinnable::Tensor;
///
/// // 100 images of 3×8×8 in one array; each sample a zero-copy view, its label its index.
/// let images = Tensor::from_vec(vec![0.5f32; 100 * 3 * 8 * 8], &[100, 3, 8, 8])?;
/// let dataset: Vec<(Tensor, i64)> = (0..100)
///     .map(|i| Ok((images.select(0, i)?, i as i64)))
///     .collect::<pinnable::Result<_>>()?;
///
/// let loader = Loader::builder(dataset)
///     .batch_size(32)
///     .shuffle(7)
///     .workers(2)
///     .build_with(|samples, c| {
///         let images = c.stack("images", samples.iter().map(|s| &s.0))?;
///         let labels = c.stack_scalars("labels", samples.iter().map(|s| s.1))?;
///         let mut out = c.finish()?;
///         Ok((out.take(images)?, out.take(labels)?))
///     })?;
///
/// let epoch = loader.iter();
/// assert_eq!(epoch.len(), 4); // 32 + 32 + 32 + 4
/// let mut seen = 0;
/// for batch in epoch {
///     let (images, labels) = batch?;
///     assert!(images.is_pinned() && images.shares_block_with(&labels));
///     seen += labels.numel();
/// }
/// assert_eq!(seen, 100);
/// println!("{}", loader.stats().unwrap());
/// # Ok::<(), pinnable::Error>(())
/// ```
pub struct Loader<D, B> {
    dataset: Arc<D>,
    batcher: Arc<B>,
    sampler: Sampler,
    run: Run,
}

impl Loader<(), ()> {
    /// Starts configuring a loader over `source`: a [`Dataset`] (giving a `Loader`) or an
    /// [`IterSource`] (giving a [`StreamLoader`]).
    pub fn builder<Src>(source: Src) -> LoaderBuilder<Src> {
        LoaderBuilder::new(source)
    }
}

impl<D, B> Loader<D, B>
where
    D: Dataset + 'static,
    D::Sample: 'static,
    B: Batcher<D::Sample> + 'static,
    B::Batch: ToDevice + 'static,
{
    pub(crate) fn from_parts(
        dataset: Arc<D>,
        batcher: Arc<B>,
        sampler: Sampler,
        workers: usize,
        prefetch: usize,
        device: Device,
        pool: PinnedPool,
    ) -> Self {
        Loader {
            dataset,
            batcher,
            sampler,
            run: Run::new(workers, prefetch, device, pool),
        }
    }

    /// Runs epoch `epoch`: its threads start now. Does not change
    /// [`next_epoch`](Self::next_epoch).
    pub fn epoch(&self, epoch: u64) -> Epoch<B::Batch> {
        let batches = self.sampler.batches(epoch);
        let n = batches.len();
        let dataset: Arc<dyn Dataset<Sample = D::Sample>> = self.dataset.clone();
        let spec = self.run.spec(
            Box::new(batches.into_iter().map(Job::Indices)),
            Some(dataset),
            self.batcher.clone(),
            EpochSeed {
                seed: self.sampler.seed(),
                epoch,
            },
        );
        let e = Epoch::new(Pipeline::start(spec), n, epoch);
        self.run.started(e.counters());
        e
    }

    /// Runs epoch [`next_epoch`](Self::next_epoch) and advances it: what `for batch in
    /// &loader` does.
    pub fn iter(&self) -> Epoch<B::Batch> {
        self.epoch(self.run.take_epoch())
    }
}

impl<D: Dataset, B> Loader<D, B> {
    /// Sets the epoch the next [`iter`](Self::iter) (or `for batch in &loader`) runs, like
    /// PyTorch's `sampler.set_epoch(e)`.
    pub fn set_epoch(&self, epoch: u64) {
        self.run.next_epoch.store(epoch, Ordering::Relaxed);
    }

    /// The epoch the next [`iter`](Self::iter) runs.
    pub fn next_epoch(&self) -> u64 {
        self.run.next_epoch.load(Ordering::Relaxed)
    }

    /// Batches per epoch (this rank's).
    pub fn len(&self) -> usize {
        self.sampler.len()
    }

    /// Whether an epoch has no batch.
    pub fn is_empty(&self) -> bool {
        self.sampler.is_empty()
    }

    /// The order and the cut into batches.
    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// The dataset.
    pub fn dataset(&self) -> &D {
        &self.dataset
    }

    /// The batcher.
    pub fn batcher(&self) -> &B {
        &self.batcher
    }

    /// Where batches are delivered.
    pub fn device(&self) -> &Device {
        &self.run.device
    }

    /// The pool batch blocks come from.
    pub fn pool(&self) -> &PinnedPool {
        &self.run.pool
    }

    /// Worker threads per epoch.
    pub fn workers(&self) -> usize {
        self.run.workers
    }

    /// The most batches whose pinned memory the loader holds at once: `prefetch + workers + 1`
    /// (the last one being the batch the consumer holds).
    pub fn bound(&self) -> usize {
        self.run.prefetch + self.run.workers + 1
    }

    /// The figures of the epoch started last (live while it runs), `None` before the first.
    pub fn stats(&self) -> Option<EpochStats> {
        self.run.stats()
    }
}

impl<D, B> IntoIterator for &Loader<D, B>
where
    D: Dataset + 'static,
    D::Sample: 'static,
    B: Batcher<D::Sample> + 'static,
    B::Batch: ToDevice + 'static,
{
    type Item = Result<B::Batch>;
    type IntoIter = Epoch<B::Batch>;

    fn into_iter(self) -> Epoch<B::Batch> {
        self.iter()
    }
}

impl<D: Dataset, B> std::fmt::Debug for Loader<D, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("samples", &self.dataset.len())
            .field("sampler", &self.sampler)
            .field("workers", &self.run.workers)
            .field("prefetch", &self.run.prefetch)
            .field("device", &self.run.device)
            .finish()
    }
}

/// A loader over a stream ([`IterSource`]): as [`Loader`], without shuffling, and its epochs
/// are plain iterators ([`StreamEpoch`]).
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
pub struct StreamLoader<F, B> {
    source: Arc<IterSource<F>>,
    batcher: Arc<B>,
    batch_size: usize,
    drop_last: bool,
    shard: (usize, usize),
    run: Run,
}

impl<F, I, S, B> StreamLoader<F, B>
where
    F: Fn(u64) -> I + Send + Sync + 'static,
    I: Iterator<Item = Result<S>> + Send + 'static,
    S: Send + 'static,
    B: Batcher<S> + 'static,
    B::Batch: ToDevice + 'static,
{
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_parts(
        source: Arc<IterSource<F>>,
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
    /// [`next_epoch`](Self::next_epoch).
    pub fn epoch(&self, epoch: u64) -> StreamEpoch<B::Batch> {
        let (rank, world) = self.shard;
        let items = shard_stream(self.source.open(epoch), rank, world);
        let jobs = Chunks {
            items,
            batch_size: self.batch_size,
            drop_last: self.drop_last,
        };
        let seed = EpochSeed { seed: None, epoch };
        let spec = self
            .run
            .spec(Box::new(jobs), None, self.batcher.clone(), seed);
        let e = StreamEpoch::new(Pipeline::start(spec), epoch);
        self.run.started(e.counters());
        e
    }

    /// Runs epoch [`next_epoch`](Self::next_epoch) and advances it: what `for batch in
    /// &loader` does.
    pub fn iter(&self) -> StreamEpoch<B::Batch> {
        self.epoch(self.run.take_epoch())
    }
}

impl<F, B> StreamLoader<F, B> {
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

impl<F, I, S, B> IntoIterator for &StreamLoader<F, B>
where
    F: Fn(u64) -> I + Send + Sync + 'static,
    I: Iterator<Item = Result<S>> + Send + 'static,
    S: Send + 'static,
    B: Batcher<S> + 'static,
    B::Batch: ToDevice + 'static,
{
    type Item = Result<B::Batch>;
    type IntoIter = StreamEpoch<B::Batch>;

    fn into_iter(self) -> StreamEpoch<B::Batch> {
        self.iter()
    }
}

impl<F, B> std::fmt::Debug for StreamLoader<F, B> {
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
