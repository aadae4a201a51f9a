//! Parsing `#[pinnable(...)]` attributes.
//!
//! Every position (the type, a variant, a field) is parsed into the same [`Attrs`], keeping the
//! tokens of each key for error spans; whether a key is allowed where it was written is
//! [`valid`](crate::valid)'s business. Malformed values stop the attribute they are in; unknown
//! and duplicate keys are recorded and parsing goes on, so one build reports them all.

use syn::meta::ParseNestedMeta;
use syn::parse::ParseStream;
use syn::punctuated::Punctuated;
use syn::{Attribute, LitStr, Meta, Path, Token, WherePredicate};

use crate::ctxt::Ctxt;

/// Where an attribute was written; decides which keys an "unknown key" error suggests.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// On the struct or enum itself.
    Container,
    /// On an enum variant (nothing is allowed there).
    Variant,
    /// On a field of a struct or of a variant.
    Field,
}

/// A key that was given, with the tokens of the key itself for error spans.
pub struct Keyed<T> {
    /// The key as written (`with`, `bound`, ...).
    pub key: Path,
    /// Its parsed value.
    pub value: T,
}

/// The `#[pinnable(...)]` keys found at one position.
#[derive(Default)]
pub struct Attrs<'a> {
    /// Every `#[pinnable]` attribute at this position, for "not allowed here" errors.
    pub originals: Vec<&'a Attribute>,
    /// `skip`: carry the field over with `Clone`.
    pub skip: Option<Path>,
    /// `with = module`: pin and move the field through the module's functions.
    pub with: Option<Keyed<Path>>,
    /// `bound = "..."`: where-predicates replacing the inferred ones.
    pub bound: Option<Keyed<Vec<WherePredicate>>>,
    /// `crate = path`: where the `pinnable` crate is.
    pub krate: Option<Keyed<Path>>,
}

/// Parses every `#[pinnable(...)]` among `attrs`, recording errors in `cx`.
pub fn parse<'a>(cx: &Ctxt, attrs: &'a [Attribute], position: Position) -> Attrs<'a> {
    let mut out = Attrs::default();
    for attr in attrs {
        if !attr.path().is_ident("pinnable") {
            continue;
        }
        out.originals.push(attr);
        let Meta::List(list) = &attr.meta else {
            cx.error_at(
                &attr.meta,
                "expected a list of keys, as in `#[pinnable(skip)]`",
            );
            continue;
        };
        let parsed = list.parse_nested_meta(|meta| parse_key(cx, &mut out, meta, position));
        if let Err(e) = parsed {
            cx.push(e);
        }
    }
    out
}

fn parse_key(
    cx: &Ctxt,
    out: &mut Attrs<'_>,
    meta: ParseNestedMeta<'_>,
    position: Position,
) -> syn::Result<()> {
    let key = meta.path.clone();
    let name = key.get_ident().map(ToString::to_string).unwrap_or_default();
    match name.as_str() {
        "skip" => {
            if meta.input.peek(Token![=]) || meta.input.peek(syn::token::Paren) {
                return Err(meta.error("`skip` takes no value: write `#[pinnable(skip)]`"));
            }
            set(cx, &mut out.skip, &key, key.clone());
        }
        "with" => {
            let value = path_value(&meta, "with", "my_module")?;
            set(
                cx,
                &mut out.with,
                &key,
                Keyed {
                    key: key.clone(),
                    value,
                },
            );
        }
        "crate" => {
            let value = path_value(&meta, "crate", "::my_reexport::pinnable")?;
            set(
                cx,
                &mut out.krate,
                &key,
                Keyed {
                    key: key.clone(),
                    value,
                },
            );
        }
        "bound" => {
            let value = bound_value(&meta)?;
            set(
                cx,
                &mut out.bound,
                &key,
                Keyed {
                    key: key.clone(),
                    value,
                },
            );
        }
        _ => {
            cx.error_at(&key, unknown_key_message(&key, position));
            skip_value(&meta)?;
        }
    }
    Ok(())
}

/// Keeps the first occurrence of a key; a second one is an error at its own tokens.
fn set<T>(cx: &Ctxt, slot: &mut Option<T>, key: &Path, value: T) {
    if slot.is_some() {
        let name = quote::quote!(#key).to_string();
        cx.error_at(
            key,
            format!("duplicate `{name}`: it is already given for this item; remove one"),
        );
    } else {
        *slot = Some(value);
    }
}

fn unknown_key_message(key: &Path, position: Position) -> String {
    let name = quote::quote!(#key).to_string().replace(' ', "");
    let accepted = match position {
        Position::Container => "a struct or enum accepts `bound = \"...\"` and `crate = path`",
        Position::Field => "a field accepts `skip`, `with = path` and `bound = \"...\"`",
        Position::Variant => {
            "an enum variant accepts none; put `skip`, `with` or `bound` on its fields"
        }
    };
    format!("unknown key `{name}` in `#[pinnable(...)]`: {accepted}")
}

/// Consumes an unknown key's value (`= expr` or `(...)`) so the keys after it are still parsed.
fn skip_value(meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(Token![=]) {
        meta.value()?.parse::<syn::Expr>()?;
    } else if meta.input.peek(syn::token::Paren) {
        meta.parse_nested_meta(|inner| skip_value(&inner))?;
    }
    Ok(())
}

/// `key = some::path`; a quoted path gets a message saying to drop the quotes.
fn path_value(meta: &ParseNestedMeta<'_>, key: &str, example: &str) -> syn::Result<Path> {
    if !meta.input.peek(Token![=]) {
        return Err(meta.error(format!("`{key}` needs a path: write `{key} = {example}`")));
    }
    let input: ParseStream<'_> = meta.value()?;
    if input.peek(LitStr) {
        let lit: LitStr = input.parse()?;
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "expected a path, found a string: write `{key} = {}` without the quotes",
                lit.value()
            ),
        ));
    }
    input.call(Path::parse_mod_style).map_err(|e| {
        syn::Error::new(
            e.span(),
            format!("expected a path after `{key} =`, as in `{key} = {example}`"),
        )
    })
}

/// `bound = "T: Pinnable, U: Clone"`: where-predicates inside a string, like serde's.
fn bound_value(meta: &ParseNestedMeta<'_>) -> syn::Result<Vec<WherePredicate>> {
    const EXAMPLE: &str = "bound = \"T: Pinnable\"";
    if !meta.input.peek(Token![=]) {
        return Err(meta.error(format!(
            "`bound` needs where-clause predicates in a string: write `{EXAMPLE}`"
        )));
    }
    let input = meta.value()?;
    if !input.peek(LitStr) {
        return Err(syn::Error::new(
            input.span(),
            format!("expected where-clause predicates in a string: write `{EXAMPLE}`"),
        ));
    }
    let lit: LitStr = input.parse()?;
    let predicates = lit
        .parse_with(Punctuated::<WherePredicate, Token![,]>::parse_terminated)
        .map_err(|e| {
            syn::Error::new(
                lit.span(),
                format!("invalid `bound` ({e}): write where-clause predicates, as in `{EXAMPLE}`"),
            )
        })?;
    Ok(predicates.into_iter().collect())
}
