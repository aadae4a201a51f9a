//! Packed batches built on the device ([`PackedBatcher::device_built`]): the worker stages only
//! the compact tokens and `cu_seqlens` in pinned memory; one upload and one kernel
//! (`pinnable/kernels/pack.cu`) lay out every field in one device allocation.

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaStream, result, sys};

use super::{PackedBatch, PackedBatcher};
use crate::alloc::{Fence, PinnedBlock};
use crate::cuda::{CudaDevice, Device, Event, pack_kernels};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::gather::Gather;
use crate::loader::{Collator, Piece};
use crate::tensor::{Arena, DeviceBuffer};

/// Threads a block of the packing kernel.
const BLOCK: u32 = 256;
/// Alignment of each field in the device allocation and the staging block.
const ALIGN: usize = 256;

fn align(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

thread_local! {
    /// A loader worker's stream, by device ordinal.
    static STREAM: RefCell<Option<(usize, Arc<CudaStream>)>> = const { RefCell::new(None) };
}

impl PackedBatcher {
    /// Whether batches for a CUDA device are built there (the default): the worker writes
    /// only the documents' u16/u32 tokens and `cu_seqlens` into pinned memory (2–4 bytes a
    /// token instead of about 22), and the crate's packing kernel writes `input_ids`,
    /// `labels`, `position_ids`, `seq_idx` and `padding_mask` from them, every value as the
    /// host path's. The batch's tensors are then on the device with a ready event (nothing
    /// waits on the host); `cu_seqlens_host` and `max_seqlen` stay on the host. With `false`,
    /// every field is written on the host and moved. Batches for the host are written there
    /// either way.
    pub fn device_built(mut self, device_built: bool) -> Self {
        self.device_built = device_built;
        self
    }

    /// The batch of `pieces` built on `device`; `cu` is its `cu_seqlens` (padded in fixed
    /// shape), `total` its tokens with padding.
    pub(super) fn build_on_device(
        &self,
        device: &Device,
        pieces: Vec<Piece>,
        cu: Vec<i32>,
        total: usize,
        c: &mut Collator,
    ) -> Result<PackedBatch> {
        if self.fixed_shape && self.dtype == DType::I32 && self.pad_id > i32::MAX as u32 {
            return Err(Error::Config {
                setting: "pad_id",
                problem: format!(
                    "{} does not fit an i32 batch: take a smaller pad id or i64 batches",
                    self.pad_id
                ),
            });
        }
        let dev = device.cuda_device("PackedBatcher::device_built")?.clone();
        let real = cu[pieces.len()] as usize;
        let staging = stage(self, &pieces, &cu, c.pool())?;
        let layout = Layout::of(self, total, cu.len(), real);
        let stream = STREAM.with(|s| -> Result<Arc<CudaStream>> {
            let mut s = s.borrow_mut();
            if let Some((_, stream)) = s.as_ref().filter(|(o, _)| *o == dev.ordinal) {
                return Ok(stream.clone());
            }
            let stream = dev.thread_stream()?;
            *s = Some((dev.ordinal, stream.clone()));
            Ok(stream)
        })?;
        let out = launch(self, &dev, &stream, &layout, &staging, pieces.len(), real)?;
        let max_seqlen = pieces.iter().map(|p| p.len).max().unwrap_or(0);
        let tensor = |dtype, at: usize| out.tensor(dtype, &[1, total], at);
        Ok(PackedBatch {
            input_ids: Gather::from(tensor(self.dtype, layout.ids)?),
            labels: tensor(self.dtype, layout.labels)?,
            position_ids: tensor(self.dtype, layout.positions)?,
            cu_seqlens: out.tensor(DType::I32, &[cu.len()], layout.cu)?,
            cu_seqlens_host: cu.into(),
            max_seqlen,
            seq_idx: layout.seq.map(|at| tensor(DType::I32, at)).transpose()?,
            padding_mask: layout.mask.map(|at| tensor(DType::U8, at)).transpose()?,
            real_tokens: real,
            pieces: pieces.into(),
        })
    }
}

/// Where each field lies in the batch's device allocation. `cu_seqlens` and the compact
/// tokens come last, in the staging block's layout, so one copy places both.
#[derive(Debug)]
struct Layout {
    /// Tokens with padding: each field's elements.
    total: usize,
    ids: usize,
    labels: usize,
    positions: usize,
    seq: Option<usize>,
    mask: Option<usize>,
    cu: usize,
    tokens: usize,
    bytes: usize,
}

impl Layout {
    fn of(b: &PackedBatcher, total: usize, n_cu: usize, real: usize) -> Layout {
        let field = align(total * b.dtype.size());
        let (ids, labels, positions) = (0, field, 2 * field);
        let mut at = 3 * field;
        let seq = b.seq_idx.then(|| {
            at += align(total * 4);
            at - align(total * 4)
        });
        let mask = b.fixed_shape.then(|| {
            at += align(total);
            at - align(total)
        });
        let cu = at;
        let tokens = cu + align(n_cu * 4);
        Layout {
            total,
            ids,
            labels,
            positions,
            seq,
            mask,
            cu,
            tokens,
            bytes: tokens + real * b.docs.dtype().size(),
        }
    }
}

/// The pinned staging of a batch: `cu` (its slots padded to [`ALIGN`]), then the real tokens
/// as the documents store them.
fn stage(
    b: &PackedBatcher,
    pieces: &[Piece],
    cu: &[i32],
    pool: &crate::PinnedPool,
) -> Result<PinnedBlock> {
    let real = cu[pieces.len()] as usize;
    let at = align(cu.len() * 4);
    let block = pool.alloc(at + real * b.docs.dtype().size())?;
    // SAFETY: the block is ours, at least `at + real × size` bytes, and its base is aligned
    // for any element (pinned blocks start on a page); the two ranges do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(cu.as_ptr().cast::<u8>(), block.as_ptr(), cu.len() * 4);
        let base = block.as_ptr().add(at);
        match b.docs.dtype() {
            DType::U16 => {
                let dst = std::slice::from_raw_parts_mut(base.cast::<u16>(), real);
                b.docs.copy_pieces(pieces, dst)?;
            }
            _ => {
                let dst = std::slice::from_raw_parts_mut(base.cast::<u32>(), real);
                b.docs.copy_pieces(pieces, dst)?;
            }
        }
    }
    Ok(block)
}

