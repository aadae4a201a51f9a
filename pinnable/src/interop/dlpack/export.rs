//! Exporting tensors as DLPack, ordered on the consumer's stream.

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{CudaStream, sys};

use super::ffi::{DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor};
use super::*;
use crate::error::Result;
use crate::tensor::{Memory, Tensor};

/// The consumer's stream that a device export is ordered on.
pub(super) enum Consumer {
    /// A host export, which waited on the host for the tensor's copy; nothing to record at the
    /// end (the host's reads are done when the deleter runs).
    Host,
    Stream(Arc<CudaStream>),
    /// A stream another library owns (kept valid by the caller of `to_dlpack_on_raw`).
    Raw(sys::CUstream),
}

/// What one export keeps alive: both managed structs (the consumer gets one), the shape and
/// strides they point at, and the tensor.
pub(super) struct Holder {
    pub(super) versioned: DLManagedTensorVersioned,
    pub(super) legacy: DLManagedTensor,
    shape: Vec<i64>,
    strides: Vec<i64>,
    pub(super) tensor: ManuallyDrop<Tensor>,
    consumer: Consumer,
}

impl Holder {
    /// The consumer is done: records its stream's work so far as the last use of the memory.
    fn record_reader(&self) {
        let Memory::Device(buf) = self.tensor.source().memory else {
            return;
        };
        let reader = match &self.consumer {
            Consumer::Host => return,
            Consumer::Stream(s) => s.record_event(None).ok(),
            // SAFETY: the caller of `to_dlpack_on_raw` keeps the stream alive until the
            // deleter runs.
            Consumer::Raw(s) => unsafe { buf.device.record_raw(*s) }.ok(),
        };
        match reader {
            Some(r) => buf.add_reader(r),
            // Nothing could be recorded: wait for the device instead of risking a reuse.
            None => {
                let _ = buf.device.ctx.synchronize();
            }
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // On the consumer's thread (its deleter): the context current there is put back once
        // the reader is recorded and the tensor dropped (which may free the memory).
        let _current = match self.tensor.source().memory {
            Memory::Device(buf) => crate::cuda::KeepCurrent::bind(&buf.device.ctx).ok(),
            _ => None,
        };
        self.record_reader();
        // SAFETY: dropped once, here, and not used afterwards.
        unsafe { ManuallyDrop::drop(&mut self.tensor) };
    }
}

unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    // SAFETY: the consumer passes back the pointer we handed out, once: `manager_ctx` is the
    // holder we leaked from a box.
    let holder = unsafe { (*managed).manager_ctx }.cast::<Holder>();
    // Unwinding out of an `extern "C"` function aborts; a panic here is swallowed instead.
    // SAFETY: as above; the box is rebuilt exactly once.
    // The holder is dropped whole or not at all, so no broken state is observed after a panic.
    let drop_it = std::panic::AssertUnwindSafe(|| drop(unsafe { Box::from_raw(holder) }));
    let _ = std::panic::catch_unwind(drop_it);
}

unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    // SAFETY: as in `delete_versioned`.
    let holder = unsafe { (*managed).manager_ctx }.cast::<Holder>();
    // SAFETY: as in `delete_versioned`.
    let drop_it = std::panic::AssertUnwindSafe(|| drop(unsafe { Box::from_raw(holder) }));
    let _ = std::panic::catch_unwind(drop_it);
}

impl Tensor {
    /// Exports a host tensor as DLPack, without a copy. Waits on the host for a pending copy
    /// into the tensor first, so any consumer, on any stream, reads complete data.
    ///
    /// A device tensor is exported with [`to_dlpack_on`](Self::to_dlpack_on) instead, naming
    /// the stream its consumer works on: with no stream, nothing could keep the memory from
    /// being freed and reused (it is, in stream order, on the device's copy stream) while the
    /// consumer's kernels still read it, since the deleter runs when the consumer's host code
    /// lets go, not when its kernels finish.
    ///
    /// # Errors
    ///
    /// [`Error::Interop`] for a device tensor (see above); [`Error::Driver`] if the pending
    /// copy failed.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::{Pinnable, Tensor};
    ///
    /// let t = Tensor::from_vec(vec![1.5f32, 2.5], &[2])?.pin_memory()?;
    /// let dl = t.to_dlpack()?;
    /// assert_eq!(dl.device().device_type, pinnable::interop::dlpack::ffi::KDL_CPU);
    /// assert_eq!(dl.shape(), &[2]);
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn to_dlpack(&self) -> Result<DlpackTensor> {
        if let Memory::Device(buf) = self.source().memory {
            return Err(error(format!(
                "a cuda:{} tensor is exported for the stream its consumer works on, so that its \
                 memory outlives the consumer's kernels: use `to_dlpack_on(&stream)`, or \
                 `to_dlpack_on_raw` with the `stream` argument of Python's `__dlpack__`",
                buf.device.ordinal
            )));
        }
        self.storage().wait_ready()?;
        self.export(Consumer::Host)
    }

