//! Language-model data: shards of token ids as one stream of tokens ([`TokenShards`]), either
//! split into documents ([`TokenDocs`]) packed for varlen attention ([`PackedDocs`],
//! [`PackedBatcher`]), or cut into windows of `context + 1` tokens ([`TokenWindows`]), batched
//! into `x` and `y` — the first `context` tokens of each window and the same shifted by one —
//! widened to i64 or i32 ([`TokenBatcher`], [`TokenBatch`]): on the GPU for a CUDA device, so
//! only the u16 or u32 tokens cross the link, by the loader's workers for the host.
//!
//! **Shards** are files of u16 or u32 token ids in any of three formats ([`ShardFormat`]):
//! raw little-endian (nanoGPT's `train.bin`), llm.c's (a 256 × i32 header, then the tokens),
//! or a 1-D `.npy` array. Each is either read once, when opened, into pinned memory — every
//! such shard into one pinned block, which the copy engine and the GPU can read where it is — or
//! memory-mapped and read where it lies ([`Residency`]).
//!
//! **Windows** never cross a shard's end. Window `j` of a shard holds its tokens
//! `j·context .. j·context + context + 1`: consecutive windows overlap by one token, so `x`
//! covers each token once per epoch (but a shard's last `(len − 1) mod context` tokens). The
//! loader's [`shuffle`](crate::loader::LoaderBuilder::shuffle) visits the windows in a random order
//! drawn from the seed and the epoch; [`shard`](crate::loader::LoaderBuilder::shard) with
//! [`drop_last`](crate::loader::LoaderBuilder::drop_last) gives each rank disjoint windows (without
//! `drop_last`, a few windows repeat to make the ranks' parts even, as PyTorch's
//! `DistributedSampler` does); a position ([`Position`](crate::loader::Position)) resumes the run at
//! the next batch.
//!
//! **Documents** ([`TokenDocs`]): shards split at a separator token, or a dataset of 1-D token
//! tensors, each document a sample, their lengths known up front. A
//! [`BudgetPlan`](crate::loader::BudgetPlan) plans batches of them under a token budget, and
//! [`PackedDocs`] packs them into batches for varlen attention ([`PackedBatch`]: `input_ids`,
//! `cu_seqlens`, `max_seqlen`, `position_ids`, `labels`, `seq_idx`), the same number on
//! every rank.
//!
//! # Examples
//!
//! ```
//! use pinnable::loader::Loader;
//! use pinnable::formats::tokens::{TokenShards, TokenWindows};
//! use pinnable::{DType, Device, ToDevice};
//!
//! // A raw u16 shard, as nanoGPT's prepare.py writes `train.bin` (np.uint16 tofile).
//! let tokens: Vec<u16> = (0..1000).map(|i| (i * 7 % 50257) as u16).collect();
//! let path = std::env::temp_dir().join(format!("tokens-doc-{}.bin", std::process::id()));
//! std::fs::write(&path, tokens.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
//!
//! let shards = TokenShards::open([&path])?; // into pinned memory, once
//! let windows = TokenWindows::new(shards, 64)?; // (1000 - 1) / 64 = 15 windows of 65 tokens
//! assert_eq!(windows.len(), 15);
//! let device = Device::cuda(0).unwrap_or_else(|_| Device::cpu());
//! let batcher = windows.batcher(DType::I64)?; // on a GPU: u16 cross, i64 made there
//! let loader = Loader::builder(windows)
//!     .batch_size(4)
//!     .shuffle(1)
//!     .drop_last(true)
//!     .device(device)
//!     .build(batcher)?;
//! for batch in &loader {
//!     let batch = batch?;
//!     let (x, y) = (batch.x.tensor()?, batch.y.tensor()?);
//!     let (x, y) = (x.to_cpu(false)?.to_vec::<i64>()?, y.to_cpu(false)?.to_vec::<i64>()?);
//!     assert_eq!(x.len(), 4 * 64);
//!     assert_eq!(x[1..64], y[..63]); // y is x shifted by one
//! }
//! # std::fs::remove_file(&path).unwrap();
//! # Ok::<(), pinnable::Error>(())
//! ```

mod docs;
mod format;
mod open;
mod pack;
mod windows;

use std::fmt;
use std::path::{Path, PathBuf};

pub use docs::{Separator, TokenDocs};
pub use format::ShardFormat;
pub use open::{Residency, ShardOptions};
pub use pack::{IGNORE_INDEX, PackedBatch, PackedBatcher, PackedDocs};
pub use windows::{TokenBatch, TokenBatcher, TokenWindows, Window};

use crate::dtype::DType;
use crate::error::Result;
use crate::storage::{Session, Storage};
use crate::tensor::Tensor;
use open::shard_error;

/// Shards of token ids, in order, as one stream of tokens: some read into pinned memory, some
/// memory-mapped ([`Residency`]). Cut it into windows with [`TokenWindows`].
///
/// See the [module docs](self) for an example.
#[derive(Clone, Debug)]
pub struct TokenShards {
    shards: Vec<Shard>,
    dtype: DType,
    tokens: usize,
    /// Every pinned shard's tokens, one after another, in one pinned block.
    pinned: Option<Tensor>,
    /// The vocabulary size every token was checked to be below, if any.
    vocab: Option<u64>,
}

impl TokenShards {
    /// These shards cut into documents at every `separator` token, each document keeping its
    /// separator at its end (GPT-2's `<|endoftext|>` after every document):
    /// [`TokenDocs::split`]`(self, separator, Separator::End)`. For another rule, call `split`.
    ///
    /// # Errors
    ///
    /// As [`TokenDocs::split`].
    pub fn documents(self, separator: u32) -> Result<TokenDocs> {
        TokenDocs::split(self, separator, Separator::End)
    }

