//! Moving tensors for libraries that own their allocations one by one (candle): each such
//! tensor gets a device allocation of its own, reserved with the rest of the batch, and an
//! impl may keep state of its own for the move.

use std::sync::Arc;

use super::{MoveContext, Pass};
use crate::check;
use crate::error::{Error, Result};
use crate::tensor::{Data, Storage, Tensor};

impl MoveContext<'_> {
    /// Moves one tensor to the target device into a device allocation of its own, holding
    /// exactly its bytes, contiguous, rather than into the batch's shared arena. For handing a
    /// tensor to a library that frees its allocations one by one (candle).
    ///
    /// The allocation is reserved with the rest of the batch, before any copy; its copy is
    /// issued with the batch's.
    #[cfg_attr(not(feature = "candle-cuda"), allow(dead_code))]
    pub(crate) fn move_tensor_apart(&mut self, t: &Tensor) -> Result<Tensor> {
        if self.target.ordinal().is_none() {
            return self.move_tensor(t);
        }
        let bytes = t.nbytes();
        let registered = t.is_registered_pinned();
        let direct = !t.placement().is_host() || (registered && t.is_contiguous());
        if t.placement().is_host() {
            check::dense_cpu(t, &self.path)?;
        }
        if direct && !t.is_contiguous() {
            return Err(Error::Field {
                path: self.path.to_string(),
                message: format!(
                    "a strided view on {} cannot be moved into an allocation of its own; \
                     make it contiguous first",
                    t.placement()
                ),
            });
        }
        if self.pass == Pass::Measure {
            self.wait_for(t);
            self.plan.note_apart(bytes, !direct);
            return Ok(t.clone());
        }
        let buf = match self.apart.pop_front() {
            Some(buf) => buf,
            None => Arc::new(self.alloc_device(bytes)?),
        };
        let dst = buf.device_ptr();
        if direct {
            self.wait_for(t);
            self.copy_alone(t, t.byte_span(), dst);
        } else if bytes > 0 {
            match self.plan.place_apart_staged(bytes) {
                Some(at) => {
                    let stage = self.staging.as_ref().expect("staging reserved").at(at);
                    self.stage(t, stage, dst, false)?;
                }
                None => self.stage_alone(t, dst)?,
            }
        }
        let storage = Storage::part(Data::Device(buf), Some(self.ready.clone()));
        Ok(t.placed_in(storage, 0, true))
    }

    /// Whether this is the first walk, which only measures (results are placeholders).
    #[cfg_attr(not(feature = "candle-cuda"), allow(dead_code))]
    pub(crate) fn is_measuring(&self) -> bool {
        self.pass == Pass::Measure
    }

    /// This move's value of type `T` (made on first use), kept through both walks until the
    /// copies have read the sources, then dropped on this thread.
    #[cfg_attr(not(feature = "candle-cuda"), allow(dead_code))]
    pub(crate) fn slot<T: Default + 'static>(&mut self) -> &mut T {
        let at = match self.slots.iter().position(|s| s.is::<T>()) {
            Some(at) => at,
            None => {
                self.slots.push(Box::new(T::default()));
                self.slots.len() - 1
            }
        };
        self.slots[at].downcast_mut().expect("found by type")
    }
}
