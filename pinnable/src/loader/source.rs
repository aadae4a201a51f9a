//! What a loader reads: [`Source`], implemented by every [`Dataset`] (indexed) and by
//! [`IterSource`] (a stream), and how each kind turns an epoch into the pipeline's jobs.

use std::sync::Arc;

use super::collate::EpochSeed;
use super::dataset::Dataset;
use super::pipeline::{Job, Jobs};
use super::plan::Plan;
use super::position::Position;
use super::sampler::Sampler;
use super::stream::{IterSource, Seekable, shard_stream};
use crate::error::{Error, Result};
use sealed::Started;

/// What a [`Loader`](super::Loader) reads: a [`Dataset`] (samples by index: shuffled, sharded,
/// planned, with a length) or an [`IterSource`] (a stream read front to back: in stream order,
/// its length known when it ends). Both kinds share one loader, one builder and one epoch type;
/// the settings that need an index (`shuffle`, `sample_timeout`) are refused for a stream at
/// `build`, naming the setting.
///
/// Implemented for every `Dataset` and every `IterSource`; not meant to be implemented
/// otherwise (implement [`Dataset`] for your source instead).
pub trait Source: sealed::Kind {}

impl<T: sealed::Kind> Source for T {}

pub(crate) mod sealed {
    use super::*;

    /// One epoch, ready for the pipeline.
    pub struct Started<S> {
        pub(crate) jobs: Jobs<S>,
        /// The batches from the first one on, when known.
        pub(crate) batches: Option<usize>,
        /// The epoch's length in batches, when known.
        pub(crate) len: Option<usize>,
        pub(crate) dataset: Option<Arc<dyn Dataset<Sample = S>>>,
        pub(crate) seed: EpochSeed,
    }

    /// What the loader needs of a source; sealed, so the loader may grow it.
    pub trait Kind: Send + Sync + 'static {
        /// One sample.
        type Sample: Send + 'static;

        /// Samples in the source, when it is indexed.
        fn samples(&self) -> Option<usize>;

        /// A plan of epoch `epoch`, when the source plans its epochs.
        fn plan(&self, sampler: &Sampler, epoch: u64) -> Option<Plan>;

        /// Epoch `epoch`'s jobs from batch `first` on; `plan` is a plan of that epoch made
        /// earlier (reused rather than made again).
        fn start(
            this: &Arc<Self>,
            sampler: &Sampler,
            epoch: u64,
            first: u64,
            plan: Option<Plan>,
        ) -> Started<Self::Sample>;

        /// The position at batch `batch` of epoch `epoch`.
        fn position_at(&self, sampler: &Sampler, epoch: u64, batch: u64) -> Position;

        /// Refuses settings this kind of source cannot honour, and a position it cannot
        /// resume from.
        fn check(
            &self,
            shuffled: bool,
            timeout: bool,
            resume: Option<&Position>,
            sampler: &Sampler,
        ) -> Result<()>;
    }
}

impl<D: Dataset + 'static> sealed::Kind for D
where
    D::Sample: 'static,
{
    type Sample = D::Sample;

    fn samples(&self) -> Option<usize> {
        Some(self.len())
    }

    fn plan(&self, sampler: &Sampler, epoch: u64) -> Option<Plan> {
        Dataset::plan(self, &sampler.request(epoch))
    }

    fn start(
        this: &Arc<Self>,
        sampler: &Sampler,
        epoch: u64,
        first: u64,
        plan: Option<Plan>,
    ) -> Started<D::Sample> {
        let request = sampler.request(epoch);
        let plan = plan.or_else(|| Dataset::plan(&**this, &request));
        let (batches, len) = match plan {
            Some(plan) => {
                this.prefetch(&request, &plan);
                let len = sampler.plan_len(&plan);
                (sampler.batches_of(plan, first as usize), len)
            }
            None => (sampler.batches_from(epoch, first as usize), sampler.len()),
        };
        let dataset: Arc<dyn Dataset<Sample = D::Sample>> = this.clone();
        Started {
            batches: Some(batches.len()),
            len: Some(len),
            jobs: Box::new(batches.map(Job::Indices)),
            dataset: Some(dataset),
            seed: EpochSeed {
                seed: sampler.seed(),
                epoch,
            },
        }
    }

    fn position_at(&self, sampler: &Sampler, epoch: u64, batch: u64) -> Position {
        sampler.position_at(epoch, batch)
    }

    fn check(
        &self,
        _shuffled: bool,
        _timeout: bool,
        resume: Option<&Position>,
        sampler: &Sampler,
    ) -> Result<()> {
        let Some(position) = resume else {
            return Ok(());
        };
        // The fingerprint first: a mix with other weights has another length too, and its
        // fingerprint says why.
        position.check_plan(sampler.fingerprint())?;
        position.check_settings(&sampler.position_at(0, 0))?;
        let len = match sealed::Kind::plan(self, sampler, position.epoch()) {
            Some(plan) => sampler.plan_len(&plan),
            None => sampler.len(),
        };
        if position.batch() > len as u64 {
            return Err(Error::Resume {
                setting: "batch",
                saved: position.batch().to_string(),
                current: format!("{len} batches an epoch"),
            });
        }
        Ok(())
    }
}

