//! ndarray: zero-copy array views of host tensors, and tensors from owned arrays.
//!
//! - [`Tensor::as_array`] views a host tensor (pageable or pinned, strided views included) as
//!   an [`ArrayViewD`] with the same shape and strides, without a copy; it waits for a pending
//!   copy into the tensor first, like [`Tensor::as_slice`].
//! - [`Tensor::as_array_mut`] is the writable view, under the rule of
//!   [`Tensor::as_mut_slice`]: in place when no clone or view shares the tensor, into a private
//!   copy otherwise, so no other tensor sees the write.
//! - [`TensorMut::as_array_mut`] writes a tensor of a [`PinnedBatch`](crate::PinnedBatch) being
//!   built with ndarray, straight into pinned memory.
//! - [`Tensor::from_array`] (and `From<Array<T, D>>`) takes an owned array's allocation over
//!   without a copy when the array's elements fill it, in any axis order.
//!
//! ```
//! use ndarray::{ArrayD, IxDyn};
//! use pinnable::Tensor;
//!
//! let a = ArrayD::from_shape_fn(IxDyn(&[2, 3]), |i| (i[0] * 10 + i[1]) as f32);
//! let t = Tensor::from_array(a.clone()); // takes the array's vector over: no copy
//! let tt = t.transpose(0, 1)?;
//! assert_eq!(tt.as_array::<f32>()?, a.t()); // a strided view, still no copy
//! # Ok::<(), pinnable::Error>(())
//! ```

use std::ptr::NonNull;

use ::ndarray::{Array, ArrayViewD, ArrayViewMutD, Dimension, IxDyn, ShapeBuilder};

use crate::batch::TensorMut;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::tensor::{HostBuf, Storage, Tensor};

