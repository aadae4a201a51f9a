//! The pool's logic over the heap test double: runs under Miri (`scripts/miri.sh`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use super::backend::{BackendKind, page_size};
use super::{Fence, PinnedPool, PoolConfig, PoolStats};
use crate::Error;

/// A fence that completes when the test says so.
#[derive(Default)]
struct Flag(AtomicBool);

impl Flag {
    fn complete(&self) {
        self.0.store(true, Ordering::Release);
    }
}

impl Fence for Flag {
    fn is_complete(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn wait(&self) {
        while !self.is_complete() {
            thread::yield_now();
        }
    }
}

/// Completes its fences when dropped.
struct Completes(Vec<Arc<Flag>>);

impl Drop for Completes {
    fn drop(&mut self) {
        self.0.iter().for_each(|f| f.complete());
    }
}

fn pool(config: PoolConfig) -> PinnedPool {
    PinnedPool::heap(config)
}

fn balanced(s: &PoolStats) {
    assert_eq!(
        s.reserved_bytes,
        s.in_use_bytes + s.pending_bytes + s.cached_bytes,
        "reserved = in use + pending + cached\n{s}"
    );
}

#[test]
fn freed_block_is_reused_last_in_first_out() {
    let p = pool(PoolConfig::default());
    let a = p.alloc(5000).unwrap();
    let b = p.alloc(5000).unwrap();
    assert_eq!(a.backend(), BackendKind::Heap);
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    assert_ne!(pa, pb);
    drop(a);
    drop(b);
    assert_eq!(
        p.alloc(5000).unwrap().as_ptr(),
        pb,
        "last freed comes back first"
    );
    let s = p.stats();
    assert_eq!((s.allocations, s.hits, s.misses), (3, 1, 2));
    assert_eq!((s.backend_allocs, s.backend_frees), (2, 0));
    assert_eq!(s.cached_bytes, 2 * 2 * page_size());
    balanced(&s);
}

#[test]
fn stats_track_requested_reserved_and_peak() {
    let p = pool(PoolConfig::default());
    let page = page_size();
    let a = p.alloc(1).unwrap();
    let b = p.alloc(17 * page).unwrap();
    let s = p.stats();
    assert_eq!(s.requested_bytes, 1 + 17 * page);
    assert_eq!(s.in_use_bytes, page + 18 * page);
    assert_eq!(s.peak_in_use_bytes, s.in_use_bytes);
    drop(a);
    drop(b);
    let s = p.stats();
    assert_eq!((s.in_use_bytes, s.requested_bytes), (0, 0));
    assert_eq!(s.peak_in_use_bytes, 19 * page);
    assert!(s.to_string().contains("peak"));
    balanced(&s);
}

#[test]
fn reused_block_is_never_smaller_than_asked() {
    let p = pool(PoolConfig::default());
    let page = page_size();
    let big = p.alloc(100 * page).unwrap();
    let big_ptr = big.as_ptr();
    drop(big);
    for bytes in [
        1,
        page,
        17 * page + 3,
        99 * page,
        100 * page,
        101 * page,
        200 * page,
    ] {
        let b = p.alloc(bytes).unwrap();
        assert!(b.capacity() >= bytes && b.len() == bytes);
        if b.as_ptr() == big_ptr {
            assert!(b.capacity() >= 100 * page);
        }
        // SAFETY: the block is ours alone; touching every byte checks it is really that large
        // (Miri reports any access past the allocation).
        unsafe { b.as_mut_slice() }.fill(0xA5);
        // SAFETY: as above; the capacity is also ours.
        unsafe { std::ptr::write_bytes(b.as_ptr(), 1, b.capacity()) };
    }
}

#[test]
fn block_with_running_copy_is_not_reused_until_its_fence_completes() {
    let p = pool(PoolConfig::default());
    let a = p.alloc(3 * page_size()).unwrap();
    let first = a.as_ptr();
    let fence = Arc::new(Flag::default());
    a.record_use(fence.clone());
    assert_eq!(a.pending_uses(), 1);
    drop(a); // must not block
    let s = p.stats();
    assert_eq!(
        (s.pending_blocks, s.pending_bytes, s.cached_bytes),
        (1, 3 * page_size(), 0)
    );
    balanced(&s);
    let mut held = Vec::new();
    for _ in 0..40 {
        let b = p.alloc(3 * page_size()).unwrap();
        assert_ne!(b.as_ptr(), first, "reused while its copy was running");
        held.push(b);
    }
    drop(held);
    fence.complete();
    // The poll on the next miss (or every few allocations) moves it to the cache.
    let mut seen = false;
    let mut held = Vec::new();
    for _ in 0..50 {
        let b = p.alloc(3 * page_size()).unwrap();
        seen |= b.as_ptr() == first;
        held.push(b);
    }
    assert!(seen, "the block came back once its fence completed");
    assert_eq!(p.stats().pending_blocks, 0);
}

/// A pool asked for nothing more after its last block came back still reports the block as
/// free once the copy reading it has completed: `stats` polls the pending list itself.
#[test]
fn stats_after_the_last_copy_completes_report_nothing_pending() {
    let p = pool(PoolConfig::default());
    let page = page_size();
    let fences: Vec<Arc<Flag>> = (0..3).map(|_| Arc::new(Flag::default())).collect();
    // Dropped before the pool, which waits for its pending blocks: a failed assertion fails
    // the test instead of hanging it.
    let _done = Completes(fences.clone());
    for (i, fence) in fences.iter().enumerate() {
        let b = p.alloc((i + 1) * page).unwrap();
        b.record_use(fence.clone());
        drop(b);
    }
    let s = p.stats();
    assert_eq!((s.pending_blocks, s.pending_bytes), (3, 6 * page), "{s}");
    fences[1].complete();
    let s = p.stats();
    assert_eq!((s.pending_blocks, s.pending_bytes), (2, 4 * page), "{s}");
    assert_eq!(s.cached_bytes, 2 * page);
    for f in &fences {
        f.complete();
    }
    // No allocation since: the snapshot alone must see the completed copies.
    let s = p.stats();
    assert_eq!((s.pending_blocks, s.pending_bytes), (0, 0), "{s}");
    assert_eq!((s.in_use_bytes, s.cached_bytes), (0, 6 * page), "{s}");
    balanced(&s);
}

/// A block coming back polls the blocks that came back before it.
#[test]
fn a_returned_block_moves_earlier_completed_blocks_to_the_cache() {
    let p = pool(PoolConfig::default());
    let page = page_size();
    let fence = Arc::new(Flag::default());
    let _done = Completes(vec![fence.clone()]);
    let a = p.alloc(page).unwrap();
    let b = p.alloc(2 * page).unwrap();
    a.record_use(fence.clone());
    drop(a);
    fence.complete();
    drop(b); // polls `a`'s fence on its way back
    let pending = p.inner.counters.pending_blocks.load(Ordering::Relaxed);
    assert_eq!(pending, 0, "the earlier block is still pending");
    let s = p.stats();
    assert_eq!((s.cached_bytes, s.pending_bytes), (3 * page, 0), "{s}");
}

/// A fence that counts how often it is asked.
struct Counted(Arc<Flag>, Arc<std::sync::atomic::AtomicUsize>);

impl Fence for Counted {
    fn is_complete(&self) -> bool {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.is_complete()
    }

