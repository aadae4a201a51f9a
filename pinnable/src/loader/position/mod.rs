//! Where a loader is in its run, so that a restarted run goes on from the next batch:
//! [`Position`].
//!
//! An epoch's order is a pure function of the seed, the epoch number, the dataset's length and
//! the shard ([`Sampler`](super::Sampler)), so a position is a handful of numbers, and resuming
//! from it computes the epoch's order and starts at the batch after the last one received: no
//! batch is loaded, collated or replayed to get there.

mod text;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// The version of [`Position`]'s byte and string forms this build writes and reads.
const VERSION: u16 = 1;
/// The version written for a position that holds a plan setting (see [`Position::plan`]):
/// version 1 and one more word, a fingerprint from [`Fingerprint`](crate::hash::Fingerprint).
/// Positions without one stay version 1, byte for byte.
const VERSION_PLAN: u16 = 3;
/// The version a position holding a plan setting had before fingerprints went through
/// [`Fingerprint`](crate::hash::Fingerprint): the same layout, read still (see
/// [`Position::check_plan`]).
const VERSION_PLAN_2: u16 = 2;
/// The length of a position with a plan setting (versions 2 and 3).
const BYTES_PLAN: usize = 72;
/// The first bytes of [`Position::to_bytes`].
const MAGIC: &[u8; 4] = b"PNPS";
/// The length of [`Position::to_bytes`].
const BYTES: usize = 64;
const PREFIX: &str = "pinnable-position/";

const HAS_SEED: u16 = 1;
const HAS_SAMPLES: u16 = 2;
const DROP_LAST: u16 = 4;
const AHEAD: u16 = 8;

/// The plan setting of a packed-documents plan ([`BudgetPlan::digest`](super::BudgetPlan::digest)),
/// whose fingerprint in format version 2 came from a hash no longer computed.
pub(crate) const PACKING_PLAN: &str = "packing plan";
/// The plan setting of a [`Mix`](super::Mix) with sources that plan their own epochs: its
/// fingerprint holds theirs, so a format-2 one may hold a packing plan's.
pub(crate) const MIX_OF_PLANS: &str = "mix (sources, their plans, weights and stop rule)";

/// Where a loader is: the epoch, how many of its batches the consumer has received, and the
/// settings those numbers depend on (the seed, the shard, the dataset's length, the batch size,
/// `drop_last`). Store it in a checkpoint ([`to_bytes`](Self::to_bytes), or the string form of
/// [`Display`](std::fmt::Display)) and give it back to [`LoaderBuilder::resume`](super::LoaderBuilder::resume)
/// after a restart: the first batch the new loader delivers is the one the interrupted run
/// would have delivered next, whatever the worker counts and prefetch depths of either run.
///
/// A position counts batches the consumer *received* (not those prefetched), from
/// [`Loader::position`](super::Loader::position) or [`Epoch::position`](super::Epoch::position)
/// (and their stream counterparts). At the end of an epoch it is the start of the next one.
///
/// A position saved by a loader with another dataset length, batch size, world size, rank,
/// seed, `drop_last` or plan setting is refused with [`Error::Resume`] naming the setting.
///
/// **Format versions.** A position without a plan setting is format version 1; one with a
/// plan setting is version 3, whose fingerprints pinnable computes with its own hash, the same
/// under every Rust release. Version 2 (the same layout, written by releases whose packing
/// plans were fingerprinted with the standard library's default hasher, which Rust may
/// change between its releases) is read: such a position resumes exactly where its fingerprint is one version 3
/// computes alike (tar shards, mixes of sources that do not plan their own epochs), and is
/// refused with [`Error::Position`] for a packing plan or a mix of planned sources, with the
/// ways to go on.
///
/// # Examples
///
/// ```
/// use pinnable::loader::{Loader, Position, Stack};
/// use pinnable::Tensor;
///
/// let data: Vec<Tensor> = (0..20).map(|i| Tensor::from_vec1(vec![i as f32])).collect();
/// let build = || Loader::builder(data.clone()).batch_size(4).shuffle(7).workers(2);
///
/// let loader = build().build(Stack)?;
/// let mut epoch = loader.iter();
/// let _first = epoch.next().unwrap()?;
/// let _second = epoch.next().unwrap()?;
/// let saved = epoch.position().to_string(); // into the checkpoint
/// let third = epoch.next().unwrap()?;
/// drop(epoch);
///
/// // After a restart: the next batch is the third.
/// let position: Position = saved.parse()?;
/// assert_eq!((position.epoch(), position.batch()), (0, 2));
/// let resumed = build().workers(1).resume(position).build(Stack)?;
/// let mut epoch = resumed.iter();
/// assert_eq!(epoch.remaining(), Some(3));
/// assert_eq!(epoch.next().unwrap()?.to_vec::<f32>()?, third.to_vec::<f32>()?);
/// # Ok::<(), pinnable::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Position {
    epoch: u64,
    batch: u64,
    seed: Option<u64>,
    rank: u64,
    world: u64,
    /// The dataset's length; `None` for a stream.
    samples: Option<u64>,
    batch_size: u64,
    drop_last: bool,
    /// The setting of a dataset that plans its own epochs, e.g. a tar source's shuffle
    /// buffer; `None` for the others.
    plan: Option<u64>,
    /// Whether `plan` was read from format version 2.
    plan_2: bool,
    /// Whether batches past `batch` were delivered already (out of order): such a position
    /// cannot be resumed.
    ahead: bool,
}

