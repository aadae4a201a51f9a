//! Semantic checks on the parsed input: every key in a place where it means something, and no
//! two keys that contradict each other.

use crate::ast::{Field, Input};
use crate::ctxt::Ctxt;

/// Records every misuse of `#[pinnable]` in `cx`.
pub fn check(cx: &Ctxt, input: &Input<'_>) {
    let attrs = input.attrs();
    if let Some(key) = &attrs.skip {
        cx.error_at(
            key,
            "`skip` goes on a field, not on the type: mark each field to carry over unchanged \
             with `#[pinnable(skip)]`",
        );
    }
    if let Some(with) = &attrs.with {
        cx.error_at(
            &with.key,
            "`with` goes on a field, not on the type: write `#[pinnable(with = module)]` on the \
             field it handles",
        );
    }
    if let Input::Enum(e) = input {
        for variant in &e.variants {
            for attr in &variant.attrs.originals {
                cx.error_at(
                    attr,
                    "`#[pinnable]` is not allowed on an enum variant: put `skip` or `with` on \
                     the variant's fields, and `bound` or `crate` on the enum",
                );
            }
        }
    }
    for field in input.fields() {
        check_field(cx, field);
    }
}

fn check_field(cx: &Ctxt, field: &Field<'_>) {
    let attrs = &field.attrs;
    if let Some(krate) = &attrs.krate {
        cx.error_at(
            &krate.key,
            "`crate` goes on the struct or enum, not on a field: write \
             `#[pinnable(crate = path)]` above the type",
        );
    }
    if let (Some(_), Some(with)) = (&attrs.skip, &attrs.with) {
        cx.error_at(
            &with.key,
            "`skip` and `with` cannot be combined: `skip` clones the field unchanged, `with` \
             pins and moves it through your module; keep one",
        );
    }
}
