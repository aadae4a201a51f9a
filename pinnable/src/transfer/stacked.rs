//! Results assembled from several pieces of a source as they land: the move side of
//! [`Gather`](crate::Gather).
//!
//! The pieces (runs of consecutive rows or windows) are placed one after another in one
//! contiguous region of the batch's arena. Which engine carries them is chosen once per gather
//! by [`engine::gather_path`]: read in place (by the SMs or the copy engine, piece by piece),
//! gathered on the host into pinned staging first, or, for a conversion where the kernels do
//! not run, converted on the host.

use std::sync::Arc;

use super::engine::sm::{SmJob, SmOp, SmPiece};
use super::engine::{self, Engine, GatherPath, Source};
use super::{MoveContext, Pass};
use crate::check;
use crate::convert::{self, Convert, Resolved};
use crate::copy::HostCopy;
use crate::error::{Error, Result};
use crate::gather::GatherRoute;
use crate::tensor::{Data, Tensor};

/// Runs of at least this many bytes on average are copied straight from the source by
/// [`GatherRoute::Auto`] when the gather kernels do not run; smaller ones are gathered on the
/// host first. Each copy costs the copy engine some time of its own even when the copies go in
/// one batched call: on an H100 over PCIe Gen5, 32 MiB of random rows took 1.29 ms as 64 KiB
/// copies, 0.83 ms as 256 KiB ones and 0.70 ms as 1 MiB ones, against 1.13–1.19 ms, 0.95–1.13 ms
/// and 0.88–0.97 ms gathered on the host and 0.61–0.65 ms for one copy (two machine instances);
/// the routes cross between 64 and 256 KiB.
pub(crate) const GATHER_DIRECT_MIN: usize = 256 << 10;

