//! Weighted mixing of several sources into one: [`Mix`], with its [`Stop`] rule.
//!
//! A mix is a [`Dataset`] that plans its own epochs ([`Dataset::plan`]): the plan says, for
//! each place of the epoch, which source it draws from and which of that source's samples it
//! takes. Sources are read in an order of their own (shuffled under the seed, the epoch and the
//! source's number, or their own plan for a source that plans, like tar shards); a source that
//! runs out before the epoch ends is reshuffled (the next pass) and goes on.
//!
//! The plan is the same on every rank and is a pure function of the seed, the epoch, the
//! sources' lengths and the mix's settings; each rank takes its part of it. It never depends on
//! the worker count or on timing, so [`Position`](super::Position)s resume a mix exactly, and
//! refuse a position saved with other sources, weights or stop rule (the setting named
//! `mix (sources, weights and stop rule)`, or `mix (sources, their plans, weights and stop
//! rule)` when a source plans its own epochs).

mod plan;
mod streams;

use super::dataset::Dataset;
use super::plan::{Plan, PlanRequest};
use super::position::MIX_OF_PLANS;
use crate::error::{Error, Result};
use crate::hash::Fingerprint;
pub use streams::{MixedStream, StreamMix};

/// When a mix's epoch ends. The names follow torchdata's stop criteria.
///
/// With per-sample draws an epoch's length is fixed in advance from the shares, so that
/// [`len`](Dataset::len) is exact and every rank gets the same number of batches: it is the
/// number of draws at which the rule is met *if every source got exactly its share*. Random
/// draws stray from the shares by a few samples (±0.1% over 10⁶ draws); a source that runs
/// out a little early is reshuffled and goes on. With per-batch counts the shares are exact, and
/// so is the rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Stop {
    /// Until every source has been read through at least once (the largest source, in
    /// proportion to its share, sets the length); smaller sources cycle, reshuffled at each
    /// pass. The default.
    AllExhausted,
    /// Until the first source has been read through (the smallest source, in proportion to its
    /// share, sets the length). With per-batch counts no sample is repeated; with per-sample
    /// draws a source drawn a little more often than its share runs a few samples into its
    /// next pass.
    FirstExhausted,
    /// Every sample of every source exactly once; the weights set how the sources interleave
    /// (a source drawn from more often runs out sooner, and the last part of an epoch holds
    /// only the sources still left). Per-sample draws only.
    EachOnce,
    /// One endless stream cut into epochs of `samples`: sources cycle across epoch
    /// boundaries (epoch `e` goes on where epoch `e − 1` stopped, and its draws are
    /// `e`'s own), so no epoch restarts a source. With per-sample draws each epoch holds
    /// each source's share exactly (rounded to whole samples), in a random order.
    Forever {
        /// The samples of one epoch (all ranks together).
        samples: usize,
    },
}

/// How a mix draws.
#[derive(Clone, Debug, PartialEq)]
enum Shares {
    /// Each place of the epoch draws its source at random, with these weights.
    Weights(Vec<f64>),
    /// Each batch holds exactly these counts, in a shuffled order.
    Counts(Vec<usize>),
}

