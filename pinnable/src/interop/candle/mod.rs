//! candle: conversions between our tensors and [`candle_core::Tensor`], and (with the
//! `candle-cuda` feature) [`ToDevice`](crate::ToDevice) for candle tensors.
//!
//! On the host, candle keeps every CPU tensor in a `Vec` of its own, so a conversion either
//! way is one copy (strided views are gathered by that copy). On a device:
//!
//! - a derived batch of candle CPU tensors moves with one `to_device` to a [`Device`] made by
//!   [`Device::from_candle`]: one reservation, staged and copied together, each tensor landing
//!   in a device allocation of its own that candle then owns and frees; candle's stream waits
//!   for the copies (an event, not a device-wide sync), so candle ops queued afterwards read
//!   the data;
//! - [`Tensor::from_candle`] of a candle CUDA tensor is one device-to-device copy, made on
//!   candle's stream: after candle's earlier work and before its later work (its safe in-place
//!   writes included), which memory shared with candle could not be ordered against;
//! - [`Tensor::to_candle`] of a device tensor shares its memory when the tensor alone owns its
//!   allocation (a tensor moved on its own), and otherwise makes one device-to-device copy.
//!
//! candle has no `bool`, `u16`, `u64` or `i8` tensors, and we have none of candle's 8-bit and
//! smaller float types: converting those is an [`Error::Interop`].
//!
//! ```
//! # fn main() -> pinnable::Result<()> {
//! use pinnable::Tensor;
//! let ours = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! let theirs = ours.to_candle(&candle_core::Device::Cpu)?;
//! assert_eq!(theirs.to_vec2::<f32>().unwrap(), [[1.0, 2.0], [3.0, 4.0]]);
//! let back = Tensor::from_candle(&theirs.t().unwrap())?; // a strided view, gathered
//! assert_eq!(back.to_vec::<f32>()?, [1.0, 3.0, 2.0, 4.0]);
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "candle-cuda")]
mod cuda;

use std::mem::ManuallyDrop;
use std::sync::Arc;

use candle_core as candle;
use candle_core::backend::BackendStorage;

#[cfg(doc)]
use crate::cuda::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{External, HostBytes, Tensor};

fn error(message: impl Into<String>) -> Error {
    Error::Interop {
        library: "candle",
        message: message.into(),
    }
}

/// Our dtype for candle's, or an error naming what candle's has no counterpart here.
pub(crate) fn dtype_from_candle(d: candle::DType) -> Result<DType> {
    use candle::DType as C;
    Ok(match d {
        C::U8 => DType::U8,
        C::U32 => DType::U32,
        C::I16 => DType::I16,
        C::I32 => DType::I32,
        C::I64 => DType::I64,
        C::BF16 => DType::BF16,
        C::F16 => DType::F16,
        C::F32 => DType::F32,
        C::F64 => DType::F64,
        other => {
            return Err(error(format!(
                "candle's {other:?} tensors have no counterpart here; convert them with \
                 `to_dtype(DType::F32)` (or another dtype both sides have) first"
            )));
        }
    })
}

/// candle's dtype for ours.
pub(crate) fn dtype_to_candle(d: DType) -> Result<candle::DType> {
    use candle::DType as C;
    Ok(match d {
        DType::U8 => C::U8,
        DType::U32 => C::U32,
        DType::I16 => C::I16,
        DType::I32 => C::I32,
        DType::I64 => C::I64,
        DType::BF16 => C::BF16,
        DType::F16 => C::F16,
        DType::F32 => C::F32,
        DType::F64 => C::F64,
        other => {
            return Err(error(format!(
                "candle has no {other} tensors; convert to a dtype it has first (u8 for bool, \
                 u32 or i64 for the other integers)"
            )));
        }
    })
}

