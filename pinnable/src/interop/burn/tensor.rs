//! burn tensors of our host tensors, for the function that turns a batch into burn's.

use burn_tensor::{Device as BurnDevice, Int, TensorCreationOptions};

use super::{error, to_burn_dtype};
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;

/// burn's creation options for `t` on `device`: `t`'s dtype when `keep` says the kind holds
/// it, else the device's default dtype for the kind (burn converts).
fn options(t: &Tensor, device: &BurnDevice, keep: bool) -> TensorCreationOptions {
    let options = TensorCreationOptions::new(device.clone());
    if keep {
        options.with_dtype(to_burn_dtype(t.dtype()))
    } else {
        options
    }
}

/// Whether `dtype` is a float.
fn is_float(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
}

/// Refuses a tensor whose rank is not `D` (burn would panic).
fn check_rank<const D: usize>(t: &Tensor, call: &str) -> Result<()> {
    if t.shape().len() == D {
        return Ok(());
    }
    Err(error(format!(
        "{call}::<{D}> of a tensor of shape {:?} ({} dimensions); ask for {} dimensions or \
         reshape the tensor first",
        t.shape(),
        t.shape().len(),
        t.shape().len()
    )))
}

/// A burn float tensor on `device` with host tensor `t`'s elements, in `t`'s dtype when it is
/// a float (`f16`, `bf16`, `f32`, `f64`), else converted by burn to the device's float dtype.
///
/// Our side makes no copy of a contiguous tensor: burn receives the tensor's own (pinned)
/// memory as its [`TensorData`](burn_tensor::TensorData) ([`Tensor::to_tensor_data`]);
/// burn's CPU backend (`flex`) then reads that memory in place, so the burn tensor is the
/// batch's block itself, held until burn drops the tensor; burn's CUDA backend uploads it
/// straight from pinned memory, without staging it.
///
/// # Errors
///
/// [`Error::WrongPlacement`](crate::Error::WrongPlacement) for a device tensor (see the
/// [module docs](super) for device batches); [`Error::Interop`](crate::Error::Interop) if
/// the tensor does not have `D` dimensions.
pub fn to_burn_float<const D: usize>(
    t: &Tensor,
    device: &BurnDevice,
) -> Result<burn_tensor::Tensor<D>> {
    check_rank::<D>(t, "to_burn_float")?;
    let keep = is_float(t.dtype());
    let options = options(t, device, keep);
    Ok(burn_tensor::Tensor::from_data(t.to_tensor_data()?, options))
}

/// A burn int tensor on `device` with host tensor `t`'s elements, in `t`'s dtype when it is a
/// signed or unsigned integer, else converted by burn to the device's int dtype. No copy on
/// our side, as [`to_burn_float`] says.
///
/// # Errors
///
/// As [`to_burn_float`].
pub fn to_burn_int<const D: usize>(
    t: &Tensor,
    device: &BurnDevice,
) -> Result<burn_tensor::Tensor<D, Int>> {
    check_rank::<D>(t, "to_burn_int")?;
    let keep = !is_float(t.dtype()) && t.dtype() != DType::Bool;
    let options = options(t, device, keep);
    Ok(burn_tensor::Tensor::from_data(t.to_tensor_data()?, options))
}
