//! Samples written in place ([`Collator::write_rows`]): each sample writes its row of the
//! batch's pinned block itself, and the step allocates nothing per sample — counted by a global
//! allocator that counts every allocation in this test binary, in all and on each thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use pinnable::loader::{Collator, FnDataset, Loader};
use pinnable::{DType, PinnedPool, PoolConfig, Tensor};
use pinnable_harness::rng;
use rand::Rng;

/// Counts allocations (and reallocations), then lets the system allocator do them.
struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's allocations: the harness starts the other test's thread (and allocates
    /// for it) while a test runs, so a count of one thread's own work must not see it.
    static ON_THIS_THREAD: Cell<usize> = const { Cell::new(0) };
}

fn counted() {
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    // A const-initialised `Cell` needs no allocation and no destructor; `try_with` only fails
    // while the thread is being torn down, when nothing here is measuring.
    let _ = ON_THIS_THREAD.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every call is forwarded to `System` with the same arguments; counting touches no
// memory the caller sees.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted();
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through `alloc` or `realloc` above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        counted();
        // SAFETY: as `dealloc`, and the caller's contract for `realloc` is passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The counter is global: the tests of this binary run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Allocations by every thread while `f` runs (for work spread over a loader's workers).
fn allocations_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    let r = f();
    (r, ALLOCATIONS.load(Ordering::SeqCst) - before)
}

/// Allocations by this thread alone while `f` runs (for work that stays on it).
fn allocations_here_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = ON_THIS_THREAD.with(Cell::get);
    let r = f();
    (r, ON_THIS_THREAD.with(Cell::get) - before)
}

/// What sample `i` writes at element `k` of its row, under `key`.
fn value(key: u64, i: usize, k: usize) -> u8 {
    (key as usize)
        .wrapping_mul(31)
        .wrapping_add(i * 7919 + k * 13) as u8
}

/// A batch of the samples at `indices` (their dataset indices are the samples), each writing
/// its own `[3, 8, 8]` row; labels from the same samples.
fn batch(key: u64, indices: Vec<usize>, c: &mut Collator) -> pinnable::Result<(Tensor, Tensor)> {
    let labels = c.stack_scalars("labels", indices.iter().map(|&i| i as i64))?;
    let images = c.write_rows(
        "images",
        DType::U8,
        &[3, 8, 8],
        indices,
        move |i, row, _| {
            for (k, v) in row.as_mut_slice::<u8>()?.iter_mut().enumerate() {
                *v = value(key, i, k);
            }
            Ok(())
        },
    )?;
    let mut out = c.finish()?;
    Ok((out.take(images)?, out.take(labels)?))
}

fn check(key: u64, (images, labels): &(Tensor, Tensor)) {
    let labels = labels.to_vec::<i64>().unwrap();
    let images = images.to_vec::<u8>().unwrap();
    assert_eq!(images.len(), labels.len() * 192);
    for (row, &i) in images.chunks(192).zip(&labels) {
        let expect: Vec<u8> = (0..192).map(|k| value(key, i as usize, k)).collect();
        assert_eq!(row, &expect[..], "sample {i}");
    }
}

#[test]
fn writing_rows_in_place_allocates_nothing_per_sample() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut r = rng("writing_rows_in_place_allocates_nothing_per_sample");
    let key: u64 = r.random();
    let pool = PinnedPool::new(PoolConfig::default());
    // Blocks of both sizes are cached first; then a batch of 64 costs what a batch of 4 does.
    let mut count = |n: usize| {
        let indices: Vec<usize> = (0..n).map(|_| r.random_range(0..1_000_000)).collect();
        let mut c = Collator::new(&pool);
        let (b, allocations) = allocations_here_during(|| batch(key, indices, &mut c).unwrap());
        check(key, &b);
        allocations
    };
    for n in [4, 64] {
        count(n);
    }
    let (small, large) = (count(4), count(64));
    assert_eq!(
        small, large,
        "a batch of 64 samples allocated {large} times, one of 4 {small} times: the in-place \
         step must cost the same whatever the batch size"
    );
}

#[test]
fn a_loader_writing_in_place_allocates_per_batch_not_per_sample() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut r = rng("a_loader_writing_in_place_allocates_per_batch_not_per_sample");
    let key: u64 = r.random();
    let batches = 24;
    let run = |batch_size: usize| {
        let samples = batches * batch_size;
        let loader = Loader::builder(FnDataset::new(samples, Ok))
            .batch_size(batch_size)
            .shuffle(key)
            .workers(2)
            .build_with(move |indices, c| batch(key, indices, c))
            .unwrap();
        // One epoch to fill the pool's cache, one measured.
        for b in loader.run_epoch(0) {
            check(key, &b.unwrap());
        }
        let (seen, allocations) = allocations_during(|| {
            loader
                .run_epoch(1)
                .map(|b| b.unwrap().1.numel())
                .sum::<usize>()
        });
        assert_eq!(seen, samples);
        allocations
    };
    let (small, large) = (run(4), run(128));
    let extra_samples = batches * (128 - 4);
    let per_sample = large.saturating_sub(small) as f64 / extra_samples as f64;
    assert!(
        per_sample < 0.05,
        "{batches} batches of 128 samples allocated {large} times, of 4 samples {small} times: \
         {per_sample:.3} allocations per extra sample"
    );
}
