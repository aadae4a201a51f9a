//! Image datasets (the `image` feature): JPEG and PNG files decoded on the host straight into
//! the batch's pinned block (`u8` pixels over the link), or decoded and transformed on the GPU
//! ([`DeviceImageBatcher`]: nvJPEG's engines, the crate's kernels).
//!
//! ```text
//!  ImageFolder ──get(i)──► ImageFile (a path and a label: nothing read yet)
//!                              │ ImageBatcher, on a loader worker, for each sample of the batch:
//!                              ▼
//!   read the file ─► decode (zune-jpeg, png) ─► crop + resize + flip ─► its row of the batch
//!   (reused buffer)   (reused buffer, upright RGB) (only the output's pixels) (pinned, [3, H, W])
//! ```
//!
//! - [`ImageFolder`]: one subfolder per class (classes and files sorted, as torchvision's
//!   `ImageFolder`), or a list of `(path, label)`; its samples are [`ImageFile`] handles.
//! - [`ImageBatcher`]: `(images [B, 3, H, W], labels i64 [B])` in one pinned block, each image
//!   written in place ([`Collator::write_rows`](crate::loader::Collator::write_rows)).
//! - [`Transform`]: center crop, resize of the shorter side + center crop, random-resized crop,
//!   horizontal flip (reproducible from the loader's seed, the epoch and the sample), `u8`
//!   output or normalised `f32`/`f16`/`bf16` written on the host. Resizing is antialiased
//!   bilinear, PIL's (torchvision's `antialias=True`) arithmetic.
//! - [`Decoder`] and [`Image`]: JPEG (baseline, progressive; gray, RGB, CMYK, YCCK) and PNG
//!   (every color type and bit depth) to upright RGB (EXIF orientation applied); corrupt or
//!   truncated files are [`Error::Image`](crate::Error::Image) naming the file and the reason.
//!
//! Moving `u8` pixels and normalising on the device moves a quarter of the bytes of `f32`:
//! deliver the `u8` batch and convert there, or [`normalize`](Transform::normalize) on the host.
//!
//! # Examples
//!
//! ```
//! use pinnable::formats::image::{ImageBatcher, ImageFolder, Transform};
//! use pinnable::loader::Loader;
//!
//! // Two tiny grayscale PNGs of one class, written on the spot.
//! let dir = std::env::temp_dir().join(format!("pinnable-doc-{}", std::process::id()));
//! std::fs::create_dir_all(dir.join("cat"))?;
//! let png = [
//!     0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x48, 0x44,
//!     0x52, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x00, 0x00, 0x00, 0x00, 0x3A,
//!     0x7E, 0x9B, 0x55, 0x00, 0x00, 0x00, 0x0A, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9C, 0x63, 0x70,
//!     0x00, 0x00, 0x00, 0x42, 0x00, 0x41, 0x29, 0x37, 0xF4, 0xEF, 0x00, 0x00, 0x00, 0x00, 0x49,
//!     0x45, 0x4E, 0x44, 0xAE, 0x42, 0x60, 0x82,
//! ]; // one gray pixel of value 64
//! std::fs::write(dir.join("cat/a.png"), png)?;
//! std::fs::write(dir.join("cat/b.PNG"), png)?;
//!
//! let folder = ImageFolder::open(&dir)?.transform(Transform::center_crop(1));
//! assert_eq!((folder.len(), folder.classes()), (2, &["cat".to_string()][..]));
//! let loader = Loader::builder(folder).batch_size(2).workers(1).build(ImageBatcher)?;
//! for batch in &loader {
//!     let (images, labels) = batch?;
//!     assert_eq!(images.shape(), &[2, 3, 1, 1]);
//!     assert_eq!(images.to_vec::<u8>()?, vec![64; 6]);
//!     assert_eq!(labels.to_vec::<i64>()?, vec![0, 0]);
//! }
//! std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#[cfg(target_arch = "x86_64")]
mod avx2;
mod chroma;
mod decode;
mod folder;
pub(crate) mod gpu;
mod orient;
mod resample;
mod transform;

pub(crate) use decode::EXTENSIONS;
pub use decode::{Decoder, Image, MAX_PIXELS};
pub use folder::{ImageBatcher, ImageFile, ImageFolder};
pub use gpu::{DecoderChoice, DeviceImageBatcher, JpegDecoder, gpu_decoder};
pub use transform::{IMAGENET_MEAN, IMAGENET_STD, MAX_SIDE, Transform};
