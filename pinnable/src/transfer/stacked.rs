//! Results assembled from several pieces of a source as they land: the move side of
//! [`Gather`](crate::Gather).
//!
//! The pieces (runs of consecutive rows or windows) are placed one after another in one
//! contiguous region of the batch's arena. Which engine carries them is chosen once per gather
//! by [`engine::gather_path`]: read in place (by the SMs or the copy engine, piece by piece),
//! gathered on the host into pinned staging first, or, for a conversion where the kernels do
//! not run, converted on the host.

use std::ops::Range;
use std::sync::Arc;

use super::engine::sm::{Indexed, SmJob, SmOp, SmPiece, SmWork};
use super::engine::{self, Engine, GatherPath, Source};
use super::{MoveContext, Pass};
use crate::check;
use crate::convert::{self, Convert, Resolved};
use crate::copy::{HostCopy, RowCopies, Src};
use crate::error::{Error, Result};
use crate::pieces::{GatherRoute, StartTable, parts_of};
use crate::tensor::{self, Memory, Storage, Tensor};

/// What a gather stacks: pieces of `piece` consecutive indices of `source`'s first dimension
/// from each of `starts` (the same bytes as `runs`, merged where consecutive), into `shape`,
/// converted by `convert`.
pub(crate) struct Stacking<'a> {
    pub(crate) source: &'a Tensor,
    pub(crate) starts: &'a Arc<StartTable>,
    pub(crate) piece: usize,
    pub(crate) runs: &'a [Range<usize>],
    pub(crate) shape: &'a [usize],
    pub(crate) route: GatherRoute,
    pub(crate) convert: Option<&'a Convert>,
}

impl Stacking<'_> {
    /// Bytes of one index of the source's first dimension.
    fn unit_bytes(&self) -> usize {
        self.source.shape()[1..].iter().product::<usize>() * self.source.dtype().size()
    }
}

