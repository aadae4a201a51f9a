//! candle's CUDA backend: moving candle tensors, and sharing device memory both ways.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use candle_core as candle;
use candle_core::backend::BackendDevice;
use candle_core::cuda::{CudaDType, CudaStorageSlice};
use cudarc::driver::{DevicePtr, DeviceRepr, sys};

use super::{ReadLocked, error, with_elem};
use crate::alloc::PinnedPool;
use crate::cuda::{Device, Event};
use crate::error::Result;
use crate::tensor::{DeviceBuffer, Storage, Tensor};
use crate::transfer::{MoveContext, ToDevice};

impl Device {
    /// Our handle on the GPU of candle's `device`.
    ///
    /// It shares candle's context (the GPU's primary context; no second context is made) and
    /// copies on its own stream. Candle tensors moved to it (`to_device` of a batch with candle
    /// fields) become CUDA tensors of this very candle device, ordered on its stream. candle's
    /// CPU device gives [`Device::cpu`].
    ///
    /// # Errors
    ///
    /// [`Error::CudaUnavailable`](crate::Error::CudaUnavailable) without a driver;
    /// [`Error::Interop`](crate::Error::Interop) for a Metal device, or a candle device whose
    /// context is not the primary one.
    pub fn from_candle(device: &candle::Device) -> Result<Device> {
        let cdev = match device {
            candle::Device::Cpu => return Ok(Device::cpu()),
            candle::Device::Cuda(d) => d,
            candle::Device::Metal(_) => return Err(error("Metal devices are not supported")),
        };
        let stream = cdev.cuda_stream();
        let theirs = stream.context();
        let mut ours = Device::cuda(theirs.ordinal())?;
        if ours
            .cuda_context()
            .is_none_or(|c| c.cu_ctx() != theirs.cu_ctx())
        {
            return Err(error(format!(
                "candle's device on cuda:{} does not use the GPU's primary context; make it \
                 with `candle_core::Device::new_cuda`",
                theirs.ordinal()
            )));
        }
        ours.framework = Some(cdev.clone());
        Ok(ours)
    }

    /// The candle device this one was made from ([`from_candle`](Self::from_candle)).
    pub fn candle(&self) -> Option<&candle::CudaDevice> {
        self.framework.as_ref()
    }
}

/// A candle tensor in a batch moves with the rest of the batch: a CPU tensor to a device made
/// by [`Device::from_candle`] lands in a device allocation of its own, which candle owns and
/// frees, and candle's stream waits for the batch's copies before the move returns. Tensors
/// already on that candle device are shared; tensors on another device, and moves to the host,
/// use candle's own copy.
///
/// Reads are ordered for candle's ops, which all run on the device's stream. Raw cudarc work
/// on another stream should wait for candle's stream first (the moved slices carry no cudarc
/// write event).
impl ToDevice for candle::Tensor {
    fn to_device_with(&self, cx: &mut MoveContext<'_>) -> Result<Self> {
        let candle_error = |e: candle::Error| error(e.to_string());
        let target = cx.device();
        if target.is_cpu() {
            return candle::Tensor::to_device(self, &candle::Device::Cpu).map_err(candle_error);
        }
        let Some(cdev) = target.candle().cloned() else {
            return Err(error(format!(
                "candle tensors move to a `Device` made by `Device::from_candle`, so that \
                 the results are that candle device's tensors; {target} was made otherwise"
            )));
        };
        if let candle::Device::Cuda(src) = self.device() {
            return if src.same_device(&cdev) {
                Ok(self.clone())
            } else {
                candle::Tensor::to_device(self, &candle::Device::Cuda(cdev)).map_err(candle_error)
            };
        }
        cx.order_stream(&cdev.cuda_stream());
        let measuring = cx.is_measuring();
        let view = cx.slot::<Locks>().view(self, measuring)?;
        let Some(view) = view else {
            return Err(error(format!(
                "tensors on candle's {:?} device cannot be moved",
                self.device().location()
            )));
        };
        let moved = cx.move_tensor_apart(&view)?;
        drop(view);
        if measuring {
            return Ok(self.clone());
        }
        let dtype = moved.dtype();
        let (ptr, bytes) = moved
            .release_device_allocation(&cdev.cuda_stream())?
            .map_err(|_| {
                error(
                    "a tensor moved into an allocation of its own did not own it; this is a \
                     bug in pinnable, please report it",
                )
            })?;
        with_elem!(dtype, adopt(ptr, bytes, &cdev, self.dims()))
    }
}

