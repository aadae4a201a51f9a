//! [`ImageCodec`]: encoded image bytes to a row of the pinned batch, on the host or on the GPU's
//! decoders, with every image setting in one value, whichever container the bytes came from.
//!
//! A container (an [`ImageFolder`](super::ImageFolder)'s files, a tar shard's members) hands
//! over each sample's bytes, label and name; it never decodes. The batchers
//! ([`ImageBatcher`](super::ImageBatcher), `TarImageBatcher`) hold an [`ImageCodec`] and call
//! [`ImageCodec::batch`] here, which picks the host or the device's decoders from the batch's
//! device ([`Collator::device`]) and [`DecodeOn`].

use std::cell::RefCell;
use std::path::Path;

use super::decode::{Decoder, Image, MAX_PIXELS};
use super::gpu::inputs::Inputs;
use super::gpu::{DecoderChoice, JpegDecoder, chosen_decoder, gpu_decoder};
use super::transform::Transform;
use crate::batch::TensorMut;
use crate::cuda::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::loader::{Collator, SplitMix64};
use crate::tensor::Tensor;

/// Where a batch's images are decoded and transformed.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DecodeOn {
    /// On the GPU when the batch goes to a CUDA device ([`Collator::device`], the loader's
    /// [`device`](crate::loader::LoaderBuilder::device)) and nvJPEG is there to decode
    /// ([`gpu_decoder`]), or a decoder is forced ([`ImageCodec::jpeg_decoder`]); on the
    /// loader's workers otherwise. The same program runs on a machine with a GPU and without.
    #[default]
    Auto,
    /// On the loader's workers, always (zune-jpeg, png, the host transform).
    Host,
    /// On the batch's CUDA device, always; a batch for the host is an error.
    Device,
}

/// Every setting of how encoded images (JPEG, PNG) become rows of a batch: the
/// [`Transform`] (crop, resize, flip, output dtype and normalisation), the largest picture
/// accepted, where decoding runs ([`DecodeOn`]) and, on the GPU, which decoder and what share
/// the host takes. One value, given to the batcher of any container
/// ([`ImageBatcher`](super::ImageBatcher) for folders, `TarImageBatcher` for tar shards), so a
/// setting given once applies to both and they write the same rows for the same bytes.
///
/// Images are upright (EXIF orientation applied) before they are transformed. The host path
/// and the GPU's draw the same crop boxes and flips for the same (seed, epoch, index); pixel
/// values agree within the decoders' rounding (PSNR ≥ 40 dB).
///
/// # Examples
///
/// ```
/// use std::path::Path;
///
/// use pinnable::formats::image::{DecodeOn, ImageCodec, Transform};
/// use pinnable::loader::SplitMix64;
///
/// let codec = ImageCodec::new(Transform::center_crop(1))
///     .max_pixels(1 << 24)
///     .decode_on(DecodeOn::Auto);
/// assert_eq!(codec.shape(), [3, 1, 1]);
/// let png = [
///     0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x48, 0x44,
///     0x52, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x00, 0x00, 0x00, 0x00, 0x3A,
///     0x7E, 0x9B, 0x55, 0x00, 0x00, 0x00, 0x0A, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9C, 0x63, 0x70,
///     0x00, 0x00, 0x00, 0x42, 0x00, 0x41, 0x29, 0x37, 0xF4, 0xEF, 0x00, 0x00, 0x00, 0x00, 0x49,
///     0x45, 0x4E, 0x44, 0xAE, 0x42, 0x60, 0x82,
/// ]; // one gray pixel of value 64
/// let row = codec.load(&png, Path::new("gray.png"), SplitMix64::new(0))?;
/// assert_eq!(row.to_vec::<u8>()?, vec![64; 3]);
/// # Ok::<(), pinnable::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct ImageCodec {
    pub(crate) transform: Transform,
    pub(crate) max_pixels: usize,
    pub(crate) on: DecodeOn,
    pub(crate) decoder: Option<JpegDecoder>,
    pub(crate) cpu_share: f64,
    pub(crate) engine_threads: usize,
}

impl Default for ImageCodec {
    /// [`Transform::resized_center_crop`]`(256, 224)`, `u8`; [`MAX_PIXELS`]; [`DecodeOn::Auto`].
    fn default() -> Self {
        ImageCodec::new(Transform::resized_center_crop(256, 224))
    }
}

impl ImageCodec {
    /// Images transformed by `transform`, pictures up to [`MAX_PIXELS`], decoded where
    /// [`DecodeOn::Auto`] says, by the decoder [`gpu_decoder`] picks on a GPU.
    pub fn new(transform: Transform) -> ImageCodec {
        ImageCodec {
            transform,
            max_pixels: MAX_PIXELS,
            on: DecodeOn::Auto,
            decoder: None,
            cpu_share: 0.0,
            engine_threads: default_engine_threads(),
        }
    }

