use std::sync::Arc;
use std::time::Instant;

use super::sampler::SplitMix64;
use super::stats::Counters;
use crate::alloc::PinnedPool;
use crate::batch::{BatchLayout, Slot, TensorMut};
use crate::cuda::Device;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

pub use collated::Collated;

#[path = "collated.rs"]
mod collated;

type Fill = Box<dyn Fn(&mut TensorMut<'_>) -> Result<()> + Send>;

/// Writes the sample at a batch position into its row.
type WriteRow = Box<dyn FnMut(usize, &mut TensorMut<'_>, SplitMix64) -> Result<()> + Send>;

/// What decides a batch's random draws: the loader's seed (its shuffle seed; none when it does
/// not shuffle) and the epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct EpochSeed {
    pub(crate) seed: Option<u64>,
    pub(crate) epoch: u64,
}

impl EpochSeed {
    /// The random stream of the sample at dataset index `index`: a function of the seed, the
    /// epoch and the index only.
    fn sample_rng(self, index: usize) -> SplitMix64 {
        let base = SplitMix64::for_epoch(self.seed.unwrap_or(0), self.epoch).next_u64();
        let mut mix = SplitMix64::new(base ^ (index as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
        SplitMix64::new(mix.next_u64())
    }
}

/// What `finish` writes into one planned tensor.
enum Write {
    /// Row `i` is a copy of tensor `i`.
    TensorRows(Vec<Tensor>),
    /// Row `i` starts with tensor `i`; `fill` writes the rest of the row.
    Padded { rows: Vec<Tensor>, fill: Fill },
    /// The whole tensor is a copy of this one (scalars gathered at plan time).
    Whole(Tensor),
    /// Left for the caller to write ([`Collated::view_mut`]).
    Empty,
    /// Row `pos` is written by the sample at batch position `pos`.
    Each(WriteRow),
}

struct Planned {
    slot: Slot,
    name: String,
    write: Write,
}

/// Builds one batch in one pinned block: plan every tensor, then [`finish`](Self::finish).
/// See [how collation works](#how-collation-works).
///
/// The loader hands each [`Batcher`](super::Batcher) call a fresh collator that knows the
/// dataset indices of the batch's samples, so errors name them; a collator made with
/// [`Collator::new`] names samples by their position in the batch instead.
///
/// # How collation works
///
/// Collation straight into pinned memory: a batch's samples are written once, into one pinned
/// block per batch, with no pageable intermediate.
///
/// A [`Collator`] works in two phases. First the batcher *plans* each tensor of the batch
/// ([`stack`](Collator::stack), [`stack_scalars`](Collator::stack_scalars),
/// [`pad`](Collator::pad), [`empty`](Collator::empty)): shapes and dtypes are checked and the
/// tensor gets its place in the batch's [`BatchLayout`], but nothing is copied yet. Then
/// [`finish`](Collator::finish) allocates the one block and performs every write; the
/// [`Collated`] result hands out the batch's tensors by their [`Slot`]s. A bad sample is
/// reported before any memory is taken, naming the sample and the tensor.
///
/// **Samples written in place.** [`write_rows`](Collator::write_rows) plans a tensor whose
/// rows the samples write themselves, during `finish`, straight into the pinned block: a
/// decoder's output lands in its row of the batch with no buffer of its own and no copy, and
/// the step allocates nothing per sample. Each sample gets its own random stream
/// ([`sample_rng`](Collator::sample_rng)), drawn from the loader's seed, the epoch and the
/// sample's index, so augmentations are reproducible whatever the number of workers.
///
/// **Why two pairs of types.** [`BatchLayout`] and [`PinnedBatch`](crate::PinnedBatch) are the mechanism: a
/// layout of tensors in one block, then the block written by whoever holds it — any code,
/// on any thread. `Collator` and [`Collated`] are that mechanism driven by a batcher's
/// *samples*: they add what only a loader knows and needs (per-sample shape checks with
/// errors naming the dataset index, padding, the multi-threaded copy of every sample's
/// bytes, the rows samples write themselves, per-sample random streams). A `Collator` plans
/// into a `BatchLayout` and `finish` writes a `PinnedBatch`; use those two directly when the
/// bytes do not come from a dataset's samples.
///
/// # Examples
///
/// ```
/// use pinnable::loader::Collator;
/// use pinnable::{PinnedPool, PoolConfig, Tensor};
///
/// let pool = PinnedPool::new(PoolConfig::default());
/// let images = [Tensor::from_vec(vec![1.0f32; 6], &[2, 3])?, Tensor::from_vec(vec![2.0f32; 6], &[2, 3])?];
/// let tokens = [Tensor::from_vec1(vec![5i64, 6, 7]), Tensor::from_vec1(vec![8i64])];
///
/// let mut c = Collator::new(&pool);
/// let im = c.stack("images", &images)?;
/// let labels = c.stack_scalars("labels", [3i64, 9])?;
/// let (tok, lengths) = c.pad("tokens", &tokens, 0i64)?;
/// let mut out = c.finish()?; // one allocation, then every write
///
/// let im = out.take(im)?;
/// assert_eq!(im.shape(), &[2, 2, 3]);
/// assert!(im.is_pinned());
/// assert_eq!(out.take(labels)?.to_vec::<i64>()?, vec![3, 9]);
/// assert_eq!(out.take(tok)?.to_vec::<i64>()?, vec![5, 6, 7, 8, 0, 0]);
/// assert_eq!(out.take(lengths)?.to_vec::<i64>()?, vec![3, 1]);
/// # Ok::<(), pinnable::Error>(())
/// ```
pub struct Collator {
    pool: PinnedPool,
    device: Device,
    indices: Option<Vec<usize>>,
    seed: EpochSeed,
    layout: BatchLayout,
    planned: Vec<Planned>,
    counters: Option<Arc<Counters>>,
}

impl Collator {
    /// A collator that takes its block from `pool`.
    pub fn new(pool: &PinnedPool) -> Self {
        Collator {
            pool: pool.clone(),
            device: Device::cpu(),
            indices: None,
            seed: EpochSeed::default(),
            layout: BatchLayout::new(),
            planned: Vec::new(),
            counters: None,
        }
    }

    /// The loader's collator for a batch of the samples at `indices`, in the epoch `seed` says.
    pub(crate) fn for_batch(
        pool: &PinnedPool,
        device: &Device,
        indices: Vec<usize>,
        seed: EpochSeed,
        counters: Arc<Counters>,
    ) -> Self {
        Collator {
            device: device.clone(),
            indices: Some(indices),
            seed,
            counters: Some(counters),
            ..Collator::new(pool)
        }
    }

    /// The epoch the batch belongs to, when the loader made this collator; 0 otherwise.
    pub fn epoch(&self) -> u64 {
        self.seed.epoch
    }

    /// A random stream for the sample at batch position `pos`, for augmentations (crops,
    /// flips, ...): a function of the loader's shuffle seed (0 when it does not shuffle), the
    /// epoch and the sample's dataset index only, so the same sample draws the same numbers in
    /// the same epoch whatever the number of workers or the batch it falls in, and other
    /// numbers in another epoch. [`write_rows`](Self::write_rows) hands each sample its own.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::loader::Collator;
    /// use pinnable::PinnedPool;
    ///
    /// let c = Collator::new(PinnedPool::global());
    /// assert_eq!(c.sample_rng(3).next_u64(), c.sample_rng(3).next_u64());
    /// assert_ne!(c.sample_rng(3).next_u64(), c.sample_rng(4).next_u64());
    /// ```
    pub fn sample_rng(&self, pos: usize) -> SplitMix64 {
        self.seed.sample_rng(self.index_of(pos))
    }

    /// The dataset indices of the batch's samples, in batch order, when the loader made this
    /// collator (positions in a stream for a stream source); empty otherwise.
    pub fn indices(&self) -> &[usize] {
        self.indices.as_deref().unwrap_or_default()
    }

    /// The device the batch is delivered to: the loader's (given once, to
    /// [`LoaderBuilder::device`](super::LoaderBuilder::device)), or the one given to
    /// [`with_device`](Self::with_device); [`Device::cpu()`] otherwise. A batcher that builds its batch on the GPU
    /// (decoding JPEGs on its engines, gathering token windows, packing documents) reads it
    /// here, so the device is never named twice.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// This collator, for a batch delivered to `device` (what the loader does for its own): for
    /// calling a batcher by hand.
    pub fn with_device(mut self, device: &Device) -> Self {
        self.device = device.clone();
        self
    }

    /// The pool the batch's block comes from.
    pub fn pool(&self) -> &PinnedPool {
        &self.pool
    }

    /// The bytes of the block planned so far.
    pub fn bytes(&self) -> usize {
        self.layout.bytes()
    }

    /// The sample at batch position `pos`, as errors name it.
    fn index_of(&self, pos: usize) -> usize {
        self.indices
            .as_ref()
            .and_then(|ix| ix.get(pos).copied())
            .unwrap_or(pos)
    }

    fn sample_error(&self, pos: usize, name: &str, source: Error) -> Error {
        let source = match source {
            Error::Field { .. } => source,
            other => Error::Field {
                path: name.to_owned(),
                message: other.to_string(),
            },
        };
        Error::Sample {
            index: self.index_of(pos),
            during: "collating",
            source: Box::new(source),
        }
    }

    fn field_error(name: &str, message: String) -> Error {
        Error::Field {
            path: name.to_owned(),
            message,
        }
    }

    fn plan(&mut self, name: &str, dtype: DType, shape: &[usize], write: Write) -> Result<Slot> {
        let slot = self
            .layout
            .push(dtype, shape)
            .map_err(|e| Self::field_error(name, e.to_string()))?;
        self.planned.push(Planned {
            slot,
            name: name.to_owned(),
            write,
        });
        Ok(slot)
    }

    /// Checks that every tensor is host data of the first one's dtype and, when `same_shape`,
    /// shape (else rank and every dimension but the first); returns them.
    fn gather<'t>(
        &self,
        name: &str,
        tensors: impl IntoIterator<Item = &'t Tensor>,
        same_shape: bool,
    ) -> Result<Vec<Tensor>> {
        let tensors: Vec<Tensor> = tensors.into_iter().cloned().collect();
        let Some(first) = tensors.first() else {
            return Err(Self::field_error(
                name,
                "there are no samples to collate".into(),
            ));
        };
        for (pos, t) in tensors.iter().enumerate() {
            let problem = if !t.placement().is_host() {
                Some(format!(
                    "the tensor is on {}; collate host tensors (move it with `to_cpu`)",
                    t.placement()
                ))
            } else if t.dtype() != first.dtype() {
                Some(format!(
                    "dtype {} differs from {} of the batch's first sample",
                    t.dtype(),
                    first.dtype()
                ))
            } else if same_shape && t.shape() != first.shape() {
                Some(format!(
                    "shape {:?} differs from {:?} of the batch's first sample",
                    t.shape(),
                    first.shape()
                ))
            } else if !same_shape && (t.rank() == 0 || t.shape()[1..] != first.shape()[1..]) {
                Some(format!(
                    "shape {:?} cannot be padded along its first dimension together with {:?} \
                     of the batch's first sample: every dimension but the first must agree",
                    t.shape(),
                    first.shape()
                ))
            } else {
                None
            };
            if let Some(message) = problem {
                return Err(self.sample_error(pos, name, Self::field_error(name, message)));
            }
        }
        Ok(tensors)
    }

    /// Plans a tensor `[B, ...]` whose row `i` is tensor `i` (any strides; views are gathered):
    /// same-shaped tensors stacked along a new first dimension, like `torch.stack`.
    ///
    /// # Errors
    ///
    /// [`Error::Sample`] naming the first sample whose tensor is on a device or differs in
    /// dtype or shape from the first sample's; [`Error::Field`] for no tensors at all.
    pub fn stack<'t>(
        &mut self,
        name: &str,
        tensors: impl IntoIterator<Item = &'t Tensor>,
    ) -> Result<Slot> {
        let rows = self.gather(name, tensors, true)?;
        let mut shape = vec![rows.len()];
        shape.extend_from_slice(rows[0].shape());
        self.plan(name, rows[0].dtype(), &shape, Write::TensorRows(rows))
    }

    /// Plans a 1-D tensor of the values (labels, weights, lengths): `[B]` of `T`.
    ///
    /// # Errors
    ///
    /// [`Error::Field`] for no values at all.
    pub fn stack_scalars<T: Element>(
        &mut self,
        name: &str,
        values: impl IntoIterator<Item = T>,
    ) -> Result<Slot> {
        let values: Vec<T> = values.into_iter().collect();
        if values.is_empty() {
            return Err(Self::field_error(
                name,
                "there are no samples to collate".into(),
            ));
        }
        let n = values.len();
        let t = Tensor::from_vec(values, &[n])?;
        self.plan(name, T::DTYPE, &[n], Write::Whole(t))
    }

    /// Plans variable-length tensors padded to the longest: tensor `i` of shape `[len_i, ...]`
    /// becomes row `i` of a `[B, max_len, ...]` tensor, its tail filled with `value`; also plans
    /// the lengths, an `i64` tensor `[B]`. Returns both slots: (padded, lengths).
    ///
    /// # Errors
    ///
    /// [`Error::Sample`] naming the first sample whose tensor is rank 0, on a device, or
    /// differs from the first sample's in dtype or in a dimension after the first;
    /// [`Error::Field`] when `T` is not the tensors' dtype, or for no tensors at all.
    pub fn pad<'t, T: Element>(
        &mut self,
        name: &str,
        tensors: impl IntoIterator<Item = &'t Tensor>,
        value: T,
    ) -> Result<(Slot, Slot)> {
        let rows = self.gather(name, tensors, false)?;
        let dtype = rows[0].dtype();
        if dtype != T::DTYPE {
            return Err(Self::field_error(
                name,
                format!(
                    "the padding value is {} but the tensors hold {dtype}",
                    T::DTYPE
                ),
            ));
        }
        let lengths: Vec<i64> = rows.iter().map(|t| t.shape()[0] as i64).collect();
        let max = rows.iter().map(|t| t.shape()[0]).max().unwrap_or(0);
        let mut shape = vec![rows.len(), max];
        shape.extend_from_slice(&rows[0].shape()[1..]);
        let fill: Fill = Box::new(move |v| v.fill(value));
        let padded = self.plan(name, dtype, &shape, Write::Padded { rows, fill })?;
        let lengths = self.stack_scalars(&format!("{name}.lengths"), lengths)?;
        Ok((padded, lengths))
    }

    /// Plans a tensor that the caller writes after [`finish`](Self::finish), through
    /// [`Collated::view_mut`]: for anything the other building blocks do not cover. Its
    /// elements are unspecified until written (`false` for `bool`).
    ///
    /// # Errors
    ///
    /// [`Error::Field`] if the shape's byte count overflows.
    pub fn empty(&mut self, name: &str, dtype: DType, shape: &[usize]) -> Result<Slot> {
        self.plan(name, dtype, shape, Write::Empty)
    }

    /// Plans a tensor `[B, ...row]` of `dtype` whose row `i` sample `i` writes itself, in
    /// place: during [`finish`](Self::finish), `write(sample, row, rng)` gets the sample, a
    /// view of its row in the batch's pinned block and its random stream
    /// ([`sample_rng`](Self::sample_rng)). A decoder writes its output there directly: no
    /// buffer of the sample's own, no copy, and nothing allocated per sample by this step.
    /// Plan the tensors that read the samples (labels, ...) first: this one takes them.
    ///
    /// The row's elements are unspecified until written: `write` should set every one.
    ///
    /// # Errors
    ///
    /// [`Error::Field`] for no samples at all, or a shape whose byte count overflows. From
    /// [`finish`](Self::finish): the first error a `write` returns, as an [`Error::Sample`]
    /// naming the sample's index (its source unchanged, e.g. the file that could not be
    /// decoded); the batch is then not made and its block goes back to the pool.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::loader::Collator;
    /// use pinnable::{DType, PinnedPool};
    ///
    /// // Samples are only indices: each writes its pixels straight into the batch.
    /// let samples = vec![3usize, 1, 4];
    /// let mut c = Collator::new(PinnedPool::global());
    /// let labels = c.stack_scalars("labels", samples.iter().map(|&i| i as i64))?;
    /// let images = c.write_rows("images", DType::U8, &[2, 2], samples, |i, row, _rng| {
    ///     row.fill(i as u8 * 10) // a decoder would write its pixels here
    /// })?;
    /// let mut out = c.finish()?;
    /// let images = out.take(images)?;
    /// assert_eq!(images.shape(), &[3, 2, 2]);
    /// assert_eq!(images.to_vec::<u8>()?[4..8], [10; 4]);
    /// assert!(images.shares_block_with(&out.take(labels)?));
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn write_rows<S, F>(
        &mut self,
        name: &str,
        dtype: DType,
        row: &[usize],
        samples: impl IntoIterator<Item = S>,
        write: F,
    ) -> Result<Slot>
    where
        S: Send + 'static,
        F: Fn(S, &mut TensorMut<'_>, SplitMix64) -> Result<()> + Send + 'static,
    {
        let samples: Vec<S> = samples.into_iter().collect();
        if samples.is_empty() {
            return Err(Self::field_error(
                name,
                "there are no samples to collate".into(),
            ));
        }
        let mut shape = Vec::with_capacity(row.len() + 1);
        shape.push(samples.len());
        shape.extend_from_slice(row);
        let mut samples = samples.into_iter();
        let each: WriteRow = Box::new(move |pos, row, rng| match samples.next() {
            Some(s) => write(s, row, rng),
            None => Err(Error::Shape(format!("no sample for row {pos}"))),
        });
        self.plan(name, dtype, &shape, Write::Each(each))
    }

    /// Allocates the batch's one block and performs every planned write. The collator is then
    /// empty, ready to plan another batch.
    ///
    /// # Errors
    ///
    /// Allocation errors from the pool ([`Error::BudgetExceeded`], ...); [`Error::Sample`] if
    /// a sample cannot be copied or written.
    pub fn finish(&mut self) -> Result<Collated> {
        let layout = std::mem::take(&mut self.layout);
        let planned = std::mem::take(&mut self.planned);
        let mut batch = layout.allocate_in(&self.pool)?;
        if let Some(c) = &self.counters {
            c.note_block(batch.block().len(), batch.block().capacity(), &self.pool);
        }
        let slots = planned.len();
        for p in planned {
            let mut view = batch.view_mut(p.slot);
            let at = |pos: usize, e: Error| self.sample_error(pos, &p.name, e);
            match p.write {
                Write::TensorRows(rows) => {
                    for (pos, (mut row, t)) in view.rows_mut().zip(&rows).enumerate() {
                        row.copy_from(t).map_err(|e| at(pos, e))?;
                    }
                }
                Write::Padded { rows, fill } => {
                    let max = view.shape()[1];
                    for (pos, (mut row, t)) in view.rows_mut().zip(&rows).enumerate() {
                        let len = t.shape()[0];
                        let write = |row: &mut TensorMut<'_>| -> Result<()> {
                            row.narrow_mut(0, len)?.copy_from(t)?;
                            fill(&mut row.narrow_mut(len, max - len)?)
                        };
                        write(&mut row).map_err(|e| at(pos, e))?;
                    }
                }
                Write::Whole(t) => view.copy_from(&t)?,
                Write::Empty => {}
                Write::Each(mut write) => {
                    let start = Instant::now();
                    for (pos, mut row) in view.rows_mut().enumerate() {
                        let rng = self.sample_rng(pos);
                        write(pos, &mut row, rng).map_err(|e| Error::Sample {
                            index: self.index_of(pos),
                            during: "writing in place",
                            source: Box::new(e),
                        })?;
                    }
                    if let Some(c) = &self.counters {
                        c.add_write(start.elapsed());
                    }
                }
            }
        }
        Ok(Collated::new(slots, batch))
    }
}

impl std::fmt::Debug for Collator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collator")
            .field("tensors", &self.planned.len())
            .field("bytes", &self.layout.bytes())
            .finish()
    }
}
