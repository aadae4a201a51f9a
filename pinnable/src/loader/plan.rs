//! What an epoch is: [`Plan`], the one hook by which a source orders its own epochs
//! ([`Dataset::plan`](super::Dataset::plan)), and [`PlanRequest`], what the loader asks for.
//!
//! A dataset that does not plan leaves the order to the [`Sampler`](super::Sampler) (shuffled
//! from the seed and the epoch, dealt to the ranks, cut every `batch_size` samples). One that
//! does — tar shards read in sequence, packed documents, batches under a token budget, a
//! mixture with counts per batch — returns its indices and, where it cuts them itself, its
//! batches, plus the fingerprint that positions carry. Planning is a pure function of the
//! request and the source's settings: it starts nothing (reading ahead is
//! [`Dataset::prefetch`](super::Dataset::prefetch)'s job, which the loader calls when an epoch
//! runs), so a plan can be made to count an epoch's batches or to check a position.

/// What a loader asks a source to plan: rank `rank`'s part of epoch `epoch` of a `world`-rank
/// run, under the loader's settings.
///
/// # Examples
///
/// ```
/// use pinnable::loader::PlanRequest;
///
/// let r = PlanRequest::new(3).shuffle(42).shard(1, 4).batch_size(8);
/// assert_eq!((r.epoch, r.seed, r.rank, r.world, r.batch_size, r.drop_last), (3, Some(42), 1, 4, 8, false));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct PlanRequest {
    /// The epoch.
    pub epoch: u64,
    /// The loader's shuffle seed, if it shuffles.
    pub seed: Option<u64>,
    /// This rank.
    pub rank: usize,
    /// The number of ranks.
    pub world: usize,
    /// The loader's batch size (for a source that cuts its own batches: the size the user set,
    /// or 1).
    pub batch_size: usize,
    /// Whether the short last batch, and the tail that makes ranks uneven, are dropped.
    pub drop_last: bool,
}

impl PlanRequest {
    /// Epoch `epoch`, not shuffled, one rank of one, batches of 1, keeping the short batch.
    pub fn new(epoch: u64) -> Self {
        PlanRequest {
            epoch,
            seed: None,
            rank: 0,
            world: 1,
            batch_size: 1,
            drop_last: false,
        }
    }

    /// Shuffled from `seed`.
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Rank `rank` of `world`.
    pub fn shard(mut self, rank: usize, world: usize) -> Self {
        self.rank = rank;
        self.world = world;
        self
    }

    /// Batches of `batch_size`.
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// Dropping the short last batch.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// The same request for another epoch.
    pub fn at_epoch(mut self, epoch: u64) -> Self {
        self.epoch = epoch;
        self
    }
}

/// One rank's epoch, as a source plans it: the dataset indices in delivery order, where the
/// source cuts batches itself, those batches, and the fingerprint a position carries.
///
/// - [`Plan::order`]: the loader cuts the indices every `batch_size` (taking at most as many
///   as the sampler deals a rank, so every rank gets the same number of batches).
/// - [`Plan::batches`]: the source cuts; the loader's `batch_size` is not used (setting one
///   that differs from the plan's batches is refused at `build`).
///
/// The fingerprint ([`with_fingerprint`](Plan::with_fingerprint)) names the source's own
/// setting that its plans depend on beyond the loader's (a shuffle buffer, a packing plan, a
/// mixture's weights) and its value; a position saved under another value is refused, naming
/// it. Compute it the same way in every build — a hash fixed by you (such as FNV-1a over
/// fixed-width little-endian fields), never the standard library's default hasher, which Rust may change
/// between releases — so positions resume after a toolchain upgrade.
///
/// # Examples
///
/// ```
/// use pinnable::loader::Plan;
///
/// let cut = Plan::batches([vec![4, 1], vec![0, 2, 3]]).with_fingerprint("my setting", 7);
/// assert_eq!(cut.indices(), &[4, 1, 0, 2, 3]);
/// assert_eq!(cut.batch_count(2), 2); // the source's cut; the batch size is not used
/// assert_eq!(cut.fingerprint(), Some(("my setting", 7)));
/// assert_eq!(Plan::order(vec![2, 0, 1]).batch_count(2), 2);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    indices: Vec<usize>,
    /// Where each batch ends in `indices`, when the source cuts them.
    ends: Option<Vec<usize>>,
    fingerprint: Option<(&'static str, u64)>,
}

impl Plan {
    /// The indices in delivery order; the loader cuts them into batches.
    pub fn order(indices: Vec<usize>) -> Self {
        Plan {
            indices,
            ends: None,
            fingerprint: None,
        }
    }

    /// Batches the source cut, in delivery order (an empty batch is skipped).
    pub fn batches<I: IntoIterator<Item = Vec<usize>>>(batches: I) -> Self {
        let mut indices = Vec::new();
        let mut ends = Vec::new();
        for b in batches {
            if !b.is_empty() {
                indices.extend(b);
                ends.push(indices.len());
            }
        }
        Plan {
            indices,
            ends: Some(ends),
            fingerprint: None,
        }
    }

    /// The plan, carrying the setting `name` = `value` that positions check.
    pub fn with_fingerprint(mut self, name: &'static str, value: u64) -> Self {
        self.fingerprint = Some((name, value));
        self
    }

    /// The indices, in delivery order.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }

    /// Whether the source cut the batches.
    pub fn is_cut(&self) -> bool {
        self.ends.is_some()
    }

    /// The fingerprint, its name and value.
    pub fn fingerprint(&self) -> Option<(&'static str, u64)> {
        self.fingerprint
    }

    /// The number of batches, cutting every `batch_size` where the source did not cut (the
    /// short last batch counted).
    pub fn batch_count(&self, batch_size: usize) -> usize {
        match &self.ends {
            Some(ends) => ends.len(),
            None => self.indices.len().div_ceil(batch_size.max(1)),
        }
    }

    /// The batches' lengths, where the source cut them.
    pub(crate) fn cut_lengths(&self) -> Option<impl Iterator<Item = usize> + '_> {
        let ends = self.ends.as_ref()?;
        Some(
            std::iter::once(0)
                .chain(ends.iter().copied())
                .zip(ends.iter().copied())
                .map(|(a, b)| b - a),
        )
    }

    /// The parts: indices and the batch ends, where cut.
    pub(crate) fn into_parts(self) -> (Vec<usize>, Option<Vec<usize>>) {
        (self.indices, self.ends)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_plan_keeps_its_batches_and_skips_empty_ones() {
        let p = Plan::batches([vec![3], vec![], vec![0, 1, 2]]);
        assert_eq!(p.indices(), &[3, 0, 1, 2]);
        assert_eq!(p.cut_lengths().unwrap().collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(p.batch_count(100), 2);
        assert!(Plan::order(vec![1, 2]).cut_lengths().is_none());
        assert_eq!(Plan::order(vec![0; 5]).batch_count(2), 3);
        assert_eq!(Plan::order(Vec::new()).batch_count(0), 0);
    }
}
