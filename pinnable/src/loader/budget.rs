//! Batches of variable-length samples under a token budget ([`BudgetPlan`]): planned from the
//! samples' lengths alone, before anything is loaded, the same on every rank, then dealt.
//!
//! Two kinds of plan ([`Budget`]):
//! - **token budget**: each batch holds whole samples up to `max_tokens`, counting the padding
//!   to the batch's longest sample or not — fairseq's `batch_by_size`;
//! - **packed rows**: samples are packed into rows of `row_tokens` by best fit, `rows` rows a
//!   batch — what varlen attention takes, flattened.
//!
//! An epoch's plan: the samples in the order of epoch `epoch` (shuffled from the seed, or
//! sequential), cut into windows of `sort_window`; each window sorted by length (longest first,
//! ties in the shuffled order) and filled into batches or rows; the batches of the epoch then
//! shuffled again (so long and short batches alternate). Zero-length samples are skipped. A
//! sample longer than the longest piece a batch can hold is an error naming its index, or is
//! cut into pieces of that length when [`split_long`](BudgetOptions::split_long) says so.
//!
//! **Equal steps.** Every epoch has exactly as many batches as epoch 0's plan
//! ([`BudgetPlan::len`]): an epoch whose plan makes more drops its last batches (their samples
//! wait for the next epoch's shuffle), one that makes fewer repeats its first ones. Rank `r` of
//! `world` takes batches `r, r + world, r + 2·world, …` of that list: `len / world` of them with
//! `drop_last`, else `⌈len / world⌉`, wrapping to the list's start — every rank the same number.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::sampler::{SplitMix64, permutation};
use crate::error::{Error, Result};
use crate::hash::Fingerprint;

/// What a batch may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Budget {
    /// Whole samples up to `max_tokens` a batch: their tokens, or with `count_padding` the
    /// batch's longest sample times the number of samples (what a padded `[B, T]` batch holds).
    Tokens {
        /// The budget.
        max_tokens: usize,
        /// Whether padding to the longest sample counts against the budget.
        count_padding: bool,
    },
    /// Samples packed into rows of `row_tokens` tokens (best fit over the sort window), `rows`
    /// rows a batch.
    Packed {
        /// Tokens a row holds.
        row_tokens: usize,
        /// Rows a batch.
        rows: usize,
    },
}

/// A part of a sample a batch holds: tokens `start .. start + len` of sample `sample` (the
/// whole sample unless it was split).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Piece {
    /// The sample's index in the dataset.
    pub sample: usize,
    /// The piece's first token in the sample.
    pub start: usize,
    /// Its tokens.
    pub len: usize,
}

/// The settings of a [`BudgetPlan`]; [`build`](Self::build) plans epoch 0 from the lengths.
///
/// # Examples
///
/// ```
/// use pinnable::loader::{Budget, BudgetPlan};
///
/// let lengths: Vec<u32> = vec![5, 3, 8, 2, 7, 1, 4];
/// let plan = BudgetPlan::options(Budget::Tokens { max_tokens: 10, count_padding: false })
///     .sort_window(4)
///     .shuffle(7)
///     .build(lengths.clone())?;
/// for batch in plan.batches(0) {
///     assert!(batch.iter().map(|p| p.len).sum::<usize>() <= 10);
/// }
/// // The same plan on every rank, dealt: each of 3 ranks gets the same number of batches.
/// let counts: Vec<usize> = (0..3).map(|r| plan.rank_batches(1, r, 3, false).len()).collect();
/// assert!(counts.iter().all(|&c| c == counts[0]));
/// # Ok::<(), pinnable::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BudgetOptions {
    budget: Budget,
    sort_window: usize,
    seed: Option<u64>,
    split_long: bool,
    max_pieces_per_row: Option<usize>,
}

impl BudgetOptions {
    /// Sorts windows of `n` samples of the shuffled order by length (default 1024; 1 keeps the
    /// shuffled order).
    pub fn sort_window(mut self, n: usize) -> Self {
        self.sort_window = n;
        self
    }

    /// Shuffles every epoch from `seed` and the epoch number (default: sequential order).
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Cuts a sample longer than a batch's longest piece into pieces of that length, each
    /// its own sequence, as pretraining does; without it (the default) such a sample is an
    /// error naming it.
    pub fn split_long(mut self, split: bool) -> Self {
        self.split_long = split;
        self
    }

    /// At most `n` pieces a row of a packed plan (none by default), which bounds the length
    /// of a fixed-shape batch's `cu_seqlens` to `rows · n + 1`.
    pub fn max_pieces_per_row(mut self, n: usize) -> Self {
        self.max_pieces_per_row = Some(n);
        self
    }

