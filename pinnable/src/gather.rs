//! [`Gather`]: rows of a tensor, stacked where they land.
//!
//! A batch drawn from a dataset that is already in pinned memory (or on the device) needs no
//! collation on the host: the copy engine can read each sample's row where it is and write it
//! into its place in the batch on the device. Each byte then crosses host memory once (the
//! copy's read) instead of three times (read from the dataset, written into a pinned batch,
//! read by the copy), which is what keeps several GPUs fed when host memory is the limit.
//!
//! A `Gather` is a field of a batch like a [`Tensor`]: [`ToDevice`] turns it into the stacked
//! tensor on the target, [`Pinnable`] into a pinned one (rows of a pinned source stay where
//! they are: they are pinned already), and [`Gather::tensor`] gives the stacked tensor.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use crate::alloc::PinnedPool;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::pin::{PinContext, Pinnable};
use crate::tensor::{Placement, Tensor};
use crate::transfer::{GATHER_DIRECT_MIN, MoveContext, ToDevice};

/// Rows of a source tensor (along its first dimension), to be stacked into one contiguous
/// `[rows, ...]` tensor by the move that carries them.
///
/// Moved to a CUDA device, the rows land in the batch's one device allocation. Runs of
/// consecutive rows from a registered pinned source or from device memory are copied straight
/// from it, one copy a run, when they are large enough ([`GatherRoute`]); smaller runs and
/// pageable sources are gathered by the copy threads into pinned staging first, like any
/// pageable tensor. Moved to the host, a host source's gather stays pending (there is nothing
/// to copy yet).
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
    /// Not gathered yet: runs of consecutive rows of `source`, in order.
    Pending {
        source: Tensor,
        runs: Arc<[Range<usize>]>,
        rows: usize,
        route: GatherRoute,
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
        let row_bytes = source.shape()[1..]
            .iter()
            .try_fold(source.dtype().size(), |b, &d| b.checked_mul(d));
        let too_large = |rows: usize| {
            Error::Shape(format!(
                "{rows} rows of {:?} {} do not fit in memory",
                &source.shape()[1..],
                source.dtype()
            ))
        };
        let row_bytes = row_bytes.ok_or_else(|| too_large(1))?;
        let mut runs: Vec<Range<usize>> = Vec::new();
        let mut count: usize = 0;
        for r in rows {
            if r >= len {
                return Err(Error::Shape(format!(
                    "row {r} is out of range for a source of {len} rows"
                )));
            }
            count += 1;
            if count
                .checked_mul(row_bytes)
                .is_none_or(|b| b > isize::MAX as usize)
            {
                return Err(too_large(count));
            }
            match runs.last_mut() {
                Some(last) if last.end == r => last.end += 1,
                _ => runs.push(r..r + 1),
            }
        }
        Ok(Gather {
            state: State::Pending {
                source: source.clone(),
                runs: runs.into(),
                rows: count,
                route: GatherRoute::Auto,
            },
        })
    }

    /// Chooses how a move to a CUDA device gathers the rows (by default
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
            State::Pending { source, rows, .. } => {
                let mut shape = source.shape().to_vec();
                shape[0] = *rows;
                shape
            }
            State::Stacked(t) => t.shape().to_vec(),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match &self.state {
            State::Pending { source, .. } | State::Stacked(source) => source.dtype(),
        }
    }

    /// Where the rows are now: the source's placement until gathered.
    pub fn placement(&self) -> Placement {
        match &self.state {
            State::Pending { source, .. } | State::Stacked(source) => source.placement(),
        }
    }

    /// How many rows (1 for a rank-0 tensor given as already stacked).
    pub fn len(&self) -> usize {
        match &self.state {
            State::Pending { rows, .. } => *rows,
            State::Stacked(t) => t.shape().first().copied().unwrap_or(1),
        }
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the rows are still in their source, not gathered yet.
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
            State::Pending { source, .. } if source.placement().is_host() => {
                let parts = self.parts();
                let shape = self.shape();
                PinContext::run(PinnedPool::global(), |cx| {
                    cx.pin_stacked(source, &parts, &shape)
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

    /// Views of the source, one per run, in order (empty once stacked).
    fn parts(&self) -> Vec<Tensor> {
        let State::Pending { source, runs, .. } = &self.state else {
            return Vec::new();
        };
        runs.iter()
            .map(|r| {
                source
                    .narrow(0, r.start, r.len())
                    .expect("runs lie within the source")
            })
            .collect()
    }
}

/// How a move to a CUDA device gathers rows from a registered pinned source. (Device sources
/// are always copied straight; pageable ones always gathered on the host first.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GatherRoute {
    /// Straight from the source when its runs of consecutive rows hold at least 256 KiB on
    /// average, else on the host: each copy costs the copy engine time of its own, and below
    /// that size one move is faster gathered on the host. When several GPUs
    /// share the host's memory, [`Direct`](Self::Direct) may win at smaller rows: it reads
    /// each byte once where the host route moves it three times.
    #[default]
    Auto,
    /// One device copy a run, straight from the source: host memory is read once.
    Direct,
    /// Gathered into pinned staging by the copy threads, then sent in a few large copies: fewer
    /// copies for small rows, but each byte crosses host memory three times.
    Host,
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
        let (source, route) = match &self.state {
            State::Stacked(t) => return Ok(Gather::from(cx.move_tensor(t)?)),
            State::Pending { source, route, .. } => (source, *route),
        };
        if cx.device().ordinal().is_none() && source.placement().is_host() {
            return Ok(self.clone());
        }
        let moved = cx.move_stacked(source, &self.parts(), &self.shape(), route)?;
        Ok(Gather::from(moved))
    }
}

impl Pinnable for Gather {
    fn pin_with(&self, cx: &mut PinContext<'_>) -> Result<Self> {
        let source = match &self.state {
            State::Stacked(t) => return Ok(Gather::from(cx.pin_tensor(t)?)),
            State::Pending { source, .. } => source,
        };
        if source.is_pinned() {
            return Ok(self.clone());
        }
        let pinned = cx.pin_stacked(source, &self.parts(), &self.shape())?;
        Ok(Gather::from(pinned))
    }
}

impl fmt::Debug for Gather {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            State::Pending { source, runs, .. } => write!(
                f,
                "Gather({} {:?} from {} in {} runs, pending)",
                source.dtype(),
                self.shape(),
                source.placement(),
                runs.len()
            ),
            State::Stacked(t) => write!(f, "Gather({t:?})"),
        }
    }
}

const _: () = assert!(
    GATHER_DIRECT_MIN == 256 << 10,
    "GatherRoute::Auto's docs name it"
);
