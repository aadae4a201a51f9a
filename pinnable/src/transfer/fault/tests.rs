//! The fault itself (on any machine), then every error path of a gather launch and of a mixed
//! move, failing each enqueue in turn (on a GPU; skipped without one).

use std::sync::{Arc, Condvar, Mutex};

use cudarc::driver::sys;

use super::{Faults, enqueue, fail_nth};
use crate::alloc::{PinnedBlock, PinnedPool, PoolConfig};
use crate::convert::Convert;
use crate::cuda::{CudaDevice, cuda_or_skip};
use crate::dtype::DType;
use crate::error::Error;
use crate::loader::SplitMix64;
use crate::tensor::{Memory, Tensor};
use crate::transfer::{MoveContext, ToDevice};
use crate::{Device, Gather, GatherRoute};

/// Fresh random data, seeded from the clock (the seed printed); under Miri, whose isolation has
/// no clock, from a fixed seed.
fn rng(test: &str) -> SplitMix64 {
    if cfg!(miri) {
        SplitMix64::new(0x9e37_79b9_7f4a_7c15)
    } else {
        SplitMix64::for_test(test)
    }
}

#[test]
fn only_the_armed_enqueue_fails_and_other_threads_carry_the_plan() {
    let mut r = rng("fault plan");
    let k = 1 + (r.next_u64() % 20) as usize;
    let armed = fail_nth(k);
    let carried = Faults::current();
    let outcomes: Vec<bool> = (1..=k + 5)
        .map(|i| {
            // Every other enqueue made by another thread, as the copy threads do.
            if i % 2 == 0 {
                let f = carried.clone();
                std::thread::spawn(move || f.enqueue("cuMemcpyHtoDAsync").is_ok())
                    .join()
                    .unwrap()
            } else {
                enqueue("cuLaunchKernel").is_ok()
            }
        })
        .collect();
    let failed: Vec<usize> = (1..=k + 5).filter(|&i| !outcomes[i - 1]).collect();
    assert_eq!(failed, [k]);
    assert!(armed.fired());
    assert_eq!(armed.seen(), k + 5);
    // A thread that never armed one counts nothing and never fails.
    let other = std::thread::spawn(move || (0..k + 5).all(|_| enqueue("cuLaunchKernel").is_ok()));
    assert!(other.join().unwrap());
    drop(armed);
    assert!((0..k + 5).all(|_| enqueue("cuLaunchKernel").is_ok()));
}

/// Taken for the whole of each test that holds the device's copy stream with a [`Gate`]: two
/// such tests at once, their gates and moves on the one copy stream, now and then never
/// finished (H100, about one run of the library's tests in three).
static HOLDS_THE_COPY_STREAM: Mutex<()> = Mutex::new(());