    fn wait(&self) {
        self.0.wait()
    }
}

#[test]
fn a_block_read_by_many_copies_at_once_asks_each_fence_about_twice() {
    // A pinned array several devices gather from: every copy fences it, and many run at once.
    let mut r = crate::loader::SplitMix64::for_test("a_block_read_by_many_copies");
    let p = pool(PoolConfig::default());
    let a = p.alloc(10).unwrap();
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let running = 16 + r.below(if cfg!(miri) { 40 } else { 200 }) as usize; // at once
    let copies = 20 * running + r.below(1000) as usize;
    let mut flags: std::collections::VecDeque<Arc<Flag>> = Default::default();
    for _ in 0..copies {
        let f = Arc::new(Flag::default());
        a.record_use(Arc::new(Counted(f.clone(), asked.clone())));
        flags.push_back(f);
        if flags.len() > running {
            flags.pop_front().unwrap().complete();
        }
    }
    let asked = asked.load(Ordering::Relaxed);
    assert!(
        asked <= 2 * copies + 8,
        "{asked} questions for {copies} copies, {running} at once"
    );
    // Nothing still running was forgotten.
    assert_eq!(a.pending_uses(), running.min(copies));
    let last = flags.clone();
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(2));
        last.iter().for_each(|f| f.complete());
    });
    a.wait_uses();
    assert!(flags.iter().all(|f| f.is_complete()));
    t.join().unwrap();
}

