//! Images decoded on the workers and resized on the device: [`ImageBatcher::on_device`]
//! batches [`DecodedImages`], the batch's images whole, each at its own size, one after another
//! in the batch's pinned block, with each one's crop and flip already drawn. Moved to a GPU,
//! one kernel reads them through the block's device mapping and writes the cropped, resized,
//! flipped (and normalised) `[B, 3, H, W]` batch; elsewhere the same batch is resampled on the
//! host by the CPU path's code.
//!
//! ```text
//!  worker: read + decode each image ─► its own reused buffer ─► one pinned block, all of them
//!          draw its crop and flip (the CPU path's draws)          + a table (64 bytes an image)
//!  move:   one launch on the copy stream: each output pixel from the source pixels it needs,
//!          antialiased bilinear (PIL's filter, in f32) ─► [B, 3, H, W] u8 / f32 / f16 / bf16
//! ```

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use super::decode::{Decoder, View};
use super::folder::{ImageBatcher, ImageFile};
use super::resample::{Rect, Resampler};
use super::transform::{Plan, Transform};
use crate::alloc::PinnedPool;
use crate::batch::BatchLayout;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::loader::{Batcher, Collator};
use crate::tensor::Tensor;
use crate::transfer::resampled::{RESAMPLE_ENTRY_BYTES, Resampling};
use crate::transfer::{MoveContext, ToDevice};

/// Where one image of a batch lies in its pixels and what becomes of it, as the kernels read
/// it: 64 bytes, `u64` offset, then `u32` width, height, crop x, y, width, height, resized
/// width, height, `i32` corner x, y, `u32` flip, three unused `u32`s (native byte order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) offset: usize,
    pub(crate) width: usize,
    pub(crate) height: usize,
    pub(crate) plan: Plan,
}

const _: () = assert!(RESAMPLE_ENTRY_BYTES == 64);

impl Entry {
    /// Writes the entry into `out` (64 bytes).
    fn encode(&self, out: &mut [u8]) -> Result<()> {
        let too_large = || {
            Error::Shape(format!(
                "an image of {} × {} pixels is too large to resample on the device",
                self.width, self.height
            ))
        };
        let u = |v: usize| u32::try_from(v).map_err(|_| too_large());
        let i = |v: isize| i32::try_from(v).map_err(|_| too_large());
        let p = &self.plan;
        let words = [
            u(p.crop.x)?,
            u(p.crop.y)?,
            u(p.crop.w)?,
            u(p.crop.h)?,
            u(p.resized.0)?,
            u(p.resized.1)?,
            i(p.at.0)? as u32,
            i(p.at.1)? as u32,
            u32::from(p.flip),
            0,
            0,
            0,
        ];
        out[..8].copy_from_slice(&(self.offset as u64).to_ne_bytes());
        out[8..12].copy_from_slice(&u(self.width)?.to_ne_bytes());
        out[12..16].copy_from_slice(&u(self.height)?.to_ne_bytes());
        for (w, o) in words.iter().zip(out[16..64].chunks_exact_mut(4)) {
            o.copy_from_slice(&w.to_ne_bytes());
        }
        Ok(())
    }

    /// The entry `encode` wrote into `b`.
    fn decode(b: &[u8]) -> Entry {
        let word = |k: usize| u32::from_ne_bytes(b[k * 4..k * 4 + 4].try_into().expect("4 bytes"));
        let offset = u64::from_ne_bytes(b[..8].try_into().expect("8 bytes")) as usize;
        Entry {
            offset,
            width: word(2) as usize,
            height: word(3) as usize,
            plan: Plan {
                crop: Rect {
                    x: word(4) as usize,
                    y: word(5) as usize,
                    w: word(6) as usize,
                    h: word(7) as usize,
                },
                resized: (word(8) as usize, word(9) as usize),
                at: (word(10) as i32 as isize, word(11) as i32 as isize),
                flip: word(12) != 0,
            },
        }
    }

    /// The image's pixels in `pixels`.
    fn view<'a>(&self, pixels: &'a [u8]) -> View<'a> {
        View {
            width: self.width,
            height: self.height,
            pixels: &pixels[self.offset..self.offset + self.width * self.height * 3],
        }
    }
}

