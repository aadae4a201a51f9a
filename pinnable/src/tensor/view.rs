//! Typed views of device tensors for kernels on any stream, ordered after the copy that fills
//! them: read-only ([`Tensor::cuda_view`]) and writable ([`Tensor::cuda_view_mut`]).

use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceRepr};

use super::Tensor;
use super::storage::{Data, DeviceBuffer};
use crate::cuda::Event;
use crate::dtype::Element;
use crate::error::{Error, Result};

impl Tensor {
    /// A typed view of a contiguous device tensor for use on `stream` (cudarc kernels, cuBLAS,
    /// ...). `stream` is made to wait for the copy that fills the tensor, so kernels enqueued on
    /// it read complete data; when the view is dropped, an event is recorded on `stream` so the
    /// memory is neither freed nor overwritten until those kernels are done. A view that is
    /// never dropped (`mem::forget`) keeps the memory allocated for good, and whatever writes
    /// the tensor's buffer next first waits for every stream of `stream`'s context.
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
        if let Some(event) = self.storage.ready_event() {
            event.wait_on(stream)?;
        }
        let n = self.numel();
        let bytes = buf
            .slice()
            .slice(self.byte_offset()..self.byte_offset() + self.nbytes());
        // SAFETY: the byte range holds `n` elements of `T` (dtype checked) written by our copy,
        // and device allocations are aligned far beyond any element's alignment.
        let view = unsafe { bytes.transmute::<T>(n) }.expect("range sized for n elements");
        let key = buf.open_reader(stream.context().clone());
        Ok(DeviceView {
            view,
            stream,
            buffer: buf.clone(),
            key,
        })
    }
}

impl Tensor {
    /// A typed, writable view of a contiguous device tensor for kernels on `stream` that write
    /// it in place.
    ///
    /// Ordered like [`cuda_view`](Self::cuda_view), and more: `stream` first waits for the copy
    /// that fills the tensor and for every consumer recorded as reading its buffer (views on
    /// other streams, copies to other devices or to the host), so the kernels overwrite nothing
    /// still being read. When the view is dropped, an event is recorded on `stream` that becomes
    /// the tensor's ready event, so whatever reads the tensor next (a view on any stream, a copy
    /// to the host or another device, a host read after `to_cpu`) waits for the kernels' writes;
    /// the same event keeps the memory from being freed before they finish. A view that is never
    /// dropped (`mem::forget`) keeps the memory allocated for good, and whatever reads the tensor
    /// next first waits for every stream of `stream`'s context.
    ///
    /// A device tensor shared by a clone or a view cannot be written in place (the others would
    /// see the write), and this does not copy it on the device behind the caller's back: it
    /// returns an error instead. Drop the other handles first, or write into a tensor of its
    /// own.
    ///
    /// # Errors
    ///
    /// [`Error::DTypeMismatch`], [`Error::WrongPlacement`] for a host tensor, [`Error::Shape`]
    /// for a non-contiguous view, [`Error::Shared`] when a clone or view shares the tensor,
    /// [`Error::Driver`] if a wait cannot be enqueued.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::{Device, Tensor, ToDevice};
    ///
    /// let Ok(device) = Device::cuda(0) else { return Ok(()) };
    /// let ctx = device.cuda_context().unwrap();
    /// let stream = ctx.new_stream().map_err(|e| pinnable::Error::Shape(e.to_string()))?;
    /// let mut t = Tensor::from_vec(vec![1.0f32; 4], &[4])?.to_device(&device, true)?;
    /// {
    ///     let mut view = t.cuda_view_mut::<f32>(&stream)?;
    ///     // A kernel would take `&mut view.as_view_mut()` as an argument; a memset will do here.
    ///     stream
    ///         .memset_zeros(&mut view.as_view_mut())
    ///         .map_err(|e| pinnable::Error::Shape(e.to_string()))?;
    /// } // the write is now the tensor's ready event
    /// assert_eq!(t.to_cpu(false)?.to_vec::<f32>()?, vec![0.0; 4]);
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn cuda_view_mut<'a, T: Element + DeviceRepr>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> Result<DeviceViewMut<'a, T>> {
        self.check_dtype::<T>()?;
        let placement = self.placement();
        if !matches!(self.storage.data, Data::Device(_)) {
            return Err(Error::WrongPlacement {
                op: "cuda_view_mut",
                needs: "a CUDA tensor (move it with `to_device` first)",
                placement: placement.to_string(),
            });
        }
        if !self.is_contiguous() {
            return Err(Error::Shape(
                "cuda_view_mut needs a contiguous tensor; this view is strided".into(),
            ));
        }
        let sharers = Arc::strong_count(&self.storage);
        let (n, offset, nbytes) = (self.numel(), self.byte_offset(), self.nbytes());
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
        let ptr = buf.device_ptr() + offset as u64;
        // From here on, readers of the tensor wait for the view's work: for its event once the
        // view is dropped, for the whole context before that (or if it never is).
        let written = Arc::new(Event::open(&buf.device, stream)?);
        let ready = OnceLock::new();
        let _ = ready.set(written.clone());
        storage.ready = Some(Arc::new(ready));
        // SAFETY: `ptr` addresses `nbytes` bytes of this tensor's part of a live device
        // allocation (held by `buffer` for the view's life, and for good if it is leaked), which
        // hold `n` elements of `T` (dtype checked) written by our copy or by earlier kernels,
        // aligned (allocations are 256-byte aligned and parts start at multiples of their
        // element size). The slice never frees it: `DeviceViewMut::drop` gives the pointer back
        // with `leak`.
        let slice = unsafe { buf.device.copy_stream.upgrade_device_ptr::<T>(ptr, n) };
        debug_assert_eq!(n * size_of::<T>(), nbytes);
        Ok(DeviceViewMut {
            slice: ManuallyDrop::new(slice),
            stream,
            buffer: buf.clone(),
            written,
            _tensor: PhantomData,
        })
    }
}