/// The read locks a move holds on its candle sources until the copy threads have read them:
/// one per storage, however many of the batch's tensors view it (a second read lock on one
/// storage could wait behind a writer that waits for the first).
#[derive(Default)]
struct Locks {
    /// Each source tensor's storage, as the first walk found it.
    storage_of: HashMap<candle::TensorId, usize>,
    held: HashMap<usize, ReadLocked>,
}

impl Locks {
    /// Our view of `t`'s bytes (`None` off the CPU). In the first walk each lock is let go at
    /// once; in the second it is kept until the move ends.
    fn view(&mut self, t: &candle::Tensor, measuring: bool) -> Result<Option<Tensor>> {
        if let Some(lock) = self.storage_of.get(&t.id()).and_then(|s| self.held.get(s)) {
            return lock.view(t);
        }
        let lock = ReadLocked::new(t);
        let view = lock.view(t)?;
        let storage = lock.storage_id();
        if measuring {
            self.storage_of.insert(t.id(), storage);
        } else {
            self.held.insert(storage, lock);
        }
        Ok(view)
    }
}

/// A candle tensor over `bytes` of device memory at `ptr`, which candle then owns.
fn adopt<T: CudaDType + DeviceRepr>(
    ptr: sys::CUdeviceptr,
    bytes: usize,
    cdev: &candle::CudaDevice,
    dims: &[usize],
) -> Result<candle::Tensor> {
    let stream = cdev.cuda_stream();
    // SAFETY: `ptr` is a live allocation of at least `bytes` bytes from the device's
    // stream-ordered pool that nothing else owns (given up by `release_device_allocation`).
    // candle frees it on its stream, which waits for the copies that fill it
    // (`MoveContext::order_stream`) before any work queued afterwards.
    let slice = unsafe { stream.upgrade_device_ptr::<T>(ptr, bytes / size_of::<T>()) };
    let storage = candle::CudaStorage::wrap_cuda_slice(slice, cdev.clone());
    Ok(candle::Tensor::from_storage(
        candle::Storage::Cuda(storage),
        dims,
        candle::op::BackpropOp::none(),
        false,
    ))
}

/// `Tensor::into_candle` to a CUDA device.
pub(super) fn into_candle_cuda(t: Tensor, cdev: &candle::CudaDevice) -> Result<candle::Tensor> {
    let target = Device::from_candle(&candle::Device::Cuda(cdev.clone()))?;
    let dims = t.shape().to_vec();
    let dtype = t.dtype();
    let t = match t.placement().is_host() {
        // Moved on its own, it owns its allocation and is handed over below.
        true => MoveContext::run(&target, true, PinnedPool::global(), |cx| {
            cx.order_stream(&cdev.cuda_stream());
            cx.move_tensor_apart(&t)
        })?,
        false => t,
    };
    match t.release_device_allocation(&cdev.cuda_stream())? {
        Ok((ptr, bytes)) => with_elem!(dtype, adopt(ptr, bytes, cdev, &dims)),
        Err(t) => with_elem!(dtype, copy_into_candle(&t, cdev, &target)),
    }
}

