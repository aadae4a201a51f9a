//! Opening token shards: where each one's tokens are kept ([`Residency`]), the options
//! ([`ShardOptions`]), and reading, pinning or mapping the files, every length checked against
//! the file first.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::format::{self, HEAD, Layout, ShardFormat};
use super::{Shard, TokenShards};
use crate::alloc::PinnedPool;
use crate::batch::BatchLayout;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::storage::{ByteSource, Mapping, Session, Storage, is_url};
use crate::tensor::{HostBytes, Tensor};

/// Where a shard's tokens are kept once opened.
///
/// # Examples
///
/// ```
/// use pinnable::formats::tokens::{Residency, ShardOptions};
///
/// // Read shards into pinned memory up to 2 GiB in all, map the rest (the default rule with
/// // a limit of one's own).
/// let options = ShardOptions::new().residency(Residency::Auto).pin_limit(2 << 30);
/// # let _ = options;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Residency {
    /// Shards are read into pinned memory in the order given while their bytes together stay
    /// within the pin limit ([`ShardOptions::pin_limit`]: by default a quarter of the machine's
    /// memory, and never more than the pool's budget); the others are mapped. If the pinned
    /// memory cannot be had (the pool's budget, `ulimit -l`), every shard is mapped.
    #[default]
    Auto,
    /// Every shard read into pinned memory, once, when opened: the GPU and the copy engine
    /// read its tokens where they are. Opening fails if the pool cannot give the memory.
    Pinned,
    /// Every shard memory-mapped and read where it lies, through the page cache: batches are
    /// gathered into pinned memory by the loader's workers.
    Mapped,
}

impl fmt::Display for Residency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Residency::Auto => "auto",
            Residency::Pinned => "pinned",
            Residency::Mapped => "mapped",
        })
    }
}

/// How [`TokenShards`] opens its files: their format, where their tokens are kept, the pool of
/// pinned memory and an optional vocabulary check.
#[derive(Clone, Debug, Default)]
#[must_use = "options do nothing until `open` or `read`"]
pub struct ShardOptions {
    format: ShardFormat,
    residency: Residency,
    pin_limit: Option<usize>,
    pool: Option<PinnedPool>,
    vocab: Option<u64>,
}

impl ShardOptions {
    /// The defaults: [`ShardFormat::Auto`], [`Residency::Auto`], the process-wide pool, no
    /// vocabulary check.
    pub fn new() -> Self {
        Self::default()
    }

    /// The files' format (the same for every shard).
    pub fn format(mut self, format: ShardFormat) -> Self {
        self.format = format;
        self
    }

    /// Where shards' tokens are kept.
    pub fn residency(mut self, residency: Residency) -> Self {
        self.residency = residency;
        self
    }

    /// The most bytes of tokens [`Residency::Auto`] reads into pinned memory.
    pub fn pin_limit(mut self, bytes: usize) -> Self {
        self.pin_limit = Some(bytes);
        self
    }

    /// The pool pinned shards come from (by default [`PinnedPool::global`]).
    pub fn pool(mut self, pool: &PinnedPool) -> Self {
        self.pool = Some(pool.clone());
        self
    }

    /// Checks, when opening, that every token id is below `vocab` (e.g. GPT-2's 50257): a
    /// shard written by another tokenizer fails here, naming the token, not as an
    /// out-of-range embedding on the GPU. A mapped shard is read once for the check.
    pub fn vocab(mut self, vocab: u64) -> Self {
        self.vocab = Some(vocab);
        self
    }

    /// Reads the shards at `locations` (paths, or with the `remote` feature `s3://` and
    /// `http(s)://` URLs), in order, as one stream of tokens, into pinned memory (whatever
    /// [`residency`](Self::residency) says), with the default [`Storage`] settings: nothing
    /// is mapped, so nothing a file's later writers do can change the tokens.
    ///
    /// # Errors
    ///
    /// [`Error::TokenShard`] naming the file and the field for a file that cannot be read
    /// (a URL without the `remote` feature), is truncated, has a wrong magic number or
    /// version, a byte count that is not a whole number of tokens, tokens of another type than
    /// the first shard's, or a token id not below [`vocab`](Self::vocab); [`Error::Config`]
    /// for no paths; allocation errors when the pool cannot give the memory.
    pub fn open<P: AsRef<Path>>(
        self,
        locations: impl IntoIterator<Item = P>,
    ) -> Result<TokenShards> {
        self.open_with(&Storage::new(), locations)
    }

    /// Reads the shards at `locations` as [`open`](Self::open) does, read as `storage` says.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open).
    pub fn open_with<P: AsRef<Path>>(
        self,
        storage: &Storage,
        locations: impl IntoIterator<Item = P>,
    ) -> Result<TokenShards> {
        self.residency(Residency::Pinned)
            .load(&Session::new(storage), locations)
    }

