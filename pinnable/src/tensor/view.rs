//! Typed views of device tensors for work on one stream, ordered after the copy that fills
//! them: read-only ([`Tensor::cuda_view`]) and writable ([`Tensor::cuda_view_mut`]).
//!
//! A view is ordered on the stream it was made for, and only there: that stream waits for the
//! tensor's copy before the view's work, and the view's work is recorded on that stream when
//! the view is dropped, so frees and later writers wait for it. Its safe methods all work on
//! that stream. A cudarc [`CudaView`] of the memory, which cudarc lets any stream use, is
//! behind an `unsafe` accessor whose contract is to use it on that stream only.

use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, result, sys,
};

use super::Tensor;
use super::storage::{Data, DeviceBuffer};
use crate::cuda::Event;
use crate::dtype::Element;
use crate::error::{Error, Result};

/// Checks that `stream` belongs to the device that holds `buf`.
fn same_device(buf: &DeviceBuffer, stream: &CudaStream, op: &'static str) -> Result<()> {
    if stream.context().cu_ctx() == buf.device.ctx.cu_ctx() {
        return Ok(());
    }
    Err(Error::WrongPlacement {
        op,
        needs: "a stream of the tensor's own device (make one from its `Device::cuda_context`)",
        placement: format!("cuda:{}", buf.device.ordinal),
    })
}

