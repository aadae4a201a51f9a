//! What a small move costs the thread that makes it, call by call: the driver calls a move is
//! made of (timed alone on a stream of their own), then our calls at the sizes where the
//! calling thread, not the link, bounds the figure — a token batch of 12×1024 (x, y gathered
//! from u16 windows and widened to i64), and 1000 pinned tensors of 4 KiB in one block. Each
//! figure is the mean of one call repeated `N` times back to back (a thread's steady cost per
//! call), the moves' results kept and dropped after, so the drop is timed on its own.
//!
//! Writes `$PINNABLE_BENCH_OUT/calls.md`. Without a GPU it prints `skipped: …`.

use std::ffi::c_void;
use std::time::Instant;

use cudarc::driver::{DevicePtr, sys};
use pinnable::formats::tokens::{TokenShards, TokenWindows};
use pinnable::{Convert, DType, Device, Gather, Tensor, ToDevice};
use pinnable_harness::bench::{Report, raw_one_copy};
use pinnable_harness::kernels::Kernels;
use pinnable_harness::{cuda_or_skip, random_tensor, rng};

/// Calls a figure averages over.
const N: usize = 400;

/// Mean seconds per call of `f`, run `N` times after `N / 10` warm-ups.
fn per_call(mut f: impl FnMut()) -> f64 {
    for _ in 0..N / 10 {
        f();
    }
    let t = Instant::now();
    for _ in 0..N {
        f();
    }
    t.elapsed().as_secs_f64() / N as f64
}

fn us(s: f64) -> String {
    format!("{:.2} µs", s * 1e6)
}

fn main() {
    let Some(dev) = cuda_or_skip("bench calls") else {
        return;
    };
    let mut rep = Report::default();
    rep.line(&format!(
        "# What a small move costs the calling thread ({dev}), mean of {N} calls in a row\n"
    ));
    driver_calls(&dev, &mut rep);
    token_batch(&dev, &mut rep);
    small_tensors(&dev, &mut rep);
    rep.save("calls.md");
}

