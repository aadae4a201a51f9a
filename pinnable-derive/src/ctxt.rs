//! The error collector: every stage records its errors here instead of stopping at the first,
//! so the user sees all of them from one build.

use std::cell::RefCell;
use std::fmt::Display;

use quote::ToTokens;

/// Errors found so far while deriving for one type.
#[derive(Default)]
pub struct Ctxt {
    errors: RefCell<Vec<syn::Error>>,
}

impl Ctxt {
    /// An empty collector.
    pub fn new() -> Self {
        Ctxt::default()
    }

    /// Records an error spanned at `tokens`.
    pub fn error_at(&self, tokens: impl ToTokens, message: impl Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// Records an error that was already built (e.g. by `syn`'s parser).
    pub fn push(&self, error: syn::Error) {
        self.errors.borrow_mut().push(error);
    }

    /// All recorded errors, combined into one, or `Ok` when there were none.
    pub fn finish(self) -> syn::Result<()> {
        let mut errors = self.errors.into_inner().into_iter();
        let Some(mut first) = errors.next() else {
            return Ok(());
        };
        for e in errors {
            first.combine(e);
        }
        Err(first)
    }
}
