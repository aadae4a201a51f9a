//! The dense, strided, dtype-tagged tensor that batches are made of.

use std::fmt;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, CudaView, DeviceRepr};

use crate::alloc::PinnedBlock;
use crate::cuda::{CudaDevice, Device, Event};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};

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
/// one produces a contiguous copy.
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
    /// In elements, from the start of the storage.
    offset: usize,
}

/// The memory behind one or more tensors.
pub(crate) struct Storage {
    pub(crate) data: Data,
    /// Set when the bytes arrive by an asynchronous copy: readers wait on it first.
    pub(crate) ready: Option<Ready>,
}

/// The event that marks an asynchronous copy's completion, filled in once the copy is enqueued.
pub(crate) type Ready = Arc<OnceLock<Arc<Event>>>;

pub(crate) enum Data {
    Host(HostBuf),
    Pinned(PinnedBlock),
    Device(DeviceBuffer),
}

/// A `Vec<T>`'s allocation, type-erased: tensors built from vectors take them over without a copy.
pub(crate) struct HostBuf {
    ptr: NonNull<u8>,
    bytes: usize,
    len: usize,
    cap: usize,
    free: unsafe fn(NonNull<u8>, usize, usize),
}

/// # Safety
///
/// 1. `ptr`, `len`, `cap` are the parts of a `Vec<T>` that was leaked and is rebuilt once.
unsafe fn free_vec<T>(ptr: NonNull<u8>, len: usize, cap: usize) {
    // SAFETY: forwarded from the caller.
    drop(unsafe { Vec::from_raw_parts(ptr.as_ptr().cast::<T>(), len, cap) });
}

impl HostBuf {
    fn from_vec<T: Element>(v: Vec<T>) -> HostBuf {
        let mut v = ManuallyDrop::new(v);
        let bytes = v.len() * size_of::<T>();
        HostBuf {
            // SAFETY: a Vec's pointer is never null (dangling but aligned when empty).
            ptr: unsafe { NonNull::new_unchecked(v.as_mut_ptr().cast()) },
            bytes,
            len: v.len(),
            cap: v.capacity(),
            free: free_vec::<T>,
        }
    }
}

impl HostBuf {
    /// `bytes` zeroed bytes, aligned for every dtype.
    fn zeroed(bytes: usize) -> HostBuf {
        let mut buf = HostBuf::from_vec(vec![0u64; bytes.div_ceil(8)]);
        buf.bytes = bytes;
        buf
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // SAFETY: built by `from_vec`, dropped once.
        unsafe { (self.free)(self.ptr, self.len, self.cap) }
    }
}

// SAFETY: HostBuf owns its Vec's allocation exclusively and the element types are Send + Sync.
unsafe impl Send for HostBuf {}
// SAFETY: as for Send; shared access only reads (writes need `&mut Tensor` and a unique Arc).
unsafe impl Sync for HostBuf {}

/// Device memory owned by a tensor, with the events of consumers that still read it.
pub(crate) struct DeviceBuffer {
    slice: ManuallyDrop<CudaSlice<u8>>,
    pub(crate) device: Arc<CudaDevice>,
    readers: Mutex<Vec<CudaEvent>>,
}