/// A batch of decoded images, each at its own size, with the crop, resize and flip each is
/// due (drawn by the [`Transform`] from the sample's random stream): what
/// [`ImageBatcher::on_device`] makes. [`ToDevice`] turns it into the transformed
/// `[B, 3, H, W]` batch on the device, made there by one kernel from the pixels in the batch's
/// pinned block; [`tensor`](Self::tensor) makes the same batch on the host (the CPU path's
/// code and values).
///
/// On the device each value is within 1 (as `u8`) of the host's: the kernel computes PIL's
/// filter in `f32` in one pass where the host rounds its first pass to 8 bits. A normalised
/// value is the normalisation of that `u8` value, computed as the host computes it.
///
/// # Examples
///
/// ```
/// use pinnable::image::{ImageBatcher, ImageFolder, Transform};
/// use pinnable::loader::Loader;
/// use pinnable::{Device, DType, ToDevice};
///
/// # let dir = std::env::temp_dir().join(format!("pinnable-doc-ragged-{}", std::process::id()));
/// # std::fs::create_dir_all(dir.join("cat"))?;
/// # let png = [
/// #     0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x48, 0x44,
/// #     0x52, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x00, 0x00, 0x00, 0x00, 0x3A,
/// #     0x7E, 0x9B, 0x55, 0x00, 0x00, 0x00, 0x0A, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9C, 0x63, 0x70,
/// #     0x00, 0x00, 0x00, 0x42, 0x00, 0x41, 0x29, 0x37, 0xF4, 0xEF, 0x00, 0x00, 0x00, 0x00, 0x49,
/// #     0x45, 0x4E, 0x44, 0xAE, 0x42, 0x60, 0x82,
/// # ]; // one gray pixel of value 64
/// # std::fs::write(dir.join("cat/a.png"), png)?;
/// # std::fs::write(dir.join("cat/b.png"), png)?;
/// // Workers only decode; the crop and resize run where the batch lands.
/// let folder = ImageFolder::open(&dir)?.transform(Transform::resized_center_crop(4, 2));
/// let device = Device::cuda(0).unwrap_or(Device::cpu());
/// let loader = Loader::builder(folder)
///     .batch_size(2)
///     .workers(1)
///     .device(device)
///     .build(ImageBatcher::on_device())?;
/// for batch in &loader {
///     let (images, labels) = batch?;
///     let images = images.into_tensor()?; // on the GPU: resized there
///     assert_eq!((images.shape(), images.dtype()), (&[2, 3, 2, 2][..], DType::U8));
///     assert_eq!(images.to_cpu(false)?.to_vec::<u8>()?, vec![64; 24]);
/// }
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct DecodedImages {
    state: State,
}

#[derive(Clone, Debug)]
enum State {
    Pending(Arc<Pending>),
    Resampled(Tensor),
}

#[derive(Debug)]
struct Pending {
    /// The images' pixels, one after another: `u8 [n]`, in the batch's pinned block.
    pixels: Tensor,
    /// [`Entry`]s, 64 bytes an image, each checked against `pixels`.
    table: Arc<[u8]>,
    transform: Transform,
    /// The batch made on the host, once asked for.
    host: OnceLock<Tensor>,
}

impl DecodedImages {
    fn pending(&self) -> Option<&Pending> {
        match &self.state {
            State::Pending(p) => Some(p),
            State::Resampled(_) => None,
        }
    }

    /// Images in the batch.
    pub fn len(&self) -> usize {
        match &self.state {
            State::Pending(p) => p.table.len() / RESAMPLE_ENTRY_BYTES,
            State::Resampled(t) => t.shape()[0],
        }
    }

    /// Whether the batch holds no image.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The transformed batch's shape, `[B, 3, H, W]`.
    pub fn shape(&self) -> [usize; 4] {
        match &self.state {
            State::Pending(p) => {
                let [c, h, w] = p.transform.shape();
                [self.len(), c, h, w]
            }
            State::Resampled(t) => {
                let s = t.shape();
                [s[0], s[1], s[2], s[3]]
            }
        }
    }

    /// The transformed batch's element type (the transform's).
    pub fn dtype(&self) -> DType {
        match &self.state {
            State::Pending(p) => p.transform.dtype(),
            State::Resampled(t) => t.dtype(),
        }
    }

