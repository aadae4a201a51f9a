//! Which samples each batch of an epoch holds: the order (shuffled from a seed and the epoch
//! number, or sequential), this rank's shard of it, and the cut into batches.
//!
//! The order depends on the seed, the epoch, the dataset's length and the shard, and on nothing
//! else: not the machine, the number of worker threads or their timing. The shuffle is our own
//! [`SplitMix64`] generator driving a Fisher–Yates shuffle, so it is the same everywhere and in
//! every version of this crate that keeps the tests of this module passing.

use super::plan::{Plan, PlanRequest};
use super::position::Position;
use crate::error::{Error, Result};

/// The SplitMix64 generator (Steele, Lea and Flood): 64 bits of state, one add and a mix per
/// number. Small, fast and well distributed; not cryptographic.
///
/// # Examples
///
/// ```
/// use pinnable::loader::SplitMix64;
///
/// let mut a = SplitMix64::new(7);
/// let mut b = SplitMix64::new(7);
/// assert_eq!(a.next_u64(), b.next_u64());
/// assert!(a.below(10) < 10);
/// ```
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// For tests: a generator seeded from `PINNABLE_TEST_SEED` or the clock; the seed is
    /// printed, named after `test`, with the line that reruns it.
    #[cfg(test)]
    pub(crate) fn for_test(test: &str) -> Self {
        SplitMix64::new(crate::test_seed::seed(test))
    }

    /// The generator for epoch `epoch` of a run seeded with `seed`: distinct epochs (and
    /// distinct seeds) give unrelated streams.
    pub fn for_epoch(seed: u64, epoch: u64) -> Self {
        let mut s = SplitMix64::new(seed);
        let a = s.next_u64();
        let mut e = SplitMix64::new(epoch ^ 0x6A09_E667_F3BC_C909);
        SplitMix64::new(a ^ e.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform number in `0..n` (0 when `n` is 0), without bias (Lemire's multiply-and-reject).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }
}

/// `0..len` in the order of epoch `epoch` of a run seeded with `seed` (Fisher–Yates).
///
/// # Examples
///
/// ```
/// use pinnable::loader::permutation;
///
/// let p = permutation(10, 42, 0);
/// assert_eq!(p, permutation(10, 42, 0)); // the same seed and epoch: the same order
/// assert_ne!(p, permutation(10, 42, 1));
/// let mut sorted = p.clone();
/// sorted.sort();
/// assert_eq!(sorted, (0..10).collect::<Vec<_>>());
/// ```
pub fn permutation(len: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..len).collect();
    let mut rng = SplitMix64::for_epoch(seed, epoch);
    for i in (1..len).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// The order of an epoch and its cut into batches, for one rank of a data-parallel run.
///
/// **Sharding**, as PyTorch's `DistributedSampler` does it: the epoch's order (shuffled or
/// not) is made a multiple of `world` long — without `drop_last` by repeating indices from its
/// start (so a few samples appear twice in the epoch), with `drop_last` by dropping its tail —
/// and rank `r` takes every `world`-th index starting at `r`. Every rank thus gets a disjoint
/// (but for the repeats), equally long part, which keeps collective operations in step.
///
/// **Batches** are consecutive runs of `batch_size` indices of the rank's part; the last one
/// is shorter unless `drop_last` drops it.
///
/// # Examples
///
/// ```
/// use pinnable::loader::Sampler;
///
/// let s = Sampler::new(10, 4)?.shard(1, 3)?; // rank 1 of 3
/// assert_eq!(s.indices(0), vec![1, 4, 7, 0]); // 10 padded to 12 with index 0 and 1
/// assert_eq!(s.batches(0), vec![vec![1, 4, 7, 0]]);
/// let s = s.drop_last(true);
/// assert_eq!(s.indices(0), vec![1, 4, 7]); // 10 cut to 9
/// assert_eq!(s.len(), 0); // and the short batch dropped
/// # Ok::<(), pinnable::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sampler {
    len: usize,
    batch_size: usize,
    seed: Option<u64>,
    drop_last: bool,
    rank: usize,
    world: usize,
    /// The fingerprint of the dataset's plans, when it plans its epochs: its name and value.
    plan: Option<(&'static str, u64)>,
}

impl Sampler {
    /// Sequential order over `len` samples in batches of `batch_size`, one rank, keeping the
    /// short last batch.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if `batch_size` is 0.
    pub fn new(len: usize, batch_size: usize) -> Result<Self> {
        if batch_size == 0 {
            return Err(Error::Config {
                setting: "batch_size",
                problem: "must be at least 1".into(),
            });
        }
        Ok(Sampler {
            len,
            batch_size,
            seed: None,
            drop_last: false,
            rank: 0,
            world: 1,
            plan: None,
        })
    }

    /// Shuffles every epoch from `seed` and the epoch number.
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Drops the short last batch, and the tail that makes the epoch uneven across ranks.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Takes rank `rank`'s part of a `world`-rank run (see the type's docs).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if `world` is 0 or `rank` is not below it.
    pub fn shard(mut self, rank: usize, world: usize) -> Result<Self> {
        if world == 0 || rank >= world {
            return Err(Error::Config {
                setting: "shard",
                problem: format!(
                    "rank {rank} of a world of {world}: the rank must be below the world size, \
                     which must be at least 1"
                ),
            });
        }
        self.rank = rank;
        self.world = world;
        Ok(self)
    }

    /// The samples per batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// The shuffle seed, if the order is shuffled.
    pub fn seed(&self) -> Option<u64> {
        self.seed
    }

    /// This rank and the world size.
    pub fn rank_and_world(&self) -> (usize, usize) {
        (self.rank, self.world)
    }

    /// How many samples this rank gets per epoch.
    pub fn samples_per_rank(&self) -> usize {
        if self.drop_last || self.len == 0 {
            self.len / self.world
        } else {
            self.len.div_ceil(self.world)
        }
    }

    /// How many batches this rank gets per epoch.
    pub fn len(&self) -> usize {
        let n = self.samples_per_rank();
        if self.drop_last {
            n / self.batch_size
        } else {
            n.div_ceil(self.batch_size)
        }
    }

    /// Whether an epoch has no batch.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// This rank's indices of epoch `epoch`, in order.
    pub fn indices(&self, epoch: u64) -> Vec<usize> {
        let order = match self.seed {
            Some(seed) => permutation(self.len, seed, epoch),
            None => (0..self.len).collect(),
        };
        let total = self.samples_per_rank() * self.world;
        // Pad by cycling from the start (never more than `world - 1` extra), or cut the tail.
        let padded = order.iter().copied().cycle().take(total);
        padded.skip(self.rank).step_by(self.world).collect()
    }

    /// This rank's batches of epoch `epoch`, in order: lists of dataset indices.
    pub fn batches(&self, epoch: u64) -> Vec<Vec<usize>> {
        self.batches_from(epoch, 0).collect()
    }

    /// This rank's batches of epoch `epoch` from batch `first` on (none when `first` is
    /// [`len`](Self::len) or more), made one at a time as they are taken. Starting late costs
    /// what starting at batch 0 costs: the epoch's order is computed (`O(len)`), and the
    /// batches before `first` are never made.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::loader::Sampler;
    ///
    /// let s = Sampler::new(10, 3)?.shuffle(5);
    /// let all = s.batches(2);
    /// assert_eq!(s.batches_from(2, 1).collect::<Vec<_>>(), all[1..].to_vec());
    /// assert_eq!(s.batches_from(2, 4).len(), 0);
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn batches_from(&self, epoch: u64, first: usize) -> Batches {
        let n = self.len();
        Batches {
            indices: if first < n {
                self.indices(epoch)
            } else {
                Vec::new()
            },
            cut: Cut::Every(self.batch_size),
            next: first.min(n),
            end: n,
        }
    }

    /// Records the fingerprint of a dataset that plans its own epochs ([`Plan::fingerprint`]):
    /// positions carry it.
    pub(crate) fn fingerprinted(mut self, plan: Option<(&'static str, u64)>) -> Self {
        self.plan = plan;
        self
    }

    /// The fingerprint of the dataset's plans, its name and value, when it plans its epochs.
    pub fn fingerprint(&self) -> Option<(&'static str, u64)> {
        self.plan
    }

    /// Whether the short last batch is dropped.
    pub fn drops_last(&self) -> bool {
        self.drop_last
    }

    /// What this sampler asks a dataset that plans its epochs ([`Dataset::plan`](super::Dataset::plan))
    /// for epoch `epoch`.
    pub fn request(&self, epoch: u64) -> PlanRequest {
        let r = PlanRequest::new(epoch)
            .shard(self.rank, self.world)
            .batch_size(self.batch_size)
            .drop_last(self.drop_last);
        match self.seed {
            Some(seed) => r.shuffle(seed),
            None => r,
        }
    }

    /// The batches of a planned epoch from batch `first` on: the source's own cut, or (for a
    /// plan of indices alone) at most [`samples_per_rank`](Self::samples_per_rank) of its
    /// indices cut every `batch_size`.
    pub fn batches_of(&self, plan: Plan, first: usize) -> Batches {
        let (mut indices, ends) = plan.into_parts();
        let (cut, n) = match ends {
            Some(ends) => {
                let n = ends.len();
                (Cut::Ends(ends), n)
            }
            None => {
                indices.truncate(self.samples_per_rank());
                (Cut::Every(self.batch_size), self.planned_len(indices.len()))
            }
        };
        Batches {
            indices,
            cut,
            next: first.min(n),
            end: n,
        }
    }

    /// The batches a plan of `indices` indices alone gives.
    fn planned_len(&self, indices: usize) -> usize {
        let indices = indices.min(self.samples_per_rank());
        if self.drop_last {
            indices / self.batch_size
        } else {
            indices.div_ceil(self.batch_size)
        }
    }

    /// The number of batches of a planned epoch.
    pub(crate) fn plan_len(&self, plan: &Plan) -> usize {
        if plan.is_cut() {
            plan.batch_count(self.batch_size)
        } else {
            self.planned_len(plan.indices().len())
        }
    }

    /// The position at batch `batch` of epoch `epoch` under this sampler's settings.
    pub(crate) fn position_at(&self, epoch: u64, batch: u64) -> Position {
        Position::new(
            (epoch, batch),
            self.seed,
            (self.rank, self.world),
            Some(self.len),
            self.batch_size,
            self.drop_last,
        )
        .with_plan(self.plan.map(|(_, v)| v))
    }
}

/// The batches of an epoch, from [`Sampler::batches_from`]: lists of dataset indices, made as
/// they are taken.
#[derive(Clone, Debug)]
pub struct Batches {
    indices: Vec<usize>,
    cut: Cut,
    next: usize,
    end: usize,
}

/// Where a [`Batches`]' batches end.
#[derive(Clone, Debug)]
enum Cut {
    /// Every this many indices.
    Every(usize),
    /// At these offsets (a source's own cut).
    Ends(Vec<usize>),
}

impl Iterator for Batches {
    type Item = Vec<usize>;

    fn next(&mut self) -> Option<Vec<usize>> {
        if self.next >= self.end {
            return None;
        }
        let (start, stop) = match &self.cut {
            Cut::Every(size) => {
                let start = self.next * size;
                (start, (start + size).min(self.indices.len()))
            }
            Cut::Ends(ends) => (
                self.next.checked_sub(1).map_or(0, |p| ends[p]),
                ends[self.next],
            ),
        };
        self.next += 1;
        Some(self.indices[start..stop].to_vec())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.end - self.next;
        (n, Some(n))
    }
}

impl ExactSizeIterator for Batches {}
