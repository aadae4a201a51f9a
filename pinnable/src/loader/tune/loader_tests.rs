//! The tuning in a running loader: the batches and their order whatever it decides, a slow
//! dataset given more workers within the cores allowed, with the reasons in the stats, and
//! fixed knobs left alone.

use std::time::Duration;

use crate::loader::{FnDataset, Loader, SplitMix64, Stack};
use crate::tensor::Tensor;

/// A dataset of `n` samples (each its index, as 4 bytes repeated `width` times) whose `get`
/// takes `delay`.
fn slow(
    n: usize,
    width: usize,
    delay: Duration,
) -> FnDataset<impl Fn(usize) -> crate::Result<Tensor>> {
    FnDataset::new(n, move |i| {
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        Ok(Tensor::from_vec1(vec![i as u32; width]))
    })
}

/// Every batch of one epoch, as the sample numbers in it.
fn epoch<S: crate::loader::Source<Sample = Tensor>>(loader: &Loader<S, Stack>) -> Vec<Vec<u32>> {
    loader
        .iter()
        .map(|b| {
            let b = b.unwrap();
            let width = b.shape()[1];
            b.to_vec::<u32>()
                .unwrap()
                .chunks(width)
                .map(|r| r[0])
                .collect()
        })
        .collect()
}

#[test]
fn no_tuning_decision_changes_the_batches_or_their_order() {
    let mut r = SplitMix64::for_test("no_tuning_decision_changes_the_batches_or_their_order");
    for case in 0..6 {
        let n = 50 + r.below(250) as usize;
        let batch = 1 + r.below(9) as usize;
        let width = 1 + r.below(64) as usize;
        let seed = r.next_u64();
        let delay = Duration::from_micros(r.below(300));
        let cores = 1 + r.below(8) as usize;
        let build = |b: crate::loader::LoaderBuilder<_>| {
            b.batch_size(batch).shuffle(seed).build(Stack).unwrap()
        };
        // The reference: one worker, one batch ahead, nothing tuned.
        let reference = epoch(&build(
            Loader::builder(slow(n, width, delay))
                .workers(1)
                .prefetch(1),
        ));
        assert_eq!(reference.len(), n.div_ceil(batch), "case {case}");
        // A random worker count and batches ahead after every batch, within the limits.
        let chaos = r.next_u64();
        let loader = build(
            Loader::builder(slow(n, width, delay))
                .cores(cores)
                .chaos(chaos),
        );
        for e in 0..2 {
            loader.set_epoch(0);
            assert_eq!(epoch(&loader), reference, "case {case}, run {e}");
            let stats = loader.stats().unwrap();
            assert!(
                stats.tuning.len() + 1 >= reference.len(),
                "case {case}: {stats}"
            );
            assert!(
                stats.workers <= cores && stats.prefetch <= cores.max(2),
                "case {case}"
            );
        }
        // And as tuned: the same batches.
        let loader = build(Loader::builder(slow(n, width, delay)).cores(cores));
        assert_eq!(epoch(&loader), reference, "case {case}");
    }
}

#[test]
fn a_slow_dataset_gets_more_workers_and_the_stats_say_why() {
    // 2 ms a sample, 4 a batch: a worker makes 125 batches/s, the consumer takes whatever
    // comes. The tuning climbs from 4 workers towards the 12 allowed.
    let loader = Loader::builder(slow(4 * 600, 16, Duration::from_millis(2)))
        .batch_size(4)
        .cores(12)
        .build(Stack)
        .unwrap();
    assert_eq!(loader.workers(), 4, "the first epoch starts from 4");
    assert_eq!(
        loader.bound(),
        12 + 12 + 1,
        "the bound at the most the tuning may set"
    );
    let mut batches = 0;
    for b in &loader {
        b.unwrap();
        batches += 1;
    }
    assert_eq!(batches, 600);
    let stats = loader.stats().unwrap();
    assert!(stats.workers > 4 && stats.workers <= 12, "{stats}");
    assert!(!stats.tuning.is_empty(), "{stats}");
    let first = &stats.tuning[0];
    assert_eq!(first.workers.0, 4);
    assert!(first.workers.1 > 4, "{first}");
    assert!(first.reason.contains("waited"), "{first}");
    assert!(stats.prefetch >= 2 && stats.prefetch <= 12, "{stats}");
    let shown = stats.to_string();
    assert!(
        shown.contains("tuned") && shown.contains("waited"),
        "{shown}"
    );
    // The next epoch starts where this one settled.
    assert_eq!(loader.workers(), stats.workers);
}