/// One upload of `staging` and one launch; the device allocation as an arena ready when the
/// kernel is done.
fn launch(
    b: &PackedBatcher,
    dev: &Arc<CudaDevice>,
    stream: &Arc<CudaStream>,
    layout: &Layout,
    staging: &PinnedBlock,
    docs: usize,
    real: usize,
) -> Result<Arena> {
    let kernels = pack_kernels(dev).map_err(|why| Error::Config {
        setting: "device_built",
        problem: format!(
            "the packing kernels cannot load ({why}); build on the host with \
             `.device_built(false)`"
        ),
    })?;
    let total = layout.total;
    // SAFETY: every byte a tensor exposes is written by the kernel (each field's `total`
    // elements) or by the upload (`cu_seqlens` and the tokens) before the ready event.
    let slice = unsafe { dev.alloc(layout.bytes.max(1)) }
        .map_err(|e| Error::driver("cuMemAllocFromPoolAsync", e))?;
    let out = DeviceBuffer::new(slice, dev.clone());
    dev.ctx
        .bind_to_thread()
        .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
    // The allocation was made in the copy stream's order.
    dev.record()?.wait_on(stream)?;
    let ready = Arc::new(Event::open(dev, stream)?);
    let base = out.device_ptr();
    let up = layout.bytes - layout.cu;
    // SAFETY: the staging block holds `up` bytes (cu padded, then the tokens) and lives until
    // the stream passes the ready event (its fence, below); the destination is the
    // allocation's tail, ordered before on `stream`.
    unsafe {
        sys::cuMemcpyHtoDAsync_v2(
            base + layout.cu as u64,
            staging.as_ptr().cast(),
            up,
            stream.cu_stream(),
        )
    }
    .result()
    .map_err(|e| Error::driver("cuMemcpyHtoDAsync", e))?;
    if total > 0 {
        let f = kernels.pack[usize::from(b.docs.dtype() == DType::U32)]
            [usize::from(b.dtype == DType::I64)];
        let ptr = |at: Option<usize>| at.map_or(0, |a| base + a as u64);
        let (mut ids, mut labels, mut pos) = (
            ptr(Some(layout.ids)),
            ptr(Some(layout.labels)),
            ptr(Some(layout.positions)),
        );
        let (mut seq, mut mask) = (ptr(layout.seq), ptr(layout.mask));
        let (mut tokens, mut cu) = (ptr(Some(layout.tokens)), ptr(Some(layout.cu)));
        // Counts fit u32: the plan and `batch_of` keep every batch within i32.
        let (mut n, mut real32, mut total32, mut pad) =
            (docs as u32, real as u32, total as u32, b.pad_id);
        let mut args: [*mut c_void; 11] = [
            (&raw mut ids).cast(),
            (&raw mut labels).cast(),
            (&raw mut pos).cast(),
            (&raw mut seq).cast(),
            (&raw mut mask).cast(),
            (&raw mut tokens).cast(),
            (&raw mut cu).cast(),
            (&raw mut n).cast(),
            (&raw mut real32).cast(),
            (&raw mut total32).cast(),
            (&raw mut pad).cast(),
        ];
        let blocks = (total.div_ceil(BLOCK as usize) as u32).clamp(1, 1 << 16);
        // SAFETY: the arguments are `pack_*`'s, in order; every pointer addresses its field
        // of the allocation (`total` elements, or `cu.len()` / `real` for the inputs), which
        // the upload before it on this stream filled where the kernel reads.
        unsafe {
            result::launch_kernel(
                f.0,
                (blocks, 1, 1),
                (BLOCK, 1, 1),
                0,
                stream.cu_stream(),
                &mut args,
            )
        }
        .map_err(|e| Error::driver("cuLaunchKernel(pack)", e))?;
    }
    ready.close(stream)?;
    out.add_reader(
        stream
            .record_event(None)
            .map_err(|e| Error::driver("cuEventRecord", e))?,
    );
    staging.record_use(ready.clone() as Arc<dyn Fence>);
    Ok(Arena::device(out, &Arc::new(OnceLock::from(ready))))
}

#[cfg(test)]
#[path = "pack_device_tests.rs"]
mod tests;
