//! Several streams read as one: [`Mix::streams`] gives a [`StreamMix`], whose
//! [`build`](StreamMix::build) is an [`IterSource`] drawing each item's stream at random, in set
//! proportions, from the seed and the epoch.

use std::sync::Arc;

use super::{Mix, Stop, bad};
use crate::error::Result;
use crate::loader::sampler::SplitMix64;
use crate::loader::stream::{IterSource, Seekable};

/// One stream, its items boxed.
type Items<S> = Box<dyn Iterator<Item = Result<S>> + Send>;
/// A stream's epoch, opened.
type Open<S> = Arc<dyn Fn(u64) -> Items<S> + Send + Sync>;
/// A stream's epoch from an item on, when it can seek.
type Seek<S> = Arc<dyn Fn(u64, u64) -> Option<Items<S>> + Send + Sync>;

/// The settings of a mix of streams, from [`Mix::streams`]: the streams with their weights
/// ([`add`](Self::add)), the stop rule ([`stop`](Self::stop)), then [`build`](Self::build).
///
/// Each item of an epoch comes from stream `s` with probability `weight[s] / Σ weight`, drawn
/// from the seed and the epoch (the same on every run); each stream is read in its own order.
/// Streams have no length, so the mix is a stream too: [`Stop::FirstExhausted`] (the default)
/// ends the epoch when a drawn stream ends, [`Stop::EachOnce`] reads every item of every stream
/// once (a stream that ends drops out of the draws). The other rules need lengths and are
/// refused at `build`.
///
/// **Resume.** With `FirstExhausted`, a mix of streams that can all seek
/// ([`IterSource::seekable`]) can seek too: the draws before the position are replayed (no
/// item read) and each stream is opened where its part ends, so a loader over the mix resumes
/// mid-epoch exactly. With `EachOnce`, which streams are still running at a position depends on
/// their lengths, so the mix resumes at an epoch's start only.
///
/// # Examples
///
/// ```
/// use pinnable::loader::{IterSource, Loader, Mix};
///
/// let web = IterSource::new(|_epoch| (0..700).map(|i| Ok(i)));
/// let code = IterSource::new(|_epoch| (1000..1300).map(|i| Ok(i)));
/// let mix = Mix::streams(42).add(web, 0.7).add(code, 0.3).build()?;
/// let loader = Loader::builder(mix).batch_size(50).workers(2).build_with(|items: Vec<i32>, _c| Ok(items))?;
/// let items: Vec<i32> = loader.iter().map(|b| b.unwrap()).flatten().collect();
/// let from_code = items.iter().filter(|&&i| i >= 1000).count();
/// assert!(from_code * 10 > items.len() * 2 && from_code * 10 < items.len() * 4); // about 30%
/// # Ok::<(), pinnable::Error>(())
/// ```
pub struct StreamMix<S> {
    streams: Vec<(Open<S>, Option<Seek<S>>, f64)>,
    stop: Stop,
    seed: u64,
}

impl Mix<()> {
    /// A mix of streams whose draws come from `seed` and the epoch: add the streams, then
    /// build ([`StreamMix`]). For sources that can be indexed, [`Mix::weighted`] and
    /// [`Mix::per_batch`] plan exact shares and resume under any stop rule.
    pub fn streams<S: Send + 'static>(seed: u64) -> StreamMix<S> {
        StreamMix {
            streams: Vec::new(),
            stop: Stop::FirstExhausted,
            seed,
        }
    }
}

