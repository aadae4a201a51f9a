//! The loader: [`Loader`] over a [`Source`] (a dataset or a stream), and the settings it keeps
//! once built.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::batcher::Batcher;
use super::builder::LoaderBuilder;
use super::collate::EpochSeed;
use super::dataset::Dataset;
use super::epoch::Epoch;
use super::pipeline::{Jobs, Pipeline, Spec};
use super::plan::Plan;
use super::position::check_epoch;
use super::position::{Position, Progress};
use super::sampler::Sampler;
use super::source::Source;
use super::source::sealed::Kind;
use super::stats::{Counters, EpochStats};
use super::straggler::Abandoned;
use super::tune::Tuner;
use crate::alloc::PinnedPool;
use crate::cuda::Device;
use crate::error::Result;
use crate::transfer::ToDevice;

/// The settings a loader keeps once built.
struct Run {
    /// The worker count and batches ahead, and their tuning; shared with the running epoch.
    tuner: Arc<Mutex<Tuner>>,
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
    fn new(tuner: Tuner, device: Device, pool: PinnedPool) -> Run {
        Run {
            tuner: Arc::new(Mutex::new(tuner)),
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

    /// The worker count and batches ahead, and their tuning.
    fn knobs(&self) -> std::sync::MutexGuard<'_, Tuner> {
        self.tuner.lock().unwrap_or_else(|e| e.into_inner())
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
            tuner: self.tuner.clone(),
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

/// A prefetching loader: a source's samples in, batches out — collated by worker threads
/// straight into pinned memory, moved to the device without blocking, in order.
///
/// The source is a [`Dataset`] (samples by index: shuffled, sharded, planned) or an
/// [`IterSource`](super::IterSource) (a stream, read front to back); see [`Source`]. Each epoch
/// runs its own threads ([`Epoch`]): `workers` threads load and collate, one thread moves
/// batches to the device in order. Pinned memory held stays at or below
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
/// assert_eq!(loader.len(), 4); // 32 + 32 + 32 + 4
/// let epoch = loader.iter();
/// assert_eq!(epoch.remaining(), Some(4));
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
///
/// Over a stream, the same loader:
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
pub struct Loader<S, B> {
    source: Arc<S>,
    batcher: Arc<B>,
    sampler: Sampler,
    run: Run,
    /// A plan made ahead of its epoch (to count its batches), reused when the epoch runs.
    planned: Mutex<Option<(u64, Plan)>>,
}

impl Loader<(), ()> {
    /// Starts configuring a loader over `source`: a [`Dataset`] or an
    /// [`IterSource`](super::IterSource).
    pub fn builder<Src>(source: Src) -> LoaderBuilder<Src> {
        LoaderBuilder::new(source)
    }
}

impl<S, B> Loader<S, B>
where
    S: Source,
    B: Batcher<S::Sample> + 'static,
    B::Batch: ToDevice + 'static,
{
    pub(crate) fn from_parts(
        source: Arc<S>,
        batcher: Arc<B>,
        sampler: Sampler,
        tuner: Tuner,
        device: Device,
        pool: PinnedPool,
    ) -> Self {
        Loader {
            source,
            batcher,
            sampler,
            run: Run::new(tuner, device, pool),
            planned: Mutex::new(None),
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

    /// Runs epoch `epoch`: its threads start now (and, for a source that reads ahead, its
    /// reads). Does not change [`next_epoch`](Self::next_epoch). The epoch of a position given
    /// to [`resume`](LoaderBuilder::resume) starts, the first time it runs, at the batch after
    /// the last one received (a stream is opened there: [`Seekable`](super::Seekable)).
    pub fn run_epoch(&self, epoch: u64) -> Epoch<B::Batch> {
        let first = self.run.first_batch(epoch);
        let position = Kind::position_at(&*self.source, &self.sampler, epoch, first);
        if let Err(error) = check_epoch(epoch) {
            // A refused epoch asks the source for no plan, and has no length, so its
            // position stays where it starts.
            let seed = EpochSeed { seed: None, epoch };
            let spec = self.run.spec(
                Box::new(std::iter::empty()),
                None,
                self.batcher.clone(),
                seed,
            );
            let progress = Progress::new(position, None);
            let e =
                Epoch::new(Pipeline::start(spec), Some(0), epoch, progress.clone()).refused(error);
            self.run.started(e.counters(), progress);
            return e;
        }
        let plan = self.take_plan(epoch);
        let started = Kind::start(&self.source, &self.sampler, epoch, first, plan);
        let spec = self.run.spec(
            started.jobs,
            started.dataset,
            self.batcher.clone(),
            started.seed,
        );
        let progress = Progress::new(position, started.len);
        let e = Epoch::new(
            Pipeline::start(spec),
            started.batches,
            epoch,
            progress.clone(),
        );
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
    /// part has the same number of batches), sharing the source, the batcher and the pool,
    /// with the same settings, starting at this loader's next epoch. `part(0, 1, device)` is
    /// this loader's own shard on another device. (Used by burn's adapter, which splits a loader
    /// across devices.)
    #[cfg(feature = "burn")]
    pub(crate) fn part(&self, k: usize, n: usize, device: Device) -> Result<Self> {
        let (rank, world) = self.sampler.rank_and_world();
        let sampler = self.sampler.clone().shard(rank * n + k, world * n)?;
        let part = Loader::from_parts(
            self.source.clone(),
            self.batcher.clone(),
            sampler,
            self.run.knobs().clone(),
            device,
            self.run.pool.clone(),
        )
        .delivery(self.run.in_order, self.run.timeout);
        part.set_epoch(self.next_epoch());
        Ok(part)
    }
}

impl<S: Source, B> Loader<S, B> {
    /// The plan of epoch `epoch` made ahead, if any, taken; else a new one.
    fn take_plan(&self, epoch: u64) -> Option<Plan> {
        let mut planned = self.planned.lock().unwrap_or_else(|e| e.into_inner());
        match planned.take() {
            Some((e, plan)) if e == epoch => Some(plan),
            _ => None,
        }
    }

    /// Batches in epoch `epoch` (this rank's), for an indexed source.
    fn epoch_len(&self, epoch: u64) -> usize {
        let mut planned = self.planned.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((e, plan)) = &*planned
            && *e == epoch
        {
            return self.sampler.plan_len(plan);
        }
        match Kind::plan(&*self.source, &self.sampler, epoch) {
            Some(plan) => {
                let len = self.sampler.plan_len(&plan);
                *planned = Some((epoch, plan));
                len
            }
            None => self.sampler.len(),
        }
    }

    /// Sets the epoch the next [`iter`](Self::iter) (or `for batch in &loader`) runs, like
    /// PyTorch's `sampler.set_epoch(e)`.
    pub fn set_epoch(&self, epoch: u64) {
        self.run.next_epoch.store(epoch, Ordering::Relaxed);
    }

    /// The epoch the next [`iter`](Self::iter) runs.
    pub fn next_epoch(&self) -> u64 {
        self.run.next_epoch.load(Ordering::Relaxed)
    }

    /// Whether batches arrive in order ([`LoaderBuilder::in_order`]).
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

    /// The order and the cut into batches of a source the loader orders (the batch size, the
    /// seed, the shard).
    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// The source.
    pub fn source(&self) -> &S {
        &self.source
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

    /// The worker count: the one set by hand, or where the tuning stands (the next epoch
    /// starts there).
    pub fn workers(&self) -> usize {
        self.run.knobs().workers()
    }

    /// Batches made ahead: the number set by hand, or where the tuning stands.
    pub fn prefetch(&self) -> usize {
        self.run.knobs().prefetch()
    }

    /// The most batches whose pinned memory the loader holds at once: `prefetch + workers + 1`
    /// (the last one being the batch the consumer holds), at the most workers and batches
    /// ahead the tuning may set.
    pub fn bound(&self) -> usize {
        let (workers, prefetch) = self.run.knobs().limits();
        prefetch + workers + 1
    }

    /// The figures of the epoch started last (live while it runs), `None` before the first.
    pub fn stats(&self) -> Option<EpochStats> {
        self.run.stats()
    }

    /// Where the consumer is, to store in a checkpoint and resume from
    /// ([`LoaderBuilder::resume`]): after the last batch received from the epoch started last
    /// (at the start of the next epoch once it is over); before the first epoch, where the
    /// loader starts. [`Epoch::position`] gives an epoch's own. A stream resumes mid-epoch only
    /// if its source is [`Seekable`](super::Seekable).
    pub fn position(&self) -> Position {
        self.run
            .position(|epoch, batch| Kind::position_at(&*self.source, &self.sampler, epoch, batch))
    }
}

impl<D: Dataset, B> Loader<D, B>
where
    D: Source,
{
    /// Batches per epoch (this rank's): those of epoch [`next_epoch`](Self::next_epoch), for a
    /// source that plans its epochs (its plan is made now, and reused when the epoch runs).
    /// A loader over a stream has no length.
    pub fn len(&self) -> usize {
        self.epoch_len(self.next_epoch())
    }

    /// Whether an epoch has no batch.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The dataset.
    pub fn dataset(&self) -> &D {
        &self.source
    }
}

impl<S, B> IntoIterator for &Loader<S, B>
where
    S: Source,
    B: Batcher<S::Sample> + 'static,
    B::Batch: ToDevice + 'static,
{
    type Item = Result<B::Batch>;
    type IntoIter = Epoch<B::Batch>;

    fn into_iter(self) -> Epoch<B::Batch> {
        self.iter()
    }
}

impl<S: Source, B> std::fmt::Debug for Loader<S, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("samples", &Kind::samples(&*self.source))
            .field("sampler", &self.sampler)
            .field("workers", &self.workers())
            .field("prefetch", &self.prefetch())
            .field("device", &self.run.device)
            .finish()
    }
}
