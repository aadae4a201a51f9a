//! The two loaders: [`Loader`] over a [`Dataset`], here with the settings both share once
//! built, and [`StreamLoader`] over an [`IterSource`](super::IterSource) (in its own module).

mod stream_loader;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::batcher::Batcher;
use super::builder::LoaderBuilder;
use super::collate::EpochSeed;
use super::dataset::Dataset;
use super::epoch::Epoch;
use super::pipeline::{Job, Jobs, Pipeline, Spec};
use super::position::check_epoch;
use super::position::{Position, Progress};
use super::sampler::Sampler;
use super::stats::{Counters, EpochStats};
use super::straggler::Abandoned;
use crate::alloc::PinnedPool;
use crate::cuda::Device;
use crate::error::Result;
use crate::transfer::ToDevice;

pub use stream_loader::StreamLoader;

/// The settings both loaders share once built.
struct Run {
    workers: usize,
    prefetch: usize,
    device: Device,
    pool: PinnedPool,
    /// The epoch the next `for batch in &loader` runs.
    next_epoch: AtomicU64,
    /// The counters and the progress of the epoch started last.
    last: Mutex<Option<(Arc<Counters>, Arc<Progress>)>>,
    /// Where the epoch of a position given to the builder starts, until that epoch runs.
    resume: Mutex<Option<(u64, u64)>>,
    /// Whether batches are delivered in order ([`LoaderBuilder::in_order`]).
    in_order: bool,
    /// The longest a sample's `get` may take ([`LoaderBuilder::sample_timeout`]).
    timeout: Option<Duration>,
    /// Workers of ended epochs still inside a call past the timeout.
    abandoned: Abandoned,
}

