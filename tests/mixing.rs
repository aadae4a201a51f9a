//! Weighted mixing of sources ([`Mix`]): proportions, exact counts per batch, the stop rules'
//! sequences, independence from the worker count, exact resume and its refusal when the mix
//! changed; on a GPU, mixed batches delivered to the device.

use std::time::Instant;

use pinnable::loader::{Collator, Dataset, Loader, Mix, PlanRequest, Stack, Stop, TensorRows};
use pinnable::{Error, Placement, Tensor, ToDevice};
use pinnable_harness::{Bars, cuda_or_skip, rng, sweep};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Source `s`'s samples are `s * 1_000_000 + i`: a sample names its source and index.
fn source(s: usize, len: usize) -> Vec<i64> {
    (0..len).map(|i| (s * 1_000_000 + i) as i64).collect()
}

fn of(v: i64) -> usize {
    (v / 1_000_000) as usize
}

/// The batcher of these tests: the samples' values, stacked.
type Ints = fn(Vec<i64>, &mut Collator) -> pinnable::Result<Tensor>;

fn ints(samples: Vec<i64>, c: &mut Collator) -> pinnable::Result<Tensor> {
    let values = c.stack_scalars("values", samples)?;
    c.finish()?.take(values)
}

fn collect(loader: &Loader<Mix<Vec<i64>>, Ints>, epoch: u64) -> Vec<Vec<i64>> {
    loader
        .run_epoch(epoch)
        .map(|b| b.and_then(|t| t.to_vec::<i64>()))
        .collect::<pinnable::Result<_>>()
        .unwrap()
}

#[test]
fn per_sample_draws_keep_each_share_within_three_tenths_of_a_percent() {
    let test = "per_sample_draws_keep_each_share_within_three_tenths_of_a_percent";
    mix_shares(&mut rng(test), &mut Bars::checked());
}

/// The bar, from `sweep_per_sample_shares` over 1000 seeds (2026-11-28, 3447 shares): a
/// share was at most 0.0015 from its weight's (0.1% 0.0014, median 0.0003), as independent
/// draws give (a binomial's standard deviation over 10^6 draws is at most 0.0005). The bar,
/// 0.003, is six of those: a source drawn 0.3% too often or too rarely crosses it. The worst
/// seeds found, kept.
#[test]
fn per_sample_shares_at_the_worst_seeds_found() {
    for seed in [10_079_921_081_566_494_406, 18_405_200_023_706_498_954] {
        mix_shares(&mut SmallRng::seed_from_u64(seed), &mut Bars::checked());
    }
}

#[test]
#[ignore = "a sweep: PINNABLE_TEST_SWEEP=N measures the bars over N seeds"]
fn sweep_per_sample_shares() {
    sweep("per_sample_shares", mix_shares);
}

/// A weighted mix of 2 to 5 sources over 10^6 per-sample draws: each source's share against
/// its weight's; and forever, each epoch's counts exact.
fn mix_shares(r: &mut SmallRng, bars: &mut Bars) {
    let k = r.random_range(2..6);
    let weights: Vec<f64> = (0..k).map(|_| r.random_range(0.05..1.0)).collect();
    let sum: f64 = weights.iter().sum();
    // Source 0 is long enough that reading it once takes 10^6 draws; the others cycle.
    let first = (1e6 * weights[0] / sum).ceil() as usize;
    let sources: Vec<(Vec<i64>, f64)> = weights
        .iter()
        .enumerate()
        .map(|(s, &w)| {
            let len = if s == 0 {
                first
            } else {
                r.random_range(1..5000)
            };
            (source(s, len), w)
        })
        .collect();
    let (epoch, seed) = (r.random_range(0..3), Some(r.random()));
    let mix = Mix::weighted(sources.clone()).unwrap();
    let n = mix.len();
    assert!((1_000_000..1_000_100).contains(&n), "{n}");
    let shares = |mix: &Mix<Vec<i64>>| {
        let plan = mix.order(epoch, seed);
        assert_eq!(plan.len(), mix.len());
        let mut counts = vec![0usize; k];
        for &i in &plan {
            counts[mix.locate(i).unwrap().0] += 1;
        }
        counts
    };
    for (s, (&c, &w)) in shares(&mix).iter().zip(&weights).enumerate() {
        let share = c as f64 / n as f64;
        let case = format!(
            "source {s} of {k}: share {share:.5}, weight's {:.5}",
            w / sum
        );
        bars.at_most(
            "|share - weight's share|",
            (share - w / sum).abs(),
            0.003,
            case,
        );
    }
    // Forever: each epoch holds each share exactly, rounded to whole samples.
    let forever = Mix::weighted(sources)
        .unwrap()
        .stop(Stop::Forever { samples: n })
        .unwrap();
    let counts = shares(&forever);
    assert_eq!(counts.iter().sum::<usize>(), n);
    for (&c, &w) in counts.iter().zip(&weights) {
        assert!((c as f64 - n as f64 * w / sum).abs() < 1.0, "{c}");
    }
}

