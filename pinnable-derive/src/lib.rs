//! Derive macros for `pinnable`. Placeholder.
use proc_macro::TokenStream;

/// Derives `Pinnable`.
#[proc_macro_derive(Pinnable, attributes(pinnable))]
pub fn derive_pinnable(_input: TokenStream) -> TokenStream {
    TokenStream::new()
}

/// Derives `ToDevice`.
#[proc_macro_derive(ToDevice, attributes(pinnable))]
pub fn derive_to_device(_input: TokenStream) -> TokenStream {
    TokenStream::new()
}