/// Joins the abandoned workers that have returned; one still inside its call is left to end
/// on its own (it does as soon as the call returns).
impl Drop for Run {
    fn drop(&mut self) {
        self.abandoned.reap();
    }
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
            resume: Mutex::new(None),
            in_order: true,
            timeout: None,
            abandoned: Abandoned::default(),
        }
    }

    fn delivery(&mut self, in_order: bool, timeout: Option<Duration>) {
        self.in_order = in_order;
        self.timeout = timeout;
    }

    /// Resumes at batch `batch` of epoch `epoch`: the next `iter` runs that epoch from there.
    fn resume_at(&self, epoch: u64, batch: u64) {
        *self.resume.lock().unwrap_or_else(|e| e.into_inner()) = Some((epoch, batch));
        self.next_epoch.store(epoch, Ordering::Relaxed);
    }

    /// The batch epoch `epoch` starts at: where a position resumes it (once), else 0.
    fn first_batch(&self, epoch: u64) -> u64 {
        let mut resume = self.resume.lock().unwrap_or_else(|e| e.into_inner());
        match *resume {
            Some((e, batch)) if e == epoch => {
                *resume = None;
                batch
            }
            _ => 0,
        }
    }

    /// The position after the batches received from the epoch started last; before any, where
    /// the next epoch starts. `settings` gives a position under the loader's settings.
    fn position(&self, settings: impl Fn(u64, u64) -> Position) -> Position {
        if let Some((_, progress)) = &*self.last.lock().unwrap_or_else(|e| e.into_inner()) {
            return progress.position();
        }
        let resume = *self.resume.lock().unwrap_or_else(|e| e.into_inner());
        let (epoch, batch) = resume.unwrap_or((self.next_epoch.load(Ordering::Relaxed), 0));
        settings(epoch, batch)
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
            in_order: self.in_order,
            timeout: self.timeout,
            abandoned: self.abandoned.clone(),
        }
    }

    fn started(&self, counters: Arc<Counters>, progress: Arc<Progress>) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((counters, progress));
    }

    fn stats(&self) -> Option<EpochStats> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.as_ref().map(|(c, _)| c.snapshot())
    }

    /// The epoch the next `iter` runs, advanced; it stops at `u64::MAX` (such an epoch is
    /// refused when it runs) rather than wrapping to 0.
    fn take_epoch(&self) -> u64 {
        let next = |e: u64| Some(e.saturating_add(1));
        match self
            .next_epoch
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, next)
        {
            Ok(e) | Err(e) => e,
        }
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
/// [`run_epoch`](Self::run_epoch) runs a given epoch without touching it.
///
/// # Examples
///
/// ```
/// use pinnable::loader::{Loader, TensorRows};
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
    /// [`IterSource`](super::IterSource) (giving a [`StreamLoader`]).
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

    /// Starts at `position` (whose settings the builder checked).
    pub(crate) fn resume_at(self, position: &Position) -> Self {
        self.run.resume_at(position.epoch(), position.batch());
        self
    }

    /// Delivers out of order and watches samples as the builder says.
    pub(crate) fn delivery(mut self, in_order: bool, timeout: Option<Duration>) -> Self {
        self.run.delivery(in_order, timeout);
        self
    }

    /// Runs epoch `epoch`: its threads start now. Does not change
    /// [`next_epoch`](Self::next_epoch). The epoch of a position given to
    /// [`resume`](LoaderBuilder::resume) starts, the first time it runs, at the batch after
    /// the last one received.
    pub fn run_epoch(&self, epoch: u64) -> Epoch<B::Batch> {
        let first = self.run.first_batch(epoch);
        let refused = check_epoch(epoch).err();
        // A position's batch is at most the epoch's length (checked when it was given).
        let (rank, world) = self.sampler.rank_and_world();
        // A refused epoch asks the dataset for no plan.
        let planned = refused.is_none().then(|| {
            self.dataset.order(
                epoch,
                self.sampler.seed(),
                (rank, world),
                self.sampler.drops_last(),
            )
        });
        let batches = match planned.flatten() {
            Some(order) => self.sampler.batches_of(order, first as usize),
            None => self.sampler.batches_from(epoch, first as usize),
        };
        let n = if refused.is_some() { 0 } else { batches.len() };
        let dataset: Arc<dyn Dataset<Sample = D::Sample>> = self.dataset.clone();
        let spec = self.run.spec(
            Box::new(batches.take(n).map(Job::Indices)),
            Some(dataset),
            self.batcher.clone(),
            EpochSeed {
                seed: self.sampler.seed(),
                epoch,
            },
        );
        // A refused epoch has no length, so its position stays where it starts.
        let progress = Progress::new(
            self.sampler.position_at(epoch, first),
            refused.is_none().then(|| self.sampler.len()),
        );
        let mut e = Epoch::new(Pipeline::start(spec), n, epoch, progress.clone());
        if let Some(error) = refused {
            e = e.refused(error);
        }
        self.run.started(e.counters(), progress);
        e
    }

    /// Runs epoch [`next_epoch`](Self::next_epoch) and advances it: what `for batch in
    /// &loader` does.
    pub fn iter(&self) -> Epoch<B::Batch> {
        self.run_epoch(self.run.take_epoch())
    }

    /// Part `k` of `n` of this loader's shard, delivered to `device`: the loader of rank
    /// `rank * n + k` of `world * n` (as [`LoaderBuilder::build_per_device`] cuts it, so every
    /// part has the same number of batches), sharing the dataset, the batcher and the pool,
    /// with the same settings, starting at this loader's next epoch. `part(0, 1, device)` is
    /// this loader's own shard on another device. (Used by burn's adapter, which splits a loader
    /// across devices.)
    #[cfg(feature = "burn")]
    pub(crate) fn part(&self, k: usize, n: usize, device: Device) -> Result<Self> {
        let (rank, world) = self.sampler.rank_and_world();
        let sampler = self.sampler.clone().shard(rank * n + k, world * n)?;
        let part = Loader::from_parts(
            self.dataset.clone(),
            self.batcher.clone(),
            sampler,
            self.run.workers,
            self.run.prefetch,
            device,
            self.run.pool.clone(),
        )
        .delivery(self.run.in_order, self.run.timeout);
        part.set_epoch(self.next_epoch());
        Ok(part)
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

    /// Whether batches arrive in the sampler's order ([`LoaderBuilder::in_order`]).
    pub fn in_order(&self) -> bool {
        self.run.in_order
    }

    /// Worker threads of ended epochs still inside a dataset's `get` that ran past the
    /// [`sample_timeout`](LoaderBuilder::sample_timeout); those that have returned since are
    /// joined now. Each returns as soon as its call does, dropping the samples it held (it
    /// holds no pinned block); dropping the loader joins those that have returned and leaves
    /// the others to end on their own.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use pinnable::loader::{FnDataset, Loader, Stack};
    /// use pinnable::Tensor;
    ///
    /// let data = FnDataset::new(8, |i| Ok(Tensor::from_vec1(vec![i as f32])));
    /// let loader = Loader::builder(data)
    ///     .batch_size(4)
    ///     .sample_timeout(Duration::from_secs(10))
    ///     .build(Stack)?;
    /// assert_eq!(loader.iter().count(), 2);
    /// assert_eq!(loader.stuck_workers(), 0);
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn stuck_workers(&self) -> usize {
        self.run.abandoned.reap()
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

    /// Where the consumer is, to store in a checkpoint and resume from
    /// ([`LoaderBuilder::resume`]): after the last batch received from the epoch started last
    /// (at the start of the next epoch once it is over); before the first epoch, where the
    /// loader starts. [`Epoch::position`] gives an epoch's own.
    pub fn position(&self) -> Position {
        self.run
            .position(|epoch, batch| self.sampler.position_at(epoch, batch))
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
