//! Windows of `context + 1` tokens as a dataset ([`TokenWindows`]), and their batches
//! ([`TokenBatcher`], [`TokenBatch`]).

use std::sync::Arc;

use super::TokenShards;
use crate::batch::TensorMut;
use crate::convert::Convert;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::gather::Gather;
use crate::loader::batcher::Batcher;
use crate::loader::collate::Collator;
use crate::loader::dataset::Dataset;
use crate::path::Walk;
use crate::pin::{PinContext, Pinnable};
use crate::tensor::Tensor;
use crate::transfer::{MoveContext, ToDevice};

/// The windows of `context + 1` tokens of [`TokenShards`], as a [`Dataset`]: sample `i` is
/// window `i` ([`Window`]), and a loader over it shuffles, shards and resumes windows as it
/// does any dataset's samples. Window `j` of a shard holds its tokens
/// `j·context .. j·context + context + 1`; no window crosses the end of a shard.
///
/// # Examples
///
/// ```
/// use pinnable::formats::tokens::{TokenShards, TokenWindows, Window};
///
/// let dir = std::env::temp_dir().join(format!("windows-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let (a, b) = (dir.join("a.bin"), dir.join("b.bin"));
/// std::fs::write(&a, vec![0u8; 2 * 100]).unwrap(); // 100 u16 tokens
/// std::fs::write(&b, vec![0u8; 2 * 40]).unwrap(); // 40
///
/// let windows = TokenWindows::new(TokenShards::open([&a, &b])?, 16)?;
/// assert_eq!(windows.len(), 6 + 2); // (100 - 1) / 16 and (40 - 1) / 16
/// assert_eq!(windows.window(6)?, Window { shard: 1, start: 0 });
/// assert_eq!(windows.window(5)?, Window { shard: 0, start: 80 }); // tokens 80..97
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok::<(), pinnable::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct TokenWindows {
    shards: Arc<TokenShards>,
    context: usize,
    /// `first[i]`: the index of shard `i`'s first window; `first[shards]`: the window count.
    first: Vec<usize>,
}

/// One window: tokens `start .. start + context + 1` of shard `shard`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    /// The shard's index in [`TokenShards::shards`].
    pub shard: usize,
    /// The window's first token in the shard.
    pub start: usize,
}

impl TokenWindows {
    /// The windows of `context + 1` tokens of `shards`.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a context of 0, or one so long that no shard holds a window.
    pub fn new(shards: impl Into<Arc<TokenShards>>, context: usize) -> Result<TokenWindows> {
        let shards = shards.into();
        if context == 0 {
            return Err(Error::Config {
                setting: "context",
                problem: "a window needs a context of at least 1 token".into(),
            });
        }
        let mut first = vec![0];
        for s in shards.shards() {
            let n = s.len().saturating_sub(1) / context;
            first.push(first.last().copied().unwrap_or(0) + n);
        }
        if first.last() == Some(&0) {
            let longest = shards.shards().iter().map(|s| s.len()).max().unwrap_or(0);
            return Err(Error::Config {
                setting: "context",
                problem: format!(
                    "no shard holds a window of {} tokens (the context and one more); the \
                     longest holds {longest}",
                    context.saturating_add(1)
                ),
            });
        }
        Ok(TokenWindows {
            shards,
            context,
            first,
        })
    }

    /// The tokens of `x` (and of `y`) per window.
    pub fn context(&self) -> usize {
        self.context
    }

    /// The shards.
    pub fn shards(&self) -> &TokenShards {
        &self.shards
    }

    /// The number of windows.
    pub fn len(&self) -> usize {
        self.first.last().copied().unwrap_or(0)
    }

    /// Whether there is no window.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Window `index`.
    ///
    /// # Errors
    ///
    /// [`Error::IndexOutOfRange`] past the last window.
    pub fn window(&self, index: usize) -> Result<Window> {
        if index >= self.len() {
            return Err(Error::IndexOutOfRange {
                index,
                len: self.len(),
            });
        }
        // The last shard whose first window is at or before `index` (empty shards share their
        // successor's first window, so take the last of equals).
        let shard = self.first.partition_point(|&f| f <= index) - 1;
        Ok(Window {
            shard,
            start: (index - self.first[shard]) * self.context,
        })
    }

