//! Packed batches of documents for varlen attention ([`PackedDocs`], [`PackedBatcher`],
//! [`PackedBatch`]): what flash-attention's varlen interface and Hugging Face's
//! `DataCollatorWithFlattening` give a model.

use std::sync::{Arc, Mutex};

use super::docs::TokenDocs;
use crate::batch::Slot;
use crate::convert::Convert;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::gather::Gather;
use crate::loader::batcher::Batcher;
use crate::loader::collate::{Collated, Collator};
use crate::loader::dataset::Dataset;
use crate::loader::plan::{Plan, PlanRequest};
use crate::loader::position::PACKING_PLAN;
use crate::loader::{Budget, BudgetPlan, Piece};

#[path = "pack_batch.rs"]
mod batch;
#[path = "pack_device.rs"]
mod device;

pub use batch::PackedBatch;

/// The label of a token whose target crosses a document boundary, and of padding: what
/// PyTorch's cross-entropy ignores.
pub const IGNORE_INDEX: i64 = -100;

/// Documents batched by a [`BudgetPlan`] plan, as a [`Dataset`] for the loader: sample `i` is
/// slot `i` of an epoch's plan (every rank's batches together), and the dataset deals each
/// rank its slots and cuts one batch a slot ([`Dataset::plan`]), so every rank gets the same
/// number of batches ([`BudgetPlan::rank_slots`]). Build the loader with no batch size and
/// the batcher from [`batcher`](Self::batcher); the plan's own seed
/// ([`BudgetOptions::shuffle`](crate::loader::BudgetOptions::shuffle)) shuffles, not the
/// loader's. A position saved by such a loader carries the plan's digest, so it resumes only
/// under the same plan and documents.
///
/// # Examples
///
/// ```
/// use pinnable::formats::tokens::{PackedDocs, TokenDocs};
/// use pinnable::loader::{Budget, Loader, BudgetPlan};
/// use pinnable::{DType, Device, Tensor};
///
/// let docs: Vec<Tensor> = (1..=20u16).map(|n| Tensor::from_vec1((0..n).collect())).collect();
/// let docs = TokenDocs::from_dataset(docs)?;
/// let plan = BudgetPlan::options(Budget::Packed { row_tokens: 32, rows: 2 })
///     .shuffle(7)
///     .build(docs.lengths().clone())?;
/// let packed = PackedDocs::new(docs, plan)?;
/// let device = Device::cuda(0).unwrap_or_else(|_| Device::cpu());
/// let batcher = packed.batcher(DType::I64)?;
/// let loader = Loader::builder(packed).workers(2).device(device).build(batcher)?;
/// let mut tokens = 0;
/// for batch in &loader {
///     let batch = batch?;
///     assert!(batch.real_tokens <= 64);
///     assert_eq!(*batch.cu_seqlens_host.last().unwrap() as usize, batch.real_tokens);
///     tokens += batch.real_tokens;
/// }
/// assert!(tokens >= 210); // 1 + 2 + … + 20, some batches repeated to even the epoch
/// # Ok::<(), pinnable::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct PackedDocs {
    docs: Arc<TokenDocs>,
    plan: Arc<BudgetPlan>,
}

impl PackedDocs {
    /// The batches `plan` makes of `docs`.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when the plan was made from other lengths than the documents'.
    pub fn new(docs: impl Into<Arc<TokenDocs>>, plan: impl Into<Arc<BudgetPlan>>) -> Result<Self> {
        let (docs, plan) = (docs.into(), plan.into());
        if plan.lengths() != docs.lengths() {
            return Err(Error::Config {
                setting: "plan",
                problem: format!(
                    "the plan was made from the lengths of {} samples, not of these {} \
                     documents: build it from TokenDocs::lengths",
                    plan.lengths().len(),
                    docs.len()
                ),
            });
        }
        Ok(PackedDocs { docs, plan })
    }

