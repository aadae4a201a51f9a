//! DLPack: hand tensors to PyTorch, JAX, CuPy, NumPy or C++ code without a copy, and take
//! theirs.
//!
//! **Export.** [`Tensor::to_dlpack`] wraps a host tensor (pageable or pinned, exported as
//! `kDLCPU`, what PyTorch does for its own pinned tensors) or a device tensor (`kDLCUDA`) in a
//! [`DlpackTensor`], strided views with their strides. The result holds a clone of the tensor,
//! so the memory stays alive until the consumer calls the deleter. The export is marked
//! read-only: our tensors share memory copy-on-write, and a write through the consumer would
//! reach every tensor sharing it (consumers without read-only tensors, PyTorch among them,
//! share the memory anyway; write through this crate's own API instead).
//!
//! **The ready event.** Nobody reads half-copied data:
//! - a host export, and a device export through [`Tensor::to_dlpack`], first wait on the host
//!   for the copy that fills the tensor;
//! - a device export through [`Tensor::to_dlpack_on`] (or [`Tensor::to_dlpack_on_raw`], for the
//!   `stream` argument of Python's `__dlpack__`) does not block: it makes the *consumer's*
//!   stream wait for the copy, and when the consumer calls the deleter it records that stream's
//!   work as a reader, so the memory is not reused before the kernels the consumer queued on
//!   that stream are done.
//!
//! The consumer must call the deleter only once it no longer uses the memory (the DLPack
//! contract); work it queued on streams other than the one named at export is not tracked.
//!
//! **Import.** [`Tensor::from_dlpack`] takes a [`DlpackTensor`] another library produced:
//! - host memory (`kDLCPU`, `kDLCUDAHost`) becomes a read-only host tensor over it, without a
//!   copy (through [`HostBytes`]), strided when the producer's strides are;
//!   it pins and moves like any tensor, and a write goes to a private copy;
//! - CUDA memory (`kDLCUDA`) becomes a device tensor over it, without a copy. The producer's
//!   pending work must be ordered before the device's copy stream ([`Device::copy_stream`]):
//!   pass that stream as the consumer stream when asking the producer for the tensor (Python:
//!   `x.__dlpack__(stream=...)`), or synchronize the producer first. The import records the copy
//!   stream as the tensor's ready event, so every later reader waits for that point. When the
//!   last tensor over the memory is dropped, it waits on the host for its readers and then calls
//!   the producer's deleter;
//! - negative strides, vector lanes and dtypes without a counterpart (complex, fp8, ...) are
//!   errors, and the producer's deleter is called.
//!
//! ```
//! use pinnable::Tensor;
//!
//! let t = Tensor::from_vec((0..6i32).collect(), &[2, 3])?.transpose(0, 1)?;
//! let dl = t.to_dlpack()?;
//! assert_eq!(dl.shape(), &[3, 2]);
//! assert_eq!(dl.strides(), Some(&[1i64, 3][..]));
//! let raw = dl.into_raw_versioned()?; // what a consumer (a Python capsule) takes
//! // ... and back, as a consumer would:
//! // SAFETY: `raw` came from `into_raw_versioned` and nothing writes its data.
//! let back = Tensor::from_dlpack(unsafe { pinnable::interop::dlpack::DlpackTensor::from_raw_versioned(raw)? })?;
//! assert_eq!(back.to_vec::<i32>()?, vec![0, 3, 1, 4, 2, 5]);
//! # Ok::<(), pinnable::Error>(())
//! ```

pub mod ffi;

use std::any::Any;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaStream, sys};

use crate::cuda::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{Data, DeviceBuffer, HostBuf, HostBytes, Storage, Tensor, contiguous_strides};
use ffi::{
    DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor,
};

fn error(message: impl Into<String>) -> Error {
    Error::Interop {
        library: "dlpack",
        message: message.into(),
    }
}

/// The DLPack type of a dtype (every dtype has one).
pub fn to_dl_dtype(dtype: DType) -> DLDataType {
    let (code, bits) = match dtype {
        DType::Bool => (ffi::KDL_BOOL, 8),
        DType::U8 => (ffi::KDL_UINT, 8),
        DType::U16 => (ffi::KDL_UINT, 16),
        DType::U32 => (ffi::KDL_UINT, 32),
        DType::U64 => (ffi::KDL_UINT, 64),
        DType::I8 => (ffi::KDL_INT, 8),
        DType::I16 => (ffi::KDL_INT, 16),
        DType::I32 => (ffi::KDL_INT, 32),
        DType::I64 => (ffi::KDL_INT, 64),
        DType::F16 => (ffi::KDL_FLOAT, 16),
        DType::BF16 => (ffi::KDL_BFLOAT, 16),
        DType::F32 => (ffi::KDL_FLOAT, 32),
        DType::F64 => (ffi::KDL_FLOAT, 64),
    };
    DLDataType {
        code,
        bits,
        lanes: 1,
    }
}

