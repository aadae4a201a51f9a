//! Field paths: where in a batch a value sits, for error messages.

use std::fmt::{self, Write};

/// One step from a value to a part of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    /// The name given to the outermost value, e.g. `batch`.
    Root(String),
    /// A named or positional field: `.images`, `.0`.
    Field(&'static str),
    /// A position in a sequence: `[2]`.
    Index(usize),
    /// A map key, shown with `Debug`: `["mask"]`.
    Key(String),
    /// The enum variant a value is in: `Kind::Image` at the root, `<Kind::Image>` inside.
    Variant {
        /// The enum's name.
        ty: &'static str,
        /// The variant's name.
        variant: &'static str,
    },
}

/// The path from the batch to the value being worked on, e.g. `batch.masks[2]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldPath {
    segments: Vec<Segment>,
}

impl FieldPath {
    /// An empty path.
    pub const fn new() -> Self {
        FieldPath {
            segments: Vec::new(),
        }
    }

    /// The segments, outermost first.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Appends a segment.
    #[inline]
    pub fn push(&mut self, segment: Segment) {
        self.segments.push(segment);
    }

    /// Removes the innermost segment.
    #[inline]
    pub fn pop(&mut self) -> Option<Segment> {
        self.segments.pop()
    }

    /// Whether no segment has been pushed.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.segments.is_empty() {
            return f.write_str("value");
        }
        for (i, seg) in self.segments.iter().enumerate() {
            match seg {
                Segment::Root(name) => f.write_str(name)?,
                Segment::Field(name) if i == 0 => f.write_str(name)?,
                Segment::Field(name) => write!(f, ".{name}")?,
                Segment::Index(i) => write!(f, "[{i}]")?,
                Segment::Key(k) => {
                    f.write_char('[')?;
                    f.write_str(k)?;
                    f.write_char(']')?;
                }
                Segment::Variant { ty, variant } if i == 0 => write!(f, "{ty}::{variant}")?,
                Segment::Variant { ty, variant } => write!(f, "<{ty}::{variant}>")?,
            }
        }
        Ok(())
    }
}

/// The path helpers shared by [`PinContext`](crate::PinContext) and
/// [`MoveContext`](crate::MoveContext): each runs `f` with one more segment on the path,
/// so errors raised inside name the field.
pub trait Walk {
    /// Where in the batch the current value sits.
    fn path(&self) -> &FieldPath;

    /// The path being built.
    fn path_mut(&mut self) -> &mut FieldPath;

    /// An error about the current value, carrying its field path.
    fn error(&self, message: impl Into<String>) -> crate::Error
    where
        Self: Sized,
    {
        crate::Error::Field {
            path: self.path().to_string(),
            message: message.into(),
        }
    }

    /// Runs `f` inside `segment`.
    fn scope<R>(&mut self, segment: Segment, f: impl FnOnce(&mut Self) -> R) -> R
    where
        Self: Sized,
    {
        self.path_mut().push(segment);
        let out = f(self);
        self.path_mut().pop();
        out
    }

    /// Names the outermost value (`batch`) when nothing is on the path yet; otherwise
    /// just runs `f`.
    fn root<R>(&mut self, name: &str, f: impl FnOnce(&mut Self) -> R) -> R
    where
        Self: Sized,
    {
        if self.path_mut().is_empty() {
            self.scope(Segment::Root(name.to_owned()), f)
        } else {
            f(self)
        }
    }

    /// Runs `f` inside field `name` (`.images`, `.0`).
    fn field<R>(&mut self, name: &'static str, f: impl FnOnce(&mut Self) -> R) -> R
    where
        Self: Sized,
    {
        self.scope(Segment::Field(name), f)
    }

    /// Runs `f` inside position `index` (`[2]`).
    fn index<R>(&mut self, index: usize, f: impl FnOnce(&mut Self) -> R) -> R
    where
        Self: Sized,
    {
        self.scope(Segment::Index(index), f)
    }

    /// Runs `f` inside map key `key`, shown with `Debug` (`["mask"]`).
    fn key<R>(&mut self, key: &dyn fmt::Debug, f: impl FnOnce(&mut Self) -> R) -> R
    where
        Self: Sized,
    {
        self.scope(Segment::Key(format!("{key:?}")), f)
    }

    /// Runs `f` inside enum variant `ty::variant`.
    fn variant<R>(
        &mut self,
        ty: &'static str,
        variant: &'static str,
        f: impl FnOnce(&mut Self) -> R,
    ) -> R
    where
        Self: Sized,
    {
        self.scope(Segment::Variant { ty, variant }, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_nested_path_like_rust_source() {
        let mut p = FieldPath::new();
        p.push(Segment::Root("batch".into()));
        p.push(Segment::Field("extra"));
        p.push(Segment::Key(format!("{:?}", "mask")));
        assert_eq!(p.to_string(), r#"batch.extra["mask"]"#);
        p.pop();
        p.push(Segment::Index(2));
        p.push(Segment::Variant {
            ty: "Kind",
            variant: "Image",
        });
        p.push(Segment::Field("0"));
        assert_eq!(p.to_string(), "batch.extra[2]<Kind::Image>.0");
    }

    #[test]
    fn enum_at_root_reads_as_its_variant() {
        let mut p = FieldPath::new();
        p.push(Segment::Variant {
            ty: "Sample",
            variant: "Pair",
        });
        p.push(Segment::Field("1"));
        assert_eq!(p.to_string(), "Sample::Pair.1");
    }
}