    /// The documents packed into batches under `budget`, planned from their own lengths and
    /// shuffled by `seed` (the plan is the same every epoch; see [`BudgetPlan`]): what
    /// `PackedDocs::new(docs, BudgetPlan::options(budget).shuffle(seed).build(docs.lengths())?)`
    /// makes. For the plan's other settings (the sort window, long documents split or not),
    /// build the plan with [`BudgetPlan::options`] and use [`new`](Self::new).
    ///
    /// # Errors
    ///
    /// As [`BudgetOptions::build`](crate::loader::BudgetOptions::build): a budget that holds no
    /// token, or a document it cannot hold.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::formats::tokens::{PackedDocs, TokenDocs};
    /// use pinnable::loader::Budget;
    /// use pinnable::Tensor;
    ///
    /// let docs = TokenDocs::from_dataset(vec![Tensor::from_vec1(vec![1u16; 300]), Tensor::from_vec1(vec![2u16; 500])])?;
    /// let packed = PackedDocs::pack(docs, Budget::Packed { row_tokens: 512, rows: 1 }, 7)?;
    /// assert_eq!(packed.plan().len(), 2); // 300 + 500 tokens do not fit one row of 512
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn pack(docs: impl Into<Arc<TokenDocs>>, budget: Budget, seed: u64) -> Result<Self> {
        let docs = docs.into();
        let plan = BudgetPlan::options(budget)
            .shuffle(seed)
            .build(docs.lengths().clone())?;
        PackedDocs::new(docs, plan)
    }

    /// The documents.
    pub fn docs(&self) -> &Arc<TokenDocs> {
        &self.docs
    }

    /// The plan.
    pub fn plan(&self) -> &Arc<BudgetPlan> {
        &self.plan
    }

    /// The batcher of these documents for a loader delivering to `device`: `input_ids`,
    /// `labels` and `position_ids` of `dtype` ([`DType::I64`], as Hugging Face's collator, or
    /// [`DType::I32`]). For a CUDA device the documents' u16/u32 tokens are copied compact
    /// into the batch's pinned block and widened on the GPU by the gather kernels; the other
    /// fields are written on the host (see [`PackedBatch`]).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for another dtype, or i32 batches of u32 tokens on a CUDA device
    /// without a vocabulary check that keeps them below 2³¹.
    pub fn batcher(&self, dtype: DType) -> Result<PackedBatcher> {
        if !matches!(dtype, DType::I64 | DType::I32) {
            return Err(Error::Config {
                setting: "dtype",
                problem: format!("token batches are i64 or i32, not {dtype}"),
            });
        }
        Ok(PackedBatcher {
            docs: self.docs.clone(),
            plan: self.plan.clone(),
            dtype,
            fixed_shape: false,
            seq_idx: true,
            pad_id: 0,
            device_built: true,
            cache: Arc::new(Mutex::new(Vec::new())),
        })
    }
}

impl Dataset for PackedDocs {
    type Sample = usize;

    fn len(&self) -> usize {
        self.plan.len()
    }

    fn get(&self, index: usize) -> Result<usize> {
        if index >= self.plan.len() {
            return Err(Error::IndexOutOfRange {
                index,
                len: self.plan.len(),
            });
        }
        Ok(index)
    }

    /// One packed batch a slot, this rank's slots dealt from the plan's (the same every epoch;
    /// the plan shuffles by its own seed). The fingerprint: the packing plan's digest.
    fn plan(&self, r: &PlanRequest) -> Option<Plan> {
        let slots = self.plan.rank_slots(r.rank, r.world, r.drop_last);
        Some(
            Plan::batches(slots.into_iter().map(|s| vec![s]))
                .with_fingerprint(PACKING_PLAN, self.plan.digest()),
        )
    }
}

/// One epoch's batches, all ranks' together.
type EpochPlan = Arc<Vec<Vec<Piece>>>;

/// Makes [`PackedBatch`]es of plan slots, from [`PackedDocs::batcher`], for the device each
/// batch goes to (the loader's, from [`Collator::device`]). For a CUDA device the batch is
/// built there: only the documents' u16/u32 tokens and `cu_seqlens` cross the link, and the
/// crate's packing kernel writes the rest ([`device_built`](Self::device_built)). For the host,
/// or with `device_built(false)`, every field is written into the batch's one pinned block by
/// the loader's worker (for a CUDA device `input_ids` then crosses as the documents' tokens
/// and is widened there).
#[derive(Clone, Debug)]
pub struct PackedBatcher {
    docs: Arc<TokenDocs>,
    plan: Arc<BudgetPlan>,
    dtype: DType,
    fixed_shape: bool,
    seq_idx: bool,
    pad_id: u32,
    /// Whether a CUDA device's batches are built there ([`device_built`](Self::device_built)).
    device_built: bool,
    /// The plans of the epochs asked for last.
    cache: Arc<Mutex<Vec<(u64, EpochPlan)>>>,
}