#[test]
fn per_batch_counts_are_exact_in_every_batch_of_every_rank() {
    let mut r = rng("per_batch_counts_are_exact_in_every_batch_of_every_rank");
    let counts: Vec<usize> = (0..r.random_range(2..5))
        .map(|_| r.random_range(1..8))
        .collect();
    let b: usize = counts.iter().sum();
    let world = r.random_range(1..4);
    let sources: Vec<(Vec<i64>, usize)> = counts
        .iter()
        .enumerate()
        .map(|(s, &c)| (source(s, r.random_range(5..400)), c))
        .collect();
    let lens: Vec<usize> = sources.iter().map(|(d, _)| d.len()).collect();
    let seed = r.random();
    for stop in [Stop::AllExhausted, Stop::FirstExhausted] {
        let mix = Mix::per_batch(sources.clone()).unwrap().stop(stop).unwrap();
        // The rule, in batches: the largest (or smallest) source in proportion to its count.
        let per = lens.iter().zip(&counts);
        let batches = match stop {
            Stop::FirstExhausted => per.map(|(l, c)| l / c).min(),
            _ => per.map(|(l, c)| l.div_ceil(*c)).max(),
        }
        .unwrap();
        assert_eq!(mix.len(), batches * b);
        let mut seen = 0;
        for rank in 0..world {
            let loader = Loader::builder(mix_clone(&sources, stop))
                .batch_size(b)
                .shuffle(seed)
                .shard(rank, world)
                .drop_last(true)
                .workers(r.random_range(1..4))
                .build(ints as Ints)
                .unwrap();
            for batch in collect(&loader, 1) {
                let mut got = vec![0; counts.len()];
                batch.iter().for_each(|&v| got[of(v)] += 1);
                assert_eq!(got, counts, "{stop:?} rank {rank}");
                seen += 1;
            }
        }
        assert_eq!(seen, batches / world * world, "{stop:?}");
    }
}

fn mix_clone(sources: &[(Vec<i64>, usize)], stop: Stop) -> Mix<Vec<i64>> {
    Mix::per_batch(sources.to_vec())
        .unwrap()
        .stop(stop)
        .unwrap()
}

