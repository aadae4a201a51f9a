//! WebDataset's grouping of a shard's members into samples, rule for rule as webdataset 1.0's
//! `tar_file_iterator` and `group_by_keys` apply them:
//!
//! - only regular files count: directories, links and other members are passed over;
//! - a top-level name that starts and ends with `__`, and any path that starts with `__…__`
//!   followed by the end or a `/` (`__meta__`, `__index__/x.json`), is metadata, passed over;
//! - a path splits into a key and an extension as the pattern `^((?:.*/|)[^.]+)[.]([^/]*)$`
//!   splits it: in the common case the key is the path up to the first dot of its last
//!   component and the extension the rest, lower-cased; a name with no dot in its last
//!   component (`README`) is passed over; a last component that starts with a dot
//!   (`dir/.hidden`) takes the key `dir/` when the component before it has no dot;
//! - keys are the path's bytes as stored (Python's `tarfile` decodes them with
//!   `surrogateescape`, which keeps every byte): two names that differ only in bytes that are
//!   not UTF-8 are two keys;
//! - consecutive members with one key form a sample; a sample never spans two shards;
//! - a second member with an extension a sample already has (or the extension `__key__` or
//!   `__url__`, which webdataset's sample dictionary already holds) is an error.

use super::reader::{Kind, Member};

/// Where a member's path splits into key and extension, as webdataset's pattern splits it;
/// `None` when it does not match (the member is passed over).
pub(crate) fn split_key(path: &[u8]) -> Option<(&[u8], &[u8])> {
    // `(?:.*/|)`: `.` does not match a newline, so the directory part ends at a `/` before
    // the first newline; the longest such part is tried first, then shorter ones, then none.
    let newline = path.iter().position(|&b| b == b'\n').unwrap_or(path.len());
    let last_slash = path.iter().rposition(|&b| b == b'/');
    let candidates = path[..newline]
        .iter()
        .enumerate()
        .rev()
        .filter(|&(_, &b)| b == b'/')
        .map(|(i, _)| i + 1)
        .chain(std::iter::once(0));
    for start in candidates {
        // `[^.]+[.]`: at least one non-dot byte, then the first dot after `start`.
        let dot = start + path[start..].iter().position(|&b| b == b'.')?;
        if dot == start {
            continue;
        }
        // `([^/]*)$`: no slash after the dot.
        if last_slash.is_some_and(|s| s > dot) {
            continue;
        }
        return Some((&path[..dot], &path[dot + 1..]));
    }
    None
}

/// Whether webdataset passes the member over as metadata (`__*__`).
pub(crate) fn is_meta(path: &[u8]) -> bool {
    let top = !path.contains(&b'/') && path.starts_with(b"__") && path.ends_with(b"__");
    top || meta_pattern(path)
}

/// `re.match(r"__[^/]*__($|/)", path)`.
fn meta_pattern(path: &[u8]) -> bool {
    if !path.starts_with(b"__") {
        return false;
    }
    let rest = &path[2..];
    let end = rest.iter().position(|&b| b == b'/').unwrap_or(rest.len());
    // Some `__` inside `rest[..end]` followed by the end (`$`, also before a final newline)
    // or a slash.
    (0..end.saturating_sub(1)).any(|i| {
        rest[i] == b'_' && rest[i + 1] == b'_' && {
            let after = &rest[i + 2..];
            after.is_empty() || after[0] == b'/' || after == b"\n"
        }
    })
}

/// One field of a sample: an extension and where its bytes lie in the shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// The extension, lower-cased (`jpg`, `cls`, `seg.png`). An extension that is not UTF-8
    /// (rare: names are read as bytes) shows its bad bytes as U+FFFD here; two such fields of
    /// one sample are still two fields, told apart by their bytes when grouped.
    pub ext: String,
    /// The offset of its bytes in the shard.
    pub offset: u64,
    /// Their length.
    pub size: u64,
}

/// The samples of one shard as they are grouped: a key and its fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// The key (the member path without its extension), as the shard stores it: bytes, UTF-8
    /// in most shards but not always.
    pub key: Vec<u8>,
    /// The offset of the first header of its first member.
    pub offset: u64,
    /// Its fields in shard order.
    pub fields: Vec<Field>,
}

