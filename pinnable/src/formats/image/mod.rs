//! Images for training (the `image` feature): JPEG and PNG bytes decoded into rows of the
//! pinned batch, on the loader's workers or on the GPU's decoders, by one codec whatever
//! container the bytes came from.
//!
//! ```text
//!  container: ImageFolder's files, a tar shard's members (bytes + label + name; no decoding)
//!                              │ ImageBatcher / TarImageBatcher, each with an ImageCodec
//!                              ▼
//!  host (a loader worker, each sample):   decode (zune-jpeg, png) ─► crop + resize + flip
//!                                          ─► its row of the pinned batch ([3, H, W])
//!  GPU (the loader's device is CUDA):     the batch's bytes into one pinned block ─► nvJPEG's
//!                                          engines / CUDA backend ─► the crate's kernels
//! ```
//!
//! - [`ImageCodec`]: every image setting in one value — the [`Transform`], the largest picture
//!   ([`max_pixels`](ImageCodec::max_pixels)), where to decode ([`DecodeOn`]: by default the
//!   GPU when the loader's device is one and nvJPEG is there, else the host), and on the GPU
//!   the decoder ([`JpegDecoder`]) and the host's share. Given to the batcher of any container.
//! - [`ImageFolder`]: one subfolder per class (classes and files sorted, as torchvision's
//!   `ImageFolder`), or a list of `(path, label)`; its samples are [`ImageFile`] handles.
//! - [`ImageBatcher`]: `(images [B, 3, H, W], labels i64 [B])` from an [`ImageFolder`];
//!   `formats::tar::TarImageBatcher` the same from tar shards, with the same codec. The device
//!   is the loader's ([`Collator::device`](crate::loader::Collator::device)), never the
//!   batcher's.
//! - [`Transform`]: center crop, resize of the shorter side + center crop, random-resized crop,
//!   horizontal flip (reproducible from the loader's seed, the epoch and the sample), `u8`
//!   output or normalised `f32`/`f16`/`bf16`. Resizing is antialiased bilinear, PIL's
//!   (torchvision's `antialias=True`) arithmetic.
//! - [`Decoder`] and [`Image`]: JPEG (baseline, progressive; gray, RGB, CMYK, YCCK) and PNG
//!   (every color type and bit depth) to upright RGB (EXIF orientation applied); corrupt or
//!   truncated files are [`Error::Image`](crate::Error::Image) naming the file and the reason.
//!
//! Moving `u8` pixels and normalising on the device moves a quarter of the bytes of `f32`:
//! deliver the `u8` batch and convert there, or [`normalize`](Transform::normalize) in the codec.
//!
//! # Examples
//!
//! ```
//! use pinnable::formats::image::{ImageBatcher, ImageCodec, ImageFolder, Transform};
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
//! let folder = ImageFolder::open(&dir)?;
//! assert_eq!((folder.len(), folder.classes()), (2, &["cat".to_string()][..]));
//! let batcher = ImageBatcher::new(ImageCodec::new(Transform::center_crop(1)));
//! let loader = Loader::builder(folder).batch_size(2).workers(1).build(batcher)?;
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
mod codec;
mod decode;
mod folder;
pub(crate) mod gpu;
mod orient;
mod resample;
mod transform;

pub(crate) use codec::Encoded;
pub use codec::{DecodeOn, ImageCodec};
pub(crate) use decode::EXTENSIONS;
pub use decode::{Decoder, Image, MAX_PIXELS};
pub use folder::{ImageBatcher, ImageFile, ImageFolder};
pub use gpu::{DecoderChoice, JpegDecoder, gpu_decoder};
pub use transform::{IMAGENET_MEAN, IMAGENET_STD, MAX_SIDE, Transform};
