//! Moving tensors for libraries that own their allocations one by one (candle): each such
//! tensor gets a device allocation of its own, reserved with the rest of the batch, and an
//! impl may keep state of its own for the move. Everything here exists for the
//! `candle-cuda` feature, and only with it.

use std::collections::VecDeque;

use super::{MoveContext, Pass};
use crate::batch::part_align;
use crate::check;
use crate::error::{Error, Result};
use crate::tensor::{Arena, DeviceBuffer, Tensor};

/// A move's tensors moved apart: what the first walk measured, the allocations reserved for
/// them, and other libraries' state for the move.
#[derive(Default)]
pub(super) struct Apart {
    /// Each tensor's bytes and whether it is staged, in walk order.
    planned: Vec<(usize, bool)>,
    /// Staged bytes of those tensors: they follow the arena's staged bytes in the staging
    /// block.
    staged: usize,
    staged_cursor: usize,
    /// The allocations reserved for them, in walk order.
    reserved: VecDeque<DeviceBuffer>,
    /// State of other libraries' impls for this move, one value per type, dropped on this
    /// thread with the context, once the copies are issued (read locks on their sources).
    slots: Vec<Box<dyn std::any::Any>>,
}

impl MoveContext<'_> {
    /// Moves one tensor to the target device into a device allocation of its own, holding
    /// exactly its bytes, contiguous, rather than into the batch's shared arena. For handing a
    /// tensor to a library that frees its allocations one by one (candle).
    ///
    /// The allocation is reserved with the rest of the batch, before any copy; its copy is
    /// issued with the batch's.
    pub(crate) fn move_tensor_apart(&mut self, t: &Tensor) -> Result<Tensor> {
        if self.target.ordinal().is_none() {
            return self.move_tensor(t);
        }
        let src = t.source();
        let bytes = t.nbytes();
        let host = src.memory.placement().is_host();
        let direct = !host || (src.memory.is_registered_pinned() && t.is_contiguous());
        if host {
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
            self.wait_for(src.ready);
            self.apart.planned.push((bytes, !direct));
            if !direct {
                self.apart.staged += part_align(bytes);
            }
            return Ok(t.clone());
        }
        let buf = match self.apart.reserved.pop_front() {
            Some(buf) => buf,
            None => self.alloc_device(bytes)?,
        };
        let own = Arena::device(buf, &self.ready);
        let dst = own.at(0);
        if direct {
            self.wait_for(src.ready);
            self.copy_alone(&src, dst);
        } else if bytes > 0 {
            match self.place_apart_staged(bytes) {
                Some(at) => {
                    let stage = self.staging.as_ref().expect("staging reserved").at(at);
                    self.stage(t, stage, dst, false)?;
                }
                None => self.stage_alone(t, dst)?,
            }
        }
        Ok(own.contiguous(t, 0))
    }

    /// Where in the staging block a staged tensor moved apart is gathered, or `None` once the
    /// measured room is used up.
    fn place_apart_staged(&mut self, bytes: usize) -> Option<usize> {
        let apart = &mut self.apart;
        if apart.staged_cursor + bytes > apart.staged {
            return None;
        }
        let at = self.plan.staged_bytes + apart.staged_cursor;
        apart.staged_cursor += part_align(bytes);
        Some(at)
    }

    /// Reserves the allocations of the tensors the first walk moved apart; returns the
    /// staging bytes they take after the arena's.
    pub(super) fn reserve_apart(&mut self) -> Result<usize> {
        for i in 0..self.apart.planned.len() {
            let buf = self.alloc_device(self.apart.planned[i].0)?;
            self.apart.reserved.push_back(buf);
        }
        if !self.apart.reserved.is_empty() {
            self.order_consumers_after_allocation()?;
        }
        Ok(self.apart.staged)
    }

    /// Allocations moved apart are handed to other libraries, which may free them on their
    /// own streams at any time (an error drops a half-built batch): those streams first wait
    /// for the allocations, made on the copy stream.
    fn order_consumers_after_allocation(&self) -> Result<()> {
        if self.consumers.is_empty() {
            return Ok(());
        }
        let dev = self.target.cuda_device("to_device")?;
        let event = dev.record()?;
        for s in &self.consumers {
            event.wait_on(s)?;
        }
        Ok(())
    }

    /// Whether this is the first walk, which only measures (results are placeholders).
    pub(crate) fn is_measuring(&self) -> bool {
        self.pass == Pass::Measure
    }

    /// This move's value of type `T` (made on first use), kept through both walks until the
    /// copies have read the sources, then dropped on this thread.
    pub(crate) fn slot<T: Default + 'static>(&mut self) -> &mut T {
        let slots = &mut self.apart.slots;
        let at = match slots.iter().position(|s| s.is::<T>()) {
            Some(at) => at,
            None => {
                slots.push(Box::new(T::default()));
                slots.len() - 1
            }
        };
        slots[at].downcast_mut().expect("found by type")
    }
}