impl Group {
    /// Its bytes in the shard: its first member's first header to its last member's data end.
    pub(crate) fn span(&self) -> std::ops::Range<u64> {
        self.offset
            ..self
                .fields
                .last()
                .map_or(self.offset, |f| f.offset + f.size)
    }
}

/// A key for messages: UTF-8 as it is, other bytes as `\xNN` (as Python's `backslashreplace`
/// shows them).
pub(crate) fn show_key(key: &[u8]) -> String {
    let mut out = String::with_capacity(key.len());
    for chunk in key.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// An extension lower-cased as Python's `str.lower` lowers the `surrogateescape` decoding of
/// its bytes: UTF-8 runs lowered, other bytes kept.
fn lower_ext(ext: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ext.len());
    for chunk in ext.utf8_chunks() {
        out.extend_from_slice(chunk.valid().to_lowercase().as_bytes());
        out.extend_from_slice(chunk.invalid());
    }
    out
}

/// Groups members, in shard order, into samples.
#[derive(Default)]
pub(crate) struct Grouper {
    current: Option<Group>,
    /// The current sample's extensions as bytes (its fields show them lossily).
    exts: Vec<Vec<u8>>,
}

/// A repeated extension: the key, the extension and the offset of the second member's header.
pub(crate) struct Duplicate {
    pub(crate) key: Vec<u8>,
    pub(crate) ext: String,
    pub(crate) offset: u64,
}

impl Grouper {
    /// Takes the next member; returns the sample it completes, if any.
    pub(crate) fn push(&mut self, member: &Member) -> Result<Option<Group>, Duplicate> {
        if member.kind != Kind::File || is_meta(&member.path) {
            return Ok(None);
        }
        let Some((key, ext)) = split_key(&member.path) else {
            return Ok(None);
        };
        let ext = lower_ext(ext);
        let mut done = None;
        if self.current.as_ref().is_none_or(|g| g.key != key) {
            done = self.current.replace(Group {
                key: key.to_vec(),
                offset: member.header,
                fields: Vec::new(),
            });
            self.exts.clear();
        }
        let group = self.current.as_mut().expect("set above");
        if ext == b"__key__" || ext == b"__url__" || self.exts.contains(&ext) {
            return Err(Duplicate {
                key: group.key.clone(),
                ext: String::from_utf8_lossy(&ext).into_owned(),
                offset: member.header,
            });
        }
        group.fields.push(Field {
            ext: String::from_utf8_lossy(&ext).into_owned(),
            offset: member.data,
            size: member.size,
        });
        self.exts.push(ext);
        Ok(done)
    }

    /// The sample being assembled: the last of the shard, or the one the damage interrupted.
    pub(crate) fn finish(&mut self) -> Option<Group> {
        self.exts.clear();
        self.current.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(p: &str) -> Option<(String, String)> {
        split_key(p.as_bytes()).map(|(k, e)| {
            (
                String::from_utf8_lossy(k).into_owned(),
                String::from_utf8_lossy(e).into_owned(),
            )
        })
    }

    #[test]
    fn keys_split_as_webdatasets_pattern() {
        let s = |k: &str, e: &str| Some((k.to_owned(), e.to_owned()));
        assert_eq!(split("a/b/000123.seg.PNG"), s("a/b/000123", "seg.PNG"));
        assert_eq!(split("x.y/z.jpg"), s("x.y/z", "jpg"));
        assert_eq!(split("README"), None);
        assert_eq!(split("dir/README"), None);
        assert_eq!(split(".hidden"), None);
        assert_eq!(split("dir/.hidden"), s("dir/", "hidden"));
        assert_eq!(split("a.b/.hidden"), None);
        assert_eq!(split("a/b.c/.x"), None);
        assert_eq!(split("a/b/.x"), s("a/b/", "x"));
        assert_eq!(split("abc."), s("abc", ""));
    }

    #[test]
    fn meta_members_are_recognised() {
        for p in ["__meta__", "__index__/x.json", "__a__b__", "____"] {
            assert!(is_meta(p.as_bytes()), "{p}");
        }
        for p in ["a/__meta__", "__meta__x", "__a", "x__meta__.json"] {
            assert!(!is_meta(p.as_bytes()), "{p}");
        }
    }
}