/// The dtype of a DLPack type.
///
/// # Errors
///
/// [`Error::Interop`] for vector types (`lanes` other than 1) and types without a dtype here
/// (complex, fp8, fp6, fp4, opaque handles, odd widths).
pub fn from_dl_dtype(t: DLDataType) -> Result<DType> {
    if t.lanes != 1 {
        return Err(error(format!(
            "vector elements ({} lanes of {} bits) have no dtype here; only scalars do",
            t.lanes, t.bits
        )));
    }
    Ok(match (t.code, t.bits) {
        (ffi::KDL_BOOL, 8) => DType::Bool,
        (ffi::KDL_UINT, 8) => DType::U8,
        (ffi::KDL_UINT, 16) => DType::U16,
        (ffi::KDL_UINT, 32) => DType::U32,
        (ffi::KDL_UINT, 64) => DType::U64,
        (ffi::KDL_INT, 8) => DType::I8,
        (ffi::KDL_INT, 16) => DType::I16,
        (ffi::KDL_INT, 32) => DType::I32,
        (ffi::KDL_INT, 64) => DType::I64,
        (ffi::KDL_FLOAT, 16) => DType::F16,
        (ffi::KDL_BFLOAT, 16) => DType::BF16,
        (ffi::KDL_FLOAT, 32) => DType::F32,
        (ffi::KDL_FLOAT, 64) => DType::F64,
        (code, bits) => {
            let name = match code {
                ffi::KDL_COMPLEX => "complex",
                ffi::KDL_FLOAT | ffi::KDL_BFLOAT => "floating-point",
                ffi::KDL_INT | ffi::KDL_UINT => "integer",
                ffi::KDL_BOOL => "bool",
                7..=17 => "fp8/fp6/fp4",
                _ => "unknown",
            };
            return Err(error(format!(
                "{bits}-bit {name} elements (type code {code}) have no dtype here"
            )));
        }
    })
}

/// The consumer's stream that a device export is ordered on.
enum Consumer {
    /// The export waited on the host; nothing to record at the end.
    Host,
    Stream(Arc<CudaStream>),
    /// A stream another library owns (kept valid by the caller of `to_dlpack_on_raw`).
    Raw(sys::CUstream),
}

/// What one export keeps alive: both managed structs (the consumer gets one), the shape and
/// strides they point at, and the tensor.
struct Holder {
    versioned: DLManagedTensorVersioned,
    legacy: DLManagedTensor,
    shape: Vec<i64>,
    strides: Vec<i64>,
    tensor: Tensor,
    consumer: Consumer,
}

