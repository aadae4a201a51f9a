//! What becomes of a decoded image before it lands in the batch: a [`Transform`] crops and
//! resizes it to a fixed size (torchvision's `CenterCrop`, `Resize` + `CenterCrop`,
//! `RandomResizedCrop`), may flip it (`RandomHorizontalFlip`), and writes it as `[3, H, W]`
//! channels, `u8` or normalised floats, straight into its row of the batch.
//!
//! Random choices come from the sample's own [`SplitMix64`] (the loader draws it from its seed,
//! the epoch and the sample's index), so a crop is reproducible and changes from epoch to
//! epoch, whatever the number of workers.

use std::sync::Arc;

use half::{bf16, f16};

use super::decode::Image;
use super::resample::{Planes, Rect, Resampler};
use crate::batch::TensorMut;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::loader::SplitMix64;
use crate::tensor::Tensor;

/// The longest side, in pixels, an output or a resized image may have (2^31 - 1): far past
/// any real image, yet small enough that every product of sides, channels and element sizes a
/// transform computes fits a 64-bit `isize`.
pub const MAX_SIDE: usize = i32::MAX as usize;

/// The ImageNet channel means PyTorch's models expect (RGB, in 0..1).
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// The ImageNet channel standard deviations PyTorch's models expect (RGB, in 0..1).
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

#[derive(Clone, Debug, PartialEq)]
enum Crop {
    /// The shorter side resized to `resize` (if set), then the center `size × size`, padded
    /// with zeros where the image is smaller.
    Center { resize: Option<usize>, size: usize },
    /// A random part of the image (its area a `scale` share, its aspect in `ratio`) resized
    /// to `size × size`.
    RandomResized {
        size: usize,
        scale: (f64, f64),
        ratio: (f64, f64),
    },
}

/// Each channel's 256 possible outputs, per output dtype.
#[derive(Clone, Debug, PartialEq)]
enum Table {
    U8,
    F32(Arc<[f32]>),
    F16(Arc<[f16]>),
    BF16(Arc<[bf16]>),
}

/// A crop to a fixed size, an optional horizontal flip, and the output's element type.
///
/// # Examples
///
/// ```
/// use pinnable::formats::image::{IMAGENET_MEAN, IMAGENET_STD, Image, Transform};
/// use pinnable::loader::SplitMix64;
/// use pinnable::DType;
///
/// let eval = Transform::resized_center_crop(256, 224); // Resize(256) + CenterCrop(224)
/// let train = Transform::random_resized_crop(224).flip(0.5);
/// let image = Image::from_rgb(500, 375, vec![128; 500 * 375 * 3])?;
/// let x = train.apply(&image, SplitMix64::new(7))?;
/// assert_eq!((x.dtype(), x.shape()), (DType::U8, &[3, 224, 224][..]));
/// let x = eval.normalize(DType::F32, IMAGENET_MEAN, IMAGENET_STD)?.apply(&image, SplitMix64::new(7))?;
/// assert_eq!(x.dtype(), DType::F32);
/// # Ok::<(), pinnable::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Transform {
    crop: Crop,
    flip: f64,
    table: Table,
}

/// Where one image's pixels go: the source rectangle, the size it is resized to, and the
/// output's window in that resized image (which may start before it or end past it: padding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) crop: Rect,
    pub(crate) resized: (usize, usize),
    /// The output's top-left corner in resized coordinates.
    pub(crate) at: (isize, isize),
    pub(crate) flip: bool,
}

/// A uniform number in `[0, 1)`.
fn uniform(rng: &mut SplitMix64) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Python's `int(round(x))`: halves to even.
fn round_even(x: f64) -> isize {
    x.round_ties_even() as isize
}

impl Transform {
    fn with(crop: Crop) -> Transform {
        Transform {
            crop,
            flip: 0.0,
            table: Table::U8,
        }
    }

    /// The center `size × size` of the image (torchvision's `CenterCrop(size)`), padded with
    /// zeros where the image is smaller.
    pub fn center_crop(size: usize) -> Transform {
        Transform::with(Crop::Center { resize: None, size })
    }

    /// The shorter side resized to `resize` (antialiased bilinear), then the center
    /// `size × size`: torchvision's `Resize(resize)` + `CenterCrop(size)`, the usual
    /// evaluation transform (256, 224). Only the crop's pixels are computed.
    pub fn resized_center_crop(resize: usize, size: usize) -> Transform {
        Transform::with(Crop::Center {
            resize: Some(resize),
            size,
        })
    }

