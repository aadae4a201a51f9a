//! The loader's host-side logic over the heap test-double pool: no OS or driver call, so these
//! run under Miri (`scripts/miri.sh`), which checks the threads, channels and unsafe code for
//! data races and undefined behaviour. Sizes shrink under Miri.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::alloc::{PinnedPool, PoolConfig};
use crate::{DType, Device, Error, Tensor};

/// Samples per test dataset: Miri runs the interpreter, so keep it small there.
const N: usize = if cfg!(miri) { 13 } else { 101 };

fn pool() -> PinnedPool {
    PinnedPool::heap(PoolConfig::default())
}

/// Sample `i` is a 2×3 f32 tensor of `i` and the label `i`.
fn dataset(n: usize) -> Vec<(Tensor, i64)> {
    (0..n)
        .map(|i| {
            let t = Tensor::from_vec(vec![i as f32; 6], &[2, 3]).unwrap();
            (t, i as i64)
        })
        .collect()
}

/// Every batch of one epoch as (labels, images) vectors.
fn collect(epoch: Epoch<(Tensor, Tensor)>) -> Vec<(Vec<i64>, Vec<f32>)> {
    epoch
        .map(|b| {
            let (x, y) = b.unwrap();
            (y.to_vec::<i64>().unwrap(), x.to_vec::<f32>().unwrap())
        })
        .collect()
}

#[test]
fn splitmix64_matches_the_reference_stream() {
    let mut r = SplitMix64::new(0);
    assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
    assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
    assert_eq!(r.next_u64(), 0x06c4_5d18_8009_454f);
}

#[test]
fn permutations_are_pinned_for_every_machine() {
    // Computed by an independent implementation of the same generator and shuffle: a change
    // here changes every user's epochs.
    assert_eq!(permutation(10, 42, 0), [6, 8, 7, 0, 9, 5, 3, 2, 4, 1]);
    assert_eq!(permutation(10, 42, 1), [8, 0, 1, 6, 2, 3, 7, 4, 5, 9]);
    assert_eq!(permutation(10, 7, 0), [5, 1, 6, 7, 2, 4, 8, 0, 3, 9]);
    assert!(permutation(0, 1, 1).is_empty());
}

#[test]
fn below_stays_in_range_and_reaches_every_value() {
    let mut r = SplitMix64::for_test("below_stays_in_range");
    let mut seen = [false; 7];
    for _ in 0..200 {
        let v = r.below(7) as usize;
        seen[v] = true;
    }
    assert!(seen.iter().all(|&s| s));
    assert_eq!(r.below(0), 0);
    assert_eq!(r.below(1), 0);
}

#[test]
fn shards_are_disjoint_equal_and_cover_the_epoch() {
    for (len, world, drop_last) in [(10, 3, false), (10, 3, true), (12, 4, false), (5, 8, false)] {
        let parts: Vec<Vec<usize>> = (0..world)
            .map(|r| {
                Sampler::new(len, 2)
                    .unwrap()
                    .shuffle(5)
                    .drop_last(drop_last)
                    .shard(r, world)
                    .unwrap()
                    .indices(3)
            })
            .collect();
        let per = parts[0].len();
        assert!(parts.iter().all(|p| p.len() == per), "{parts:?}");
        let mut all: Vec<usize> = parts.concat();
        if drop_last {
            assert_eq!(all.len(), len / world * world);
            all.sort_unstable();
            all.dedup();
            assert_eq!(all.len(), len / world * world, "disjoint");
        } else {
            assert_eq!(all.len(), len.div_ceil(world) * world);
            all.sort_unstable();
            all.dedup();
            assert_eq!(all, (0..len).collect::<Vec<_>>(), "covering");
        }
    }
}

