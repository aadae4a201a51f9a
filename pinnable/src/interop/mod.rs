//! Conversions to and from the libraries users already have, each behind its own cargo
//! feature (off by default; a feature that is off costs nothing):
//!
//! - `ndarray`: zero-copy [`ArrayViewD`](::ndarray::ArrayViewD) and
//!   [`ArrayViewMutD`](::ndarray::ArrayViewMutD) of host tensors (views included), writable
//!   arrays over a pinned batch being built, and tensors from owned arrays without a copy;
//! - `dlpack`: export to and import from DLPack, the C ABI PyTorch, JAX, CuPy and NumPy
//!   exchange tensors through, with the ready event honoured;
//! - `burn`: our loader as burn's `DataLoader` (burn's `Learner` trains on it), and
//!   conversions between host tensors and burn's `TensorData` and tensors;
//! - `candle` (host) and `candle-cuda` (device): conversions both ways with candle's tensors,
//!   and candle tensors as fields of a batch that moves with one `to_device`.
//!
//! Memory owned elsewhere is pinned and moved with the same building blocks every batch uses:
//! [`Tensor::from_host_bytes`](crate::Tensor::from_host_bytes) over a
//! [`HostBytes`](crate::HostBytes) owner, then [`PinContext::pin_tensor`](crate::PinContext::pin_tensor)
//! and [`MoveContext::move_tensor`](crate::MoveContext::move_tensor) inside the batch's walk.

#[cfg(feature = "burn")]
pub mod burn;
#[cfg(feature = "candle")]
pub mod candle;
#[cfg(feature = "dlpack")]
pub mod dlpack;
#[cfg(feature = "ndarray")]
pub mod ndarray;
