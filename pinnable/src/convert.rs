//! [`Convert`]: elements converted while a [`Gather`](crate::Gather) moves them, so compact
//! types cross the link and wide ones are made where they land.
//!
//! u8 pixels are a quarter of their f32 values and u16 token ids a quarter of their i64 ones:
//! a gather that converts on the way moves the compact bytes and writes the wide ones on the
//! device (by the gather kernels). Moved to the host, or where the kernels cannot run, the same
//! conversion runs here, in plain Rust, and gives the same values bit for bit: the affine map
//! is one fused multiply-add in f32 on both sides, rounded to f16 or bf16 to nearest even.

use std::fmt;
use std::sync::Arc;

use crate::dtype::DType;
use crate::error::{Error, Result};

/// How a gather converts each element on the way to its destination.
///
/// # Examples
///
/// u16 token ids widened to i64, and u8 pixels normalised to f32 as torchvision's
/// `Normalize(mean, std)` does after `ToTensor`:
///
/// ```
/// use pinnable::{Convert, DType, Gather, Tensor};
///
/// let tokens = Tensor::from_vec1(vec![7u16, 8, 9, 10, 11]);
/// let x = Gather::windows(&tokens, [0, 2], 3)?.convert(Convert::cast(DType::I64))?;
/// assert_eq!(x.tensor()?.to_vec::<i64>()?, vec![7, 8, 9, 9, 10, 11]);
///
/// let pixels = Tensor::from_vec(vec![0u8, 255, 51, 102], &[1, 2, 2])?; // [B, C, H*W]
/// let norm = Convert::normalize(DType::F32, &[0.5, 0.2], &[0.5, 0.4])?;
/// let x = Gather::rows(&pixels, [0])?.convert(norm)?;
/// let v = x.tensor()?.to_vec::<f32>()?;
/// assert!((v[0] + 1.0).abs() < 1e-6 && (v[1] - 1.0).abs() < 1e-6);
/// assert!((v[2] - 0.0).abs() < 1e-6 && (v[3] - 0.5).abs() < 1e-6);
/// # Ok::<(), pinnable::Error>(())
/// ```
#[derive(Clone, PartialEq)]
pub struct Convert {
    pub(crate) kind: Kind,
}

#[derive(Clone, PartialEq)]
pub(crate) enum Kind {
    /// Integers to a wider (or equal) integer type, as Rust's `as` does.
    Cast(DType),
    /// u8 to a float type: `(x as f32).mul_add(scale[c], offset[c])`, rounded to `to`, where
    /// the channel `c` of the element at index `i` of the gathered tensor is
    /// `(i / inner) % channels`, along `dim`.
    Affine {
        to: DType,
        scale: Arc<[f32]>,
        offset: Arc<[f32]>,
        dim: usize,
    },
}

impl Convert {
    /// Integers widened to `to` (`I32` or `I64`) as Rust's `as` does: u8, u16 and u32 sources
    /// (a u32 above `i32::MAX` wraps when cast to `I32`).
    ///
    /// Which source dtypes are accepted is checked by [`Gather::convert`](crate::Gather::convert).
    pub fn cast(to: DType) -> Convert {
        Convert {
            kind: Kind::Cast(to),
        }
    }

    /// u8 pixels to `to` (`F32`, `F16` or `BF16`) normalised per channel as torchvision's
    /// `ToTensor` then `Normalize(mean, std)` do: `(x / 255 - mean[c]) / std[c]`, computed as
    /// one fused multiply-add `x * (1 / (255 * std[c])) + (-mean[c] / std[c])` in f32 (within
    /// a unit in the last place of the two-step formula). The channel is dimension 1 of the
    /// gathered tensor (`[B, C, ...]`).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when `mean` and `std` differ in length or are empty, or a `std` is 0
    /// or not finite.
    pub fn normalize(to: DType, mean: &[f32], std: &[f32]) -> Result<Convert> {
        if mean.len() != std.len() || mean.is_empty() {
            return Err(Error::Config {
                setting: "normalize",
                problem: format!(
                    "mean has {} channels and std {}; give one of each per channel",
                    mean.len(),
                    std.len()
                ),
            });
        }
        if let Some(s) = std.iter().find(|s| **s == 0.0 || !s.is_finite()) {
            return Err(Error::Config {
                setting: "normalize",
                problem: format!("a standard deviation of {s} cannot divide"),
            });
        }
        let scale: Vec<f32> = std.iter().map(|s| 1.0 / (255.0 * s)).collect();
        let offset: Vec<f32> = mean.iter().zip(std).map(|(m, s)| -m / s).collect();
        Convert::affine(to, &scale, &offset, 1)
    }

