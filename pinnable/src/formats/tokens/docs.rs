//! Documents as samples ([`TokenDocs`]): token shards split at a separator token, or any
//! dataset whose samples are 1-D token tensors, with every document's length known up front.

use std::sync::Arc;

use super::TokenShards;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::loader::Piece;
use crate::loader::dataset::Dataset;
use crate::tensor::Tensor;

/// What becomes of the separator token when shards are split into documents.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Separator {
    /// Dropped: a document is a run of tokens between separators (empty runs are no document).
    #[default]
    Drop,
    /// Kept as the last token of the document it ends, as nanoGPT's `prepare.py` writes them
    /// (`ids.append(eot)`).
    End,
    /// Kept as the first token of the document it starts, as llm.c's `fineweb.py` writes them
    /// (`[eot] + ids`).
    Start,
}

/// Token documents, each a sample ([`Dataset`], a 1-D u16 or u32 tensor), with their lengths
/// known up front so that batches can be planned without loading anything
/// ([`BudgetPlan`](crate::loader::BudgetPlan), [`PackedDocs`](super::PackedDocs)).
///
/// From shards ([`split`](Self::split)): one pass over the tokens finds the separators; the
/// index (a shard, a start and a length per document, 16 bytes) is kept in memory, not on disk
/// — the pass reads tokens at memory speed, a few hundred milliseconds a billion tokens. A
/// document never crosses a shard's end. From a dataset ([`from_dataset`](Self::from_dataset)):
/// each sample is loaded once to learn its length.
///
/// # Examples
///
/// ```
/// use pinnable::formats::tokens::{Separator, TokenDocs, TokenShards};
/// use pinnable::loader::Dataset;
///
/// // Two documents, each ended by the separator 0, as nanoGPT writes them.
/// let tokens: Vec<u16> = vec![5, 6, 7, 0, 8, 9, 0];
/// let path = std::env::temp_dir().join(format!("docs-doc-{}.bin", std::process::id()));
/// std::fs::write(&path, tokens.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>())?;
///
/// let docs = TokenDocs::split(TokenShards::open([&path])?, 0, Separator::End)?;
/// assert_eq!(docs.lengths().as_ref(), &[4, 3]);
/// assert_eq!(docs.get(1)?.to_vec::<u16>()?, vec![8, 9, 0]);
/// let dropped = TokenDocs::split(TokenShards::open([&path])?, 0, Separator::Drop)?;
/// assert_eq!(dropped.get(0)?.to_vec::<u16>()?, vec![5, 6, 7]);
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), pinnable::Error>(())
/// ```
#[derive(Clone)]
pub struct TokenDocs {
    source: Source,
    lengths: Arc<[u32]>,
    dtype: DType,
    vocab: Option<u64>,
}

#[derive(Clone)]
enum Source {
    /// Document `i` is tokens `starts[i] .. starts[i] + lengths[i]` of shard `shard[i]`.
    Shards {
        shards: Arc<TokenShards>,
        shard: Arc<[u32]>,
        starts: Arc<[usize]>,
    },
    Dataset(Arc<dyn Dataset<Sample = Tensor>>),
}

impl std::fmt::Debug for TokenDocs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let from = match &self.source {
            Source::Shards { shards, .. } => format!("{} shards", shards.shards().len()),
            Source::Dataset(_) => "a dataset".to_owned(),
        };
        f.debug_struct("TokenDocs")
            .field("docs", &self.lengths.len())
            .field("dtype", &self.dtype)
            .field("from", &from)
            .finish()
    }
}

impl TokenDocs {
    /// The documents of `shards`, split at the token `separator` (the id is the tokenizer's,
    /// e.g. GPT-2's `<|endoftext|>` is 50256), which `keep` drops or keeps.
    ///
    /// # Errors
    ///
    /// [`Error::TokenShard`] naming the shard and token where a document longer than
    /// `u32::MAX` tokens starts.
    pub fn split(
        shards: impl Into<Arc<TokenShards>>,
        separator: u32,
        keep: Separator,
    ) -> Result<TokenDocs> {
        let shards = shards.into();
        let (mut shard, mut starts, mut lengths) = (Vec::new(), Vec::new(), Vec::new());
        for (s, sh) in shards.shards().iter().enumerate() {
            let mut add = |start: usize, end: usize| -> Result<()> {
                if end > start {
                    let len = u32::try_from(end - start).map_err(|_| Error::TokenShard {
                        path: sh.path().display().to_string(),
                        field: format!("token {start}"),
                        problem: format!(
                            "a document of {} tokens starts here, more than {}: is {separator} \
                             the separator of this tokenizer?",
                            end - start,
                            u32::MAX
                        ),
                    })?;
                    shard.push(s as u32);
                    starts.push(start);
                    lengths.push(len);
                }
                Ok(())
            };
            let cuts = match shards.dtype() {
                DType::U16 => separators::<u16>(sh.tokens().as_slice()?, separator),
                _ => separators::<u32>(sh.tokens().as_slice()?, separator),
            };
            let mut start = 0;
            for at in cuts {
                match keep {
                    Separator::Drop => add(start, at)?,
                    Separator::End => add(start, at + 1)?,
                    Separator::Start => add(start, at)?,
                }
                start = if keep == Separator::Start { at } else { at + 1 };
            }
            add(start, sh.len())?;
        }
        Ok(TokenDocs {
            dtype: shards.dtype(),
            vocab: shards.vocab(),
            source: Source::Shards {
                shards,
                shard: shard.into(),
                starts: starts.into(),
            },
            lengths: lengths.into(),
        })
    }

