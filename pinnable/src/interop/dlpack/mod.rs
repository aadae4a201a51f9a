//! DLPack: hand tensors to PyTorch, JAX, CuPy, NumPy or C++ code without a copy, and take
//! theirs.
//!
//! **Export.** [`Tensor::to_dlpack`](crate::Tensor::to_dlpack) wraps a host tensor (pageable or pinned, exported as
//! `kDLCPU`, what PyTorch does for its own pinned tensors) or a device tensor (`kDLCUDA`) in a
//! [`DlpackTensor`], strided views with their strides. The result holds a clone of the tensor,
//! so the memory stays alive until the consumer calls the deleter. The export is marked
//! read-only: our tensors share memory copy-on-write, and a write through the consumer would
//! reach every tensor sharing it (consumers without read-only tensors, PyTorch among them,
//! share the memory anyway; write through this crate's own API instead).
//!
//! **The ready event.** Nobody reads half-copied data, and nobody reads freed memory:
//! - a host export ([`Tensor::to_dlpack`](crate::Tensor::to_dlpack)) first waits on the host
//!   for the copy that fills the tensor;
//! - a device export names the stream its consumer works on:
//!   [`Tensor::to_dlpack_on`](crate::Tensor::to_dlpack_on) (or
//!   [`Tensor::to_dlpack_on_raw`](crate::Tensor::to_dlpack_on_raw), for the `stream` argument
//!   of Python's `__dlpack__`) does not block: it makes the *consumer's* stream wait for the
//!   copy, and when the consumer calls the deleter it records that stream's work as a reader,
//!   so the memory is not freed or reused before the kernels the consumer queued on that stream
//!   are done. `to_dlpack` refuses a device tensor: with no stream named, nothing could order
//!   the free after the consumer's kernels.
//!
//! The consumer must call the deleter only once it no longer uses the memory (the DLPack
//! contract), and order work it queued on other streams before the stream it named.
//!
//! **Import.** [`Tensor::from_dlpack`](crate::Tensor::from_dlpack) takes a [`DlpackTensor`] another library produced:
//! - host memory (`kDLCPU`, `kDLCUDAHost`) becomes a read-only host tensor over it, without a
//!   copy (through [`HostBytes`](crate::HostBytes)), strided when the producer's strides are;
//!   it pins and moves like any tensor, and a write goes to a private copy;
//! - CUDA memory (`kDLCUDA`) becomes a device tensor over it, without a copy. The producer's
//!   pending work must be ordered before the device's copy stream ([`Device::copy_stream`](crate::Device::copy_stream)):
//!   pass that stream as the consumer stream when asking the producer for the tensor (Python:
//!   `x.__dlpack__(stream=...)`), or synchronize the producer first. The import records the copy
//!   stream as the tensor's ready event, so every later reader waits for that point. When the
//!   last tensor over the memory is dropped, it waits on the host for its readers and then calls
//!   the producer's deleter;
//!   Such a tensor is read-only here: [`Tensor::cuda_view_mut`](crate::Tensor::cuda_view_mut)
//!   refuses it, as the producer may still read the memory;
//! - a tensor this crate exported comes back as the tensor it was (sharing its storage, so the
//!   usual rules decide whether a write happens in place);
//! - negative strides, vector lanes, dtypes without a counterpart (complex, fp8, ...) and `bool`
//!   tensors on a device (whose bytes cannot be checked to be 0 or 1) are errors, and the
//!   producer's deleter is called.
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

mod export;
pub mod ffi;
mod import;

use export::Holder;

use std::ptr::NonNull;

use crate::dtype::DType;
use crate::error::{Error, Result};
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

/// An owned DLPack managed tensor: one this crate exported, or one another library produced.
/// Dropping it calls the producer's deleter.
///
/// Hand it to a consumer with [`into_raw_versioned`](Self::into_raw_versioned) (DLPack 1.x,
/// the Python capsule named `dltensor_versioned`) or [`into_raw_legacy`](Self::into_raw_legacy)
/// (the unversioned `dltensor`); take one in with [`from_raw_versioned`](Self::from_raw_versioned)
/// or [`from_raw_legacy`](Self::from_raw_legacy), then [`Tensor::from_dlpack`](crate::Tensor::from_dlpack).
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