/// A stop rule's case: its name, the mix, the epoch and the sequence.
type Case = (&'static str, Mix<Vec<i64>>, u64, Vec<i64>);

/// The sequences of a fixed seed, one per stop rule: a change to any of them changes every
/// mixed run's order, and must be a decision.
#[test]
fn each_stop_rule_gives_its_sequence_for_a_fixed_seed() {
    let a = || source(0, 3); // 0, 1, 2
    let b = || source(1, 2); // 1000000, 1000001
    let run = |mix: &Mix<Vec<i64>>, epoch| mix.order(epoch, Some(42));
    let show = |mix: &Mix<Vec<i64>>, plan: Vec<usize>| -> Vec<i64> {
        plan.iter().map(|&i| mix.get(i).unwrap()).collect()
    };
    let per_batch = |stop| {
        Mix::per_batch(vec![(a(), 1), (b(), 1)])
            .unwrap()
            .stop(stop)
            .unwrap()
    };
    let weighted = |stop| {
        Mix::weighted(vec![(a(), 1.0), (b(), 1.0)])
            .unwrap()
            .stop(stop)
            .unwrap()
    };
    let cases: Vec<Case> = vec![
        (
            "per batch, all exhausted",
            per_batch(Stop::AllExhausted),
            0,
            vec![2, 1000001, 0, 1000000, 1000001, 1],
        ),
        (
            "per batch, first exhausted",
            per_batch(Stop::FirstExhausted),
            0,
            vec![2, 1000001, 0, 1000000],
        ),
        (
            "per batch, forever, epoch 1",
            per_batch(Stop::Forever { samples: 4 }),
            1,
            vec![1, 1000001, 1000000, 1],
        ),
        (
            "weighted, each once",
            weighted(Stop::EachOnce),
            0,
            vec![1000001, 1000000, 2, 0, 1],
        ),
        (
            "weighted, all exhausted",
            weighted(Stop::AllExhausted),
            0,
            vec![1000001, 1000000, 2, 0, 1, 0],
        ),
        (
            "weighted, first exhausted",
            weighted(Stop::FirstExhausted),
            0,
            vec![1000001, 1000000, 2, 0],
        ),
        (
            "weighted, forever, epoch 2",
            weighted(Stop::Forever { samples: 5 }),
            2,
            vec![0, 1000001, 1, 2, 1000000],
        ),
    ];
    let mut failed = Vec::new();
    for (name, mix, epoch, want) in cases {
        let got = show(&mix, run(&mix, epoch));
        if got != want {
            failed.push(format!("{name}: {got:?}"));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

#[test]
fn the_order_is_the_same_for_any_worker_count_and_resumes_exactly_with_another() {
    let mut r = rng("the_order_is_the_same_for_any_worker_count_and_resumes_exactly_with_another");
    let sources: Vec<(Vec<i64>, f64)> = (0..3)
        .map(|s| (source(s, r.random_range(20..300)), r.random_range(0.1..1.0)))
        .collect();
    let seed = r.random();
    let batch = r.random_range(1..9);
    let build = |workers| {
        Loader::builder(Mix::weighted(sources.clone()).unwrap())
            .batch_size(batch)
            .shuffle(seed)
            .workers(workers)
            .prefetch(2)
    };
    let epoch = r.random_range(0..4);
    let one = collect(&build(1).build(ints as Ints).unwrap(), epoch);
    let many = build(r.random_range(2..8)).build(ints as Ints).unwrap();
    assert_eq!(collect(&many, epoch), one);
    assert!(one.len() > 3);

    // Stop after a few batches with one worker count, go on with another.
    let cut = r.random_range(1..one.len());
    many.set_epoch(epoch);
    let mut e = many.iter();
    for want in &one[..cut] {
        assert_eq!(&e.next().unwrap().unwrap().to_vec::<i64>().unwrap(), want);
    }
    let saved: pinnable::loader::Position = e.position().to_string().parse().unwrap();
    drop(e);
    let resumed = build(r.random_range(1..8))
        .resume(saved)
        .build(ints as Ints)
        .unwrap();
    let rest: Vec<Vec<i64>> = resumed
        .iter()
        .map(|b| b.unwrap().to_vec::<i64>().unwrap())
        .collect();
    assert_eq!(rest, one[cut..]);
}

#[test]
fn a_position_is_refused_when_the_weights_or_sources_changed() {
    let mut r = rng("a_position_is_refused_when_the_weights_or_sources_changed");
    let w: f64 = r.random_range(0.1..1.0);
    let (a, b) = (source(0, r.random_range(10..50)), source(1, 30));
    let loader = Loader::builder(Mix::weighted(vec![(a.clone(), w), (b.clone(), 1.0)]).unwrap())
        .batch_size(3)
        .shuffle(r.random())
        .build(ints as Ints)
        .unwrap();
    let mut e = loader.iter();
    e.next().unwrap().unwrap();
    let position = e.position();
    drop(e);
    let resume = |mix: Mix<Vec<i64>>| {
        Loader::builder(mix)
            .batch_size(3)
            .shuffle(position.seed().unwrap())
            .resume(position)
            .build(ints as Ints)
            .map(|_| ())
    };
    resume(Mix::weighted(vec![(a.clone(), w), (b.clone(), 1.0)]).unwrap()).unwrap();
    let changed = [
        Mix::weighted(vec![(a.clone(), w * 1.01), (b.clone(), 1.0)]).unwrap(),
        Mix::weighted(vec![(a.clone(), w), (b[1..].to_vec(), 1.0)]).unwrap(),
        Mix::weighted(vec![(a.clone(), w), (b.clone(), 1.0)])
            .unwrap()
            .stop(Stop::FirstExhausted)
            .unwrap(),
    ];
    for mix in changed {
        let err = resume(mix).unwrap_err();
        assert!(
            matches!(&err, Error::Resume { setting, .. } if setting.starts_with("mix")),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("mix (sources, weights and stop rule)"),
            "{err}"
        );
    }
}

#[test]
fn a_per_batch_mix_refuses_another_batch_size_and_bad_settings_are_named() {
    let mix = Mix::per_batch(vec![(source(0, 10), 3), (source(1, 10), 1)]).unwrap();
    let err = Loader::builder(mix)
        .batch_size(5)
        .build(ints as Ints)
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Config {
                setting: "batch_size",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("batches of 4 samples"), "{err}");
    assert!(err.to_string().contains("remove `.batch_size(5)`"), "{err}");
    // The mix cuts its batches: no batch size to repeat by hand, and its own is allowed.
    for batch_size in [None, Some(4)] {
        let mix = Mix::per_batch(vec![(source(0, 10), 3), (source(1, 10), 1)]).unwrap();
        let builder = Loader::builder(mix).workers(1);
        let builder = match batch_size {
            Some(b) => builder.batch_size(b),
            None => builder,
        };
        let loader = builder.build(ints as Ints).unwrap();
        let sizes: Vec<usize> = loader.iter().map(|b| b.unwrap().numel()).collect();
        assert!(loader.len() >= 3, "{batch_size:?}: {}", loader.len());
        assert_eq!(sizes, vec![4; loader.len()], "{batch_size:?}");
    }
    let bad = [
        Mix::weighted(vec![(source(0, 3), 0.0)]).map(|_| ()),
        Mix::weighted(vec![(source(0, 3), f64::NAN)]).map(|_| ()),
        Mix::weighted(vec![(Vec::<i64>::new(), 1.0)]).map(|_| ()),
        Mix::<Vec<i64>>::weighted(Vec::new()).map(|_| ()),
        Mix::per_batch(vec![(source(0, 3), 0)]).map(|_| ()),
        Mix::per_batch(vec![(source(0, 3), 2)])
            .and_then(|m| m.stop(Stop::EachOnce))
            .map(|_| ()),
        Mix::per_batch(vec![(source(0, 3), 2)])
            .and_then(|m| m.stop(Stop::Forever { samples: 5 }))
            .map(|_| ()),
    ];
    for (k, result) in bad.into_iter().enumerate() {
        let err = result.unwrap_err();
        assert!(
            matches!(&err, Error::Config { setting: "mix", .. }),
            "case {k}: {err}"
        );
    }
}

#[test]
fn ranks_take_disjoint_parts_of_one_plan() {
    let mut r = rng("ranks_take_disjoint_parts_of_one_plan");
    let mix = Mix::weighted(
        (0..3)
            .map(|s| (source(s, r.random_range(10..200)), r.random_range(0.1..1.0)))
            .collect(),
    )
    .unwrap()
    .stop(Stop::FirstExhausted)
    .unwrap();
    let (seed, world) = (r.random(), r.random_range(2..5));
    let plan = mix.order(3, Some(seed));
    let parts: Vec<Vec<usize>> = (0..world)
        .map(|rank| {
            let request = PlanRequest::new(3)
                .shuffle(seed)
                .shard(rank, world)
                .drop_last(true);
            mix.plan(&request).unwrap().indices().to_vec()
        })
        .collect();
    assert!(parts.iter().all(|p| p.len() == plan.len() / world));
    for (k, &i) in plan.iter().take(plan.len() / world * world).enumerate() {
        assert_eq!(parts[k % world][k / world], i);
    }
}

#[test]
fn first_exhausted_with_counts_repeats_no_sample_and_all_exhausted_reads_every_one() {
    let mut r =
        rng("first_exhausted_with_counts_repeats_no_sample_and_all_exhausted_reads_every_one");
    let sources: Vec<(Vec<i64>, usize)> = (0..3)
        .map(|s| (source(s, r.random_range(10..300)), r.random_range(1..6)))
        .collect();
    let seed = Some(r.random());
    let first = mix_clone(&sources, Stop::FirstExhausted).order(2, seed);
    let mut sorted = first.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), first.len());
    let all = mix_clone(&sources, Stop::AllExhausted);
    let mut read = all.order(2, seed);
    read.sort_unstable();
    read.dedup();
    assert_eq!(read, (0..all.total()).collect::<Vec<_>>());
}

#[test]
fn mixed_batches_reach_the_device_with_their_counts() {
    let Some(dev) = cuda_or_skip("mixed_batches_reach_the_device_with_their_counts") else {
        return;
    };
    let mut r = rng("mixed_batches_reach_the_device_with_their_counts");
    let counts = [r.random_range(1..12), r.random_range(1..6), 1];
    let b: usize = counts.iter().sum();
    let sources: Vec<(Vec<i64>, usize)> = counts
        .iter()
        .enumerate()
        .map(|(s, &c)| (source(s, r.random_range(50..2000)), c))
        .collect();
    let seed = r.random();
    let host = Loader::builder(mix_clone(&sources, Stop::AllExhausted))
        .batch_size(b)
        .shuffle(seed)
        .build(ints as Ints)
        .unwrap();
    let want = collect(&host, 0);
    let loader = Loader::builder(mix_clone(&sources, Stop::AllExhausted))
        .batch_size(b)
        .shuffle(seed)
        .workers(4)
        .in_order(r.random())
        .device(dev)
        .build(ints as Ints)
        .unwrap();
    let mut got: Vec<Vec<i64>> = Vec::new();
    for batch in loader.run_epoch(0) {
        let batch = batch.unwrap();
        assert!(matches!(batch.placement(), Placement::Cuda(_)));
        let back = batch.to_cpu(false).unwrap().to_vec::<i64>().unwrap();
        let mut per = vec![0; counts.len()];
        back.iter().for_each(|&v| per[of(v)] += 1);
        assert_eq!(per, counts);
        got.push(back);
    }
    if loader.in_order() {
        assert_eq!(got, want);
    } else {
        got.sort();
        let mut want = want;
        want.sort();
        assert_eq!(got, want);
    }
}

/// Mixing's cost per batch against one source, on the host: run by hand,
/// `cargo test --release --test mixing -- --ignored --nocapture mixing_costs`.
/// Two shapes: small rows (where the per-batch overheads show most) and image-sized rows.
#[test]
#[ignore = "a measurement, run by hand"]
fn mixing_costs_little_per_batch_against_one_source() {
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().min(8));
    for (rows, width, batch) in [(1usize << 17, 256usize, 256usize), (4096, 12288, 64)] {
        let data: Vec<f32> = (0..rows * width).map(|i| i as f32).collect();
        let all = Tensor::from_vec(data, &[rows, width]).unwrap();
        let part = |a: usize, b: usize| TensorRows::new(all.narrow(0, a, b - a).unwrap()).unwrap();
        let one = Loader::builder(TensorRows::new(all.clone()).unwrap())
            .batch_size(batch)
            .shuffle(1)
            .drop_last(true)
            .workers(workers)
            .build(Stack)
            .unwrap();
        let mixed = Loader::builder(
            Mix::weighted(vec![
                (part(0, rows / 2), 2.0),
                (part(rows / 2, rows * 3 / 4), 1.0),
                (part(rows * 3 / 4, rows), 1.0),
            ])
            .unwrap()
            .stop(Stop::Forever { samples: rows })
            .unwrap(),
        )
        .batch_size(batch)
        .shuffle(1)
        .drop_last(true)
        .workers(workers)
        .build(Stack)
        .unwrap();
        let epoch = |loader: &dyn Fn() -> usize| {
            let t = Instant::now();
            assert_eq!(loader(), rows / batch);
            t.elapsed().as_secs_f64()
        };
        let count_one = || one.iter().map(|b| b.map(|_| 1).unwrap()).sum();
        let count_mix = || mixed.iter().map(|b| b.map(|_| 1).unwrap()).sum();
        // Alternated, best of 9 each: drift in the machine's load hits both alike.
        let (mut single, mut mix) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..9 {
            single = single.min(epoch(&count_one));
            mix = mix.min(epoch(&count_mix));
        }
        let t = Instant::now();
        let _ = mixed.dataset().order(9, Some(1));
        let plan = t.elapsed().as_secs_f64();
        let per = |t: f64| t * 1e3 / (rows / batch) as f64;
        println!(
            "{} batches of {batch} x {} B, {workers} workers: one source {:.4} ms/batch, mix \
             of 3 {:.4} ms/batch ({:+.2}%); the mix's plan {:.2} ms an epoch ({:.4} ms/batch)",
            rows / batch,
            width * 4,
            per(single),
            per(mix),
            (mix / single - 1.0) * 100.0,
            plan * 1e3,
            per(plan)
        );
    }
}
