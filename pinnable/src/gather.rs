//! [`Gather`]: rows of a tensor, stacked where they land.
//!
//! A batch drawn from a dataset that is already in pinned memory (or on the device) needs no
//! collation on the host: the copy engine can read each sample's row where it is and write it
//! into its place in the batch on the device. Each byte then crosses host memory once (the
//! copy's read) instead of three times (read from the dataset, written into a pinned batch,
//! read by the copy), which is what keeps several GPUs fed when host memory is the limit.
//!
//! Pieces of any size are gathered at the link's speed: small ones by the gather kernels, which
//! read pinned memory through its device mapping (one launch for the whole batch), large ones by
//! the copy engine, one copy each (see [`GatherRoute`]). Pieces are whole rows of a tensor
//! ([`Gather::rows`]) or windows of a 1-D array ([`Gather::windows`]: token windows at arbitrary
//! offsets), and their elements may be converted on the way ([`Gather::convert`]): u8 pixels
//! and u16 tokens cross the link, f32 and i64 are made on the device.
//!
//! A `Gather` is a field of a batch like a [`Tensor`]: [`ToDevice`] turns it into the stacked
//! tensor on the target, [`Pinnable`] into a pinned one (rows of a pinned source stay where
//! they are: they are pinned already), and [`Gather::tensor`] gives the stacked tensor.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use crate::alloc::PinnedPool;
use crate::convert::Convert;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::pieces::{GatherRoute, StartTable, parts_of};
use crate::pin::{PinContext, Pinnable};
use crate::tensor::{Placement, Tensor};
use crate::transfer::{MoveContext, Stacking, ToDevice};

/// Pieces of a source tensor — rows along its first dimension, or windows of a 1-D array — to
/// be stacked into one contiguous tensor by the move that carries them, converted on the way
/// if asked.
///
/// Moved to a CUDA device, the pieces land in the batch's one device allocation. From pinned
/// memory (or the device) they are read where they lie: small ones by the gather kernels on the
/// SMs, large ones by the copy engine ([`GatherRoute`]); from pageable memory (a memory-mapped
/// file) the copy threads gather them into pinned staging first. Moved to the host, a host
/// source's gather stays pending (there is nothing to copy yet).
///
/// # Examples
///
/// A dataset pinned once; each batch gathers its rows on the device.
///
/// ```
/// use pinnable::{Device, Gather, Tensor, ToDevice};
///
/// #[derive(ToDevice)]
/// struct Batch { images: Gather, labels: Gather }
///
/// let images = Tensor::pinned_from_fn(&[100, 3, 8, 8], |i| i as f32)?;
/// let labels = Tensor::pinned_from_fn(&[100], |i| i as i64)?;
/// let rows = [7, 8, 9, 42];
/// let batch = Batch { images: Gather::rows(&images, rows)?, labels: Gather::rows(&labels, rows)? };
///
/// let device = Device::cuda(0).unwrap_or_else(|_| Device::cpu());
/// let moved = batch.to_device(&device, true)?;
/// let labels = moved.labels.tensor()?;
/// assert_eq!(labels.shape(), &[4]);
/// assert_eq!(labels.to_cpu(false)?.to_vec::<i64>()?, vec![7, 8, 9, 42]);
/// assert_eq!(moved.images.shape(), vec![4, 3, 8, 8]);
/// # Ok::<(), pinnable::Error>(())
/// ```
#[derive(Clone)]
pub struct Gather {
    state: State,
}

#[derive(Clone)]
enum State {
    /// Not gathered yet: pieces of `piece` consecutive indices of `source`'s first dimension
    /// from each of `starts` (also as `runs`, merged where consecutive), in order, stacked into
    /// `shape` (of the source's dtype), then converted by `convert`.
    Pending {
        source: Tensor,
        starts: Arc<StartTable>,
        piece: usize,
        runs: Arc<[Range<usize>]>,
        shape: Arc<[usize]>,
        route: GatherRoute,
        convert: Option<Convert>,
    },
    /// Gathered.
    Stacked(Tensor),
}

