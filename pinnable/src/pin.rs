//! `Pinnable`: a copy of a batch whose tensors live in page-locked memory.

use std::sync::Arc;

use crate::alloc::{PinnedBlock, PinnedPool};
use crate::batch::part_align;
use crate::check;
use crate::convert::{self, Convert};
use crate::copy::{self, HostCopy};
use crate::error::Result;
use crate::path::{FieldPath, Walk};
use crate::tensor::{Storage, Tensor};

/// A value whose tensors can be copied into page-locked (pinned) host memory.
///
/// Derive it with `#[derive(Pinnable)]`, or implement [`pin_with`](Self::pin_with) for your own
/// types by pinning their parts through the [`PinContext`].
///
/// # Examples
///
/// ```
/// use pinnable::{Pinnable, Tensor};
///
/// #[derive(Pinnable)]
/// struct Batch {
///     images: Tensor,
///     ids: Vec<String>,
/// }
///
/// let batch = Batch {
///     images: Tensor::from_vec(vec![0.5f32; 12], &[1, 3, 2, 2])?,
///     ids: vec!["a".into()],
/// };
/// let pinned = batch.pin_memory()?;
/// assert!(pinned.images.is_pinned());
/// assert_eq!(pinned.ids, batch.ids);
/// # Ok::<(), pinnable::Error>(())
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be pinned: it does not implement `Pinnable`",
    label = "`{Self}` does not implement `Pinnable`",
    note = "derive `Pinnable` for `{Self}` or implement it by hand; to carry the field over \
            unchanged instead, mark it `#[pinnable(skip)]` (it must then implement `Clone`)"
)]
pub trait Pinnable: Sized {
    /// The recursive step: a copy of `self` with every tensor pinned through `cx`.
    ///
    /// # Errors
    ///
    /// Whatever pinning a part returns, with its field path.
    fn pin_with(&self, cx: &mut PinContext<'_>) -> Result<Self>;

    /// A copy of `self` whose tensors live in page-locked memory from the process-wide
    /// [`PinnedPool`]. Already-pinned tensors are shared, not copied; non-tensor data is cloned;
    /// `self` is untouched, so an error loses nothing.
    ///
    /// # Errors
    ///
    /// [`Error::NotDenseCpu`](crate::Error::NotDenseCpu) for a tensor that is not dense host data, naming its field;
    /// allocation errors from the pool.
    fn pin_memory(&self) -> Result<Self> {
        self.pin_memory_in(PinnedPool::global())
    }

    /// As [`pin_memory`](Self::pin_memory), with memory from `pool`.
    ///
    /// # Errors
    ///
    /// As [`pin_memory`](Self::pin_memory).
    fn pin_memory_in(&self, pool: &PinnedPool) -> Result<Self> {
        PinContext::run(pool, |cx| self.pin_with(cx))
    }
}

/// Which walk is running.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Check and add up bytes; results are placeholders.
    Measure,
    /// Place every tensor in the batch's block.
    Build,
}

/// What [`Pinnable::pin_with`] works through: the pool, the field path for errors, the batch's
/// one block, and the copies into it.
///
/// [`run`](Self::run) walks the value twice: the first walk checks every tensor and adds up
/// its bytes, then the whole batch's block is allocated at once, and the second walk places
/// each tensor in it at an aligned offset ([`BatchLayout::PART_ALIGN`](crate::BatchLayout::PART_ALIGN)). So an
/// allocation error comes back before anything is copied, and the batch moves to a device with
/// one copy. Implementations must walk the same tensors in the same order every time they are
/// called on the same value (the derive and the std impls do); a walk that pins more than it
/// measured still works, with the extra tensors in blocks of their own.
pub struct PinContext<'a> {
    pool: &'a PinnedPool,
    path: FieldPath,
    pass: Pass,
    measured: usize,
    block: Option<Arc<PinnedBlock>>,
    cursor: usize,
    copies: Vec<HostCopy>,
    /// Keeps each copy's source alive until the copies have run.
    keep: Vec<Tensor>,
}