impl<S: Send + 'static> StreamMix<S> {
    /// Adds `source` with `weight` (a positive finite number; checked at `build`).
    pub fn add<F, G, I>(mut self, source: IterSource<F, G>, weight: f64) -> Self
    where
        F: Fn(u64) -> I + Send + Sync + 'static,
        I: Iterator<Item = Result<S>> + Send + 'static,
        G: Seekable<S> + 'static,
    {
        let source = Arc::new(source);
        let open: Open<S> = {
            let source = source.clone();
            Arc::new(move |epoch| Box::new(source.open(epoch)) as Items<S>)
        };
        let seek: Option<Seek<S>> = source.can_seek::<S>().then(|| {
            Arc::new(move |epoch, item| {
                source
                    .seek::<S>(epoch, item)
                    .map(|s| Box::new(s) as Items<S>)
            }) as Seek<S>
        });
        self.streams.push((open, seek, weight));
        self
    }

    /// When an epoch ends: [`Stop::FirstExhausted`] (the default) or [`Stop::EachOnce`].
    pub fn stop(mut self, stop: Stop) -> Self {
        self.stop = stop;
        self
    }

    /// The mix, as a stream source for [`Loader::builder`](crate::loader::Loader::builder).
    ///
    /// # Errors
    ///
    /// [`Error::Config`](crate::Error::Config) naming `mix` for no stream, a weight that is
    /// not a positive finite number, or a stop rule other than `FirstExhausted` and
    /// `EachOnce`.
    pub fn build(
        self,
    ) -> Result<
        IterSource<
            impl Fn(u64) -> MixedStream<S> + Send + Sync + 'static,
            impl Seekable<S> + 'static,
        >,
    > {
        if self.streams.is_empty() {
            return Err(bad("a mix of streams needs at least one stream".into()));
        }
        if let Some((_, _, w)) = self
            .streams
            .iter()
            .find(|(_, _, w)| !(w.is_finite() && *w > 0.0))
        {
            return Err(bad(format!(
                "a weight of {w}: weights are positive finite numbers"
            )));
        }
        if !matches!(self.stop, Stop::FirstExhausted | Stop::EachOnce) {
            return Err(bad(format!(
                "{:?} needs the sources' lengths, which streams do not have: a mix of streams \
                 stops at the first stream's end (Stop::FirstExhausted) or reads each once \
                 (Stop::EachOnce); for exact shares under any rule, mix datasets",
                self.stop
            )));
        }
        let mix = Arc::new(self);
        let seek = MixSeek(mix.clone());
        Ok(IterSource::new(move |epoch| mix.stream(epoch, None)).seekable_by(seek))
    }

    /// The draws' generator of epoch `epoch`.
    fn rng(&self, epoch: u64) -> SplitMix64 {
        SplitMix64::for_epoch(self.seed, epoch)
    }

    /// Epoch `epoch`'s mixed stream; with `at`, from item `at` on, each stream opened where
    /// its part of the first `at` items ends (`FirstExhausted`, every stream seekable).
    fn stream(&self, epoch: u64, at: Option<u64>) -> MixedStream<S> {
        let mut rng = self.rng(epoch);
        let weights: Vec<f64> = self.streams.iter().map(|s| s.2).collect();
        let streams = match at {
            None => self.streams.iter().map(|s| Some((s.0)(epoch))).collect(),
            Some(at) => {
                let alive = vec![true; weights.len()];
                let mut counts = vec![0u64; weights.len()];
                for _ in 0..at {
                    counts[draw(&mut rng, &weights, &alive)] += 1;
                }
                self.streams
                    .iter()
                    .zip(counts)
                    .map(|(s, k)| match (k, &s.1) {
                        (0, _) => Some((s.0)(epoch)),
                        (k, Some(seek)) => seek(epoch, k),
                        (_, None) => None,
                    })
                    .collect()
            }
        };
        MixedStream {
            alive: vec![true; weights.len()],
            streams,
            weights,
            rng,
            each_once: self.stop == Stop::EachOnce,
            done: false,
        }
    }
}

impl<S> std::fmt::Debug for StreamMix<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamMix")
            .field(
                "weights",
                &self.streams.iter().map(|s| s.2).collect::<Vec<_>>(),
            )
            .field("stop", &self.stop)
            .field("seed", &self.seed)
            .finish()
    }
}

/// Which stream the next item comes from: one draw, by weight, among those alive.
fn draw(rng: &mut SplitMix64, weights: &[f64], alive: &[bool]) -> usize {
    let total: f64 = weights
        .iter()
        .zip(alive)
        .filter(|(_, a)| **a)
        .map(|(w, _)| w)
        .sum();
    let mut u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
    let mut last = 0;
    for (s, (w, a)) in weights.iter().zip(alive).enumerate() {
        if !a {
            continue;
        }
        last = s;
        if u < *w {
            return s;
        }
        u -= w;
    }
    last
}

/// The seeking of a mix of streams: possible with `FirstExhausted` when every stream can seek.
struct MixSeek<S>(Arc<StreamMix<S>>);

impl<S: Send + 'static> Seekable<S> for MixSeek<S> {
    type Stream = MixedStream<S>;

    fn seek(&self, epoch: u64, item: u64) -> Option<MixedStream<S>> {
        self.can_seek().then(|| self.0.stream(epoch, Some(item)))
    }

    fn can_seek(&self) -> bool {
        self.0.stop == Stop::FirstExhausted && self.0.streams.iter().all(|s| s.1.is_some())
    }
}

/// One epoch of a mix of streams ([`StreamMix`]): each item drawn from one of the streams.
pub struct MixedStream<S> {
    streams: Vec<Option<Items<S>>>,
    weights: Vec<f64>,
    alive: Vec<bool>,
    rng: SplitMix64,
    each_once: bool,
    done: bool,
}

impl<S> Iterator for MixedStream<S> {
    type Item = Result<S>;

    fn next(&mut self) -> Option<Result<S>> {
        while !self.done {
            if !self.alive.contains(&true) {
                self.done = true;
                break;
            }
            let s = draw(&mut self.rng, &self.weights, &self.alive);
            match self.streams[s].as_mut().and_then(Iterator::next) {
                Some(item) => return Some(item),
                None if self.each_once => {
                    self.alive[s] = false;
                    self.streams[s] = None;
                }
                None => self.done = true,
            }
        }
        None
    }
}

impl<S> std::fmt::Debug for MixedStream<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MixedStream")
            .field("weights", &self.weights)
            .field("alive", &self.alive)
            .finish_non_exhaustive()
    }
}