#[test]
fn sampler_batches_keep_or_drop_the_short_last_batch() {
    let s = Sampler::new(10, 4).unwrap();
    assert_eq!(s.len(), 3);
    assert_eq!(s.batches(0)[2], vec![8, 9]);
    let s = s.drop_last(true);
    assert_eq!(s.len(), 2);
    assert_eq!(s.batches(0).len(), 2);
    assert!(matches!(Sampler::new(3, 0), Err(Error::Config { .. })));
    assert!(Sampler::new(3, 1).unwrap().shard(2, 2).is_err());
}

#[test]
fn collator_stacks_pads_and_writes_one_block() {
    let pool = pool();
    let images: Vec<Tensor> = (0..3)
        .map(|i| Tensor::from_vec(vec![i as f32; 4], &[2, 2]).unwrap())
        .collect();
    // A strided view is gathered.
    let transposed = Tensor::from_vec(vec![0.0f32, 1.0, 2.0, 3.0], &[2, 2])
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    let tokens = [
        Tensor::from_vec(vec![1i32, 2, 3, 4], &[2, 2]).unwrap(),
        Tensor::from_vec(vec![5i32, 6], &[1, 2]).unwrap(),
        Tensor::from_vec(vec![0i32; 0], &[0, 2]).unwrap(),
    ];
    let mut c = Collator::new(&pool);
    let x = c
        .stack("images", images.iter().chain([&transposed]))
        .unwrap();
    let y = c.stack_scalars("labels", [1u8, 2, 3, 4]).unwrap();
    let (t, lengths) = c.pad("tokens", &tokens, -1i32).unwrap();
    let extra = c.empty("extra", DType::F64, &[2]).unwrap();
    let bytes = c.bytes();
    let mut out = c.finish().unwrap();
    out.view_mut(extra)
        .unwrap()
        .copy_from_slice(&[0.5f64, 1.5])
        .unwrap();
    let x = out.take(x).unwrap();
    assert_eq!(x.shape(), &[4, 2, 2]);
    assert_eq!(
        x.to_vec::<f32>().unwrap(),
        [
            0., 0., 0., 0., 1., 1., 1., 1., 2., 2., 2., 2., 0., 2., 1., 3.
        ]
    );
    assert_eq!(out.take(y).unwrap().to_vec::<u8>().unwrap(), [1, 2, 3, 4]);
    let t = out.take(t).unwrap();
    assert_eq!(t.shape(), &[3, 2, 2]);
    assert_eq!(
        t.to_vec::<i32>().unwrap(),
        [1, 2, 3, 4, 5, 6, -1, -1, -1, -1, -1, -1]
    );
    assert_eq!(
        out.take(lengths).unwrap().to_vec::<i64>().unwrap(),
        [2, 1, 0]
    );
    let extra = out.take(extra).unwrap();
    assert_eq!(extra.to_vec::<f64>().unwrap(), [0.5, 1.5]);
    assert!(x.is_pinned() && x.shares_block_with(&extra));
    assert_eq!(x.pinned_block().unwrap().len(), bytes);
    assert!(out.view_mut(y).is_err(), "no writes after a take");
    assert_eq!(pool.stats().allocations, 1, "one block per batch");
}

#[test]
fn collator_errors_name_the_sample_and_the_tensor() {
    let pool = pool();
    let a = Tensor::from_vec(vec![0f32; 6], &[2, 3]).unwrap();
    let b = Tensor::from_vec(vec![0f32; 4], &[2, 2]).unwrap();
    let c64 = Tensor::from_vec(vec![0f64; 6], &[2, 3]).unwrap();
    let mut c = Collator::new(&pool);
    let e = c.stack("images", [&a, &a, &b]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "sample 2 failed while collating: `images`: shape [2, 2] differs from [2, 3] of the \
         batch's first sample"
    );
    let e = c.stack("images", [&a, &c64]).unwrap_err();
    assert!(matches!(e, Error::Sample { index: 1, .. }), "{e}");
    let e = c.pad("tokens", [&a, &b], 0f32).unwrap_err();
    assert!(matches!(e, Error::Sample { index: 1, .. }), "{e}");
    let e = c.pad("tokens", [&a], 0i64).unwrap_err();
    assert!(e.to_string().contains("padding value is i64"), "{e}");
    assert!(c.stack("none", []).is_err());
    assert!(c.stack_scalars::<i64>("none", []).is_err());
    // With the loader's indices, the dataset index is named.
    let counters = Arc::new(stats::Counters::new(1, 0, 1));
    let mut c = Collator::for_batch(
        &pool,
        &Device::cpu(),
        vec![40, 41, 42],
        Default::default(),
        counters,
    );
    let e = c.stack("images", [&a, &a, &b]).unwrap_err();
    assert!(matches!(e, Error::Sample { index: 42, .. }), "{e}");
    assert_eq!(
        pool.stats().allocations,
        0,
        "nothing allocated for a bad plan"
    );
}

