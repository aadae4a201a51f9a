//! Images decoded for the device ([`ImageBatcher::on_device`]): after warm-up, a batch costs the
//! same allocations beyond the decoder's own whatever its size — nothing per sample — counted
//! by a global allocator that counts every allocation in this test binary.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use pinnable::image::{Decoder, ImageBatcher, ImageFolder, Transform};
use pinnable::loader::{Batcher, Collator, Dataset};
use pinnable::{PinnedPool, PoolConfig};
use pinnable_harness::images::{self, Jpeg};
use pinnable_harness::rng;
use rand::Rng;

/// Counts allocations (and reallocations), then lets the system allocator do them.
struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to `System` with the same arguments; counting touches no
// memory the caller sees.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through `alloc` or `realloc` above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as `dealloc`, and the caller's contract for `realloc` is passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    let r = f();
    (r, ALLOCATIONS.load(Ordering::SeqCst) - before)
}

#[test]
fn decoding_for_the_device_allocates_nothing_per_sample_beyond_the_decoder() {
    let mut r = rng("decoding_for_the_device_allocates_nothing_per_sample_beyond_the_decoder");
    let dir = std::env::temp_dir().join(format!("pinnable-ragged-alloc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let files: Vec<_> = (0..64)
        .map(|i| {
            let (w, h) = (r.random_range(20..90), r.random_range(20..90));
            let rgb = images::picture(&mut r, w, h, 6.0);
            let path = dir.join(format!("{i:02}.jpg"));
            std::fs::write(&path, images::jpeg(&rgb, w, h, 90, Jpeg::Baseline, None)).unwrap();
            (path, i as i64)
        })
        .collect();
    let folder = ImageFolder::from_list(files.clone())
        .transform(Transform::random_resized_crop(32).flip(0.5));
    let pool = PinnedPool::new(PoolConfig::default());
    // What decoding the same files costs alone, with one warm decoder and file buffer.
    let mut decoder = Decoder::new();
    let mut decode_alone = |n: usize| {
        allocations_during(|| {
            for (path, _) in &files[..n] {
                let bytes = std::fs::read(path).unwrap();
                decoder.decode(&bytes, Path::new(path)).unwrap();
                drop(bytes);
            }
        })
        .1 - n // the `fs::read` buffers
    };
    let batch = |n: usize| {
        let samples: Vec<_> = (0..n).map(|i| folder.get(i).unwrap()).collect();
        let mut c = Collator::new(&pool);
        let (b, allocations) =
            allocations_during(|| ImageBatcher::on_device().batch(samples, &mut c).unwrap());
        assert_eq!(b.0.len(), n);
        allocations
    };
    for n in [4, 64] {
        batch(n);
        batch(n);
        decode_alone(n);
    }
    let (small, large) = (batch(4), batch(64));
    let (small_decode, large_decode) = (decode_alone(4), decode_alone(64));
    let (small_own, large_own) = (
        small.saturating_sub(small_decode),
        large.saturating_sub(large_decode),
    );
    assert!(
        large_own <= small_own,
        "beyond the decoder's own ({small_decode} and {large_decode}), a batch of 64 allocated \
         {large_own} times, one of 4 {small_own} times: the step must cost the same whatever \
         the batch size"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