    /// Whether the images are still as decoded (not yet resampled by a move to a device).
    pub fn is_pending(&self) -> bool {
        self.pending().is_some()
    }

    /// The decoded pixels while pending: `u8 [n]`, every image's RGB rows one after another.
    pub fn pixels(&self) -> Option<&Tensor> {
        self.pending().map(|p| &p.pixels)
    }

    /// The decoded (upright) width and height of image `i` while pending.
    pub fn decoded_size(&self, i: usize) -> Option<(usize, usize)> {
        let p = self.pending()?;
        let e = p.table.chunks_exact(RESAMPLE_ENTRY_BYTES).nth(i)?;
        let e = Entry::decode(e);
        Some((e.width, e.height))
    }

    /// The transformed batch: the tensor the move made, or, still pending, made on the host
    /// now (once; later calls share it) by the CPU path's code, with its values.
    ///
    /// # Errors
    ///
    /// Allocation errors from the global pool.
    pub fn tensor(&self) -> Result<Tensor> {
        match &self.state {
            State::Resampled(t) => Ok(t.clone()),
            State::Pending(p) => p.on_host(PinnedPool::global()),
        }
    }

    /// As [`tensor`](Self::tensor), by value.
    ///
    /// # Errors
    ///
    /// As [`tensor`](Self::tensor).
    pub fn into_tensor(self) -> Result<Tensor> {
        self.tensor()
    }