/// Several sources read as one, each in a set proportion: a [`Dataset`] to give to
/// [`Loader::builder`](super::Loader::builder).
///
/// - [`Mix::weighted`]: each sample of an epoch is drawn from source `s` with probability
///   `weight[s] / Σ weight` (over 10⁶ samples, each source's share is within ±0.5% of its
///   weight's).
/// - [`Mix::per_batch`]: each batch holds exactly `count[s]` samples of source `s`, in an
///   order shuffled per batch; the loader's batch size must be `Σ count` (the builder checks).
///
/// [`stop`](Self::stop) sets when an epoch ends ([`Stop`]).
///
/// Sources are any [`Dataset`]s of one sample type: datasets, token windows, image folders,
/// tar shards (read in their own planned order; a pass of theirs is planned as their own epoch).
/// For sources of different types, box each as `Arc<dyn Dataset<Sample = S>>`.
/// Streams, which cannot be indexed, mix through [`Mix::streams`].
///
/// **Indices and length.** [`len`](Dataset::len) is the samples in an epoch (all ranks
/// together) and is exact; the indices that [`get`](Dataset::get) takes run over the sources
/// laid end to end, `0..`[`total`](Self::total): source `s`'s sample `i` is
/// `offset(s) + i` ([`locate`](Self::locate) says which source and sample an index is).
///
/// **Ranks.** With per-sample draws a rank takes every `world`-th place of the epoch's plan
/// (padded or cut as [`Sampler`](super::Sampler) does); with per-batch counts it takes every
/// `world`-th batch, so each of its batches is exact too. When the epoch's batches do not
/// divide evenly among the ranks, a rank's last batch may be cut short: use `drop_last`, or a
/// [`Stop::Forever`] epoch of a multiple of `world` batches.
///
/// **Cost.** The plan is made when an epoch starts: `O(len + Σ source length)` time and one
/// `usize` per sample, at any epoch (no earlier epoch is replayed).
///
/// # Errors
///
/// The constructors refuse an empty list, an empty source, a weight that is not a positive
/// finite number and a count of 0 ([`Error::Config`] naming `mix`).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use pinnable::loader::{Dataset, Loader, Mix, Stop};
/// use pinnable::Tensor;
///
/// // Two corpora of one sample type, 70% / 30%.
/// let web: Vec<i32> = (0..700).collect();
/// let code: Vec<i32> = (1000..1100).collect(); // small: cycled, reshuffled at each pass
/// let mix = Mix::weighted(vec![(web, 0.7), (code, 0.3)])?.stop(Stop::AllExhausted)?;
/// assert_eq!(mix.len(), 1000); // 700 web samples are 70% of 1000
///
/// let loader = Loader::builder(mix).batch_size(100).shuffle(5).workers(2).build_with(
///     |samples: Vec<i32>, _c| Ok(Tensor::from_vec1(samples)),
/// )?;
/// let mut from_code = 0;
/// for batch in &loader {
///     from_code += batch?.to_vec::<i32>()?.iter().filter(|&&v| v >= 1000).count();
/// }
/// assert!((250..350).contains(&from_code));
///
/// // Exactly 3 of 4 samples from the first source in every batch.
/// let exact = Mix::per_batch(vec![(vec![0i32; 30], 3), (vec![1i32; 10], 1)])?;
/// assert_eq!(exact.batch_size(), Some(4));
/// let loader = Loader::builder(exact).batch_size(4).shuffle(1).build_with(
///     |samples: Vec<i32>, _c| Ok(Tensor::from_vec1(samples)),
/// )?;
/// for batch in &loader {
///     assert_eq!(batch?.to_vec::<i32>()?.iter().sum::<i32>(), 1);
/// }
///
/// // Sources of different types, boxed.
/// let a: Arc<dyn Dataset<Sample = i32>> = Arc::new(vec![1, 2, 3]);
/// let b: Arc<dyn Dataset<Sample = i32>> = Arc::new(pinnable::loader::FnDataset::new(5, |i| Ok(i as i32)));
/// let mixed = Mix::weighted(vec![(a, 1.0), (b, 1.0)])?;
/// assert_eq!(mixed.total(), 8);
/// # Ok::<(), pinnable::Error>(())
/// ```
pub struct Mix<D> {
    sources: Vec<D>,
    /// Where each source's indices start, and the total at the end.
    offsets: Vec<usize>,
    shares: Shares,
    stop: Stop,
    /// The samples of an epoch.
    len: usize,
}

fn bad(problem: String) -> Error {
    Error::Config {
        setting: "mix",
        problem,
    }
}

/// The name positions give the mix's settings.
const SETTING: &str = "mix (sources, weights and stop rule)";

impl<D: Dataset> Mix<D> {
    /// Sources drawn at random, sample by sample, in proportion to their weights; stops with
    /// [`Stop::AllExhausted`] until [`stop`](Self::stop) says otherwise.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for no source, an empty source, or a weight that is not a positive
    /// finite number.
    pub fn weighted(sources: Vec<(D, f64)>) -> Result<Self> {
        if let Some((s, (_, w))) = sources
            .iter()
            .enumerate()
            .find(|(_, (_, w))| !(w.is_finite() && *w > 0.0))
        {
            return Err(bad(format!(
                "source {s} has weight {w}; weights must be positive finite numbers (leave a \
                 source out rather than give it 0)"
            )));
        }
        let (sources, weights) = sources.into_iter().unzip();
        Mix::new(sources, Shares::Weights(weights))
    }

    /// Sources in fixed counts per batch: each batch holds exactly `count` samples of each
    /// source, in an order shuffled per batch; the loader's batch size must be the counts' sum
    /// ([`batch_size`](Self::batch_size)). Stops with [`Stop::AllExhausted`] until
    /// [`stop`](Self::stop) says otherwise.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for no source, an empty source, or a count of 0.
    pub fn per_batch(sources: Vec<(D, usize)>) -> Result<Self> {
        if let Some(s) = sources.iter().position(|(_, c)| *c == 0) {
            return Err(bad(format!(
                "source {s} has a count of 0 per batch; give it at least 1, or leave it out"
            )));
        }
        let (sources, counts) = sources.into_iter().unzip();
        Mix::new(sources, Shares::Counts(counts))
    }

