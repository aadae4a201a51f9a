//! Host access: reading and writing a tensor's elements, contiguous copies, and tensors over
//! host bytes owned elsewhere.

use std::sync::Arc;

use super::{
    Data, External, HostBuf, HostBytes, HostSrc, Placement, Storage, Tensor, contiguous_strides,
};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};

impl Tensor {
    /// A contiguous tensor of `dtype` and `shape` viewing `owner`'s bytes from `byte_offset`,
    /// without a copy (a memory-mapped array, another library's buffer). The tensor keeps
    /// `owner` alive and only reads it: the bytes `owner` answers with now, which it keeps
    /// reading whatever `owner` answers later (see [`HostBytes`]).
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] if the bytes are too few for the shape, `byte_offset` is not a whole
    /// number of elements, the first element is not aligned for `dtype`, or a `bool` byte is
    /// not 0 or 1.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use pinnable::{DType, Tensor};
    ///
    /// let bytes: Vec<u8> = (0..16).collect();
    /// let t = Tensor::from_host_bytes(Arc::new(bytes), DType::U8, &[2, 4], 8)?;
    /// assert_eq!(t.to_vec::<u8>()?, (8..16).collect::<Vec<u8>>());
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn from_host_bytes(
        owner: Arc<dyn HostBytes>,
        dtype: DType,
        shape: &[usize],
        byte_offset: usize,
    ) -> Result<Tensor> {
        let (strides, _) = contiguous_strides(shape)?;
        Tensor::over_host_bytes(External::new(owner), dtype, shape, &strides, byte_offset)
            .map_err(Error::Shape)
    }

    /// A tensor viewing `bytes` (the owner's one answer) from `byte_offset` with `shape` and
    /// `strides` (in elements): checked so that every element it reaches lies within those
    /// bytes, aligned for `dtype` and, for `bool`, 0 or 1. The one place tensors over borrowed
    /// host bytes are made; the error says what is wrong.
    pub(crate) fn over_host_bytes(
        bytes: External,
        dtype: DType,
        shape: &[usize],
        strides: &[usize],
        byte_offset: usize,
    ) -> std::result::Result<Tensor, String> {
        let elem = dtype.size();
        let have = bytes.bytes();
        if !byte_offset.is_multiple_of(elem) {
            return Err(format!(
                "{dtype} elements start at a multiple of {elem} bytes from the start of the \
                 bytes; byte {byte_offset} is not one"
            ));
        }
        let numel = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        let last = shape.iter().zip(strides).try_fold(0usize, |at, (&d, &s)| {
            d.checked_sub(1).map_or(Some(at), |d| {
                d.checked_mul(s).and_then(|x| x.checked_add(at))
            })
        });
        // The end of the last element reached, in bytes from the start of `have`.
        let end = match (numel, last) {
            (Some(0), _) => Some(byte_offset),
            (Some(_), Some(last)) => last
                .checked_add(1)
                .and_then(|n| n.checked_mul(elem))
                .and_then(|n| n.checked_add(byte_offset)),
            _ => None,
        };
        if end.is_none_or(|end| end > have.len()) {
            return Err(format!(
                "{shape:?} {dtype} elements (strides {strides:?}) from byte {byte_offset} do not \
                 fit in {} bytes",
                have.len()
            ));
        }
        let addr = have.as_ptr() as usize + byte_offset;
        if numel != Some(0) && !addr.is_multiple_of(elem) {
            return Err(format!(
                "{dtype} elements must be aligned to {elem} bytes, and byte {byte_offset} of \
                 these bytes is not (the bytes start at address {:#x})",
                have.as_ptr() as usize
            ));
        }
        if dtype == DType::Bool && !bools_valid(&have[byte_offset..], shape, strides) {
            return Err("bool elements must be 0 or 1".into());
        }
        let storage = Arc::new(Storage::new(Data::External(bytes)));
        Ok(Tensor::from_parts(
            storage,
            dtype,
            shape,
            strides,
            byte_offset / elem,
        ))
    }

    /// A contiguous copy in pageable host memory (or `self` if already contiguous on the host).
    ///
    /// # Errors
    ///
    /// [`Error::WrongPlacement`] for a device tensor.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() && self.placement().is_host() {
            return Ok(self.clone());
        }
        self.contiguous_copy()
    }

    /// Where the host bytes are, for copies; waits for a pending copy into them first.
    pub(crate) fn host_src(&self, op: &'static str) -> Result<HostSrc> {
        let Some(base) = self.storage.host_ptr() else {
            return Err(Error::WrongPlacement {
                op,
                needs: "a host tensor (move it with `to_cpu` first)",
                placement: self.placement().to_string(),
            });
        };
        self.storage.wait_ready()?;
        let elem = self.dtype.size();
        // SAFETY: the offset lies within the storage (views are checked when made).
        let src = unsafe { base.add(self.byte_offset()) };
        Ok(HostSrc::new(src, elem, &self.shape, &self.strides))
    }

    pub(crate) fn check_dtype<T: Element>(&self) -> Result<()> {
        if T::DTYPE != self.dtype {
            return Err(Error::DTypeMismatch {
                actual: self.dtype,
                requested: T::DTYPE,
            });
        }
        Ok(())
    }

    /// The elements in row-major order. Waits for a pending copy into the tensor first.
    ///
    /// # Errors
    ///
    /// [`Error::DTypeMismatch`] if `T` is not the dtype; [`Error::WrongPlacement`] for a device
    /// tensor (move it with [`to_cpu`](crate::ToDevice::to_cpu) first).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.check_dtype::<T>()?;
        let src = self.host_src("to_vec")?;
        let n = self.numel();
        let mut out: Vec<T> = Vec::with_capacity(n);
        // SAFETY: `out` has room for `n` elements = `nbytes` bytes; `gather` writes all of them
        // with values of dtype `T` (checked above), after which the length is set.
        unsafe {
            src.gather(out.as_mut_ptr().cast());
            out.set_len(n);
        }
        Ok(out)
    }

    /// The elements as a slice, for a contiguous host tensor. Waits for a pending copy first.
    ///
    /// # Errors
    ///
    /// As [`to_vec`](Self::to_vec), and [`Error::Shape`] for a non-contiguous view.
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        self.check_dtype::<T>()?;
        let src = self.host_src("as_slice")?;
        if !self.is_contiguous() {
            return Err(Error::Shape(
                "as_slice needs a contiguous tensor; use to_vec or contiguous() for a view".into(),
            ));
        }
        // SAFETY: the storage holds `numel` elements of `T` from `src.ptr`, aligned (storage is
        // aligned for its dtype and the offset is a whole number of elements); no one writes
        // them while `&self` lives, since writes need `&mut Tensor` and a unique part.
        Ok(unsafe { std::slice::from_raw_parts(src.ptr.cast(), self.numel()) })
    }

    /// The elements as a mutable slice.
    ///
    /// If a clone or view shares this tensor's storage, or the tensor is a non-contiguous view,
    /// the tensor first gets its own contiguous copy (in the same kind of memory), so other
    /// tensors never see the write. Otherwise it writes in place, also inside a block shared
    /// with other tensors of its batch (each owns its own bytes there); if copies to a device
    /// are still reading that block, this first waits for them, so they move the old values,
    /// never a mix.
    ///
    /// # Errors
    ///
    /// As [`as_slice`](Self::as_slice), plus allocation errors when a private copy is made.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        self.check_dtype::<T>()?;
        let first = self.writable("as_mut_slice", false)?;
        // SAFETY: `writable` made this tensor the only one referring to its storage and
        // contiguous, whose part of the buffer no other storage covers (parts of a shared block
        // never overlap), so `&mut self` is exclusive over these `numel` aligned elements of
        // `T`; no copy still reads them.
        Ok(unsafe { std::slice::from_raw_parts_mut(first.cast(), self.numel()) })
    }

    /// Makes the tensor writable in place and returns the address of its first element: if a
    /// clone or view shares the storage, the bytes are owned elsewhere, or (unless
    /// `keep_strides`) the view is not contiguous, the tensor first gets its own contiguous copy
    /// in the same kind of memory. Then waits for the copy that fills the tensor and for copies
    /// still reading its block. Afterwards this tensor alone refers to its storage, so the
    /// elements its view reaches (and the gaps between them, inside its own part) are
    /// exclusively `&mut self`'s.
    pub(crate) fn writable(&mut self, op: &'static str, keep_strides: bool) -> Result<*mut u8> {
        let placement = self.placement();
        if !placement.is_host() {
            return Err(Error::WrongPlacement {
                op,
                needs: "a host tensor (move it with `to_cpu` first)",
                placement: placement.to_string(),
            });
        }
        let external = matches!(self.storage.data, Data::External(_));
        let strided_ok = if keep_strides {
            super::layout::non_overlapping(&self.shape, &self.strides)
        } else {
            self.is_contiguous()
        };
        if external || !strided_ok || Arc::get_mut(&mut self.storage).is_none() {
            *self = match placement {
                Placement::Pinned => self.to_own_block()?,
                _ => self.contiguous_copy()?,
            };
        }
        self.storage.wait_ready()?;
        let offset = self.byte_offset();
        let storage = Arc::get_mut(&mut self.storage).expect("made unique above");
        let base = match &mut storage.data {
            Data::Host(h) => h.as_ptr(),
            Data::Pinned(b) => {
                b.wait_uses();
                b.as_ptr()
            }
            Data::Device(_) | Data::External(_) => unreachable!("made private above"),
        };
        // SAFETY: the offset lies within the storage (views are checked when made).
        Ok(unsafe { base.add(offset) })
    }

    pub(crate) fn contiguous_copy(&self) -> Result<Tensor> {
        let src = self.host_src("contiguous")?;
        let buf = HostBuf::zeroed(self.nbytes());
        // SAFETY: `buf` has `nbytes` writable bytes; the source is live (held by `self`).
        unsafe { src.gather(buf.as_ptr()) };
        Tensor::at(Storage::host(buf), self.dtype, &self.shape, 0)
    }
}

/// Whether every element that `shape` and `strides` reach in `bytes` (one byte each, the first
/// at `bytes[0]`) is 0 or 1; the caller checked that they lie within `bytes`.
fn bools_valid(bytes: &[u8], shape: &[usize], strides: &[usize]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let mut idx = vec![0usize; shape.len()];
    let mut at = 0usize;
    loop {
        if bytes.get(at).is_none_or(|&b| b > 1) {
            return false;
        }
        let mut d = shape.len();
        loop {
            if d == 0 {
                return true;
            }
            d -= 1;
            idx[d] += 1;
            at += strides[d];
            if idx[d] < shape[d] {
                break;
            }
            at -= shape[d] * strides[d];
            idx[d] = 0;
        }
    }
}
