//! Stream-safe reuse: a block freed while a copy still reads it is not handed out again until
//! the copy's fence completes; on a GPU, with real copies in flight.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use pinnable::{BackendChoice, DType, Fence, Pinnable, PinnedPool, PoolConfig, ToDevice};
use rand::Rng;

/// A fence the test completes by hand.
#[derive(Default)]
struct Flag(AtomicBool);

impl Fence for Flag {
    fn is_complete(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn wait(&self) {
        while !self.is_complete() {
            std::thread::yield_now();
        }
    }
}

/// Completes its fence when dropped: a failed assertion then unwinds past the pool's drop,
/// which waits for pending fences, instead of hanging there.
struct CompleteOnDrop(Arc<Flag>);

impl Drop for CompleteOnDrop {
    fn drop(&mut self) {
        self.0.0.store(true, Ordering::Release);
    }
}

#[test]
fn block_freed_during_a_copy_is_reused_only_after_the_fence_completes() {
    let mut rng = pinnable_harness::rng("alloc_stream_cpu");
    let _ = pinnable::PinnedPool::raise_memlock_limit();
    let pool = PinnedPool::new(PoolConfig::default().backend(BackendChoice::Mlock));
    let bytes = rng.random_range(1..=256 << 10);
    let block = pool.alloc(bytes).unwrap();
    let first = block.as_ptr();
    let fence = Arc::new(Flag::default());
    let _complete = CompleteOnDrop(fence.clone());
    block.record_use(fence.clone());
    assert_eq!(block.pending_uses(), 1);
    drop(block); // returns at once
    assert_eq!(pool.stats().pending_blocks, 1);
    let mut held = Vec::new();
    for _ in 0..100 {
        let b = pool.alloc(bytes).unwrap();
        assert_ne!(b.as_ptr(), first, "handed out while its copy ran");
        held.push(b);
    }
    drop(held);
    fence.0.store(true, Ordering::Release);
    let mut held = Vec::new();
    let mut reused = false;
    for _ in 0..120 {
        let b = pool.alloc(bytes).unwrap();
        reused |= b.as_ptr() == first;
        held.push(b);
    }
    assert!(
        reused,
        "the block returned to the cache once the fence completed"
    );
    let s = pool.stats();
    assert_eq!((s.pending_blocks, s.pending_bytes), (0, 0), "{s}");
}

#[test]
fn gpu_reuse_waits_for_the_copy_in_flight() {
    let Some(device) = pinnable_harness::cuda_or_skip("gpu_reuse_waits_for_the_copy_in_flight")
    else {
        return;
    };
    let mut rng = pinnable_harness::rng("gpu_reuse_waits_for_the_copy_in_flight");
    const BYTES: usize = 256 << 20;
    let pool = PinnedPool::new(PoolConfig::default());
    let original = pinnable_harness::random_tensor(&mut rng, DType::U8, &[BYTES]);
    let pinned = original.pin_memory_in(&pool).unwrap();
    let block = pinned.pinned_block().expect("pinned in our pool");
    assert_ne!(block.backend(), pinnable::BackendKind::Mlock);
    let first = block.as_ptr();
    // Several large copies of the block, held back on the copy stream so they are surely still
    // to run when it is dropped.
    pinnable_harness::hold_stream(device.copy_stream().expect("a CUDA copy stream"), 300);
    let copies: Vec<_> = (0..8)
        .map(|_| pinned.to_device(&device, true).unwrap())
        .collect();
    drop(pinned);
    assert_eq!(
        pool.stats().pending_blocks,
        1,
        "the block waits for its copies"
    );
    let again = pool.alloc(BYTES).unwrap();
    assert_ne!(
        again.as_ptr(),
        first,
        "a block read by running copies was handed out"
    );
    // Scribble over whatever we got: had it been the block being read, the copies would see it.
    // SAFETY: the block is ours alone.
    unsafe { again.as_mut_slice() }.fill(0xEE);
    for (i, on_gpu) in copies.iter().enumerate() {
        let back = on_gpu.to_cpu(false).unwrap();
        assert!(
            pinnable_harness::bytes_of(&back) == pinnable_harness::bytes_of(&original),
            "copy {i} differs from the original"
        );
    }
    drop(again);
    pool.empty_cache();
    pinnable_harness::assert_drained(&pool);
}