impl MoveContext<'_> {
    /// Moves what `s` stacks into one contiguous tensor on the target.
    ///
    /// The caller keeps a host source moved to the host as it is (nothing to copy).
    pub(crate) fn move_stacked(&mut self, s: &Stacking<'_>) -> Result<Tensor> {
        let source = s.source;
        let src = source.source();
        let host = src.memory.placement().is_host();
        if host {
            check::dense_cpu(source, &self.path)?;
        } else if !source.is_contiguous() {
            return Err(self.field_error(format!(
                "rows of a strided view on {} cannot be gathered; make it contiguous first",
                source.placement()
            )));
        }
        let layout = match s.convert {
            Some(c) => Some(c.resolve(source.dtype(), s.shape)?),
            None => None,
        };
        let in_bytes = s.starts.len() * s.piece * s.unit_bytes();
        let out_dtype = layout.map_or(source.dtype(), |l| l.to);
        let out_bytes = in_bytes / source.dtype().size() * out_dtype.size();
        let same_device = source.device() == *self.target;
        let kind = if !host {
            Source::Device
        } else if source.is_contiguous() && src.memory.is_device_mapped() {
            Source::Pinned
        } else {
            Source::Host
        };
        let kernels = match self.target.ordinal() {
            Some(_) => crate::cuda::kernels(self.target.cuda_device("to_device")?).is_some(),
            None => false,
        };
        // The kernels read device memory of the target only.
        let kernels = kernels && (host || same_device);
        if layout.is_some() && (self.target.ordinal().is_none() || (!host && !kernels)) {
            return Err(self.field_error(format!(
                "converting pieces of a tensor on {} while moving them to {} needs the gather \
                 kernels on that device{}; convert before moving, or move without converting",
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
            s.route,
            layout.is_some(),
            kernels,
            in_bytes,
            s.runs.len(),
        );
        if self.pass == Pass::Measure {
            match path {
                GatherPath::Staged if layout.is_none() => self.plan.note_staged(in_bytes),
                _ => self.plan.note_single(out_bytes),
            }
            return Ok(source.clone());
        }
        if path == GatherPath::Staged && layout.is_none() {
            return self.stage_stacked(s, in_bytes);
        }
        // Every other path writes the result into the arena's region for single tensors.
        let (own, base, at) = match self.plan.place_single(out_bytes) {
            Some(at) => (None, self.arena().at(at), at),
            None => {
                let own = self.own_destination(out_bytes)?;
                let base = own.at(0);
                (Some(own), base, 0)
            }
        };
        let op = match s.convert.zip(layout) {
            Some((c, layout)) => SmOp::Convert(c.clone(), layout),
            None => SmOp::Copy,
        };
        match path {
            GatherPath::InPlace(force) => {
                self.wait_for(src.ready);
                let run_bytes = in_bytes / s.runs.len().max(1);
                match engine::in_place_engine(force, layout.is_some(), kernels, run_bytes) {
                    Engine::Sms => self.gather_by_sms(s, &src, op, base),
                    Engine::CopyEngine => self.gather_by_copies(s, base, force),
                }
            }
            GatherPath::Staged => {
                let (SmOp::Convert(c, layout), true) = (&op, layout.is_some()) else {
                    unreachable!("unconverted staged gathers are placed with the staged bytes")
                };
                self.stage_compact(s, base, c, *layout, in_bytes)?;
            }
            GatherPath::HostConverted => {
                let (SmOp::Convert(c, layout), true) = (&op, layout.is_some()) else {
                    unreachable!("only conversions are converted on the host")
                };
                self.convert_on_host(s, base, c, layout, out_bytes)?;
            }
        }
        own.as_ref()
            .unwrap_or_else(|| self.arena())
            .tensor(out_dtype, s.shape, at)
    }

    /// The SMs read every piece where it lies (mapped pinned or device memory) and write it,
    /// converted by `op`, from `base` on: one launch, 8 bytes of table a piece. The source is
    /// held and noted as read.
    fn gather_by_sms(&mut self, s: &Stacking<'_>, src: &tensor::Source<'_>, op: SmOp, base: u64) {
        match src.memory {
            Memory::Device(d) => self.copies.sm_reads.push(d.clone()),
            Memory::Pinned(b) => self.copies.note_block(b),
            Memory::Pageable(_) => unreachable!("read in place: pinned or device memory"),
        }
        self.copies.keep.push(src.hold());
        // The kernels read the table of starts too (copied, or in place through the mapping):
        // noted with the source, before anything of this move is enqueued.
        if let Some(b) = s.starts.pinned() {
            self.copies.note_block(b);
        }
        // The kernels count a plain copy in bytes, a conversion in source elements.
        let elem = match &op {
            SmOp::Copy => 1,
            SmOp::Convert(_, layout) => layout.from.size(),
        };
        let unit = s.unit_bytes();
        self.copies.sm.push(SmJob {
            op,
            work: SmWork::Indexed(Indexed {
                src: src.memory.base() + src.span.start as u64,
                dst: base,
                piece: s.piece * unit / elem,
                stride: unit,
                starts: vec![s.starts.clone()],
            }),
        });
    }

    /// One copy-engine copy a run, straight from the source.
    fn gather_by_copies(&mut self, s: &Stacking<'_>, base: u64, force: Option<Engine>) {
        let mut offset = 0;
        for p in parts_of(s.source, s.runs) {
            let src = p.source();
            let n = src.span.len() as u64;
            self.copy_alone(&src, base + offset);
            if let Some(last) = self.copies.direct.last_mut() {
                last.force = force.or(Some(Engine::CopyEngine));
            }
            offset += n;
        }
    }

    fn field_error(&self, message: String) -> Error {
        Error::Field {
            path: self.path.to_string(),
            message,
        }
    }

    /// Unconverted pieces gathered by the copy threads into the staging block, then sent with
    /// the batch's staged bytes.
    fn stage_stacked(&mut self, s: &Stacking<'_>, bytes: usize) -> Result<Tensor> {
        let slot = self.plan.place_staged(bytes).and_then(|at| {
            let arena = self.arena.as_ref()?;
            Some((at, self.staging.as_ref()?.at(at), arena.at(at)))
        });
        let (own, stage, dst, at, block) = match slot {
            Some((at, stage, dst)) => (None, stage, dst, at, None),
            None => {
                let own = self.own_destination(bytes)?;
                let dst = own.at(0);
                let block = Arc::new(self.pool.alloc(bytes)?);
                (Some(own), block.as_ptr(), dst, 0, Some(block))
            }
        };
        let mergeable = block.is_none();
        if s.source.is_contiguous() {
            if bytes > 0 {
                self.stage_rows(s, stage, dst, mergeable)?;
            }
        } else {
            let mut offset = 0;
            for p in &parts_of(s.source, s.runs) {
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
        }
        if let Some(block) = block {
            self.copies.blocks.push(block);
        }
        own.as_ref()
            .unwrap_or_else(|| self.arena())
            .tensor(s.source.dtype(), s.shape, at)
    }

    /// Plans gathering the pieces of a contiguous source into `stage` as one copy of rows,
    /// read from the gather's start table, and the device copy of those bytes to `dst`: the
    /// work on this thread and in the copy threads' bookkeeping does not grow with the number
    /// of pieces.
    fn stage_rows(
        &mut self,
        s: &Stacking<'_>,
        stage: *mut u8,
        dst: u64,
        mergeable: bool,
    ) -> Result<()> {
        // Waits for a pending copy into the source.
        let src = s.source.host_src("to_device")?;
        let unit = s.unit_bytes();
        self.copies.staged.push(HostCopy {
            src: Src::RowCopies(RowCopies {
                base: src.ptr,
                stride: unit,
                len: s.piece * unit,
                starts: s.starts.clone(),
            }),
            dst: stage,
        });
        self.copies.staged_dst.push(Some((dst, mergeable)));
        self.copies.keep.push(s.source.storage().clone());
        Ok(())
    }

    /// Converted pieces of a source the device cannot read in place: the copy threads gather
    /// the compact bytes into a pinned block of their own, and the SMs convert them from there
    /// once staging is done. Falls back to converting on the host when the pool's blocks are not
    /// mapped for the device.
    fn stage_compact(
        &mut self,
        s: &Stacking<'_>,
        base: u64,
        c: &Convert,
        layout: Resolved,
        in_bytes: usize,
    ) -> Result<()> {
        let block = Arc::new(self.pool.alloc(in_bytes)?);
        if !block.is_device_mapped() {
            let out_bytes = in_bytes / layout.from.size() * layout.to.size();
            return self.convert_on_host(s, base, c, &layout, out_bytes);
        }
        let parts = parts_of(s.source, s.runs);
        let mut offset = 0;
        let mut first = 0;
        let mut pieces = Vec::with_capacity(parts.len());
        for p in &parts {
            let n = p.nbytes();
            if n > 0 {
                let src = p.host_src("to_device")?;
                self.copies.staged.push(HostCopy {
                    src: src.into(),
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
        self.copies.keep.push(s.source.storage().clone());
        self.copies.blocks.push(block);
        self.copies.after_staging.push(SmJob {
            op: SmOp::Convert(c.clone(), layout),
            work: SmWork::Pieces(pieces),
        });
        Ok(())
    }

    /// Converted pieces made on the host, into a pinned block of their own, and sent by the
    /// copy engine: for when the gather kernels do not run.
    fn convert_on_host(
        &mut self,
        s: &Stacking<'_>,
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
        convert::convert_parts(c, layout, &parts_of(s.source, s.runs), dst)?;
        let staged = Tensor::at(
            Storage::pinned(block),
            layout.to,
            &[out_bytes / layout.to.size()],
            0,
        )?;
        self.copy_alone(&staged.source(), base);
        if let Some(last) = self.copies.direct.last_mut() {
            last.force = Some(Engine::CopyEngine);
        }
        Ok(())
    }
}