    /// The batcher of these windows: batches `x` and `y`
    /// of `dtype`, [`DType::I64`] (what PyTorch's embedding and cross-entropy take) or
    /// [`DType::I32`].
    ///
    /// For a CUDA device, only the tokens cross the link: `x` and `y` are [`Gather`]s of
    /// windows, read by the GPU where they lie when every window of the batch is in a pinned
    /// shard, else from the batch's pinned block, into which the loader's worker copies the
    /// windows (a mapped shard is staged there); the move widens them on the GPU. For the host
    /// ([`Device::cpu`](crate::Device::cpu)), the worker writes `x` and `y`, widened, into the batch's pinned block.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for another dtype. A batch of i32 tokens from u32 shards for a CUDA
    /// device fails unless the shards were opened with a vocabulary check that keeps them
    /// below 2³¹ ([`ShardOptions::vocab`]: the GPU widens as Rust's `as` does, and a larger id
    /// would wrap).
    ///
    /// [`ShardOptions::vocab`]: super::ShardOptions::vocab
    pub fn batcher(&self, dtype: DType) -> Result<TokenBatcher> {
        if !matches!(dtype, DType::I64 | DType::I32) {
            return Err(Error::Config {
                setting: "dtype",
                problem: format!("token batches are i64 or i32, not {dtype}"),
            });
        }
        Ok(TokenBatcher {
            shards: self.shards.clone(),
            context: self.context,
            dtype,
            gather: false,
        })
    }
}

impl Dataset for TokenWindows {
    type Sample = Window;

    fn len(&self) -> usize {
        TokenWindows::len(self)
    }

    fn get(&self, index: usize) -> Result<Window> {
        self.window(index)
    }
}

/// A batch of windows: `x`, the first `context` tokens of each window, and `y`, the same
/// shifted by one token (the next-token targets), both `[batch, context]` of i64 or i32.
///
/// Fields are [`Gather`]s: a batcher for a CUDA device leaves the windows to be gathered and
/// widened by the move, so a loader delivers them stacked on the device; take the tensors with
/// [`Gather::tensor`] (a cheap handle once stacked; a batch that was never moved is gathered
/// and widened on the host by that call).
#[derive(Clone, Debug)]
pub struct TokenBatch {
    /// The inputs, `[batch, context]`.
    pub x: Gather,
    /// The targets, `[batch, context]`: `y[i][t] == x[i][t + 1]`, and `y[i][context - 1]` the
    /// window's last token.
    pub y: Gather,
}

impl ToDevice for TokenBatch {
    fn to_device_with(&self, cx: &mut MoveContext<'_>) -> Result<Self> {
        Ok(TokenBatch {
            x: cx.field("x", |cx| self.x.to_device_with(cx))?,
            y: cx.field("y", |cx| self.y.to_device_with(cx))?,
        })
    }
}

impl Pinnable for TokenBatch {
    fn pin_with(&self, cx: &mut PinContext<'_>) -> Result<Self> {
        Ok(TokenBatch {
            x: cx.field("x", |cx| self.x.pin_with(cx))?,
            y: cx.field("y", |cx| self.y.pin_with(cx))?,
        })
    }
}

/// Makes [`TokenBatch`]es of [`Window`]s, from [`TokenWindows::batcher`]: for a CUDA device,
/// gathers of the windows' tokens that the move widens on the GPU; for the host, `x` and `y`
/// written, widened, into the batch's one pinned block by the loader's worker.
#[derive(Clone, Debug)]
pub struct TokenBatcher {
    shards: Arc<TokenShards>,
    context: usize,
    dtype: DType,
    /// Gathers as for a CUDA device whatever the batch's device (tests without a GPU).
    gather: bool,
}

impl TokenBatcher {
    /// The dtype of `x` and `y`.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The tokens of `x` per window.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Checks that every window lies within its shard; an error names the window's place in
    /// the batch.
    fn check(&self, windows: &[Window]) -> std::result::Result<(), (usize, Error)> {
        let span = self.context + 1;
        for (pos, w) in windows.iter().enumerate() {
            let Some(shard) = self.shards.shards().get(w.shard) else {
                return Err((
                    pos,
                    Error::Shape(format!(
                        "window {w:?} names shard {}, and there are {}",
                        w.shard,
                        self.shards.shards().len()
                    )),
                ));
            };
            if w.start
                .checked_add(span)
                .is_none_or(|end| end > shard.len())
            {
                return Err((
                    pos,
                    Error::Shape(format!(
                        "window {w:?} needs tokens {}..{} of `{}`, which has {}",
                        w.start,
                        w.start.saturating_add(span),
                        shard.path().display(),
                        shard.len()
                    )),
                ));
            }
        }
        Ok(())
    }
}