/// One device-to-device copy of `t` into a new allocation of candle's, on candle's stream.
fn copy_into_candle<T: CudaDType + DeviceRepr + crate::dtype::Element>(
    t: &Tensor,
    cdev: &candle::CudaDevice,
    target: &Device,
) -> Result<candle::Tensor> {
    if t.device() != *target {
        return Err(error(format!(
            "a tensor on {} cannot become a candle tensor of {target}; move it there first",
            t.placement()
        )));
    }
    let stream = cdev.cuda_stream();
    // The view orders candle's stream after the copy that fills `t`, and records the copy
    // below (on that stream) as a reader of `t`'s memory.
    let view = t.cuda_view::<T>(&stream)?;
    // SAFETY: filled by the copy right below, before anything else on candle's stream.
    let mut slice = unsafe { stream.alloc::<T>(t.numel()) }
        .map_err(|e| crate::Error::driver("cuMemAllocAsync", e))?;
    view.copy_to(&mut slice)?;
    drop(view);
    let storage = candle::CudaStorage::wrap_cuda_slice(slice, cdev.clone());
    Ok(candle::Tensor::from_storage(
        candle::Storage::Cuda(storage),
        t.shape(),
        candle::op::BackpropOp::none(),
        false,
    ))
}

/// `Tensor::from_candle` of a CUDA tensor: one device-to-device copy into memory of our own,
/// made on candle's stream, so it reads the tensor after everything candle queued before it
/// and before anything candle queues after it (candle's safe in-place writes included). Shared
/// memory could not be ordered against those writes, so nothing is shared.
pub(super) fn copy_candle(t: &candle::Tensor) -> Result<Tensor> {
    let dtype = super::dtype_from_candle(t.dtype())?;
    let (storage, layout) = t.storage_and_layout();
    let candle::Storage::Cuda(cs) = &*storage else {
        unreachable!("called for CUDA tensors");
    };
    let stream = cs.device.cuda_stream();
    fn raw<T>(
        s: &cudarc::driver::CudaSlice<T>,
        stream: &Arc<cudarc::driver::CudaStream>,
    ) -> (sys::CUdeviceptr, usize) {
        (s.device_ptr(stream).0, s.num_bytes())
    }
    let (ptr, bytes) = match &cs.slice {
        CudaStorageSlice::U8(s) => raw(s, &stream),
        CudaStorageSlice::U32(s) => raw(s, &stream),
        CudaStorageSlice::I16(s) => raw(s, &stream),
        CudaStorageSlice::I32(s) => raw(s, &stream),
        CudaStorageSlice::I64(s) => raw(s, &stream),
        CudaStorageSlice::BF16(s) => raw(s, &stream),
        CudaStorageSlice::F16(s) => raw(s, &stream),
        CudaStorageSlice::F32(s) => raw(s, &stream),
        CudaStorageSlice::F64(s) => raw(s, &stream),
        _ => unreachable!("refused by dtype_from_candle"),
    };
    let ours = Device::from_candle(t.device())?;
    let dev = ours.cuda_device("from_candle")?.clone();
    // Our memory, made in our copy stream's order; candle's stream waits for it.
    // SAFETY: written by the copy below before anything reads it (readers wait for `ready`).
    let slice = unsafe { dev.alloc(bytes.max(1)) }
        .map_err(|e| crate::Error::driver("cuMemAllocAsync", e))?;
    let dst = slice.device_ptr(&dev.copy_stream).0;
    dev.record()?.wait_on(&stream)?;
    // SAFETY: `ptr` holds `bytes` bytes of candle's live storage (its read lock is held; candle
    // frees it on its stream, after this copy); `dst` is our fresh allocation of as many; the
    // copy runs on candle's stream, ordered after the allocation.
    unsafe { sys::cuMemcpyDtoDAsync_v2(dst, ptr, bytes, stream.cu_stream()) }
        .result()
        .map_err(|e| crate::Error::driver("cuMemcpyDtoDAsync", e))?;
    let (event, written) = Event::record_on(&dev, &stream)?;
    let buf = DeviceBuffer::new(slice, dev);
    // The copy writes our buffer on candle's stream: freeing it (on our copy stream) waits.
    buf.add_reader(written);
    let ready = Arc::new(OnceLock::new());
    let _ = ready.set(Arc::new(event));
    let storage = Storage::device(buf, ready);
    Ok(Tensor::from_parts(
        storage,
        dtype,
        layout.dims(),
        layout.stride(),
        layout.start_offset(),
    ))
}