    /// A random part of the image resized to `size × size`: torchvision's
    /// `RandomResizedCrop(size)`, with its defaults (an area share in 0.08..1, an aspect ratio
    /// in 3/4..4/3, ten tries, then the center) and its antialiased bilinear resize.
    pub fn random_resized_crop(size: usize) -> Transform {
        Transform::with(Crop::RandomResized {
            size,
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
        })
    }

    /// A random-resized crop's range of area shares (`scale`) and aspect ratios (`ratio`).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] on another transform, or for an empty, non-positive or non-finite
    /// range.
    pub fn crop_ranges(mut self, scale: (f64, f64), ratio: (f64, f64)) -> Result<Transform> {
        let ok = |(lo, hi): (f64, f64)| lo.is_finite() && hi.is_finite() && 0.0 < lo && lo <= hi;
        match &mut self.crop {
            Crop::RandomResized {
                scale: s, ratio: r, ..
            } if ok(scale) && ok(ratio) => {
                (*s, *r) = (scale, ratio);
                Ok(self)
            }
            Crop::RandomResized { .. } => Err(Error::Config {
                setting: "crop_ranges",
                problem: format!(
                    "scale {scale:?} and ratio {ratio:?} must be finite, positive (lo, hi) ranges"
                ),
            }),
            Crop::Center { .. } => Err(Error::Config {
                setting: "crop_ranges",
                problem: "only a random-resized crop has ranges".into(),
            }),
        }
    }

    /// Flips the output horizontally with probability `p` (torchvision's
    /// `RandomHorizontalFlip(p)`), drawn after the crop.
    pub fn flip(mut self, p: f64) -> Transform {
        self.flip = p;
        self
    }