    /// What becomes of each image (see [`Transform`]).
    pub fn transform(mut self, transform: Transform) -> ImageCodec {
        self.transform = transform;
        self
    }

    /// Refuses pictures of more than `max_pixels` pixels (width × height), before decoding
    /// them, on the host and on the GPU (default [`MAX_PIXELS`], PIL's limit).
    pub fn max_pixels(mut self, max_pixels: usize) -> ImageCodec {
        self.max_pixels = max_pixels;
        self
    }

    /// Where the images are decoded (default [`DecodeOn::Auto`]).
    pub fn decode_on(mut self, on: DecodeOn) -> ImageCodec {
        self.on = on;
        self
    }

    /// On a GPU, forces `decoder` instead of the one [`gpu_decoder`] picks (what it refuses
    /// still falls back, as always: engines → CUDA backend → host). With [`DecodeOn::Auto`],
    /// a forced decoder sends every batch for a CUDA device to the GPU path.
    pub fn jpeg_decoder(mut self, decoder: JpegDecoder) -> ImageCodec {
        self.decoder = Some(decoder);
        self
    }

    /// On a GPU, has the loader's workers decode this share of each batch's JPEGs (0 to 1;
    /// default 0), beside the device's decoders: the same positions of every batch, so the
    /// output stays a function of (seed, epoch, index).
    pub fn cpu_share(mut self, share: f64) -> ImageCodec {
        self.cpu_share = if share.is_finite() {
            share.clamp(0.0, 1.0)
        } else {
            0.0
        };
        self
    }

    /// On a GPU, how many of the loader's workers may be in the JPEG engines' batched decode
    /// at once: 1 or 2 (0 counts as 1, more as 2). The call keeps its thread busy until the
    /// engines are done, so each thread inside is a core spent waiting; two decode faster by
    /// up to a third for about 0.4 more cores. More are not allowed: four callers at once can
    /// stop inside nvJPEG. By default 2 where the process may use 8 cores or more (the 0.4
    /// core is then cheap), else 1.
    pub fn engine_threads(mut self, threads: usize) -> ImageCodec {
        self.engine_threads = threads.clamp(1, 2);
        self
    }

    /// The element type of an image's row in the batch (the transform's).
    pub fn dtype(&self) -> DType {
        self.transform.dtype()
    }

    /// The shape of an image's row in the batch, `[3, H, W]` (the transform's).
    pub fn shape(&self) -> [usize; 3] {
        self.transform.shape()
    }

    /// The decoder that makes batches for `device`, and why: the host's where this codec
    /// decodes there, the forced one, else [`gpu_decoder`]'s choice.
    pub fn chosen(&self, device: &Device) -> DecoderChoice {
        match (self.on, self.decoder) {
            (DecodeOn::Host, _) => DecoderChoice {
                decoder: JpegDecoder::Cpu,
                reason: "DecodeOn::Host".into(),
            },
            (_, _) if device.ordinal().is_none() => gpu_decoder(device),
            (_, Some(d)) => DecoderChoice {
                decoder: d,
                reason: "forced by ImageCodec::jpeg_decoder".into(),
            },
            (_, None) => gpu_decoder(device),
        }
    }

    /// Whether a batch for `device` is made on the device.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for [`DecodeOn::Device`] and a batch for the host.
    pub(crate) fn decodes_on_gpu(&self, device: &Device) -> Result<bool> {
        match self.on {
            DecodeOn::Host => Ok(false),
            DecodeOn::Device if device.ordinal().is_none() => Err(Error::Config {
                setting: "ImageCodec::decode_on",
                problem: "DecodeOn::Device, but the batch is for the host: give the loader a CUDA \
                          device (LoaderBuilder::device), or decode with DecodeOn::Auto or Host"
                    .into(),
            }),
            DecodeOn::Device => Ok(true),
            DecodeOn::Auto => Ok(device.ordinal().is_some()
                && (self.decoder.is_some() || chosen_decoder(device) != JpegDecoder::Cpu)),
        }
    }

    /// Whether position `pos` of a batch made on the GPU is one the host decodes for its share.
    pub(crate) fn host_share(&self, pos: usize) -> bool {
        let s = self.cpu_share;
        ((pos + 1) as f64 * s).floor() > (pos as f64 * s).floor()
    }

