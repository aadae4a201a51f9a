//! The one plan hook and the one loader: a source of the user's own that cuts its batches,
//! planning that starts nothing, resume inside a planned epoch, and a stream read by the same
//! loader (its length unknown, split per device as a dataset is).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use pinnable::loader::{Collator, Dataset, IterSource, Loader, Plan, PlanRequest};
use pinnable::{Device, Error};
use pinnable_harness::rng;
use rand::Rng;
use rand::SeedableRng;
use rand::rngs::SmallRng;

/// Samples `0..len`, planned into batches of random sizes drawn from the seed and the epoch,
/// this rank's every `world`-th batch; counts its plans and prefetches.
struct Buckets {
    len: usize,
    plans: AtomicUsize,
    prefetches: AtomicUsize,
}

impl Buckets {
    /// Every batch of epoch `epoch` (all ranks'), the same for any rank.
    fn cut(&self, epoch: u64, seed: u64) -> Vec<Vec<usize>> {
        let mut r = SmallRng::seed_from_u64(seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut order: Vec<usize> = (0..self.len).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, r.random_range(0..=i));
        }
        let mut out = Vec::new();
        let mut at = 0;
        while at < order.len() {
            let n = r.random_range(1..=7).min(order.len() - at);
            out.push(order[at..at + n].to_vec());
            at += n;
        }
        out
    }
}

impl Dataset for Buckets {
    type Sample = usize;

    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> pinnable::Result<usize> {
        Ok(index)
    }

    fn plan(&self, r: &PlanRequest) -> Option<Plan> {
        self.plans.fetch_add(1, Ordering::Relaxed);
        let all = self.cut(r.epoch, r.seed.unwrap_or(0));
        // Every rank as many batches: the count cut to a multiple of the world.
        let n = all.len() / r.world * r.world;
        let mine = all.into_iter().take(n).skip(r.rank).step_by(r.world);
        Some(Plan::batches(mine).with_fingerprint("buckets", self.len as u64))
    }

    fn prefetch(&self, _r: &PlanRequest, _plan: &Plan) {
        self.prefetches.fetch_add(1, Ordering::Relaxed);
    }
}

fn ids(samples: Vec<usize>, _c: &mut Collator) -> pinnable::Result<Vec<usize>> {
    Ok(samples)
}

type Ids = fn(Vec<usize>, &mut Collator) -> pinnable::Result<Vec<usize>>;

fn buckets(len: usize) -> Arc<Buckets> {
    Arc::new(Buckets {
        len,
        plans: AtomicUsize::new(0),
        prefetches: AtomicUsize::new(0),
    })
}