fn driver_calls(dev: &Device, rep: &mut Report) {
    let ctx = dev.cuda_context().expect("a CUDA device");
    ctx.bind_to_thread().expect("bind");
    let stream = ctx.new_stream().expect("a stream");
    let pinned = Tensor::empty_pinned(DType::U8, &[4096]).expect("pinned");
    let src = pinned.pinned_block().expect("pinned").as_ptr();
    let dst = stream.alloc_zeros::<u8>(1 << 20).expect("device memory");
    let (dst_ptr, _guard) = dst.device_ptr(&stream);
    let cu = stream.cu_stream();
    rep.line("## Driver calls, alone on a stream of their own\n");
    rep.line("| call | per call |\n| --- | --- |");
    let record = per_call(|| drop(stream.record_event(None).expect("event")));
    rep.line(&format!(
        "| cuEventCreate + cuEventRecord + cuEventDestroy | {} |",
        us(record)
    ));
    let event = stream.record_event(None).expect("event");
    let record_only = per_call(|| event.record(&stream).expect("record"));
    rep.line(&format!("| cuEventRecord | {} |", us(record_only)));
    let query = per_call(|| {
        let _ = event.is_complete();
    });
    rep.line(&format!("| cuEventQuery | {} |", us(query)));
    let wait = per_call(|| stream.wait(&event).expect("wait"));
    rep.line(&format!("| cuStreamWaitEvent | {} |", us(wait)));
    let alloc = per_call(|| {
        // SAFETY: never read; freed at once in stream order.
        drop(unsafe { stream.alloc::<u8>(196_608) }.expect("alloc"))
    });
    rep.line(&format!(
        "| cuMemAllocAsync + cuMemFreeAsync (192 KiB, default pool) | {} |",
        us(alloc)
    ));
    let copy = per_call(|| {
        // SAFETY: 96 bytes of a live pinned block into a live device buffer, in stream order.
        let r = unsafe { sys::cuMemcpyHtoDAsync_v2(dst_ptr, src.cast::<c_void>(), 96, cu) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    });
    rep.line(&format!(
        "| cuMemcpyHtoDAsync, 96 bytes from pinned memory | {} |",
        us(copy)
    ));
    if let Some(k) = Kernels::load(dev) {
        let launch = per_call(|| k.spin(&stream, 0));
        rep.line(&format!(
            "| cuLaunchKernel (an empty kernel) | {} |",
            us(launch)
        ));
    } else {
        rep.line("| cuLaunchKernel | skipped: no bench kernels (PINNABLE_KERNELS_PTX unset) |");
    }
    stream.synchronize().expect("sync");
    let sync = per_call(|| stream.synchronize().expect("sync"));
    rep.line(&format!(
        "| cuStreamSynchronize, nothing queued | {} |",
        us(sync)
    ));
    let round = per_call(|| {
        // SAFETY: as above.
        let r = unsafe { sys::cuMemcpyHtoDAsync_v2(dst_ptr, src.cast::<c_void>(), 96, cu) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        stream.synchronize().expect("sync");
    });
    rep.line(&format!(
        "| a 96-byte copy and its sync (a round trip) | {} |\n",
        us(round)
    ));
}

/// The loader's transfer thread's share of one 12×1024 token batch: the move of x and y, and
/// the drops of the host batch and, later, of the moved one.
fn token_batch(dev: &Device, rep: &mut Report) {
    let mut r = rng("bench calls");
    let tokens = random_tensor(&mut r, DType::U16, &[1 << 22]);
    let dir = std::env::temp_dir().join(format!("pinnable-calls-{}.bin", std::process::id()));
    let bytes: Vec<u8> = tokens
        .to_vec::<u16>()
        .expect("u16")
        .iter()
        .flat_map(|t| t.to_le_bytes())
        .collect();
    std::fs::write(&dir, bytes).expect("write tokens");
    let shards = TokenShards::open([&dir]).expect("read tokens");
    let _ = std::fs::remove_file(&dir);
    let windows = TokenWindows::new(shards, 1024).expect("windows");
    let source = windows.shards().pinned().expect("pinned").clone();
    let (b, t) = (12, 1024);
    let batch = |r: &mut u64| {
        let starts: Vec<usize> = (0..b)
            .map(|_| {
                *r = r
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (*r >> 20) as usize % ((1 << 22) - t - 1)
            })
            .collect();
        // As the token loader's batcher makes them: one table of starts for both.
        let (x, y) = Gather::inputs_and_targets(&source, &starts, t).expect("x, y");
        (
            x.convert(Convert::cast(DType::I64)).expect("x"),
            y.convert(Convert::cast(DType::I64)).expect("y"),
        )
    };
    let mut seed = 7;
    rep.line("## A 12×1024 token batch: x, y gathered from u16 windows, widened to i64\n");
    rep.line("| step | per batch |\n| --- | --- |");
    let build = per_call(|| drop(batch(&mut seed)));
    rep.line(&format!(
        "| make the two gathers (a loader's worker: starts tables in pinned memory) | {} |",
        us(build)
    ));
    let hosts: Vec<_> = (0..N + N / 10).map(|_| batch(&mut seed)).collect();
    let mut it = hosts.iter();
    let mut moved = Vec::with_capacity(N + N / 10);
    let call = per_call(|| {
        moved.push(
            it.next()
                .expect("enough")
                .to_device(dev, true)
                .expect("move"),
        );
    });
    rep.line(&format!("| to_device(true), the call | {} |", us(call)));
    dev.synchronize().expect("sync");
    let t0 = Instant::now();
    drop(hosts);
    let host_drop = t0.elapsed().as_secs_f64() / (N + N / 10) as f64;
    rep.line(&format!("| drop the host batch | {} |", us(host_drop)));
    let t0 = Instant::now();
    drop(moved);
    let moved_drop = t0.elapsed().as_secs_f64() / (N + N / 10) as f64;
    rep.line(&format!("| drop the moved batch | {} |", us(moved_drop)));
    let with_sync = per_call(|| {
        let m = batch(&mut seed).to_device(dev, true).expect("move");
        dev.synchronize().expect("sync");
        drop(m);
    });
    rep.line(&format!(
        "| make, move, sync, drop, one after another | {} |",
        us(with_sync)
    ));
    let raw = raw_one_copy(dev, 2 * b * (t + 1));
    rep.line(&format!(
        "| raw: one copy of the u16 windows' bytes + sync | {} |\n",
        us(raw)
    ));
}

/// 1000 pinned tensors of 4 KiB in one block (`pin_memory` of a `Vec<Tensor>`).
fn small_tensors(dev: &Device, rep: &mut Report) {
    let mut r = rng("bench calls small");
    let small: Vec<Tensor> = (0..1000)
        .map(|_| random_tensor(&mut r, DType::F32, &[1024]))
        .collect();
    let pinned = pinnable::Pinnable::pin_memory(&small).expect("pin");
    rep.line("## 1000 pinned tensors of 4 KiB in one block\n");
    rep.line("| step | per batch |\n| --- | --- |");
    let clone = per_call(|| drop(pinned.clone()));
    rep.line(&format!(
        "| clone the Vec<Tensor> and drop it (a walk's floor) | {} |",
        us(clone)
    ));
    let mut moved = Vec::with_capacity(N + N / 10);
    let call = per_call(|| moved.push(pinned.to_device(dev, true).expect("move")));
    rep.line(&format!("| to_device(true), the call | {} |", us(call)));
    dev.synchronize().expect("sync");
    let t0 = Instant::now();
    drop(moved);
    let moved_drop = t0.elapsed().as_secs_f64() / (N + N / 10) as f64;
    rep.line(&format!("| drop the moved batch | {} |", us(moved_drop)));
    let with_sync = per_call(|| {
        let m = pinned.to_device(dev, true).expect("move");
        dev.synchronize().expect("sync");
        drop(m);
    });
    rep.line(&format!("| move, sync, drop | {} |", us(with_sync)));
    let raw = raw_one_copy(dev, 1000 << 12);
    rep.line(&format!("| raw: one copy of 4 MB + sync | {} |\n", us(raw)));
}