    /// `bytes` (a JPEG or PNG) decoded, upright, untransformed; `name` is what errors call it.
    ///
    /// # Errors
    ///
    /// [`Error::Image`] naming `name` and the reason: not a JPEG or PNG, corrupt, truncated, or
    /// over [`max_pixels`](Self::max_pixels).
    pub fn decode(&self, bytes: &[u8], name: &Path) -> Result<Image> {
        let mut decoder = Decoder::new().max_pixels(self.max_pixels);
        decoder.decode(bytes, name)?;
        Ok(decoder.into_image())
    }

    /// `bytes` decoded and transformed into `row` (a view of [`shape`](Self::shape) and
    /// [`dtype`](Self::dtype), e.g. its row of a batch), drawing crop and flip from `rng`: what
    /// the host path writes for every container. The thread's decoder buffers are reused
    /// from call to call.
    ///
    /// # Errors
    ///
    /// As [`decode`](Self::decode); [`Error::Shape`] for a view of another shape or dtype.
    pub fn write(
        &self,
        bytes: &[u8],
        name: &Path,
        row: &mut TensorMut<'_>,
        rng: SplitMix64,
    ) -> Result<()> {
        thread_local! {
            static DECODER: RefCell<Option<Decoder>> = const { RefCell::new(None) };
        }
        DECODER.with(|d| match d.try_borrow_mut() {
            Ok(mut d) => {
                let decoder = d.get_or_insert_with(Decoder::new);
                decoder.max_pixels = self.max_pixels;
                let image = decoder.decode(bytes, name)?;
                self.transform.write(image, row, rng)
            }
            Err(_) => self.transform.write(&self.decode(bytes, name)?, row, rng),
        })
    }

    /// `bytes` decoded and transformed into a tensor of its own, drawing from `rng`: the row
    /// [`write`](Self::write) writes.
    ///
    /// # Errors
    ///
    /// As [`write`](Self::write).
    pub fn load(&self, bytes: &[u8], name: &Path, rng: SplitMix64) -> Result<Tensor> {
        self.transform.apply(&self.decode(bytes, name)?, rng)
    }

    /// The batch `(images [B, 3, H, W], labels i64 [B])` of `samples`, whose labels are
    /// `labels`: on the device's decoders when [`decodes_on_gpu`](Self::decodes_on_gpu) says so (the
    /// bytes gathered into one pinned block by [`Encoded::gather`]), else each sample's bytes
    /// decoded by the worker straight into its row of the pinned block.
    pub(crate) fn batch<S: Encoded>(
        &self,
        samples: Vec<S>,
        labels: Vec<i64>,
        c: &mut Collator,
    ) -> Result<(Tensor, Tensor)> {
        if samples.is_empty() {
            return Err(Error::Field {
                path: "images".into(),
                message: "there are no samples to collate".into(),
            });
        }
        if self.decodes_on_gpu(c.device())? {
            let device = c.device().clone();
            let inputs = S::gather(&samples, labels, self.max_pixels, c)?;
            return super::gpu::batch::make(self, &device, inputs, c);
        }
        thread_local! {
            static BYTES: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
        }
        let labels = c.stack_scalars("labels", labels)?;
        let codec = self.clone();
        let images = c.write_rows(
            "images",
            codec.dtype(),
            &codec.shape(),
            samples,
            move |s, row, rng| {
                BYTES.with(|buf| match buf.try_borrow_mut() {
                    Ok(mut buf) => s.with_bytes(&mut buf, |b, name| codec.write(b, name, row, rng)),
                    Err(_) => {
                        s.with_bytes(&mut Vec::new(), |b, name| codec.write(b, name, row, rng))
                    }
                })
            },
        )?;
        let mut out = c.finish()?;
        Ok((out.take(images)?, out.take(labels)?))
    }
}

/// A sample whose image is encoded bytes, as a container hands it to the codec: a file, a
/// shard's member.
pub(crate) trait Encoded: Send + Sized + 'static {
    /// Runs `f` on the sample's encoded bytes and what errors call them: read into `buf`
    /// (reused from sample to sample), or held in memory already.
    fn with_bytes<R>(
        &self,
        buf: &mut Vec<u8>,
        f: impl FnOnce(&[u8], &Path) -> Result<R>,
    ) -> Result<R>;

    /// The encoded bytes of a batch in one pinned block from `c`'s pool, for the device's
    /// decoders, with the batch's `labels`.
    fn gather(
        samples: &[Self],
        labels: Vec<i64>,
        max_pixels: usize,
        c: &Collator,
    ) -> Result<Inputs>;
}

/// The engines' callers by default: 2 where the process may use 8 cores or more, else 1.
fn default_engine_threads() -> usize {
    if crate::numa::cores() >= 8 { 2 } else { 1 }
}