#[test]
fn fixed_knobs_are_left_alone_in_a_running_loader() {
    let loader = Loader::builder(slow(4 * 150, 16, Duration::from_millis(2)))
        .batch_size(4)
        .workers(3)
        .prefetch(1)
        .cores(12)
        .build(Stack)
        .unwrap();
    assert_eq!(loader.bound(), 3 + 1 + 1);
    for b in &loader {
        b.unwrap();
    }
    let stats = loader.stats().unwrap();
    assert_eq!((stats.workers, stats.prefetch), (3, 1), "{stats}");
    assert!(stats.tuning.is_empty(), "{stats}");

    // Workers fixed, batches ahead tuned: they follow the workers.
    let loader = Loader::builder(slow(4 * 150, 16, Duration::from_millis(2)))
        .batch_size(4)
        .workers(3)
        .build(Stack)
        .unwrap();
    assert_eq!(loader.prefetch(), 3);
    for b in &loader {
        b.unwrap();
    }
    let stats = loader.stats().unwrap();
    assert_eq!((stats.workers, stats.prefetch), (3, 3), "{stats}");
}

#[test]
fn a_stream_ends_its_epoch_whatever_the_tuning_left_waiting() {
    // A stream's length is unknown: the epoch ends when every worker has left, those the
    // tuning made wait for a permit among them.
    let mut r = SplitMix64::for_test("a_stream_ends_its_epoch_whatever_the_tuning_left_waiting");
    for case in 0..5 {
        let n = 20 + r.below(200) as usize;
        let batch = 1 + r.below(6) as usize;
        let source = crate::loader::IterSource::new(move |_| {
            (0..n).map(|i| Ok(Tensor::from_vec1(vec![i as u32; 3])))
        });
        let loader = Loader::builder(source)
            .batch_size(batch)
            .cores(1 + r.below(8) as usize)
            .chaos(r.next_u64())
            .build(Stack)
            .unwrap();
        let (done, rx) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || {
            let got = epoch(&loader);
            let _ = done.send(());
            got
        });
        rx.recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("case {case}: the epoch did not end"));
        let got = handle.join().unwrap();
        let expected: Vec<Vec<u32>> = (0..n as u32)
            .collect::<Vec<_>>()
            .chunks(batch)
            .map(<[u32]>::to_vec)
            .collect();
        assert_eq!(got, expected, "case {case}");
    }
}

#[test]
fn epochs_shorter_than_a_window_are_tuned_across_epochs() {
    // Epochs of about 25 ms (50 batches of 4 samples at 0.5 ms each, on 4 workers): no window
    // fits in one, yet the windows run on across epochs and the workers climb.
    let loader = Loader::builder(slow(4 * 50, 8, Duration::from_micros(500)))
        .batch_size(4)
        .cores(12)
        .build(Stack)
        .unwrap();
    let mut decisions = 0;
    for _ in 0..60 {
        for b in &loader {
            b.unwrap();
        }
        decisions += loader.stats().unwrap().tuning.len();
    }
    assert!(decisions > 0, "no decision in 60 short epochs");
    assert!(loader.workers() > 4, "{} workers", loader.workers());
}

#[test]
fn loaders_of_one_process_share_its_cores_by_default() {
    use crate::loader::builder::{cores_each, default_cores};
    let mut r = SplitMix64::for_test("loaders_of_one_process_share_its_cores_by_default");
    for _ in 0..100 {
        let (total, loaders) = (1 + r.below(256) as usize, 1 + r.below(16) as usize);
        let each = cores_each(None, total, loaders);
        assert!(each >= 1 && (each * loaders <= total || each == 1));
        assert!(
            each * loaders + loaders > total,
            "{total} cores, {loaders} loaders: {each}"
        );
        let set = 1 + r.below(64) as usize;
        assert_eq!(cores_each(Some(set), total, loaders), set);
    }
    // In a built loader: `bound` is the most workers and the most batches ahead (as many, at
    // least 2) the tuning may set, and one more.
    let bound = |cores: usize| cores + cores.max(2) + 1;
    let n = 2 + r.below(4) as usize;
    let devices = vec![crate::Device::cpu(); n];
    let build = |cores: Option<usize>| {
        let b = Loader::builder(slow(64, 1, Duration::ZERO)).batch_size(4);
        match cores {
            Some(c) => b.cores(c),
            None => b,
        }
        .build_per_device(&devices, Stack)
        .unwrap()
    };
    let share = cores_each(None, default_cores(), n);
    for l in build(None) {
        assert_eq!(l.bound(), bound(share), "{n} loaders");
        assert!(l.workers() <= share);
    }
    // Set by hand, each loader's.
    let cores = 1 + r.below(6) as usize;
    assert!(build(Some(cores)).iter().all(|l| l.bound() == bound(cores)));
    // One loader alone has them all.
    let one = Loader::builder(slow(64, 1, Duration::ZERO)).batch_size(4);
    assert_eq!(one.build(Stack).unwrap().bound(), bound(default_cores()));
}