/// Calls `$f::<T>()` with the element type of our dtype `$d` (one candle also has).
macro_rules! with_elem {
    ($d:expr, $f:ident ( $($arg:expr),* )) => {
        match $d {
            $crate::DType::U8 => $f::<u8>($($arg),*),
            $crate::DType::U32 => $f::<u32>($($arg),*),
            $crate::DType::I16 => $f::<i16>($($arg),*),
            $crate::DType::I32 => $f::<i32>($($arg),*),
            $crate::DType::I64 => $f::<i64>($($arg),*),
            $crate::DType::BF16 => $f::<half::bf16>($($arg),*),
            $crate::DType::F16 => $f::<half::f16>($($arg),*),
            $crate::DType::F32 => $f::<f32>($($arg),*),
            $crate::DType::F64 => $f::<f64>($($arg),*),
            other => Err(error(format!("candle has no {other} tensors"))),
        }
    };
}
#[cfg(feature = "candle-cuda")]
pub(crate) use with_elem;

/// A candle tensor's storage, read-locked for as long as this value lives, so candle's
/// in-place ops (`slice_set`, `Var::set`) wait while we read it.
pub(crate) struct ReadLocked {
    /// Dropped first, explicitly, before the tensor that keeps its lock alive.
    guard: ManuallyDrop<candle::StorageRef<'static>>,
    _tensor: candle::Tensor,
}

impl ReadLocked {
    pub(crate) fn new(t: &candle::Tensor) -> ReadLocked {
        let tensor = t.clone();
        let (guard, _) = tensor.storage_and_layout();
        // SAFETY: the lock lives in the tensor's shared allocation, which `_tensor` keeps alive
        // (moving `_tensor` does not move it), and `drop` releases the guard before `_tensor`.
        let guard = unsafe {
            std::mem::transmute::<candle::StorageRef<'_>, candle::StorageRef<'static>>(guard)
        };
        ReadLocked {
            guard: ManuallyDrop::new(guard),
            _tensor: tensor,
        }
    }

    /// Identifies the storage: equal for every tensor over it (views included).
    #[cfg(feature = "candle-cuda")]
    pub(crate) fn storage_id(&self) -> usize {
        std::ptr::from_ref::<candle::Storage>(&self.guard).addr()
    }

    /// Our tensor over the locked CPU bytes with `t`'s layout (`t` is a tensor over this
    /// storage): read it only while `self` lives. `None` when the storage is not on the CPU.
    pub(crate) fn view(&self, t: &candle::Tensor) -> Result<Option<Tensor>> {
        let candle::Storage::Cpu(cpu) = &**self.guard else {
            return Ok(None);
        };
        let dtype = dtype_from_candle(t.dtype())?;
        let (ptr, len) = cpu_bytes(cpu)?;
        let owner = Arc::new(LockedBytes { ptr, len });
        let layout = t.layout();
        // Checked against the storage's bytes: candle's layout is not taken on trust.
        let offset = layout.start_offset().checked_mul(dtype.size());
        let view = offset
            .ok_or_else(|| "the start offset overflows".to_owned())
            .and_then(|at| {
                Tensor::over_host_bytes(
                    External::new(owner),
                    dtype,
                    layout.dims(),
                    layout.stride(),
                    at,
                )
            });
        view.map(Some).map_err(error)
    }
}

impl Drop for ReadLocked {
    fn drop(&mut self) {
        // SAFETY: dropped once, here, while `self._tensor` still keeps the lock alive.
        unsafe { ManuallyDrop::drop(&mut self.guard) };
    }
}

/// The bytes of a candle CPU storage.
fn cpu_bytes(s: &candle::CpuStorage) -> Result<(*const u8, usize)> {
    use candle::CpuStorage as S;
    fn raw<T>(v: &[T]) -> (*const u8, usize) {
        (v.as_ptr().cast(), std::mem::size_of_val(v))
    }
    Ok(match s {
        S::U8(v) => raw(v),
        S::U32(v) => raw(v),
        S::I16(v) => raw(v),
        S::I32(v) => raw(v),
        S::I64(v) => raw(v),
        S::BF16(v) => raw(v),
        S::F16(v) => raw(v),
        S::F32(v) => raw(v),
        S::F64(v) => raw(v),
        other => {
            dtype_from_candle(other.dtype())?;
            unreachable!("every other dtype is refused above")
        }
    })
}

