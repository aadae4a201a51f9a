//! Code generation: the `impl` of `Pinnable` or `ToDevice` for a validated input.
//!
//! For `struct Batch { images: Tensor, #[pinnable(skip)] ids: Vec<String> }` the `Pinnable`
//! impl reads:
//!
//! ```text
//! fn pin_with(&self, __cx: &mut PinContext<'_>) -> Result<Self> {
//!     Walk::root(__cx, "batch", |__cx| -> Result<Self> {
//!         Ok(Self {
//!             images: Walk::field(__cx, "images", |__cx| <Tensor as Pinnable>::pin_with(&self.images, __cx))?,
//!             ids: <Vec<String> as Clone>::clone(&self.ids),
//!         })
//!     })
//! }
//! ```
//!
//! Each `<FieldType as Trait>` is spanned at the field's type, so a missing impl is reported
//! there, with the trait's `on_unimplemented` advice.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Ident, Path};

use crate::ast::{Enum, Field, Input, Struct, Variant};
use crate::generics;

/// Which trait is being derived.
#[derive(Clone, Copy)]
pub enum Trait {
    /// `Pinnable`: `pin_with(&self, &mut PinContext) -> Result<Self>`.
    Pinnable,
    /// `ToDevice`: `to_device_with(&self, &mut MoveContext) -> Result<Self>`.
    ToDevice,
}

impl Trait {
    /// The trait's name, also the name under `__private`.
    pub fn ident(self) -> Ident {
        match self {
            Trait::Pinnable => Ident::new("Pinnable", Span::call_site()),
            Trait::ToDevice => Ident::new("ToDevice", Span::call_site()),
        }
    }

    /// The recursive method (and the function a `with` module provides).
    pub fn method(self) -> Ident {
        match self {
            Trait::Pinnable => Ident::new("pin_with", Span::call_site()),
            Trait::ToDevice => Ident::new("to_device_with", Span::call_site()),
        }
    }

    /// The context type the method takes.
    pub fn context(self) -> Ident {
        match self {
            Trait::Pinnable => Ident::new("PinContext", Span::call_site()),
            Trait::ToDevice => Ident::new("MoveContext", Span::call_site()),
        }
    }
}

/// `::pinnable::__private`, or `<crate>::__private` under `#[pinnable(crate = ...)]`.
pub fn private_path(krate: Option<&Path>) -> TokenStream {
    match krate {
        Some(path) => quote!(#path::__private),
        None => quote!(::pinnable::__private),
    }
}

/// The whole output for a valid input: the impl inside `const _: () = { ... };`.
pub fn derive(input: &Input<'_>, tr: Trait) -> TokenStream {
    let private = private_path(input.attrs().krate.as_ref().map(|k| &k.value));
    let trait_ident = tr.ident();
    let trait_path = quote!(#private::#trait_ident);
    let generics = generics::with_bounds(input, &trait_path);
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    let ident = &input.original().ident;
    let method = tr.method();
    let context = tr.context();
    let emit = Gen {
        private: &private,
        tr,
    };
    let body = match input {
        Input::Struct(s) => emit.struct_body(s),
        Input::Enum(e) => emit.enum_body(e),
    };
    // A move's first walk measures the same parts in the same order and builds nothing.
    let measure = match tr {
        Trait::Pinnable => TokenStream::new(),
        Trait::ToDevice => {
            let body = match input {
                Input::Struct(s) => emit.struct_measure(s),
                Input::Enum(e) => emit.enum_measure(e),
            };
            quote! {
                fn measure_with(
                    &self,
                    __cx: &mut #private::#context<'_>,
                ) -> #private::Result<()> {
                    #body
                }
            }
        }
    };
    quote! {
        const _: () = {
            #[automatically_derived]
            impl #impl_generics #trait_path for #ident #ty_generics #where_clause {
                fn #method(
                    &self,
                    __cx: &mut #private::#context<'_>,
                ) -> #private::Result<Self> {
                    #body
                }
                #measure
            }
        };
    }
}

/// What every piece of generated code needs to know.
struct Gen<'a> {
    private: &'a TokenStream,
    tr: Trait,
}

