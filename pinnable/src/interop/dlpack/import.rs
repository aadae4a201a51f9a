//! Importing DLPack tensors another library produced, without a copy.

use std::any::Any;
use std::sync::{Arc, OnceLock};

use super::*;
use crate::cuda::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::{
    DeviceBuffer, External, HostBuf, HostBytes, Storage, Tensor, contiguous_strides,
};

impl Tensor {
    /// A tensor over a DLPack tensor's memory, without a copy; see the [module docs](crate::interop::dlpack) for
    /// host and device memory and the stream the producer must order its work before.
    ///
    /// # Errors
    ///
    /// [`Error::Interop`] for a dtype without a counterpart,
    /// vector lanes, negative strides or sizes, a null data pointer for a non-empty tensor,
    /// data not aligned for its dtype, `bool` bytes other than 0 and 1, or a device type other
    /// than CPU, CUDA host and CUDA; [`Error::CudaUnavailable`] for a CUDA tensor without the
    /// device. The producer's deleter is called on every error.
    pub fn from_dlpack(dl: DlpackTensor) -> Result<Tensor> {
        if let Some(holder) = dl.ours {
            // Our own export coming back: the tensor it holds, so the sharing rules see one
            // storage (a second one over the same bytes could be written in place). Dropping
            // `dl` then runs our deleter once.
            // SAFETY: the holder lives until `dl`'s deleter runs, which is after this line.
            return Ok(Tensor::clone(&unsafe { holder.as_ref() }.tensor));
        }
        // A versioned tensor's major version was checked when it was taken in.
        let t = dl.dl_tensor();
        let dtype = from_dl_dtype(t.dtype)?;
        // SAFETY: `from_raw_*`'s callers promise `ndim` entries.
        let dims = unsafe { raw_slice(t.shape, t.ndim) }
            .ok_or_else(|| error(format!("ndim {} with no shape", t.ndim)))?;
        let shape = dims
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| error(format!("negative size in {dims:?}"))))
            .collect::<Result<Vec<usize>>>()?;
        let (row_major, numel) = contiguous_strides(&shape)?;
        // SAFETY: as above.
        let strides = match unsafe { raw_slice(t.strides, t.ndim) } {
            None => row_major.to_vec(),
            Some(s) => s
                .iter()
                .map(|&x| {
                    usize::try_from(x).map_err(|_| {
                        error(format!(
                            "negative strides {s:?} are not supported; make the tensor \
                             contiguous on the producer's side first"
                        ))
                    })
                })
                .collect::<Result<Vec<usize>>>()?,
        };
        let elem = dtype.size();
        let span = if numel == 0 {
            0
        } else {
            shape
                .iter()
                .zip(&strides)
                .try_fold(1usize, |acc, (&d, &s)| {
                    (d - 1).checked_mul(s).and_then(|x| x.checked_add(acc))
                })
                .and_then(|n| n.checked_mul(elem))
                .ok_or_else(|| error("the tensor's byte span overflows"))?
        };
        let device = t.device;
        if numel > 0 && t.data.is_null() {
            return Err(error("a null data pointer for a non-empty tensor"));
        }
        let first = (t.data as usize)
            .checked_add(usize::try_from(t.byte_offset).unwrap_or(usize::MAX))
            .ok_or_else(|| error("data + byte_offset overflows"))?;
        if numel > 0 && !first.is_multiple_of(elem) {
            return Err(error(format!(
                "{dtype} data at {first:#x} is not aligned to {elem} bytes"
            )));
        }
        match device.device_type {
            ffi::KDL_CPU | ffi::KDL_CUDA_HOST => {
                if numel == 0 {
                    return Tensor::at(Storage::host(HostBuf::zeroed(0)), dtype, &shape, 0);
                }
                let owner = ForeignHost {
                    ptr: first as *const u8,
                    len: span,
                    _dl: dl,
                };
                // Checked there against the span: in bounds, aligned, and bools 0 or 1.
                Tensor::over_host_bytes(External::new(Arc::new(owner)), dtype, &shape, &strides, 0)
                    .map_err(error)
            }
            ffi::KDL_CUDA if dtype == DType::Bool => Err(error(
                "bool tensors on a CUDA device cannot be imported: their bytes cannot be checked \
                 to be 0 or 1 here; import them as u8 (or on the host) instead",
            )),
            ffi::KDL_CUDA => {
                let ordinal = usize::try_from(device.device_id)
                    .map_err(|_| error(format!("device id {}", device.device_id)))?;
                let target = Device::cuda(ordinal)?;
                let dev = target.cuda_device("from_dlpack")?.clone();
                let ready = Arc::new(OnceLock::new());
                let _ = ready.set(Arc::new(dev.record()?));
                let owner: Box<dyn Any + Send + Sync> = Box::new(dl);
                // SAFETY: `first` addresses `span` bytes of the device's memory, alive until
                // the DLPack tensor's deleter runs, which dropping `owner` does
                // (`from_raw_*`'s callers).
                let buf = unsafe { DeviceBuffer::foreign(first as u64, span, dev, owner) };
                let storage = Storage::device(buf, ready);
                Ok(Tensor::from_parts(storage, dtype, &shape, &strides, 0))
            }
            other => Err(error(format!(
                "device type {other} is not supported; only CPU (1), CUDA (2) and CUDA host (3) \
                 memory can be imported"
            ))),
        }
    }
}

/// Host bytes a DLPack producer owns: from the first element to the last.
struct ForeignHost {
    ptr: *const u8,
    len: usize,
    /// Calls the producer's deleter when the last tensor over the bytes is dropped.
    _dl: DlpackTensor,
}

// SAFETY: the bytes are only read (`from_raw_*`'s callers promise nobody writes them) and the
// deleter may run on any thread.
unsafe impl Send for ForeignHost {}
// SAFETY: as for Send.
unsafe impl Sync for ForeignHost {}

impl HostBytes for ForeignHost {
    fn host_bytes(&self) -> &[u8] {
        // SAFETY: `from_raw_*`'s callers promise these bytes are readable and unchanging while
        // the DLPack tensor is held, which `self` does.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}