    /// Opens the shards at `paths`, in order, as one stream of tokens, keeping each as
    /// [`residency`](Self::residency) says: mapped shards' windows view the mapping, no copy.
    /// A URL among them is read into pinned memory, as [`open`](Self::open) reads it.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open).
    ///
    /// # Safety
    ///
    /// 1. Nothing (this process or another) writes to or truncates a file that is mapped
    ///    (any local shard unless [`Residency::Pinned`]) while the shards, or a tensor or
    ///    batch viewing them, live: the mapping is not a snapshot, and a write would change
    ///    tokens that tensors read as unchanging, a truncation make reading them fault. Shards
    ///    written once and then only read satisfy this. [`open`](Self::open) maps nothing and
    ///    is safe.
    pub unsafe fn open_mapped<P: AsRef<Path>>(
        self,
        paths: impl IntoIterator<Item = P>,
    ) -> Result<TokenShards> {
        self.load(&Session::new(&Storage::new()), paths)
    }

    /// Opens the shards through `session`; maps local files unless the residency is
    /// `Pinned` (the caller of `open_mapped` took on the mapping's contract).
    pub(super) fn load<P: AsRef<Path>>(
        self,
        session: &Session,
        paths: impl IntoIterator<Item = P>,
    ) -> Result<TokenShards> {
        let found = paths
            .into_iter()
            .map(|p| probe(session, p.as_ref(), self.format))
            .collect::<Result<Vec<_>>>()?;
        let Some((first, _, l, _)) = found.first() else {
            return Err(Error::Config {
                setting: "shards",
                problem: "no shard files were given".into(),
            });
        };
        let (first, dtype) = (first.clone(), l.dtype);
        if let Some((path, _, l, _)) = found.iter().find(|(_, _, l, _)| l.dtype != dtype) {
            return Err(shard_error(
                path,
                "token type",
                format!(
                    "{} tokens, but `{}` holds {dtype}: the shards of one stream hold one token \
                     type",
                    l.dtype,
                    first.display()
                ),
            ));
        }
        let pool = self
            .pool
            .clone()
            .unwrap_or_else(|| PinnedPool::global().clone());
        let pin = self.choose(&found, &pool);
        let (pinned, mut shards) = match read_pinned(&found, &pin, dtype, &pool) {
            Ok(done) => done,
            Err(_) if self.residency == Residency::Auto => {
                read_pinned(&found, &vec![false; found.len()], dtype, &pool)?
            }
            Err(e) => return Err(e),
        };
        for (shard, (path, len, l, _)) in shards.iter_mut().zip(&found) {
            if shard.is_none() {
                *shard = Some(map(path, *len, l)?);
            }
        }
        let shards: Vec<Shard> = shards.into_iter().flatten().collect();
        if let Some(vocab) = self.vocab {
            shards.iter().try_for_each(|s| s.check_vocab(vocab))?;
        }
        Ok(TokenShards {
            tokens: shards.iter().map(Shard::len).sum(),
            dtype,
            pinned,
            shards,
            vocab: self.vocab,
        })
    }

    /// Which shards are read into pinned memory.
    fn choose(&self, found: &[Found], pool: &PinnedPool) -> Vec<bool> {
        let limit = match self.residency {
            Residency::Pinned => return vec![true; found.len()],
            // A URL cannot be mapped: it is read into pinned memory.
            Residency::Mapped => {
                return found
                    .iter()
                    .map(|(path, ..)| is_url(&path.to_string_lossy()))
                    .collect();
            }
            Residency::Auto => self.pin_limit.unwrap_or_else(|| default_pin_limit(pool)),
        };
        let mut total = 0usize;
        found
            .iter()
            .map(|(path, _, l, _)| {
                // A URL cannot be mapped: it is read into pinned memory whatever the limit.
                if is_url(&path.to_string_lossy()) {
                    return true;
                }
                let bytes = l.tokens * l.dtype.size();
                let fits = total.checked_add(bytes).is_some_and(|t| t <= limit);
                if fits {
                    total += bytes;
                }
                fits
            })
            .collect()
    }
}

/// A shard found: its path or URL, length, layout and bytes.
type Found = (PathBuf, u64, Layout, Arc<dyn ByteSource>);

/// A quarter of the machine's memory, within the pool's budget.
fn default_pin_limit(pool: &PinnedPool) -> usize {
    // SAFETY: sysconf only reads system configuration.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let memory = usize::try_from(pages)
        .ok()
        .zip(usize::try_from(page).ok())
        .map_or(0, |(n, p)| n.saturating_mul(p));
    (memory / 4).min(pool.config().max_bytes.unwrap_or(usize::MAX))
}

pub(super) fn shard_error(path: &Path, field: &str, problem: String) -> Error {
    Error::TokenShard {
        path: path.display().to_string(),
        field: field.to_owned(),
        problem,
    }
}