impl<F, G, I, S> sealed::Kind for IterSource<F, G>
where
    F: Fn(u64) -> I + Send + Sync + 'static,
    G: Seekable<S> + 'static,
    I: Iterator<Item = Result<S>> + Send + 'static,
    S: Send + 'static,
{
    type Sample = S;

    fn samples(&self) -> Option<usize> {
        None
    }

    fn plan(&self, _sampler: &Sampler, _epoch: u64) -> Option<Plan> {
        None
    }

    fn start(
        this: &Arc<Self>,
        sampler: &Sampler,
        epoch: u64,
        first: u64,
        _plan: Option<Plan>,
    ) -> Started<S> {
        let (rank, world) = sampler.rank_and_world();
        let batch_size = sampler.batch_size();
        let drop_last = sampler.drops_last();
        // Every rank's first `first` batches came from the stream's first
        // `first * batch_size * world` items.
        let skip = first
            .saturating_mul(batch_size as u64)
            .saturating_mul(world as u64);
        let jobs: Jobs<S> = if skip == 0 {
            Box::new(Chunks {
                items: shard_stream(this.open(epoch), 0, rank, world),
                batch_size,
                drop_last,
            })
        } else {
            // A position past batch 0 is only taken by a source that can seek (checked at
            // build), so `seek` gives a stream.
            match this.seek(epoch, skip) {
                Some(stream) => Box::new(Chunks {
                    items: shard_stream(stream, skip as usize, rank, world),
                    batch_size,
                    drop_last,
                }),
                None => Box::new(std::iter::empty()),
            }
        };
        Started {
            jobs,
            batches: None,
            len: None,
            dataset: None,
            seed: EpochSeed { seed: None, epoch },
        }
    }

    fn position_at(&self, sampler: &Sampler, epoch: u64, batch: u64) -> Position {
        Position::new(
            (epoch, batch),
            None,
            sampler.rank_and_world(),
            None,
            sampler.batch_size(),
            sampler.drops_last(),
        )
    }

    fn check(
        &self,
        shuffled: bool,
        timeout: bool,
        resume: Option<&Position>,
        sampler: &Sampler,
    ) -> Result<()> {
        if timeout {
            return Err(Error::Config {
                setting: "sample_timeout",
                problem: "a stream's `next` is not watched (it runs under the loader's lock on \
                          the stream); time out inside the stream, or use a Dataset"
                    .into(),
            });
        }
        if shuffled {
            return Err(Error::Config {
                setting: "shuffle",
                problem: "a stream cannot be shuffled; shuffle inside the stream (its closure \
                          gets the epoch number), or use a Dataset"
                    .into(),
            });
        }
        let Some(p) = resume else {
            return Ok(());
        };
        p.check_settings(&self.position_at(sampler, 0, 0))?;
        if p.batch() > 0 && !self.can_seek::<S>() {
            return Err(Error::Config {
                setting: "resume",
                problem: format!(
                    "the position is batch {} of epoch {}, and this stream cannot start \
                     mid-epoch; give its IterSource a way there with `.seekable(|epoch, item| \
                     ...)`, or resume at the start of an epoch",
                    p.batch(),
                    p.epoch()
                ),
            });
        }
        Ok(())
    }
}

/// A stream's items cut into batch jobs.
struct Chunks<It> {
    items: It,
    batch_size: usize,
    drop_last: bool,
}

impl<It, S> Iterator for Chunks<It>
where
    It: Iterator<Item = (usize, Result<S>)>,
{
    type Item = Job<S>;

    fn next(&mut self) -> Option<Job<S>> {
        let chunk: Vec<_> = self.items.by_ref().take(self.batch_size).collect();
        if chunk.is_empty() || (self.drop_last && chunk.len() < self.batch_size) {
            return None;
        }
        Some(Job::Read(chunk))
    }
}