/// Bytes of a candle CPU storage, valid while a [`ReadLocked`] over it lives: only the crate's
/// moves and conversions build tensors over them, and drop those tensors first.
struct LockedBytes {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the bytes are only read, under candle's read lock, from any thread.
unsafe impl Send for LockedBytes {}
// SAFETY: as for Send.
unsafe impl Sync for LockedBytes {}

impl HostBytes for LockedBytes {
    fn host_bytes(&self) -> &[u8] {
        // SAFETY: the storage is read-locked and alive while tensors over these bytes are
        // (see the type's comment).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Tensor {
    /// Our tensor with a candle tensor's values.
    ///
    /// A CPU tensor is copied once into pageable memory (a strided view is gathered by that
    /// copy). With the `candle-cuda` feature, a CUDA tensor is copied once on the device, on
    /// candle's stream: after the work candle queued before the call, and before anything it
    /// queues after (its safe in-place writes, which shared memory could not be ordered
    /// against). The copy is ours, writable, and its readers wait for it.
    ///
    /// # Errors
    ///
    /// [`Error::Interop`] for a dtype we lack, or a candle device other than CPU and CUDA;
    /// driver errors when sharing a CUDA tensor.
    pub fn from_candle(t: &candle::Tensor) -> Result<Tensor> {
        let locked = ReadLocked::new(t);
        if let Some(view) = locked.view(t)? {
            // The copy is made while the lock is held; the view dies with this scope.
            return view.contiguous_copy();
        }
        drop(locked);
        #[cfg(feature = "candle-cuda")]
        if let candle::Device::Cuda(_) = t.device() {
            return cuda::copy_candle(t);
        }
        Err(error(format!(
            "tensors on candle's {:?} device cannot be converted; move them to the CPU{} first",
            t.device().location(),
            if cfg!(feature = "candle-cuda") {
                " or to CUDA"
            } else {
                ""
            }
        )))
    }

    /// A candle tensor with this tensor's values, on candle's `device`; as
    /// [`into_candle`](Self::into_candle) of a clone, so a device tensor is copied.
    ///
    /// # Errors
    ///
    /// As [`into_candle`](Self::into_candle).
    pub fn to_candle(&self, device: &candle::Device) -> Result<candle::Tensor> {
        self.clone().into_candle(device)
    }

    /// A candle tensor with this tensor's values, on candle's `device`.
    ///
    /// To the CPU: a host tensor is copied once into a new `Vec` (a device tensor: move it
    /// with `to_cpu` first). With the `candle-cuda` feature, to a CUDA device: a host tensor
    /// is moved into an allocation candle then owns. A device tensor on that GPU that alone
    /// owns its allocation, from its first byte (a tensor moved by itself, with no clone or
    /// view left), is handed over without a copy; any other is copied once on the device.
    /// Either way candle's stream waits for our copies, not the whole device.
    ///
    /// # Errors
    ///
    /// [`Error::Interop`] for a dtype candle lacks or a device pairing that is not supported;
    /// [`Error::WrongPlacement`] for a device tensor asked for
    /// on the CPU; driver and memory errors.
    pub fn into_candle(self, device: &candle::Device) -> Result<candle::Tensor> {
        let dtype = dtype_to_candle(self.dtype())?;
        match device {
            candle::Device::Cpu => {
                fn to_vec<T: crate::dtype::Element + candle::WithDType>(
                    t: &Tensor,
                ) -> Result<candle::Tensor> {
                    candle::Tensor::from_vec(t.to_vec::<T>()?, t.shape(), &candle::Device::Cpu)
                        .map_err(|e| error(e.to_string()))
                }
                let out = with_elem!(self.dtype(), to_vec(&self))?;
                debug_assert_eq!(out.dtype(), dtype);
                Ok(out)
            }
            #[cfg(feature = "candle-cuda")]
            candle::Device::Cuda(dev) => cuda::into_candle_cuda(self, dev),
            other => Err(error(format!(
                "candle's {:?} device is not supported{}",
                other.location(),
                if cfg!(feature = "candle-cuda") {
                    ""
                } else {
                    "; CUDA needs the `candle-cuda` feature"
                }
            ))),
        }
    }
}
