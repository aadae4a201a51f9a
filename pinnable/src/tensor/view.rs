//! Typed views of device tensors for kernels on any stream, ordered after the copy that fills
//! them.

use cudarc::driver::{CudaStream, CudaView, DeviceRepr};

use super::Tensor;
use super::storage::{Data, DeviceBuffer};
use crate::dtype::Element;
use crate::error::{Error, Result};

impl Tensor {
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
        Ok(DeviceView {
            view,
            stream,
            buffer: buf,
        })
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