impl Batcher<Window> for TokenBatcher {
    type Batch = TokenBatch;

    fn batch(&self, windows: Vec<Window>, c: &mut Collator) -> Result<TokenBatch> {
        self.check(&windows)
            .map_err(|(pos, source)| Error::Sample {
                index: c.indices().get(pos).copied().unwrap_or(pos),
                during: "collating",
                source: Box::new(source),
            })?;
        // The batch's device is the loader's: a CUDA device gathers there.
        if self.gather || c.device().ordinal().is_some() {
            let wraps = self.shards.vocab().is_none_or(|v| v > 1 << 31);
            if self.dtype == DType::I32 && self.shards.dtype() == DType::U32 && wraps {
                return Err(Error::Config {
                    setting: "dtype",
                    problem: "i32 batches of u32 tokens on a device need the shards opened \
                              with a vocabulary check of at most 2^31 (ShardOptions::vocab); \
                              or take i64 batches"
                        .into(),
                });
            }
            return self.gathers(&windows, c);
        }
        let shape = [windows.len(), self.context];
        let x = c.empty("x", self.dtype, &shape)?;
        let y = c.empty("y", self.dtype, &shape)?;
        let mut out = c.finish()?;
        widen_windows(&self.shards, &windows, 0, &mut out.view_mut(x)?)?;
        widen_windows(&self.shards, &windows, 1, &mut out.view_mut(y)?)?;
        Ok(TokenBatch {
            x: Gather::from(out.take(x)?),
            y: Gather::from(out.take(y)?),
        })
    }
}

impl TokenBatcher {
    /// `x` and `y` as gathers of windows, widened by the move: from the shards' pinned block
    /// when every window lies in it, else from the batch's own pinned block, where the windows'
    /// tokens are copied first.
    fn gathers(&self, windows: &[Window], c: &mut Collator) -> Result<TokenBatch> {
        let shards = self.shards.shards();
        let span = self.context + 1;
        let pinned_at: Option<Vec<usize>> = windows
            .iter()
            .map(|w| Some(shards[w.shard].pinned_at()? + w.start))
            .collect();
        let (source, starts): (Tensor, Vec<usize>) = match (self.shards.pinned(), pinned_at) {
            (Some(all), Some(starts)) => (all.clone(), starts),
            _ => {
                let slot = c.empty("windows", self.shards.dtype(), &[windows.len() * span])?;
                let mut out = c.finish()?;
                stage_windows(&self.shards, windows, &mut out.view_mut(slot)?)?;
                (
                    out.take(slot)?,
                    (0..windows.len()).map(|i| i * span).collect(),
                )
            }
        };
        let cast = Convert::cast(self.dtype);
        let (x, y) = Gather::inputs_and_targets(&source, &starts, self.context)?;
        Ok(TokenBatch {
            x: x.convert(cast.clone())?,
            y: y.convert(cast)?,
        })
    }
}

/// Copies each window's `context + 1` tokens, one after another, into `out` (1-D, of the
/// tokens' dtype). The windows lie within their shards (checked by the caller).
fn stage_windows(shards: &TokenShards, windows: &[Window], out: &mut TensorMut<'_>) -> Result<()> {
    fn copy<T: crate::dtype::Element>(
        shards: &TokenShards,
        windows: &[Window],
        out: &mut TensorMut<'_>,
    ) -> Result<()> {
        let dst = out.as_mut_slice::<T>()?;
        let span = dst.len() / windows.len().max(1);
        for (w, row) in windows.iter().zip(dst.chunks_mut(span)) {
            let src = shards.shards()[w.shard].tokens().as_slice::<T>()?;
            row.copy_from_slice(&src[w.start..w.start + span]);
        }
        Ok(())
    }
    match shards.dtype() {
        DType::U16 => copy::<u16>(shards, windows, out),
        _ => copy::<u32>(shards, windows, out),
    }
}

