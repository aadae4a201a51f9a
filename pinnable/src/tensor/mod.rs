//! The dense, strided, dtype-tagged tensor that batches are made of.
//!
//! A tensor is a view (shape, strides, offset) over storage. Pageable storage belongs
//! to one tensor and its views. Pinned and device storage is a *part* of a shared buffer: every
//! tensor of a pinned batch is a part of one pinned block, every tensor of a moved batch a part
//! of one device allocation, so a batch moves with one copy.
//!
//! **Sharing rules.** A tensor carved from a shared block keeps the whole block alive, however
//! small the tensor; [`Tensor::to_own_block`] copies one out into a block of its own. Clones and
//! views ([`transpose`](Tensor::transpose), [`narrow`](Tensor::narrow)) share the part they came
//! from. A write through [`as_mut_slice`](Tensor::as_mut_slice) never changes another tensor: it
//! writes in place when no clone or view shares the part, and into a private copy otherwise; in
//! place, it first waits for the copies still reading the block.

mod layout;
mod pinned;
mod storage;
mod view;

use std::fmt;
use std::sync::Arc;

use crate::alloc::PinnedBlock;
use crate::cuda::{Device, Event};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};

pub(crate) use layout::{HostSrc, contiguous_strides};
pub use storage::HostBytes;
pub(crate) use storage::{Data, DeviceBuffer, HostBuf, Ready, Storage};
pub use view::{DeviceView, DeviceViewMut};

/// Where a tensor's elements live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Ordinary (pageable) host memory.
    Cpu,
    /// Page-locked host memory from a [`PinnedPool`](crate::PinnedPool).
    Pinned,
    /// Memory of CUDA device `n`.
    Cuda(usize),
}

impl Placement {
    /// Whether the elements are in host memory (pageable or pinned).
    pub fn is_host(self) -> bool {
        !matches!(self, Placement::Cuda(_))
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Cpu => f.write_str("cpu"),
            Placement::Pinned => f.write_str("pinned cpu"),
            Placement::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// A dense n-dimensional array of one [`DType`], on the host or on a CUDA device.
///
/// Storage is shared: cloning a tensor or taking a view ([`transpose`](Self::transpose),
/// [`narrow`](Self::narrow)) copies no elements. Views may be non-contiguous; pinning or moving
/// one produces a contiguous copy. See the [module docs](self) for how tensors share blocks.
///
/// # Examples
///
/// ```
/// use pinnable::Tensor;
///
/// let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
/// let tt = t.transpose(0, 1)?;
/// assert_eq!(tt.shape(), &[3, 2]);
/// assert!(!tt.is_contiguous());
/// assert_eq!(tt.to_vec::<f32>()?, vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
/// # Ok::<(), pinnable::Error>(())
/// ```
#[derive(Clone)]
pub struct Tensor {
    storage: Arc<Storage>,
    dtype: DType,
    shape: Vec<usize>,
    /// In elements.
    strides: Vec<usize>,
    /// In elements, from the start of the storage's buffer.
    offset: usize,
}

impl Tensor {
    /// A tensor that takes over `data` (no copy) with the given shape.
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] if `data.len()` is not the product of `shape`, or the product overflows.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        let (_, n) = contiguous_strides(shape)?;
        if n != data.len() {
            return Err(Error::Shape(format!(
                "shape {shape:?} holds {n} elements but {} were given",
                data.len()
            )));
        }
        let storage = Storage::new(Data::Host(HostBuf::from_vec(data)));
        Tensor::from_storage(storage, T::DTYPE, shape)
    }