/// The file's path, length, layout and bytes, from its first bytes.
fn probe(session: &Session, path: &Path, format: ShardFormat) -> Result<Found> {
    let io = |e: std::io::Error| shard_error(path, "file", e.to_string());
    let source = session.open(&path.to_string_lossy()).map_err(|e| match e {
        Error::Storage { problem, .. } => shard_error(path, "file", problem),
        e => e,
    })?;
    let len = source.len();
    let mut head = vec![0u8; HEAD.min(usize::try_from(len).unwrap_or(HEAD))];
    source.read_into(0, &mut head).map_err(io)?;
    let layout =
        format::layout(format, &head, len).map_err(|p| shard_error(path, &p.field, p.problem))?;
    Ok((path.to_owned(), len, layout, source))
}

/// Reads the shards marked in `pin` into one pinned block, one after another; the others are
/// `None`.
fn read_pinned(
    found: &[Found],
    pin: &[bool],
    dtype: DType,
    pool: &PinnedPool,
) -> Result<(Option<Tensor>, Vec<Option<Shard>>)> {
    let total: usize = found
        .iter()
        .zip(pin)
        .filter(|(_, p)| **p)
        .map(|((_, _, l, _), _)| l.tokens)
        .sum();
    if !pin.iter().any(|p| *p) {
        return Ok((None, (0..found.len()).map(|_| None).collect()));
    }
    let mut layout = BatchLayout::new();
    let slot = layout.push(dtype, &[total])?;
    let mut block = layout.allocate_in(pool)?;
    {
        let mut view = block.view_mut(slot);
        let bytes = view_bytes(&mut view, dtype)?;
        let mut at = 0;
        for ((path, _, l, source), _) in found.iter().zip(pin).filter(|(_, p)| **p) {
            let n = l.tokens * dtype.size();
            read_tokens(path, source.as_ref(), l, &mut bytes[at..at + n])?;
            at += n;
        }
    }
    let all = block.finish().pop().expect("one tensor");
    let mut at = 0;
    let shards = found
        .iter()
        .zip(pin)
        .map(|((path, _, l, _), &p)| {
            if !p {
                return Ok(None);
            }
            let tokens = all.narrow(0, at, l.tokens)?;
            at += l.tokens;
            Ok(Some(Shard {
                path: path.clone(),
                format: l.format,
                residency: Residency::Pinned,
                tokens,
                pinned_at: Some(at - l.tokens),
            }))
        })
        .collect::<Result<_>>()?;
    Ok((Some(all), shards))
}

/// The bytes of a pinned view of u16 or u32 tokens.
fn view_bytes<'v>(view: &'v mut crate::batch::TensorMut<'_>, dtype: DType) -> Result<&'v mut [u8]> {
    let (ptr, bytes) = match dtype {
        DType::U16 => {
            let s = view.as_mut_slice::<u16>()?;
            (s.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(s))
        }
        _ => {
            let s = view.as_mut_slice::<u32>()?;
            (s.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(s))
        }
    };
    // SAFETY: the slice above is exclusively borrowed for 'v and is `bytes` long; u16 and u32
    // are plain integers, so any bytes written through this view are valid tokens.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, bytes) })
}

/// Reads a shard's tokens (`dst.len()` bytes) from its bytes (a short read, as from a file
/// cut since its header was read, is an error naming the file).
fn read_tokens(path: &Path, source: &dyn ByteSource, l: &Layout, dst: &mut [u8]) -> Result<()> {
    source
        .read_into(l.offset as u64, dst)
        .map_err(|e| shard_error(path, "file", e.to_string()))
}

fn check_unchanged(path: &Path, then: u64, now: u64) -> Result<()> {
    if then != now {
        return Err(shard_error(
            path,
            "file size",
            format!(
                "{then} bytes when its header was read, {now} bytes now: it changed while it was opened"
            ),
        ));
    }
    Ok(())
}

/// Maps a shard's file; its tokens view the mapping.
fn map(path: &Path, len: u64, l: &Layout) -> Result<Shard> {
    let tokens = if l.tokens == 0 {
        match l.dtype {
            DType::U16 => Tensor::from_vec1(Vec::<u16>::new()),
            _ => Tensor::from_vec1(Vec::<u32>::new()),
        }
    } else {
        let mapping = Mapping::open(path).map_err(|e| shard_error(path, "file", e))?;
        check_unchanged(path, len, mapping.host_bytes().len() as u64)?;
        Tensor::from_host_bytes(Arc::new(mapping), l.dtype, &[l.tokens], l.offset)
            .map_err(|e| shard_error(path, "data", e.to_string()))?
    };
    Ok(Shard {
        path: path.to_owned(),
        format: l.format,
        residency: Residency::Mapped,
        tokens,
        pinned_at: None,
    })
}
