//! The batcher for image members (the `image` feature): JPEG and PNG members decoded straight
//! into their rows of the pinned batch with the image module's [`Decoder`] and [`Transform`].
//! Only members the decoder reads are taken as a sample's image.

use std::cell::RefCell;
use std::path::PathBuf;

use super::TarSample;
use crate::error::Result;
use crate::formats::image::gpu::inputs::Inputs;
use crate::formats::image::{Decoder, DeviceImageBatcher, EXTENSIONS, MAX_PIXELS, Transform};
use crate::loader::{Batcher, Collator};
use crate::tensor::Tensor;

/// Image formats found in shards that the decoder does not read: a sample whose only image
/// is one of these is an error that says so, not a missing image.
const NOT_DECODED: &[&str] = &[
    "webp", "gif", "bmp", "tif", "tiff", "avif", "heic", "heif", "jxl", "jp2", "ppm", "pgm", "pbm",
    "pnm",
];

thread_local! {
    /// A worker thread's decoder, its buffers reused from image to image.
    static DECODER: RefCell<Option<Decoder>> = const { RefCell::new(None) };
}

/// Batches samples into `(images [B, 3, H, W], labels i64 [B])`, as
/// [`ImageBatcher`](crate::formats::image::ImageBatcher) does for files: each sample's first
/// member among `jpg`, `jpeg`, `png` (the formats decoded; a `.webp` or other member beside
/// them is left alone) is decoded from the shard's bytes straight into its row of the pinned
/// block, transformed by the transform (crop, resize, flip drawn from the
/// loader's seed, the epoch and the sample); the label is the `cls` member (or the extension
/// given to [`label`](Self::label)).
///
/// # Errors
///
/// A sample without an image or a label, or one that cannot be decoded, arrives as the batch's
/// error naming the shard and the key; a sample whose only image is in a format not decoded
/// (`.webp`, `.gif`, ...) names the member and the formats that are.
///
/// [`on_device`](Self::on_device) makes the images on a GPU instead, as
/// [`DeviceImageBatcher`] does for files: each member's bytes are read from the shard once
/// and copied into the batch's pinned block (the shard reader hands them over in memory), then
/// decoded and transformed on the device.
#[derive(Clone, Debug)]
pub struct TarImageBatcher {
    transform: Transform,
    label: String,
    device: Option<DeviceImageBatcher>,
}

impl TarImageBatcher {
    /// Images transformed by `transform`, labels from `.cls`.
    pub fn new(transform: Transform) -> TarImageBatcher {
        TarImageBatcher {
            transform,
            label: "cls".into(),
            device: None,
        }
    }

    /// Makes the images on `batcher`'s device, with its decoders (same crop boxes and flips as
    /// on the host).
    pub fn on_device(mut self, batcher: DeviceImageBatcher) -> TarImageBatcher {
        self.device = Some(batcher);
        self
    }

    /// Labels from the members with extension `ext`.
    pub fn label(mut self, ext: &str) -> TarImageBatcher {
        self.label = ext.to_lowercase();
        self
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

impl Batcher<TarSample> for TarImageBatcher {
    type Batch = (Tensor, Tensor);

    fn batch(&self, samples: Vec<TarSample>, c: &mut Collator) -> Result<(Tensor, Tensor)> {
        let labels = samples
            .iter()
            .map(|s| s.class(&self.label))
            .collect::<Result<Vec<_>>>()?;
        if let Some(device) = &self.device {
            let mut members = Vec::with_capacity(samples.len());
            for (s, &label) in samples.iter().zip(&labels) {
                let ext = image_ext(s)?;
                let name = PathBuf::from(format!("{}:{}.{ext}", s.shard(), s.shown_key()));
                members.push((s.bytes(ext)?, name, s.index(), label));
            }
            let pictures: Vec<_> = members
                .iter()
                .map(|(b, n, i, l)| (b.as_ref(), n.clone(), *i, *l))
                .collect();
            let inputs = Inputs::copied(&pictures, MAX_PIXELS, c)?;
            return device.make(&self.transform, inputs, c);
        }
        let labels = c.stack_scalars("labels", labels)?;
        let transform = self.transform.clone();
        let shape = transform.shape();
        let images = c.write_rows(
            "images",
            transform.dtype(),
            &shape,
            samples,
            move |s, row, rng| {
                let ext = image_ext(&s)?;
                let bytes = s.bytes(ext)?;
                let name = PathBuf::from(format!("{}:{}.{ext}", s.shard(), s.shown_key()));
                DECODER.with(|d| {
                    let mut d = d.borrow_mut();
                    let decoder = d.get_or_insert_with(Decoder::new);
                    let image = decoder.decode(&bytes, &name)?;
                    transform.write(image, row, rng)
                })
            },
        )?;
        let mut out = c.finish()?;
        Ok((out.take(images)?, out.take(labels)?))
    }
}
