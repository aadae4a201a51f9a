//! Our [`Loader`] as burn's `DataLoader`: [`BurnLoader`].

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use burn_core::data::dataloader::{DataLoader, DataLoaderIterator, Progress};
use burn_core::data::dataset::DatasetError;
use burn_tensor::Device as BurnDevice;

use crate::cuda::Device;
use crate::error::{Error, Result};
use crate::loader::{Batcher, Dataset, Epoch, Loader, Sampler};
use crate::transfer::ToDevice;

/// Which of our devices batches go to for a burn device.
type Placement = Arc<dyn Fn(&BurnDevice) -> Result<Device> + Send + Sync>;

/// A [`Loader`] as burn's [`DataLoader`]: give it to burn's `Learner` (its
/// `SupervisedTraining`), its `Evaluator`, or any code that takes `Arc<dyn DataLoader<O>>`.
///
/// Batches are made as the loader makes them — collated into pinned memory by its workers,
/// moved to its device with stream-ordered copies, in its order — and each one is turned into
/// burn's batch type `O` by `convert(batch, &burn_device)` on the thread that iterates.
/// [`to_burn_float`](super::to_burn_float) and [`to_burn_int`](super::to_burn_int) make
/// burn tensors of host tensors with no copy of ours.
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
/// ```
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
    loader: Arc<Loader<D, B>>,
    convert: Arc<F>,
    device: BurnDevice,
    placement: Placement,
    /// The number of devices burn splits the loader over, when the user said.
    devices: Option<usize>,
    /// Why this loader cannot run: every epoch yields this message as its one error.
    refused: Option<String>,
}

impl<D, B, F> Clone for BurnLoader<D, B, F> {
    fn clone(&self) -> Self {
        BurnLoader {
            loader: self.loader.clone(),
            convert: self.convert.clone(),
            device: self.device.clone(),
            placement: self.placement.clone(),
            devices: self.devices,
            refused: self.refused.clone(),
        }
    }
}

