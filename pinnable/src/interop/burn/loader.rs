//! Our [`Loader`] as burn's `DataLoader`: [`BurnLoader`].

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock};

use burn_core::data::dataloader::{DataLoader, DataLoaderIterator, Progress};
use burn_core::data::dataset::DatasetError;
use burn_tensor::Device as BurnDevice;

use crate::cuda::Device;
use crate::error::{Error, Result};
use crate::loader::{Batcher, Dataset, Epoch, Loader, Sampler};
use crate::transfer::ToDevice;

/// The loader an adapter reads, or why it cannot run.
type Source<D, B> = std::result::Result<Arc<Loader<D, B>>, String>;

/// Which of our devices batches go to for a burn device.
type Placement = Arc<dyn Fn(&BurnDevice) -> Result<Device> + Send + Sync>;

/// A [`Loader`] as burn's [`DataLoader`]: give it to burn's `Learner` (its
/// `SupervisedTraining`), its `Evaluator`, or any code that takes `Arc<dyn DataLoader<O>>`.
///
/// Batches are made as the loader makes them — collated into pinned memory by its workers,
/// moved to its device with stream-ordered copies, in its order — and each one is turned into
/// burn's batch type `O` by `convert(batch, &burn_device)` on the thread that iterates.
/// [`to_burn_float`](super::to_burn_float) and [`to_burn_int`](super::to_burn_int) make
/// burn tensors of host tensors with no copy of ours (burn's CPU backend reads the pinned block
/// in place). A batch's block goes back to the pool when burn drops the last tensor over it, so
/// the loader's [`bound`](Loader::bound) holds while burn keeps no batch past its step.
///
/// - **Items** are samples: [`num_items`](DataLoader::num_items) is the samples an epoch's
///   batches hold and the iterator's `progress()` counts the samples delivered so far (after
///   a resume, from the resumed batch on). Batches of a fixed size are assumed; a dataset that
///   plans batches of its own sizes (a token budget, a mix) is counted as `batch_size` a batch.
/// - **Epochs**: each `iter()` runs the loader's next epoch, so consecutive epochs are
///   shuffled differently, as `for batch in &loader` does.
/// - **Devices**: burn splits a loader across devices with `slice(start, end)` (equal item
///   ranges, the remainder to the last) and then `to_device`. Here `slice` recognises which
///   part of burn's split it is asked for and returns that part of **our** shard instead: the
///   loader of rank `rank * n + k` of `world * n`, which has the same number of batches as
///   every other part (without `drop_last` a few samples repeat to even the parts out, with
///   it the uneven tail is dropped, as [`Sampler`] says). `to_device` turns burn's device into
///   ours with the [`placement`](Self::placement) (by default the loader's own device).
/// - **Errors**: a sample that fails, a batch that cannot be made or converted, or a panic in
///   `convert` reaches burn as a `DatasetError` in the batch's place (its message names the
///   sample; [`std::error::Error::source`] gives our [`Error`]), never as a panic. A slice or a
///   device that cannot be served gives a loader whose iterator yields one error saying why.
/// - **Resume**: build the [`Loader`] with [`resume`](crate::loader::LoaderBuilder::resume)
///   and the adapter starts at the next batch; [`position`](Self::position) gives the position
///   to store.
///
/// # Examples
///
/// burn picks its backend from its own features (`flex` for the CPU, `cuda`, ...), which this
/// crate does not turn on, so this example is only compiled here; `examples/burn_train.rs`
/// runs a whole training with burn's `Learner`.
///
/// ```no_run
/// use burn_core::data::dataloader::DataLoader;
/// use burn_tensor::{Device, Int, Tensor};
/// use pinnable::interop::burn::{BurnLoader, to_burn_float, to_burn_int};
/// use pinnable::loader::{FnDataset, Loader};
///
/// // 10 samples: 4 features and a label each.
/// let dataset = FnDataset::new(10, |i| {
///     Ok((pinnable::Tensor::from_vec(vec![i as f32; 4], &[4])?, i as i64))
/// });
/// let loader = Loader::builder(dataset).batch_size(4).shuffle(7).build_with(|samples, c| {
///     let x = c.stack("x", samples.iter().map(|s| &s.0))?;
///     let y = c.stack_scalars("y", samples.iter().map(|s| s.1))?;
///     let mut out = c.finish()?;
///     Ok((out.take(x)?, out.take(y)?))
/// })?;
/// let burn = BurnLoader::new(loader, Device::default(), |(x, y), device| {
///     Ok((to_burn_float::<2>(&x, device)?, to_burn_int::<1>(&y, device)?))
/// });
/// assert_eq!(burn.num_items(), 10);
/// let mut seen = 0;
/// for batch in burn.iter() {
///     let (x, y): (Tensor<2>, Tensor<1, Int>) = batch?;
///     assert_eq!(x.dims()[0], y.dims()[0]);
///     seen += y.dims()[0];
/// }
/// assert_eq!(seen, 10);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct BurnLoader<D, B, F> {
    /// The loader this adapter was built on or sliced from.
    parent: Arc<Loader<D, B>>,
    /// The part of `parent` burn asked for with `slice`, if any.
    part: Option<Part>,
    /// Our device for the burn device `to_device` named, when it is not `parent`'s.
    ours: Option<Device>,
    /// The loader batches come from, made at first use (a slice's part is known only once
    /// burn has asked for all of its parent's slices).
    source: Arc<OnceLock<Source<D, B>>>,
    /// The slices burn asked of this adapter (the siblings of each).
    slices: Arc<Mutex<Vec<(usize, usize)>>>,
    convert: Arc<F>,
    device: BurnDevice,
    placement: Placement,
    /// The number of devices burn splits the loader over, when the user said.
    devices: Option<usize>,
}