impl DeviceBuffer {
    pub(crate) fn new(slice: CudaSlice<u8>, device: Arc<CudaDevice>) -> DeviceBuffer {
        DeviceBuffer {
            slice: ManuallyDrop::new(slice),
            device,
            readers: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn slice(&self) -> &CudaSlice<u8> {
        &self.slice
    }

    /// Records work on another stream that reads this buffer; the buffer is freed only after it.
    pub(crate) fn add_reader(&self, event: CudaEvent) {
        let mut readers = self.readers.lock().unwrap_or_else(|e| e.into_inner());
        readers.retain(|r| !r.is_complete());
        readers.push(event);
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // The buffer is freed on the copy stream (stream-ordered); make that stream wait for
        // every consumer that read it on another stream first.
        let readers = std::mem::take(&mut *self.readers.lock().unwrap_or_else(|e| e.into_inner()));
        for r in &readers {
            let _ = self.device.copy_stream.wait(r);
        }
        // SAFETY: dropped exactly once, here.
        unsafe { ManuallyDrop::drop(&mut self.slice) };
    }
}

impl Storage {
    fn placement(&self) -> Placement {
        match &self.data {
            Data::Host(_) => Placement::Cpu,
            Data::Pinned(_) => Placement::Pinned,
            Data::Device(d) => Placement::Cuda(d.device.ordinal),
        }
    }

    /// Waits for the asynchronous copy that fills this storage, if any.
    pub(crate) fn wait_ready(&self) -> Result<()> {
        if let Some(event) = self.ready.as_ref().and_then(|r| r.get()) {
            event.synchronize()?;
        }
        Ok(())
    }

    /// The host address of the bytes (pageable or pinned); `None` on a device.
    pub(crate) fn host_ptr(&self) -> Option<*mut u8> {
        match &self.data {
            Data::Host(h) => Some(h.ptr.as_ptr()),
            Data::Pinned(b) => Some(b.as_ptr()),
            Data::Device(_) => None,
        }
    }

    fn bytes(&self) -> usize {
        match &self.data {
            Data::Host(h) => h.bytes,
            Data::Pinned(b) => b.len(),
            Data::Device(d) => d.slice.len(),
        }
    }
}

/// Row-major strides for `shape`, or an error if the element count overflows.
fn contiguous_strides(shape: &[usize]) -> Result<(Vec<usize>, usize)> {
    let mut strides = vec![0; shape.len()];
    let mut n: usize = 1;
    for (i, &d) in shape.iter().enumerate().rev() {
        strides[i] = n;
        n = n.checked_mul(d).ok_or_else(|| {
            Error::Shape(format!("the element count of shape {shape:?} overflows"))
        })?;
    }
    Ok((strides, n))
}

impl Tensor {
    /// A tensor that takes over `data` (no copy) with the given shape.
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] if `data.len()` is not the product of `shape`, or the product overflows.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        let (strides, n) = contiguous_strides(shape)?;
        if n != data.len() {
            return Err(Error::Shape(format!(
                "shape {shape:?} holds {n} elements but {} were given",
                data.len()
            )));
        }
        Ok(Tensor {
            storage: Arc::new(Storage {
                data: Data::Host(HostBuf::from_vec(data)),
                ready: None,
            }),
            dtype: T::DTYPE,
            shape: shape.to_vec(),
            strides,
            offset: 0,
        })
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

    pub(crate) fn from_storage(storage: Storage, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let (strides, _) = contiguous_strides(shape)?;
        Ok(Tensor {
            storage: Arc::new(storage),
            dtype,
            shape: shape.to_vec(),
            strides,
            offset: 0,
        })
    }

    /// `self`'s elements placed at `byte_offset` inside shared storage (a batch's device
    /// arena): contiguous, or with `self`'s strides when its whole span was copied there.
    pub(crate) fn placed_in(
        &self,
        storage: &Arc<Storage>,
        byte_offset: usize,
        contiguous: bool,
    ) -> Tensor {
        debug_assert_eq!(byte_offset % self.dtype.size(), 0);
        let base = byte_offset / self.dtype.size();
        let (strides, offset) = if contiguous {
            let (strides, _) = contiguous_strides(&self.shape)
                .expect("an existing tensor's shape does not overflow");
            (strides, base)
        } else {
            (self.strides.clone(), base + self.offset - self.span().0)
        };
        Tensor {
            storage: storage.clone(),
            dtype: self.dtype,
            shape: self.shape.clone(),
            strides,
            offset,
        }
    }

    /// Same shape and strides as `self`, over other storage.
    pub(crate) fn with_storage(&self, storage: Storage, contiguous: bool) -> Tensor {
        if contiguous {
            Tensor::from_storage(storage, self.dtype, &self.shape)
                .expect("an existing tensor's shape does not overflow")
        } else {
            Tensor {
                storage: Arc::new(storage),
                dtype: self.dtype,
                shape: self.shape.clone(),
                strides: self.strides.clone(),
                offset: self.offset - self.span().0,
            }
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

    /// The pinned block behind this tensor, if it is pinned.
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

    /// Whether the elements are laid out row-major with no gaps.
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d;
        }
        true
    }

    /// The element range `[first, last + 1)` the view touches, in elements from the storage start.
    pub(crate) fn span(&self) -> (usize, usize) {
        if self.numel() == 0 {
            return (self.offset, self.offset);
        }
        let last: usize = self
            .shape
            .iter()
            .zip(&self.strides)
            .map(|(&d, &s)| (d - 1) * s)
            .sum();
        (self.offset, self.offset + last + 1)
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
        Ok(HostSrc::new(
            src,
            elem,
            &self.shape,
            &self.strides.iter().map(|s| s * elem).collect::<Vec<_>>(),
        ))
    }

    fn check_dtype<T: Element>(&self) -> Result<()> {
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
        // them while `&self` lives, since writes need `&mut Tensor` and unique storage.
        Ok(unsafe { std::slice::from_raw_parts(src.ptr.cast(), self.numel()) })
    }

    /// The elements as a mutable slice.
    ///
    /// If the storage is shared with other tensors or the tensor is a non-contiguous view, the
    /// tensor first gets its own contiguous copy (in the same kind of memory), so other tensors
    /// never see the write. If copies to a device are still reading the pinned memory, this
    /// waits for them, so they move the old values, never a mix.
    ///
    /// # Errors
    ///
    /// As [`as_slice`](Self::as_slice), plus allocation errors when a private copy is made.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        self.check_dtype::<T>()?;
        let placement = self.placement();
        if !placement.is_host() {
            return Err(Error::WrongPlacement {
                op: "as_mut_slice",
                needs: "a host tensor (move it with `to_cpu` first)",
                placement: placement.to_string(),
            });
        }
        let unique_full = self.is_contiguous()
            && Arc::get_mut(&mut self.storage).is_some()
            && self.offset == 0
            && self.nbytes() == self.storage.bytes();
        if !unique_full {
            *self = match placement {
                Placement::Pinned => {
                    let pool = crate::PinnedPool::global();
                    crate::pin::pin_contiguous_now(self, pool)?
                }
                _ => self.contiguous_copy()?,
            };
        }
        self.storage.wait_ready()?;
        let n = self.numel();
        let storage = Arc::get_mut(&mut self.storage).expect("made unique above");
        let ptr = match &mut storage.data {
            Data::Host(h) => h.ptr.as_ptr(),
            Data::Pinned(b) => {
                b.wait_uses();
                b.as_ptr()
            }
            Data::Device(_) => unreachable!("checked to be on the host"),
        };
        // SAFETY: the storage is uniquely owned by this tensor (so `&mut self` is exclusive),
        // holds exactly `n` aligned elements of `T`, and no copy still reads it.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr.cast(), n) })
    }

