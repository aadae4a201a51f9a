//! Results assembled from several parts of a source as they land: the move side of
//! [`Gather`](crate::Gather).
//!
//! The parts (runs of consecutive rows) are placed one after another in one contiguous region
//! of the batch's arena. Large runs from memory the copy engine reads as it is (registered
//! pinned memory, device memory) are copied straight from the source, one copy a run, so
//! their bytes cross host memory once; small runs, and runs from pageable memory, are gathered
//! by the copy threads into the staging block and sent with the batch's staged bytes.

use std::sync::Arc;

use super::{MoveContext, Pass};
use crate::check;
use crate::error::{Error, Result};
use crate::gather::GatherRoute;
use crate::tensor::Tensor;

/// Runs of at least this many bytes on average are copied straight from the source by
/// [`GatherRoute::Auto`]; smaller ones are gathered on the host first. Each copy costs the copy
/// engine some time of its own even when the copies go in one batched call: on an H100 over
/// PCIe Gen5, 32 MiB of random rows took 1.29 ms as 64 KiB copies, 0.83 ms as 256 KiB ones and
/// 0.70 ms as 1 MiB ones, against 1.13–1.19 ms, 0.95–1.13 ms and 0.88–0.97 ms gathered on the
/// host and 0.61–0.65 ms for one copy (two machine instances); the routes cross between 64 and
/// 256 KiB.
pub(crate) const GATHER_DIRECT_MIN: usize = 256 << 10;

impl MoveContext<'_> {
    /// Moves the concatenation along dimension 0 of `parts` (views of `source`, each
    /// contiguous when `source` is) into one contiguous tensor of `shape` on the target.
    ///
    /// The caller keeps a host source moved to the host as it is (nothing to copy).
    pub(crate) fn move_stacked(
        &mut self,
        source: &Tensor,
        parts: &[Tensor],
        shape: &[usize],
        route: GatherRoute,
    ) -> Result<Tensor> {
        let dtype = source.dtype();
        let bytes: usize = parts.iter().map(Tensor::nbytes).sum();
        let host = source.placement().is_host();
        if host {
            check::dense_cpu(source, &self.path)?;
        }
        let registered = source.is_registered_pinned();
        let by_copy_engine = match route {
            GatherRoute::Auto => bytes >= GATHER_DIRECT_MIN.saturating_mul(parts.len()),
            GatherRoute::Direct => true,
            GatherRoute::Host => false,
        };
        let direct = !host || (registered && source.is_contiguous() && by_copy_engine);
        if !host && !source.is_contiguous() {
            return Err(Error::Field {
                path: self.path.to_string(),
                message: format!(
                    "rows of a strided view on {} cannot be gathered; make it contiguous first",
                    source.placement()
                ),
            });
        }
        if self.pass == Pass::Measure {
            if direct {
                self.plan.note_single(bytes);
            } else {
                self.plan.note_staged(bytes);
            }
            return Ok(source.clone());
        }
        if direct {
            self.wait_for(source);
            let (data, base, at) = match self.plan.place_single(bytes) {
                Some(at) => (None, self.arena.as_ref().expect("reserved").at(at), at),
                None => {
                    let (data, base) = self.own_destination(bytes)?;
                    (Some(data), base, 0)
                }
            };
            let mut offset = 0;
            for p in parts {
                let span = p.byte_span();
                let n = span.len() as u64;
                self.copy_alone(p, span, base + offset);
                offset += n;
            }
            return Tensor::at(self.part(data), dtype, shape, at);
        }
        let slot = self.plan.place_staged(bytes).and_then(|at| {
            let arena = self.arena.as_ref()?;
            Some((at, self.staging.as_ref()?.at(at), arena.at(at)))
        });
        let (data, stage, dst, at, block) = match slot {
            Some((at, stage, dst)) => (None, stage, dst, at, None),
            None => {
                let (data, dst) = self.own_destination(bytes)?;
                let block = Arc::new(self.pool.alloc(bytes)?);
                (Some(data), block.as_ptr(), dst, 0, Some(block))
            }
        };
        let mergeable = block.is_none();
        let mut offset = 0;
        for p in parts {
            let n = p.nbytes();
            if n > 0 {
                self.stage(
                    p,
                    stage.wrapping_add(offset),
                    dst + offset as u64,
                    mergeable,
                )?;
            }
            offset += n;
        }
        if let Some(block) = block {
            self.copies.blocks.push(block);
        }
        Tensor::at(self.part(data), dtype, shape, at)
    }
}
