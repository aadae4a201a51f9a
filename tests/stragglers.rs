//! Slow and stuck samples: out-of-order delivery (`in_order(false)`) hides a straggler that
//! stalls strict order; a `get` that never returns ends its epoch with `Error::Timeout`, the
//! next epoch runs with every worker, and threads and pinned memory go back to where they
//! started once the stuck call returns.
//!
//! The tests of this file run one at a time (they count the loader's threads and time
//! epochs). Timings use sleeps, which cost no CPU, so that a loaded 2-core machine shows the
//! same effects: the margins are about three times the jitter seen there.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pinnable::loader::{Dataset, FnDataset, Loader, Position, Stack};
use pinnable::{Error, Placement, Tensor, ToDevice};
use pinnable_harness::{cuda_or_skip, rng};
use rand::Rng;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn alone() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// The loader's threads alive in this process (their names start with `loader-`).
fn loader_threads() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("loader-"))
        .count()
}

fn values(batch: pinnable::Result<Tensor>) -> Vec<i64> {
    batch.unwrap().to_vec::<i64>().unwrap()
}

#[test]
fn out_of_order_delivery_hides_a_straggler_that_stalls_strict_order() {
    let _alone = alone();
    let mut r = rng("out_of_order_delivery_hides_a_straggler_that_stalls_strict_order");
    // 400 samples of 6 ms, 1% of them (one in each hundred, away from the epoch's end) 20×
    // slower; the consumer's step takes 3 ms, so 8 workers have time to spare.
    let (n, base, step) = (400, Duration::from_millis(6), Duration::from_millis(3));
    let offset = r.random_range(5..30);
    // The dataset indices of the slow samples, set once the epoch's order is known.
    let slow: &'static std::sync::OnceLock<HashSet<usize>> =
        Box::leak(Box::new(std::sync::OnceLock::new()));
    let slow_now: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let data = Arc::new(FnDataset::new(n, move |i| {
        let straggler =
            slow_now.load(Ordering::Relaxed) && slow.get().is_some_and(|s| s.contains(&i));
        std::thread::sleep(if straggler { base * 20 } else { base });
        Ok(Tensor::from_vec1(vec![i as i64]))
    }));
    let seed = r.random();
    let build = |in_order| {
        Loader::builder(data.clone())
            .batch_size(1)
            .shuffle(seed)
            .workers(8)
            .prefetch(0)
            .in_order(in_order)
            .build(Stack)
            .unwrap()
    };
    // The best of three runs: a loaded machine's hiccups only ever add time.
    let run = |loader: &Loader<_, Stack>, epoch| {
        let mut best = f64::INFINITY;
        let mut got = Vec::new();
        for _ in 0..3 {
            let t = Instant::now();
            got = loader
                .run_epoch(epoch)
                .flat_map(|b| {
                    std::thread::sleep(step);
                    values(b)
                })
                .collect::<Vec<i64>>();
            best = best.min(t.elapsed().as_secs_f64());
        }
        (best, got)
    };
    let (strict, unordered) = (build(true), build(false));
    let epoch = r.random_range(0..5);
    let order = strict.sampler().indices(epoch);
    let want: Vec<i64> = order.iter().map(|&i| i as i64).collect();
    // The slow samples' places in the epoch: one in each hundred, none in its last 70.
    let places = (0..n).filter(|p| p % 100 == offset);
    let _ = slow.set(places.map(|p| order[p]).collect());
    slow_now.store(false, Ordering::Relaxed);
    let (plain, got) = run(&strict, epoch);
    assert_eq!(got, want);
    slow_now.store(true, Ordering::Relaxed);
    let (stalled, got) = run(&strict, epoch);
    assert_eq!(got, want);
    let (hidden, mut got) = run(&unordered, epoch);
    assert_ne!(
        got, want,
        "out of order, the stragglers' batches come later"
    );
    got.sort_unstable();
    let mut sorted = want.clone();
    sorted.sort_unstable();
    assert_eq!(got, sorted, "the same samples, once each");
    println!(
        "epoch of {n}: no straggler {plain:.3} s; 1% 20x slower: in order {stalled:.3} s \
         ({:.2}x), out of order {hidden:.3} s ({:.2}x)",
        stalled / plain,
        hidden / plain
    );
    assert!(
        hidden <= plain * 1.1,
        "out of order: {hidden:.3} s against {plain:.3} s"
    );
    assert!(
        stalled >= plain * 1.15,
        "in order: {stalled:.3} s against {plain:.3} s"
    );
}

/// A dataset whose sample `stuck` blocks, the first time it is asked for, until released.
struct Stuck {
    len: usize,
    stuck: usize,
    armed: AtomicBool,
    released: Mutex<bool>,
    wake: Condvar,
    entered: Mutex<Option<Instant>>,
    threads: Mutex<HashSet<String>>,
}

impl Stuck {
    fn release(&self) {
        *self.released.lock().unwrap() = true;
        self.wake.notify_all();
    }
}