    /// The plan over samples of `lengths` tokens.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a budget, window or row count of 0, a budget over `i32::MAX`
    /// tokens (varlen offsets are int32), or lengths with no token; [`Error::Sample`] naming
    /// the first sample longer than a batch's longest piece, unless
    /// [`split_long`](Self::split_long).
    pub fn build(self, lengths: impl Into<Arc<[u32]>>) -> Result<BudgetPlan> {
        let lengths = lengths.into();
        let config = |setting: &'static str, problem: String| Error::Config { setting, problem };
        let (longest, total) = match self.budget {
            Budget::Tokens { max_tokens, .. } => (max_tokens, max_tokens),
            Budget::Packed { row_tokens, rows } => {
                if rows == 0 {
                    return Err(config("rows", "a packed batch needs at least 1 row".into()));
                }
                (row_tokens, row_tokens.saturating_mul(rows))
            }
        };
        if longest == 0 {
            return Err(config(
                "budget",
                "a budget of 0 tokens holds nothing".into(),
            ));
        }
        if total > i32::MAX as usize {
            return Err(config(
                "budget",
                format!(
                    "{total} tokens a batch; varlen offsets are int32: at most {}",
                    i32::MAX
                ),
            ));
        }
        if self.sort_window == 0 {
            return Err(config("sort_window", "must be at least 1".into()));
        }
        if self.max_pieces_per_row == Some(0) {
            return Err(config("max_pieces_per_row", "must be at least 1".into()));
        }
        if !self.split_long
            && let Some((i, &len)) = lengths
                .iter()
                .enumerate()
                .find(|&(_, &l)| l as usize > longest)
        {
            return Err(Error::Sample {
                index: i,
                during: "planning",
                source: Box::new(Error::Shape(format!(
                    "sample {i} has {len} tokens, more than the {longest} a batch's sequence \
                     may hold: raise the budget, or split long samples \
                     (BudgetOptions::split_long)"
                ))),
            });
        }
        let mut plan = BudgetPlan {
            lengths,
            options: self,
            longest,
            total,
            len: 0,
        };
        plan.len = plan.plan(0).len();
        if plan.len == 0 {
            return Err(config(
                "lengths",
                "no sample has a token: nothing to batch".into(),
            ));
        }
        Ok(plan)
    }
}

/// Batches of variable-length samples under a token budget, planned from their lengths alone,
/// before anything is loaded, the same on every rank, then dealt ([`BudgetOptions`] has an
/// example).
///
/// Two kinds of plan ([`Budget`]): a **token budget** (whole samples up to `max_tokens` a
/// batch, counting the padding to the batch's longest sample or not — fairseq's
/// `batch_by_size`) and **packed rows** (samples packed into rows of `row_tokens` by best fit,
/// `rows` rows a batch — what varlen attention takes, flattened).
///
/// An epoch's plan: the samples in the order of that epoch (shuffled from the seed, or
/// sequential), cut into windows of `sort_window`; each window sorted by length (longest first,
/// ties in the shuffled order) and filled into batches or rows; the batches then shuffled again
/// (so long and short batches alternate). Zero-length samples are skipped. A sample longer than
/// the longest piece a batch can hold is an error naming its index, or is cut into pieces of
/// that length when [`split_long`](BudgetOptions::split_long) says so.
///
/// **Equal steps.** Every epoch has exactly as many batches as epoch 0's plan
/// ([`len`](Self::len)): an epoch whose plan makes more drops its last batches (their samples
/// wait for the next epoch's shuffle), one that makes fewer repeats its first ones. Rank `r` of
/// `world` takes batches `r, r + world, r + 2·world, …` of that list: `len / world` of them with
/// `drop_last`, else `⌈len / world⌉`, wrapping to the list's start — every rank the same number.
#[derive(Clone, Debug)]
pub struct BudgetPlan {
    lengths: Arc<[u32]>,
    options: BudgetOptions,
    /// The longest piece a batch holds.
    longest: usize,
    /// The most tokens a batch holds.
    total: usize,
    /// Batches an epoch (every rank's together).
    len: usize,
}

impl BudgetPlan {
    /// Settings for `budget`: sort window 1024, sequential order, long samples refused.
    pub fn options(budget: Budget) -> BudgetOptions {
        BudgetOptions {
            budget,
            sort_window: 1024,
            seed: None,
            split_long: false,
            max_pieces_per_row: None,
        }
    }

    /// The settings.
    pub fn settings(&self) -> &BudgetOptions {
        &self.options
    }

    /// The budget.
    pub fn budget(&self) -> Budget {
        self.options.budget
    }

    /// The samples' lengths.
    pub fn lengths(&self) -> &Arc<[u32]> {
        &self.lengths
    }

