mod host;
mod layout;
mod moving;
mod storage;
#[cfg(test)]
mod tests;
mod view;

use std::fmt;
use std::sync::Arc;

use crate::alloc::PinnedBlock;
use crate::cuda::{Device, Event};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};

use layout::Dims;
pub(crate) use layout::{HostSrc, contiguous_strides};
pub(crate) use moving::{Arena, Memory, Source};
use storage::Data;
pub use storage::HostBytes;
pub(crate) use storage::{AlignedCopy, DeviceBuffer, External, HostBuf, Ready, Storage};
pub use view::{DeviceView, DeviceViewMut};

/// Where a tensor's elements live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Placement {
    /// Ordinary (pageable) host memory: the copy engine cannot read it directly, so a move
    /// stages it through pinned memory. Both this and [`Pinned`](Self::Pinned) are host
    /// memory ([`is_host`](Self::is_host)), which is what [`Device::cpu()`](crate::Device::cpu)
    /// stands for.
    Pageable,
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
            Placement::Pageable => f.write_str("cpu"),
            Placement::Pinned => f.write_str("pinned cpu"),
            Placement::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// A dense n-dimensional array of one [`DType`], on the host or on a CUDA device.
///
/// Storage is shared: cloning a tensor or taking a view ([`transpose`](Self::transpose),
/// [`narrow`](Self::narrow)) copies no elements. Views may be non-contiguous; pinning or moving
/// one produces a contiguous copy. See [below](#storage-and-sharing) for how tensors share blocks.
///
/// # Storage and sharing
///
/// The dense, strided, dtype-tagged tensor that batches are made of.
///
/// A tensor is a view (shape, strides, offset) over storage. Pageable storage belongs
/// to one tensor and its views. Pinned and device storage is a *part* of a shared buffer: every
/// tensor of a pinned batch is a part of one pinned block, every tensor of a moved batch a part
/// of one device allocation, so a batch moves with one copy.
///
/// **Sharing rules.** A tensor carved from a shared block keeps the whole block alive, however
/// small the tensor; [`Tensor::to_own_block`] copies one out into a block of its own. Clones and
/// views ([`transpose`](Tensor::transpose), [`narrow`](Tensor::narrow)) share the part they came
/// from. A write through [`as_mut_slice`](Tensor::as_mut_slice) never changes another tensor: it
/// writes in place when no clone or view shares the part, and into a private copy otherwise; in
/// place, it first waits for the copies still reading the block.
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
    shape: Dims,
    /// In elements.
    strides: Dims,
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
        Tensor::at(Storage::host(HostBuf::from_vec(data)), T::DTYPE, shape, 0)
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

    /// A contiguous tensor of `shape` starting `byte_offset` bytes into `storage`'s buffer.
    pub(crate) fn at(
        storage: Arc<Storage>,
        dtype: DType,
        shape: &[usize],
        byte_offset: usize,
    ) -> Result<Tensor> {
        // Elements are counted from the buffer's start: an offset between two of them would be
        // rounded down and read other bytes, misaligned.
        if !byte_offset.is_multiple_of(dtype.size()) {
            return Err(Error::Shape(format!(
                "{dtype} elements start at a multiple of {} bytes; byte {byte_offset} is not one",
                dtype.size()
            )));
        }
        let (strides, _) = contiguous_strides(shape)?;
        Ok(Tensor {
            storage,
            dtype,
            shape: Dims::from(shape),
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

    /// A tensor over `storage` with an explicit layout, in elements.
    pub(crate) fn from_parts(
        storage: Arc<Storage>,
        dtype: DType,
        shape: &[usize],
        strides: &[usize],
        offset: usize,
    ) -> Tensor {
        debug_assert_eq!(shape.len(), strides.len());
        Tensor {
            storage,
            dtype,
            shape: Dims::from(shape),
            strides: Dims::from(strides),
            offset,
        }
    }

    /// Gives away the device allocation of a tensor that alone owns it and starts at its first
    /// byte, contiguous: its address and the tensor's bytes (the allocation may be larger).
    /// `consumer`, the stream of whoever takes it over (and frees it), first waits for the copy
    /// that fills it, if already issued, and for every reader recorded on it. Any other tensor
    /// comes back unchanged.
    ///
    /// # Errors
    ///
    /// A driver error enqueuing a wait; the tensor is lost with it.
    #[cfg(feature = "candle-cuda")]
    pub(crate) fn release_device_allocation(
        self,
        consumer: &cudarc::driver::CudaStream,
    ) -> Result<std::result::Result<(cudarc::driver::sys::CUdeviceptr, usize), Tensor>> {
        let whole = self.byte_offset() == 0
            && self.is_contiguous()
            && Arc::strong_count(&self.storage) == 1
            && matches!(&self.storage.data,
                Data::Device(b) if Arc::strong_count(b) == 1 && !b.is_foreign());
        if !whole {
            return Ok(Err(self));
        }
        let nbytes = self.nbytes();
        if let Some(e) = self.ready_event() {
            e.wait_on(consumer)?;
        }
        let storage = Arc::into_inner(self.storage).expect("checked: the only handle");
        let Data::Device(buf) = storage.data else {
            unreachable!("checked: device memory")
        };
        buf.wait_readers_on(consumer)?;
        let (ptr, _) = Arc::into_inner(buf)
            .expect("checked: the only handle")
            .release();
        Ok(Ok((ptr, nbytes)))
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

    /// The address of the first element: a host address, or a device address for a tensor on
    /// a CUDA device, as `torch.Tensor.data_ptr()` gives it for the same memory (what a
    /// zero-copy hand-over is checked with). Reading or writing through it is the caller's
    /// business: it carries none of the ordering the tensor's own methods keep.
    pub fn data_ptr(&self) -> usize {
        let base = match self.storage.host_ptr() {
            Some(p) => p as usize,
            None => match self.source().memory {
                Memory::Device(buf) => buf.device_ptr() as usize,
                _ => 0,
            },
        };
        base + self.byte_offset()
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

    /// The elements at `index` along `dim`, without that dimension (a view; no copy), like
    /// `torch.select`: row `i` of a dataset held in one array is `array.select(0, i)`.
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] if `dim` or `index` is out of bounds.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::Tensor;
    ///
    /// let t = Tensor::from_vec((0..6).collect::<Vec<i32>>(), &[3, 2])?;
    /// let row = t.select(0, 1)?;
    /// assert_eq!(row.shape(), &[2]);
    /// assert!(row.shares_storage_with(&t));
    /// assert_eq!(row.to_vec::<i32>()?, vec![2, 3]);
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn select(&self, dim: usize, index: usize) -> Result<Tensor> {
        if self.shape.get(dim).is_some_and(|&size| index >= size) {
            return Err(Error::Shape(format!(
                "index {index} is out of bounds for dimension {dim} of size {}",
                self.shape[dim]
            )));
        }
        let mut t = self.narrow(dim, index, 1)?;
        t.shape.remove(dim);
        t.strides.remove(dim);
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
        t.shape = Dims::from(shape);
        t.strides = strides;
        Ok(t)
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
