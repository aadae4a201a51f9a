//! The batcher for image members (the `image` feature): each sample's JPEG or PNG member handed
//! to the image module's [`ImageCodec`], which writes it into its row of the batch, on the host
//! or on the GPU's decoders. Only members the decoder reads are taken as a sample's image.

use std::path::{Path, PathBuf};

use super::TarSample;
use crate::error::Result;
use crate::formats::image::gpu::inputs::Inputs;
use crate::formats::image::{EXTENSIONS, Encoded, ImageCodec};
use crate::loader::{Batcher, Collator};
use crate::tensor::Tensor;

/// Image formats found in shards that the decoder does not read: a sample whose only image
/// is one of these is an error that says so, not a missing image.
const NOT_DECODED: &[&str] = &[
    "webp", "gif", "bmp", "tif", "tiff", "avif", "heic", "heif", "jxl", "jp2", "ppm", "pgm", "pbm",
    "pnm",
];

/// Batches samples into `(images [B, 3, H, W], labels i64 [B])`, as
/// [`ImageBatcher`](crate::formats::image::ImageBatcher) does for files, with the same
/// [`ImageCodec`] settings and the same rows for the same bytes: each sample's first member
/// among `jpg`, `jpeg`, `png` (the formats decoded; a `.webp` or other member beside them is
/// left alone) is decoded and transformed by the codec (crop, resize, flip drawn from the
/// loader's seed, the epoch and the sample); the label is the `cls` member (or the extension
/// given to [`label`](Self::label)).
///
/// Where the images are made is the codec's [`DecodeOn`](crate::formats::image::DecodeOn) and
/// the loader's device: by default on the GPU's decoders when the loader delivers to a CUDA
/// device and nvJPEG is there (each member's bytes copied once into the batch's pinned block),
/// else on the loader's workers straight into the rows of the pinned block.
///
/// # Errors
///
/// A sample without an image or a label, or one that cannot be decoded, arrives as the batch's
/// error naming the shard and the key; a sample whose only image is in a format not decoded
/// (`.webp`, `.gif`, ...) names the member and the formats that are.
#[derive(Clone, Debug, Default)]
pub struct TarImageBatcher {
    codec: ImageCodec,
    label: String,
}

impl TarImageBatcher {
    /// Images made as `codec` says, labels from `.cls`.
    pub fn new(codec: ImageCodec) -> TarImageBatcher {
        TarImageBatcher {
            codec,
            label: "cls".into(),
        }
    }

    /// Labels from the members with extension `ext`.
    pub fn label(mut self, ext: &str) -> TarImageBatcher {
        self.label = ext.to_lowercase();
        self
    }

    /// The codec's settings.
    pub fn codec(&self) -> &ImageCodec {
        &self.codec
    }
}

/// The extension of the member taken as `s`'s image: the first of the decoded formats.
fn image_ext(s: &TarSample) -> Result<&'static str> {
    if let Some(ext) = EXTENSIONS.into_iter().find(|e| s.field(e).is_some()) {
        return Ok(ext);
    }
    let exts: Vec<&str> = s.fields().iter().map(|f| f.ext.as_str()).collect();
    let problem = match exts.iter().find(|e| NOT_DECODED.contains(e)) {
        Some(other) => format!(
            "sample `{}` has its image as `.{other}`, a format that is not decoded: images are \
             read from `.{}` members (JPEG and PNG); convert its images to one of them",
            s.shown_key(),
            EXTENSIONS.join("`, `."),
        ),
        None => format!(
            "sample `{}` has no image member ({}); its extensions: {}",
            s.shown_key(),
            EXTENSIONS.join(", "),
            exts.join(", ")
        ),
    };
    Err(s.error(problem))
}

/// What errors call the image member `ext` of `s`: the shard and the member.
fn member_name(s: &TarSample, ext: &str) -> PathBuf {
    PathBuf::from(format!("{}:{}.{ext}", s.shard(), s.shown_key()))
}

impl Encoded for TarSample {
    fn with_bytes<R>(
        &self,
        _buf: &mut Vec<u8>,
        f: impl FnOnce(&[u8], &Path) -> Result<R>,
    ) -> Result<R> {
        let ext = image_ext(self)?;
        let bytes = self.bytes(ext)?;
        f(&bytes, &member_name(self, ext))
    }

    fn gather(
        samples: &[TarSample],
        labels: Vec<i64>,
        max_pixels: usize,
        c: &Collator,
    ) -> Result<Inputs> {
        let mut members = Vec::with_capacity(samples.len());
        for (s, label) in samples.iter().zip(labels) {
            let ext = image_ext(s)?;
            members.push((s.bytes(ext)?, member_name(s, ext), s.index(), label));
        }
        let pictures: Vec<_> = members
            .iter()
            .map(|(b, n, i, l)| (b.as_ref(), n.clone(), *i, *l))
            .collect();
        Inputs::copied(&pictures, max_pixels, c)
    }
}

impl Batcher<TarSample> for TarImageBatcher {
    type Batch = (Tensor, Tensor);

    fn batch(&self, samples: Vec<TarSample>, c: &mut Collator) -> Result<(Tensor, Tensor)> {
        let labels = samples
            .iter()
            .map(|s| s.class(&self.label))
            .collect::<Result<Vec<_>>>()?;
        self.codec.batch(samples, labels, c)
    }
}