    /// Batches every epoch, all ranks' together: epoch 0's count.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether an epoch has no batch (never: [`BudgetOptions::build`] refuses that).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The longest piece a batch holds: `max_tokens` or `row_tokens`.
    pub fn longest(&self) -> usize {
        self.longest
    }

    /// The most tokens a batch holds: `max_tokens`, or `rows · row_tokens`.
    pub fn max_tokens(&self) -> usize {
        self.total
    }

    /// The most pieces a batch holds: `rows · max_pieces_per_row` for a packed plan that sets
    /// it, else the most tokens (every piece has one).
    pub fn max_pieces(&self) -> usize {
        match (self.options.budget, self.options.max_pieces_per_row) {
            (Budget::Packed { rows, .. }, Some(n)) => rows.saturating_mul(n).min(self.total),
            _ => self.total,
        }
    }

    /// A digest of the settings and the lengths: positions carry it, so a run resumes only
    /// under the same plan. FNV-1a over the fields in a fixed layout, the same value in every
    /// release and on every machine, shifted right by 1 (below 2⁶³): the budget's kind (one
    /// byte, 0 for tokens, 1 for packed rows) and its numbers (`max_tokens` and
    /// `count_padding`, or `row_tokens` and `rows`), the sort window, the seed (a byte 0 for
    /// none, or 1 and the seed), `split_long`, `max_pieces_per_row` (as the seed), the number of
    /// lengths and each length (4 bytes); numbers little-endian, 8 bytes unless said, booleans
    /// one byte.
    pub fn digest(&self) -> u64 {
        let o = &self.options;
        let mut h = Fingerprint::new();
        match o.budget {
            Budget::Tokens {
                max_tokens,
                count_padding,
            } => h.u8(0).usize(max_tokens).bool(count_padding),
            Budget::Packed { row_tokens, rows } => h.u8(1).usize(row_tokens).usize(rows),
        };
        h.usize(o.sort_window)
            .opt_u64(o.seed)
            .bool(o.split_long)
            .opt_u64(o.max_pieces_per_row.map(|n| n as u64))
            .usize(self.lengths.len());
        for &len in self.lengths.iter() {
            h.u32(len);
        }
        h.finish63()
    }

    /// The batches of epoch `epoch`, all ranks' together: exactly [`len`](Self::len).
    pub fn batches(&self, epoch: u64) -> Vec<Vec<Piece>> {
        let mut batches = self.plan(epoch);
        let made = batches.len();
        if made >= self.len {
            batches.truncate(self.len);
        } else if made > 0 {
            for i in 0..self.len - made {
                let again = batches[i % made].clone();
                batches.push(again);
            }
        }
        batches
    }

    /// Which of an epoch's batches rank `rank` of `world` takes, in order: `r, r + world, …`
    /// (see [`BudgetPlan`] for the tail).
    pub fn rank_slots(&self, rank: usize, world: usize, drop_last: bool) -> Vec<usize> {
        let world = world.max(1);
        let per = if drop_last {
            self.len / world
        } else {
            self.len.div_ceil(world)
        };
        (0..per)
            .map(|j| (rank + j * world) % self.len.max(1))
            .collect()
    }

    /// Rank `rank` of `world`'s batches of epoch `epoch`, in order.
    pub fn rank_batches(
        &self,
        epoch: u64,
        rank: usize,
        world: usize,
        drop_last: bool,
    ) -> Vec<Vec<Piece>> {
        let all = self.batches(epoch);
        self.rank_slots(rank, world, drop_last)
            .into_iter()
            .map(|s| all[s].clone())
            .collect()
    }

    /// The epoch's plan before it is made [`len`](Self::len) long.
    fn plan(&self, epoch: u64) -> Vec<Vec<Piece>> {
        let n = self.lengths.len();
        let order = match self.options.seed {
            Some(seed) => permutation(n, seed, epoch),
            None => (0..n).collect(),
        };
        let mut pieces = Vec::with_capacity(n);
        for i in order {
            let len = self.lengths[i] as usize;
            let mut start = 0;
            while start < len {
                let take = (len - start).min(self.longest);
                pieces.push(Piece {
                    sample: i,
                    start,
                    len: take,
                });
                start += take;
            }
        }
        let mut fill = Fill::default();
        let mut rows = Rows::default();
        for window in pieces.chunks_mut(self.options.sort_window) {
            window.sort_by_key(|p| std::cmp::Reverse(p.len));
            match self.options.budget {
                Budget::Tokens {
                    max_tokens,
                    count_padding,
                } => fill.add(window, max_tokens, count_padding),
                Budget::Packed { row_tokens, .. } => {
                    let limit = self.options.max_pieces_per_row.unwrap_or(usize::MAX);
                    rows.best_fit(window, row_tokens, limit)
                }
            }
        }
        fill.close();
        let mut batches = match self.options.budget {
            Budget::Packed { rows: per, .. } => rows.rows.chunks(per).map(|r| r.concat()).collect(),
            Budget::Tokens { .. } => fill.batches,
        };
        if let Some(seed) = self.options.seed {
            let mut rng = SplitMix64::for_epoch(seed ^ 0x5851_F42D_4C95_7F2D, epoch);
            for i in (1..batches.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                batches.swap(i, j);
            }
        }
        batches
    }
}