fn hold_the_copy_stream_alone() -> std::sync::MutexGuard<'static, ()> {
    HOLDS_THE_COPY_STREAM
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Holds the copy stream: nothing enqueued after it runs until the gate opens (on drop, also
/// when an assertion fails), so a fence found complete meant no fence at all.
struct Gate {
    open: Mutex<bool>,
    wake: Condvar,
}

struct Closed(Arc<Gate>);

impl Gate {
    fn close(dev: &CudaDevice) -> Closed {
        dev.ctx.bind_to_thread().expect("context");
        let gate = Arc::new(Gate {
            open: Mutex::new(false),
            wake: Condvar::new(),
        });
        let raw = Arc::into_raw(gate.clone());
        // SAFETY: the callback takes over the reference `raw` holds and calls no CUDA
        // function; the stream is live.
        let r = unsafe {
            sys::cuLaunchHostFunc(dev.copy_stream.cu_stream(), Some(wait_for_gate), raw as _)
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: the callback was not enqueued: the reference is still ours.
            drop(unsafe { Arc::from_raw(raw) });
            panic!("cuLaunchHostFunc: {}", r as u32);
        }
        Closed(gate)
    }
}

impl Drop for Closed {
    fn drop(&mut self) {
        *self.0.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.0.wake.notify_all();
    }
}

/// Runs on the driver's callback thread: waits for the gate to open.
unsafe extern "C" fn wait_for_gate(data: *mut std::ffi::c_void) {
    // SAFETY: `data` is the reference `Gate::close` gave up, handed over once.
    let gate = unsafe { Arc::from_raw(data as *const Gate) };
    let mut open = gate.open.lock().unwrap_or_else(|e| e.into_inner());
    while !*open {
        open = gate.wake.wait(open).unwrap_or_else(|e| e.into_inner());
    }
}

/// The pinned blocks a move reads: `early` of them (the first) by the copies it starts before
/// its second walk, which are its first `first_launch` enqueues; the rest only by later ones.
struct Reads {
    blocks: Vec<Arc<PinnedBlock>>,
    first_launch: usize,
    early: usize,
}

impl Reads {
    /// The blocks that work enqueued before the `k`-th enqueue may read.
    fn before(&self, k: usize) -> &[Arc<PinnedBlock>] {
        match k <= self.first_launch {
            true => &self.blocks[..self.early],
            false => &self.blocks,
        }
    }
}

/// Moves `batch` with its `k`-th enqueue failing, the copy stream held, and checks what the
/// error path left: every pinned block the enqueued work may read fenced, and nothing the move
/// took from its own pool idle before the work ran; then, once the stream runs, everything
/// back. `None` when the move made fewer than `k` enqueues (and succeeded).
fn fail_at<T: ToDevice>(device: &Device, batch: &T, reads: &Reads, k: usize) -> Option<T> {
    let read = reads.before(k);
    let dev = device.cuda_device("test").unwrap().clone();
    let pool = PinnedPool::new(PoolConfig::default());
    let gate = Gate::close(&dev);
    let armed = fail_nth(k);
    let moved = MoveContext::run_ready(
        device,
        true,
        &pool,
        |cx| batch.measure_with(cx),
        |cx| batch.to_device_with(cx),
    );
    let fired = armed.fired();
    drop(armed);
    if !fired {
        drop(gate);
        return Some(moved.expect("no enqueue failed").0);
    }
    let e = moved
        .err()
        .expect("the k-th enqueue failed: the move must fail");
    assert!(
        matches!(e, Error::Driver { .. }) && e.to_string().contains("CUDA_ERROR_LAUNCH_OUT"),
        "k={k}: {e}"
    );
    for (i, b) in read.iter().enumerate() {
        assert!(
            b.pending_uses() >= 1,
            "k={k}: pinned block {i} read by the move has no pending fence"
        );
    }
    let s = pool.stats();
    assert_eq!(s.in_use_bytes, 0, "k={k}: {s:?}");
    assert_eq!(
        s.cached_bytes, 0,
        "k={k}: a block of the move came back idle while its copies wait: {s:?}"
    );
    assert!(s.pending_blocks >= 1, "k={k}: {s:?}");
    drop(gate);
    dev.copy_stream.synchronize().expect("copy stream");
    let s = pool.stats();
    assert_eq!((s.in_use_bytes, s.pending_bytes), (0, 0), "k={k}: {s:?}");
    assert_eq!(s.cached_bytes, s.reserved_bytes, "k={k}: {s:?}");
    assert!(reads.blocks.iter().all(|b| b.pending_uses() == 0), "k={k}");
    None
}

/// Fails each enqueue of `batch`'s move in turn, then moves it whole; at least `min` enqueues.
fn every_enqueue_fails_in_turn<T: ToDevice>(
    device: &Device,
    batch: &T,
    reads: &Reads,
    min: usize,
) -> T {
    // Moved once first, with nothing held: every kernel it runs is loaded before the stream is
    // held (loading one lazily may wait for the whole context, the held stream included).
    drop(batch.to_device(device, false).expect("the batch moves"));
    for k in 1..=256 {
        if let Some(moved) = fail_at(device, batch, reads, k) {
            assert!(k > min, "only {} enqueues; expected more than {min}", k - 1);
            println!("{} enqueues, each failed in turn", k - 1);
            return moved;
        }
    }
    panic!("more than 256 enqueues")
}

fn pinned_block(t: &Tensor) -> Arc<PinnedBlock> {
    match t.source().memory {
        Memory::Pinned(b) => b.clone(),
        _ => panic!("a pinned source"),
    }
}

fn random_rows(r: &mut SplitMix64, n: usize, of: usize) -> Vec<usize> {
    (0..n)
        .map(|_| (r.next_u64() % of as u64) as usize)
        .collect()
}

#[test]
fn a_gather_launch_failing_at_any_enqueue_keeps_every_block_it_reads_fenced() {
    let _alone = hold_the_copy_stream_alone();
    let test = "a_gather_launch_failing_at_any_enqueue_keeps_every_block_it_reads_fenced";
    let Some(device) = cuda_or_skip(test) else {
        return;
    };
    crate::cuda::gather_kernels(&device).expect("the gather kernels load on a GPU");
    let mut r = rng(test);
    let salt = r.next_u64();
    let len = 3000 + (r.next_u64() % 1000) as usize;
    let images = Tensor::pinned_from_fn(&[len, 3, 4, 4], |i| (i as u64 ^ salt) as u8).unwrap();
    let labels = Tensor::pinned_from_fn(&[len], |i| (i as u64 ^ salt) as i64).unwrap();
    let tokens = Tensor::pinned_from_fn(&[1 << 16], |i| (i as u64 ^ salt) as u16).unwrap();
    // More than 4096 rows: tables copied to the device; the windows' table is read in place.
    let count = 4100 + (r.next_u64() % 500) as usize;
    let rows = random_rows(&mut r, count, len);
    let starts = random_rows(&mut r, 64, (1 << 16) - 40);
    let normalize = Convert::normalize(DType::F32, &[0.4, 0.5, 0.6], &[0.2, 0.3, 0.25]).unwrap();
    let (x, y) = Gather::inputs_and_targets(&tokens, &starts, 32).unwrap();
    let batch = (
        Gather::rows(&images, rows.iter().copied())
            .unwrap()
            .convert(normalize)
            .unwrap()
            .route(GatherRoute::Kernel),
        Gather::rows(&labels, rows.iter().copied())
            .unwrap()
            .route(GatherRoute::Kernel),
        x.convert(Convert::cast(DType::I64))
            .unwrap()
            .route(GatherRoute::Kernel),
        y.convert(Convert::cast(DType::I64))
            .unwrap()
            .route(GatherRoute::Kernel),
    );
    let mut read = vec![
        pinned_block(&images),
        pinned_block(&labels),
        pinned_block(&tokens),
    ];
    read.extend(
        [&batch.0, &batch.1, &batch.2]
            .iter()
            .filter_map(|g| g.start_block()),
    );
    assert_eq!(read.len(), 6, "three tables of starts in pinned blocks");
    // Nothing moves before the second walk; then the table's host part, two tables of
    // starts and three kernels (fewer where jobs merge).
    let reads = Reads {
        blocks: read,
        first_launch: 0,
        early: 0,
    };
    let moved = every_enqueue_fails_in_turn(&device, &batch, &reads, 3);
    let got = moved.1.tensor().unwrap().to_cpu(false).unwrap();
    let want: Vec<i64> = rows.iter().map(|&i| (i as u64 ^ salt) as i64).collect();
    assert_eq!(got.to_vec::<i64>().unwrap(), want);
    let got = moved.3.tensor().unwrap().to_cpu(false).unwrap();
    let want: Vec<i64> = starts
        .iter()
        .flat_map(|&s| (s + 1..s + 33).map(|i| (i as u64 ^ salt) as u16 as i64))
        .collect();
    assert_eq!(got.to_vec::<i64>().unwrap(), want);
}

#[test]
fn a_mixed_move_failing_at_any_enqueue_keeps_every_block_it_reads_fenced() {
    let _alone = hold_the_copy_stream_alone();
    let test = "a_mixed_move_failing_at_any_enqueue_keeps_every_block_it_reads_fenced";
    let Some(device) = cuda_or_skip(test) else {
        return;
    };
    crate::cuda::gather_kernels(&device).expect("the gather kernels load on a GPU");
    let mut r = rng(test);
    let salt = r.next_u64();
    let value = |i: usize| (i as u64 ^ salt) as u8;
    let len = 256 + (r.next_u64() % 256) as usize;
    // Pinned and read in place by the copy engine.
    let whole = Tensor::pinned_from_fn(&[1 << 20], |i| value(i) as f32).unwrap();
    // Pageable: staged through the pool by the copy threads, sent in several copies.
    let pageable: Vec<u8> = (0..6 << 20).map(value).collect();
    let pageable = Tensor::from_vec(pageable, &[6 << 20]).unwrap();
    // Rows of 48 KiB by the copy engine, of 48 B by the kernels (converted), and pageable
    // rows staged, then converted on the device.
    let big = Tensor::pinned_from_fn(&[len, 3, 64, 64], |i| value(i) as u32).unwrap();
    let small = Tensor::pinned_from_fn(&[len, 3, 4, 4], value).unwrap();
    let host_rows: Vec<u8> = (0..len * 48).map(value).collect();
    let host_rows = Tensor::from_vec(host_rows, &[len, 3, 4, 4]).unwrap();
    let rows = random_rows(&mut r, 64, len);
    let normalize = Convert::normalize(DType::F32, &[0.4, 0.5, 0.6], &[0.2, 0.3, 0.25]).unwrap();
    let batch = (
        whole.clone(),
        pageable,
        Gather::rows(&big, rows.iter().copied())
            .unwrap()
            .route(GatherRoute::Direct),
        Gather::rows(&small, rows.iter().copied())
            .unwrap()
            .convert(normalize.clone())
            .unwrap()
            .route(GatherRoute::Kernel),
        Gather::rows(&host_rows, rows.iter().copied())
            .unwrap()
            .convert(normalize)
            .unwrap(),
    );
    let mut read = vec![
        pinned_block(&whole),
        pinned_block(&big),
        pinned_block(&small),
    ];
    read.extend(batch.3.start_block());
    // The pinned tensor is copied whole (one enqueue) as soon as the batch is reserved; the
    // rest once the second walk has noted it all.
    let reads = Reads {
        blocks: read,
        first_launch: 1,
        early: 1,
    };
    let moved = every_enqueue_fails_in_turn(&device, &batch, &reads, 4);
    let got = moved.2.tensor().unwrap().to_cpu(false).unwrap();
    let want: Vec<u32> = rows
        .iter()
        .flat_map(|&row| (row * 3 * 64 * 64..(row + 1) * 3 * 64 * 64).map(|i| value(i) as u32))
        .collect();
    assert_eq!(got.to_vec::<u32>().unwrap(), want);
    let got = moved.1.to_cpu(false).unwrap().to_vec::<u8>().unwrap();
    assert!(got.iter().enumerate().all(|(i, &v)| v == value(i)));
}

/// A field whose move panics in the second walk, after the first copies have started.
struct PanicsWhenBuilt;

impl ToDevice for PanicsWhenBuilt {
    fn to_device_with(&self, _: &mut MoveContext<'_>) -> crate::Result<Self> {
        panic!("a user's to_device_with panicked")
    }

    fn measure_with(&self, _: &mut MoveContext<'_>) -> crate::Result<()> {
        Ok(())
    }
}

#[test]
fn a_panic_while_the_batch_is_built_still_fences_the_copies_already_started() {
    let _alone = hold_the_copy_stream_alone();
    let test = "a_panic_while_the_batch_is_built_still_fences_the_copies_already_started";
    let Some(device) = cuda_or_skip(test) else {
        return;
    };
    let dev = device.cuda_device("test").unwrap().clone();
    let mut r = rng(test);
    let salt = r.next_u64();
    let n = (1 << 16) + (r.next_u64() % (1 << 16)) as usize;
    let pinned = Tensor::pinned_from_fn(&[n], |i| i as u64 ^ salt).unwrap();
    let block = pinned_block(&pinned);
    let pool = PinnedPool::new(PoolConfig::default());
    let gate = Gate::close(&dev);
    let batch = (pinned.clone(), PanicsWhenBuilt);
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        MoveContext::run_ready(
            &device,
            true,
            &pool,
            |cx| batch.measure_with(cx),
            |cx| batch.to_device_with(cx),
        )
        .map(drop)
    }));
    assert!(caught.is_err(), "the panic goes on to the caller");
    // The pinned tensor's copy was started before the panic: its block waits for it.
    assert!(
        block.pending_uses() >= 1,
        "the copy started first is not fenced"
    );
    drop(gate);
    dev.copy_stream.synchronize().expect("copy stream");
    assert_eq!(block.pending_uses(), 0);
    assert_eq!(pool.stats().in_use_bytes, 0);
}
