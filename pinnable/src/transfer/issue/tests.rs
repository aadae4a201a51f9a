use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use cudarc::driver::{DriverError, sys};

use super::*;
use crate::alloc::{PinnedPool, PoolConfig};
use crate::loader::SplitMix64;

/// Fresh random data, seeded from the clock (the seed printed); under Miri, whose isolation has
/// no clock, from a fixed seed.
fn rng(test: &str) -> SplitMix64 {
    if cfg!(miri) {
        SplitMix64::new(0x9e37_79b9_7f4a_7c15)
    } else {
        SplitMix64::for_test(test)
    }
}

/// A fence that completes when the test says so.
#[derive(Default)]
struct Flag(AtomicBool);

impl Fence for Flag {
    fn is_complete(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    fn wait(&self) {
        while !self.is_complete() {
            std::thread::yield_now();
        }
    }
}

/// Blocks of random sizes from a fresh page-locked pool.
fn blocks(pool: &PinnedPool, r: &mut SplitMix64) -> Vec<Arc<PinnedBlock>> {
    let n = 2 + (r.next_u64() % 6) as usize;
    (0..n)
        .map(|_| {
            let bytes = 1 + (r.next_u64() % (256 << 10)) as usize;
            Arc::new(pool.alloc(bytes).expect("page-locked block"))
        })
        .collect()
}

#[test]
fn fenced_blocks_stay_out_of_the_free_lists_until_the_fence_completes() {
    let mut r = rng("fenced blocks stay out");
    let pool = PinnedPool::heap(PoolConfig::default());
    let held = blocks(&pool, &mut r);
    let sizes: Vec<usize> = held.iter().map(|b| b.len()).collect();
    let fence = fence_blocks(
        &held,
        || Ok(Flag::default()),
        || panic!("no wait when a fence is made"),
    )
    .expect("fenced");
    assert!(held.iter().all(|b| b.pending_uses() == 1));
    drop(held);
    let s = pool.stats();
    assert_eq!((s.in_use_bytes, s.cached_bytes), (0, 0), "{s:?}");
    assert_eq!(s.pending_blocks, sizes.len());
    assert_eq!(s.pending_bytes, s.reserved_bytes);
    // Asking again for the same sizes cannot get the fenced blocks back.
    let hits = s.hits;
    let again: Vec<PinnedBlock> = sizes.iter().map(|&n| pool.alloc(n).unwrap()).collect();
    assert_eq!(
        pool.stats().hits,
        hits,
        "a fenced block was handed out again"
    );
    drop(again);
    fence.0.store(true, Ordering::SeqCst);
    let s = pool.stats();
    assert_eq!((s.pending_blocks, s.in_use_bytes), (0, 0), "{s:?}");
    assert_eq!(s.cached_bytes, s.reserved_bytes);
}

#[test]
fn without_a_fence_the_work_is_waited_for_before_the_error_comes_back() {
    let mut r = rng("without a fence");
    let pool = PinnedPool::heap(PoolConfig::default());
    let held = blocks(&pool, &mut r);
    let waited = AtomicUsize::new(0);
    let code = sys::CUresult::CUDA_ERROR_LAUNCH_FAILED;
    let got = fence_blocks::<Flag>(
        &held,
        || Err(Error::driver("cuEventRecord", DriverError(code))),
        || {
            waited.fetch_add(1, Ordering::SeqCst);
        },
    );
    let e = got.err().expect("the recording error");
    assert!(e.to_string().contains("cuEventRecord"), "{e}");
    assert_eq!(waited.load(Ordering::SeqCst), 1);
    // Nothing is left to wait for: the blocks go straight back.
    assert!(held.iter().all(|b| b.pending_uses() == 0));
    drop(held);
    let s = pool.stats();
    assert_eq!(s.pending_blocks, 0);
    assert_eq!(s.cached_bytes, s.reserved_bytes);
}
