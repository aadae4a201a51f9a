//! A soak run: 10^5 batches through the loader on the host, checking that pinned memory, the
//! process's thread count and its resident memory stay flat. Ignored by default (about a minute
//! on two cores); run it with
//!
//!     cargo test --release --test loader_soak -- --ignored --nocapture
//!
//! Its own test binary, so no other test's threads are counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use pinnable::loader::{Dataset, FnDataset, Loader, Stack, TensorRows};
use pinnable::{DType, Error, PinnedPool, PoolConfig};
use pinnable_harness::{random_tensor, rng};
use rand::Rng;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// Resident memory in KiB.
fn rss_kib() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[derive(Default)]
struct Range {
    min: usize,
    max: usize,
}

impl Range {
    fn add(&mut self, v: usize) {
        if self.max == 0 && self.min == 0 {
            self.min = v;
        }
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }
}

#[test]
#[ignore = "a soak run of 10^5 batches; run it explicitly"]
fn soak_100k_batches_keep_pinned_memory_and_threads_flat() {
    let mut r = rng("soak_100k_batches_keep_pinned_memory_and_threads_flat");
    let total: usize = std::env::var("PINNABLE_SOAK_BATCHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let (batch, epochs, workers) = (32, 10, 2);
    let per_epoch = total / epochs;
    let rows = TensorRows::new(random_tensor(&mut r, DType::F32, &[4096, 3, 16, 16])).unwrap();
    // Every epoch is `per_epoch` batches of zero-copy views. In every fifth epoch one sample
    // fails, so the error path (stop, join, return the blocks) is soaked too.
    let fail = Arc::new(AtomicBool::new(false));
    let bad = r.random_range(0..per_epoch * batch);
    let failing = fail.clone();
    let data = FnDataset::new(per_epoch * batch, move |i| {
        if i == bad && failing.load(Ordering::Relaxed) {
            return Err(Error::Shape("injected failure".into()));
        }
        rows.get(i % 4096)
    });
    let pool = PinnedPool::new(PoolConfig::default());
    let loader = Loader::builder(data)
        .batch_size(batch)
        .shuffle(r.random())
        .workers(workers)
        .prefetch(2)
        .pool(pool.clone())
        .build(Stack)
        .unwrap();
    let threads_before = threads();
    let (mut threads_running, mut threads_between) = (Range::default(), Range::default());
    let (mut reserved, mut rss, mut peak) = (Range::default(), Range::default(), 0);
    let (mut batches, mut errors) = (0usize, 0usize);
    let mut block = 0;
    let start = Instant::now();
    let mut rss_after_first = 0;
    let mut epoch = 0;
    while batches < total {
        fail.store(epoch % 5 == 4, Ordering::Relaxed);
        for (i, b) in loader.run_epoch(epoch).enumerate() {
            match b {
                Ok(t) => {
                    block = block.max(t.pinned_block().unwrap().capacity());
                    batches += 1;
                }
                Err(e) => {
                    assert!(e.to_string().contains("injected failure"), "{e}");
                    errors += 1;
                }
            }
            if i % 1000 == 0 {
                threads_running.add(threads());
                reserved.add(pool.stats().reserved_bytes);
                rss.add(rss_kib());
                peak = peak.max(pool.stats().in_use_bytes);
            }
        }
        threads_between.add(threads());
        assert_eq!(
            pool.stats().in_use_bytes,
            0,
            "epoch {epoch}: every block back"
        );
        if epoch == 0 {
            rss_after_first = rss_kib();
        }
        epoch += 1;
    }
    let elapsed = start.elapsed();
    let bound = loader.bound() * block;
    let s = pool.stats();
    println!(
        "soak: {batches} batches in {epoch} epochs ({errors} ended by an injected error) in {elapsed:.1?} ({:.0} batches/s)",
        batches as f64 / elapsed.as_secs_f64()
    );
    println!(
        "threads: {threads_before} before; {}..{} while running; {}..{} between epochs",
        threads_running.min, threads_running.max, threads_between.min, threads_between.max
    );
    println!(
        "pinned: reserved {}..{} bytes; peak in use {} of a bound of {bound} ({} × {block}); pool peak {}",
        reserved.min,
        reserved.max,
        peak,
        loader.bound(),
        s.peak_in_use_bytes
    );
    println!(
        "pool: {} allocations, {} backend allocations, {} backend frees",
        s.allocations, s.backend_allocs, s.backend_frees
    );
    println!(
        "rss: {}..{} KiB while running; {rss_after_first} KiB after epoch 0, {} KiB at the end",
        rss.min,
        rss.max,
        rss_kib()
    );
    assert!(batches >= total && errors >= 1);
    assert_eq!(
        (threads_between.min, threads_between.max),
        (threads_before, threads_before)
    );
    assert!(threads_running.max <= threads_before + workers + 1);
    assert!(s.peak_in_use_bytes <= bound);
    assert!(
        s.backend_allocs <= loader.bound() as u64,
        "blocks reused, not allocated per batch"
    );
    assert!(
        rss_kib() < rss_after_first + 64 * 1024,
        "resident memory flat within 64 MiB"
    );
}
