//! The move side of decoded images resampled on the device
//! ([`DecodedImages`](crate::image::DecodedImages)): the batch's pinned block holds each image
//! whole, at its own size; the SMs read them through the block's device mapping and write the
//! cropped, resized batch into the arena, in one launch on the copy stream. Where the kernels
//! do not run (or the block is not mapped), the images are resampled on the host and the
//! result moved as a tensor.

use std::sync::Arc;

use super::engine::sm::resample::Resample;
use super::engine::sm::{SmJob, SmOp, SmWork};
use super::{MoveContext, Pass};
use crate::alloc::PinnedPool;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{Data, Tensor};

pub(crate) use super::engine::sm::resample::ENTRY_BYTES as RESAMPLE_ENTRY_BYTES;

/// What a batch of decoded images becomes: `[count, 3, size, size]` of `dtype`.
pub(crate) struct Resampling<'a> {
    /// The images' pixels, one after another: `u8 [n]`.
    pub(crate) pixels: &'a Tensor,
    /// [`RESAMPLE_ENTRY_BYTES`] an image, offsets counted from the pixels' first byte; every
    /// entry checked against the pixels by its maker (each image and its crop inside them).
    pub(crate) table: &'a Arc<[u8]>,
    pub(crate) size: usize,
    /// `U8`, or a float type written as `fmaf(u8, scale[c], offset[c])`.
    pub(crate) dtype: DType,
    pub(crate) scale: [f32; 3],
    pub(crate) offset: [f32; 3],
    /// The same result made on the host (the same value every call), for when the kernels
    /// cannot make it.
    pub(crate) host: &'a dyn Fn(&PinnedPool) -> Result<Tensor>,
}

impl MoveContext<'_> {
    /// Moves `r`'s result to the target: resampled there by the SMs from the pixels where they
    /// lie, or made on the host and moved.
    ///
    /// # Errors
    ///
    /// As [`move_tensor`](Self::move_tensor); the host resample's errors.
    pub(crate) fn move_resampled(&mut self, r: &Resampling<'_>) -> Result<Tensor> {
        let count = r.table.len() / RESAMPLE_ENTRY_BYTES;
        let shape = [count, 3, r.size, r.size];
        let out_bytes = shape.iter().product::<usize>() * r.dtype.size();
        let block = match &r.pixels.storage().data {
            Data::Pinned(b) if b.is_device_mapped() && r.pixels.is_contiguous() => Some(b.clone()),
            _ => None,
        };
        let kernels = match self.target.ordinal() {
            Some(_) => crate::cuda::kernels(self.target.cuda_device("to_device")?)
                .is_some_and(|k| k.resample(r.dtype).is_some()),
            None => false,
        };
        let Some(block) = block.filter(|_| kernels) else {
            let host = (r.host)(self.pool)?;
            return self.move_tensor(&host);
        };
        let size = u32::try_from(r.size).map_err(|_| Error::Field {
            path: self.path.to_string(),
            message: format!(
                "images of {} pixels a side are too large to resample",
                r.size
            ),
        })?;
        if self.pass == Pass::Measure {
            self.plan.note_single(out_bytes);
            return Ok(r.pixels.clone());
        }
        let (data, base, at) = match self.plan.place_single(out_bytes) {
            Some(at) => (None, self.arena.as_ref().expect("reserved").at(at), at),
            None => {
                let (data, base) = self.own_destination(out_bytes)?;
                (Some(data), base, 0)
            }
        };
        self.wait_for(r.pixels);
        // The kernels read the block until the ready event: it gets that event, and the
        // pixels' storage is held until the launch is queued.
        self.copies.note_block(&block);
        self.copies.keep.push(r.pixels.storage().clone());
        self.copies.sm.push(SmJob {
            op: SmOp::Copy,
            work: SmWork::Resample(Resample {
                src: block.as_ptr() as u64 + r.pixels.byte_span().start as u64,
                table: r.table.clone(),
                dst: base,
                size,
                dtype: r.dtype,
                scale: r.scale,
                offset: r.offset,
            }),
        });
        Tensor::at(self.part(data), r.dtype, &shape, at)
    }
}