impl Tensor {
    /// A typed, read-only view of a contiguous device tensor, for work on `stream`.
    ///
    /// `stream` is made to wait for the copy that fills the tensor, so work enqueued on it
    /// through the view reads complete data; when the view is dropped, an event is recorded on
    /// `stream`, so the memory is neither freed nor overwritten until that work is done. The
    /// view's methods ([`copy_to_host`](DeviceView::copy_to_host),
    /// [`copy_to`](DeviceView::copy_to), ...) all work on `stream`; kernels take
    /// [`device_ptr`](DeviceView::device_ptr) and are enqueued on `stream` too. A view that is
    /// never dropped (`mem::forget`) keeps the memory allocated for good, and whatever writes
    /// the tensor's buffer next first waits for every stream of `stream`'s context.
    ///
    /// # Errors
    ///
    /// [`Error::DTypeMismatch`], [`Error::WrongPlacement`] for a host tensor or a stream of
    /// another device, [`Error::Shape`] for a non-contiguous view, [`Error::Driver`] if the
    /// wait cannot be enqueued.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::{Device, Tensor, ToDevice};
    ///
    /// let Ok(device) = Device::cuda(0) else { return Ok(()) };
    /// let stream = device.cuda_context().unwrap().new_stream().unwrap();
    /// let t = Tensor::from_vec(vec![1.5f32, 2.5], &[2])?.to_device(&device, true)?;
    /// let view = t.cuda_view::<f32>(&stream)?; // `stream` waits for the copy
    /// assert_eq!(view.to_vec()?, vec![1.5, 2.5]);
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn cuda_view<'a, T: Element + DeviceRepr>(
        &'a self,
        stream: &'a Arc<CudaStream>,
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
        same_device(buf, stream, "cuda_view")?;
        if let Some(event) = self.storage.ready_event() {
            event.wait_on(stream)?;
        }
        let key = buf.open_reader(stream.context().clone());
        Ok(DeviceView {
            on: On {
                ptr: buf.device_ptr() + self.byte_offset() as u64,
                len: self.numel(),
                stream,
                _elem: PhantomData,
            },
            buffer: buf.clone(),
            key,
            cudarc: OnceLock::new(),
            _tensor: PhantomData,
        })
    }

    /// A typed, writable view of a contiguous device tensor for work on `stream` that writes
    /// it in place.
    ///
    /// Ordered like [`cuda_view`](Self::cuda_view), and more: `stream` first waits for the copy
    /// that fills the tensor and for every consumer recorded as reading its buffer (views on
    /// other streams, copies to other devices or to the host), so the view's work overwrites
    /// nothing still being read. When the view is dropped, an event is recorded on `stream`
    /// that becomes the tensor's ready event, so whatever reads the tensor next (a view on any
    /// stream, a copy to the host or another device, a host read after `to_cpu`) waits for the
    /// writes; the same event keeps the memory from being freed before they finish. A view
    /// that is never dropped (`mem::forget`) keeps the memory allocated for good, and whatever
    /// reads the tensor next first waits for every stream of `stream`'s context.
    ///
    /// A device tensor shared by a clone or a view cannot be written in place (the others would
    /// see the write), and this does not copy it on the device behind the caller's back: it
    /// returns an error instead. Drop the other handles first, or write into a tensor of its
    /// own.
    ///
    /// # Errors
    ///
    /// [`Error::DTypeMismatch`], [`Error::WrongPlacement`] for a host tensor or a stream of
    /// another device, [`Error::Shape`] for a non-contiguous view, [`Error::Shared`] when a
    /// clone or view shares the tensor, [`Error::Driver`] if a wait cannot be enqueued.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::{Device, Tensor, ToDevice};
    ///
    /// let Ok(device) = Device::cuda(0) else { return Ok(()) };
    /// let stream = device.cuda_context().unwrap().new_stream().unwrap();
    /// let mut t = Tensor::from_vec(vec![1.0f32; 4], &[4])?.to_device(&device, true)?;
    /// {
    ///     let mut view = t.cuda_view_mut::<f32>(&stream)?;
    ///     // A kernel on `stream` would take `view.device_ptr()`; a fill will do here.
    ///     view.fill_zeros()?;
    /// } // the write is now the tensor's ready event
    /// assert_eq!(t.to_cpu(false)?.to_vec::<f32>()?, vec![0.0; 4]);
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn cuda_view_mut<'a, T: Element + DeviceRepr>(
        &'a mut self,
        stream: &'a Arc<CudaStream>,
    ) -> Result<DeviceViewMut<'a, T>> {
        self.check_dtype::<T>()?;
        let placement = self.placement();
        let Data::Device(buf) = &self.storage.data else {
            return Err(Error::WrongPlacement {
                op: "cuda_view_mut",
                needs: "a CUDA tensor (move it with `to_device` first)",
                placement: placement.to_string(),
            });
        };
        if !self.is_contiguous() {
            return Err(Error::Shape(
                "cuda_view_mut needs a contiguous tensor; this view is strided".into(),
            ));
        }
        same_device(buf, stream, "cuda_view_mut")?;
        let sharers = Arc::strong_count(&self.storage);
        let (len, offset) = (self.numel(), self.byte_offset());
        let Some(storage) = Arc::get_mut(&mut self.storage) else {
            return Err(Error::Shared {
                op: "cuda_view_mut",
                tensors: sharers,
                placement: placement.to_string(),
            });
        };
        let Data::Device(buf) = &storage.data else {
            unreachable!("checked above")
        };
        if buf.is_foreign() {
            return Err(Error::Field {
                path: "cuda_view_mut".into(),
                message: "this tensor views device memory another library owns (a DLPack \
                          or candle import), which is read-only here; write into a copy of it \
                          instead"
                    .into(),
            });
        }
        if let Some(event) = storage.ready.as_ref().and_then(|r| r.get()) {
            event.wait_on(stream)?;
        }
        buf.wait_readers_on(stream)?;
        // From here on, readers of the tensor wait for the view's work: for its event once the
        // view is dropped, for the whole context before that (or if it never is).
        let written = Arc::new(Event::open(&buf.device, stream)?);
        let ready = OnceLock::new();
        let _ = ready.set(written.clone());
        storage.ready = Some(Arc::new(ready));
        Ok(DeviceViewMut {
            on: On {
                ptr: buf.device_ptr() + offset as u64,
                len,
                stream,
                _elem: PhantomData,
            },
            buffer: buf.clone(),
            written,
            cudarc: OnceLock::new(),
            _tensor: PhantomData,
        })
    }
}

/// Where a view's elements are and the one stream it is ordered on.
struct On<'a, T> {
    /// The device address of the first element: `len` elements of `T`, written by our copy or
    /// by earlier work, in a live allocation (the view holds its buffer), aligned (allocations
    /// are 256-byte aligned and parts start at multiples of their element size).
    ptr: sys::CUdeviceptr,
    len: usize,
    stream: &'a Arc<CudaStream>,
    _elem: PhantomData<&'a [T]>,
}

