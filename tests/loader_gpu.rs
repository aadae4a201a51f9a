//! The loader delivering to a CUDA device: random batches moved by the loader's transfer
//! thread, read back, equal to what the batcher makes on the host. Skips (printing
//! `skipped: …`) without a GPU, and fails instead under `PINNABLE_REQUIRE_GPU=1`.

use pinnable::loader::{Collator, Loader};
use pinnable::{PinnedPool, Placement, PoolConfig, ToDevice};
use pinnable_harness::samples::{collate, random_samples};
use pinnable_harness::{bytes_of, cuda_or_skip, rng};
use rand::Rng;

#[test]
fn a_thousand_random_batches_reach_the_device_intact() {
    let Some(dev) = cuda_or_skip("a_thousand_random_batches_reach_the_device_intact") else {
        return;
    };
    let mut r = rng("a_thousand_random_batches_reach_the_device_intact");
    let batch_size = r.random_range(2..9);
    let batches = 1000;
    let samples = random_samples(&mut r, batches * batch_size, (16, 16), 24);
    let seed = r.random();
    let pool = PinnedPool::new(PoolConfig::default());
    let loader = Loader::builder(samples.clone())
        .batch_size(batch_size)
        .shuffle(seed)
        .workers(r.random_range(1..6))
        .prefetch(r.random_range(0..4))
        .device(dev.clone())
        .pool(pool.clone())
        .build_with(collate)
        .unwrap();
    let order = loader.sampler().batches(0);
    let host_pool = PinnedPool::new(PoolConfig::default());
    let epoch = loader.run_epoch(0);
    assert_eq!(epoch.remaining(), Some(batches));
    let mut n = 0;
    for (got, indices) in epoch.zip(&order) {
        let got = got.unwrap();
        assert!(got.iter().all(|t| t.placement() == Placement::Cuda(0)));
        let back = got.to_cpu(false).unwrap();
        let picked = indices.iter().map(|&i| samples[i].clone()).collect();
        let want = collate(picked, &mut Collator::new(&host_pool)).unwrap();
        assert_eq!(back.len(), want.len(), "batch {n}");
        for (k, (b, w)) in back.iter().zip(&want).enumerate() {
            assert_eq!(b.shape(), w.shape(), "batch {n} tensor {k}");
            assert_eq!(bytes_of(b), bytes_of(w), "batch {n} tensor {k}");
        }
        n += 1;
    }
    assert_eq!(n, batches);
    let stats = loader.stats().unwrap();
    println!("{stats}");
    assert!(
        stats.pinned_peak_bytes <= stats.pinned_bound_bytes,
        "{stats}"
    );
    assert_eq!(pool.stats().in_use_bytes, 0, "every block back in the pool");
}

/// A batch whose host copy panics when dropped, once its move has been issued.
struct Fragile {
    values: pinnable::Tensor,
    armed: bool,
}

impl Drop for Fragile {
    fn drop(&mut self) {
        if self.armed {
            panic!("a host batch panicked when dropped");
        }
    }
}

impl ToDevice for Fragile {
    fn to_device_with(&self, cx: &mut pinnable::MoveContext<'_>) -> pinnable::Result<Self> {
        Ok(Fragile {
            values: self.values.to_device_with(cx)?,
            armed: false,
        })
    }
}

#[test]
fn a_host_batch_that_panics_when_dropped_after_its_move_fails_that_batch() {
    let test = "a_host_batch_that_panics_when_dropped_after_its_move_fails_that_batch";
    let Some(dev) = cuda_or_skip(test) else {
        return;
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let loader = Loader::builder((0..40i64).collect::<Vec<i64>>())
            .batch_size(4)
            .workers(2)
            .prefetch(1)
            .device(dev)
            .build_with(|s: Vec<i64>, c: &mut Collator| {
                let x = c.stack_scalars("x", s.iter().copied())?;
                let values = c.finish()?.take(x)?;
                // Batch 3 (samples 12..16) panics when the transfer thread drops its host copy.
                Ok(Fragile {
                    values,
                    armed: s[0] == 12,
                })
            })
            .unwrap();
        let results: Vec<_> = loader
            .iter()
            .map(|b| b.map(|b| b.values.to_cpu(false).unwrap().to_vec::<i64>().unwrap()))
            .collect();
        let _ = tx.send(results);
    });
    let results = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the epoch hung");
    assert_eq!(
        results.len(),
        4,
        "three batches, then the failed one: {results:?}"
    );
    assert_eq!(results[2].as_ref().unwrap(), &[8, 9, 10, 11]);
    match &results[3] {
        Err(pinnable::Error::Panicked { what, message }) => {
            assert!(what.contains("batch 3"), "{what}");
            assert_eq!(message, "a host batch panicked when dropped");
        }
        other => panic!("expected a panic error for batch 3, got {other:?}"),
    }
}

/// A slow consumer of GPU batches, then the epoch and the loader dropped: the pool's figures are
/// back where they started as soon as the last copies have run, with no allocation since to
/// poll them — in every one of 100 epochs. Prints the longest time that took; after the
/// device's work is synchronised nothing may be pending at all.
#[test]
fn the_pool_is_back_to_its_start_after_every_slow_gpu_epoch() {
    let test = "the_pool_is_back_to_its_start_after_every_slow_gpu_epoch";
    let Some(dev) = cuda_or_skip(test) else {
        return;
    };
    let mut r = rng(test);
    let pool = PinnedPool::new(PoolConfig::default());
    let start = pool.stats();
    let mut slowest = std::time::Duration::ZERO;
    for run in 0..100 {
        let batch_size = r.random_range(2..9);
        let batches = r.random_range(4..12);
        let samples = random_samples(&mut r, batches * batch_size, (64, 256), 24);
        let loader = Loader::builder(samples)
            .batch_size(batch_size)
            .shuffle(r.random())
            .workers(r.random_range(1..5))
            .prefetch(r.random_range(0..4))
            .device(dev.clone())
            .pool(pool.clone())
            .build_with(collate)
            .unwrap();
        let mut n = 0;
        for batch in loader.run_epoch(0) {
            drop(batch.unwrap());
            // The consumer's step: slower than the loader, so batches wait in prefetch.
            std::thread::sleep(std::time::Duration::from_micros(r.random_range(200..1500)));
            n += 1;
        }
        assert_eq!(n, batches, "run {run}");
        drop(loader);
        let ended = std::time::Instant::now();
        let back =
            |s: &pinnable::PoolStats| s.in_use_bytes == start.in_use_bytes && s.pending_bytes == 0;
        // Polled only through `stats`: nothing else asks the pool for anything.
        let mut s = pool.stats();
        while !back(&s) && ended.elapsed() < std::time::Duration::from_secs(2) {
            std::thread::yield_now();
            s = pool.stats();
        }
        slowest = slowest.max(ended.elapsed());
        assert!(back(&s), "run {run}: still held 2 s after the epoch\n{s}");
        dev.synchronize().unwrap();
        let s = pool.stats();
        assert_eq!(
            (s.in_use_bytes, s.pending_bytes, s.pending_blocks),
            (0, 0, 0),
            "run {run}\n{s}"
        );
        assert_eq!(s.reserved_bytes, s.cached_bytes, "run {run}\n{s}");
    }
    println!(
        "{test}: back to the starting figures at most {slowest:?} after an epoch's end (100 epochs)"
    );
}