    /// Each image's entry, for tests.
    #[cfg(test)]
    pub(crate) fn entries(&self) -> Vec<Entry> {
        self.pending()
            .map(|p| {
                p.table
                    .chunks_exact(RESAMPLE_ENTRY_BYTES)
                    .map(Entry::decode)
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Pending {
    /// The batch made on the host, into a pinned block of `pool`'s (once).
    fn on_host(&self, pool: &PinnedPool) -> Result<Tensor> {
        if let Some(t) = self.host.get() {
            return Ok(t.clone());
        }
        let [c, h, w] = self.transform.shape();
        let n = self.table.len() / RESAMPLE_ENTRY_BYTES;
        let mut layout = BatchLayout::new();
        let slot = layout.push(self.transform.dtype(), &[n, c, h, w])?;
        let mut batch = layout.allocate_in(pool)?;
        let pixels = self.pixels.as_slice::<u8>()?;
        let mut resampler = Resampler::default();
        let mut view = batch.view_mut(slot);
        for (mut row, e) in view
            .rows_mut()
            .zip(self.table.chunks_exact(RESAMPLE_ENTRY_BYTES))
        {
            let e = Entry::decode(e);
            self.transform
                .write_plan(e.view(pixels), &e.plan, &mut row, &mut resampler)?;
        }
        let t = batch.finish().swap_remove(0);
        Ok(self.host.get_or_init(|| t).clone())
    }
}

impl ToDevice for DecodedImages {
    /// On a CUDA device: the transformed batch, made there by one kernel on the copy stream
    /// from the pixels in the batch's pinned block (or, where the gather kernels do not run,
    /// made on the host and moved). To the host: the batch as it is, still pending.
    fn to_device_with(&self, cx: &mut MoveContext<'_>) -> Result<Self> {
        let p = match &self.state {
            State::Resampled(t) => {
                return Ok(DecodedImages {
                    state: State::Resampled(cx.move_tensor(t)?),
                });
            }
            State::Pending(p) => p,
        };
        if cx.device().ordinal().is_none() {
            return Ok(self.clone());
        }
        let (scale, offset) = p.transform.affine();
        let host = |pool: &PinnedPool| p.on_host(pool);
        let moved = cx.move_resampled(&Resampling {
            pixels: &p.pixels,
            table: &p.table,
            size: p.transform.shape()[1],
            dtype: p.transform.dtype(),
            scale,
            offset,
            host: &host,
        })?;
        Ok(DecodedImages {
            state: State::Resampled(moved),
        })
    }
}

/// Batches [`ImageFile`]s into `(images, labels)` whose images are only decoded on the
/// workers: [`DecodedImages`], resized where the batch is moved. Made by
/// [`ImageBatcher::on_device`].
///
/// # Errors
///
/// As [`ImageBatcher`]'s: a file that cannot be read or decoded is an [`Error::Sample`] naming
/// the sample's index, its source an [`Error::Image`] naming the file and the reason.
#[derive(Clone, Copy, Debug, Default)]
pub struct DecodedBatcher;

impl ImageBatcher {
    /// A batcher whose workers only decode: each batch's images land whole in its pinned
    /// block, and the crop, resize, flip and normalisation of the dataset's [`Transform`] run
    /// on the GPU when the batch is moved there (see [`DecodedImages`]), in one kernel. The
    /// random draws are the CPU path's: the same crops and flips for the same seed.
    ///
    /// Resizing is then off the workers' cores (about a sixth of a 500×375 JPEG's cost there)
    /// and the link carries the decoded images (often larger than the output).
    pub fn on_device() -> DecodedBatcher {
        DecodedBatcher
    }
}

/// A worker thread's decoders (one per image of a batch, each keeping its pixel buffer) and
/// file buffer, reused from batch to batch.
#[derive(Default)]
struct Scratch {
    bytes: Vec<u8>,
    decoders: Vec<Decoder>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl Batcher<ImageFile> for DecodedBatcher {
    type Batch = (DecodedImages, Tensor);

    fn batch(&self, samples: Vec<ImageFile>, c: &mut Collator) -> Result<Self::Batch> {
        let Some(first) = samples.first() else {
            return Err(Error::Field {
                path: "images".into(),
                message: "there are no samples to collate".into(),
            });
        };
        let transform = first.transform().clone();
        SCRATCH.with(|scratch| {
            let mut fresh = Scratch::default();
            let mut held = scratch.try_borrow_mut();
            let scratch = match &mut held {
                Ok(s) => &mut **s,
                Err(_) => &mut fresh,
            };
            decoded_batch(&samples, transform, c, scratch)
        })
    }
}

/// Decodes `samples` into `scratch`, then lays them out in the batch's block with their table.
fn decoded_batch(
    samples: &[ImageFile],
    transform: Transform,
    c: &mut Collator,
    scratch: &mut Scratch,
) -> Result<(DecodedImages, Tensor)> {
    let n = samples.len();
    if scratch.decoders.len() < n {
        scratch.decoders.resize_with(n, Decoder::new);
    }
    let mut table = vec![0u8; n * RESAMPLE_ENTRY_BYTES];
    let mut total = 0usize;
    for (pos, (s, decoder)) in samples.iter().zip(&mut scratch.decoders).enumerate() {
        let at = |e: Error| Error::Sample {
            index: c.indices().get(pos).copied().unwrap_or(pos),
            during: "writing in place",
            source: Box::new(e),
        };
        let image = s.decode_into(&mut scratch.bytes, decoder).map_err(at)?;
        let (width, height) = (image.width(), image.height());
        if width == 0 || height == 0 {
            return Err(at(Error::Shape(format!(
                "cannot transform an image of {width} × {height} pixels"
            ))));
        }
        let plan = transform.plan(width, height, &mut c.sample_rng(pos));
        let entry = Entry {
            offset: total,
            width,
            height,
            plan,
        };
        entry
            .encode(&mut table[pos * RESAMPLE_ENTRY_BYTES..][..RESAMPLE_ENTRY_BYTES])
            .map_err(at)?;
        total += width * height * 3;
    }
    let labels = c.stack_scalars("labels", samples.iter().map(ImageFile::label))?;
    let pixels = c.empty("images", DType::U8, &[total])?;
    let mut out = c.finish()?;
    {
        let mut view = out.view_mut(pixels)?;
        let dst = view.as_mut_slice::<u8>()?;
        let mut at = 0;
        for d in &scratch.decoders[..n] {
            let px = d.image().pixels();
            dst[at..at + px.len()].copy_from_slice(px);
            at += px.len();
        }
    }
    let images = DecodedImages {
        state: State::Pending(Arc::new(Pending {
            pixels: out.take(pixels)?,
            table: table.into(),
            transform,
            host: OnceLock::new(),
        })),
    };
    Ok((images, out.take(labels)?))
}

#[cfg(test)]
mod tests;