#[test]
fn wait_uses_waits_for_every_fence() {
    let p = pool(PoolConfig::default());
    let a = p.alloc(10).unwrap();
    let f1 = Arc::new(Flag::default());
    let f2 = Arc::new(Flag::default());
    a.record_use(f1.clone());
    a.record_use(f2.clone());
    f1.complete();
    assert_eq!(a.pending_uses(), 1);
    let t = {
        let f2 = f2.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(5));
            f2.complete();
        })
    };
    a.wait_uses();
    assert!(f2.is_complete());
    assert_eq!(a.pending_uses(), 0);
    t.join().unwrap();
}

#[test]
fn empty_cache_waits_for_pending_blocks_and_frees_everything() {
    let p = pool(PoolConfig::default());
    let fence = Arc::new(Flag::default());
    let blocks: Vec<_> = (1..6).map(|i| p.alloc(i * 1000).unwrap()).collect();
    blocks[2].record_use(fence.clone());
    let kept = p.alloc(7).unwrap();
    drop(blocks);
    let t = {
        let fence = fence.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(5));
            fence.complete();
        })
    };
    p.empty_cache();
    assert!(fence.is_complete());
    let s = p.stats();
    assert_eq!((s.cached_bytes, s.pending_bytes), (0, 0));
    assert_eq!(s.reserved_bytes, kept.capacity());
    assert_eq!(s.backend_allocs, s.backend_frees + 1);
    drop(kept);
    p.trim();
    let s = p.stats();
    assert_eq!((s.reserved_bytes, s.backend_allocs), (0, s.backend_frees));
    t.join().unwrap();
}

#[test]
fn trim_keeps_pending_blocks() {
    let p = pool(PoolConfig::default());
    let fence = Arc::new(Flag::default());
    let a = p.alloc(100).unwrap();
    a.record_use(fence.clone());
    drop(a);
    drop(p.alloc(50_000).unwrap());
    p.trim();
    let s = p.stats();
    assert_eq!((s.cached_bytes, s.pending_blocks), (0, 1));
    fence.complete();
    p.trim();
    let s = p.stats();
    assert_eq!(
        (s.reserved_bytes, s.pending_blocks, s.backend_frees),
        (0, 0, 2)
    );
}

#[test]
fn cache_beyond_its_cap_is_freed() {
    let page = page_size();
    let p = pool(PoolConfig::default().max_cached_bytes(3 * page));
    let blocks: Vec<_> = (0..5).map(|_| p.alloc(page).unwrap()).collect();
    drop(blocks);
    let s = p.stats();
    assert_eq!(s.cached_bytes, 3 * page);
    assert_eq!(s.backend_frees, 2);
    balanced(&s);
}

#[test]
fn over_budget_waits_then_fails_with_the_facts() {
    let page = page_size();
    let wait = Duration::from_millis(30);
    let p = pool(PoolConfig::default().max_bytes(10 * page).wait(wait));
    let held = p.alloc(7 * page).unwrap();
    let err = p.alloc(4 * page).unwrap_err();
    match err {
        Error::BudgetExceeded {
            requested,
            in_use,
            budget,
            waited,
        } => {
            assert_eq!((requested, in_use, budget), (4 * page, 7 * page, 10 * page));
            assert!(waited >= wait, "gave up after {waited:?}");
        }
        other => panic!("expected BudgetExceeded, got {other}"),
    }
    let s = p.stats();
    assert!(s.reserved_bytes <= 10 * page && s.budget_waits == 1);
    // A request that can never fit fails at once.
    match p.alloc(11 * page).unwrap_err() {
        Error::BudgetExceeded { waited, .. } => assert_eq!(waited, Duration::ZERO),
        other => panic!("expected BudgetExceeded, got {other}"),
    }
    drop(held);
}