impl<T: Element> On<'_, T> {
    fn bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    fn check_len(&self, op: &str, other: usize) -> Result<()> {
        if other == self.len {
            return Ok(());
        }
        Err(Error::Shape(format!(
            "{op} needs {} elements, as many as the view holds, not {other}",
            self.len
        )))
    }

    fn bind(&self) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))
    }

    fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| Error::driver("cuStreamSynchronize", e))
    }

    /// Copies the elements into `dst` on the stream and waits for the copy.
    fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        self.check_len("copy_to_host", dst.len())?;
        // SAFETY: `dst` has room for `len` elements, exclusively borrowed until the copy has
        // finished (waited for below); the source holds `len` elements (see `On::ptr`).
        unsafe { self.copy_to_host_raw(dst.as_mut_ptr()) }
    }

    /// # Safety
    ///
    /// 1. `dst` is valid for `len` elements of writes until this returns.
    unsafe fn copy_to_host_raw(&self, dst: *mut T) -> Result<()> {
        self.bind()?;
        // SAFETY: forwarded from the caller for `dst`; the source is `len` live elements
        // (`On::ptr`), read on the stream that waited for the tensor's copy.
        let r = unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.cast(), self.ptr, self.bytes(), self.stream.cu_stream())
        };
        r.result()
            .map_err(|e| Error::driver("cuMemcpyDtoHAsync", e))?;
        self.synchronize()
    }

    fn to_vec(&self) -> Result<Vec<T>> {
        let mut out: Vec<T> = Vec::with_capacity(self.len);
        // SAFETY: `out` has room for `len` elements; the copy writes all of them with values of
        // the tensor's dtype, `T` (checked when the view was made), before the length is set.
        unsafe {
            self.copy_to_host_raw(out.as_mut_ptr())?;
            out.set_len(self.len);
        }
        Ok(out)
    }

    /// Copies the elements into `dst` on the stream, without blocking.
    fn copy_to(&self, dst: &mut impl DevicePtrMut<T>) -> Result<()> {
        self.check_len("copy_to", dst.len())?;
        self.bind()?;
        // cudarc orders `dst` itself: the stream waits for its earlier uses, and this use is
        // recorded on it when `_record` drops.
        let (dst, _record) = dst.device_ptr_mut(self.stream);
        // SAFETY: both ranges are `bytes` long device memory (`dst` checked above, the source
        // by `On::ptr`), distinct allocations (`dst` is exclusively borrowed, the tensor is
        // not), ordered on the stream.
        unsafe { result::memcpy_dtod_async(dst, self.ptr, self.bytes(), self.stream.cu_stream()) }
            .map_err(|e| Error::driver("cuMemcpyDtoDAsync", e))
    }

    /// A cudarc slice over the elements, made on the stream, that never frees them.
    ///
    /// # Safety
    ///
    /// 1. As [`DeviceView::as_cuda_view`]: work that uses it runs on the view's stream only.
    unsafe fn cudarc_slice(&self) -> CudaSlice<T> {
        // SAFETY: `ptr` addresses `len` elements of `T` (see `On::ptr`); the slice is given
        // back with `leak` when the view drops, never freed; its use is the caller's contract.
        unsafe { self.stream.upgrade_device_ptr::<T>(self.ptr, self.len) }
    }
}

/// A typed, read-only view of a device tensor, ordered on one stream; see
/// [`Tensor::cuda_view`].
pub struct DeviceView<'a, T> {
    on: On<'a, T>,
    /// Keeps the memory allocated while the view lives (for good if it is leaked).
    buffer: Arc<DeviceBuffer>,
    /// The view's entry among the buffer's open readers.
    key: u64,
    /// The cudarc slice behind [`as_cuda_view`](Self::as_cuda_view), made on first use.
    cudarc: OnceLock<CudaSlice<T>>,
    /// The view borrows the tensor for its life.
    _tensor: PhantomData<&'a Tensor>,
}

impl<'a, T: Element + DeviceRepr> DeviceView<'a, T> {
    /// The number of elements.
    pub fn len(&self) -> usize {
        self.on.len
    }

    /// Whether the view has no elements.
    pub fn is_empty(&self) -> bool {
        self.on.len == 0
    }