impl<'a> PinContext<'a> {
    /// Runs `f` twice with a fresh context (measure, then build), allocating the batch's block
    /// in between, then performs the batch's copies (in parallel where large).
    ///
    /// # Errors
    ///
    /// Whatever `f` returns; allocation errors from the pool. Nothing is copied then.
    pub fn run<T>(
        pool: &'a PinnedPool,
        mut f: impl FnMut(&mut PinContext<'a>) -> Result<T>,
    ) -> Result<T> {
        let mut cx = PinContext {
            pool,
            path: FieldPath::new(),
            pass: Pass::Measure,
            measured: 0,
            block: None,
            cursor: 0,
            copies: Vec::new(),
            keep: Vec::new(),
        };
        drop(f(&mut cx)?);
        if cx.measured > 0 {
            cx.block = Some(Arc::new(pool.alloc(cx.measured)?));
        }
        cx.pass = Pass::Build;
        cx.path = FieldPath::new();
        let value = f(&mut cx)?;
        // SAFETY: every source is held in `cx.keep` until after the copies; the destinations
        // are disjoint parts of fresh blocks nothing else writes.
        unsafe { copy::run(&cx.copies)? };
        drop(cx);
        Ok(value)
    }

    /// The pool blocks come from.
    pub fn pool(&self) -> &'a PinnedPool {
        self.pool
    }

    /// Pins one tensor: already-pinned tensors are shared; dense host tensors get a contiguous
    /// copy in the batch's block (filled when [`run`](Self::run) finishes).
    ///
    /// # Errors
    ///
    /// [`Error::NotDenseCpu`](crate::Error::NotDenseCpu) for a device tensor; allocation errors from the pool.
    pub fn pin_tensor(&mut self, t: &Tensor) -> Result<Tensor> {
        if t.is_pinned() {
            return Ok(t.clone());
        }
        check::dense_cpu(t, &self.path)?;
        let bytes = t.nbytes();
        if self.pass == Pass::Measure {
            self.measured += part_align(bytes);
            return Ok(t.clone());
        }
        let src = t.host_src("pin_memory")?;
        let (block, offset) = self.place(bytes)?;
        // SAFETY: `offset + bytes` lies within the block (`place` made room).
        let dst = unsafe { block.as_ptr().add(offset) };
        let out = t.placed_in(Storage::pinned(block), offset, true);
        self.copies.push(HostCopy {
            src: src.into(),
            dst,
        });
        self.keep.push(t.clone());
        Ok(out)
    }

    /// Pins the concatenation along dimension 0 of `parts` (host views of `source`) as one
    /// contiguous tensor of `shape` in the batch's block, converted by `convert` (on this
    /// thread) if given.
    pub(crate) fn pin_stacked(
        &mut self,
        source: &Tensor,
        parts: &[Tensor],
        shape: &[usize],
        convert: Option<&Convert>,
    ) -> Result<Tensor> {
        check::dense_cpu(source, &self.path)?;
        let layout = match convert {
            Some(c) => Some(c.resolve(source.dtype(), shape)?),
            None => None,
        };
        let dtype = layout.map_or(source.dtype(), |l| l.to);
        let elements: usize = parts.iter().map(Tensor::numel).sum();
        let bytes = elements * dtype.size();
        if self.pass == Pass::Measure {
            self.measured += part_align(bytes);
            return Ok(source.clone());
        }
        let (block, offset) = self.place(bytes)?;
        if let Some((c, layout)) = convert.zip(layout) {
            // SAFETY: `place` made room for `bytes` at `offset` in a block this walk alone
            // writes, and no copy is queued into that room.
            let dst = unsafe { std::slice::from_raw_parts_mut(block.as_ptr().add(offset), bytes) };
            convert::convert_parts(c, &layout, parts, dst)?;
        } else {
            let mut at = offset;
            for p in parts {
                let src = p.host_src("pin_memory")?;
                // SAFETY: the parts' bytes add up to `bytes`, which `place` made room for.
                let dst = unsafe { block.as_ptr().add(at) };
                at += p.nbytes();
                self.copies.push(HostCopy {
                    src: src.into(),
                    dst,
                });
            }
            self.keep.push(source.clone());
        }
        let storage = Storage::pinned(block);
        Tensor::at(storage, dtype, shape, offset)
    }

    /// Room for `bytes` in the batch's block (or, past what was measured, in a block of its
    /// own): the block and the offset.
    fn place(&mut self, bytes: usize) -> Result<(Arc<PinnedBlock>, usize)> {
        Ok(match &self.block {
            Some(block) if self.cursor + bytes <= self.measured => {
                let offset = self.cursor;
                self.cursor += part_align(bytes);
                (block.clone(), offset)
            }
            _ => (Arc::new(self.pool.alloc(bytes)?), 0),
        })
    }
}

impl Walk for PinContext<'_> {
    fn path(&self) -> &FieldPath {
        &self.path
    }

    fn path_mut(&mut self) -> &mut FieldPath {
        &mut self.path
    }
}