    /// The documents of `dataset`, whose samples are 1-D u16 or u32 token tensors (all of one
    /// dtype). Each sample is loaded once, now, to learn its length; a zero-length document is
    /// kept and never batched.
    ///
    /// # Errors
    ///
    /// [`Error::Sample`] naming the first sample that fails to load, is not 1-D, has another
    /// dtype than the first, or more than `u32::MAX` tokens.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::formats::tokens::TokenDocs;
    /// use pinnable::Tensor;
    ///
    /// let docs = vec![Tensor::from_vec1(vec![1u16, 2, 3]), Tensor::from_vec1(vec![4u16])];
    /// let docs = TokenDocs::from_dataset(docs)?;
    /// assert_eq!(docs.lengths().as_ref(), &[3, 1]);
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn from_dataset<D>(dataset: D) -> Result<TokenDocs>
    where
        D: Dataset<Sample = Tensor> + 'static,
    {
        let mut lengths = Vec::with_capacity(dataset.len());
        let mut dtype = None;
        for i in 0..dataset.len() {
            let bad = |problem: String| Error::Sample {
                index: i,
                during: "indexing",
                source: Box::new(Error::Shape(problem)),
            };
            let t = dataset.get(i).map_err(|e| Error::Sample {
                index: i,
                during: "indexing",
                source: Box::new(e),
            })?;
            if t.rank() != 1 {
                return Err(bad(format!(
                    "document {i} has shape {:?}; documents are 1-D token tensors",
                    t.shape()
                )));
            }
            let want = *dtype.get_or_insert(t.dtype());
            if !matches!(t.dtype(), DType::U16 | DType::U32) || t.dtype() != want {
                return Err(bad(format!(
                    "document {i} holds {} tokens; documents hold u16 or u32 tokens, all of one \
                     dtype ({want} from document 0): convert them",
                    t.dtype()
                )));
            }
            lengths.push(u32::try_from(t.numel()).map_err(|_| {
                bad(format!(
                    "document {i} has {} tokens, more than {}",
                    t.numel(),
                    u32::MAX
                ))
            })?);
        }
        Ok(TokenDocs {
            source: Source::Dataset(Arc::new(dataset)),
            lengths: lengths.into(),
            dtype: dtype.unwrap_or(DType::U16),
            vocab: None,
        })
    }

    /// Every document's length in tokens, in order.
    pub fn lengths(&self) -> &Arc<[u32]> {
        &self.lengths
    }

    /// The number of documents.
    pub fn len(&self) -> usize {
        self.lengths.len()
    }

    /// Whether there is no document.
    pub fn is_empty(&self) -> bool {
        self.lengths.is_empty()
    }

    /// The tokens of every document.
    pub fn tokens(&self) -> usize {
        self.lengths.iter().map(|&l| l as usize).sum()
    }

    /// The token type: [`DType::U16`] or [`DType::U32`].
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The vocabulary size the shards' tokens were checked against, if they were.
    pub fn vocab(&self) -> Option<u64> {
        self.vocab
    }

    /// Document `index`'s tokens: a view of its shard, or the dataset's sample.
    ///
    /// # Errors
    ///
    /// [`Error::IndexOutOfRange`] past the last document; the dataset's own errors.
    pub fn doc(&self, index: usize) -> Result<Tensor> {
        let Some(&len) = <[u32]>::get(&self.lengths, index) else {
            return Err(Error::IndexOutOfRange {
                index,
                len: self.len(),
            });
        };
        match &self.source {
            Source::Shards {
                shards,
                shard,
                starts,
            } => {
                let tokens = shards.shards()[shard[index] as usize].tokens();
                tokens.narrow(0, starts[index], len as usize)
            }
            Source::Dataset(d) => d.get(index),
        }
    }

    /// Copies the tokens of `pieces`, one after another, into `out` (of the documents' dtype,
    /// at least as long as the pieces).
    ///
    /// # Errors
    ///
    /// [`Error::Sample`] naming a document that is not as long as the plan says (a dataset
    /// that changed its answer) or a piece outside it.
    pub(crate) fn copy_pieces<T: Element>(&self, pieces: &[Piece], out: &mut [T]) -> Result<()> {
        let mut at = 0;
        for p in pieces {
            let doc = self.doc(p.sample)?;
            let src = doc.as_slice::<T>()?;
            let Some(part) = p
                .start
                .checked_add(p.len)
                .and_then(|end| src.get(p.start..end))
            else {
                return Err(Error::Sample {
                    index: p.sample,
                    during: "collating",
                    source: Box::new(Error::Shape(format!(
                        "the plan takes tokens {}..{} of document {}, which has {}; the \
                         dataset changed since it was indexed",
                        p.start,
                        p.start.saturating_add(p.len),
                        p.sample,
                        src.len()
                    ))),
                });
            };
            out[at..at + p.len].copy_from_slice(part);
            at += p.len;
        }
        Ok(())
    }
}

/// The positions of `separator` in `tokens`.
fn separators<T: Element + Into<u64>>(tokens: &[T], separator: u32) -> Vec<usize> {
    let sep = u64::from(separator);
    tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| (**t).into() == sep)
        .map(|(i, _)| i)
        .collect()
}

/// Document `index`'s tokens.
impl Dataset for TokenDocs {
    type Sample = Tensor;

    fn len(&self) -> usize {
        TokenDocs::len(self)
    }

    fn get(&self, index: usize) -> Result<Tensor> {
        self.doc(index)
    }
}