    /// The stream the view is ordered on: the one work through it must be enqueued on.
    pub fn stream(&self) -> &'a Arc<CudaStream> {
        self.on.stream
    }

    /// The device address of the first element, for a kernel enqueued on
    /// [`stream`](Self::stream) while the view lives (launching one is `unsafe` in cudarc,
    /// and this is part of its contract: on that stream, and only reading).
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.on.ptr
    }

    /// Copies the elements into `dst`, on the view's stream, and waits for the copy.
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] if `dst` does not hold [`len`](Self::len) elements; [`Error::Driver`].
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        self.on.copy_to_host(dst)
    }

    /// The elements, copied to the host on the view's stream.
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] if the copy fails.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.on.to_vec()
    }

    /// Copies the elements into device memory of your own (a cudarc slice or mutable view of
    /// the same length), on the view's stream, without blocking; cudarc orders `dst` as it does
    /// any of its slices.
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] if `dst` does not hold [`len`](Self::len) elements; [`Error::Driver`].
    pub fn copy_to(&self, dst: &mut impl DevicePtrMut<T>) -> Result<()> {
        self.on.copy_to(dst)
    }

    /// The elements as a cudarc view, for cudarc's kernel launches, cuBLAS and copies.
    ///
    /// # Panics
    ///
    /// When the stream's context tracks events (cudarc's default), cudarc makes two for the
    /// view the first time, and panics if the driver cannot (out of resources).
    ///
    /// # Safety
    ///
    /// cudarc lets any stream use a `CudaView`; this view is ordered on
    /// [`stream`](Self::stream) alone. So:
    ///
    /// 1. Work that reads the returned view, or anything taken from it (sub-views, device
    ///    pointers, kernel arguments), is enqueued on [`stream`](Self::stream); or on another
    ///    stream that first waits for `stream` (after this view was made) and that `stream`
    ///    waits for before this view is dropped.
    pub unsafe fn as_cuda_view(&self) -> CudaView<'_, T> {
        // SAFETY: forwarded from the caller.
        self.cudarc
            .get_or_init(|| unsafe { self.on.cudarc_slice() })
            .as_view()
    }
}

impl<T> Drop for DeviceView<'_, T> {
    fn drop(&mut self) {
        if let Some(slice) = self.cudarc.take() {
            // Given back without freeing: the memory is the tensor's.
            let _ = slice.leak();
        }
        match self.on.stream.record_event(None) {
            Ok(e) => self.buffer.close_reader(self.key, Some(e)),
            // Nothing can be recorded: wait here, so writers and the free find the reads done.
            Err(_) => {
                let _ = self.on.stream.synchronize();
                self.buffer.close_reader(self.key, None);
            }
        }
    }
}

/// A typed, writable view of a device tensor, ordered on one stream; see
/// [`Tensor::cuda_view_mut`].
pub struct DeviceViewMut<'a, T> {
    on: On<'a, T>,
    /// Keeps the memory allocated while the view lives (for good if it is leaked).
    buffer: Arc<DeviceBuffer>,
    /// The tensor's ready event from now on: closed when the view is dropped.
    written: Arc<Event>,
    /// The cudarc slice behind [`as_view_mut`](Self::as_view_mut), made on first use.
    cudarc: OnceLock<CudaSlice<T>>,
    /// The view borrows the tensor mutably for its life.
    _tensor: PhantomData<&'a mut Tensor>,
}

impl<'a, T: Element + DeviceRepr> DeviceViewMut<'a, T> {
    /// The number of elements.
    pub fn len(&self) -> usize {
        self.on.len
    }

    /// Whether the view has no elements.
    pub fn is_empty(&self) -> bool {
        self.on.len == 0
    }

