//! Configuring a loader: [`LoaderBuilder`], from [`Loader::builder`](super::Loader::builder).

use std::sync::Arc;
use std::time::Duration;

use super::batcher::Batcher;
use super::collate::Collator;
use super::launch::Launch;
use super::loaders::Loader;
use super::position::Position;
use super::sampler::Sampler;
use super::source::Source;
use super::source::sealed::Kind;
use super::tune::{START_WORKERS, Tuner};
use crate::alloc::{PinnedPool, PoolConfig};
use crate::cuda::Device;
use crate::error::{Error, Result};
use crate::transfer::ToDevice;

/// The settings of a loader over a source (a [`Dataset`](super::Dataset) or an [`IterSource`](super::IterSource)), ending in
/// `build` (a [`Batcher`]) or `build_with` (a closure).
///
/// Defaults: batches of 1, sequential order, the short last batch kept, the worker count and
/// the batches made ahead tuned while each epoch runs (within [`cores`](Self::cores)), the host
/// as the device ([`Device::cpu`]), a pinned pool of the loader's own, one rank of one.
///
/// # Examples
///
/// ```
/// use pinnable::loader::{Loader, Stack};
/// use pinnable::{Device, PinnedPool, PoolConfig, Tensor};
///
/// let data: Vec<Tensor> = (0..10).map(|i| Tensor::from_vec1(vec![i as f32; 2])).collect();
/// let loader = Loader::builder(data)
///     .batch_size(4)
///     .shuffle(7)
///     .drop_last(true)
///     .workers(2)
///     .prefetch(1)
///     .device(Device::cpu())
///     .pool(PinnedPool::new(PoolConfig::default().max_bytes(64 << 20)))
///     .shard(0, 1)
///     .build(Stack)?;
/// assert_eq!(loader.len(), 2); // 10 samples: two full batches, the short one dropped
/// assert_eq!(loader.bound(), 4); // prefetch + workers + 1 batches of pinned memory at most
/// # Ok::<(), pinnable::Error>(())
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` or `build_with`"]
pub struct LoaderBuilder<Src> {
    pub(crate) source: Src,
    /// The batch size set by hand (1 by default, or a source's own cut).
    pub(crate) batch_size: Option<usize>,
    pub(crate) seed: Option<u64>,
    pub(crate) drop_last: bool,
    /// The worker count set by hand (`None`: tuned).
    pub(crate) workers: Option<usize>,
    /// Batches ahead set by hand (`None`: tuned).
    pub(crate) prefetch: Option<usize>,
    /// The most workers the tuning may start (`None`: [`default_cores`]).
    pub(crate) cores: Option<usize>,
    pub(crate) device: Device,
    pub(crate) pool: Option<PinnedPool>,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) resume: Option<Position>,
    pub(crate) in_order: bool,
    pub(crate) sample_timeout: Option<Duration>,
    /// A setting refused when it was given, reported by `build`.
    pub(crate) invalid: Option<Error>,
    /// For tests: the seed of random tuning decisions after every batch.
    #[cfg(test)]
    pub(crate) chaos: Option<u64>,
}

/// A loader's own pool for `device`, placed on its NUMA node when the host has several.
fn own_pool(device: &Device) -> PinnedPool {
    let config = PoolConfig::default();
    PinnedPool::new(match crate::numa::device_affinity(device) {
        Some(a) => config.numa_node(a.node),
        None => config,
    })
}

/// The cores each of `loaders` loaders may use: `set` by hand, else its share of `total`.
pub(crate) fn cores_each(set: Option<usize>, total: usize, loaders: usize) -> usize {
    set.unwrap_or(total / loaders.max(1)).max(1)
}

/// The cores a loader's workers may use by default: those this process may run on, less an
/// eighth of them (at least one) left for the training step; at least one.
pub(crate) fn default_cores() -> usize {
    let cores = crate::numa::cores();
    cores.saturating_sub(cores.div_ceil(8)).max(1)
}

impl<Src> LoaderBuilder<Src> {
    pub(crate) fn new(source: Src) -> Self {
        LoaderBuilder {
            source,
            batch_size: None,
            seed: None,
            drop_last: false,
            workers: None,
            prefetch: None,
            cores: None,
            device: Device::cpu(),
            pool: None,
            rank: 0,
            world: 1,
            resume: None,
            in_order: true,
            sample_timeout: None,
            invalid: None,
            #[cfg(test)]
            chaos: None,
        }
    }

    /// Samples per batch.
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = Some(batch_size);
        self
    }

    /// Shuffles every epoch from `seed` and the epoch number (datasets only: a stream cannot
    /// be shuffled).
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Drops the short last batch (and, sharded, the tail that makes ranks uneven; see
    /// [`Sampler`]).
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Worker threads that load and collate batches (at least 1), fixed: the tuning leaves
    /// the count alone. By default the count is tuned while each epoch runs: more workers while
    /// the consumer waits for data and they are busy, as long as each step raises the rate,
    /// up to [`cores`](Self::cores); each epoch starts where the last one settled. The changes
    /// and their reasons are in [`EpochStats::tuning`](super::EpochStats::tuning).
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = Some(workers);
        self
    }

    /// Batches made ahead beyond the ones being collated, fixed. Pinned memory held is at most
    /// `(prefetch + workers + 1)` batches. By default they follow the tuned worker count (as
    /// many as workers, at least 2): a loader delivering in order wants about as many batches
    /// ahead as workers, since each may finish while an older one is still being made.
    pub fn prefetch(mut self, prefetch: usize) -> Self {
        self.prefetch = Some(prefetch);
        self
    }

    /// The most worker threads the tuning may run: the cores the loader may use (at least 1).
    /// By default the cores this process may run on, less an eighth of them (at least one)
    /// left for the training step: 14 of 16, 28 of 32. Batches ahead are bounded by as many,
    /// so pinned memory stays within [`Loader::bound`] batches whatever the tuning does. No
    /// effect on a worker count set by hand. The loaders of
    /// [`build_per_device`](Self::build_per_device) share the default, each the same part;
    /// cores set here are each one's.
    pub fn cores(mut self, cores: usize) -> Self {
        self.cores = Some(cores.max(1));
        self
    }

    /// Where batches are delivered: moved to a CUDA device without blocking, or left in pinned
    /// host memory for [`Device::cpu`].
    pub fn device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// The pool batch blocks come from (by default a pool of the loader's own).
    pub fn pool(mut self, pool: PinnedPool) -> Self {
        self.pool = Some(pool);
        self
    }

    /// This process is rank `rank` of `world` in a data-parallel run: it gets its part of
    /// every epoch (see [`Sampler`] and [`IterSource`](super::IterSource) for how the parts are cut).
    pub fn shard(mut self, rank: usize, world: usize) -> Self {
        self.rank = rank;
        self.world = world;
        self
    }

    /// Starts where `position` says (from [`Loader::position`] or [`Epoch::position`] of an
    /// earlier run, stored in a checkpoint): the first batch delivered is the one that run
    /// would have delivered next, with any worker count and prefetch depth. The loader starts
    /// at the position's epoch ([`next_epoch`](Loader::next_epoch)); that epoch's order is
    /// computed and its batches before the position are skipped without being loaded, so
    /// resuming costs the same at batch 10 as at batch 10⁶.
    ///
    /// `build` checks the position against the loader: it must come from a loader with the
    /// same dataset length, batch size, world size, rank, seed and `drop_last`. A stream
    /// loader resumes mid-epoch only if its source is [`Seekable`](super::Seekable).
    ///
    /// [`Epoch::position`]: super::Epoch::position
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::loader::{Loader, Stack};
    /// use pinnable::Tensor;
    ///
    /// let data: Vec<Tensor> = (0..30).map(|i| Tensor::from_vec1(vec![i as i32])).collect();
    /// let loader = Loader::builder(data.clone()).batch_size(5).shuffle(3).build(Stack)?;
    /// let uninterrupted: Vec<Vec<i32>> = loader.run_epoch(1).map(|b| b?.to_vec::<i32>()).collect::<pinnable::Result<_>>()?;
    ///
    /// loader.set_epoch(1);
    /// let mut epoch = loader.iter();
    /// epoch.next().unwrap()?;
    /// epoch.next().unwrap()?;
    /// let position = loader.position(); // epoch 1, 2 batches received
    /// drop(epoch); // the run stops
    ///
    /// let resumed = Loader::builder(data).batch_size(5).shuffle(3).workers(3).resume(position).build(Stack)?;
    /// let rest: Vec<Vec<i32>> = resumed.iter().map(|b| b?.to_vec::<i32>()).collect::<pinnable::Result<_>>()?;
    /// assert_eq!(rest, uninterrupted[2..]);
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn resume(mut self, position: Position) -> Self {
        self.resume = Some(position);
        self
    }

    /// Whether batches reach the consumer in the sampler's order (`true`, the default) or as
    /// soon as each is ready (`false`, like PyTorch's `DataLoader(in_order=False)`): a slow
    /// sample then holds up only its own batch, while free workers take new batches and the
    /// consumer gets theirs. An epoch still delivers the same batches, each with the same
    /// samples; only their order changes, with timing.
    ///
    /// Pinned memory stays within [`bound`](Loader::bound) batches either way. A
    /// [`Position`] taken mid-epoch while a later batch had arrived before an earlier one
    /// ([`Position::delivered_ahead`]) is refused by [`resume`](Self::resume); positions
    /// between epochs, and those without a gap, resume exactly.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::loader::{FnDataset, Loader, Stack};
    /// use pinnable::Tensor;
    ///
    /// let data = FnDataset::new(40, |i| {
    ///     if i == 3 {
    ///         std::thread::sleep(std::time::Duration::from_millis(50)); // a straggler
    ///     }
    ///     Ok(Tensor::from_vec1(vec![i as i32]))
    /// });
    /// let loader = Loader::builder(data).batch_size(4).workers(3).in_order(false).build(Stack)?;
    /// let mut seen: Vec<i32> = Vec::new();
    /// for batch in &loader {
    ///     seen.extend(batch?.to_vec::<i32>()?);
    /// }
    /// assert_ne!(seen[..4], [0, 1, 2, 3]); // batch 0 came later
    /// seen.sort();
    /// assert_eq!(seen, (0..40).collect::<Vec<_>>()); // the same samples
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn in_order(mut self, in_order: bool) -> Self {
        self.in_order = in_order;
        self
    }

    /// The longest a dataset's `get` may take for one sample. When a sample passes it, the
    /// consumer gets [`Error::Timeout`](crate::Error::Timeout) naming the sample, the worker
    /// and the wait (within a tenth of the timeout of it passing, while the consumer waits
    /// for a batch), and the epoch ends; the next epoch runs with every worker. The stuck
    /// worker cannot be stopped: it is abandoned, holding no pinned block, and ends when its
    /// call returns ([`Loader::stuck_workers`]). Datasets only: a stream's `next` is not
    /// watched. Off by default (a slow `get` is waited for).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use pinnable::loader::{FnDataset, Loader, Stack};
    /// use pinnable::{Error, Tensor};
    ///
    /// let data = FnDataset::new(8, |i| {
    ///     if i == 5 {
    ///         std::thread::sleep(Duration::from_millis(400)); // stuck, for a while
    ///     }
    ///     Ok(Tensor::from_vec1(vec![i as f32]))
    /// });
    /// let loader = Loader::builder(data)
    ///     .batch_size(2)
    ///     .workers(2)
    ///     .sample_timeout(Duration::from_millis(50))
    ///     .build(Stack)?;
    /// let err = loader.iter().find_map(|b| b.err()).unwrap();
    /// assert!(matches!(err, Error::Timeout { index: 5, .. }), "{err}");
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn sample_timeout(mut self, timeout: Duration) -> Self {
        self.sample_timeout = Some(timeout);
        self
    }

    /// Shards by `launch` and delivers to its GPU, `cuda:LOCAL_RANK` — or to the host on a
    /// machine with no CUDA device at all, so the same program runs on a laptop. A
    /// `LOCAL_RANK` past the machine's GPUs is refused at `build`
    /// ([`Error::CudaUnavailable`], naming it).
    pub fn launch(mut self, launch: Launch) -> Self {
        self = self.shard(launch.rank, launch.world);
        match launch.device() {
            Ok(device) => self.device(device),
            Err(_) if crate::cuda::Device::count() == 0 => self.device(Device::cpu()),
            Err(e) => {
                self.invalid.get_or_insert(e);
                self
            }
        }
    }

    /// Shards by the launcher's `RANK` and `WORLD_SIZE` and delivers to `cuda:LOCAL_RANK`
    /// ([`Launch::from_env`], then [`launch`](Self::launch)): one process per GPU, on any
    /// number of machines. Malformed variables are refused at `build` ([`Error::Launcher`]).
    pub fn launch_from_env(mut self) -> Self {
        match Launch::from_env() {
            Ok(launch) => self.launch(launch),
            Err(e) => {
                self.invalid.get_or_insert(e);
                self
            }
        }
    }

    /// The worker count and batches ahead this builder sets, as the tuner of one of `loaders`
    /// loaders that share this process's cores: by default each gets its share of
    /// [`default_cores`]; cores set by hand are each loader's.
    fn knobs(&self, loaders: usize) -> Tuner {
        let cores = cores_each(self.cores, default_cores(), loaders);
        let tuner = Tuner::new(self.workers, self.prefetch, cores, cores.min(START_WORKERS));
        #[cfg(test)]
        let tuner = tuner.with_chaos(self.chaos);
        tuner
    }

    /// For tests: random tuning decisions after every batch, from `seed`.
    #[cfg(test)]
    pub(crate) fn chaos(mut self, seed: u64) -> Self {
        self.chaos = Some(seed);
        self
    }

    fn check(&mut self) -> Result<()> {
        if let Some(e) = self.invalid.take() {
            return Err(e);
        }
        if self.workers == Some(0) {
            return Err(Error::Config {
                setting: "workers",
                problem: "at least one worker thread is needed".into(),
            });
        }
        Ok(())
    }

    /// The pool given, or one of the loader's own, placed on the device's NUMA node when the
    /// host has several.
    fn pool_or_own(&mut self) -> PinnedPool {
        let device = self.device.clone();
        self.pool.take().unwrap_or_else(|| own_pool(&device))
    }
}

impl<S: Source> LoaderBuilder<S> {
    /// The sampler of rank `rank` of `world` over the source, with its plans' fingerprint and,
    /// for a source that cuts its own batches, their size.
    fn sampler(&self, rank: usize, world: usize) -> Result<Sampler> {
        let make = |batch_size: usize| -> Result<Sampler> {
            let sampler = Sampler::new(Kind::samples(&self.source).unwrap_or(0), batch_size)?
                .drop_last(self.drop_last)
                .shard(rank, world)?;
            Ok(match self.seed {
                Some(seed) => sampler.shuffle(seed),
                None => sampler,
            })
        };
        let batch_size = self.batch_size.unwrap_or(1);
        let sampler = make(batch_size)?;
        let Some(plan) = Kind::plan(&self.source, &sampler, 0) else {
            return Ok(sampler);
        };
        let Some(mut lengths) = plan.cut_lengths() else {
            return Ok(sampler.fingerprinted(plan.fingerprint()));
        };
        // The source cuts its batches: a batch size set by hand must be theirs, and positions
        // carry theirs (a mix's counts per batch, one packed batch).
        let first = lengths.next().unwrap_or(batch_size);
        let uniform = lengths.all(|n| n == first);
        match self.batch_size {
            Some(b) if !uniform || b != first => Err(Error::Config {
                setting: "batch_size",
                problem: format!(
                    "{b} does not match the source, which cuts its own batches{}; remove \
                     `.batch_size({b})`",
                    if uniform {
                        format!(" of {first} samples")
                    } else {
                        String::new()
                    }
                ),
            }),
            Some(_) => Ok(sampler.fingerprinted(plan.fingerprint())),
            None => Ok(make(first)?.fingerprinted(plan.fingerprint())),
        }
    }

    /// The loader, batching with `batcher`.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a batch size or worker count of 0, a rank not below the world
    /// size, a batch size set by hand for a source that cuts its own batches into others, a
    /// shuffle or a sample timeout for a stream, or a position past the start of an epoch for
    /// a stream that is not [`Seekable`](super::Seekable); [`Error::Resume`] for a position
    /// given to [`resume`](Self::resume) that another loader's settings saved, naming the
    /// setting that differs.
    pub fn build<B>(mut self, batcher: B) -> Result<Loader<S, B>>
    where
        B: Batcher<S::Sample> + 'static,
        B::Batch: ToDevice + 'static,
    {
        self.check()?;
        let sampler = self.sampler(self.rank, self.world)?;
        Kind::check(
            &self.source,
            self.seed.is_some(),
            self.sample_timeout.is_some(),
            self.resume.as_ref(),
            &sampler,
        )?;
        let pool = self.pool_or_own();
        let knobs = self.knobs(1);
        let loader = Loader::from_parts(
            Arc::new(self.source),
            Arc::new(batcher),
            sampler,
            knobs,
            self.device,
            pool,
        )
        .delivery(self.in_order, self.sample_timeout);
        Ok(match &self.resume {
            Some(p) => loader.resume_at(p),
            None => loader,
        })
    }

    /// One loader per device in `devices`, for one process feeding several GPUs: loader `k`
    /// delivers to `devices[k]` from shard `k` of `devices.len()` (within this process's own
    /// shard, when a launcher or [`shard`](Self::shard) set one), with its own worker threads,
    /// its own pinned pool (on the device's NUMA node, unless [`pool`](Self::pool) gave one to
    /// share), and its device's copy stream. The source and the batcher are shared; a batcher
    /// that builds on the GPU reads each batch's device from its
    /// [`Collator`](super::Collator::device). Worker, prefetch and [`cores`](Self::cores)
    /// settings apply to each loader; left to their defaults, the loaders share the process's
    /// cores (each tunes within its share). Run each loader's epochs on a thread of its own, as
    /// each GPU's training step does.
    ///
    /// A position given to [`resume`](Self::resume) (saved by any one of the loaders) resumes
    /// every loader at its epoch and batch: data-parallel steps take one batch on every
    /// device.
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build), and [`Error::Config`] for an empty `devices`.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::loader::{Loader, Stack};
    /// use pinnable::{Device, Tensor};
    ///
    /// let data: Vec<Tensor> = (0..12).map(|i| Tensor::from_vec1(vec![i as f32; 2])).collect();
    /// let devices = [Device::cpu(), Device::cpu()]; // CUDA devices in a real run
    /// let loaders = Loader::builder(data).batch_size(3).workers(1).build_per_device(&devices, Stack)?;
    /// assert_eq!(loaders.iter().map(|l| l.len()).sum::<usize>(), 4); // 12 samples, 6 a device
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn build_per_device<B>(
        mut self,
        devices: &[Device],
        batcher: B,
    ) -> Result<Vec<Loader<S, B>>>
    where
        B: Batcher<S::Sample> + 'static,
        B::Batch: ToDevice + 'static,
    {
        self.check()?;
        if devices.is_empty() {
            return Err(Error::Config {
                setting: "devices",
                problem: "no device to build a loader for; pass at least one".into(),
            });
        }
        let n = devices.len();
        let samplers = (0..n)
            .map(|k| self.sampler(self.rank * n + k, self.world * n))
            .collect::<Result<Vec<_>>>()?;
        // A position was saved by one of this process's loaders: check against that one.
        let k = self.resume.as_ref().map_or(0, |p| {
            let (rank, _) = p.shard();
            usize::try_from(rank)
                .ok()
                .and_then(|r| r.checked_sub(self.rank * n))
                .filter(|&k| k < n)
                .unwrap_or(0)
        });
        Kind::check(
            &self.source,
            self.seed.is_some(),
            self.sample_timeout.is_some(),
            self.resume.as_ref(),
            &samplers[k],
        )?;
        let shared_pool = self.pool.take();
        let knobs = self.knobs(n);
        let (source, batcher) = (Arc::new(self.source), Arc::new(batcher));
        let resume = self.resume;
        Ok(devices
            .iter()
            .zip(samplers)
            .map(|(device, sampler)| {
                let pool = shared_pool.clone().unwrap_or_else(|| own_pool(device));
                let loader = Loader::from_parts(
                    source.clone(),
                    batcher.clone(),
                    sampler,
                    knobs.clone(),
                    device.clone(),
                    pool,
                )
                .delivery(self.in_order, self.sample_timeout);
                match &resume {
                    Some(p) => loader.resume_at(p),
                    None => loader,
                }
            })
            .collect())
    }

    /// The loader, batching with the closure `batch(samples, collator)`: [`build`](Self::build)
    /// for a closure, whose argument types Rust infers only where the expected signature is
    /// spelled out, as here.
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build).
    pub fn build_with<F, T>(self, batch: F) -> Result<Loader<S, F>>
    where
        F: Fn(Vec<S::Sample>, &mut Collator) -> Result<T> + Send + Sync + 'static,
        T: ToDevice + Send + 'static,
    {
        self.build(batch)
    }
}