/// A slice burn asked for: items `start..end` of `total`, and the slices asked of the same
/// parent (this one among them).
#[derive(Clone)]
struct Part {
    start: usize,
    end: usize,
    total: usize,
    siblings: Arc<Mutex<Vec<(usize, usize)>>>,
}

impl<D, B, F> Clone for BurnLoader<D, B, F> {
    fn clone(&self) -> Self {
        BurnLoader {
            parent: self.parent.clone(),
            part: self.part.clone(),
            ours: self.ours.clone(),
            source: self.source.clone(),
            slices: self.slices.clone(),
            convert: self.convert.clone(),
            device: self.device.clone(),
            placement: self.placement.clone(),
            devices: self.devices,
        }
    }
}

impl<D, B, F> std::fmt::Debug for BurnLoader<D, B, F>
where
    D: Dataset + 'static,
    D::Sample: 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BurnLoader")
            .field("parent", &self.parent)
            .field("part", &self.part.as_ref().map(|p| (p.start, p.end)))
            .field("device", &self.device)
            .finish()
    }
}

impl<D, B, F, O> BurnLoader<D, B, F>
where
    D: Dataset + 'static,
    D::Sample: 'static,
    B: Batcher<D::Sample> + 'static,
    B::Batch: ToDevice + 'static,
    F: Fn(B::Batch, &BurnDevice) -> Result<O> + Send + Sync + 'static,
    O: 'static,
{
    /// `loader`'s batches as burn's, made by `convert(batch, device)` on burn's `device`.
    pub fn new(loader: Loader<D, B>, device: BurnDevice, convert: F) -> Self {
        let ours = loader.device().clone();
        let parent = Arc::new(loader);
        BurnLoader {
            source: Arc::new(OnceLock::from(Ok(parent.clone()))),
            parent,
            part: None,
            ours: None,
            slices: Arc::default(),
            convert: Arc::new(convert),
            device,
            placement: Arc::new(move |_| Ok(ours.clone())),
            devices: None,
        }
    }

    /// Which of our devices serves a burn device that [`to_device`](DataLoader::to_device)
    /// names: batches then move there before `convert` sees them. By default every burn device
    /// is served by the loader's own device (right for burn's CPU backends, and for one GPU).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use burn_tensor::Device as BurnDevice;
    /// use pinnable::interop::burn::BurnLoader;
    /// use pinnable::loader::{Loader, Stack};
    /// use pinnable::{Device, Tensor};
    ///
    /// let data: Vec<Tensor> = (0..8).map(|i| Tensor::from_vec1(vec![i as f32])).collect();
    /// let loader = Loader::builder(data).batch_size(2).build(Stack)?;
    /// let burn = BurnLoader::new(loader, BurnDevice::default(), |t, _| Ok(t))
    ///     .placement(|_burn_device| Ok(Device::cpu()));
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn placement(
        mut self,
        place: impl Fn(&BurnDevice) -> Result<Device> + Send + Sync + 'static,
    ) -> Self {
        self.placement = Arc::new(place);
        self
    }

    /// Says that burn splits this loader over `n` devices. Needed only when burn's cut of the
    /// items over different numbers of devices gives the same slices and the adapter cannot
    /// tell them apart (a few items over many devices); it says so when it is.
    pub fn devices(mut self, n: usize) -> Self {
        self.devices = Some(n);
        self
    }

    /// The loader this adapter was built on (for a slice, the one it was cut from).
    pub fn loader(&self) -> &Loader<D, B> {
        &self.parent
    }

    /// The burn device batches are made on.
    pub fn device(&self) -> &BurnDevice {
        &self.device
    }

    /// Where the consumer is, to store in a checkpoint ([`Loader::position`]); for a part of
    /// a split, that part's position.
    pub fn position(&self) -> crate::loader::Position {
        match self.source() {
            Ok(loader) => loader.position(),
            Err(_) => self.parent.position(),
        }
    }

    /// The loader batches come from: made now if it was not yet.
    fn source(&self) -> std::result::Result<&Arc<Loader<D, B>>, String> {
        self.source
            .get_or_init(|| {
                let (k, n) = match &self.part {
                    None => (0, 1),
                    Some(p) => {
                        let siblings = p.siblings.lock().unwrap_or_else(|e| e.into_inner());
                        resolve(p.total, p.start, p.end, self.devices, &siblings)?
                    }
                };
                let device = self
                    .ours
                    .clone()
                    .unwrap_or_else(|| self.parent.device().clone());
                self.parent
                    .part(k, n, device)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// This adapter, changed by `change`, with its loader made afresh at first use.
    fn derived(&self, change: impl FnOnce(&mut Self)) -> Arc<Self> {
        let mut next = self.clone();
        next.source = Arc::default();
        next.slices = Arc::default();
        change(&mut next);
        if next.part.is_none() && next.ours.is_none() {
            next.source = self.source.clone();
        }
        Arc::new(next)
    }

    /// This adapter refusing to run, saying `why`: its iterator yields that error.
    fn refusing(&self, why: String) -> Arc<Self> {
        let mut next = self.clone();
        next.part = None;
        next.ours = None;
        next.slices = Arc::default();
        next.source = Arc::new(OnceLock::from(Err(why)));
        Arc::new(next)
    }
}

/// The samples an epoch of `sampler` delivers in its batches.
fn items(sampler: &Sampler) -> usize {
    if sampler.drops_last() {
        sampler.len() * sampler.batch_size()
    } else {
        sampler.samples_per_rank()
    }
}

/// burn's `split_dataloader` cut of `total` items over `n` devices: `total / n` items a part,
/// the remainder to the last.
fn burn_cut(total: usize, n: usize) -> Vec<(usize, usize)> {
    let step = total / n;
    (0..n)
        .map(|k| (k * step, if k + 1 == n { total } else { (k + 1) * step }))
        .collect()
}

/// Which part of burn's cut the items `start..end` of `total` are: `(k, n)` for part `k` of an
/// `n`-way cut, among `n` in `within`. Every `n` that fits is returned.
fn burn_parts(
    total: usize,
    start: usize,
    end: usize,
    within: Option<usize>,
) -> Vec<(usize, usize)> {
    if start >= end || end > total {
        return Vec::new();
    }
    let candidates = match within {
        Some(n) => n..=n,
        None => 2..=total,
    };
    candidates
        .filter_map(|n| {
            let step = total.checked_div(n)?;
            if step == 0 || !start.is_multiple_of(step) {
                return None;
            }
            let k = start / step;
            let part_end = if k + 1 == n { total } else { start + step };
            (k < n && part_end == end).then_some((k, n))
        })
        .collect()
}

/// The part `start..end` of `total` is: the one cut that fits it, or among several, the one
/// whose every slice burn asked for (`asked`).
fn resolve(
    total: usize,
    start: usize,
    end: usize,
    within: Option<usize>,
    asked: &[(usize, usize)],
) -> std::result::Result<(usize, usize), String> {
    let fits = burn_parts(total, start, end, within);
    let complete: Vec<(usize, usize)> = fits
        .iter()
        .copied()
        .filter(|&(_, n)| burn_cut(total, n).iter().all(|r| asked.contains(r)))
        .collect();
    match (&fits[..], &complete[..]) {
        ([one], _) | (_, [one]) => Ok(*one),
        ([], _) => Err(format!(
            "slice({start}, {end}) of {total} items is not one of the equal parts burn's \
             split_dataloader cuts{}; split with burn's split_dataloader, or build a loader \
             per device with LoaderBuilder::build_per_device",
            within.map_or_else(String::new, |n| format!(" over {n} devices"))
        )),
        (several, _) => Err(format!(
            "slice({start}, {end}) of {total} items is a part of burn's split over any of {:?} \
             devices; say how many with BurnLoader::devices(n)",
            several.iter().map(|&(_, n)| n).collect::<Vec<_>>()
        )),
    }
}

impl<D, B, F, O> DataLoader<O> for BurnLoader<D, B, F>
where
    D: Dataset + 'static,
    D::Sample: 'static,
    B: Batcher<D::Sample> + 'static,
    B::Batch: ToDevice + 'static,
    F: Fn(B::Batch, &BurnDevice) -> Result<O> + Send + Sync + 'static,
    O: 'static,
    Loader<D, B>: Send + Sync,
{
    fn iter<'a>(&'a self) -> Box<dyn DataLoaderIterator<O> + 'a> {
        let loader = match self.source() {
            Ok(loader) => loader,
            Err(why) => {
                return Box::new(RefusedEpoch(Some(why), std::marker::PhantomData));
            }
        };
        let epoch = loader.iter();
        let sampler = loader.sampler();
        let first = usize::try_from(epoch.position().batch()).unwrap_or(usize::MAX);
        Box::new(BurnEpoch {
            epoch,
            convert: &*self.convert,
            device: &self.device,
            batch_size: sampler.batch_size(),
            total: items(sampler),
            received: first,
        })
    }

    fn num_items(&self) -> usize {
        self.source().map_or(0, |loader| items(loader.sampler()))
    }

    fn to_device(&self, device: &BurnDevice) -> Arc<dyn DataLoader<O>> {
        match (self.placement)(device) {
            Ok(ours) => self.derived(|next| {
                next.device = device.clone();
                next.ours = (ours != *self.parent.device()).then_some(ours);
            }),
            Err(e) => self.refusing(e.to_string()),
        }
    }

    fn slice(&self, start: usize, end: usize) -> Arc<dyn DataLoader<O>> {
        let loader = match self.source() {
            Ok(loader) => loader.clone(),
            Err(why) => return self.refusing(why),
        };
        let total = items(loader.sampler());
        if start == 0 && end == total {
            return Arc::new(self.clone());
        }
        self.slices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((start, end));
        let siblings = self.slices.clone();
        let mut next = self.clone();
        next.parent = loader;
        next.ours = None;
        next.part = Some(Part {
            start,
            end,
            total,
            siblings,
        });
        next.source = Arc::default();
        next.slices = Arc::default();
        Arc::new(next)
    }
}

/// One epoch of a [`BurnLoader`]: our epoch's batches, converted.
struct BurnEpoch<'a, T, F> {
    epoch: Epoch<T>,
    convert: &'a F,
    device: &'a BurnDevice,
    batch_size: usize,
    /// The samples of an epoch.
    total: usize,
    /// Batches received, counting those a resume skipped.
    received: usize,
}

