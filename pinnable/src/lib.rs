//! Pin custom training batches in page-locked host memory and move them to CUDA devices with
//! stream-ordered copies.
//!
//! ```
//! use std::collections::HashMap;
//! use pinnable::{Pinnable, Tensor, ToDevice};
//!
//! #[derive(Pinnable, ToDevice)]
//! struct Batch {
//!     images: Tensor,
//!     labels: Tensor,
//!     masks: Option<Vec<Tensor>>,
//!     extra: HashMap<String, Tensor>,
//!     ids: Vec<String>,
//! }
//!
//! let batch = Batch {
//!     images: Tensor::from_vec(vec![0.25f32; 2 * 3 * 4 * 4], &[2, 3, 4, 4])?,
//!     labels: Tensor::from_vec(vec![3i64, 7], &[2])?,
//!     masks: Some(vec![Tensor::from_vec(vec![true; 16], &[4, 4])?]),
//!     extra: HashMap::new(),
//!     ids: vec!["a".into(), "b".into()],
//! };
//! let pinned = batch.pin_memory()?;
//! assert!(pinned.images.is_pinned() && pinned.labels.is_pinned());
//! if let Ok(device) = pinnable::Device::cuda(0) {
//!     let on_gpu = pinned.to_device(&device, true)?;
//!     assert_eq!(on_gpu.labels.placement(), pinnable::Placement::Cuda(0));
//! }
//! # Ok::<(), pinnable::Error>(())
//! ```
//!
//! **Soundness.** No safe call can cause undefined behaviour, read out of bounds, or race the
//! GPU: tensors share memory copy-on-write, every asynchronous copy carries a ready event that
//! readers wait for, memory is freed only after its recorded readers, device views are ordered
//! on the one stream they were made for, and the cudarc handles users get keep cudarc's own
//! ordering. The [safety chapter](guide::safety) of the guide states the contract for users and
//! what each `unsafe` function asks; `SAFETY.md`, at the root of the repository, is the audit.
//!
//! **The derives.** `#[derive(Pinnable, ToDevice)]` walks every field with its path, so an
//! error names where it happened (`batch.extra["mask"]`, `Sample::Pair.1`). Every field's type
//! must implement the trait; a field that does not is a compile error at that field. Attributes,
//! all under `#[pinnable(...)]`:
//! - on a field: `skip` (cloned unchanged: needs `Clone`, not the trait); `with = module` (the
//!   field is pinned and moved by `module::pin_with(&T, &mut PinContext) -> Result<T>` and
//!   `module::to_device_with(&T, &mut MoveContext) -> Result<T>`: a foreign type you cannot
//!   implement the traits for); `bound = "..."` (replaces the bounds inferred from this field);
//! - on the type: `bound = "..."` (replaces every inferred bound); `crate = path` (where
//!   `pinnable` is, when it is re-exported under another name).
//!
//! Bounds are inferred only for type parameters that non-skipped fields use (`PhantomData`
//! exempt). Misuse is a compile error at the offending tokens, all reported together.
//!
//! ```
//! use std::marker::PhantomData;
//! use pinnable::{Pinnable, Tensor, ToDevice};
//!
//! /// A type of another crate: no `Pinnable` impl of its own.
//! pub struct Labels(pub Tensor);
//!
//! mod labels {
//!     use pinnable::{MoveContext, PinContext, Pinnable, Result, ToDevice};
//!
//!     pub fn pin_with(l: &super::Labels, cx: &mut PinContext<'_>) -> Result<super::Labels> {
//!         Ok(super::Labels(l.0.pin_with(cx)?))
//!     }
//!
//!     pub fn to_device_with(l: &super::Labels, cx: &mut MoveContext<'_>) -> Result<super::Labels> {
//!         Ok(super::Labels(l.0.to_device_with(cx)?))
//!     }
//! }
//!
//! #[derive(Pinnable, ToDevice)]
//! struct Batch<T, M> {
//!     inputs: Vec<T>,                 // infers `T: Pinnable` (and `T: ToDevice`)
//!     #[pinnable(with = labels)]
//!     labels: Labels,
//!     #[pinnable(skip, bound = "M: Clone")]
//!     meta: M,                        // cloned; needs `M: Clone`, not `M: Pinnable`
//!     marker: PhantomData<fn() -> T>, // no bound from `PhantomData`
//! }
//!
//! fn main() -> pinnable::Result<()> {
//!     let batch = Batch {
//!         inputs: vec![Tensor::from_vec1(vec![1.0f32, 2.0])],
//!         labels: Labels(Tensor::from_vec1(vec![7i64])),
//!         meta: "epoch 3".to_string(),
//!         marker: PhantomData,
//!     };
//!     let pinned = batch.pin_memory()?;
//!     assert!(pinned.inputs[0].is_pinned() && pinned.labels.0.is_pinned());
//!     assert_eq!(pinned.meta, "epoch 3");
//!     Ok(())
//! }
//! ```
//!
//! **Where things are.** Every public item has exactly one path. The core types sit at the
//! root, in the order a batch meets them:
//! - [`Tensor`] (dense, strided, dtype-tagged; [`DType`], [`Element`], [`Placement`]) and the
//!   dense-CPU check every pinned tensor passes ([`dense_cpu`], [`TensorMeta`]);
//! - [`BatchLayout`] and [`PinnedBatch`]: batches built in place in one pinned block;
//! - the [`Pinnable`] and [`ToDevice`] traits, their contexts ([`PinContext`], [`MoveContext`])
//!   and the field paths errors name ([`FieldPath`]: `batch.masks[2]`);
//! - [`PinnedPool`]: the caching pinned host allocator ([`PoolConfig`], [`PoolStats`]);
//! - [`Device`] and [`Event`]: driver availability ([`Device::is_available`]), devices, copy
//!   streams and events;
//! - [`ToDevices`]: one batch to several devices, pinned once;
//! - [`Gather`]: rows or windows of a pinned (or device) dataset, stacked on the device by the
//!   gather kernels or the copy engine, with no collation on the host, and [`Convert`]ed on the
//!   way (u8 pixels to normalised f32, u16 tokens to i64);
//! - [`Error`]: the one error type.
//!
//! Five namespaces hold the concepts with many items of their own:
//! - [`loader`]: a prefetching loader — datasets in, batches collated into pinned memory and
//!   moved to the device by worker threads out;
//! - [`storage`]: bytes by path or URL: local files (positioned reads; mapping only through
//!   `unsafe` `open_mapped`) and, with the `remote` feature, S3 and HTTP(S); one
//!   [`Storage`](storage::Storage) of read settings that every format's `open_with` takes;
//! - [`formats`]: the files the loader reads, one module each: `.npy` arrays, token shards and
//!   packed documents, WebDataset tar shards, and (the `image` feature) JPEG and PNG images
//!   decoded on the host or the GPU, each from a path or a URL;
//! - [`interop`]: ndarray, DLPack, burn and candle, each behind its own cargo feature;
//! - [`numa`]: which memory node a GPU's pinned memory and staging threads belong on.
//!
//! The [`guide`] (modules with no items) explains each job's knobs, every error, resume and
//! ranks, the safety contract and performance tuning.