fn loader(workers: usize, pool: &PinnedPool) -> Loader<Vec<(Tensor, i64)>, Stack> {
    Loader::builder(dataset(N))
        .batch_size(4)
        .shuffle(11)
        .workers(workers)
        .prefetch(1)
        .pool(pool.clone())
        .build(Stack)
        .unwrap()
}

#[test]
fn batches_come_in_sampler_order_for_any_worker_count() {
    let pool = pool();
    let one = collect(loader(1, &pool).run_epoch(2));
    let three = collect(loader(3, &pool).run_epoch(2));
    assert_eq!(one, three);
    let order: Vec<i64> = one.iter().flat_map(|(y, _)| y.clone()).collect();
    let want: Vec<i64> = permutation(N, 11, 2).iter().map(|&i| i as i64).collect();
    assert_eq!(order, want);
    for (y, x) in &one {
        let rows: Vec<f32> = y.iter().flat_map(|&l| [l as f32; 6]).collect();
        assert_eq!(x, &rows);
    }
    assert_eq!(pool.stats().in_use_bytes, 0);
}

#[test]
fn an_error_in_a_sample_ends_the_epoch_in_order() {
    let pool = pool();
    let bad = N / 2;
    let data = FnDataset::new(N, move |i| {
        if i == bad {
            Err(Error::Field {
                path: "sample.image".into(),
                message: "corrupt record".into(),
            })
        } else {
            Ok(Tensor::from_vec1(vec![i as u32; 3]))
        }
    });
    let loader = Loader::builder(data)
        .batch_size(3)
        .workers(2)
        .pool(pool.clone())
        .build(Stack)
        .unwrap();
    let mut epoch = loader.iter();
    let total = epoch.remaining().unwrap();
    let mut ok = 0;
    let err = loop {
        match epoch.next().unwrap() {
            Ok(_) => ok += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(ok, bad / 3, "every batch before the bad one");
    assert!(total > ok + 1);
    assert_eq!(
        err.to_string(),
        format!("sample {bad} failed while loading: `sample.image`: corrupt record")
    );
    assert_eq!(epoch.remaining(), Some(0));
    assert!(epoch.next().is_none());
    assert_eq!(pool.stats().in_use_bytes, 0);
}

#[test]
fn a_panicking_batcher_is_an_error() {
    let pool = pool();
    let loader = Loader::builder(dataset(N))
        .batch_size(2)
        .workers(2)
        .pool(pool.clone())
        .build_with(|samples, c| {
            assert!(samples[0].1 != 4, "bad sample in the batcher");
            Stack.batch(samples, c)
        })
        .unwrap();
    let results: Vec<_> = loader.iter().collect();
    assert_eq!(results.len(), 3);
    let e = results[2].as_ref().unwrap_err();
    assert!(matches!(e, Error::Panicked { .. }), "{e}");
    assert!(e.to_string().contains("bad sample in the batcher"), "{e}");
    assert!(e.to_string().contains("batch 2"), "{e}");
}

#[test]
fn dropping_mid_epoch_returns_every_block() {
    let pool = pool();
    let loader = loader(2, &pool);
    let mut epoch = loader.iter();
    let first = epoch.next().unwrap().unwrap();
    drop(epoch);
    let s = pool.stats();
    assert_eq!(s.in_use_bytes, first.0.pinned_block().unwrap().capacity());
    drop(first);
    assert_eq!(pool.stats().in_use_bytes, 0);
}

#[test]
fn pinned_memory_held_stays_within_the_bound() {
    let pool = pool();
    let loader = loader(2, &pool);
    let mut peak = 0;
    let mut block = 0;
    for batch in &loader {
        let (x, _) = batch.unwrap();
        block = block.max(x.pinned_block().unwrap().capacity());
        // A slow consumer: the workers fill every permit meanwhile.
        std::thread::sleep(std::time::Duration::from_millis(2));
        peak = peak.max(pool.stats().in_use_bytes);
    }
    let stats = loader.stats().unwrap();
    assert!(pool.stats().peak_in_use_bytes <= loader.bound() * block);
    assert!(
        stats.pinned_peak_bytes <= stats.pinned_bound_bytes,
        "{stats}"
    );
    assert_eq!(stats.pinned_bound_bytes, loader.bound() * block);
    assert!(peak > block, "prefetching happened");
}

#[test]
fn for_loops_advance_the_epoch_and_set_epoch_resets_it() {
    let pool = pool();
    let loader = loader(1, &pool);
    let labels = |l: &Loader<Vec<(Tensor, i64)>, Stack>| -> Vec<i64> {
        l.into_iter()
            .flat_map(|b| b.unwrap().1.to_vec::<i64>().unwrap())
            .collect()
    };
    let e0 = labels(&loader);
    let e1 = labels(&loader);
    assert_ne!(e0, e1);
    assert_eq!(loader.next_epoch(), 2);
    loader.set_epoch(0);
    assert_eq!(labels(&loader), e0);
    let explicit: Vec<i64> = loader
        .run_epoch(1)
        .flat_map(|b| b.unwrap().1.to_vec::<i64>().unwrap())
        .collect();
    assert_eq!(explicit, e1);
}

#[test]
fn a_stream_is_sharded_by_every_world_th_item() {
    let pool = pool();
    let opened = Arc::new(AtomicUsize::new(0));
    let o = opened.clone();
    let source = IterSource::new(move |epoch| {
        o.fetch_add(1, Ordering::SeqCst);
        (0..N as u64).map(move |i| Ok((Tensor::from_vec1(vec![i as f32]), (i + epoch) as i64)))
    });
    let loader = Loader::builder(source)
        .batch_size(2)
        .shard(1, 3)
        .workers(2)
        .pool(pool.clone())
        .build(Stack)
        .unwrap();
    let labels: Vec<i64> = loader
        .run_epoch(0)
        .flat_map(|b| b.unwrap().1.to_vec::<i64>().unwrap())
        .collect();
    let want: Vec<i64> = (1..N as i64).step_by(3).collect();
    assert_eq!(labels, want);
    assert_eq!(opened.load(Ordering::SeqCst), 1);
    let shuffled = Loader::builder(IterSource::new(|_| {
        std::iter::empty::<crate::Result<Tensor>>()
    }))
    .shuffle(1)
    .build(Stack);
    assert!(matches!(
        shuffled,
        Err(Error::Config {
            setting: "shuffle",
            ..
        })
    ));
}

#[test]
fn a_stream_error_names_its_position() {
    let source = IterSource::new(|_| {
        (0..10u32).map(|i| {
            if i == 5 {
                Err(Error::Shape("bad line".into()))
            } else {
                Ok(Tensor::from_vec1(vec![i]))
            }
        })
    });
    let loader = Loader::builder(source)
        .batch_size(2)
        .drop_last(true)
        .workers(2)
        .pool(pool())
        .build(Stack)
        .unwrap();
    let results: Vec<_> = loader.iter().collect();
    assert_eq!(results.len(), 3);
    assert!(matches!(results[2], Err(Error::Sample { index: 5, .. })));
}

#[test]
fn launch_reads_the_launcher_variables() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    };
    let l = Launch::from_lookup(env(&[
        ("RANK", "3"),
        ("WORLD_SIZE", "4"),
        ("LOCAL_RANK", "1"),
    ]));
    assert_eq!(
        l.unwrap(),
        Launch {
            rank: 3,
            world: 4,
            local_rank: 1
        }
    );
    assert_eq!(Launch::from_lookup(env(&[])).unwrap(), Launch::single());
    let e = Launch::from_lookup(env(&[("RANK", "x"), ("WORLD_SIZE", "4")])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "launcher variable RANK: \"x\" is not a non-negative whole number"
    );
    let e = Launch::from_lookup(env(&[("RANK", "4"), ("WORLD_SIZE", "4")])).unwrap_err();
    assert!(e.to_string().contains("not below the world size 4"), "{e}");
    let e = Launch::from_lookup(env(&[("RANK", "0")])).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Launcher {
                variable: "WORLD_SIZE",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn rows_are_zero_copy_views() {
    let t = Tensor::from_vec((0..24).collect::<Vec<i16>>(), &[4, 3, 2]).unwrap();
    let rows = TensorRows::new(t.clone()).unwrap();
    assert_eq!(rows.len(), 4);
    let r = rows.get(2).unwrap();
    assert!(r.shares_storage_with(&t));
    assert_eq!(r.to_vec::<i16>().unwrap(), (12..18).collect::<Vec<_>>());
    assert!(matches!(
        rows.get(4),
        Err(Error::IndexOutOfRange { index: 4, len: 4 })
    ));
    assert!(TensorRows::new(Tensor::from_vec(vec![1u8], &[]).unwrap()).is_err());
}

#[test]
fn epochs_past_the_position_limit_are_errors_not_a_wrap_to_epoch_0() {
    use super::Position;
    let pool = pool();
    let loader = loader(2, &pool);
    // The last epoch that runs ends at a position that still fits, and reads back.
    let last = Position::LIMIT - 1;
    let mut epoch = loader.run_epoch(last);
    assert_eq!(epoch.remaining(), Some(loader.len()));
    assert!(epoch.by_ref().all(|b| b.is_ok()));
    let end = epoch.position();
    assert_eq!((end.epoch(), end.batch()), (Position::LIMIT, 0));
    assert_eq!(end.to_string().parse::<Position>().unwrap(), end);
    drop(epoch);
    // Past it: one error naming the limit, then the end; the position does not move.
    for e in [Position::LIMIT, u64::MAX] {
        let mut epoch = loader.run_epoch(e);
        let err = epoch.next().unwrap().map(|_| ()).unwrap_err();
        assert!(matches!(err, Error::Position { .. }), "{err}");
        assert!(err.to_string().contains("Position::LIMIT"), "{err}");
        assert!(epoch.next().is_none());
        assert_eq!(epoch.position().epoch(), e);
    }
    // `iter` after `set_epoch(u64::MAX)` stays there instead of going back to epoch 0.
    loader.set_epoch(u64::MAX);
    assert!(loader.iter().next().unwrap().is_err());
    assert_eq!(loader.next_epoch(), u64::MAX);
    assert_eq!(pool.stats().in_use_bytes, 0);
    // Streams too.
    let source = IterSource::new(|_| (0..4u32).map(|i| Ok(Tensor::from_vec1(vec![i]))));
    let stream = Loader::builder(source)
        .batch_size(2)
        .workers(2)
        .pool(pool.clone())
        .build(Stack)
        .unwrap();
    let mut epoch = stream.run_epoch(u64::MAX);
    assert!(matches!(epoch.next(), Some(Err(Error::Position { .. }))));
    assert!(epoch.next().is_none());
    assert_eq!(stream.run_epoch(Position::LIMIT - 1).count(), 2);
}