impl Gen<'_> {
    fn struct_body(&self, s: &Struct<'_>) -> TokenStream {
        let private = self.private;
        let root = root_name(&s.original.ident.unraw().to_string());
        let fields = s.fields.iter().map(|f| {
            let member = &f.member;
            let value = self.field_value(f, quote!(&self.#member));
            quote!(#member: #value)
        });
        quote! {
            #private::Walk::root(__cx, #root, |__cx| -> #private::Result<Self> {
                #private::Ok(Self { #(#fields,)* })
            })
        }
    }

    fn enum_body(&self, e: &Enum<'_>) -> TokenStream {
        if e.variants.is_empty() {
            return quote!(match *self {});
        }
        let ty_name = e.original.ident.unraw().to_string();
        let arms = e.variants.iter().map(|v| self.variant_arm(&ty_name, v));
        quote! {
            match self {
                #(#arms)*
            }
        }
    }

    fn variant_arm(&self, ty_name: &str, v: &Variant<'_>) -> TokenStream {
        let private = self.private;
        let ident = &v.original.ident;
        let members = v.fields.iter().map(|f| &f.member);
        self.variant_match(
            ty_name,
            v,
            quote!(Self),
            |values| quote!(#private::Ok(Self::#ident { #(#members: #values,)* })),
            |f, b| self.field_value(f, b),
        )
    }

    /// One match arm over variant `v`: its fields bound, each turned by `field` into a
    /// token stream, and `body` made of those, inside the variant's path segment; `out` is
    /// what the arm returns.
    fn variant_match(
        &self,
        ty_name: &str,
        v: &Variant<'_>,
        out: TokenStream,
        body: impl FnOnce(Vec<TokenStream>) -> TokenStream,
        field: impl Fn(&Field<'_>, TokenStream) -> TokenStream,
    ) -> TokenStream {
        let private = self.private;
        let ident = &v.original.ident;
        let members: Vec<_> = v.fields.iter().map(|f| &f.member).collect();
        let bindings: Vec<_> = (0..v.fields.len())
            .map(|i| format_ident!("__binding_{}", i))
            .collect();
        let parts = v
            .fields
            .iter()
            .zip(&bindings)
            .map(|(f, b)| field(f, b.to_token_stream()))
            .collect();
        let body = body(parts);
        if v.fields.is_empty() {
            return quote!(Self::#ident {} => #body,);
        }
        let variant_name = ident.unraw().to_string();
        quote! {
            Self::#ident { #(#members: #bindings),* } => {
                #private::Walk::variant(__cx, #ty_name, #variant_name, |__cx| -> #private::Result<#out> {
                    #body
                })
            }
        }
    }

    /// `measure_with`'s body for a struct: each field measured, in order, under its name.
    fn struct_measure(&self, s: &Struct<'_>) -> TokenStream {
        let private = self.private;
        let root = root_name(&s.original.ident.unraw().to_string());
        let fields = s.fields.iter().map(|f| {
            let member = &f.member;
            self.field_measure(f, quote!(&self.#member))
        });
        quote! {
            #private::Walk::root(__cx, #root, |__cx| -> #private::Result<()> {
                #(#fields)*
                #private::Ok(())
            })
        }
    }

    /// `measure_with`'s body for an enum: the variant's fields measured under its name.
    fn enum_measure(&self, e: &Enum<'_>) -> TokenStream {
        let private = self.private;
        if e.variants.is_empty() {
            return quote!(match *self {});
        }
        let ty_name = e.original.ident.unraw().to_string();
        let arms = e.variants.iter().map(|v| {
            self.variant_match(
                &ty_name,
                v,
                quote!(()),
                |steps| quote!({ #(#steps)* #private::Ok(()) }),
                |f, b| self.field_measure(f, b),
            )
        });
        quote! {
            match self {
                #(#arms)*
            }
        }
    }

    /// One field's step of `measure_with`: nothing for a skipped field; a `with` module's
    /// `to_device_with`, dropped; else the field type's `measure_with`.
    fn field_measure(&self, f: &Field<'_>, access: TokenStream) -> TokenStream {
        let private = self.private;
        let ty = f.ty;
        let name = &f.path_name;
        if f.is_skipped() {
            return TokenStream::new();
        }
        let call = match &f.attrs.with {
            Some(with) => {
                let module = &with.value;
                quote_spanned!(module.span()=> |__v, __cx| #module::to_device_with(__v, __cx).map(|_| ()))
            }
            None => quote_spanned!(ty.span()=> <#ty as #private::ToDevice>::measure_with),
        };
        quote! {
            #private::Walk::field(__cx, #name, |__cx| (#call)(#access, __cx))?;
        }
    }

    /// The expression for one field of the result; `access` is a `&FieldType` expression.
    fn field_value(&self, f: &Field<'_>, access: TokenStream) -> TokenStream {
        let private = self.private;
        let ty = f.ty;
        let name = &f.path_name;
        if f.is_skipped() {
            return quote_spanned!(ty.span()=> <#ty as #private::Clone>::clone(#access));
        }
        let method = self.tr.method();
        let call = match &f.attrs.with {
            Some(with) => {
                let module = &with.value;
                quote_spanned!(module.span()=> #module::#method)
            }
            None => {
                let trait_ident = self.tr.ident();
                quote_spanned!(ty.span()=> <#ty as #private::#trait_ident>::#method)
            }
        };
        quote! {
            #private::Walk::field(__cx, #name, |__cx| #call(#access, __cx))?
        }
    }
}

/// The name of a type as the root of a field path: `TrainBatch` -> `train_batch`,
/// `Batch2D` -> `batch2d` (digits do not start a word).
pub fn root_name(type_name: &str) -> String {
    let mut out = String::with_capacity(type_name.len() + 4);
    let mut prev_lower = false;
    for c in type_name.chars() {
        if c.is_uppercase() {
            if prev_lower {
                out.push('_');
            }
            out.extend(c.to_lowercase());
            prev_lower = false;
        } else {
            out.push(c);
            prev_lower = c.is_lowercase();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::root_name;

    #[test]
    fn root_name_is_snake_case_and_digits_do_not_start_words() {
        assert_eq!(root_name("Batch"), "batch");
        assert_eq!(root_name("TrainBatch"), "train_batch");
        assert_eq!(root_name("Batch2D"), "batch2d");
        assert_eq!(root_name("HTTPBatch"), "httpbatch");
        assert_eq!(root_name("already_snake"), "already_snake");
    }
}