    /// Writes `((x / 255) - mean[c]) / std[c]` in `dtype` (`F32`, `F16` or `BF16`) instead of
    /// the `u8` pixel `x`: torchvision's `ToTensor` + `Normalize`, on the host. The value is
    /// computed as `(x as f32).mul_add(1 / (255 std), -mean / std)`, then rounded to `dtype`:
    /// the same numbers a conversion on the device computes from the `u8` batch.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for another dtype or a standard deviation that is not positive.
    pub fn normalize(mut self, dtype: DType, mean: [f32; 3], std: [f32; 3]) -> Result<Transform> {
        if std.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
            return Err(Error::Config {
                setting: "normalize",
                problem: format!("standard deviations {std:?} must be positive"),
            });
        }
        let value = |i: usize| {
            let (c, x) = (i / 256, (i % 256) as f32);
            x.mul_add(1.0 / (255.0 * std[c]), -mean[c] / std[c])
        };
        self.table = match dtype {
            DType::F32 => Table::F32((0..768).map(value).collect()),
            DType::F16 => Table::F16((0..768).map(|i| f16::from_f32(value(i))).collect()),
            DType::BF16 => Table::BF16((0..768).map(|i| bf16::from_f32(value(i))).collect()),
            other => {
                return Err(Error::Config {
                    setting: "normalize",
                    problem: format!("normalised pixels are f32, f16 or bf16, not {other}"),
                });
            }
        };
        Ok(self)
    }

    /// The output's element type: `U8` unless [`normalize`](Self::normalize)d.
    pub fn dtype(&self) -> DType {
        match self.table {
            Table::U8 => DType::U8,
            Table::F32(_) => DType::F32,
            Table::F16(_) => DType::F16,
            Table::BF16(_) => DType::BF16,
        }
    }

    /// The output's shape, `[3, size, size]`.
    pub fn shape(&self) -> [usize; 3] {
        let (Crop::Center { size, .. } | Crop::RandomResized { size, .. }) = self.crop;
        [3, size, size]
    }

    /// Refuses sizes whose output or resized image cannot be represented: an output of more
    /// than `isize::MAX` bytes (no allocation can hold it), or a resize to more than
    /// [`MAX_SIDE`] pixels a side.
    fn check(&self) -> Result<()> {
        let (size, resize) = match self.crop {
            Crop::Center { resize, size } => (size, resize),
            Crop::RandomResized { size, .. } => (size, None),
        };
        let bytes = [3, size, size, self.dtype().size()]
            .into_iter()
            .try_fold(1usize, usize::checked_mul)
            .filter(|&b| b <= isize::MAX as usize);
        if bytes.is_none() || size > MAX_SIDE {
            return Err(Error::Config {
                setting: "transform",
                problem: format!(
                    "an output of 3 × {size} × {size} {} cannot be allocated; the output side                      must be at most {MAX_SIDE}",
                    self.dtype()
                ),
            });
        }
        if let Some(resize) = resize.filter(|&r| r > MAX_SIDE) {
            return Err(Error::Config {
                setting: "transform",
                problem: format!(
                    "a resize of the shorter side to {resize} pixels is over the limit of                      {MAX_SIDE}"
                ),
            });
        }
        Ok(())
    }

    /// Each channel's 256 outputs as the bytes of the output type (`[3][256]` elements; the
    /// identity for `u8`): what the device's kernels write through.
    pub(crate) fn table_bytes(&self) -> Vec<u8> {
        match &self.table {
            Table::U8 => (0..768).map(|i| (i % 256) as u8).collect(),
            Table::F32(t) => t.iter().flat_map(|v| v.to_ne_bytes()).collect(),
            Table::F16(t) => t.iter().flat_map(|v| v.to_ne_bytes()).collect(),
            Table::BF16(t) => t.iter().flat_map(|v| v.to_ne_bytes()).collect(),
        }
    }

    /// Checks the transform's settings, as a write does first.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for sizes that cannot be represented.
    pub(crate) fn validate(&self) -> Result<()> {
        self.check()
    }

    /// Where an image of `width × height` goes, with the random draws from `rng`.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a resized image whose longer side would be over [`MAX_SIDE`].
    pub(crate) fn plan(&self, width: usize, height: usize, rng: &mut SplitMix64) -> Result<Plan> {
        let full = Rect {
            x: 0,
            y: 0,
            w: width,
            h: height,
        };
        let (crop, resized, at) = match self.crop {
            Crop::Center { resize, size } => {
                let resized = match resize {
                    Some(s) => shorter_side_to(width, height, s).ok_or_else(|| Error::Config {
                        setting: "transform",
                        problem: format!(
                            "resizing a {width} × {height} image's shorter side to {s} makes                              its longer side over the limit of {MAX_SIDE} pixels"
                        ),
                    })?,
                    None => (width, height),
                };
                let corner = |len: usize| -> isize {
                    if size > len {
                        -(((size - len) / 2) as isize)
                    } else {
                        round_even((len - size) as f64 / 2.0)
                    }
                };
                (full, resized, (corner(resized.0), corner(resized.1)))
            }
            Crop::RandomResized { size, scale, ratio } => {
                let crop = random_crop(width, height, scale, ratio, rng);
                (crop, (size, size), (0, 0))
            }
        };
        let flip = self.flip > 0.0 && uniform(rng) < self.flip;
        Ok(Plan {
            crop,
            resized,
            at,
            flip,
        })
    }

    /// Transforms `image` into `out`, a view of shape [`shape`](Self::shape) and dtype
    /// [`dtype`](Self::dtype) — a sample's row of a batch, for a dataset of one's own
    /// ([`Collator::write_rows`](crate::loader::Collator::write_rows)) — drawing from `rng`.
    /// Only the output's pixels are computed, straight into `out`; the thread's scratch memory
    /// is reused from call to call.
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] for a view of another shape or dtype, or an image without pixels.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::formats::image::{Image, Transform};
    /// use pinnable::loader::SplitMix64;
    /// use pinnable::{BatchLayout, DType};
    ///
    /// let t = Transform::resized_center_crop(8, 4);
    /// let image = Image::from_rgb(12, 9, vec![200; 12 * 9 * 3])?;
    /// let mut layout = BatchLayout::new();
    /// let images = layout.push(DType::U8, &[2, 3, 4, 4])?;
    /// let mut batch = layout.allocate()?;
    /// for mut row in batch.view_mut(images).rows_mut() {
    ///     t.write(&image, &mut row, SplitMix64::new(1))?;
    /// }
    /// assert!(batch.finish()[0].to_vec::<u8>()?.iter().all(|&v| v == 200));
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn write(&self, image: &Image, out: &mut TensorMut<'_>, rng: SplitMix64) -> Result<()> {
        thread_local! {
            static RESAMPLER: std::cell::RefCell<Resampler> = Default::default();
        }
        RESAMPLER.with(|r| match r.try_borrow_mut() {
            Ok(mut r) => self.write_into(image, out, rng, &mut r),
            Err(_) => self.write_into(image, out, rng, &mut Resampler::default()),
        })
    }

    /// [`write`](Self::write) with scratch memory of the caller's.
    pub(crate) fn write_into(
        &self,
        image: &Image,
        out: &mut TensorMut<'_>,
        rng: SplitMix64,
        resampler: &mut Resampler,
    ) -> Result<()> {
        let shape = self.shape();
        no_pixels(image)?;
        self.check()?;
        if out.dtype() != self.dtype() || out.shape() != shape {
            return Err(Error::Shape(format!(
                "the transform writes {} {shape:?}, not into a view of {} {:?}",
                self.dtype(),
                out.dtype(),
                out.shape()
            )));
        }
        let out = match self.table {
            Table::U8 => Out::U8(out.as_mut_slice()?),
            Table::F32(_) => Out::F32(out.as_mut_slice()?),
            Table::F16(_) => Out::F16(out.as_mut_slice()?),
            Table::BF16(_) => Out::BF16(out.as_mut_slice()?),
        };
        self.run(image, out, rng, resampler)
    }

    /// Transforms `image` into a tensor of its own, drawing from `rng`: what a loader writes
    /// into a batch's row for a sample drawing the same numbers.
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] for an image without pixels; [`Error::Config`] for sizes that cannot
    /// be represented (an output side or a resize over [`MAX_SIDE`]);
    /// [`Error::HostAlloc`] when the output's memory is refused.
    pub fn apply(&self, image: &Image, rng: SplitMix64) -> Result<Tensor> {
        no_pixels(image)?;
        self.check()?;
        let shape = self.shape();
        let n = 3 * shape[1] * shape[2];
        let mut resampler = Resampler::default();
        match self.table {
            Table::U8 => {
                let mut v = zeros(n, 0u8)?;
                self.run(image, Out::U8(&mut v), rng, &mut resampler)?;
                Tensor::from_vec(v, &shape)
            }
            Table::F32(_) => {
                let mut v = zeros(n, 0f32)?;
                self.run(image, Out::F32(&mut v), rng, &mut resampler)?;
                Tensor::from_vec(v, &shape)
            }
            Table::F16(_) => {
                let mut v = zeros(n, f16::ZERO)?;
                self.run(image, Out::F16(&mut v), rng, &mut resampler)?;
                Tensor::from_vec(v, &shape)
            }
            Table::BF16(_) => {
                let mut v = zeros(n, bf16::ZERO)?;
                self.run(image, Out::BF16(&mut v), rng, &mut resampler)?;
                Tensor::from_vec(v, &shape)
            }
        }
    }

    /// Plans `image` with draws from `rng` and writes it into `out`, whose element type is
    /// this transform's.
    fn run(
        &self,
        image: &Image,
        out: Out<'_>,
        mut rng: SplitMix64,
        r: &mut Resampler,
    ) -> Result<()> {
        let plan = self.plan(image.width(), image.height(), &mut rng)?;
        let size = self.shape()[1];
        let at = |c: usize, v: u8| c * 256 + usize::from(v);
        match (&self.table, out) {
            (Table::U8, Out::U8(d)) => resample(image, &plan, size, d, r),
            (Table::F32(t), Out::F32(d)) => write(image, &plan, size, d, r, |c, v| t[at(c, v)]),
            (Table::F16(t), Out::F16(d)) => write(image, &plan, size, d, r, |c, v| t[at(c, v)]),
            (Table::BF16(t), Out::BF16(d)) => write(image, &plan, size, d, r, |c, v| t[at(c, v)]),
            _ => unreachable!("the output's element type is the table's"),
        }
        Ok(())
    }
}