#[test]
fn over_budget_reclaims_cached_blocks_first() {
    let page = page_size();
    let p = pool(
        PoolConfig::default()
            .max_bytes(10 * page)
            .wait(Duration::ZERO),
    );
    drop(p.alloc(6 * page).unwrap());
    drop(p.alloc(3 * page).unwrap());
    let b = p.alloc(5 * page).unwrap(); // needs the cached 6-page block freed
    let s = p.stats();
    assert!(s.reserved_bytes <= 10 * page);
    assert_eq!(s.backend_frees, 1);
    assert_eq!(s.budget_waits, 0);
    drop(b);
}

#[test]
fn freeing_from_another_thread_wakes_a_waiter() {
    let page = page_size();
    let p = pool(
        PoolConfig::default()
            .max_bytes(8 * page)
            .wait(Duration::from_secs(60)),
    );
    let held = p.alloc(6 * page).unwrap();
    let start = std::time::Instant::now();
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(20));
        drop(held);
    });
    let b = p.alloc(5 * page).unwrap();
    assert!(start.elapsed() < Duration::from_secs(30));
    assert!(p.stats().reserved_bytes <= 8 * page);
    assert_eq!(p.stats().budget_waits, 1);
    drop(b);
    t.join().unwrap();
}

#[test]
fn pending_block_completing_unblocks_a_waiter() {
    let page = page_size();
    let p = pool(
        PoolConfig::default()
            .max_bytes(4 * page)
            .wait(Duration::from_secs(60)),
    );
    let fence = Arc::new(Flag::default());
    let a = p.alloc(4 * page).unwrap();
    a.record_use(fence.clone());
    drop(a);
    let t = {
        let fence = fence.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(10));
            fence.complete();
        })
    };
    let b = p.alloc(2 * page).unwrap(); // different class: the pending block must be freed
    assert!(fence.is_complete());
    assert!(p.stats().reserved_bytes <= 4 * page);
    drop(b);
    t.join().unwrap();
}

#[test]
fn budget_is_never_exceeded_under_contention() {
    let page = page_size();
    let budget = 24 * page;
    let p = pool(
        PoolConfig::default()
            .max_bytes(budget)
            .wait(Duration::from_secs(60)),
    );
    let threads = if cfg!(miri) { 3 } else { 8 };
    let rounds = if cfg!(miri) { 15 } else { 2_000 };
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let p = p.clone();
            let barrier = barrier.clone();
            thread::spawn(move || {
                barrier.wait();
                for i in 0..rounds {
                    let pages = 1 + (t * 7 + i * 13) % 6;
                    let b = p.alloc(pages * page - t).unwrap();
                    let s = p.stats();
                    assert!(s.reserved_bytes <= budget, "over budget:\n{s}");
                    let tag = (t * 1_000_003 + i) as u64;
                    // SAFETY: the block is ours alone while we hold it.
                    let bytes = unsafe { b.as_mut_slice() };
                    bytes[..8].copy_from_slice(&tag.to_le_bytes());
                    let n = bytes.len();
                    bytes[n - 8..].copy_from_slice(&tag.to_le_bytes());
                    thread::yield_now();
                    // SAFETY: as above.
                    let bytes = unsafe { b.as_slice() };
                    assert_eq!(bytes[..8], tag.to_le_bytes());
                    assert_eq!(bytes[n - 8..], tag.to_le_bytes());
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    p.empty_cache();
    let s = p.stats();
    assert_eq!(
        (s.in_use_bytes, s.cached_bytes, s.reserved_bytes),
        (0, 0, 0)
    );
    assert_eq!(s.backend_allocs, s.backend_frees);
}

#[test]
fn dropping_the_pool_frees_its_cache() {
    let p = pool(PoolConfig::default());
    let a = p.alloc(12345).unwrap();
    let fence = Arc::new(Flag::default());
    a.record_use(fence.clone());
    fence.complete();
    drop(a);
    drop(p.alloc(3).unwrap());
    drop(p); // Miri reports a leak if the cached blocks were not freed
}
