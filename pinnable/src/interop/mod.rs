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
//!
//! # Adding an integration
//!
//! An integration is a module here behind a cargo feature of its own (off by default, built and
//! tested by CI's every-feature steps), depending only on the crate's public surface:
//! - **A tensor type of another library as a batch field**: implement [`Pinnable`](crate::Pinnable)
//!   and [`ToDevice`](crate::ToDevice) for it (or give users a `#[pinnable(with = module)]`
//!   module), pinning through [`PinContext::pin_tensor`](crate::PinContext::pin_tensor) and
//!   moving through [`MoveContext::move_tensor`](crate::MoveContext::move_tensor), so its bytes
//!   share the batch's one reservation and ready event.
//! - **Conversions without a copy**: wrap the library's buffer as a
//!   [`HostBytes`](crate::HostBytes) owner and make a [`Tensor`](crate::Tensor) over it; the
//!   other way, hand out the tensor's bytes with the owner kept alive (as `dlpack` does).
//! - **Another framework's loader**: wrap a [`Loader`](crate::loader::Loader) (any
//!   [`Source`](crate::loader::Source)) and convert each batch, as `burn`'s
//!   `BurnLoader` does; the device stays the loader's, named once.

#[cfg(feature = "burn")]
pub mod burn;
#[cfg(feature = "candle")]
pub mod candle;
#[cfg(feature = "dlpack")]
pub mod dlpack;
#[cfg(feature = "ndarray")]
pub mod ndarray;
