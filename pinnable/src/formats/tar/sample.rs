//! One sample of a shard ([`TarSample`]: a handle, its fields byte ranges of the shard) and the
//! batcher for `.npy` members ([`TarNpyBatcher`]).

use std::borrow::Cow;
use std::sync::Arc;

use super::{ByteSource, Entry, Field, Index};
use crate::error::{Error, Result};
use crate::formats::npy::NpyArray;
use crate::loader::{Batcher, Collator};
use crate::tensor::{AlignedCopy, HostBytes, Tensor};

/// A sample's bytes held for the worker that takes it (and for tensors made over them).
pub(crate) type Held = Arc<dyn HostBytes>;

/// One sample of [`TarShards`](super::TarShards): which shard, its key, and where each field's
/// bytes lie. From local shards nothing is read until a field is asked for; a remote sample
/// holds its bytes, streamed ahead (see [`TarShards::open_with`](super::TarShards::open_with)).
#[derive(Clone)]
pub struct TarSample {
    index: Arc<Index>,
    at: usize,
    /// The sample's bytes from the shard and the shard offset of their first, when held.
    held: Option<(Held, u64)>,
}

impl std::fmt::Debug for TarSample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TarSample({} in {})", self.shown_key(), self.shard())
    }
}

/// A member's bytes inside a held sample, as the bytes of a tensor: no copy.
struct HeldBytes {
    bytes: Held,
    from: usize,
    len: usize,
}

impl HostBytes for HeldBytes {
    fn host_bytes(&self) -> &[u8] {
        let end = self.from.saturating_add(self.len);
        self.bytes.host_bytes().get(self.from..end).unwrap_or(&[])
    }
}

/// A member's bytes inside a mapped shard, as the bytes of a tensor: no copy.
struct MemberBytes {
    shard: Arc<dyn ByteSource>,
    offset: usize,
    len: usize,
}

impl HostBytes for MemberBytes {
    fn host_bytes(&self) -> &[u8] {
        let end = self.offset.saturating_add(self.len);
        self.shard
            .in_memory()
            .and_then(|b| b.get(self.offset..end))
            .unwrap_or(&[])
    }
}

impl TarSample {
    pub(crate) fn new(index: Arc<Index>, at: usize) -> TarSample {
        TarSample {
            index,
            at,
            held: None,
        }
    }

    /// The sample with its bytes, which begin at shard offset `start`.
    pub(crate) fn holding(mut self, bytes: Held, start: u64) -> TarSample {
        self.held = Some((bytes, start));
        self
    }

    /// Where field `f`'s bytes lie in the held bytes, if the sample holds them.
    fn held_range(&self, f: &Field) -> Option<(&Held, usize, usize)> {
        let (bytes, start) = self.held.as_ref()?;
        let from = usize::try_from(f.offset.checked_sub(*start)?).ok()?;
        let len = usize::try_from(f.size).ok()?;
        (from.checked_add(len)? <= bytes.host_bytes().len()).then_some((bytes, from, len))
    }

    fn group(&self) -> Option<&super::Group> {
        match &self.index.entries[self.at] {
            Entry::Sample(g) => Some(g),
            Entry::Broken { .. } => None,
        }
    }

    /// The sample's index in its [`TarShards`](super::TarShards).
    pub fn index(&self) -> usize {
        self.at
    }

    /// The key (the member path without its extension) when it is UTF-8, as it is in most
    /// shards; `None` when it is not (see [`key_bytes`](Self::key_bytes)).
    pub fn key(&self) -> Option<&str> {
        std::str::from_utf8(self.key_bytes()).ok()
    }

    /// The key as the shard stores it: bytes, which need not be UTF-8 (tar names are bytes;
    /// Python's `tarfile` keeps them through `surrogateescape`). Two keys that differ in any
    /// byte are two samples. Messages show the bytes that are not UTF-8 as `\xNN`.
    pub fn key_bytes(&self) -> &[u8] {
        self.group().map_or(&[], |g| g.key.as_slice())
    }

    /// The key as messages show it.
    pub(crate) fn shown_key(&self) -> String {
        super::group::show_key(self.key_bytes())
    }

    /// The shard it comes from (path or URL).
    pub fn shard(&self) -> &str {
        &self.index.shards[self.index.shard_of[self.at] as usize].name
    }

    fn shard_bytes(&self) -> &Arc<dyn ByteSource> {
        &self.index.shards[self.index.shard_of[self.at] as usize].bytes
    }

    /// The fields, in shard order.
    pub fn fields(&self) -> &[Field] {
        self.group().map_or(&[], |g| g.fields.as_slice())
    }

    /// The field with extension `ext` (lower-case), if the sample has one.
    pub fn field(&self, ext: &str) -> Option<&Field> {
        self.fields().iter().find(|f| f.ext == ext)
    }