impl Gather {
    /// The rows `rows` of `source`, in that order (a row may repeat).
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] for a rank-0 source, a row out of range, or more rows than fit in
    /// memory.
    pub fn rows(source: &Tensor, rows: impl IntoIterator<Item = usize>) -> Result<Gather> {
        let Some(&len) = source.shape().first() else {
            return Err(Error::Shape("a rank-0 tensor has no rows to gather".into()));
        };
        let (starts, runs) = runs_of(source, rows, 1, len, "row")?;
        let mut shape = source.shape().to_vec();
        shape[0] = starts.len();
        Ok(Gather::pending(source, starts, 1, runs, shape))
    }

    /// Windows of `len` consecutive elements of a 1-D `source`, one starting at each of
    /// `starts` (in any order, overlapping or not), stacked into a `[starts, len]` tensor: the
    /// token windows of a language model's batch.
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] for a source that is not 1-D, a window that runs past its end, or more
    /// elements than fit in memory.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::{Gather, Tensor};
    ///
    /// let tokens = Tensor::pinned_from_fn(&[1000], |i| i as u16)?;
    /// let x = Gather::windows(&tokens, [3, 500, 17], 4)?;
    /// assert_eq!(x.shape(), vec![3, 4]);
    /// assert_eq!(x.tensor()?.to_vec::<u16>()?, vec![3, 4, 5, 6, 500, 501, 502, 503, 17, 18, 19, 20]);
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn windows(
        source: &Tensor,
        starts: impl IntoIterator<Item = usize>,
        len: usize,
    ) -> Result<Gather> {
        let n = window_source_len(source)?;
        let (starts, runs) = runs_of(source, starts, len, n, "window")?;
        let count = starts.len();
        Ok(Gather::pending(source, starts, len, runs, vec![count, len]))
    }

    /// A language model's inputs and targets: windows of `len` elements of a 1-D `source`
    /// from each of `starts` (as [`windows`](Self::windows)), and the same windows one element
    /// later. The two share one table of starts, and a move that carries both (as fields of
    /// one batch, `x` then `y`) gathers them in one launch.
    ///
    /// # Errors
    ///
    /// As [`windows`](Self::windows); a window must also leave one element after it.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::{Gather, Tensor};
    ///
    /// let tokens = Tensor::pinned_from_fn(&[100], |i| i as u16)?;
    /// let (x, y) = Gather::inputs_and_targets(&tokens, &[7, 40], 3)?;
    /// assert_eq!(x.tensor()?.to_vec::<u16>()?, vec![7, 8, 9, 40, 41, 42]);
    /// assert_eq!(y.tensor()?.to_vec::<u16>()?, vec![8, 9, 10, 41, 42, 43]);
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn inputs_and_targets(
        source: &Tensor,
        starts: &[usize],
        len: usize,
    ) -> Result<(Gather, Gather)> {
        let n = window_source_len(source)?;
        let (first, runs) = runs_of(source, starts.iter().copied(), len, n, "window")?;
        let later = starts.iter().map(|s| s.saturating_add(1));
        let (next, next_runs) = runs_of(source, later, len, n, "window")?;
        let count = first.len();
        let (x, y) = StartTable::split(&[first, next].concat(), count);
        let make = |starts: StartTable, runs: Vec<Range<usize>>| Gather {
            state: State::Pending {
                source: source.clone(),
                starts: Arc::new(starts),
                piece: len,
                runs: runs.into(),
                shape: vec![count, len].into(),
                route: GatherRoute::Auto,
                convert: None,
            },
        };
        Ok((make(x, runs), make(y, next_runs)))
    }

    fn pending(
        source: &Tensor,
        starts: Vec<usize>,
        piece: usize,
        runs: Vec<Range<usize>>,
        shape: Vec<usize>,
    ) -> Gather {
        Gather {
            state: State::Pending {
                source: source.clone(),
                starts: Arc::new(StartTable::new(&starts)),
                piece,
                runs: runs.into(),
                shape: shape.into(),
                route: GatherRoute::Auto,
                convert: None,
            },
        }
    }

    /// Converts every element on the way (see [`Convert`]): on the GPU, by the gather kernels,
    /// for moves to a CUDA device, so only the compact elements cross the link; on the host
    /// otherwise, with the same values.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when the conversion does not take the source's dtype, its channels do
    /// not match the stacked shape, or the gather is already stacked (convert before moving).
    pub fn convert(mut self, to: Convert) -> Result<Gather> {
        let State::Pending {
            source,
            shape,
            convert,
            ..
        } = &mut self.state
        else {
            return Err(Error::Config {
                setting: "convert",
                problem: "this gather is already stacked; convert it before moving it".into(),
            });
        };
        to.resolve(source.dtype(), shape)?;
        *convert = Some(to);
        Ok(self)
    }

    /// Chooses how a move to a CUDA device gathers the pieces (by default
    /// [`GatherRoute::Auto`]); no effect once stacked.
    #[must_use]
    pub fn route(mut self, route: GatherRoute) -> Gather {
        if let State::Pending { route: r, .. } = &mut self.state {
            *r = route;
        }
        self
    }

    /// The shape of the stacked tensor: `[rows, ...]`.
    pub fn shape(&self) -> Vec<usize> {
        match &self.state {
            State::Pending { shape, .. } => shape.to_vec(),
            State::Stacked(t) => t.shape().to_vec(),
        }
    }

    /// The element type of the stacked tensor (the conversion's output, if any).
    pub fn dtype(&self) -> DType {
        match &self.state {
            State::Pending {
                convert: Some(c), ..
            } => c.output(),
            State::Pending { source, .. } | State::Stacked(source) => source.dtype(),
        }
    }

    /// Where the rows are now: the source's placement until gathered.
    pub fn placement(&self) -> Placement {
        match &self.state {
            State::Pending { source, .. } | State::Stacked(source) => source.placement(),
        }
    }

    /// How many rows or windows (1 for a rank-0 tensor given as already stacked).
    pub fn len(&self) -> usize {
        match &self.state {
            State::Pending { shape, .. } => shape[0],
            State::Stacked(t) => t.shape().first().copied().unwrap_or(1),
        }
    }

    /// Whether there are no rows or windows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the pieces are still in their source, not gathered yet.
    pub fn is_pending(&self) -> bool {
        matches!(self.state, State::Pending { .. })
    }

    /// The stacked tensor. A gather that is still pending is gathered now: from a host source
    /// into a pinned block of the process-wide pool, from a device source on its device
    /// (waiting for the copies).
    ///
    /// # Errors
    ///
    /// Allocation and driver errors.
    pub fn tensor(&self) -> Result<Tensor> {
        match &self.state {
            State::Stacked(t) => Ok(t.clone()),
            State::Pending {
                source, convert, ..
            } if source.placement().is_host() => {
                let (parts, shape) = (self.parts(), self.shape());
                PinContext::run(PinnedPool::global(), |cx| {
                    cx.pin_stacked(source, &parts, &shape, convert.as_ref())
                })
            }
            State::Pending { source, .. } => self.to_device(&source.device(), false)?.tensor(),
        }
    }

    /// As [`tensor`](Self::tensor), consuming the gather.
    ///
    /// # Errors
    ///
    /// As [`tensor`](Self::tensor).
    pub fn into_tensor(self) -> Result<Tensor> {
        match self.state {
            State::Stacked(t) => Ok(t),
            State::Pending { .. } => self.tensor(),
        }
    }

    /// The pinned block holding the table of starts the gather kernels read, if any.
    #[cfg(test)]
    pub(crate) fn start_block(&self) -> Option<Arc<crate::alloc::PinnedBlock>> {
        match &self.state {
            State::Pending { starts, .. } => starts.pinned().cloned(),
            State::Stacked(_) => None,
        }
    }

    /// Views of the source, one per run, in order (empty once stacked).
    fn parts(&self) -> Vec<Tensor> {
        match &self.state {
            State::Pending { source, runs, .. } => parts_of(source, runs),
            State::Stacked(_) => Vec::new(),
        }
    }
}