    fn contiguous_copy(&self) -> Result<Tensor> {
        let src = self.host_src("contiguous")?;
        let buf = HostBuf::zeroed(self.nbytes());
        // SAFETY: `buf` has `nbytes` writable bytes; the source is live (held by `self`).
        unsafe { src.gather(buf.ptr.as_ptr()) };
        Tensor::from_storage(
            Storage {
                data: Data::Host(buf),
                ready: None,
            },
            self.dtype,
            &self.shape,
        )
    }

    /// A typed view of a contiguous device tensor for use on `stream` (cudarc kernels, cuBLAS,
    /// ...). `stream` is made to wait for the copy that fills the tensor, so kernels enqueued on
    /// it read complete data; when the view is dropped, an event is recorded on `stream` so the
    /// memory is not freed until those kernels are done.
    ///
    /// # Errors
    ///
    /// [`Error::DTypeMismatch`], [`Error::WrongPlacement`] for a host tensor, [`Error::Shape`]
    /// for a non-contiguous view, [`Error::Driver`] if the wait cannot be enqueued.
    pub fn cuda_view<'a, T: Element + DeviceRepr>(
        &'a self,
        stream: &'a CudaStream,
    ) -> Result<DeviceView<'a, T>> {
        self.check_dtype::<T>()?;
        let Data::Device(buf) = &self.storage.data else {
            return Err(Error::WrongPlacement {
                op: "cuda_view",
                needs: "a CUDA tensor (move it with `to_device` first)",
                placement: self.placement().to_string(),
            });
        };
        if !self.is_contiguous() {
            return Err(Error::Shape(
                "cuda_view needs a contiguous tensor; this view is strided".into(),
            ));
        }
        if let Some(event) = self.storage.ready.as_ref().and_then(|r| r.get()) {
            event.wait_on(stream)?;
        }
        let n = self.numel();
        let elem = self.dtype.size();
        let bytes = buf
            .slice()
            .slice(self.byte_offset()..self.byte_offset() + n * elem);
        // SAFETY: the byte range holds `n` elements of `T` (dtype checked) written by our copy,
        // and device allocations are aligned far beyond any element's alignment.
        let view = unsafe { bytes.transmute::<T>(n) }.expect("range sized for n elements");
        Ok(DeviceView {
            view,
            stream,
            buffer: buf,
        })
    }

    /// The event that completes when the asynchronous copy that produced this tensor is done;
    /// `None` if the tensor was not produced by an asynchronous copy.
    pub fn ready_event(&self) -> Option<&Event> {
        self.storage.ready.as_ref()?.get().map(|e| &**e)
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

/// A typed, read-only [`CudaView`] of a device tensor, ordered on one stream.
/// Derefs to the view; see [`Tensor::cuda_view`].
pub struct DeviceView<'a, T> {
    view: CudaView<'a, T>,
    stream: &'a CudaStream,
    buffer: &'a DeviceBuffer,
}