impl Position {
    /// The largest epoch and batch number a position holds: 2⁶³ − 1, so every position fits a
    /// signed 64-bit integer (as checkpoints written by other tools store numbers). A loader
    /// runs epochs below it, so the position after its last epoch still fits; a position or an
    /// epoch past it is an error ([`Error::Position`]), never a wrap to epoch 0.
    pub const LIMIT: u64 = i64::MAX as u64;

    /// The position at batch `batch` of epoch `epoch` of a loader with these settings.
    pub(crate) fn new(
        (epoch, batch): (u64, u64),
        seed: Option<u64>,
        (rank, world): (usize, usize),
        samples: Option<usize>,
        batch_size: usize,
        drop_last: bool,
    ) -> Position {
        Position {
            epoch,
            batch,
            seed,
            rank: rank as u64,
            world: world as u64,
            samples: samples.map(|s| s as u64),
            batch_size: batch_size as u64,
            drop_last,
            plan: None,
            plan_2: false,
            ahead: false,
        }
    }

    /// The same position with the plan setting `plan`.
    pub(crate) fn with_plan(self, plan: Option<u64>) -> Position {
        Position {
            plan,
            plan_2: false,
            ..self
        }
    }

    /// The same settings at batch `batch` of epoch `epoch`.
    pub(crate) fn at(self, epoch: u64, batch: u64) -> Position {
        Position {
            epoch,
            batch,
            ahead: false,
            ..self
        }
    }

    /// Whether the consumer had also received batches past [`batch`](Self::batch) when the
    /// position was taken: a loader delivering out of order
    /// ([`in_order(false)`](super::LoaderBuilder::in_order)) had handed on a later batch
    /// before an earlier one. [`LoaderBuilder::resume`](super::LoaderBuilder::resume) refuses
    /// such a position (a batch count cannot say which later batches were received); one
    /// taken between epochs, or when every batch before the last received one had arrived,
    /// is exact.
    pub fn delivered_ahead(&self) -> bool {
        self.ahead
    }

    /// The epoch the next batch belongs to.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The batches of [`epoch`](Self::epoch) the consumer has received: the next batch is
    /// batch number `batch()` of the epoch (counting from 0).
    pub fn batch(&self) -> u64 {
        self.batch
    }

    /// The shuffle seed, `None` for sequential order (and streams).
    pub fn seed(&self) -> Option<u64> {
        self.seed
    }

    /// The rank and the world size.
    pub fn shard(&self) -> (u64, u64) {
        (self.rank, self.world)
    }

    /// The dataset's length in samples, `None` for a stream.
    pub fn samples(&self) -> Option<u64> {
        self.samples
    }

    /// The samples per batch.
    pub fn batch_size(&self) -> u64 {
        self.batch_size
    }

    /// Whether the short last batch is dropped.
    pub fn drop_last(&self) -> bool {
        self.drop_last
    }