impl PackedBatcher {
    /// Pads every batch to the plan's most tokens and pieces (see [`PackedBatch`]); off by
    /// default.
    #[must_use]
    pub fn fixed_shape(mut self, fixed: bool) -> Self {
        self.fixed_shape = fixed;
        self
    }

    /// Whether batches carry `seq_idx` (default: yes).
    #[must_use]
    pub fn seq_idx(mut self, on: bool) -> Self {
        self.seq_idx = on;
        self
    }

    /// The token id padding takes in fixed shape (default 0; its label is [`IGNORE_INDEX`]
    /// whatever it is).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an id the documents' token type cannot hold.
    pub fn pad_id(mut self, id: u32) -> Result<Self> {
        if self.docs.dtype() == DType::U16 && id > u32::from(u16::MAX) {
            return Err(Error::Config {
                setting: "pad_id",
                problem: format!("{id} does not fit the documents' u16 tokens"),
            });
        }
        self.pad_id = id;
        Ok(self)
    }

    /// The dtype of `input_ids`, `labels` and `position_ids`.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The pieces of slot `slot` of epoch `epoch`'s plan.
    ///
    /// # Errors
    ///
    /// [`Error::IndexOutOfRange`] for a slot past the plan's length.
    pub fn pieces(&self, epoch: u64, slot: usize) -> Result<Vec<Piece>> {
        let plan = self.epoch_plan(epoch);
        <[Vec<Piece>]>::get(&plan[..], slot)
            .cloned()
            .ok_or(Error::IndexOutOfRange {
                index: slot,
                len: plan.len(),
            })
    }

    /// The batch of slot `slot` of epoch `epoch`, through `c` (what the loader's call does
    /// with the collator's epoch).
    ///
    /// # Errors
    ///
    /// As [`pieces`](Self::pieces); [`Error::Sample`] naming a document that could not be read.
    pub fn batch_at(&self, epoch: u64, slot: usize, c: &mut Collator) -> Result<PackedBatch> {
        let pieces = self.pieces(epoch, slot)?;
        self.batch_of(pieces, c)
    }

