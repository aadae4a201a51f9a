//! The dense-CPU check: the one place that decides whether a tensor-like value can be pinned.

use std::fmt;

use crate::error::{Error, Result};
use crate::path::FieldPath;
use crate::tensor::{Placement, Tensor};

/// How a tensor-like value lays out its elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TensorLayout {
    /// Every element stored, at a regular stride (contiguous or a strided view).
    Dense,
    /// Anything else, named for messages: `sparse COO`, `quantized`, `lazy`...
    Other(&'static str),
}

impl fmt::Display for TensorLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorLayout::Dense => f.write_str("dense"),
            TensorLayout::Other(name) => f.write_str(name),
        }
    }
}

/// What the dense-CPU check needs to know about a tensor-like value. Implemented by
/// [`Tensor`]; library authors implement it for their own tensor types.
pub trait TensorMeta {
    /// The element type's name for messages (`f32`, `i64`, ...).
    fn dtype_name(&self) -> String;
    /// Where the elements live.
    fn placement(&self) -> Placement;
    /// How the elements are laid out.
    fn layout(&self) -> TensorLayout {
        TensorLayout::Dense
    }
}

impl TensorMeta for Tensor {
    fn dtype_name(&self) -> String {
        self.dtype().name().to_owned()
    }

    fn placement(&self) -> Placement {
        Tensor::placement(self)
    }
}

/// Checks that `value` is dense data in host memory (pageable or pinned).
///
/// # Errors
///
/// [`Error::NotDenseCpu`] naming `path`, the dtype and the placement (or layout), e.g.
/// ``cannot pin `batch.extra["mask"]` (i64 tensor on cuda:0): only dense CPU tensors can be pinned``.
///
/// # Examples
///
/// ```
/// use pinnable::{FieldPath, Tensor, dense_cpu};
///
/// let t = Tensor::from_vec(vec![1i64, 2, 3], &[3])?;
/// dense_cpu(&t, &FieldPath::new())?;
/// # Ok::<(), pinnable::Error>(())
/// ```
pub fn dense_cpu<T: TensorMeta + ?Sized>(value: &T, path: &FieldPath) -> Result<()> {
    let placement = value.placement();
    let layout = value.layout();
    if placement.is_host() && layout == TensorLayout::Dense {
        return Ok(());
    }
    let placement = match layout {
        TensorLayout::Dense => placement.to_string(),
        other => format!("{placement}, {other} layout"),
    };
    Err(Error::NotDenseCpu {
        path: path.to_string(),
        dtype: value.dtype_name(),
        placement,
    })
}