impl MoveContext<'_> {
    /// Moves the concatenation along dimension 0 of `parts` (views of `source`, each
    /// contiguous when `source` is) into one contiguous tensor of `shape` on the target,
    /// converting the elements by `convert`.
    ///
    /// The caller keeps a host source moved to the host as it is (nothing to copy).
    pub(crate) fn move_stacked(
        &mut self,
        source: &Tensor,
        parts: &[Tensor],
        shape: &[usize],
        route: GatherRoute,
        convert: Option<&Convert>,
    ) -> Result<Tensor> {
        let host = source.placement().is_host();
        if host {
            check::dense_cpu(source, &self.path)?;
        } else if !source.is_contiguous() {
            return Err(self.field_error(format!(
                "rows of a strided view on {} cannot be gathered; make it contiguous first",
                source.placement()
            )));
        }
        let layout = match convert {
            Some(c) => Some(c.resolve(source.dtype(), shape)?),
            None => None,
        };
        let in_bytes: usize = parts.iter().map(Tensor::nbytes).sum();
        let out_dtype = layout.map_or(source.dtype(), |l| l.to);
        let out_bytes = in_bytes / source.dtype().size() * out_dtype.size();
        let kind = if !host {
            Source::Device
        } else if source.is_contiguous() && source.storage().is_device_mapped() {
            Source::Pinned
        } else {
            Source::Host
        };
        let kernels = match self.target.ordinal() {
            Some(_) => crate::cuda::kernels(self.target.cuda_device("to_device")?).is_some(),
            None => false,
        };
        if layout.is_some() && (self.target.ordinal().is_none() || (!host && !kernels)) {
            return Err(self.field_error(format!(
                "converting pieces of a tensor on {} while moving them to {} needs the gather \
                 kernels on the target{}; convert before moving, or move without converting",
                source.placement(),
                self.target,
                crate::cuda::gather_kernels(self.target)
                    .err()
                    .map(|why| format!(" ({why})"))
                    .unwrap_or_default()
            )));
        }
        let path = engine::gather_path(
            kind,
            route,
            layout.is_some(),
            kernels,
            in_bytes,
            parts.len(),
        );
        if self.pass == Pass::Measure {
            match path {
                GatherPath::Staged if layout.is_none() => self.plan.note_staged(in_bytes),
                _ => self.plan.note_single(out_bytes),
            }
            return Ok(source.clone());
        }
        if path == GatherPath::Staged && layout.is_none() {
            return self.stage_stacked(source, parts, shape, in_bytes);
        }
        // Every other path writes the result into the arena's region for single tensors.
        let (data, base, at) = match self.plan.place_single(out_bytes) {
            Some(at) => (None, self.arena.as_ref().expect("reserved").at(at), at),
            None => {
                let (data, base) = self.own_destination(out_bytes)?;
                (Some(data), base, 0)
            }
        };
        match (path, convert.zip(layout)) {
            (GatherPath::InPlace(force), None) => {
                self.wait_for(source);
                let mut offset = 0;
                for p in parts {
                    let span = p.byte_span();
                    let n = span.len() as u64;
                    self.copy_alone(p, span, base + offset);
                    if let Some(last) = self.copies.direct.last_mut() {
                        last.force = force;
                    }
                    offset += n;
                }
            }
            (GatherPath::InPlace(_), Some((c, layout))) => {
                self.wait_for(source);
                let pieces = self.pieces_in_place(source, parts, base, &layout);
                self.copies.sm.push(SmJob {
                    op: SmOp::Convert(c.clone(), layout),
                    pieces,
                });
            }
            (GatherPath::Staged, Some((c, layout))) => {
                self.stage_compact(source, parts, base, c, layout, in_bytes)?;
            }
            (GatherPath::HostConverted, Some((c, layout))) => {
                self.convert_on_host(parts, base, c, &layout, out_bytes)?;
            }
            (GatherPath::Staged | GatherPath::HostConverted, None) => {
                unreachable!("unconverted staged gathers are placed with the staged bytes")
            }
        }
        Tensor::at(self.part(data), out_dtype, shape, at)
    }

    fn field_error(&self, message: String) -> Error {
        Error::Field {
            path: self.path.to_string(),
            message,
        }
    }

    /// Unconverted pieces gathered by the copy threads into the staging block, then sent with
    /// the batch's staged bytes.
    fn stage_stacked(
        &mut self,
        source: &Tensor,
        parts: &[Tensor],
        shape: &[usize],
        bytes: usize,
    ) -> Result<Tensor> {
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
        Tensor::at(self.part(data), source.dtype(), shape, at)
    }

    /// The SMs' pieces for parts read where they lie (mapped pinned or device memory), written
    /// converted from `base` on; the sources are held and noted as read.
    fn pieces_in_place(
        &mut self,
        source: &Tensor,
        parts: &[Tensor],
        base: u64,
        layout: &Resolved,
    ) -> Vec<SmPiece> {
        let src_base = match &source.storage().data {
            Data::Device(d) => {
                self.copies.sm_reads.push(d.clone());
                d.device_ptr()
            }
            Data::Pinned(b) => {
                self.copies.note_block(b);
                b.as_ptr() as u64
            }
            _ => unreachable!("read in place: pinned or device memory"),
        };
        self.copies.keep.push(source.storage().clone());
        let mut first = 0;
        parts
            .iter()
            .map(|p| {
                let piece = SmPiece {
                    src: src_base + p.byte_span().start as u64,
                    dst: base + (first * layout.to.size()) as u64,
                    count: p.numel(),
                    first,
                };
                first += p.numel();
                piece
            })
            .collect()
    }

    /// Converted pieces of a source the device cannot read in place: the copy threads gather
    /// the compact bytes into a pinned block of their own, and the SMs convert them from there
    /// once staging is done. Falls back to converting on the host when the pool's blocks are not
    /// mapped for the device.
    fn stage_compact(
        &mut self,
        source: &Tensor,
        parts: &[Tensor],
        base: u64,
        c: &Convert,
        layout: Resolved,
        in_bytes: usize,
    ) -> Result<()> {
        let block = Arc::new(self.pool.alloc(in_bytes)?);
        if !block.is_device_mapped() {
            let out_bytes = in_bytes / layout.from.size() * layout.to.size();
            return self.convert_on_host(parts, base, c, &layout, out_bytes);
        }
        let mut offset = 0;
        let mut first = 0;
        let mut pieces = Vec::with_capacity(parts.len());
        for p in parts {
            let n = p.nbytes();
            if n > 0 {
                let src = p.host_src("to_device")?;
                self.copies.staged.push(HostCopy {
                    src,
                    dst: block.as_ptr().wrapping_add(offset),
                });
                self.copies.staged_dst.push(None);
                pieces.push(SmPiece {
                    src: block.as_ptr() as u64 + offset as u64,
                    dst: base + (first * layout.to.size()) as u64,
                    count: p.numel(),
                    first,
                });
            }
            offset += n;
            first += p.numel();
        }
        self.copies.keep.push(source.storage().clone());
        self.copies.blocks.push(block);
        self.copies.after_staging.push(SmJob {
            op: SmOp::Convert(c.clone(), layout),
            pieces,
        });
        Ok(())
    }

    /// Converted pieces made on the host, into a pinned block of their own, and sent by the
    /// copy engine: for when the gather kernels do not run.
    fn convert_on_host(
        &mut self,
        parts: &[Tensor],
        base: u64,
        c: &Convert,
        layout: &Resolved,
        out_bytes: usize,
    ) -> Result<()> {
        if out_bytes == 0 {
            return Ok(());
        }
        let block = Arc::new(self.pool.alloc(out_bytes)?);
        // SAFETY: the block was just allocated; nothing else refers to it yet.
        let dst = unsafe { block.as_mut_slice() };
        convert::convert_parts(c, layout, parts, dst)?;
        let staged = Tensor::at(
            crate::tensor::Storage::part(Data::Pinned(block), None),
            layout.to,
            &[out_bytes / layout.to.size()],
            0,
        )?;
        self.copy_alone(&staged, staged.byte_span(), base);
        if let Some(last) = self.copies.direct.last_mut() {
            last.force = Some(Engine::CopyEngine);
        }
        Ok(())
    }
}
