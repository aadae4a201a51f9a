//! A loader and its epochs whatever the source and batcher: what the Python class drives, its
//! batches as named fields.

use super::*;

/// One field of a batch: a tensor, or a host integer (a packed batch's `max_seqlen`).
pub(crate) enum Value {
    Tensor(Tensor),
    Int(i64),
}

/// A batch's fields, in order.
pub(crate) type Named = Vec<(String, Value)>;

/// The loader's settings, as `LoaderBuilder` takes them.
#[derive(Clone)]
pub(crate) struct Options {
    pub(super) batch_size: Option<usize>,
    pub(super) seed: Option<u64>,
    pub(super) drop_last: bool,
    pub(super) workers: Option<usize>,
    pub(super) prefetch: Option<usize>,
    pub(super) cores: Option<usize>,
    pub(super) device: Device,
    pub(super) rank: usize,
    pub(super) world: usize,
    pub(super) in_order: bool,
    pub(super) sample_timeout: Option<Duration>,
}

/// A loader whatever its source and batcher: what the Python class drives.
pub(crate) trait AnyLoader: Send + Sync {
    fn iter(&self) -> Box<dyn AnyEpoch>;
    fn len(&self) -> usize;
    fn set_epoch(&self, epoch: u64);
    fn next_epoch(&self) -> u64;
    fn position(&self) -> Position;
    fn stats(&self) -> Option<EpochStats>;
    fn pool(&self) -> &PinnedPool;
    fn workers(&self) -> usize;
}

/// An epoch whatever its batch type, its batches as named fields.
pub(crate) trait AnyEpoch: Send {
    fn try_next(&mut self) -> Poll<Option<pinnable::Result<Named>>>;
    fn next_within(&mut self, timeout: Duration) -> Poll<Option<pinnable::Result<Named>>>;
    fn remaining(&self) -> Option<usize>;
}

type Convert<T> = Arc<dyn Fn(T) -> pinnable::Result<Named> + Send + Sync>;

struct Erased<D: Dataset, B: Batcher<D::Sample>> {
    loader: Loader<D, B>,
    convert: Convert<B::Batch>,
}

struct ErasedEpoch<T> {
    epoch: pinnable::loader::Epoch<T>,
    convert: Convert<T>,
}

impl<T: Send> AnyEpoch for ErasedEpoch<T> {
    fn try_next(&mut self) -> Poll<Option<pinnable::Result<Named>>> {
        self.epoch
            .try_next()
            .map(|item| item.map(|b| b.and_then(|b| (self.convert)(b))))
    }

    fn next_within(&mut self, timeout: Duration) -> Poll<Option<pinnable::Result<Named>>> {
        self.epoch
            .next_within(timeout)
            .map(|item| item.map(|b| b.and_then(|b| (self.convert)(b))))
    }

    fn remaining(&self) -> Option<usize> {
        self.epoch.remaining()
    }
}

impl<D, B> AnyLoader for Erased<D, B>
where
    D: Dataset + 'static,
    B: Batcher<D::Sample> + 'static,
    B::Batch: ToDevice + Send + 'static,
{
    fn iter(&self) -> Box<dyn AnyEpoch> {
        Box::new(ErasedEpoch {
            epoch: self.loader.iter(),
            convert: self.convert.clone(),
        })
    }

    fn len(&self) -> usize {
        self.loader.len()
    }

    fn set_epoch(&self, epoch: u64) {
        self.loader.set_epoch(epoch);
    }

    fn next_epoch(&self) -> u64 {
        self.loader.next_epoch()
    }

    fn position(&self) -> Position {
        self.loader.position()
    }

    fn stats(&self) -> Option<EpochStats> {
        self.loader.stats()
    }

    fn pool(&self) -> &PinnedPool {
        self.loader.pool()
    }

    fn workers(&self) -> usize {
        self.loader.workers()
    }
}

/// A loader over `dataset` batched by `batcher` with `options`, resuming at `resume`, its
/// batches named by `convert`.
pub(crate) fn erase<D, B>(
    dataset: D,
    batcher: B,
    options: &Options,
    resume: Option<Position>,
    convert: impl Fn(B::Batch) -> pinnable::Result<Named> + Send + Sync + 'static,
) -> PyResult<Box<dyn AnyLoader>>
where
    D: Dataset + 'static,
    B: Batcher<D::Sample> + 'static,
    B::Batch: ToDevice + Send + 'static,
{
    let o = options;
    let mut b = Loader::builder(dataset)
        .drop_last(o.drop_last)
        .device(o.device.clone())
        .shard(o.rank, o.world)
        .in_order(o.in_order);
    if let Some(n) = o.batch_size {
        b = b.batch_size(n);
    }
    if let Some(seed) = o.seed {
        b = b.shuffle(seed);
    }
    if let Some(n) = o.workers {
        b = b.workers(n);
    }
    if let Some(n) = o.prefetch {
        b = b.prefetch(n);
    }
    if let Some(n) = o.cores {
        b = b.cores(n);
    }
    if let Some(t) = o.sample_timeout {
        b = b.sample_timeout(t);
    }
    if let Some(p) = resume {
        b = b.resume(p);
    }
    let loader = b.build(batcher).py_err()?;
    Ok(Box::new(Erased {
        loader,
        convert: Arc::new(convert),
    }))
}