impl Drop for Holder {
    fn drop(&mut self) {
        let Data::Device(buf) = &self.tensor.storage().data else {
            return;
        };
        // The consumer is done: its stream's work so far is the last use of the memory.
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

/// An owned DLPack managed tensor: one this crate exported, or one another library produced.
/// Dropping it calls the producer's deleter.
///
/// Hand it to a consumer with [`into_raw_versioned`](Self::into_raw_versioned) (DLPack 1.x,
/// the Python capsule named `dltensor_versioned`) or [`into_raw_legacy`](Self::into_raw_legacy)
/// (the unversioned `dltensor`); take one in with [`from_raw_versioned`](Self::from_raw_versioned)
/// or [`from_raw_legacy`](Self::from_raw_legacy), then [`Tensor::from_dlpack`].
pub struct DlpackTensor {
    raw: Raw,
    /// Set for our own exports, which carry both forms.
    ours: Option<NonNull<Holder>>,
}

enum Raw {
    Versioned(NonNull<DLManagedTensorVersioned>),
    Legacy(NonNull<DLManagedTensor>),
}

// SAFETY: an exported holder owns a tensor (Send + Sync) and plain data; for a foreign one,
// `from_raw_*`'s callers promise that its deleter may run on any thread and that nobody writes
// the data while we hold it, so sharing it is sharing read-only memory.
unsafe impl Send for DlpackTensor {}
// SAFETY: as for Send; `&DlpackTensor` only reads.
unsafe impl Sync for DlpackTensor {}

impl DlpackTensor {
    /// Takes ownership of a versioned managed tensor (DLPack 1.x).
    ///
    /// # Errors
    ///
    /// [`Error::Interop`] for a null pointer, or for a major version other than
    /// [`ffi::DLPACK_MAJOR_VERSION`], whose layout past `flags` is unknown: its deleter is
    /// called then, as the DLPack spec asks.
    ///
    /// # Safety
    ///
    /// 1. `managed` points to a valid `DLManagedTensorVersioned` that the caller owns and hands
    ///    over: it is not used afterwards except through the result, and its deleter is called
    ///    once, by the result, from any thread.
    /// 2. Its shape and strides hold `ndim` entries; for host memory, every byte from the first
    ///    element to the last is readable for as long as the result (or a tensor made from it)
    ///    lives; for device memory, the same on its device.
    /// 3. Nobody writes the data while the result, or a tensor made from it, lives.
    pub unsafe fn from_raw_versioned(managed: *mut DLManagedTensorVersioned) -> Result<Self> {
        let p = NonNull::new(managed)
            .ok_or_else(|| error("a null DLManagedTensorVersioned pointer"))?;
        // SAFETY: a valid managed tensor (caller); `version` and `deleter` sit before `flags`,
        // which every version keeps in place.
        let version = unsafe { p.as_ref() }.version;
        let dl = DlpackTensor {
            raw: Raw::Versioned(p),
            ours: None,
        };
        if version.major != ffi::DLPACK_MAJOR_VERSION {
            drop(dl); // calls the deleter
            return Err(error(format!(
                "DLPack {}.{} is not supported; only {}.x is",
                version.major,
                version.minor,
                ffi::DLPACK_MAJOR_VERSION
            )));
        }
        Ok(dl)
    }

    /// Takes ownership of a legacy, unversioned managed tensor.
    ///
    /// # Errors
    ///
    /// [`Error::Interop`] for a null pointer.
    ///
    /// # Safety
    ///
    /// As for [`from_raw_versioned`](Self::from_raw_versioned), for a `DLManagedTensor`.
    pub unsafe fn from_raw_legacy(managed: *mut DLManagedTensor) -> Result<Self> {
        NonNull::new(managed)
            .map(|p| DlpackTensor {
                raw: Raw::Legacy(p),
                ours: None,
            })
            .ok_or_else(|| error("a null DLManagedTensor pointer"))
    }

    /// Gives up ownership: the versioned managed tensor for a consumer, which must call its
    /// deleter once.
    ///
    /// # Errors
    ///
    /// [`Error::Interop`] for a legacy tensor another library produced (it has no versioned
    /// form); it is dropped, calling its deleter.
    pub fn into_raw_versioned(self) -> Result<*mut DLManagedTensorVersioned> {
        let out = match (&self.raw, self.ours) {
            (Raw::Versioned(p), _) => p.as_ptr(),
            // SAFETY: our holder, alive until a deleter runs; `self` is forgotten below.
            (Raw::Legacy(_), Some(h)) => unsafe { &raw mut (*h.as_ptr()).versioned },
            (Raw::Legacy(_), None) => {
                return Err(error(
                    "a legacy DLManagedTensor from another library has no versioned form",
                ));
            }
        };
        std::mem::forget(self);
        Ok(out)
    }

    /// Gives up ownership: the legacy, unversioned managed tensor for a consumer that only
    /// knows that form, which must call its deleter once.
    ///
    /// # Errors
    ///
    /// [`Error::Interop`] for a versioned tensor another library produced; it is dropped,
    /// calling its deleter.
    pub fn into_raw_legacy(self) -> Result<*mut DLManagedTensor> {
        let out = match (&self.raw, self.ours) {
            (Raw::Legacy(p), _) => p.as_ptr(),
            // SAFETY: our holder, alive until a deleter runs; `self` is forgotten below.
            (Raw::Versioned(_), Some(h)) => unsafe { &raw mut (*h.as_ptr()).legacy },
            (Raw::Versioned(_), None) => {
                return Err(error(
                    "a versioned DLManagedTensorVersioned from another library has no legacy form",
                ));
            }
        };
        std::mem::forget(self);
        Ok(out)
    }

    /// The DLPack version, `None` for a legacy tensor.
    pub fn version(&self) -> Option<DLPackVersion> {
        match self.raw {
            // SAFETY: valid while `self` owns it.
            Raw::Versioned(p) => Some(unsafe { p.as_ref() }.version),
            Raw::Legacy(_) => None,
        }
    }

    /// The `FLAG_*` bits (0 for a legacy tensor).
    pub fn flags(&self) -> u64 {
        match self.raw {
            // SAFETY: valid while `self` owns it.
            Raw::Versioned(p) => unsafe { p.as_ref() }.flags,
            Raw::Legacy(_) => 0,
        }
    }

    /// The tensor description.
    pub fn dl_tensor(&self) -> &DLTensor {
        // SAFETY: valid while `self` owns it.
        unsafe {
            match self.raw {
                Raw::Versioned(p) => &p.as_ref().dl_tensor,
                Raw::Legacy(p) => &p.as_ref().dl_tensor,
            }
        }
    }

    /// The sizes (empty when the tensor is malformed: a negative `ndim` or no shape).
    pub fn shape(&self) -> &[i64] {
        let t = self.dl_tensor();
        // SAFETY: `from_raw_*`'s callers promise `ndim` entries (our exports have them).
        unsafe { raw_slice(t.shape, t.ndim) }.unwrap_or(&[])
    }

    /// The strides in elements, `None` when the producer gave none (row-major).
    pub fn strides(&self) -> Option<&[i64]> {
        let t = self.dl_tensor();
        // SAFETY: as in `shape`.
        unsafe { raw_slice(t.strides, t.ndim) }
    }

    /// Where the data lives.
    pub fn device(&self) -> DLDevice {
        self.dl_tensor().device
    }
}

/// `ndim` entries at `ptr`, or `None` for a null pointer or a negative count.
///
/// # Safety
///
/// 1. A non-null `ptr` points to `ndim` readable `i64`s that outlive `'a`.
unsafe fn raw_slice<'a>(ptr: *const i64, ndim: i32) -> Option<&'a [i64]> {
    let n = usize::try_from(ndim).ok()?;
    if n == 0 {
        return Some(&[]);
    }
    // SAFETY: non-null (checked) and `n` entries (caller).
    (!ptr.is_null()).then(|| unsafe { std::slice::from_raw_parts(ptr, n) })
}

impl Drop for DlpackTensor {
    fn drop(&mut self) {
        // SAFETY: we own the tensor (`from_raw_*` or our export): its deleter runs once, here.
        unsafe {
            match self.raw {
                Raw::Versioned(p) => {
                    if let Some(d) = p.as_ref().deleter {
                        d(p.as_ptr());
                    }
                }
                Raw::Legacy(p) => {
                    if let Some(d) = p.as_ref().deleter {
                        d(p.as_ptr());
                    }
                }
            }
        }
    }
}

impl std::fmt::Debug for DlpackTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DlpackTensor")
            .field("version", &self.version())
            .field("device", &self.device())
            .field("dtype", &self.dl_tensor().dtype)
            .field("shape", &self.shape())
            .field("strides", &self.strides())
            .finish()
    }
}