    /// An error about this sample: its shard, the offset of its first header, `problem`.
    pub(crate) fn error(&self, problem: String) -> Error {
        Error::Tar {
            shard: self.shard().to_owned(),
            offset: self.group().map_or(0, |g| g.offset),
            problem,
        }
    }

    fn require(&self, ext: &str) -> Result<&Field> {
        self.field(ext).ok_or_else(|| {
            let have: Vec<&str> = self.fields().iter().map(|f| f.ext.as_str()).collect();
            self.error(format!(
                "sample `{}` has no `.{ext}` member (it has: {}); choose one of its extensions",
                self.shown_key(),
                have.join(", ")
            ))
        })
    }

    /// The bytes of field `ext`: borrowed from the mapped shard, read for other shards.
    ///
    /// # Errors
    ///
    /// [`Error::Tar`] naming the shard and the key when there is no such field or it cannot
    /// be read.
    pub fn bytes(&self, ext: &str) -> Result<Cow<'_, [u8]>> {
        let f = self.require(ext)?;
        if let Some((bytes, from, len)) = self.held_range(f) {
            return Ok(Cow::Borrowed(&bytes.host_bytes()[from..from + len]));
        }
        let len = usize::try_from(f.size).map_err(|_| self.error("too long".into()))?;
        self.shard_bytes()
            .read_at(f.offset, len)
            .map_err(|e| self.error(format!("reading `.{ext}` of `{}`: {e}", self.shown_key())))
    }

    /// Field `ext` as UTF-8 text (`.txt`, `.json`).
    ///
    /// # Errors
    ///
    /// As [`bytes`](Self::bytes); [`Error::Tar`] when it is not UTF-8.
    pub fn text(&self, ext: &str) -> Result<String> {
        let bytes = self.bytes(ext)?;
        String::from_utf8(bytes.into_owned()).map_err(|_| {
            self.error(format!(
                "`.{ext}` of `{}` is not UTF-8 text",
                self.shown_key()
            ))
        })
    }

    /// Field `ext` (`cls`) as a class number: decimal text, spaces around it allowed.
    ///
    /// # Errors
    ///
    /// As [`text`](Self::text); [`Error::Tar`] when it is not a whole number.
    pub fn class(&self, ext: &str) -> Result<i64> {
        let text = self.text(ext)?;
        text.trim().parse().map_err(|_| {
            self.error(format!(
                "`.{ext}` of `{}` is {:?}, not a whole number",
                self.shown_key(),
                text.chars().take(40).collect::<String>()
            ))
        })
    }

    /// Field `ext` (`npy`) as a tensor: a view of the mapped shard (no copy) or, for shards
    /// that are not in memory, of the bytes read.
    ///
    /// # Errors
    ///
    /// As [`bytes`](Self::bytes); [`Error::Npy`] naming `shard:key.ext` for a bad header.
    pub fn npy(&self, ext: &str) -> Result<Tensor> {
        let f = self.require(ext)?;
        let name = format!("{}:{}.{ext}", self.shard(), self.shown_key());
        let shard = self.shard_bytes();
        // Held bytes may be a slice of a received buffer at any address: a member that does
        // not start on an 8-byte boundary (the largest element) is copied into one that does.
        let held = self.held_range(f).filter(|(bytes, from, _)| {
            (bytes.host_bytes().as_ptr() as usize).wrapping_add(*from) % 8 == 0
        });
        let bytes: Arc<dyn HostBytes> = match (held, shard.in_memory(), usize::try_from(f.offset)) {
            (Some((bytes, from, len)), _, _) => Arc::new(HeldBytes {
                bytes: bytes.clone(),
                from,
                len,
            }),
            (None, Some(_), Ok(offset)) => Arc::new(MemberBytes {
                shard: shard.clone(),
                offset,
                len: usize::try_from(f.size).unwrap_or(usize::MAX),
            }),
            _ => Arc::new(AlignedCopy::of(&self.bytes(ext)?)),
        };
        Ok(NpyArray::from_host_bytes(bytes, &name)?.tensor().clone())
    }
}

/// Batches the `.npy` member `ext` of each sample into one `[B, ...]` tensor (each array's
/// bytes copied once, from the shard straight into the pinned batch) and, with a label
/// extension, the class numbers `i64 [B]` in the same block.
///
/// # Errors
///
/// A missing member or a bad header is [`Error::Tar`]/[`Error::Npy`] naming the shard and the
/// key; arrays of different shapes or dtypes in one batch are [`Error::Field`].
#[derive(Clone, Debug)]
pub struct TarNpyBatcher {
    ext: String,
    label: Option<String>,
}