/// Batches being filled under a token budget: those closed, and the open one, which stays
/// open across windows.
#[derive(Default)]
struct Fill {
    batches: Vec<Vec<Piece>>,
    open: Vec<Piece>,
    sum: usize,
    longest: usize,
}

impl Fill {
    /// Adds `window`'s pieces (longest first) in order, closing the open batch when the next
    /// piece would take it over `max_tokens`.
    fn add(&mut self, window: &[Piece], max_tokens: usize, count_padding: bool) {
        for &p in window {
            let longest = self.longest.max(p.len);
            let cost = if count_padding {
                longest * (self.open.len() + 1)
            } else {
                self.sum + p.len
            };
            if cost > max_tokens && !self.open.is_empty() {
                self.close();
            }
            self.sum += p.len;
            self.longest = self.longest.max(p.len);
            self.open.push(p);
        }
    }

    fn close(&mut self) {
        if !self.open.is_empty() {
            self.batches.push(std::mem::take(&mut self.open));
        }
        self.sum = 0;
        self.longest = 0;
    }
}

/// Rows being packed: every row of the epoch so far, and those that can take more.
#[derive(Default)]
struct Rows {
    rows: Vec<Vec<Piece>>,
    room: Vec<usize>,
    /// (room left, row index) of the rows that can take more.
    open: BTreeSet<(usize, usize)>,
}

impl Rows {
    /// Packs `window` (longest first) into rows of `row_tokens` by best fit: each piece into
    /// the open row it leaves least room in (the first such row on ties), or a new row. Rows
    /// stay open across windows, so a short piece of a later window fills an earlier row's
    /// end; a row holds at most `limit` pieces.
    fn best_fit(&mut self, window: &[Piece], row_tokens: usize, limit: usize) {
        for &p in window {
            let fit = self.open.range((p.len, 0)..).next().copied();
            let row = match fit {
                Some(key) => {
                    self.open.remove(&key);
                    key.1
                }
                None => {
                    self.rows.push(Vec::new());
                    self.room.push(row_tokens);
                    self.rows.len() - 1
                }
            };
            self.rows[row].push(p);
            self.room[row] -= p.len;
            if self.room[row] > 0 && self.rows[row].len() < limit {
                self.open.insert((self.room[row], row));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random_lengths(r: &mut SplitMix64, n: usize, max: u64) -> Vec<u32> {
        (0..n).map(|_| r.below(max) as u32).collect()
    }

    /// Every piece of every sample lands in exactly one batch of an epoch's plan, within
    /// budget, for both kinds.
    #[test]
    fn plan_covers_every_token_once_within_budget() {
        let mut r = SplitMix64::for_test("plan_covers_every_token_once_within_budget");
        for _ in 0..20 {
            let n = 1 + r.below(300) as usize;
            let lengths = random_lengths(&mut r, n, 200);
            let budgets = [
                Budget::Tokens {
                    max_tokens: 200 + r.below(300) as usize,
                    count_padding: r.below(2) == 1,
                },
                Budget::Packed {
                    row_tokens: 200,
                    rows: 1 + r.below(4) as usize,
                },
            ];
            for budget in budgets {
                if lengths.iter().all(|&l| l == 0) {
                    continue;
                }
                let plan = BudgetPlan::options(budget)
                    .sort_window(1 + r.below(64) as usize)
                    .shuffle(r.next_u64())
                    .build(lengths.clone())
                    .unwrap();
                let epoch = r.below(5);
                let raw = plan.plan(epoch);
                let mut seen = vec![0usize; lengths.len()];
                for b in &raw {
                    let tokens: usize = b.iter().map(|p| p.len).sum();
                    assert!(tokens <= plan.max_tokens(), "{budget:?}: {tokens}");
                    if let Budget::Tokens {
                        max_tokens,
                        count_padding: true,
                    } = budget
                    {
                        let longest = b.iter().map(|p| p.len).max().unwrap();
                        assert!(longest * b.len() <= max_tokens);
                    }
                    for p in b {
                        seen[p.sample] += p.len;
                    }
                }
                let want: Vec<usize> = lengths.iter().map(|&l| l as usize).collect();
                assert_eq!(seen, want);
                assert_eq!(plan.batches(epoch).len(), plan.len());
            }
        }
    }
}