    /// Options for opening shards: format, residency, pool, vocabulary.
    pub fn options() -> ShardOptions {
        ShardOptions::new()
    }

    /// Reads the shards at `locations` (paths, or with the `remote` feature `s3://` and
    /// `http(s)://` URLs) into pinned memory, once, with the default options
    /// ([`ShardOptions::open`]).
    ///
    /// # Errors
    ///
    /// As [`ShardOptions::open`].
    pub fn open<P: AsRef<Path>>(locations: impl IntoIterator<Item = P>) -> Result<TokenShards> {
        ShardOptions::new().open(locations)
    }

    /// Reads the shards at `locations` into pinned memory, read as `storage` says
    /// ([`ShardOptions::open_with`]).
    ///
    /// # Errors
    ///
    /// As [`ShardOptions::open`].
    pub fn open_with<P: AsRef<Path>>(
        storage: &Storage,
        locations: impl IntoIterator<Item = P>,
    ) -> Result<TokenShards> {
        ShardOptions::new().open_with(storage, locations)
    }

    /// Opens the local shards at `paths` with the default options ([`ShardFormat::Auto`],
    /// [`Residency::Auto`]): small shards read into pinned memory, large ones mapped.
    ///
    /// # Errors
    ///
    /// As [`ShardOptions::open`].
    ///
    /// # Safety
    ///
    /// As [`ShardOptions::open_mapped`]: no file may be written or truncated while it is
    /// mapped.
    pub unsafe fn open_mapped<P: AsRef<Path>>(
        paths: impl IntoIterator<Item = P>,
    ) -> Result<TokenShards> {
        ShardOptions::new().load(&Session::new(&Storage::new()), paths)
    }

    /// The tokens of every shard.
    pub fn len(&self) -> usize {
        self.tokens
    }

    /// Whether there is no token.
    pub fn is_empty(&self) -> bool {
        self.tokens == 0
    }

    /// The token type: [`DType::U16`] or [`DType::U32`].
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The vocabulary size every token id was checked to be below when the shards were opened
    /// ([`ShardOptions::vocab`]), if they were.
    pub fn vocab(&self) -> Option<u64> {
        self.vocab
    }

    /// The shards, in order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// Every pinned shard's tokens, one after another in one pinned 1-D tensor (shard `i`'s
    /// starting at [`Shard::pinned_at`]), `None` when no shard is pinned.
    pub fn pinned(&self) -> Option<&Tensor> {
        self.pinned.as_ref()
    }

    /// The bytes of tokens kept in `residency` ([`Residency::Pinned`] or
    /// [`Residency::Mapped`]).
    pub fn bytes(&self, residency: Residency) -> usize {
        self.shards
            .iter()
            .filter(|s| s.residency == residency)
            .map(|s| s.len() * self.dtype.size())
            .sum()
    }
}

/// `3 shards, 1200000 u16 tokens: 2 pinned (1.6 MB), 1 mapped (800.0 kB)`.
impl fmt::Display for TokenShards {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} shards, {} {} tokens:",
            self.shards.len(),
            self.tokens,
            self.dtype
        )?;
        let mut sep = " ";
        for r in [Residency::Pinned, Residency::Mapped] {
            let n = self.shards.iter().filter(|s| s.residency == r).count();
            if n > 0 {
                let mb = self.bytes(r) as f64 / 1e6;
                write!(f, "{sep}{n} {r} ({mb:.1} MB)")?;
                sep = ", ";
            }
        }
        Ok(())
    }
}

/// One shard file of a [`TokenShards`].
#[derive(Clone, Debug)]
pub struct Shard {
    path: PathBuf,
    format: ShardFormat,
    residency: Residency,
    tokens: Tensor,
    pinned_at: Option<usize>,
}

impl Shard {
    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its format, as found (never [`ShardFormat::Auto`]).
    pub fn format(&self) -> ShardFormat {
        self.format
    }

    /// Where its tokens are kept: [`Residency::Pinned`] or [`Residency::Mapped`].
    pub fn residency(&self) -> Residency {
        self.residency
    }

    /// Its tokens.
    pub fn len(&self) -> usize {
        self.tokens.numel()
    }

    /// Whether it holds no token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its tokens: a 1-D u16 or u32 tensor, a part of the shards' pinned block or a view of
    /// the mapped file.
    pub fn tokens(&self) -> &Tensor {
        &self.tokens
    }

    /// Where its tokens start in [`TokenShards::pinned`], for a pinned shard.
    pub fn pinned_at(&self) -> Option<usize> {
        self.pinned_at
    }

    fn check_vocab(&self, vocab: u64) -> Result<()> {
        fn first_bad<T: crate::dtype::Element + Into<u64>>(
            s: &[T],
            vocab: u64,
        ) -> Option<(usize, u64)> {
            s.iter()
                .map(|&t| t.into())
                .enumerate()
                .find(|&(_, t)| t >= vocab)
        }
        let bad = match self.tokens.dtype() {
            DType::U16 => first_bad(self.tokens.as_slice::<u16>()?, vocab),
            _ => first_bad(self.tokens.as_slice::<u32>()?, vocab),
        };
        match bad {
            Some((i, t)) => Err(shard_error(
                &self.path,
                &format!("token {i}"),
                format!(
                    "id {t} is not below the vocabulary size {vocab}: the shard was written by \
                     another tokenizer, or is not a token shard"
                ),
            )),
            None => Ok(()),
        }
    }
}