impl Tensor {
    /// The tensor as an ndarray view with its shape and strides, without a copy. Waits for a
    /// pending copy into the tensor first.
    ///
    /// # Errors
    ///
    /// [`Error::DTypeMismatch`] if `T` is not the dtype; [`Error::WrongPlacement`] for a device
    /// tensor (move it with [`to_cpu`](crate::ToDevice::to_cpu) first).
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::{Pinnable, Tensor};
    ///
    /// let t = Tensor::from_vec((0..6i64).collect(), &[2, 3])?.pin_memory()?;
    /// let col = t.narrow(1, 1, 1)?;
    /// let view = col.as_array::<i64>()?;
    /// assert_eq!(view.shape(), &[2, 1]);
    /// assert_eq!(view.strides(), &[3, 1]);
    /// assert_eq!(view.iter().copied().collect::<Vec<_>>(), vec![1, 4]);
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn as_array<T: Element>(&self) -> Result<ArrayViewD<'_, T>> {
        self.check_dtype::<T>()?;
        let first = self.host_src("as_array")?.ptr.cast::<T>();
        let shape = IxDyn(self.shape()).strides(IxDyn(self.strides()));
        if self.numel() == 0 {
            // SAFETY: an empty view reads nothing; a dangling, aligned pointer may be offset
            // by zero along every axis.
            return Ok(unsafe { ArrayViewD::from_shape_ptr(shape, NonNull::dangling().as_ptr()) });
        }
        // SAFETY: every element the shape and non-negative strides reach lies in the storage,
        // which `&self` keeps alive (views are checked when made), aligned for `T` (dtype
        // checked; storage is aligned for its dtype and offsets are whole elements) and valid
        // (written as `T`); nothing writes them while `&self` lives, since writes need
        // `&mut Tensor` and a storage of their own. The storage is one allocation smaller than
        // `isize::MAX` bytes.
        Ok(unsafe { ArrayViewD::from_shape_ptr(shape, first) })
    }

    /// The tensor as a writable ndarray view, under the rule of [`as_mut_slice`](Self::as_mut_slice):
    /// if a clone or view shares this tensor's storage, or its bytes are owned elsewhere, the
    /// tensor first gets a contiguous copy of its own (in the same kind of memory), so other
    /// tensors never see the write; otherwise the view writes in place with the tensor's
    /// strides, after waiting for device copies still reading its block.
    ///
    /// # Errors
    ///
    /// As [`as_array`](Self::as_array), plus allocation errors when a private copy is made.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::Axis;
    /// use pinnable::Tensor;
    ///
    /// let mut t = Tensor::from_vec(vec![0.0f32; 6], &[2, 3])?.transpose(0, 1)?;
    /// t.as_array_mut::<f32>()?.index_axis_mut(Axis(0), 2).fill(1.0); // in place, strided
    /// assert_eq!(t.to_vec::<f32>()?, vec![0.0, 0.0, 0.0, 0.0, 1.0, 1.0]);
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn as_array_mut<T: Element>(&mut self) -> Result<ArrayViewMutD<'_, T>> {
        self.check_dtype::<T>()?;
        let first = self.writable("as_array_mut", true)?.cast::<T>();
        let shape = IxDyn(self.shape()).strides(IxDyn(self.strides()));
        if self.numel() == 0 {
            // SAFETY: an empty view touches nothing; see `as_array`.
            return Ok(unsafe {
                ArrayViewMutD::from_shape_ptr(shape, NonNull::dangling().as_ptr())
            });
        }
        // SAFETY: as in `as_array`, and `writable` left this tensor the only one referring to
        // its storage, with a layout in which no two indices reach one element, so `&mut self`
        // is exclusive over every element the view reaches; no copy still reads them.
        Ok(unsafe { ArrayViewMutD::from_shape_ptr(shape, first) })
    }

    /// A pageable tensor holding `array`'s elements, with its shape.
    ///
    /// Without a copy when the array's elements fill its allocation, in any axis order
    /// (row-major, column-major, permuted axes): the tensor takes the allocation over and keeps
    /// the array's strides. With one copy, into a contiguous tensor, when the array is a slice
    /// of a larger allocation (which the tensor would otherwise keep alive) or has a negative
    /// stride (which tensors do not have).
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::Array2;
    /// use pinnable::Tensor;
    ///
    /// let a = Array2::from_shape_fn((3, 4), |(i, j)| (i * 4 + j) as u16).reversed_axes();
    /// let t = Tensor::from_array(a.clone()); // column-major: kept as it is, no copy
    /// assert_eq!(t.shape(), &[4, 3]);
    /// assert_eq!(t.strides(), &[1, 4]);
    /// assert_eq!(t.as_array::<u16>()?, a.into_dyn());
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn from_array<T: Element, D: Dimension>(array: Array<T, D>) -> Tensor {
        let shape = array.shape().to_vec();
        let numel = array.len();
        let strides: Option<Vec<usize>> = array
            .strides()
            .iter()
            .zip(&shape)
            // A stride along a dimension of one element is never followed; any value will do.
            .map(|(&s, &d)| {
                if d <= 1 {
                    Some(0)
                } else {
                    usize::try_from(s).ok()
                }
            })
            .collect();
        if let Some(strides) = strides {
            let (vec, offset) = array.into_raw_vec_and_offset();
            match offset {
                Some(offset) if numel > 0 && vec.len() == numel => {
                    let strides: Vec<usize> = strides
                        .iter()
                        .zip(&shape)
                        .map(|(&s, &d)| if d <= 1 { 1 } else { s })
                        .collect();
                    let storage = Storage::host(HostBuf::from_vec(vec));
                    return Tensor::from_parts(storage, T::DTYPE, &shape, &strides, offset);
                }
                _ if numel == 0 => {
                    return Tensor::from_vec(Vec::<T>::new(), &shape)
                        .expect("an array's shape holds its elements");
                }
                _ => {
                    // The vector holds more than the array's elements: gather them.
                    let view = ArrayViewD::from_shape(
                        IxDyn(&shape).strides(IxDyn(&strides)),
                        &vec[offset.unwrap_or(0)..],
                    );
                    let data = match view {
                        Ok(v) => v.iter().copied().collect(),
                        Err(_) => unreachable!("an owned array's layout fits its vector"),
                    };
                    return Tensor::from_vec(data, &shape)
                        .expect("an array's shape holds its elements");
                }
            }
        }
        let data: Vec<T> = array.iter().copied().collect();
        Tensor::from_vec(data, &shape).expect("an array's shape holds its elements")
    }
}

impl<T: Element, D: Dimension> From<Array<T, D>> for Tensor {
    /// As [`Tensor::from_array`].
    fn from(array: Array<T, D>) -> Tensor {
        Tensor::from_array(array)
    }
}

impl TensorMut<'_> {
    /// The view as a writable ndarray view of its shape, for writing a sample into a batch
    /// being built in pinned memory with ndarray (`assign`, `slice_mut`, `Zip`, ...).
    ///
    /// # Errors
    ///
    /// [`Error::DTypeMismatch`] if `T` is not the dtype.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{Array2, s};
    /// use pinnable::{BatchLayout, DType};
    ///
    /// let mut layout = BatchLayout::new();
    /// let images = layout.push(DType::F32, &[2, 3, 4])?;
    /// let mut batch = layout.allocate()?;
    /// for (i, mut row) in batch.view_mut(images).rows_mut().enumerate() {
    ///     let mut a = row.as_array_mut::<f32>()?;
    ///     a.fill(0.0);
    ///     a.slice_mut(s![1, ..]).assign(&Array2::from_elem((1, 4), i as f32).row(0));
    /// }
    /// let t = batch.finish().remove(0);
    /// assert!(t.is_pinned());
    /// assert_eq!(t.as_array::<f32>()?[[1, 1, 2]], 1.0);
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn as_array_mut<T: Element>(&mut self) -> Result<ArrayViewMutD<'_, T>> {
        let shape = self.shape().to_vec();
        let slice = self.as_mut_slice::<T>()?;
        ArrayViewMutD::from_shape(IxDyn(&shape), slice)
            .map_err(|e| Error::Shape(format!("cannot view {shape:?} as an array: {e}")))
    }
}
