//! Bound inference: which where-predicates the generated impl carries.
//!
//! Like serde's: a type parameter is bounded by the derived trait only when a field that is
//! walked (not `skip`, not `with`, no `bound` of its own) mentions it outside `PhantomData`.
//! A field's `bound = "..."` replaces that field's contribution; the container's replaces all
//! of them. The type's own where-clause is always kept.

use std::collections::BTreeSet;

use proc_macro2::TokenStream;
use syn::visit::{self, Visit};
use syn::{Generics, Ident, TypePath, parse_quote};

use crate::ast::Input;

/// The input's generics with the where-clause the impl of `trait_path` needs.
pub fn with_bounds(input: &Input<'_>, trait_path: &TokenStream) -> Generics {
    let mut generics = input.original().generics.clone();
    let params: Vec<Ident> = generics.type_params().map(|p| p.ident.clone()).collect();
    let where_clause = generics.make_where_clause();
    if let Some(bound) = &input.attrs().bound {
        where_clause.predicates.extend(bound.value.iter().cloned());
        return generics;
    }
    let mut finder = ParamFinder {
        params: &params,
        used: BTreeSet::new(),
    };
    for field in input.fields() {
        if let Some(bound) = &field.attrs.bound {
            where_clause.predicates.extend(bound.value.iter().cloned());
        } else if !field.is_skipped() && field.attrs.with.is_none() {
            finder.visit_type(field.ty);
        }
    }
    // Declaration order, so the generated where-clause reads like the type's parameter list.
    for (i, param) in params.iter().enumerate() {
        if finder.used.contains(&i) {
            where_clause
                .predicates
                .push(parse_quote!(#param: #trait_path));
        }
    }
    generics
}

/// Finds which of `params` a type mentions, not looking inside `PhantomData<...>`.
struct ParamFinder<'a> {
    params: &'a [Ident],
    /// Indices into `params`.
    used: BTreeSet<usize>,
}

impl<'ast> Visit<'ast> for ParamFinder<'_> {
    fn visit_type_path(&mut self, ty: &'ast TypePath) {
        if ty.qself.is_none()
            && ty.path.leading_colon.is_none()
            && let Some(first) = ty.path.segments.first()
            && let Some(i) = self.params.iter().position(|p| *p == first.ident)
        {
            self.used.insert(i);
        }
        if ty
            .path
            .segments
            .last()
            .is_some_and(|last| last.ident == "PhantomData")
        {
            return;
        }
        visit::visit_type_path(self, ty);
    }
}