/// Writes row `i` of `out` (`[windows, context]`, i64 or i32): tokens `shift .. shift +
/// context` of window `i`, widened as Rust's `as` does, u32 to i32 checked. The windows lie
/// within their shards (checked by the caller). The host's counterpart of a device-side gather
/// of windows.
fn widen_windows(
    shards: &TokenShards,
    windows: &[Window],
    shift: usize,
    out: &mut TensorMut<'_>,
) -> Result<()> {
    let context = out.shape()[1];
    for (w, mut row) in windows.iter().zip(out.rows_mut()) {
        let shard = &shards.shards()[w.shard];
        let (from, tokens) = (w.start + shift, shard.tokens());
        let overflow = match (tokens.dtype(), row.dtype()) {
            (DType::U16, DType::I64) => widen::<u16, i64>(tokens.as_slice()?, from, &mut row)?,
            (DType::U16, _) => widen::<u16, i32>(tokens.as_slice()?, from, &mut row)?,
            (_, DType::I64) => widen::<u32, i64>(tokens.as_slice()?, from, &mut row)?,
            _ => widen::<u32, i32>(tokens.as_slice()?, from, &mut row)?,
        };
        if let Some(k) = overflow {
            let t = tokens.as_slice::<u32>()?[from + k];
            return Err(Error::TokenShard {
                path: shard.path().display().to_string(),
                field: format!("token {}", from + k),
                problem: format!("id {t} does not fit in an i32 batch; ask for i64 batches"),
            });
        }
        debug_assert_eq!(row.numel(), context);
    }
    Ok(())
}

/// Converts `src[from..]` into the row; the offset of the first token that does not fit.
fn widen<S, D>(src: &[S], from: usize, row: &mut TensorMut<'_>) -> Result<Option<usize>>
where
    S: crate::dtype::Element,
    D: crate::dtype::Element + TryFrom<S>,
{
    let dst = row.as_mut_slice::<D>()?;
    for (k, (d, &s)) in dst.iter_mut().zip(&src[from..]).enumerate() {
        match D::try_from(s) {
            Ok(v) => *d = v,
            Err(_) => return Ok(Some(k)),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{PinnedPool, PoolConfig};
    use crate::formats::tokens::Residency;
    use crate::loader::sampler::SplitMix64;

    /// A batcher for a device gathers the same windows the host path writes: from the shards'
    /// pinned block, or staged from mapped shards (read back by the gathers' host conversion).
    #[test]
    fn device_gathers_hold_what_the_host_path_writes() {
        let mut r = SplitMix64::for_test("device_gathers_hold_what_the_host_path_writes");
        let dir = std::env::temp_dir().join(format!("windows-gathers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let paths: Vec<_> = (0..3)
            .map(|s| {
                let n = 40 + r.below(200) as usize;
                let bytes: Vec<u8> = (0..n)
                    .flat_map(|_| (r.below(50257) as u16).to_le_bytes())
                    .collect();
                let p = dir.join(format!("{s}.bin"));
                std::fs::write(&p, bytes).unwrap();
                p
            })
            .collect();
        let pool = PinnedPool::new(PoolConfig::default());
        for residency in [Residency::Pinned, Residency::Mapped] {
            let options = TokenShards::options().residency(residency).pool(&pool);
            // SAFETY: the test wrote the files above and nothing writes them while mapped.
            let shards = unsafe { options.open_mapped(&paths) }.unwrap();
            let windows = TokenWindows::new(shards, 1 + r.below(12) as usize).unwrap();
            for dtype in [DType::I64, DType::I32] {
                let host = windows.batcher(dtype).unwrap();
                let device = TokenBatcher {
                    gather: true,
                    ..host.clone()
                };
                let picks: Vec<Window> = (0..1 + r.below(9))
                    .map(|_| {
                        windows
                            .window(r.below(windows.len() as u64) as usize)
                            .unwrap()
                    })
                    .collect();
                let a = host
                    .batch(picks.clone(), &mut Collator::new(&pool))
                    .unwrap();
                let b = device.batch(picks, &mut Collator::new(&pool)).unwrap();
                assert!(b.x.is_pending() && b.y.is_pending());
                assert_eq!(b.x.dtype(), dtype);
                for (a, b) in [(&a.x, &b.x), (&a.y, &b.y)] {
                    let (a, b) = (a.tensor().unwrap(), b.tensor().unwrap());
                    assert_eq!(a.shape(), b.shape());
                    if dtype == DType::I64 {
                        assert_eq!(a.to_vec::<i64>().unwrap(), b.to_vec::<i64>().unwrap());
                    } else {
                        assert_eq!(a.to_vec::<i32>().unwrap(), b.to_vec::<i32>().unwrap());
                    }
                }
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