impl TarNpyBatcher {
    /// Arrays from the members with extension `ext`, no labels.
    pub fn new(ext: &str) -> TarNpyBatcher {
        TarNpyBatcher {
            ext: ext.to_lowercase(),
            label: None,
        }
    }

    /// Labels from the members with extension `ext` (e.g. `cls`).
    pub fn label(mut self, ext: &str) -> TarNpyBatcher {
        self.label = Some(ext.to_lowercase());
        self
    }
}

impl Batcher<TarSample> for TarNpyBatcher {
    type Batch = (Tensor, Option<Tensor>);

    fn batch(&self, samples: Vec<TarSample>, c: &mut Collator) -> Result<Self::Batch> {
        let arrays = samples
            .iter()
            .map(|s| s.npy(&self.ext))
            .collect::<Result<Vec<_>>>()?;
        let x = c.stack(&self.ext, &arrays)?;
        let y = match &self.label {
            Some(ext) => {
                let labels = samples
                    .iter()
                    .map(|s| s.class(ext))
                    .collect::<Result<Vec<_>>>()?;
                Some(c.stack_scalars(ext, labels)?)
            }
            None => None,
        };
        let mut out = c.finish()?;
        let x = out.take(x)?;
        let y = match y {
            Some(y) => Some(out.take(y)?),
            None => None,
        };
        Ok((x, y))
    }
}

#[cfg(all(test, feature = "remote"))]
mod tests {
    use std::sync::Arc;

    use super::{Held, TarSample};
    use crate::formats::tar::TarShards;
    use crate::loader::{Dataset, SplitMix64};
    use crate::tensor::HostBytes;

    fn member(out: &mut Vec<u8>, name: &str, data: &[u8]) {
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..108].copy_from_slice(b"0000644\0");
        h[124..136].copy_from_slice(format!("{:011o}\0", data.len()).as_bytes());
        h[156] = b'0';
        h[257..263].copy_from_slice(b"ustar\0");
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(data);
        out.resize(out.len().next_multiple_of(512), 0);
    }

    fn npy_f64(values: &[f64]) -> Vec<u8> {
        let dict = format!(
            "{{'descr': '<f8', 'fortran_order': False, 'shape': ({},), }}",
            values.len()
        );
        let mut header = dict.into_bytes();
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(b' ');
        }
        header.push(b'\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(&header);
        values
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        out
    }

    /// Bytes at `shift` bytes past a 16-byte boundary, as a slice of a received piece may be.
    struct Shifted {
        buffer: Vec<u8>,
        shift: usize,
    }

    impl HostBytes for Shifted {
        fn host_bytes(&self) -> &[u8] {
            &self.buffer[self.shift..]
        }
    }

    fn shifted(bytes: &[u8], shift: usize) -> Held {
        let mut buffer = vec![0u8; 32 + bytes.len()];
        let to = (16 - buffer.as_ptr() as usize % 16) % 16 + shift;
        buffer.truncate(to + bytes.len());
        buffer[to..].copy_from_slice(bytes);
        let held = Shifted { buffer, shift: to };
        assert_eq!(held.host_bytes().as_ptr() as usize % 16, shift);
        Arc::new(held)
    }

    /// A held sample whose bytes start at any address: its `.npy` member reads as the array
    /// it holds, viewed in place when it lies on an 8-byte boundary and copied when not.
    #[test]
    fn npy_members_of_held_bytes_at_any_address_read_whole() {
        let mut rng = SplitMix64::for_test("npy_members_of_held_bytes_at_any_address_read_whole");
        let seed = rng.next_u64();
        let values: Vec<f64> = (0..1 + rng.below(300))
            .map(|_| rng.next_u64() as f64 / 7.0)
            .collect();
        let mut tar = Vec::new();
        member(&mut tar, "s.cls", b"4");
        member(&mut tar, "s.npy", &npy_f64(&values));
        let dir =
            std::env::temp_dir().join(format!("pinnable-held-npy-{}-{seed}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.tar");
        std::fs::write(&path, &tar).unwrap();
        let shards = TarShards::open([path.display().to_string()]).unwrap();
        let local: TarSample = shards.get(0).unwrap();
        let start = local.fields()[0].offset;
        let span = &tar[start as usize..];
        for shift in [0, 1, 4, 8, 9, 15] {
            let bytes = shifted(span, shift);
            let held = local.clone().holding(bytes.clone(), start);
            assert_eq!(held.class("cls").unwrap(), 4);
            let array = held.npy("npy").unwrap();
            assert_eq!(array.to_vec::<f64>().unwrap(), values, "shift {shift}");
            let data = array.as_slice::<f64>().unwrap().as_ptr() as usize;
            let inside = bytes.host_bytes().as_ptr_range();
            let viewed = (inside.start as usize..inside.end as usize).contains(&data);
            assert_eq!(viewed, shift % 8 == 0, "shift {shift}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