impl Tensor {
    /// Exports the tensor as DLPack, without a copy. Waits on the host for a pending copy
    /// into the tensor first, so any consumer, on any stream, reads complete data.
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] if the pending copy failed.
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
        if !matches!(self.storage().data, Data::Device(_)) {
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
        if !matches!(self.storage().data, Data::Device(_)) {
            return self.to_dlpack();
        }
        if let Some(e) = self.storage().ready_event() {
            // SAFETY: a stream of this device (caller).
            unsafe { e.wait_on_raw(stream)? };
        }
        self.export(Consumer::Raw(stream))
    }

    fn export(&self, consumer: Consumer) -> Result<DlpackTensor> {
        let (device, first) = match &self.storage().data {
            Data::Device(buf) => (
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
            tensor: self.clone(),
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

    /// A tensor over a DLPack tensor's memory, without a copy; see the [module docs](self) for
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
                    let storage = Storage::new(Data::Host(HostBuf::zeroed(0)));
                    return Tensor::from_storage(storage, dtype, &shape);
                }
                let owner = ForeignHost {
                    ptr: first as *const u8,
                    len: span,
                    _dl: dl,
                };
                if dtype == DType::Bool {
                    check_bools(owner.host_bytes(), &shape, &strides)?;
                }
                let storage = Arc::new(Storage::new(Data::External(Arc::new(owner))));
                Ok(Tensor::from_parts(storage, dtype, &shape, &strides, 0))
            }
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
                let storage = Storage::part(Data::Device(Arc::new(buf)), Some(ready));
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

/// Checks that every element a bool view reaches is 0 or 1.
fn check_bools(bytes: &[u8], shape: &[usize], strides: &[usize]) -> Result<()> {
    let mut idx = vec![0usize; shape.len()];
    let mut at = 0usize;
    loop {
        if bytes.get(at).is_none_or(|&b| b > 1) {
            return Err(error("bool elements must be 0 or 1"));
        }
        let mut d = shape.len();
        loop {
            if d == 0 {
                return Ok(());
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
