//! `#[derive(Pinnable)]` and `#[derive(ToDevice)]` for
//! [`pinnable`](https://docs.rs/pinnable): the recursive impls that pin a batch in page-locked
//! memory or move it to a device, field by field. Use them through `pinnable`, which
//! re-exports both.
//!
//! ```ignore
//! use std::collections::HashMap;
//! use pinnable::{Pinnable, Tensor, ToDevice};
//!
//! #[derive(Pinnable, ToDevice)]
//! struct Batch {
//!     images: Tensor,
//!     masks: Option<Vec<Tensor>>,
//!     extra: HashMap<String, Tensor>,
//!     ids: Vec<String>, // plain data implements both traits by cloning
//! }
//!
//! #[derive(Pinnable, ToDevice)]
//! enum Sample {
//!     Single(Tensor),
//!     Pair(Tensor, Tensor),
//!     Empty,
//! }
//! ```
//!
//! Every field is walked with its field path, so an error names where it happened:
//! ``cannot pin `batch.extra["mask"]` (i64 tensor on cuda:0): only dense CPU tensors can be
//! pinned``, or `Sample::Pair.1` inside an enum. Structs are named by their type in snake case
//! (`TrainBatch` is `train_batch`) when they are the outermost value.
//!
//! Every field's type must implement the trait being derived; a field that does not is a
//! compile error at that field, which suggests `#[pinnable(skip)]`.
//!
//! # Attributes
//!
//! All under `#[pinnable(...)]`.
//!
//! **On a field:**
//!
//! - `skip`: carry the field over with `Clone` instead of walking it. Its type must implement
//!   `Clone`, not the trait.
//! - `with = module`: pin and move the field through `module::pin_with(&T, &mut PinContext)
//!   -> Result<T>` and `module::to_device_with(&T, &mut MoveContext) -> Result<T>`, e.g. for a
//!   foreign type you cannot implement the traits for.
//! - `bound = "..."`: where-predicates that replace the ones inferred from this field.
//!
//! **On the struct or enum:**
//!
//! - `bound = "..."`: where-predicates that replace all inferred ones.
//! - `crate = path`: where `pinnable` is, when it is re-exported under another name.
//!
//! ```ignore
//! use std::marker::PhantomData;
//! use pinnable::{Pinnable, Tensor};
//!
//! /// A label set from another crate: no `Pinnable` impl of its own.
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
//! #[derive(Pinnable)]
//! struct Batch<T, M> {
//!     inputs: Vec<T>,                 // infers `T: Pinnable`
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
//!         labels: Labels(Tensor::from_vec1(vec![3i64])),
//!         meta: "run 7",
//!         marker: PhantomData,
//!     };
//!     let pinned = batch.pin_memory()?;
//!     assert!(pinned.inputs[0].is_pinned() && pinned.labels.0.is_pinned());
//!     assert_eq!(pinned.meta, "run 7");
//!     Ok(())
//! }
//! ```
//!
//! Bounds are inferred only for type parameters that walked fields mention (not `skip`, not
//! `with`, not inside `PhantomData`). The same `bound` applies to both derives, so a type
//! deriving both usually names both traits: `bound = "T: Pinnable + ToDevice"`.
//!
//! # Errors
//!
//! Unions, unknown or duplicate keys, malformed values, `skip` with `with`, and keys in the
//! wrong place are compile errors at the offending tokens, all reported together. The derive
//! then still emits an impl with the right signature, so only those errors are shown.
//!
//! # Implementation
//!
//! Three steps, one module each: `ast` parses the input (with `attr`), `valid` checks
//! it, `expand` writes the impl (with `generics` for bounds); on any error, `fallback`
//! writes the errors and a stub impl. `ctxt` collects the errors on the way.
//!
//! The examples above are not doctests, since this crate does not depend on `pinnable`; the
//! attributes example is built and run as `tests/ui/pass/doc_attributes.rs`.

mod ast;
mod attr;
mod ctxt;
mod expand;
mod fallback;
mod generics;
mod valid;

use proc_macro::TokenStream;
use syn::{DeriveInput, parse_macro_input};

use crate::ast::Input;
use crate::ctxt::Ctxt;
use crate::expand::Trait;

/// Derives `pinnable::Pinnable`: a copy with every tensor in page-locked host memory.
///
/// See the [crate docs](crate) for the attributes.
#[proc_macro_derive(Pinnable, attributes(pinnable))]
pub fn derive_pinnable(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    derive(&input, Trait::Pinnable).into()
}

/// Derives `pinnable::ToDevice`: a copy with every tensor on a device (or back on the host).
///
/// See the [crate docs](crate) for the attributes.
#[proc_macro_derive(ToDevice, attributes(pinnable))]
pub fn derive_to_device(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    derive(&input, Trait::ToDevice).into()
}

/// Parse, validate, expand; on any error, the errors and a stub impl.
fn derive(node: &DeriveInput, tr: Trait) -> proc_macro2::TokenStream {
    let cx = Ctxt::new();
    let input = Input::from_syn(&cx, node);
    if let Some(input) = &input {
        valid::check(&cx, input);
    }
    match (cx.finish(), input) {
        (Ok(()), Some(input)) => expand::derive(&input, tr),
        (result, _) => fallback::expand(node, tr, result.err()),
    }
}
