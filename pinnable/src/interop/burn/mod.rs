//! burn: our loader as burn's `DataLoader`, and conversions between host tensors and burn's
//! [`TensorData`], the host-side form every burn backend creates tensors from.
//!
//! - [`BurnLoader`]: a [`Loader`](crate::loader::Loader) wherever burn takes
//!   `Arc<dyn DataLoader<O>>` — its `Learner` with `SupervisedTraining`, its `Evaluator` —
//!   with batches collated into pinned memory by our workers, in our order, resumable from our
//!   [`Position`](crate::loader::Position), split across devices with equal batch counts, and
//!   errors that name the failing sample. Only burn-core's data traits are needed (burn-core
//!   with `std` and `dataset`), not burn-train.
//! - [`to_burn_float`] / [`to_burn_int`]: a burn tensor on a burn device from a host tensor,
//!   for the function that turns our batch into burn's: burn gets the tensor's own (pinned)
//!   memory, with no copy on our side.
//! - [`Tensor::to_tensor_data`]: without a copy for a contiguous host tensor (burn's `Bytes`
//!   then share the tensor's memory, marked as pinned when it is registered with the driver,
//!   so burn's CUDA backend copies from it directly instead of staging it; a write on burn's
//!   side copies first), one copy for a strided view.
//! - [`Tensor::from_tensor_data`]: without a copy when the bytes are in host memory and aligned
//!   for their dtype (the tensor keeps burn's allocation), one copy otherwise.
//!
//! Every dtype here exists in burn. burn's `Flex32` comes in as `f32` (the same bytes), `bool`
//! stored as `u8` as `bool`, `bool` stored as `u32` with one copy; quantized data has no
//! counterpart and is an error.
//!
//! # Device batches and burn's CUDA backend
//!
//! On burn's CUDA backend, leave the loader on the host ([`Device::cpu`](crate::Device::cpu),
//! the default) and convert with [`to_burn_float`]: each batch is one pinned block, marked
//! pinned, which burn copies to the GPU on its own stream straight from the block (no staging
//! copy on either side), and keeps (its drop queue holds the bytes until a fence after the
//! copy) until the copy has run; the block then goes back to the loader's pool. That order is
//! checked on a GPU with burn's stream kept busy while the loader reuses its blocks
//! (`burn-cuda/tests/cuda.rs`). A batch our loader has already moved to a GPU cannot become a
//! burn tensor without going through the host: burn's CUDA backend (cubecl 0.11) creates
//! tensors only in memory its own pools allocate, and neither adopts memory allocated
//! elsewhere nor hands out the stream a copy into its memory would have to be ordered on.
//! Device tensors go through [`to_cpu`](crate::ToDevice::to_cpu) first, or stay with a
//! framework that takes DLPack (the `dlpack` feature).
//!
//! ```
//! use burn_tensor::TensorData;
//! use pinnable::{Pinnable, Tensor};
//!
//! let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?.pin_memory()?;
//! let data: TensorData = t.to_tensor_data()?; // shares the pinned bytes
//! assert_eq!(data.shape().as_slice(), &[2, 2]);
//! assert_eq!(data.as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
//! let back = Tensor::from_tensor_data(data)?;
//! assert_eq!(back.to_vec::<f32>()?, vec![1.0, 2.0, 3.0, 4.0]);
//! # Ok::<(), pinnable::Error>(())
//! ```

mod loader;
mod tensor;

pub use loader::BurnLoader;
pub use tensor::{to_burn_float, to_burn_int};

use std::sync::Arc;

use burn_tensor::{AllocationProperty, BoolStore, Bytes, DType as BurnDType, TensorData};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{AlignedCopy, HostBytes, Tensor};

fn error(message: impl Into<String>) -> Error {
    Error::Interop {
        library: "burn",
        message: message.into(),
    }
}

/// burn's dtype for one of ours (every dtype has one; `bool` is burn's native `bool`).
pub fn to_burn_dtype(dtype: DType) -> BurnDType {
    match dtype {
        DType::Bool => BurnDType::Bool(BoolStore::Native),
        DType::U8 => BurnDType::U8,
        DType::U16 => BurnDType::U16,
        DType::U32 => BurnDType::U32,
        DType::U64 => BurnDType::U64,
        DType::I8 => BurnDType::I8,
        DType::I16 => BurnDType::I16,
        DType::I32 => BurnDType::I32,
        DType::I64 => BurnDType::I64,
        DType::F16 => BurnDType::F16,
        DType::BF16 => BurnDType::BF16,
        DType::F32 => BurnDType::F32,
        DType::F64 => BurnDType::F64,
    }
}

/// Our dtype for burn's, for data stored with that dtype's width.
///
/// # Errors
///
/// [`Error::Interop`] for quantized data and for `bool` stored as `u32` (which
/// [`Tensor::from_tensor_data`] converts with a copy).
pub fn from_burn_dtype(dtype: BurnDType) -> Result<DType> {
    Ok(match dtype {
        BurnDType::Bool(BoolStore::Native | BoolStore::U8) => DType::Bool,
        BurnDType::U8 => DType::U8,
        BurnDType::U16 => DType::U16,
        BurnDType::U32 => DType::U32,
        BurnDType::U64 => DType::U64,
        BurnDType::I8 => DType::I8,
        BurnDType::I16 => DType::I16,
        BurnDType::I32 => DType::I32,
        BurnDType::I64 => DType::I64,
        BurnDType::F16 => DType::F16,
        BurnDType::BF16 => DType::BF16,
        BurnDType::F32 | BurnDType::Flex32 => DType::F32,
        BurnDType::F64 => DType::F64,
        other => {
            return Err(error(format!(
                "{other:?} has no dtype here; dequantize or convert it on burn's side first"
            )));
        }
    })
}

