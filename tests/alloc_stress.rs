//! The pinned pool under contention, over the `mlock` backend: 16 threads allocate random
//! sizes (mostly small, a few large), write a canary, keep some blocks across iterations so
//! blocks are reused, verify, and free; afterwards nothing is in use, cached or leaked.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use pinnable::{BackendChoice, Error, PinnedBlock, PinnedPool, PoolConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const THREADS: usize = 16;
const CYCLES: usize = 100_000;
const HELD: usize = 4;

/// Whether the process may lock memory beyond `ulimit -l` (`CAP_IPC_LOCK`, e.g. root).
fn has_cap_ipc_lock() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("CapEff:"))?;
            u64::from_str_radix(line.trim_start_matches("CapEff:").trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << 14) != 0)
}

/// Offsets of the canary words: start, end and a few places in between. Byte `i` of a block
/// holds byte `i % 8` of the tag, so words that overlap in a small block agree.
fn canary_offsets(len: usize) -> [usize; 5] {
    let last = len.saturating_sub(8);
    [0, last / 4, last / 2, last * 3 / 4, last]
}

fn write_canary(b: &PinnedBlock, tag: u64) {
    // SAFETY: the block is this thread's alone while it holds it.
    let bytes = unsafe { b.as_mut_slice() };
    let word = tag.to_le_bytes();
    for off in canary_offsets(bytes.len()) {
        for i in off..(off + 8).min(bytes.len()) {
            bytes[i] = word[i % 8];
        }
    }
}

fn check_canary(b: &PinnedBlock, tag: u64) {
    // SAFETY: the block is this thread's alone while it holds it.
    let bytes = unsafe { b.as_slice() };
    let word = tag.to_le_bytes();
    for off in canary_offsets(bytes.len()) {
        let end = (off + 8).min(bytes.len());
        let want: Vec<u8> = (off..end).map(|i| word[i % 8]).collect();
        assert_eq!(
            bytes[off..end],
            want[..],
            "canary of thread {} seq {} at {off}/{} overwritten: a block was handed out twice",
            tag >> 40,
            tag & ((1 << 40) - 1),
            bytes.len()
        );
    }
}

#[test]
fn sixteen_threads_allocate_write_verify_free_without_leaks() {
    let seed = pinnable_harness::rng("alloc_stress").random::<u64>();
    let _ = pinnable::PinnedPool::raise_memlock_limit();
    // `PINNABLE_STRESS_MEMLOCK=bytes` sizes the test as if that limit bound (to exercise the
    // budgeted configuration on a machine where it does not).
    let limit = std::env::var("PINNABLE_STRESS_MEMLOCK")
        .ok()
        .and_then(|v| v.parse().ok())
        .or_else(|| pinnable::PinnedPool::memlock_limit().filter(|_| !has_cap_ipc_lock()));
    // Fit the locked-memory limit when it binds: the budget makes threads wait, never fail.
    let (large_max, config) = match limit {
        None => (4 << 20, PoolConfig::default()),
        Some(l) => {
            let l = l as usize;
            let config = PoolConfig::default()
                .max_bytes(l / 8 * 7)
                .max_cached_bytes(l / 4)
                .wait(Duration::from_secs(30));
            ((l / 128).clamp(16 << 10, 4 << 20), config)
        }
    };
    println!("memlock limit {limit:?}, largest block {large_max} B");
    let pool = PinnedPool::new(config.backend(BackendChoice::Mlock));
    let page = pinnable::PinnedPool::rounded_size(1);
    let budget_retries = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let pool = pool.clone();
            let budget_retries = budget_retries.clone();
            thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed ^ (t as u64).wrapping_mul(0x9E37_79B9));
                let mut held: Vec<(PinnedBlock, u64)> = Vec::with_capacity(HELD);
                for seq in 0..CYCLES {
                    let bytes = if rng.random_ratio(1, 250) {
                        rng.random_range(64 << 10..=large_max)
                    } else {
                        let bits = rng.random_range(0..=14);
                        rng.random_range(1..=1usize << bits)
                    };
                    let block = loop {
                        match pool.alloc(bytes) {
                            Ok(b) => break b,
                            Err(Error::BudgetExceeded { .. }) if !held.is_empty() => {
                                budget_retries.fetch_add(1, Ordering::Relaxed);
                                for (b, tag) in held.drain(..) {
                                    check_canary(&b, tag);
                                }
                            }
                            Err(e) => panic!("thread {t} seq {seq}: alloc({bytes}): {e}"),
                        }
                    };
                    assert_eq!(block.len(), bytes);
                    assert!(block.capacity() >= bytes);
                    assert!(block.capacity() <= bytes + bytes / 8 + page);
                    assert_eq!(block.as_ptr() as usize % page, 0);
                    let tag = ((t as u64) << 40) | seq as u64;
                    write_canary(&block, tag);
                    if rng.random_bool(0.5) {
                        if held.len() == HELD {
                            let (old, old_tag) = held.swap_remove(rng.random_range(0..HELD));
                            check_canary(&old, old_tag);
                        }
                        held.push((block, tag));
                    } else {
                        check_canary(&block, tag);
                    }
                }
                for (b, tag) in held {
                    check_canary(&b, tag);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a stress thread failed");
    }
    let before = pool.stats();
    println!(
        "{} cycles in {:?}; {} budget retries\n{before}",
        THREADS * CYCLES,
        start.elapsed(),
        budget_retries.load(Ordering::Relaxed)
    );
    assert_eq!(before.allocations as usize, THREADS * CYCLES);
    assert!(
        before.hits > 10 * before.misses,
        "blocks were reused\n{before}"
    );
    pool.empty_cache();
    let s = pool.stats();
    assert_eq!((s.in_use_bytes, s.requested_bytes), (0, 0), "{s}");
    assert_eq!(
        (s.cached_bytes, s.pending_bytes, s.reserved_bytes),
        (0, 0, 0),
        "{s}"
    );
    assert_eq!(
        s.backend_allocs, s.backend_frees,
        "every backend allocation was freed\n{s}"
    );
    assert_eq!(s.hits + s.misses, s.allocations);
}