    fn epoch_plan(&self, epoch: u64) -> EpochPlan {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, p)) = cache.iter().find(|(e, _)| *e == epoch) {
            return p.clone();
        }
        let plan = Arc::new(self.plan.batches(epoch));
        if cache.len() >= 2 {
            cache.remove(0);
        }
        cache.push((epoch, plan.clone()));
        plan
    }

    /// The batch of `pieces` (of these documents), in that order, whatever the plan: to pack
    /// documents chosen by other means, or to compare with another collator.
    ///
    /// # Errors
    ///
    /// [`Error::Sample`] naming a piece outside its document, or a document that could not be
    /// read; [`Error::Config`] for more pieces or tokens than a fixed-shape batch holds.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::formats::tokens::{PackedDocs, TokenDocs, IGNORE_INDEX};
    /// use pinnable::loader::{Budget, Collator, Piece, BudgetPlan};
    /// use pinnable::{DType, Device, PinnedPool, Tensor};
    ///
    /// let docs = TokenDocs::from_dataset(vec![
    ///     Tensor::from_vec1(vec![5u16, 6, 7]),
    ///     Tensor::from_vec1(vec![8u16, 9]),
    /// ])?;
    /// let plan = BudgetPlan::options(Budget::Tokens { max_tokens: 8, count_padding: false })
    ///     .build(docs.lengths().clone())?;
    /// let batcher = PackedDocs::new(docs, plan)?.batcher(DType::I64)?;
    /// let pieces = vec![Piece { sample: 1, start: 0, len: 2 }, Piece { sample: 0, start: 0, len: 3 }];
    /// let b = batcher.batch_of(pieces, &mut Collator::new(PinnedPool::global()))?;
    /// assert_eq!(b.input_ids.tensor()?.to_vec::<i64>()?, vec![8, 9, 5, 6, 7]);
    /// assert_eq!(b.labels.to_vec::<i64>()?, vec![IGNORE_INDEX, 9, IGNORE_INDEX, 6, 7]);
    /// assert_eq!(b.position_ids.to_vec::<i64>()?, vec![0, 1, 0, 1, 2]);
    /// assert_eq!(&b.cu_seqlens_host[..], &[0, 2, 5]);
    /// assert_eq!(b.max_seqlen, 3);
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn batch_of(&self, pieces: Vec<Piece>, c: &mut Collator) -> Result<PackedBatch> {
        for p in &pieces {
            let len = self.docs.lengths()[..].get(p.sample).copied().unwrap_or(0) as usize;
            if p.len == 0 || p.start.checked_add(p.len).is_none_or(|end| end > len) {
                return Err(Error::Sample {
                    index: p.sample,
                    during: "collating",
                    source: Box::new(Error::Shape(format!(
                        "piece {p:?} is empty or lies outside document {} of {len} tokens",
                        p.sample
                    ))),
                });
            }
        }
        let real: usize = pieces.iter().map(|p| p.len).sum();
        if self.fixed_shape
            && (real > self.plan.max_tokens() || pieces.len() > self.plan.max_pieces())
        {
            return Err(Error::Config {
                setting: "fixed_shape",
                problem: format!(
                    "{} pieces of {real} tokens do not fit a fixed-shape batch of {} pieces and \
                     {} tokens",
                    pieces.len(),
                    self.plan.max_pieces(),
                    self.plan.max_tokens()
                ),
            });
        }
        if real > i32::MAX as usize {
            return Err(Error::Config {
                setting: "pieces",
                problem: format!("{real} tokens; varlen offsets are int32"),
            });
        }
        let (total, n_cu) = if self.fixed_shape {
            (self.plan.max_tokens(), self.plan.max_pieces() + 1)
        } else {
            (real, pieces.len() + 1)
        };
        let mut cu = Vec::with_capacity(n_cu);
        cu.push(0i32);
        for p in &pieces {
            // The plan keeps every batch within i32 (checked when it was built).
            cu.push(cu[cu.len() - 1] + p.len as i32);
        }
        cu.resize(n_cu, real as i32);
        let device = c.device().clone();
        let on_device = device.ordinal().is_some();
        if on_device {
            let wraps = self.docs.vocab().is_none_or(|v| v > 1 << 31);
            if self.dtype == DType::I32 && self.docs.dtype() == DType::U32 && wraps {
                return Err(Error::Config {
                    setting: "dtype",
                    problem: "i32 batches of u32 tokens on a device need shards opened with a \
                              vocabulary check of at most 2^31 (ShardOptions::vocab); or take \
                              i64 batches"
                        .into(),
                });
            }
            if self.device_built {
                return self.build_on_device(&device, pieces, cu, total, c);
            }
        }
        let max_seqlen = pieces.iter().map(|p| p.len).max().unwrap_or(0);
        let shape = [1, total];
        let tokens = if on_device {
            c.empty("tokens", self.docs.dtype(), &[total])?
        } else {
            c.empty("input_ids", self.dtype, &shape)?
        };
        let labels = c.empty("labels", self.dtype, &shape)?;
        let positions = c.empty("position_ids", self.dtype, &shape)?;
        let cu_slot = c.empty("cu_seqlens", DType::I32, &[n_cu])?;
        let seq = (self.seq_idx.then(|| c.empty("seq_idx", DType::I32, &shape))).transpose()?;
        let mask = (self.fixed_shape)
            .then(|| c.empty("padding_mask", DType::U8, &shape))
            .transpose()?;
        let mut out = c.finish()?;
        // Every token, widened to u32 (padding included): the host reads each document once.
        let mut compact = vec![self.pad_id; total];
        match self.docs.dtype() {
            DType::U16 => {
                let mut buf = vec![0u16; real];
                self.docs.copy_pieces(&pieces, &mut buf)?;
                compact
                    .iter_mut()
                    .zip(&buf)
                    .for_each(|(d, &s)| *d = u32::from(s));
            }
            _ => self.docs.copy_pieces(&pieces, &mut compact[..real])?,
        }
        if on_device {
            // Compact over the link: the GPU widens them.
            let mut v = out.view_mut(tokens)?;
            match self.docs.dtype() {
                // Every value came from a u16 (or is a pad id checked to fit one).
                DType::U16 => (v.as_mut_slice::<u16>()?.iter_mut())
                    .zip(&compact)
                    .for_each(|(d, &t)| *d = t as u16),
                _ => v.as_mut_slice::<u32>()?.copy_from_slice(&compact),
            }
        }
        let fields = Fields {
            pieces: &pieces,
            real,
            compact: &compact,
        };
        let ids = (!on_device).then_some(tokens);
        match self.dtype {
            DType::I64 => fields.write::<i64>(&mut out, ids, labels, positions)?,
            _ => fields.write::<i32>(&mut out, ids, labels, positions)?,
        }
        out.view_mut(cu_slot)?
            .as_mut_slice::<i32>()?
            .copy_from_slice(&cu);
        if let Some(seq) = seq {
            let mut dst = out.view_mut(seq)?;
            let dst = dst.as_mut_slice::<i32>()?;
            let mut at = 0;
            for (k, p) in pieces.iter().enumerate() {
                dst[at..at + p.len].fill(k as i32);
                at += p.len;
            }
            dst[real..].fill(-1);
        }
        if let Some(mask) = mask {
            let mut dst = out.view_mut(mask)?;
            let dst = dst.as_mut_slice::<u8>()?;
            dst[..real].fill(1);
            dst[real..].fill(0);
        }
        let input_ids = if on_device {
            let staged = out.take(tokens)?;
            Gather::windows(&staged, [0], total)?.convert(Convert::cast(self.dtype))?
        } else {
            Gather::from(out.take(tokens)?)
        };
        Ok(PackedBatch {
            input_ids,
            labels: out.take(labels)?,
            position_ids: out.take(positions)?,
            cu_seqlens: out.take(cu_slot)?,
            cu_seqlens_host: cu.into(),
            max_seqlen,
            seq_idx: seq.map(|s| out.take(s)).transpose()?,
            padding_mask: mask.map(|m| out.take(m)).transpose()?,
            real_tokens: real,
            pieces: pieces.into(),
        })
    }
}