impl From<Tensor> for Gather {
    /// A gather that is already stacked: `t` itself.
    fn from(t: Tensor) -> Gather {
        Gather {
            state: State::Stacked(t),
        }
    }
}

impl ToDevice for Gather {
    fn to_device_with(&self, cx: &mut MoveContext<'_>) -> Result<Self> {
        let stacking = match &self.state {
            State::Stacked(t) => return Ok(Gather::from(cx.move_tensor(t)?)),
            State::Pending {
                source,
                starts,
                piece,
                runs,
                shape,
                route,
                convert,
            } => Stacking {
                source,
                starts,
                piece: *piece,
                runs,
                shape,
                route: *route,
                convert: convert.as_ref(),
            },
        };
        if cx.device().ordinal().is_none() && stacking.source.placement().is_host() {
            return Ok(self.clone());
        }
        let moved = cx.move_stacked(&stacking)?;
        Ok(Gather::from(moved))
    }
}

impl Pinnable for Gather {
    /// Pinned: the stacked (and converted) tensor in the batch's block; a pinned source without
    /// a conversion stays pending (its pieces are pinned already).
    fn pin_with(&self, cx: &mut PinContext<'_>) -> Result<Self> {
        let (source, convert) = match &self.state {
            State::Stacked(t) => return Ok(Gather::from(cx.pin_tensor(t)?)),
            State::Pending {
                source, convert, ..
            } => (source, convert.as_ref()),
        };
        if source.is_pinned() && convert.is_none() {
            return Ok(self.clone());
        }
        let pinned = cx.pin_stacked(source, &self.parts(), &self.shape(), convert)?;
        Ok(Gather::from(pinned))
    }
}