#[test]
fn a_source_that_cuts_its_batches_gets_them_whole_on_every_rank_and_resumes_inside_them() {
    let mut r = rng("a_source_that_cuts_its_batches");
    let len = r.random_range(50..400);
    let seed: u64 = r.random();
    let world = r.random_range(1..4);
    let source = buckets(len);
    let all = source.cut(3, seed);
    for rank in 0..world {
        let loader = Loader::builder(source.clone())
            .shuffle(seed)
            .shard(rank, world)
            .workers(r.random_range(1..4))
            .build(ids as Ids)
            .unwrap();
        loader.set_epoch(3);
        let want: Vec<Vec<usize>> = all
            .iter()
            .take(all.len() / world * world)
            .skip(rank)
            .step_by(world)
            .cloned()
            .collect();
        // Counting the batches plans the epoch and starts nothing; running it reuses that plan.
        let (plans, prefetches) = (
            source.plans.load(Ordering::Relaxed),
            source.prefetches.load(Ordering::Relaxed),
        );
        assert_eq!(loader.len(), want.len());
        assert_eq!(source.prefetches.load(Ordering::Relaxed), prefetches);
        let epoch = loader.iter();
        assert_eq!(epoch.remaining(), Some(want.len()));
        let got: Vec<Vec<usize>> = epoch.map(|b| b.unwrap()).collect();
        assert_eq!(got, want, "rank {rank} of {world}");
        assert_eq!(source.plans.load(Ordering::Relaxed), plans + 1);
        assert_eq!(source.prefetches.load(Ordering::Relaxed), prefetches + 1);

        // Stopped after k batches and resumed with other workers: the rest, whole.
        let k = r.random_range(0..=want.len());
        let mut epoch = loader.run_epoch(3);
        for _ in 0..k {
            epoch.next().unwrap().unwrap();
        }
        let position = epoch.position();
        drop(epoch);
        let resumed = Loader::builder(source.clone())
            .shuffle(seed)
            .shard(rank, world)
            .workers(r.random_range(1..4))
            .resume(position)
            .build(ids as Ids)
            .unwrap();
        let rest: Vec<Vec<usize>> = resumed.iter().map(|b| b.unwrap()).collect();
        if k < want.len() {
            assert_eq!(rest, want[k..].to_vec(), "rank {rank}: resumed after {k}");
        } else {
            // After the last batch the position is the next epoch's start.
            let next = source.cut(4, seed);
            let next: Vec<Vec<usize>> = next
                .iter()
                .take(next.len() / world * world)
                .skip(rank)
                .step_by(world)
                .cloned()
                .collect();
            assert_eq!(rest, next, "rank {rank}: resumed after the whole epoch");
        }
    }
    // A batch size set by hand for a source that cuts batches of several sizes is refused.
    let e = Loader::builder(source.clone())
        .batch_size(4)
        .build(ids as Ids)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Config {
                setting: "batch_size",
                ..
            }
        ),
        "{e}"
    );
    // A position saved over another source's plans is refused, naming the fingerprint.
    let other = buckets(len + 1);
    let position = Loader::builder(source.clone())
        .build(ids as Ids)
        .unwrap()
        .position();
    let e = Loader::builder(other)
        .resume(position)
        .build(ids as Ids)
        .unwrap_err();
    assert!(e.to_string().contains("buckets"), "{e}");
}

#[test]
fn a_stream_is_read_by_the_same_loader_and_split_per_device() {
    let mut r = rng("a_stream_is_read_by_the_same_loader");
    let n: u64 = r.random_range(20..300);
    let batch = r.random_range(1..9);
    let stream = move || IterSource::new(move |epoch| (0..n).map(move |i| Ok(i * 1000 + epoch)));
    let loader = Loader::builder(stream())
        .batch_size(batch)
        .workers(2)
        .build_with(|items: Vec<u64>, _c| Ok(items))
        .unwrap();
    let epoch = loader.run_epoch(5);
    assert_eq!(epoch.remaining(), None, "a stream's length is not known");
    assert_eq!(epoch.size_hint(), (0, None));
    let got: Vec<u64> = epoch.flat_map(|b| b.unwrap()).collect();
    assert_eq!(got, (0..n).map(|i| i * 1000 + 5).collect::<Vec<_>>());
    // Two devices (the host twice here): each loader every other item, together every item once.
    let devices = [Device::cpu(), Device::cpu()];
    let loaders = Loader::builder(stream())
        .batch_size(batch)
        .workers(1)
        .build_per_device(&devices, |items: Vec<u64>, _c: &mut Collator| Ok(items))
        .unwrap();
    let mut parts: Vec<Vec<u64>> = loaders
        .iter()
        .map(|l| l.run_epoch(0).flat_map(|b| b.unwrap()).collect())
        .collect();
    assert!(parts[0].iter().all(|i| (i / 1000) % 2 == 0));
    assert!(parts[1].iter().all(|i| (i / 1000) % 2 == 1));
    let mut all: Vec<u64> = parts.concat();
    all.sort_unstable();
    assert_eq!(all, (0..n).map(|i| i * 1000).collect::<Vec<_>>());
    parts.clear();
    // What a stream cannot do is refused at build, naming the setting.
    let e = Loader::builder(stream())
        .shuffle(1)
        .build_with(|items: Vec<u64>, _c| Ok(items))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Config {
                setting: "shuffle",
                ..
            }
        ),
        "{e}"
    );
}