    fn new(sources: Vec<D>, shares: Shares) -> Result<Self> {
        if sources.is_empty() {
            return Err(bad("no source to mix; give at least one".into()));
        }
        if let Some(s) = sources.iter().position(|d| d.is_empty()) {
            return Err(bad(format!(
                "source {s} has no sample; leave it out of the mix"
            )));
        }
        let mut offsets = Vec::with_capacity(sources.len() + 1);
        let mut total = 0usize;
        offsets.push(0);
        for d in &sources {
            total = total
                .checked_add(d.len())
                .ok_or_else(|| bad("the sources' lengths add up past usize::MAX".into()))?;
            offsets.push(total);
        }
        let mut mix = Mix {
            sources,
            offsets,
            shares,
            stop: Stop::AllExhausted,
            len: 0,
        };
        mix.len = mix.epoch_len()?;
        Ok(mix)
    }

    /// The same mix with the stop rule `stop` (see [`Stop`]).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for [`Stop::EachOnce`] with per-batch counts (exact counts cannot
    /// read every sample once unless the sources' lengths are in the counts' proportions; use
    /// [`Stop::FirstExhausted`]), or [`Stop::Forever`] with 0 samples or, with per-batch
    /// counts, samples that are not a multiple of the batch.
    pub fn stop(mut self, stop: Stop) -> Result<Self> {
        self.stop = stop;
        self.len = self.epoch_len()?;
        Ok(self)
    }

    /// The stop rule.
    pub fn stop_rule(&self) -> Stop {
        self.stop
    }

    /// The sources, in the order given.
    pub fn sources(&self) -> &[D] {
        &self.sources
    }

    /// The batch size a per-batch mix is made for (the counts' sum); `None` for per-sample
    /// draws.
    pub fn batch_size(&self) -> Option<usize> {
        match &self.shares {
            Shares::Counts(c) => Some(c.iter().sum()),
            Shares::Weights(_) => None,
        }
    }

    /// The sources' samples laid end to end: indices run over `0..total()`.
    pub fn total(&self) -> usize {
        *self.offsets.last().expect("at least one offset")
    }

    /// Which source index `index` belongs to, and its index there; `None` past
    /// [`total`](Self::total).
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::loader::Mix;
    ///
    /// let mix = Mix::weighted(vec![(vec![0u8; 3], 1.0), (vec![0u8; 5], 1.0)])?;
    /// assert_eq!(mix.locate(4), Some((1, 1)));
    /// assert_eq!(mix.locate(8), None);
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn locate(&self, index: usize) -> Option<(usize, usize)> {
        if index >= self.total() {
            return None;
        }
        let s = self.offsets.partition_point(|&o| o <= index) - 1;
        Some((s, index - self.offsets[s]))
    }

