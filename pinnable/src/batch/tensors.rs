//! Tensors built in place in page-locked memory: no pageable intermediate, no second copy.

use super::{BatchLayout, TensorMut};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// A one-tensor batch of `dtype` and `shape`, written by `fill`.
fn build(
    dtype: DType,
    shape: &[usize],
    fill: impl FnOnce(TensorMut<'_>) -> Result<()>,
) -> Result<Tensor> {
    let mut layout = BatchLayout::new();
    let slot = layout.push(dtype, shape)?;
    let mut batch = layout.allocate()?;
    fill(batch.view_mut(slot))?;
    Ok(batch.finish().pop().expect("one slot"))
}

impl Tensor {
    /// A pinned tensor whose elements are unspecified (whatever its block last held; `false`
    /// for `bool`), like `torch.empty(..., pin_memory=True)`: for callers that overwrite every
    /// element anyway. Reading it is safe; the values are merely arbitrary.
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] if the byte count overflows; allocation errors from the pool.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::{DType, Tensor};
    ///
    /// let mut t = Tensor::empty_pinned(DType::F32, &[2, 3])?;
    /// t.as_mut_slice::<f32>()?.fill(0.5); // in place: the tensor owns its block
    /// assert!(t.is_pinned());
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn empty_pinned(dtype: DType, shape: &[usize]) -> Result<Tensor> {
        build(dtype, shape, |_| Ok(()))
    }

    /// A pinned tensor of zeros (`false` for `bool`).
    ///
    /// # Errors
    ///
    /// As [`empty_pinned`](Self::empty_pinned).
    pub fn zeros_pinned(dtype: DType, shape: &[usize]) -> Result<Tensor> {
        build(dtype, shape, |mut v| {
            v.fill_zeros();
            Ok(())
        })
    }

    /// A pinned tensor whose element `i` (in row-major order) is `f(i)`.
    ///
    /// # Errors
    ///
    /// As [`empty_pinned`](Self::empty_pinned).
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::Tensor;
    ///
    /// let t = Tensor::pinned_from_fn(&[2, 2], |i| i as i64 * 10)?;
    /// assert_eq!(t.to_vec::<i64>()?, vec![0, 10, 20, 30]);
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn pinned_from_fn<T: Element>(
        shape: &[usize],
        mut f: impl FnMut(usize) -> T,
    ) -> Result<Tensor> {
        build(T::DTYPE, shape, |mut v| {
            for (i, x) in v.as_mut_slice::<T>()?.iter_mut().enumerate() {
                *x = f(i);
            }
            Ok(())
        })
    }

    /// A pinned tensor holding the items of `iter` in row-major order.
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] if `iter` yields fewer or more items than the shape holds; as
    /// [`empty_pinned`](Self::empty_pinned).
    pub fn pinned_from_iter<T: Element>(
        shape: &[usize],
        iter: impl IntoIterator<Item = T>,
    ) -> Result<Tensor> {
        build(T::DTYPE, shape, |mut v| {
            let dst = v.as_mut_slice::<T>()?;
            let mut it = iter.into_iter();
            let mut n = 0;
            for (x, item) in dst.iter_mut().zip(&mut it) {
                *x = item;
                n += 1;
            }
            let extra = it.next().is_some();
            if n < dst.len() || extra {
                return Err(Error::Shape(format!(
                    "shape {shape:?} holds {} elements but the iterator yielded {}",
                    dst.len(),
                    if extra {
                        "more".to_string()
                    } else {
                        n.to_string()
                    }
                )));
            }
            Ok(())
        })
    }

    /// A pinned tensor built one row (index along the first dimension) at a time: `f(i, row)`
    /// writes row `i`, a slice of the row's elements.
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] for a rank-0 shape; as [`empty_pinned`](Self::empty_pinned).
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::Tensor;
    ///
    /// let t = Tensor::pinned_from_rows(&[3, 2], |i, row: &mut [f32]| row.fill(i as f32))?;
    /// assert_eq!(t.to_vec::<f32>()?, vec![0.0, 0.0, 1.0, 1.0, 2.0, 2.0]);
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn pinned_from_rows<T: Element>(
        shape: &[usize],
        mut f: impl FnMut(usize, &mut [T]),
    ) -> Result<Tensor> {
        if shape.is_empty() {
            return Err(Error::Shape("a rank-0 tensor has no rows".into()));
        }
        build(T::DTYPE, shape, |mut v| {
            for (i, mut row) in v.rows_mut().enumerate() {
                f(i, row.as_mut_slice::<T>()?);
            }
            Ok(())
        })
    }

    /// A contiguous copy of this host tensor in a pinned block of its own: for keeping one
    /// tensor of a pinned batch without keeping the whole batch's block alive.
    ///
    /// # Errors
    ///
    /// [`Error::WrongPlacement`] for a device tensor; as [`empty_pinned`](Self::empty_pinned).
    pub fn to_own_block(&self) -> Result<Tensor> {
        build(self.dtype(), self.shape(), |mut v| v.copy_from(self))
    }
}