impl Dataset for Stuck {
    type Sample = Tensor;

    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> pinnable::Result<Tensor> {
        let name = std::thread::current().name().unwrap_or("?").to_owned();
        self.threads.lock().unwrap().insert(name);
        if index == self.stuck && self.armed.swap(false, Ordering::SeqCst) {
            *self.entered.lock().unwrap() = Some(Instant::now());
            let mut released = self.released.lock().unwrap();
            while !*released {
                released = self.wake.wait(released).unwrap();
            }
        } else {
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(Tensor::from_vec1(vec![index as i64; 64]))
    }
}

#[test]
fn a_get_that_never_returns_times_out_and_nothing_leaks_once_it_does() {
    let _alone = alone();
    let mut r = rng("a_get_that_never_returns_times_out_and_nothing_leaks_once_it_does");
    let (n, workers) = (96, r.random_range(2..6));
    let data = Arc::new(Stuck {
        len: n,
        stuck: r.random_range(0..n),
        armed: AtomicBool::new(true),
        released: Mutex::new(false),
        wake: Condvar::new(),
        entered: Mutex::new(None),
        threads: Mutex::new(HashSet::new()),
    });
    let timeout = Duration::from_millis(r.random_range(200..400));
    let loader = Loader::builder(data.clone())
        .batch_size(2)
        .shuffle(r.random())
        .workers(workers)
        .sample_timeout(timeout)
        .build(Stack)
        .unwrap();
    let threads = loader_threads();
    let pool = loader.pool().stats();

    // Epoch 0: the stuck sample ends it with a timeout, in time.
    let mut epoch = loader.iter();
    let err = loop {
        match epoch.next() {
            Some(Ok(_)) => {}
            Some(Err(e)) => break e,
            None => panic!("the epoch ended without the timeout"),
        }
    };
    let noticed = Instant::now();
    let entered = data
        .entered
        .lock()
        .unwrap()
        .expect("the stuck sample was asked for");
    let Error::Timeout {
        index,
        worker,
        waited,
        timeout: limit,
    } = err
    else {
        panic!("not a timeout: {err}");
    };
    assert_eq!((index, limit), (data.stuck, timeout));
    assert!(
        worker < workers && waited >= timeout,
        "worker {worker}, waited {waited:?}"
    );
    let late = noticed - entered;
    assert!(
        late <= timeout.mul_f64(1.5),
        "{late:?} for a timeout of {timeout:?}"
    );
    assert!(epoch.next().is_none(), "the epoch is over after the error");
    drop(epoch);
    assert_eq!(loader.stuck_workers(), 1);
    println!("timeout {timeout:?}: the error came {late:?} after the call began");

    // Epoch 1: every batch, from every worker.
    data.threads.lock().unwrap().clear();
    let batches = loader.iter().map(|b| b.map(|_| 1).unwrap()).sum::<usize>();
    assert_eq!(batches, n / 2);
    let used = data.threads.lock().unwrap().len();
    assert_eq!(used, workers, "the next epoch runs with every worker");
    assert_eq!(loader.stuck_workers(), 1, "still inside its call");

    // The call returns: the abandoned worker ends, and is joined.
    data.release();
    let start = Instant::now();
    while loader.stuck_workers() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the worker did not end"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(loader_threads(), threads);
    let now = loader.pool().stats();
    assert_eq!(
        (now.in_use_bytes, now.requested_bytes),
        (pool.in_use_bytes, pool.requested_bytes)
    );
}

#[test]
fn a_position_with_batches_delivered_ahead_is_refused_and_one_between_epochs_resumes() {
    let _alone = alone();
    let mut r =
        rng("a_position_with_batches_delivered_ahead_is_refused_and_one_between_epochs_resumes");
    // One of the first three batches is slow: the fourth, started beside it, arrives ahead.
    let slow = r.random_range(0..3);
    let data = Arc::new(FnDataset::new(40, move |i| {
        if i == slow {
            std::thread::sleep(Duration::from_millis(300));
        }
        Ok(Tensor::from_vec1(vec![i as i64]))
    }));
    let build = || {
        Loader::builder(data.clone())
            .batch_size(1)
            .workers(4)
            .in_order(false)
    };
    let loader = build().build(Stack).unwrap();
    let mut epoch = loader.iter();
    for _ in 0..3 {
        epoch.next().unwrap().unwrap();
    }
    let position = epoch.position();
    assert!(position.delivered_ahead(), "{position}");
    let parsed: Position = position.to_string().parse().unwrap();
    assert_eq!(parsed, position);
    assert_eq!(
        Position::from_bytes(&position.to_bytes()).unwrap(),
        position
    );
    let err = build().resume(parsed).build(Stack).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Config {
                setting: "resume",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("in_order(false)"), "{err}");
    let rest = epoch.map(|b| b.map(|_| 1).unwrap()).sum::<usize>();
    assert_eq!(rest, 37);
    let end = loader.position();
    assert!(!end.delivered_ahead());
    assert_eq!((end.epoch(), end.batch()), (1, 0));
    build().resume(end).build(Stack).unwrap();
}

#[test]
fn out_of_order_batches_reach_the_device_intact() {
    let _alone = alone();
    let Some(dev) = cuda_or_skip("out_of_order_batches_reach_the_device_intact") else {
        return;
    };
    let mut r = rng("out_of_order_batches_reach_the_device_intact");
    let (n, batch) = (r.random_range(200..600), r.random_range(1..9));
    let slow = r.random_range(0..n);
    let width = r.random_range(1..300);
    let data = Arc::new(FnDataset::new(n, move |i| {
        if i == slow {
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(Tensor::from_vec1(vec![i as i64; width]))
    }));
    let loader = Loader::builder(data.clone())
        .batch_size(batch)
        .shuffle(r.random())
        .workers(6)
        .in_order(false)
        .device(dev)
        .build(Stack)
        .unwrap();
    let mut want: Vec<Vec<i64>> = loader
        .sampler()
        .batches(0)
        .iter()
        .map(|b| b.iter().flat_map(|&i| vec![i as i64; width]).collect())
        .collect();
    let mut got: Vec<Vec<i64>> = Vec::new();
    for b in loader.run_epoch(0) {
        let b = b.unwrap();
        assert!(matches!(b.placement(), Placement::Cuda(_)));
        got.push(b.to_cpu(false).unwrap().to_vec::<i64>().unwrap());
    }
    got.sort();
    want.sort();
    assert_eq!(got, want);
}