/// What the host writes of a batch.
struct Fields<'a> {
    pieces: &'a [Piece],
    real: usize,
    /// Every token widened to u32, padding included (empty when the device widens).
    compact: &'a [u32],
}

impl Fields<'_> {
    /// Writes `labels`, `position_ids` and, when given, `input_ids`.
    fn write<T: Element + TryFrom<u32> + From<i32>>(
        &self,
        out: &mut Collated,
        input_ids: Option<Slot>,
        labels: Slot,
        positions: Slot,
    ) -> Result<()> {
        let narrow = |t: u32, at: usize| {
            T::try_from(t).map_err(|_| Error::Sample {
                index: self.sample_at(at),
                during: "collating",
                source: Box::new(Error::Shape(format!(
                    "token id {t} does not fit in an i32 batch; ask for i64 batches"
                ))),
            })
        };
        if let Some(ids) = input_ids {
            let mut v = out.view_mut(ids)?;
            let dst = v.as_mut_slice::<T>()?;
            for (at, (d, &t)) in dst.iter_mut().zip(self.compact).enumerate() {
                *d = narrow(t, at)?;
            }
        }
        let ignore = T::from(IGNORE_INDEX as i32);
        let mut v = out.view_mut(labels)?;
        let dst = v.as_mut_slice::<T>()?;
        for (at, (d, &t)) in dst.iter_mut().zip(&self.compact[..self.real]).enumerate() {
            *d = narrow(t, at)?;
        }
        let mut at = 0;
        for p in self.pieces {
            dst[at] = ignore;
            at += p.len;
        }
        dst[self.real..].fill(ignore);
        let mut v = out.view_mut(positions)?;
        let dst = v.as_mut_slice::<T>()?;
        let mut at = 0;
        for p in self.pieces {
            for (k, d) in dst[at..at + p.len].iter_mut().enumerate() {
                // A piece is at most the plan's budget, which fits an i32.
                *d = T::from(k as i32);
            }
            at += p.len;
        }
        dst[self.real..].fill(T::from(0));
        Ok(())
    }

    /// The document of the token at `at`.
    fn sample_at(&self, at: usize) -> usize {
        let mut end = 0;
        let p = self.pieces.iter().find(|p| {
            end += p.len;
            at < end
        });
        p.or(self.pieces.last()).map_or(0, |p| p.sample)
    }
}

impl Batcher<usize> for PackedBatcher {
    type Batch = PackedBatch;

    fn batch(&self, slots: Vec<usize>, c: &mut Collator) -> Result<PackedBatch> {
        let [slot] = slots[..] else {
            return Err(Error::Config {
                setting: "batch_size",
                problem: format!(
                    "each sample of PackedDocs is a whole packed batch; the loader gave {} \
                     together: leave the loader's batch size unset (the plan cuts the \
                     batches)",
                    slots.len()
                ),
            });
        };
        self.batch_at(c.epoch(), slot, c)
    }
}