    /// A tensor holding a copy of `data`.
    ///
    /// # Errors
    ///
    /// As [`from_vec`](Self::from_vec).
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize]) -> Result<Tensor> {
        Tensor::from_vec(data.to_vec(), shape)
    }

    /// A one-dimensional tensor holding `data`.
    pub fn from_vec1<T: Element>(data: Vec<T>) -> Tensor {
        let n = data.len();
        Tensor::from_vec(data, &[n]).expect("a vector's length is its own shape")
    }

    /// A contiguous tensor of `dtype` and `shape` viewing `owner`'s bytes from `byte_offset`,
    /// without a copy (a memory-mapped array, another library's buffer). The tensor keeps
    /// `owner` alive and only reads it.
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] if the bytes are too few for the shape, or the first element is not
    /// aligned for `dtype`.
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
        let (_, n) = contiguous_strides(shape)?;
        let have = owner.host_bytes();
        let need = n
            .checked_mul(dtype.size())
            .and_then(|b| b.checked_add(byte_offset));
        if need.is_none_or(|need| need > have.len()) {
            return Err(Error::Shape(format!(
                "{shape:?} {dtype} elements from byte {byte_offset} do not fit in {} bytes",
                have.len()
            )));
        }
        let addr = have.as_ptr() as usize + byte_offset;
        if !addr.is_multiple_of(dtype.size()) {
            return Err(Error::Shape(format!(
                "{dtype} elements must start at a multiple of {} bytes; byte {byte_offset} of \
                 this buffer does not",
                dtype.size()
            )));
        }
        if dtype == DType::Bool && have[byte_offset..byte_offset + n].iter().any(|&b| b > 1) {
            return Err(Error::Shape("bool elements must be 0 or 1".into()));
        }
        Tensor::at(
            Arc::new(Storage::new(Data::External(owner))),
            dtype,
            shape,
            byte_offset,
        )
    }

    /// A contiguous tensor of `shape` at the start of `storage`.
    pub(crate) fn from_storage(storage: Storage, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        Tensor::at(Arc::new(storage), dtype, shape, 0)
    }

    /// A contiguous tensor of `shape` starting `byte_offset` bytes into `storage`'s buffer.
    pub(crate) fn at(
        storage: Arc<Storage>,
        dtype: DType,
        shape: &[usize],
        byte_offset: usize,
    ) -> Result<Tensor> {
        debug_assert_eq!(byte_offset % dtype.size(), 0);
        let (strides, _) = contiguous_strides(shape)?;
        Ok(Tensor {
            storage,
            dtype,
            shape: shape.to_vec(),
            strides,
            offset: byte_offset / dtype.size(),
        })
    }

    /// `self`'s elements as a part of another buffer (`storage`), whose copy of them starts at
    /// `byte_offset`: contiguous there, or with `self`'s strides when `self`'s whole span was
    /// copied (then `byte_offset` is where the span starts).
    pub(crate) fn placed_in(
        &self,
        storage: Arc<Storage>,
        byte_offset: usize,
        contiguous: bool,
    ) -> Tensor {
        let elem = self.dtype.size();
        debug_assert_eq!(byte_offset % elem, 0);
        let base = byte_offset / elem;
        let (strides, offset) = if contiguous {
            let (strides, _) = contiguous_strides(&self.shape)
                .expect("an existing tensor's shape does not overflow");
            (strides, base)
        } else {
            (self.strides.clone(), base + self.offset - self.span().0)
        };
        Tensor {
            storage,
            dtype: self.dtype,
            shape: self.shape.clone(),
            strides,
            offset,
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The size of each dimension.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The step between neighbours along each dimension, in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The bytes the elements take when contiguous.
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }

    /// Where the elements live.
    pub fn placement(&self) -> Placement {
        self.storage.placement()
    }

    /// Whether the elements are in page-locked host memory.
    pub fn is_pinned(&self) -> bool {
        self.placement() == Placement::Pinned
    }

    /// The pinned block behind this tensor, if it is pinned. Every tensor of a pinned batch
    /// returns the same block.
    pub fn pinned_block(&self) -> Option<&PinnedBlock> {
        match &self.storage.data {
            Data::Pinned(b) => Some(b),
            _ => None,
        }
    }

    /// Whether `self` and `other` share storage (one is a clone or a view of the other).
    pub fn shares_storage_with(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// Whether `self` and `other` live in one buffer: the same pinned block (two tensors of one
    /// pinned batch) or the same device allocation (two tensors of one moved batch). Such
    /// tensors keep the whole buffer alive between them.
    pub fn shares_block_with(&self, other: &Tensor) -> bool {
        self.storage.buffer_id() == other.storage.buffer_id()
    }

    /// Whether the elements are laid out row-major with no gaps.
    pub fn is_contiguous(&self) -> bool {
        layout::is_contiguous(&self.shape, &self.strides)
    }

    /// The element range `[first, last + 1)` the view touches, in elements from the buffer start.
    pub(crate) fn span(&self) -> (usize, usize) {
        layout::span(&self.shape, &self.strides, self.offset)
    }

    /// The byte range the view touches, from the buffer start.
    pub(crate) fn byte_span(&self) -> std::ops::Range<usize> {
        let (first, end) = self.span();
        first * self.dtype.size()..end * self.dtype.size()
    }

    pub(crate) fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }

    /// The offset of the first element, in bytes.
    pub(crate) fn byte_offset(&self) -> usize {
        self.offset * self.dtype.size()
    }

    /// Swaps two dimensions (a view; no copy).
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] if a dimension is out of range.
    pub fn transpose(&self, d0: usize, d1: usize) -> Result<Tensor> {
        let rank = self.rank();
        if d0 >= rank || d1 >= rank {
            return Err(Error::Shape(format!(
                "cannot transpose dimensions {d0} and {d1} of a rank-{rank} tensor"
            )));
        }
        let mut t = self.clone();
        t.shape.swap(d0, d1);
        t.strides.swap(d0, d1);
        Ok(t)
    }

    /// The elements `start..start + len` along `dim` (a view; no copy).
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] if `dim` or the range is out of bounds.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        let size = *self.shape.get(dim).ok_or_else(|| {
            Error::Shape(format!(
                "dimension {dim} out of range for shape {:?}",
                self.shape
            ))
        })?;
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::Shape(format!(
                "range {start}..{} is out of bounds for dimension {dim} of size {size}",
                start.saturating_add(len)
            )));
        }
        let mut t = self.clone();
        t.shape[dim] = len;
        if len > 0 {
            t.offset += start * self.strides[dim];
        }
        Ok(t)
    }

    /// The same elements with a new shape; the tensor must be contiguous.
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] if the element counts differ or the tensor is not contiguous.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        let (strides, n) = contiguous_strides(shape)?;
        if n != self.numel() {
            return Err(Error::Shape(format!(
                "cannot reshape {:?} ({} elements) to {shape:?} ({n} elements)",
                self.shape,
                self.numel()
            )));
        }
        if !self.is_contiguous() {
            return Err(Error::Shape(
                "cannot reshape a non-contiguous view; copy it with `contiguous()` first".into(),
            ));
        }
        let mut t = self.clone();
        t.shape = shape.to_vec();
        t.strides = strides;
        Ok(t)
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
            layout::non_overlapping(&self.shape, &self.strides)
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

    /// A tensor over `storage` with an explicit layout, in elements.
    #[cfg_attr(not(any(feature = "ndarray", feature = "dlpack")), allow(dead_code))]
    pub(crate) fn from_parts(
        storage: Arc<Storage>,
        dtype: DType,
        shape: Vec<usize>,
        strides: Vec<usize>,
        offset: usize,
    ) -> Tensor {
        debug_assert_eq!(shape.len(), strides.len());
        Tensor {
            storage,
            dtype,
            shape,
            strides,
            offset,
        }
    }

    fn contiguous_copy(&self) -> Result<Tensor> {
        let src = self.host_src("contiguous")?;
        let buf = HostBuf::zeroed(self.nbytes());
        // SAFETY: `buf` has `nbytes` writable bytes; the source is live (held by `self`).
        unsafe { src.gather(buf.as_ptr()) };
        Tensor::from_storage(Storage::new(Data::Host(buf)), self.dtype, &self.shape)
    }

    /// The event that completes when the asynchronous copy that produced this tensor is done;
    /// `None` if the tensor was not produced by an asynchronous copy.
    pub fn ready_event(&self) -> Option<&Event> {
        self.storage.ready_event().map(|e| &**e)
    }

    /// Whether the data is all there: no asynchronous copy into it is still running.
    pub fn is_ready(&self) -> bool {
        self.ready_event().is_none_or(|e| e.is_complete())
    }

    /// The device this tensor is on, or [`Device::cpu`].
    pub fn device(&self) -> Device {
        match &self.storage.data {
            Data::Device(d) => Device::from_cuda(d.device.clone()),
            _ => Device::cpu(),
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({} {:?} on {}{})",
            self.dtype,
            self.shape,
            self.placement(),
            if self.is_contiguous() {
                ""
            } else {
                ", strided"
            }
        )
    }
}