    /// Exports a device tensor for a consumer that works on `stream`, without blocking:
    /// `stream` is made to wait for the copy that fills the tensor, and when the consumer calls
    /// the deleter, `stream`'s work is recorded as a reader so the memory outlives it. A host
    /// tensor is exported as by [`to_dlpack`](Self::to_dlpack).
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] if the wait cannot be enqueued.
    pub fn to_dlpack_on(&self, stream: &Arc<CudaStream>) -> Result<DlpackTensor> {
        if !matches!(self.source().memory, Memory::Device(_)) {
            return self.to_dlpack();
        }
        if let Some(e) = self.storage().ready_event() {
            e.wait_on(stream)?;
        }
        self.export(Consumer::Stream(stream.clone()))
    }

    /// As [`to_dlpack_on`](Self::to_dlpack_on), for a stream another library owns, given as
    /// its raw handle (the `stream` integer of Python's `__dlpack__`: `1` is the legacy default
    /// stream, `2` the per-thread default stream, other values `cudaStream_t` handles).
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] if the wait cannot be enqueued.
    ///
    /// # Safety
    ///
    /// 1. `stream` is a stream of the tensor's device (or a special handle above), and stays
    ///    alive until the consumer calls the deleter.
    pub unsafe fn to_dlpack_on_raw(&self, stream: sys::CUstream) -> Result<DlpackTensor> {
        if !matches!(self.source().memory, Memory::Device(_)) {
            return self.to_dlpack();
        }
        if let Some(e) = self.storage().ready_event() {
            // SAFETY: a stream of this device (caller).
            unsafe { e.wait_on_raw(stream)? };
        }
        self.export(Consumer::Raw(stream))
    }

    /// As [`to_dlpack_on_raw`](Self::to_dlpack_on_raw) for each of `tensors`, for one
    /// consumer on `stream`, making the stream wait once for each copy they came by: the
    /// tensors of a batch come by one copy, so handing a whole batch over costs one wait
    /// instead of one a tensor. What a binding handing batches to Python calls.
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] if a wait cannot be enqueued; the tensors exported until then are
    /// dropped.
    ///
    /// # Safety
    ///
    /// As for [`to_dlpack_on_raw`](Self::to_dlpack_on_raw), for every tensor.
    pub unsafe fn to_dlpack_all_on_raw(
        tensors: &[Tensor],
        stream: sys::CUstream,
    ) -> Result<Vec<DlpackTensor>> {
        let mut waited: Vec<sys::CUevent> = Vec::new();
        let mut out = Vec::with_capacity(tensors.len());
        for t in tensors {
            if !matches!(t.source().memory, Memory::Device(_)) {
                out.push(t.to_dlpack()?);
                continue;
            }
            if let Some(e) = t.storage().ready_event() {
                // An event is told apart by its handle, live while its tensor is.
                let handle = e.handle();
                if handle.is_none_or(|h| !waited.contains(&h)) {
                    // SAFETY: a stream of the tensor's device (caller).
                    unsafe { e.wait_on_raw(stream)? };
                    waited.extend(handle);
                }
            }
            out.push(t.export(Consumer::Raw(stream))?);
        }
        Ok(out)
    }

    fn export(&self, consumer: Consumer) -> Result<DlpackTensor> {
        let (device, first) = match self.source().memory {
            Memory::Device(buf) => (
                DLDevice {
                    device_type: ffi::KDL_CUDA,
                    device_id: i32::try_from(buf.device.ordinal).unwrap_or(i32::MAX),
                },
                (buf.device_ptr() + self.byte_offset() as u64) as *mut c_void,
            ),
            _ => (
                DLDevice {
                    device_type: ffi::KDL_CPU,
                    device_id: 0,
                },
                self.host_src("to_dlpack")?.ptr.cast_mut().cast(),
            ),
        };
        let to_i64 = |v: &[usize]| -> Result<Vec<i64>> {
            v.iter()
                .map(|&x| i64::try_from(x).map_err(|_| error(format!("{x} does not fit in i64"))))
                .collect()
        };
        let shape = to_i64(self.shape())?;
        let strides = to_i64(self.strides())?;
        let ndim = i32::try_from(self.rank()).map_err(|_| error("too many dimensions"))?;
        let data = if self.numel() == 0 {
            std::ptr::null_mut()
        } else {
            first
        };
        let dl_tensor = |shape: *mut i64, strides: *mut i64| DLTensor {
            data,
            device,
            ndim,
            dtype: to_dl_dtype(self.dtype()),
            shape,
            strides,
            byte_offset: 0,
        };
        let mut holder = Box::new(Holder {
            versioned: DLManagedTensorVersioned {
                version: DLPackVersion {
                    major: ffi::DLPACK_MAJOR_VERSION,
                    minor: ffi::DLPACK_MINOR_VERSION,
                },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_versioned),
                flags: ffi::FLAG_READ_ONLY,
                dl_tensor: dl_tensor(std::ptr::null_mut(), std::ptr::null_mut()),
            },
            legacy: DLManagedTensor {
                dl_tensor: dl_tensor(std::ptr::null_mut(), std::ptr::null_mut()),
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_legacy),
            },
            shape,
            strides,
            tensor: ManuallyDrop::new(self.clone()),
            consumer,
        });
        // The vectors' buffers do not move when the box does.
        let (shape, strides) = (holder.shape.as_mut_ptr(), holder.strides.as_mut_ptr());
        for t in [
            &mut holder.versioned.dl_tensor,
            &mut holder.legacy.dl_tensor,
        ] {
            t.shape = shape;
            t.strides = strides;
        }
        let holder = Box::into_raw(holder);
        // SAFETY: `holder` is a live box we just leaked; its address is the managers' context
        // and the deleters rebuild the box from it once.
        unsafe {
            (*holder).versioned.manager_ctx = holder.cast();
            (*holder).legacy.manager_ctx = holder.cast();
            Ok(DlpackTensor {
                raw: Raw::Versioned(NonNull::new_unchecked(&raw mut (*holder).versioned)),
                ours: Some(NonNull::new_unchecked(holder)),
            })
        }
    }
}