impl<T, F, O> Iterator for BurnEpoch<'_, T, F>
where
    F: Fn(T, &BurnDevice) -> Result<O>,
{
    type Item = std::result::Result<O, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        let batch = match self.epoch.next()? {
            Ok(batch) => batch,
            Err(e) => return Some(Err(DatasetError::new(e))),
        };
        self.received += 1;
        let converted = catch_unwind(AssertUnwindSafe(|| (self.convert)(batch, self.device)))
            .unwrap_or_else(|panic| {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic without a message".into());
                Err(Error::Panicked {
                    what: format!(
                        "the conversion into burn's batch (batch {} of epoch {})",
                        self.received - 1,
                        self.epoch.number()
                    ),
                    message,
                })
            });
        Some(converted.map_err(DatasetError::new))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.epoch.size_hint()
    }
}

impl<T, F, O> DataLoaderIterator<O> for BurnEpoch<'_, T, F>
where
    F: Fn(T, &BurnDevice) -> Result<O>,
{
    fn progress(&self) -> Progress {
        Progress::new(
            (self.received * self.batch_size).min(self.total),
            self.total,
            Some("items".into()),
        )
    }
}

/// The epoch of a loader that cannot run: one error, then the end.
struct RefusedEpoch<O>(Option<String>, std::marker::PhantomData<fn() -> O>);