    /// The fingerprint of a dataset that plans its own epochs
    /// ([`Plan::fingerprint`](super::Plan::fingerprint), e.g. a tar source's shuffle buffer and
    /// shard list), `None` for the others.
    pub fn plan(&self) -> Option<u64> {
        self.plan
    }

    fn version(&self) -> u16 {
        match (self.plan, self.plan_2) {
            (None, _) => VERSION,
            (Some(_), false) => VERSION_PLAN,
            (Some(_), true) => VERSION_PLAN_2,
        }
    }

    /// The position as 64 bytes (little-endian, with a magic number and a format version), for
    /// a binary checkpoint; 72 (format version 3) when it holds a [`plan`](Self::plan) setting.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut flags = 0;
        if self.seed.is_some() {
            flags |= HAS_SEED;
        }
        if self.samples.is_some() {
            flags |= HAS_SAMPLES;
        }
        if self.drop_last {
            flags |= DROP_LAST;
        }
        if self.ahead {
            flags |= AHEAD;
        }
        let mut out = Vec::with_capacity(BYTES);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.version().to_le_bytes());
        out.extend_from_slice(&flags.to_le_bytes());
        for v in [
            self.epoch,
            self.batch,
            self.seed.unwrap_or(0),
            self.rank,
            self.world,
            self.samples.unwrap_or(0),
            self.batch_size,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        if let Some(plan) = self.plan {
            out.extend_from_slice(&plan.to_le_bytes());
        }
        out
    }

    /// The position [`to_bytes`](Self::to_bytes) wrote.
    ///
    /// # Errors
    ///
    /// [`Error::Position`] for bytes of another length, another magic number, another format
    /// version, unknown flags, or settings no loader has (a world of 0, a rank outside it, a
    /// batch size of 0).
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::loader::{Loader, Position, Stack};
    /// use pinnable::Tensor;
    ///
    /// let data: Vec<Tensor> = (0..8).map(|i| Tensor::from_vec1(vec![i as u8])).collect();
    /// let loader = Loader::builder(data).batch_size(3).workers(1).build(Stack)?;
    /// let bytes = loader.position().to_bytes();
    /// assert_eq!(Position::from_bytes(&bytes)?, loader.position());
    /// assert!(Position::from_bytes(&bytes[..10]).is_err());
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn from_bytes(bytes: &[u8]) -> Result<Position> {
        let bad = |problem: String| Error::Position { problem };
        if bytes.len() != BYTES && bytes.len() != BYTES_PLAN {
            return Err(bad(format!(
                "{} bytes; a position is {BYTES} bytes ({BYTES_PLAN} with a plan setting)",
                bytes.len()
            )));
        }
        if &bytes[..4] != MAGIC {
            return Err(bad(format!(
                "it does not start with {:?}: these bytes are not a position",
                String::from_utf8_lossy(MAGIC)
            )));
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        check_version(u64::from(version))?;
        let planned = version == VERSION_PLAN || version == VERSION_PLAN_2;
        let want = if planned { BYTES_PLAN } else { BYTES };
        if bytes.len() != want {
            return Err(bad(format!(
                "{} bytes for format version {version}, which has {want}",
                bytes.len()
            )));
        }
        let flags = u16::from_le_bytes([bytes[6], bytes[7]]);
        if flags & !(HAS_SEED | HAS_SAMPLES | DROP_LAST | AHEAD) != 0 {
            return Err(bad(format!("unknown flags {flags:#06x}")));
        }
        let word = |i: usize| {
            let at = 8 + 8 * i;
            u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
        };
        for (flag, i, name) in [(HAS_SEED, 2, "seed"), (HAS_SAMPLES, 5, "dataset length")] {
            if flags & flag == 0 && word(i) != 0 {
                return Err(bad(format!("a {name} is stored but flagged absent")));
            }
        }
        let p = Position {
            epoch: word(0),
            batch: word(1),
            seed: (flags & HAS_SEED != 0).then(|| word(2)),
            rank: word(3),
            world: word(4),
            samples: (flags & HAS_SAMPLES != 0).then(|| word(5)),
            batch_size: word(6),
            drop_last: flags & DROP_LAST != 0,
            plan: planned.then(|| word(7)),
            plan_2: version == VERSION_PLAN_2,
            ahead: flags & AHEAD != 0,
        };
        p.validate()?;
        Ok(p)
    }

    /// Checks what every loader's settings satisfy.
    fn validate(&self) -> Result<()> {
        let bad = |problem: String| Err(Error::Position { problem });
        if self.world == 0 || self.rank >= self.world {
            return bad(format!(
                "shard {}/{}: the rank must be below the world size, which must be at least 1",
                self.rank, self.world
            ));
        }
        if self.batch_size == 0 {
            return bad("a batch size of 0".into());
        }
        if self.epoch > Position::LIMIT || self.batch > Position::LIMIT {
            return bad(format!(
                "epoch {} batch {}: epochs and batches go up to {} (`Position::LIMIT`)",
                self.epoch,
                self.batch,
                Position::LIMIT
            ));
        }
        for v in [self.rank, self.world, self.batch_size]
            .into_iter()
            .chain(self.samples)
        {
            if usize::try_from(v).is_err() {
                return bad(format!("{v} does not fit in this machine's usize"));
            }
        }
        Ok(())
    }

    /// Refuses a position saved under other settings than `current`'s (whose epoch and batch
    /// are ignored), naming the first setting that differs.
    pub(crate) fn check_settings(&self, current: &Position) -> Result<()> {
        if self.ahead {
            return Err(Error::Config {
                setting: "resume",
                problem: format!(
                    "the position (epoch {} batch {}) was taken while batches past batch {} had \
                     been delivered out of order (`in_order(false)`), so no batch count says \
                     where to go on; save positions between epochs, or when \
                     `Position::delivered_ahead` is false",
                    self.epoch, self.batch, self.batch
                ),
            });
        }
        let differ = |setting, saved: String, current: String| {
            Err(Error::Resume {
                setting,
                saved,
                current,
            })
        };
        let samples = |s: Option<u64>| match s {
            Some(n) => format!("{n} samples"),
            None => "a stream (no length)".to_owned(),
        };
        let seed = |s: Option<u64>| match s {
            Some(s) => s.to_string(),
            None => "none (sequential order)".to_owned(),
        };
        if self.samples != current.samples {
            return differ(
                "dataset length",
                samples(self.samples),
                samples(current.samples),
            );
        }
        if self.batch_size != current.batch_size {
            return differ(
                "batch size",
                self.batch_size.to_string(),
                current.batch_size.to_string(),
            );
        }
        if self.world != current.world {
            return differ(
                "world size",
                self.world.to_string(),
                current.world.to_string(),
            );
        }
        if self.rank != current.rank {
            return differ("rank", self.rank.to_string(), current.rank.to_string());
        }
        if self.seed != current.seed {
            return differ("seed", seed(self.seed), seed(current.seed));
        }
        if self.drop_last != current.drop_last {
            return differ(
                "drop_last",
                self.drop_last.to_string(),
                current.drop_last.to_string(),
            );
        }
        Ok(())
    }

    /// Refuses a position whose plan setting differs from `current` (the name and value of the
    /// loader's dataset's plans, [`Plan::fingerprint`](super::Plan::fingerprint)), naming
    /// it; or, for a format-2 position whose kind of fingerprint this release computes with
    /// another hash, with [`Error::Position`] saying how to go on.
    pub(crate) fn check_plan(&self, current: Option<(&'static str, u64)>) -> Result<()> {
        let value = current.map(|(_, v)| v);
        if self.plan == value {
            return Ok(());
        }
        if self.plan_2
            && let Some((name, value)) = current
            && (name == PACKING_PLAN || name == MIX_OF_PLANS)
        {
            let what = if name == PACKING_PLAN {
                "packing plans"
            } else {
                "packing plans, which a mix's fingerprint holds when a source plans its own \
                 epochs,"
            };
            let (epoch, batch) = (self.epoch, self.batch);
            let upgraded = self.with_plan(Some(value));
            return Err(Error::Position {
                problem: format!(
                    "it is format version 2, written by a release that fingerprinted \
                     {what} with the standard library's default hasher, which Rust does not keep the same \
                     between its releases; this release fingerprints them with a fixed hash \
                     of its own (format version 3) and cannot check the old fingerprint, so it \
                     cannot tell whether this loader's {name} (now {value}) is the one the \
                     position was saved under (saved {saved}). To go on: build the loader \
                     without `resume` and call `set_epoch({epoch})` to run epoch {epoch} again \
                     from its first batch ({batch} of its batches had been received); or \
                     finish epoch {epoch} with the release that saved the position; or, only \
                     if the data and every setting are the ones the position was saved under, \
                     resume from `{upgraded}` (the position with this loader's fingerprint)",
                    saved = self
                        .plan
                        .map_or_else(|| "none".to_owned(), |v| v.to_string()),
                ),
            });
        }
        let show = |v: Option<u64>| v.map_or_else(|| "none".to_owned(), |v| v.to_string());
        Err(Error::Resume {
            setting: current.map_or("plan setting", |(name, _)| name),
            saved: show(self.plan),
            current: show(value),
        })
    }
}

/// Refuses to run an epoch whose end could not be saved as a position.
pub(crate) fn check_epoch(epoch: u64) -> Result<()> {
    if epoch >= Position::LIMIT {
        return Err(Error::Position {
            problem: format!(
                "epoch {epoch} cannot run: epochs run below {} (`Position::LIMIT`), so the \
                 position after each still fits a signed 64-bit integer",
                Position::LIMIT
            ),
        });
    }
    Ok(())
}

fn check_version(version: u64) -> Result<()> {
    if ![VERSION, VERSION_PLAN_2, VERSION_PLAN]
        .map(u64::from)
        .contains(&version)
    {
        let newer = if version > u64::from(VERSION_PLAN) {
            ": a newer release of pinnable wrote it; resume with that release or a later one"
        } else {
            ""
        };
        return Err(Error::Position {
            problem: format!(
                "format version {version}; this build of pinnable reads versions {VERSION} \
                 to {VERSION_PLAN}{newer}"
            ),
        });
    }
    Ok(())
}

/// The batches one epoch's consumer has received, for its position.
pub(crate) struct Progress {
    /// The epoch's settings, number and first batch (where it resumed).
    start: Position,
    /// The batches the epoch has when its length is known (datasets, not streams).
    batches: Option<u64>,
    /// The batches received without a gap from the start, and those received past them
    /// (out-of-order delivery).
    received: Mutex<(u64, BTreeSet<u64>)>,
    ended: AtomicBool,
}

impl Progress {
    pub(crate) fn new(start: Position, batches: Option<usize>) -> Arc<Progress> {
        Arc::new(Progress {
            start,
            batches: batches.map(|b| b as u64),
            received: Mutex::new((0, BTreeSet::new())),
            ended: AtomicBool::new(false),
        })
    }

    /// The consumer received batch `batch` (counted from the epoch's first).
    pub(crate) fn received(&self, batch: usize) {
        let mut r = self.received.lock().unwrap_or_else(|e| e.into_inner());
        let (done, ahead) = &mut *r;
        if batch as u64 == *done {
            *done += 1;
            while ahead.remove(done) {
                *done += 1;
            }
        } else {
            ahead.insert(batch as u64);
        }
    }

    /// The stream ended with its last batch delivered.
    pub(crate) fn ended(&self) {
        self.ended.store(true, Ordering::Relaxed);
    }

    /// Where the consumer is: after the last batch received, or at the start of the next epoch
    /// once this one is over.
    pub(crate) fn position(&self) -> Position {
        // Both stay within `Position::LIMIT`: epochs past `LIMIT - 1` never run (`check_epoch`),
        // and no run receives 2⁶³ batches.
        let (done, ahead) = {
            let r = self.received.lock().unwrap_or_else(|e| e.into_inner());
            (r.0, !r.1.is_empty())
        };
        let batch = self.start.batch.saturating_add(done);
        let over = self.ended.load(Ordering::Relaxed) || self.batches == Some(batch);
        if over {
            self.start.at(self.start.epoch.saturating_add(1), 0)
        } else {
            Position {
                ahead,
                ..self.start.at(self.start.epoch, batch)
            }
        }
    }
}

#[cfg(test)]
mod tests;