/// A typed, writable view of a device tensor, ordered on one stream; see
/// [`Tensor::cuda_view_mut`]. Hand [`as_view_mut`](Self::as_view_mut) to kernels.
pub struct DeviceViewMut<'a, T> {
    /// Borrows the tensor's memory; never frees it.
    slice: ManuallyDrop<CudaSlice<T>>,
    stream: &'a CudaStream,
    /// Keeps the memory allocated while the view lives (for good if it is leaked).
    buffer: Arc<DeviceBuffer>,
    /// The tensor's ready event from now on: closed when the view is dropped.
    written: Arc<Event>,
    /// The view borrows the tensor mutably for its life.
    _tensor: PhantomData<&'a mut Tensor>,
}

impl<T> DeviceViewMut<'_, T> {
    /// The elements, writable, for a kernel argument or a cudarc copy.
    pub fn as_view_mut(&mut self) -> CudaViewMut<'_, T> {
        self.slice.as_view_mut()
    }

    /// The elements, read-only.
    pub fn as_view(&self) -> CudaView<'_, T> {
        self.slice.as_view()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// Whether the view has no elements.
    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }
}

impl<T> Drop for DeviceViewMut<'_, T> {
    fn drop(&mut self) {
        // SAFETY: taken once, here; `leak` hands the pointer back without freeing it.
        let _ = unsafe { ManuallyDrop::take(&mut self.slice) }.leak();
        // The kernels' end becomes the tensor's ready event and a reader of the buffer (so it
        // is freed after them). If it cannot be recorded, the event stays open: readers then
        // wait for the whole context, and the free waits for this stream here.
        let recorded = self.written.close(self.stream).is_ok();
        match self.stream.record_event(None) {
            Ok(e) if recorded => self.buffer.add_reader(e),
            _ => {
                let _ = self.stream.synchronize();
            }
        }
    }
}

/// A typed, read-only [`CudaView`] of a device tensor, ordered on one stream.
/// Derefs to the view; see [`Tensor::cuda_view`].
pub struct DeviceView<'a, T> {
    view: CudaView<'a, T>,
    stream: &'a CudaStream,
    /// Keeps the memory allocated while the view lives (for good if it is leaked).
    buffer: Arc<DeviceBuffer>,
    /// The view's entry among the buffer's open readers.
    key: u64,
}

impl<'a, T> std::ops::Deref for DeviceView<'a, T> {
    type Target = CudaView<'a, T>;

    fn deref(&self) -> &CudaView<'a, T> {
        &self.view
    }
}

impl<T> Drop for DeviceView<'_, T> {
    fn drop(&mut self) {
        match self.stream.record_event(None) {
            Ok(e) => self.buffer.close_reader(self.key, Some(e)),
            // Nothing can be recorded: wait here, so writers and the free find the reads done.
            Err(_) => {
                let _ = self.stream.synchronize();
                self.buffer.close_reader(self.key, None);
            }
        }
    }
}
