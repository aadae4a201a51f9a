//! `Pinnable`: a copy of a batch whose tensors live in page-locked memory.

use std::sync::Arc;

use crate::alloc::PinnedPool;
use crate::check;
use crate::copy::{self, HostCopy};
use crate::error::{Error, Result};
use crate::path::{FieldPath, Walk};
use crate::tensor::{Data, Storage, Tensor};

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
    /// [`Error::NotDenseCpu`] for a tensor that is not dense host data, naming its field;
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

/// What [`Pinnable::pin_with`] works through: the pool, the field path for errors, and the
/// copies to run once every block of the batch has been allocated.
pub struct PinContext<'a> {
    pool: &'a PinnedPool,
    path: FieldPath,
    copies: Vec<HostCopy>,
    /// Keeps each copy's source and destination alive until the copies have run.
    keep: Vec<(Tensor, Arc<Storage>)>,
}

impl<'a> PinContext<'a> {
    /// Runs `f` with a fresh context, then performs the batch's copies (in parallel where large).
    ///
    /// Every allocation happens inside `f`, before the first copy: if any fails, nothing is
    /// copied and the partial result is dropped.
    ///
    /// # Errors
    ///
    /// Whatever `f` returns.
    pub fn run<T>(
        pool: &'a PinnedPool,
        f: impl FnOnce(&mut PinContext<'a>) -> Result<T>,
    ) -> Result<T> {
        let mut cx = PinContext {
            pool,
            path: FieldPath::new(),
            copies: Vec::new(),
            keep: Vec::new(),
        };
        let value = f(&mut cx)?;
        // SAFETY: every source and destination is held in `cx.keep` until after the copies;
        // the destinations are fresh blocks nothing else has seen yet.
        unsafe { copy::run(&cx.copies)? };
        drop(cx);
        Ok(value)
    }

    /// The pool blocks come from.
    pub fn pool(&self) -> &'a PinnedPool {
        self.pool
    }

    /// Where in the batch the current value sits.
    pub fn path(&self) -> &FieldPath {
        &self.path
    }

    /// An error about the current value, carrying its field path.
    pub fn error(&self, message: impl Into<String>) -> Error {
        Error::Field {
            path: self.path.to_string(),
            message: message.into(),
        }
    }

    /// Pins one tensor: already-pinned tensors are shared; dense host tensors get a pinned,
    /// contiguous copy (filled when the outermost [`run`](Self::run) finishes).
    ///
    /// # Errors
    ///
    /// [`Error::NotDenseCpu`] for a device tensor; allocation errors from the pool.
    pub fn pin_tensor(&mut self, t: &Tensor) -> Result<Tensor> {
        if t.is_pinned() {
            return Ok(t.clone());
        }
        check::dense_cpu(t, &self.path)?;
        let block = self.pool.alloc(t.nbytes())?;
        let dst = block.as_ptr();
        let src = t.host_src("pin_memory")?;
        let out = t.with_storage(
            Storage {
                data: Data::Pinned(block),
                ready: None,
            },
            true,
        );
        self.copies.push(HostCopy { src, dst });
        self.keep.push((t.clone(), out.storage().clone()));
        Ok(out)
    }
}

impl Walk for PinContext<'_> {
    fn path_mut(&mut self) -> &mut FieldPath {
        &mut self.path
    }
}

/// A contiguous pinned copy of `t` made now, even if `t` is already pinned (for copy-on-write).
pub(crate) fn pin_contiguous_now(t: &Tensor, pool: &PinnedPool) -> Result<Tensor> {
    let block = pool.alloc(t.nbytes())?;
    let src = t.host_src("pin_memory")?;
    // SAFETY: `t` keeps the source alive for the call; `block` is fresh and `nbytes` long.
    unsafe { src.gather(block.as_ptr()) };
    Ok(t.with_storage(
        Storage {
            data: Data::Pinned(block),
            ready: None,
        },
        true,
    ))
}
