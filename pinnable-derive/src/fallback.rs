//! Output for an input with errors: the errors, plus an impl with the right signature and no
//! body, so code that uses the type as `Pinnable` or `ToDevice` compiles and the user sees only
//! the errors that matter instead of a cascade of "trait not implemented".

use proc_macro2::TokenStream;
use syn::DeriveInput;

use crate::attr::{self, Position};
use crate::ctxt::Ctxt;
use crate::expand::{Trait, private_path};

/// `error` as `compile_error!`s (`None` only if a stage failed without saying why), plus a stub impl of `tr` for the input type.
pub fn expand(input: &DeriveInput, tr: Trait, error: Option<syn::Error>) -> TokenStream {
    let error = error.unwrap_or_else(|| {
        syn::Error::new(
            proc_macro2::Span::call_site(),
            "pinnable-derive could not derive this impl but found no error to report; \
             please report this as a bug",
        )
    });
    // The `crate = ...` path, if it parsed; its own errors are already in `error`.
    let attrs = attr::parse(&Ctxt::new(), &input.attrs, Position::Container);
    let private = private_path(attrs.krate.as_ref().map(|k| &k.value));
    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let trait_ident = tr.ident();
    let method = tr.method();
    let context = tr.context();
    let errors = error.into_compile_error();
    quote::quote! {
        #errors
        const _: () = {
            #[automatically_derived]
            impl #impl_generics #private::#trait_ident for #ident #ty_generics #where_clause {
                fn #method(
                    &self,
                    __cx: &mut #private::#context<'_>,
                ) -> #private::Result<Self> {
                    loop {}
                }
            }
        };
    }
}