#![warn(missing_docs)]
// On docs.rs (nightly), items behind a cargo feature show the feature they need.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod alloc;
mod batch;
mod check;
mod convert;
mod copy;
mod cuda;
mod dtype;
mod error;
mod fanout;
pub mod formats;
mod gather;
pub mod guide;
mod hash;
mod impls;
pub mod interop;
pub mod loader;
pub mod numa;
mod path;
mod pieces;
mod pin;
pub mod storage;
mod tensor;
mod transfer;

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod test_seed;

pub use alloc::{
    BackendChoice, BackendKind, Fence, PinnedBlock, PinnedPool, PoolConfig, PoolStats,
};
pub use batch::{BatchLayout, PinnedBatch, Slot, TensorMut};
pub use check::{TensorLayout, TensorMeta, dense_cpu};
pub use convert::Convert;
pub use copy::copy_threads;
pub use cuda::{Device, Event};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use fanout::{FanoutRoute, ToDevices};
pub use gather::Gather;
pub use path::{FieldPath, Segment, Walk};
pub use pieces::GatherRoute;
pub use pin::{PinContext, Pinnable};
pub use tensor::{DeviceView, DeviceViewMut, HostBytes, Placement, Tensor};
pub use transfer::{MoveContext, ToDevice};

/// `#[derive(Pinnable)]`: see the `pinnable-derive` crate.
#[cfg(feature = "derive")]
pub use pinnable_derive::{Pinnable, ToDevice};

/// What the derive's generated code names. Not public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::error::Result;
    pub use crate::path::Walk;
    pub use crate::pin::{PinContext, Pinnable};
    pub use crate::transfer::{MoveContext, ToDevice};
    pub use core::clone::Clone;
    pub use core::result::Result::{Err, Ok};
}

/// The README's code blocks, compiled and run as doc tests. Its blocks use `image`, `remote` and
/// `dlpack` and carry no `cfg` lines (each is a program a user pastes into a new crate), so
/// they run where those features are on: CI's every-feature `cargo test`.
#[cfg(all(doctest, feature = "image", feature = "remote", feature = "dlpack"))]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