/// Where a transform writes: `[3, size, size]` elements of its output type.
enum Out<'a> {
    U8(&'a mut [u8]),
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
    BF16(&'a mut [bf16]),
}

/// Refuses an image without pixels (one can be made by hand), which has nothing to crop.
fn no_pixels(image: &Image) -> Result<()> {
    if image.width() == 0 || image.height() == 0 {
        return Err(Error::Shape(format!(
            "cannot transform an image of {} × {} pixels",
            image.width(),
            image.height()
        )));
    }
    Ok(())
}

/// `n` copies of `zero`, or [`Error::HostAlloc`] when the memory is refused.
fn zeros<T: Copy>(n: usize, zero: T) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::HostAlloc {
        requested: n.saturating_mul(std::mem::size_of::<T>()),
        source: std::io::Error::from(std::io::ErrorKind::OutOfMemory),
    })?;
    v.resize(n, zero);
    Ok(v)
}

/// torchvision's `Resize(s)` size: the shorter side `s`, the longer `int(s * long / short)`;
/// `None` when the longer side would be over [`MAX_SIDE`].
fn shorter_side_to(width: usize, height: usize, s: usize) -> Option<(usize, usize)> {
    let long = |long: usize, short: usize| {
        let l = (s.checked_mul(long)? as f64 / short as f64) as usize;
        (l <= MAX_SIDE).then_some(l)
    };
    Some(if width <= height {
        (s, long(height, width)?)
    } else {
        (long(width, height)?, s)
    })
}