    /// The stream the view is ordered on: the one work through it must be enqueued on.
    pub fn stream(&self) -> &'a Arc<CudaStream> {
        self.on.stream
    }

    /// The device address of the first element, for a kernel enqueued on
    /// [`stream`](Self::stream) while the view lives (launching one is `unsafe` in cudarc,
    /// and this is part of its contract).
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.on.ptr
    }

    /// Sets every element to zero (`false`, `0`, `0.0`) on the view's stream, without
    /// blocking.
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] if the fill cannot be enqueued.
    pub fn fill_zeros(&mut self) -> Result<()> {
        self.on.bind()?;
        // SAFETY: `len` elements of device memory this view alone writes (`On::ptr`), on its
        // stream; all-zero bytes are a valid value of every element type.
        unsafe {
            result::memset_d8_async(self.on.ptr, 0, self.on.bytes(), self.stream().cu_stream())
        }
        .map_err(|e| Error::driver("cuMemsetD8Async", e))
    }

    /// Copies `src` into the elements, on the view's stream, and waits for the copy (so
    /// `src` may be reused as soon as this returns).
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] if `src` does not hold [`len`](Self::len) elements; [`Error::Driver`].
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        self.on.check_len("copy_from_host", src.len())?;
        self.on.bind()?;
        // SAFETY: `src` holds `len` elements, borrowed until the copy has finished (waited for
        // below); the destination is `len` elements this view alone writes (`On::ptr`).
        let r = unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                self.on.ptr,
                src.as_ptr().cast(),
                self.on.bytes(),
                self.stream().cu_stream(),
            )
        };
        r.result()
            .map_err(|e| Error::driver("cuMemcpyHtoDAsync", e))?;
        self.on.synchronize()
    }

    /// Copies device memory of your own (a cudarc slice or view of the same length) into the
    /// elements, on the view's stream, without blocking; cudarc orders `src` as it does any of
    /// its slices.
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] if `src` does not hold [`len`](Self::len) elements; [`Error::Driver`].
    pub fn copy_from(&mut self, src: &impl DevicePtr<T>) -> Result<()> {
        self.on.check_len("copy_from", src.len())?;
        self.on.bind()?;
        let (src, _record) = src.device_ptr(self.on.stream);
        // SAFETY: both ranges are `bytes` long device memory (`src` checked above, the
        // destination by `On::ptr`), distinct (this view alone writes the tensor's), ordered
        // on the stream.
        unsafe {
            result::memcpy_dtod_async(self.on.ptr, src, self.on.bytes(), self.stream().cu_stream())
        }
        .map_err(|e| Error::driver("cuMemcpyDtoDAsync", e))
    }

    /// Copies the elements into `dst`, on the view's stream, and waits for the copy.
    ///
    /// # Errors
    ///
    /// As [`DeviceView::copy_to_host`].
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        self.on.copy_to_host(dst)
    }

    /// The elements, copied to the host on the view's stream.
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] if the copy fails.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.on.to_vec()
    }

    /// The elements as a writable cudarc view, for cudarc's kernel launches, cuBLAS and copies.
    ///
    /// # Panics
    ///
    /// As [`DeviceView::as_cuda_view`].
    ///
    /// # Safety
    ///
    /// cudarc lets any stream use a `CudaViewMut`; this view is ordered on
    /// [`stream`](Self::stream) alone. So:
    ///
    /// 1. Work that reads or writes the returned view, or anything taken from it (sub-views,
    ///    device pointers, kernel arguments), is enqueued on [`stream`](Self::stream); or on
    ///    another stream that first waits for `stream` (after this view was made) and that
    ///    `stream` waits for before this view is dropped.
    pub unsafe fn as_view_mut(&mut self) -> CudaViewMut<'_, T> {
        let on = &self.on;
        // SAFETY: forwarded from the caller.
        self.cudarc.get_or_init(|| unsafe { on.cudarc_slice() });
        self.cudarc
            .get_mut()
            .expect("made just above")
            .as_view_mut()
    }

    /// The elements as a read-only cudarc view.
    ///
    /// # Panics
    ///
    /// As [`DeviceView::as_cuda_view`].
    ///
    /// # Safety
    ///
    /// As [`as_view_mut`](Self::as_view_mut).
    pub unsafe fn as_view(&self) -> CudaView<'_, T> {
        // SAFETY: forwarded from the caller.
        self.cudarc
            .get_or_init(|| unsafe { self.on.cudarc_slice() })
            .as_view()
    }
}

impl<T> Drop for DeviceViewMut<'_, T> {
    fn drop(&mut self) {
        if let Some(slice) = self.cudarc.take() {
            // Given back without freeing: the memory is the tensor's.
            let _ = slice.leak();
        }
        // The view's work becomes the tensor's ready event and a reader of the buffer (so it
        // is freed after it). If it cannot be recorded, the event stays open: readers then
        // wait for the whole context, and the free waits for this stream here.
        let recorded = self.written.close(self.on.stream).is_ok();
        match self.on.stream.record_event(None) {
            Ok(e) if recorded => self.buffer.add_reader(e),
            _ => {
                let _ = self.on.stream.synchronize();
            }
        }
    }
}
