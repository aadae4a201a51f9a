//! [`Collated`]: a batch the [`Collator`](super::Collator) has planned and written, its tensors
//! taken by the slots planning returned.

use crate::batch::{PinnedBatch, Slot, TensorMut};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// A collated batch: its tensors, all in one pinned block, by the [`Slot`]s the
/// [`Collator`](super::Collator) returned.
pub struct Collated {
    slots: usize,
    /// The block while tensors planned with [`Collator::empty`](super::Collator::empty) may still be written.
    batch: Option<PinnedBatch>,
    tensors: Vec<Tensor>,
}

impl Collated {
    /// The batch of `slots` tensors planned in `batch`.
    pub(super) fn new(slots: usize, batch: PinnedBatch) -> Collated {
        Collated {
            slots,
            batch: Some(batch),
            tensors: Vec::new(),
        }
    }

    fn check(&self, call: &'static str, slot: Slot) -> Result<()> {
        if slot.index() >= self.slots {
            return Err(Error::Misuse {
                call,
                problem: format!(
                    "slot {} does not belong to this batch, which has {} tensors; pass the \
                     slots the collator returned while planning this batch",
                    slot.index(),
                    self.slots
                ),
            });
        }
        Ok(())
    }

    /// A writable view of a tensor, for those planned with [`Collator::empty`](super::Collator::empty). Only before
    /// the first [`take`](Self::take).
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] for a slot of another batch, or after a `take`.
    pub fn view_mut(&mut self, slot: Slot) -> Result<TensorMut<'_>> {
        self.check("Collated::view_mut", slot)?;
        match &mut self.batch {
            Some(batch) => Ok(batch.view_mut(slot)),
            None => Err(Error::Misuse {
                call: "Collated::view_mut",
                problem: "the batch's tensors were already taken; write them before the first \
                          `take`"
                    .into(),
            }),
        }
    }

    /// The tensor planned at `slot`. Tensors share the batch's block; taking one twice gives
    /// two handles on the same tensor.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] for a slot of another batch.
    pub fn take(&mut self, slot: Slot) -> Result<Tensor> {
        self.check("Collated::take", slot)?;
        if let Some(batch) = self.batch.take() {
            self.tensors = batch.finish();
        }
        Ok(self.tensors[slot.index()].clone())
    }

    /// Every tensor, in the order they were planned.
    pub fn into_tensors(mut self) -> Vec<Tensor> {
        match self.batch.take() {
            Some(batch) => batch.finish(),
            None => self.tensors,
        }
    }
}

impl std::fmt::Debug for Collated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Collated({} tensors)", self.slots)
    }
}