    /// u8 elements to `to` (`F32`, `F16` or `BF16`) by a per-channel affine map:
    /// `(x as f32).mul_add(scale[c], offset[c])`, rounded to nearest even, where `c` is the
    /// element's index along dimension `dim` of the gathered tensor.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when `scale` and `offset` differ in length or are empty.
    pub fn affine(to: DType, scale: &[f32], offset: &[f32], dim: usize) -> Result<Convert> {
        if scale.len() != offset.len() || scale.is_empty() {
            return Err(Error::Config {
                setting: "affine",
                problem: format!(
                    "scale has {} channels and offset {}; give one of each per channel",
                    scale.len(),
                    offset.len()
                ),
            });
        }
        Ok(Convert {
            kind: Kind::Affine {
                to,
                scale: scale.into(),
                offset: offset.into(),
                dim,
            },
        })
    }

    /// The element type produced.
    pub fn output(&self) -> DType {
        match &self.kind {
            Kind::Cast(to) | Kind::Affine { to, .. } => *to,
        }
    }

    /// Checks that `self` converts `from` elements of a gathered tensor of `shape`, and returns
    /// the layout the conversion runs with.
    pub(crate) fn resolve(&self, from: DType, shape: &[usize]) -> Result<Resolved> {
        let unsupported = || Error::Config {
            setting: "convert",
            problem: format!(
                "{self:?} does not convert {from} elements; it takes {}",
                match self.kind {
                    Kind::Cast(_) => "u8, u16 or u32 to i32 or i64",
                    Kind::Affine { .. } => "u8 to f32, f16 or bf16",
                }
            ),
        };
        match &self.kind {
            Kind::Cast(to) => {
                let ok = matches!(from, DType::U8 | DType::U16 | DType::U32)
                    && matches!(to, DType::I32 | DType::I64);
                if !ok {
                    return Err(unsupported());
                }
                Ok(Resolved {
                    from,
                    to: *to,
                    channels: 1,
                    inner: 1,
                })
            }
            Kind::Affine { to, scale, dim, .. } => {
                if from != DType::U8 || !matches!(to, DType::F32 | DType::F16 | DType::BF16) {
                    return Err(unsupported());
                }
                let Some(&channels) = shape.get(*dim) else {
                    return Err(Error::Config {
                        setting: "convert",
                        problem: format!(
                            "channels along dimension {dim} of a gathered tensor of shape \
                             {shape:?}, which has no such dimension"
                        ),
                    });
                };
                if channels != scale.len() {
                    return Err(Error::Config {
                        setting: "convert",
                        problem: format!(
                            "{} channel parameters for {channels} channels along dimension \
                             {dim} of the gathered shape {shape:?}",
                            scale.len()
                        ),
                    });
                }
                let inner = shape[dim + 1..].iter().product::<usize>().max(1);
                Ok(Resolved {
                    from,
                    to: *to,
                    channels,
                    inner,
                })
            }
        }
    }

    /// Whether this is a per-channel affine map (else an integer cast).
    pub(crate) fn is_affine(&self) -> bool {
        matches!(self.kind, Kind::Affine { .. })
    }

    /// The per-channel scale and offset of an affine map (empty for a cast).
    pub(crate) fn coefficients(&self) -> (&[f32], &[f32]) {
        match &self.kind {
            Kind::Cast(_) => (&[], &[]),
            Kind::Affine { scale, offset, .. } => (scale, offset),
        }
    }

    /// Converts `count` elements of `src` (compact, contiguous, of the source dtype) into `dst`,
    /// the first being element `first` of the gathered tensor. The host reference of the gather
    /// kernels.
    pub(crate) fn run(&self, layout: &Resolved, src: &[u8], first: usize, dst: &mut [u8]) {
        let n = src.len() / layout.from.size();
        debug_assert_eq!(dst.len(), n * layout.to.size());
        match (&self.kind, layout.from) {
            (Kind::Cast(_), DType::U8) => cast(src.iter().map(|&b| i64::from(b)), layout.to, dst),
            (Kind::Cast(_), DType::U16) => cast(
                src.chunks_exact(2)
                    .map(|b| i64::from(u16::from_ne_bytes([b[0], b[1]]))),
                layout.to,
                dst,
            ),
            (Kind::Cast(_), _) => cast(
                src.chunks_exact(4)
                    .map(|b| i64::from(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))),
                layout.to,
                dst,
            ),
            (Kind::Affine { scale, offset, .. }, _) => {
                let size = layout.to.size();
                let mut r = first % layout.inner;
                let mut c = first / layout.inner % layout.channels;
                for (&x, out) in src.iter().zip(dst.chunks_exact_mut(size)) {
                    let y = f32::from(x).mul_add(scale[c], offset[c]);
                    match layout.to {
                        DType::F32 => out.copy_from_slice(&y.to_ne_bytes()),
                        DType::F16 => out.copy_from_slice(&half::f16::from_f32(y).to_ne_bytes()),
                        _ => out.copy_from_slice(&half::bf16::from_f32(y).to_ne_bytes()),
                    }
                    r += 1;
                    if r == layout.inner {
                        r = 0;
                        c = if c + 1 == layout.channels { 0 } else { c + 1 };
                    }
                }
            }
        }
    }
}