impl<D, B, F> std::fmt::Debug for BurnLoader<D, B, F>
where
    D: Dataset,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BurnLoader")
            .field("loader", &self.loader)
            .field("device", &self.device)
            .field("refused", &self.refused)
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
        BurnLoader {
            loader: Arc::new(loader),
            convert: Arc::new(convert),
            device,
            placement: Arc::new(move |_| Ok(ours.clone())),
            devices: None,
            refused: None,
        }
    }

    /// Which of our devices serves a burn device that [`to_device`](DataLoader::to_device)
    /// names: batches then move there before `convert` sees them. By default every burn device
    /// is served by the loader's own device (right for burn's CPU backends, and for one GPU).
    ///
    /// # Examples
    ///
    /// ```
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

    /// Says that burn splits this loader over `n` devices. Needed only when the items are so
    /// few that a slice burn asks for could come from splits over different numbers of
    /// devices (fewer than about `n * (n + 1)` items); the adapter says so when it is.
    pub fn devices(mut self, n: usize) -> Self {
        self.devices = Some(n);
        self
    }

    /// The loader batches come from.
    pub fn loader(&self) -> &Loader<D, B> {
        &self.loader
    }

    /// The burn device batches are made on.
    pub fn device(&self) -> &BurnDevice {
        &self.device
    }

    /// Where the consumer is, to store in a checkpoint ([`Loader::position`]).
    pub fn position(&self) -> crate::loader::Position {
        self.loader.position()
    }

    /// This adapter over another loader, or refusing with `refused`.
    fn with(&self, loader: Result<Arc<Loader<D, B>>>, device: BurnDevice) -> Arc<Self> {
        let mut next = self.clone();
        next.device = device;
        match loader {
            Ok(loader) => next.loader = loader,
            Err(e) => next.refused = Some(e.to_string()),
        }
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

/// Which part of burn's `split_dataloader` the items `start..end` of `total` are: `(k, n)`
/// for part `k` of an `n`-way split, cut as burn cuts it (`total / n` items a part, the
/// remainder to the last), among `n` in `within`. Every `n` that fits is returned.
fn burn_parts(total: usize, start: usize, end: usize, within: Option<usize>) -> Vec<(usize, usize)> {
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
            if step == 0 || start % step != 0 {
                return None;
            }
            let k = start / step;
            let part_end = if k + 1 == n { total } else { start + step };
            (k < n && part_end == end).then_some((k, n))
        })
        .collect()
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
        if let Some(why) = &self.refused {
            return Box::new(RefusedEpoch(Some(why.clone()), std::marker::PhantomData));
        }
        let epoch = self.loader.iter();
        let sampler = self.loader.sampler();
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
        if self.refused.is_some() {
            return 0;
        }
        items(self.loader.sampler())
    }

    fn to_device(&self, device: &BurnDevice) -> Arc<dyn DataLoader<O>> {
        let loader = (self.placement)(device).and_then(|ours| {
            if ours == *self.loader.device() {
                Ok(self.loader.clone())
            } else {
                self.loader.part(0, 1, ours).map(Arc::new)
            }
        });
        self.with(loader, device.clone())
    }

    fn slice(&self, start: usize, end: usize) -> Arc<dyn DataLoader<O>> {
        let total = self.num_items();
        if start == 0 && end == total {
            return Arc::new(self.clone());
        }
        let loader = match burn_parts(total, start, end, self.devices)[..] {
            [(k, n)] => self
                .loader
                .part(k, n, self.loader.device().clone())
                .map(Arc::new),
            [] => Err(burn_error(format!(
                "slice({start}, {end}) of {total} items is not one of the equal parts burn's \
                 split_dataloader cuts{}; split with burn's split_dataloader, or build a \
                 loader per device with LoaderBuilder::build_per_device",
                self.devices
                    .map_or_else(String::new, |n| format!(" over {n} devices"))
            ))),
            ref several => Err(burn_error(format!(
                "slice({start}, {end}) of {total} items is a part of burn's split over any of \
                 {:?} devices; say how many with BurnLoader::devices(n)",
                several.iter().map(|&(_, n)| n).collect::<Vec<_>>()
            ))),
        };
        self.with(loader, self.device.clone())
    }
}

fn burn_error(message: String) -> Error {
    Error::Interop {
        library: "burn",
        message,
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
        Some(Err(DatasetError::new(burn_error(why))))
    }
}

impl<O> DataLoaderIterator<O> for RefusedEpoch<O> {
    fn progress(&self) -> Progress {
        Progress::new(0, 0, Some("items".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::burn_parts;

    /// burn's own cut (split_dataloader): `total / n` a part, the remainder to the last.
    fn burn_cut(total: usize, n: usize) -> Vec<(usize, usize)> {
        let step = total / n;
        (0..n)
            .map(|k| (k * step, if k + 1 == n { total } else { (k + 1) * step }))
            .collect()
    }

    #[test]
    fn every_part_of_burns_split_is_recognised() {
        let mut rng = crate::loader::SplitMix64::for_test("burn_parts");
        for _ in 0..200 {
            let n = 2 + rng.below(7) as usize;
            let total = n * (n + 1) + rng.below(5000) as usize;
            for (k, (start, end)) in burn_cut(total, n).into_iter().enumerate() {
                assert_eq!(
                    burn_parts(total, start, end, None),
                    vec![(k, n)],
                    "{start}..{end} of {total}"
                );
                assert_eq!(burn_parts(total, start, end, Some(n)), vec![(k, n)]);
            }
        }
    }

    #[test]
    fn ambiguous_and_foreign_slices_are_not_guessed() {
        // 10 items: [6, 10) ends burn's split over 3 devices and over 4.
        assert_eq!(burn_parts(10, 6, 10, None), vec![(2, 3), (3, 4)]);
        assert_eq!(burn_parts(10, 6, 10, Some(4)), vec![(3, 4)]);
        assert!(burn_parts(100, 3, 50, None).is_empty());
        assert!(burn_parts(100, 50, 40, None).is_empty());
        assert!(burn_parts(100, 0, 101, None).is_empty());
    }
}