impl<O> Iterator for RefusedEpoch<O> {
    type Item = std::result::Result<O, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        let why = self.0.take()?;
        Some(Err(DatasetError::new(super::error(why))))
    }
}

impl<O> DataLoaderIterator<O> for RefusedEpoch<O> {
    fn progress(&self) -> Progress {
        Progress::new(0, 0, Some("items".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::{burn_cut, burn_parts, resolve};

    #[test]
    fn every_part_of_burns_split_is_recognised() {
        let mut rng = crate::loader::SplitMix64::for_test("burn_parts");
        for _ in 0..200 {
            let n = 2 + rng.below(7) as usize;
            let total = n + rng.below(5000) as usize;
            let cut = burn_cut(total, n);
            for (k, &(start, end)) in cut.iter().enumerate() {
                assert!(burn_parts(total, start, end, None).contains(&(k, n)));
                assert_eq!(burn_parts(total, start, end, Some(n)), vec![(k, n)]);
                assert_eq!(
                    resolve(total, start, end, None, &cut),
                    Ok((k, n)),
                    "{start}..{end} of {total}"
                );
            }
        }
    }

    #[test]
    fn ambiguous_and_foreign_slices_are_not_guessed() {
        // 10 items: [6, 10) ends burn's split over 3, 4 and 7 devices.
        assert_eq!(burn_parts(10, 6, 10, None), vec![(2, 3), (3, 4), (6, 7)]);
        assert_eq!(burn_parts(10, 6, 10, Some(4)), vec![(3, 4)]);
        let alone = resolve(10, 6, 10, None, &[(6, 10)]).unwrap_err();
        assert!(alone.contains("BurnLoader::devices"), "{alone}");
        assert_eq!(resolve(10, 6, 10, None, &burn_cut(10, 4)), Ok((3, 4)));
        for (start, end) in [(3, 50), (50, 40), (0, 101)] {
            let e = resolve(100, start, end, None, &[]).unwrap_err();
            assert!(e.contains("not one of the equal parts"), "{e}");
        }
    }
}