/// torchvision's `RandomResizedCrop.get_params`: ten tries at a random area and aspect ratio
/// that fit, then the center crop of the ratio range.
fn random_crop(
    width: usize,
    height: usize,
    scale: (f64, f64),
    ratio: (f64, f64),
    rng: &mut SplitMix64,
) -> Rect {
    let area = (width * height) as f64;
    let (lo, hi) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target = area * (scale.0 + (scale.1 - scale.0) * uniform(rng));
        let aspect = (lo + (hi - lo) * uniform(rng)).exp();
        let w = round_even((target * aspect).sqrt());
        let h = round_even((target / aspect).sqrt());
        if 0 < w && w as usize <= width && 0 < h && h as usize <= height {
            let (w, h) = (w as usize, h as usize);
            let y = rng.below((height - h + 1) as u64) as usize;
            let x = rng.below((width - w + 1) as u64) as usize;
            return Rect { x, y, w, h };
        }
    }
    let in_ratio = width as f64 / height as f64;
    let (w, h) = if in_ratio < ratio.0 {
        (width, round_even(width as f64 / ratio.0) as usize)
    } else if in_ratio > ratio.1 {
        (round_even(height as f64 * ratio.1) as usize, height)
    } else {
        (width, height)
    };
    let (w, h) = (w.clamp(1, width), h.clamp(1, height));
    Rect {
        x: (width - w) / 2,
        y: (height - h) / 2,
        w,
        h,
    }
}

/// Writes the planned image into `planes` (`[3, size, size]`), zeros where the window pads
/// the image.
fn resample(image: &Image, plan: &Plan, size: usize, planes: &mut [u8], r: &mut Resampler) {
    // The window's part inside the resized image, in resized and in output coordinates.
    let inside = |at: isize, len: usize| {
        let lo = at.max(0) as usize;
        let hi = (at + size as isize).clamp(0, len as isize) as usize;
        (lo..hi.max(lo), (lo as isize - at) as usize)
    };
    let (cols, x0) = inside(plan.at.0, plan.resized.0);
    let (rows, y0) = inside(plan.at.1, plan.resized.1);
    if cols.len() < size || rows.len() < size {
        planes.fill(0);
    }
    if cols.is_empty() || rows.is_empty() {
        return;
    }
    // Mirrored, the window's columns land at the other end of the row.
    let x0 = if plan.flip {
        size - x0 - cols.len()
    } else {
        x0
    };
    let dst = Planes {
        data: planes,
        plane: size * size,
        width: size,
        x0,
        y0,
        flip: plan.flip,
    };
    r.run(image, plan.crop, plan.resized, cols, rows, dst);
}

/// Writes the planned image into `dst` (`[3, size, size]`), each pixel value `v` of channel `c`
/// as `value(c, v)`; `u8` outputs are written in place, others through `r`'s planes.
fn write<T: Copy>(
    image: &Image,
    plan: &Plan,
    size: usize,
    dst: &mut [T],
    r: &mut Resampler,
    value: impl Fn(usize, u8) -> T,
) {
    let mut planes = std::mem::take(&mut r.planes);
    planes.resize(3 * size * size, 0);
    resample(image, plan, size, &mut planes, r);
    let plane = size * size;
    for (c, (d, p)) in dst.chunks_mut(plane).zip(planes.chunks(plane)).enumerate() {
        for (d, &v) in d.iter_mut().zip(p) {
            *d = value(c, v);
        }
    }
    r.planes = planes;
}

#[cfg(test)]
mod tests;