/// Converts the concatenation of `parts` (host tensors of the source dtype) into `dst`, on
/// this thread: the host's side of a converting gather.
///
/// # Errors
///
/// [`Error::WrongPlacement`] for a part that is not on the host.
pub(crate) fn convert_parts(
    c: &Convert,
    layout: &Resolved,
    parts: &[crate::Tensor],
    dst: &mut [u8],
) -> Result<()> {
    let mut first = 0;
    let mut compact = Vec::new();
    for p in parts {
        let src = p.host_src("convert")?;
        compact.clear();
        compact.resize(p.nbytes(), 0);
        // SAFETY: the part's bytes are live (held by `p`) and only read; `compact` holds
        // exactly its bytes and overlaps nothing.
        unsafe { src.gather(compact.as_mut_ptr()) };
        let n = p.numel();
        let out = layout.to.size();
        c.run(
            layout,
            &compact,
            first,
            &mut dst[first * out..(first + n) * out],
        );
        first += n;
    }
    Ok(())
}

/// Writes `values` as `to` (`I32`, wrapping, or `I64`) into `dst`.
fn cast(values: impl Iterator<Item = i64>, to: DType, dst: &mut [u8]) {
    if to == DType::I32 {
        for (v, out) in values.zip(dst.chunks_exact_mut(4)) {
            out.copy_from_slice(&(v as i32).to_ne_bytes());
        }
    } else {
        for (v, out) in values.zip(dst.chunks_exact_mut(8)) {
            out.copy_from_slice(&v.to_ne_bytes());
        }
    }
}

/// A conversion checked against its source: dtypes and the channel layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub(crate) from: DType,
    pub(crate) to: DType,
    /// Channels of an affine map (1 for a cast).
    pub(crate) channels: usize,
    /// Elements of one channel plane: the product of the dimensions after the channel's.
    pub(crate) inner: usize,
}

impl fmt::Debug for Convert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Cast(to) => write!(f, "Convert::cast({to})"),
            Kind::Affine { to, dim, scale, .. } => write!(
                f,
                "Convert::affine(to {to}, {} channels along dimension {dim})",
                scale.len()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn casts_widen_like_as() {
        let c = Convert::cast(DType::I32);
        let layout = c.resolve(DType::U32, &[2]).unwrap();
        let src: Vec<u8> = [7u32, u32::MAX]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        let mut dst = vec![0u8; 8];
        c.run(&layout, &src, 0, &mut dst);
        assert_eq!(&dst[..4], &7i32.to_ne_bytes());
        assert_eq!(&dst[4..], &(u32::MAX as i32).to_ne_bytes());
    }

    #[test]
    fn affine_channels_follow_the_dimension_from_any_first_element() {
        // [2, 3, 2]: channel of element i is (i / 2) % 3.
        let c = Convert::affine(DType::F32, &[1.0, 10.0, 100.0], &[0.5, 0.25, 0.125], 1).unwrap();
        let layout = c.resolve(DType::U8, &[2, 3, 2]).unwrap();
        assert_eq!((layout.channels, layout.inner), (3, 2));
        let src = [1u8, 2, 3];
        let mut dst = vec![0u8; 12];
        // Elements 3, 4, 5: channels 1, 2, 2.
        c.run(&layout, &src, 3, &mut dst);
        let got: Vec<f32> = dst
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(got, vec![10.25, 200.125, 300.125]);
    }

    #[test]
    fn unsupported_pairs_and_wrong_channel_counts_are_refused() {
        assert!(Convert::cast(DType::I64).resolve(DType::F32, &[4]).is_err());
        assert!(Convert::cast(DType::U64).resolve(DType::U16, &[4]).is_err());
        let n = Convert::normalize(DType::BF16, &[0.5; 3], &[0.2; 3]).unwrap();
        assert!(n.resolve(DType::U8, &[8, 3, 4, 4]).is_ok());
        let e = n.resolve(DType::U8, &[8, 4, 4]).unwrap_err().to_string();
        assert!(e.contains("3 channel parameters for 4 channels"), "{e}");
        assert!(n.resolve(DType::U16, &[8, 3, 4]).is_err());
        assert!(Convert::normalize(DType::F32, &[0.5], &[0.0]).is_err());
        assert!(Convert::normalize(DType::F32, &[0.5, 0.1], &[0.2]).is_err());
    }
}
