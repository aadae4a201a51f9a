//! A borrowed view of the derive input: the type, its variants and fields, each with its
//! parsed `#[pinnable]` attributes.

use syn::ext::IdentExt;
use syn::{Data, DeriveInput, Fields, Member, Type};

use crate::attr::{self, Attrs, Position};
use crate::ctxt::Ctxt;

/// A struct or an enum (unions are rejected while building this).
pub enum Input<'a> {
    /// A named, tuple or unit struct.
    Struct(Struct<'a>),
    /// An enum with any variant shapes.
    Enum(Enum<'a>),
}

/// A struct and its fields.
pub struct Struct<'a> {
    /// The whole input.
    pub original: &'a DeriveInput,
    /// The container's attributes.
    pub attrs: Attrs<'a>,
    /// The fields, in declaration order.
    pub fields: Vec<Field<'a>>,
}

/// An enum and its variants.
pub struct Enum<'a> {
    /// The whole input.
    pub original: &'a DeriveInput,
    /// The container's attributes.
    pub attrs: Attrs<'a>,
    /// The variants, in declaration order.
    pub variants: Vec<Variant<'a>>,
}

/// One enum variant.
pub struct Variant<'a> {
    /// The variant as written.
    pub original: &'a syn::Variant,
    /// Attributes on the variant itself (none are allowed; kept to report them).
    pub attrs: Attrs<'a>,
    /// The variant's fields.
    pub fields: Vec<Field<'a>>,
}

/// One field of a struct or variant.
pub struct Field<'a> {
    /// The field's attributes.
    pub attrs: Attrs<'a>,
    /// How to name it in code: `images` or `0`.
    pub member: Member,
    /// How to name it in a field path: `images` (raw identifiers unescaped) or `0`.
    pub path_name: String,
    /// Its type.
    pub ty: &'a Type,
}

impl<'a> Input<'a> {
    /// Builds the view, recording attribute errors in `cx`; `None` for a union (also an error).
    pub fn from_syn(cx: &Ctxt, node: &'a DeriveInput) -> Option<Self> {
        match &node.data {
            Data::Struct(data) => Some(Input::Struct(Struct {
                original: node,
                attrs: attr::parse(cx, &node.attrs, Position::Container),
                fields: Field::all(cx, &data.fields),
            })),
            Data::Enum(data) => Some(Input::Enum(Enum {
                original: node,
                attrs: attr::parse(cx, &node.attrs, Position::Container),
                variants: data
                    .variants
                    .iter()
                    .map(|v| Variant {
                        original: v,
                        attrs: attr::parse(cx, &v.attrs, Position::Variant),
                        fields: Field::all(cx, &v.fields),
                    })
                    .collect(),
            })),
            Data::Union(data) => {
                cx.error_at(
                    data.union_token,
                    "unions cannot derive `Pinnable` or `ToDevice`: which field holds the value \
                     is not known at compile time; use a struct or an enum, or implement the \
                     traits by hand",
                );
                None
            }
        }
    }

    /// The whole input.
    pub fn original(&self) -> &'a DeriveInput {
        match self {
            Input::Struct(s) => s.original,
            Input::Enum(e) => e.original,
        }
    }

    /// The container's attributes.
    pub fn attrs(&self) -> &Attrs<'a> {
        match self {
            Input::Struct(s) => &s.attrs,
            Input::Enum(e) => &e.attrs,
        }
    }

    /// Every field of the type: the struct's, or every variant's.
    pub fn fields(&self) -> Box<dyn Iterator<Item = &Field<'a>> + '_> {
        match self {
            Input::Struct(s) => Box::new(s.fields.iter()),
            Input::Enum(e) => Box::new(e.variants.iter().flat_map(|v| v.fields.iter())),
        }
    }
}

impl<'a> Field<'a> {
    fn all(cx: &Ctxt, fields: &'a Fields) -> Vec<Self> {
        fields
            .iter()
            .enumerate()
            .map(|(i, field)| {
                let (member, path_name) = match &field.ident {
                    Some(ident) => (Member::Named(ident.clone()), ident.unraw().to_string()),
                    None => (Member::Unnamed(i.into()), i.to_string()),
                };
                Field {
                    attrs: attr::parse(cx, &field.attrs, Position::Field),
                    member,
                    path_name,
                    ty: &field.ty,
                }
            })
            .collect()
    }

    /// Whether the field is carried over with `Clone` instead of being walked.
    pub fn is_skipped(&self) -> bool {
        self.attrs.skip.is_some()
    }
}