/// A contiguous host tensor's bytes, for burn's `Bytes` to share.
struct TensorBytes(Tensor);

impl AsRef<[u8]> for TensorBytes {
    fn as_ref(&self) -> &[u8] {
        let t = &self.0;
        match t.host_src("to_tensor_data") {
            // SAFETY: a contiguous host tensor (checked when made) holds `nbytes` bytes from
            // its first element, alive while `self` holds the tensor; nothing writes them
            // (a write through another handle goes to a private copy, since `self` shares the
            // storage), and the pending copy was waited for when made.
            Ok(src) => unsafe { std::slice::from_raw_parts(src.ptr, t.nbytes()) },
            Err(_) => &[],
        }
    }
}

/// burn's bytes, in host memory, viewed by a tensor.
struct BurnBytes(Bytes);

impl HostBytes for BurnBytes {
    fn host_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl Tensor {
    /// burn's [`TensorData`] with this host tensor's elements, shape and dtype: without a copy
    /// for a contiguous tensor (burn shares its memory), one copy for a strided view. Waits for
    /// a pending copy into the tensor first.
    ///
    /// # Errors
    ///
    /// [`Error::WrongPlacement`] for a device tensor (move it with
    /// [`to_cpu`](crate::ToDevice::to_cpu) first); [`Error::Interop`] if burn refuses the
    /// layout.
    pub fn to_tensor_data(&self) -> Result<TensorData> {
        let src = self.host_src("to_tensor_data")?;
        let t = if self.is_contiguous() {
            self.clone()
        } else {
            self.contiguous()?
        };
        drop(src);
        // Pinned only when registered with the driver: burn's CUDA backend then copies from
        // it directly instead of staging it through pinned memory of its own.
        let registered = t.source().memory.is_registered_pinned();
        let property = if registered {
            AllocationProperty::Pinned
        } else {
            AllocationProperty::Native
        };
        let shape = t.shape().to_vec();
        let dtype = to_burn_dtype(t.dtype());
        let bytes = Bytes::from_shared(bytes::Bytes::from_owner(TensorBytes(t)), property);
        TensorData::try_from_bytes(bytes, shape, dtype).map_err(|e| error(e.to_string()))
    }

    /// A pageable host tensor with `data`'s elements, shape and dtype: without a copy when its
    /// bytes are in host memory and aligned for the dtype, one copy otherwise.
    ///
    /// # Errors
    ///
    /// [`Error::Interop`] for quantized data, for bytes burn cannot read on the host, and for
    /// `bool` bytes other than 0 and 1.
    ///
    /// # Examples
    ///
    /// ```
    /// use burn_tensor::TensorData;
    /// use pinnable::{DType, Tensor};
    ///
    /// let t = Tensor::from_tensor_data(TensorData::new(vec![3i64, 1, 4], [3]))?;
    /// assert_eq!((t.dtype(), t.to_vec::<i64>()?), (DType::I64, vec![3, 1, 4]));
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn from_tensor_data(data: TensorData) -> Result<Tensor> {
        let shape = data.shape().as_slice().to_vec();
        let burn_dtype = data.dtype();
        if burn_dtype == BurnDType::Bool(BoolStore::U32) {
            let values = data
                .as_slice::<u32>()
                .map_err(|e| error(format!("cannot read bool stored as u32: {e}")))?;
            let bools: Vec<bool> = values.iter().map(|&v| v != 0).collect();
            return Tensor::from_vec(bools, &shape);
        }
        let dtype = from_burn_dtype(burn_dtype)?;
        let bytes = data.into_bytes();
        let in_memory = matches!(
            bytes.property(),
            AllocationProperty::Native | AllocationProperty::Pinned
        );
        let aligned = bytes.as_ptr().cast::<u8>().align_offset(dtype.size()) == 0;
        let owner: Arc<dyn HostBytes> = if in_memory && aligned {
            Arc::new(BurnBytes(bytes))
        } else {
            let read = bytes
                .read(Default::default())
                .map_err(|e| error(format!("cannot read burn's bytes on the host: {e}")))?;
            Arc::new(AlignedCopy::of(read))
        };
        Tensor::from_host_bytes(owner, dtype, &shape, 0).map_err(|e| match e {
            Error::Shape(m) => error(m),
            other => other,
        })
    }
}

impl TryFrom<&Tensor> for TensorData {
    type Error = Error;

    /// As [`Tensor::to_tensor_data`].
    fn try_from(t: &Tensor) -> Result<TensorData> {
        t.to_tensor_data()
    }
}

impl TryFrom<TensorData> for Tensor {
    type Error = Error;

    /// As [`Tensor::from_tensor_data`].
    fn try_from(data: TensorData) -> Result<Tensor> {
        Tensor::from_tensor_data(data)
    }
}