impl fmt::Debug for Gather {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            State::Pending {
                source,
                runs,
                convert,
                ..
            } => {
                write!(
                    f,
                    "Gather({} {:?} from {} in {} runs",
                    source.dtype(),
                    self.shape(),
                    source.placement(),
                    runs.len()
                )?;
                if let Some(c) = convert {
                    write!(f, ", then {c:?}")?;
                }
                f.write_str(", pending)")
            }
            State::Stacked(t) => write!(f, "Gather({t:?})"),
        }
    }
}

/// The length of a 1-D `source` of windows, or why it is not one.
fn window_source_len(source: &Tensor) -> Result<usize> {
    match source.shape() {
        &[n] => Ok(n),
        shape => Err(Error::Shape(format!(
            "windows are taken from a 1-D tensor; this one has shape {shape:?} (reshape it to \
             [{}] first)",
            source.numel()
        ))),
    }
}

/// The starts of pieces of `n` consecutive indices of `source`'s first dimension (of `len`),
/// checked, and the runs they cover, merged where one piece starts where the last ended.
fn runs_of(
    source: &Tensor,
    starts: impl IntoIterator<Item = usize>,
    n: usize,
    len: usize,
    what: &str,
) -> Result<(Vec<usize>, Vec<Range<usize>>)> {
    let unit_bytes = source.shape()[1..]
        .iter()
        .try_fold(source.dtype().size(), |b, &d| b.checked_mul(d));
    let too_large = |pieces: usize| {
        Error::Shape(format!(
            "{pieces} {what}s of {:?} {} do not fit in memory",
            &source.shape()[1..],
            source.dtype()
        ))
    };
    let piece_bytes = unit_bytes
        .and_then(|b| b.checked_mul(n))
        .ok_or_else(|| too_large(1))?;
    let starts = starts.into_iter();
    let mut out = Vec::with_capacity(starts.size_hint().0);
    let mut runs: Vec<Range<usize>> = Vec::new();
    for start in starts {
        let Some(end) = start.checked_add(n).filter(|&e| e <= len) else {
            return Err(Error::Shape(if what == "row" {
                format!("row {start} is out of range for a source of {len} rows")
            } else {
                format!(
                    "the {what} of {n} elements from {start} runs past the end of a source of \
                     {len}"
                )
            }));
        };
        out.push(start);
        if (out.len())
            .checked_mul(piece_bytes)
            .is_none_or(|b| b > isize::MAX as usize)
        {
            return Err(too_large(out.len()));
        }
        match runs.last_mut() {
            Some(last) if last.end == start && n > 0 => last.end = end,
            _ => runs.push(start..end),
        }
    }
    Ok((out, runs))
}
