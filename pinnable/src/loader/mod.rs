//! A prefetching loader: samples in, batches out — collated straight into pinned memory by
//! worker threads and moved to the device without blocking, overlapped with the training step.
//!
//! ```text
//!  Sampler ──► worker threads ──────────────► transfer thread ──────────► consumer
//!  (order,      get(i) for each sample,        in order: to_device on      `for batch in &loader`
//!   shard)      the Batcher writes the batch   the copy stream (identity
//!               into ONE pinned block          for Device::cpu())
//! ```
//!
//! - **Sources**: the [`Dataset`] trait (implemented for slices, `Vec`s, `Arc`s,
//!   references), [`FnDataset`] for closures, [`TensorRows`] for the rows of one big tensor,
//!   and [`IterSource`] for streams that cannot be indexed; the file formats
//!   ([`formats`](crate::formats): `.npy` arrays, token shards, image folders) implement these
//!   traits from outside the loader. Samples may be zero-copy views of the dataset's memory.
//! - **Collation**: a [`Batcher`] (any closure
//!   `Fn(Vec<Sample>, &mut Collator) -> Result<Batch>`) plans the batch's tensors with the
//!   [`Collator`] — [`stack`](Collator::stack), [`stack_scalars`](Collator::stack_scalars),
//!   [`pad`](Collator::pad), [`empty`](Collator::empty),
//!   [`write_rows`](Collator::write_rows) (each sample writes its own row: a decoder's output
//!   lands in the batch) — and [`finish`](Collator::finish) writes every sample's bytes once,
//!   into one pinned block per batch, reused from the pool.
//! - **A dataset already in pinned memory** needs no collation: a batcher that returns
//!   [`Gather`](crate::Gather)s of the dataset's rows has the copy engine stack them on the
//!   device, reading each byte once, with no pinned batch block.
//! - **Order**: sequential or shuffled from a seed and the epoch number (our own
//!   [`SplitMix64`] and Fisher–Yates, identical on every machine), sharded like PyTorch's
//!   `DistributedSampler`; [`Launch`] reads the launcher's `RANK`, `WORLD_SIZE`, `LOCAL_RANK`.
//!   Variable-length samples batch under a token budget ([`BudgetPlan`]), planned from their
//!   lengths the same on every rank and dealt, so every rank gets the same number of batches.
//! - **Mixtures**: [`Mix`] reads several sources as one, in set proportions — drawn sample by
//!   sample, or in exact counts per batch — with torchdata's stop rules ([`Stop`]); its plan
//!   is a pure function of the seed and the epoch, so it resumes exactly.
//! - **The pipeline**: batches arrive in sampler order whatever the number of workers (or, with
//!   [`in_order(false)`](LoaderBuilder::in_order), as each is ready, so a slow sample holds up
//!   only its own batch); at most `prefetch + workers + 1` batches' pinned memory is held; an
//!   error in a sample arrives in its batch's place, naming the sample, and ends the epoch; a
//!   panic becomes an [`Error::Panicked`](crate::Error::Panicked); a sample past the
//!   [`sample_timeout`](LoaderBuilder::sample_timeout) ends the epoch with
//!   [`Error::Timeout`](crate::Error::Timeout); dropping an [`Epoch`] stops and joins its
//!   threads and returns its blocks.
//! - **Figures**: [`EpochStats`] — time the consumer waited, time loading,
//!   collating and moving, batches/s, GB/s, pinned memory held against the bound.
//! - **Resume**: a loader's [`Position`] — the epoch, the batches the consumer
//!   received, the settings they depend on — stored in a checkpoint and given back to
//!   [`LoaderBuilder::resume`] after a restart starts at the next batch, with any worker count,
//!   skipping the batches before it without loading them.
//!
//! # Examples
//!
//! ```
//! use pinnable::loader::{FnDataset, Loader};
//! use pinnable::{Device, Tensor, ToDevice};
//!
//! struct Sample { image: Tensor, tokens: Tensor, label: i64 }
//!
//! #[derive(ToDevice)]
//! struct Batch { images: Tensor, tokens: Tensor, lengths: Tensor, labels: Tensor }
//!
//! let dataset = FnDataset::new(10, |i| {
//!     Ok(Sample {
//!         image: Tensor::from_vec(vec![i as f32; 3 * 4 * 4], &[3, 4, 4])?,
//!         tokens: Tensor::from_vec1(vec![i as i64; 1 + i % 3]),
//!         label: i as i64,
//!     })
//! });
//! let device = Device::cuda(0).unwrap_or_else(|_| Device::cpu());
//! let loader = Loader::builder(dataset)
//!     .batch_size(4)
//!     .shuffle(1234)
//!     .device(device)
//!     .build_with(|samples, c| {
//!         let images = c.stack("images", samples.iter().map(|s| &s.image))?;
//!         let (tokens, lengths) = c.pad("tokens", samples.iter().map(|s| &s.tokens), 0i64)?;
//!         let labels = c.stack_scalars("labels", samples.iter().map(|s| s.label))?;
//!         let mut out = c.finish()?;
//!         Ok(Batch {
//!             images: out.take(images)?,
//!             tokens: out.take(tokens)?,
//!             lengths: out.take(lengths)?,
//!             labels: out.take(labels)?,
//!         })
//!     })?;
//!
//! for epoch in 0..2 {
//!     loader.set_epoch(epoch);
//!     for batch in &loader {
//!         let batch = batch?;
//!         assert_eq!(batch.tokens.shape()[0], batch.labels.shape()[0]);
//!     }
//!     println!("{}", loader.stats().unwrap());
//! }
//! # Ok::<(), pinnable::Error>(())
//! ```

pub(crate) mod batcher;
mod budget;
mod builder;
pub(crate) mod collate;
pub(crate) mod dataset;
mod epoch;
mod guard;
pub(crate) mod launch;
mod loaders;
pub(crate) mod mix;
#[cfg(test)]
mod panic_tests;
mod pipeline;
pub(crate) mod plan;
#[cfg(test)]
mod poll_tests;
pub(crate) mod position;
pub(crate) mod sampler;
mod source;
pub(crate) mod stats;
pub(crate) mod straggler;
pub(crate) mod stream;
#[cfg(test)]
mod tests;
mod tune;

pub use batcher::{Batcher, Stack};
pub use budget::{Budget, BudgetOptions, BudgetPlan, Piece};
pub use builder::LoaderBuilder;
pub use collate::{Collated, Collator};
pub use dataset::{Dataset, FnDataset, TensorRows};
pub use epoch::Epoch;
pub use launch::Launch;
pub use loaders::Loader;
pub use mix::{Mix, MixedStream, Stop, StreamMix};
pub use plan::{Plan, PlanRequest};
pub use position::Position;
pub use sampler::{Batches, Sampler, SplitMix64, permutation};
pub use source::Source;
pub use stats::EpochStats;
pub use stream::{IterSource, NotSeekable, Seekable};
pub use tune::Decision;