impl<'a, T> std::ops::Deref for DeviceView<'a, T> {
    type Target = CudaView<'a, T>;

    fn deref(&self) -> &CudaView<'a, T> {
        &self.view
    }
}

impl<T> Drop for DeviceView<'_, T> {
    fn drop(&mut self) {
        if let Ok(e) = self.stream.record_event(None) {
            self.buffer.add_reader(e);
        }
    }
}

/// A strided run of host bytes to gather into a contiguous destination, with dimensions
/// that are contiguous with their inner neighbour merged.
#[derive(Clone, Debug)]
pub(crate) struct HostSrc {
    pub(crate) ptr: *const u8,
    /// Bytes per innermost contiguous run.
    pub(crate) run: usize,
    /// Outer dimensions (sizes and byte strides) over the runs, outermost first.
    pub(crate) dims: Vec<(usize, usize)>,
}

// SAFETY: a HostSrc is a description of bytes that outlive the copy that uses it (the copy
// holds the source tensor); it is only read.
unsafe impl Send for HostSrc {}
// SAFETY: as for Send.
unsafe impl Sync for HostSrc {}

impl HostSrc {
    pub(crate) fn new(ptr: *const u8, elem: usize, shape: &[usize], strides: &[usize]) -> HostSrc {
        let mut run = elem;
        let mut dims: Vec<(usize, usize)> = Vec::new();
        let mut inner_contig = true;
        for (&d, &s) in shape.iter().zip(strides).rev() {
            if d == 1 {
                continue;
            }
            if inner_contig && s == run {
                run *= d;
            } else {
                inner_contig = false;
                dims.insert(0, (d, s));
            }
        }
        if shape.contains(&0) {
            run = 0;
            dims.clear();
        }
        HostSrc { ptr, run, dims }
    }

    /// Total bytes gathered.
    pub(crate) fn bytes(&self) -> usize {
        self.run * self.dims.iter().map(|d| d.0).product::<usize>()
    }

    /// The part of the gather whose outermost index lies in `range` (by runs when there is no
    /// outer dimension: then `range` is in bytes), and the byte offset it lands at.
    pub(crate) fn split(&self, range: std::ops::Range<usize>) -> (HostSrc, usize) {
        match self.dims.first() {
            None => (
                HostSrc {
                    // SAFETY: `range` lies within the run.
                    ptr: unsafe { self.ptr.add(range.start) },
                    run: range.len(),
                    dims: Vec::new(),
                },
                range.start,
            ),
            Some(&(_, stride)) => {
                let inner = self.bytes() / self.dims[0].0;
                let mut dims = self.dims.clone();
                dims[0].0 = range.len();
                (
                    HostSrc {
                        // SAFETY: `range` lies within the outer dimension.
                        ptr: unsafe { self.ptr.add(range.start * stride) },
                        run: self.run,
                        dims,
                    },
                    range.start * inner,
                )
            }
        }
    }

    /// How many pieces [`split`](Self::split) can cut along, and the bytes of one piece.
    pub(crate) fn split_unit(&self) -> (usize, usize) {
        match self.dims.first() {
            None => (self.run, 1),
            Some(&(d, _)) => (d, self.bytes() / d.max(1)),
        }
    }

    /// Copies the described bytes, contiguously, to `dst`.
    ///
    /// # Safety
    ///
    /// 1. The source bytes are live and not written during the call.
    /// 2. `dst` is valid for [`bytes`](Self::bytes) bytes of writes and does not overlap them.
    pub(crate) unsafe fn gather(&self, dst: *mut u8) {
        if self.run == 0 {
            return;
        }
        let mut idx = vec![0usize; self.dims.len()];
        let total = self.bytes() / self.run;
        let mut src = self.ptr;
        for k in 0..total {
            // SAFETY: each run lies within the source (caller) and `dst` has room (caller).
            unsafe { std::ptr::copy_nonoverlapping(src, dst.add(k * self.run), self.run) };
            // Advance the odometer over the outer dimensions.
            let mut d = self.dims.len();
            while d > 0 {
                d -= 1;
                idx[d] += 1;
                let (size, stride) = self.dims[d];
                if idx[d] < size {
                    // SAFETY: stays within the source's span.
                    src = unsafe { src.add(stride) };
                    break;
                }
                // SAFETY: rewinds to the start of this dimension, within the span.
                src = unsafe { src.sub((size - 1) * stride) };
                idx[d] = 0;
            }
        }
    }
}