    fn lens(&self) -> impl Iterator<Item = usize> + '_ {
        self.sources.iter().map(|d| d.len())
    }

    /// The samples of an epoch under the stop rule.
    fn epoch_len(&self) -> Result<usize> {
        let lens: Vec<usize> = self.lens().collect();
        match (&self.shares, self.stop) {
            (_, Stop::Forever { samples: 0 }) => Err(bad(
                "Stop::Forever with 0 samples an epoch; give the samples of one epoch".into(),
            )),
            (Shares::Counts(c), Stop::Forever { samples }) => {
                let b: usize = c.iter().sum();
                if samples % b != 0 {
                    return Err(bad(format!(
                        "Stop::Forever with {samples} samples an epoch, which is not a whole \
                         number of batches of {b} (the counts' sum); use a multiple of {b}"
                    )));
                }
                Ok(samples)
            }
            (Shares::Weights(_), Stop::Forever { samples }) => Ok(samples),
            (Shares::Weights(_), Stop::EachOnce) => Ok(self.total()),
            (Shares::Counts(_), Stop::EachOnce) => Err(bad(
                "Stop::EachOnce needs per-sample draws: exact counts per batch cannot read \
                 every sample once; use Mix::weighted, or Stop::FirstExhausted"
                    .into(),
            )),
            (Shares::Counts(c), rule) => {
                let b: usize = c.iter().sum();
                let passes = lens.iter().zip(c).map(|(&l, &c)| match rule {
                    Stop::FirstExhausted => l / c,
                    _ => l.div_ceil(c),
                });
                let batches = match rule {
                    Stop::FirstExhausted => passes.min(),
                    _ => passes.max(),
                }
                .unwrap_or(0);
                batches
                    .checked_mul(b)
                    .ok_or_else(|| bad("the epoch is longer than usize::MAX samples".into()))
            }
            (Shares::Weights(w), rule) => {
                let sum: f64 = w.iter().sum();
                // A length that is a whole number but for rounding (700 / 0.7) counts as one.
                let whole = |x: f64| {
                    let r = x.round();
                    ((x - r).abs() <= 1e-9 * r.max(1.0)).then_some(r)
                };
                let each = lens.iter().zip(w).map(|(&l, &w)| l as f64 * sum / w);
                let n = match rule {
                    Stop::FirstExhausted => {
                        let x = each.fold(f64::INFINITY, f64::min);
                        whole(x).unwrap_or(x.floor())
                    }
                    _ => {
                        let x = each.fold(0.0, f64::max);
                        whole(x).unwrap_or(x.ceil())
                    }
                };
                if n >= usize::MAX as f64 {
                    return Err(bad("the epoch is longer than usize::MAX samples".into()));
                }
                Ok(n as usize)
            }
        }
    }

    /// A number that changes when the sources' count or lengths, their own plan settings, the
    /// shares or the stop rule change: positions carry it. FNV-1a over 64-bit words
    /// ([`Fingerprint`]), the same value in every release. With it, whether a source plans its
    /// own epochs.
    fn fingerprint(&self) -> (u64, bool) {
        let mut h = Fingerprint::new();
        match &self.shares {
            Shares::Weights(w) => {
                h.u64(1);
                w.iter().for_each(|&w| {
                    h.f64(w);
                });
            }
            Shares::Counts(c) => {
                h.u64(2);
                c.iter().for_each(|&c| {
                    h.usize(c);
                });
            }
        }
        match self.stop {
            Stop::AllExhausted => h.u64(10),
            Stop::FirstExhausted => h.u64(11),
            Stop::EachOnce => h.u64(12),
            Stop::Forever { samples } => h.u64(13).usize(samples),
        };
        h.usize(self.sources.len());
        let mut planned = false;
        for d in &self.sources {
            h.usize(d.len());
            // A source's own fingerprint does not depend on the epoch: epoch 0's stands for all.
            let plan = d
                .plan(&PlanRequest::new(0))
                .and_then(|p| p.fingerprint())
                .map(|(_, v)| v);
            planned |= plan.is_some();
            h.u64(plan.unwrap_or(u64::MAX));
        }
        (h.finish63(), planned)
    }
}

impl<D: Dataset> Dataset for Mix<D> {
    type Sample = D::Sample;

    /// The samples of one epoch, all ranks together (see the type's docs).
    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> Result<D::Sample> {
        let (s, i) = self.locate(index).ok_or(Error::IndexOutOfRange {
            index,
            len: self.total(),
        })?;
        self.sources[s].get(i)
    }

    /// The whole epoch's order ([`Mix::order`]) dealt to the ranks in units of a batch (with
    /// counts per batch) or a sample, padded by repeating whole units from its start as the
    /// sampler pads; with counts per batch, the mix cuts the batches itself. The fingerprint
    /// covers the weights or counts, the stop rule, and each source's length and own
    /// fingerprint.
    fn plan(&self, r: &PlanRequest) -> Option<Plan> {
        let order = self.order(r.epoch, r.seed);
        let unit = self.batch_size().unwrap_or(1);
        let units = order.len() / unit;
        let per_rank = if r.world <= 1 {
            units
        } else if r.drop_last {
            units / r.world
        } else {
            units.div_ceil(r.world)
        };
        let unit_at = |k: usize| {
            let u = (k * r.world.max(1) + r.rank) % units.max(1);
            order[u * unit..(u + 1) * unit].to_vec()
        };
        let plan = match self.batch_size() {
            Some(_) => Plan::batches((0..per_rank).map(unit_at)),
            None if r.world <= 1 => Plan::order(order),
            None => Plan::order((0..per_rank).flat_map(unit_at).collect()),
        };
        let (fingerprint, planned) = self.fingerprint();
        Some(plan.with_fingerprint(if planned { MIX_OF_PLANS } else { SETTING }, fingerprint))
    }
}

impl<D: Dataset> std::fmt::Debug for Mix<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lens: Vec<usize> = self.lens().collect();
        f.debug_struct("Mix")
            .field("sources", &lens)
            .field("shares", &self.shares)
            .field("stop", &self.stop)
            .field("len", &self.len)
            .finish()
    }
}
