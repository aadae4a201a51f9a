//! One pinned block per batch: moves of pinned batches against the raw one-copy ceiling and
//! PyTorch, many small tensors, the cost of pinning per tensor, and a batch built fresh in
//! pageable memory each step against one built in place in a reused pinned block.
//!
//! PyTorch's figures come from `$PINNABLE_BENCH_OUT/torch.txt` (`bench/torch_baseline.py`, same
//! run). Prints a markdown table and writes it to `$PINNABLE_BENCH_OUT/batch.md`.
//!
//! Nothing here is a stream of batches: each figure is one call (or one step of build, move
//! and sync, done before the next starts) repeated, so medians of repeats are fair; no repeat
//! waits on another.

use std::time::Instant;

use pinnable::{BatchLayout, DType, Device, Pinnable, PinnedPool, Tensor, ToDevice};
use pinnable_harness::bench::{Table, batch_64x1mib, median, raw_one_copy, time, torch_rows};
use pinnable_harness::{cuda_or_skip, random_tensor, rng};

fn sync(t: &Tensor) {
    if let Some(e) = t.ready_event() {
        e.synchronize().unwrap();
    }
}

/// Minor page faults of this process so far.
fn minor_faults() -> i64 {
    // SAFETY: getrusage writes one plain struct.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u.ru_minflt
    }
}

/// Median seconds the `to_device(true)` call takes to return (the CPU's share: walks,
/// placement, issuing), with the copy's sync and the result's drop outside the timing.
fn call_only<T: ToDevice>(dev: &Device, batch: &T, first: impl Fn(&T) -> &Tensor) -> f64 {
    let mut v = Vec::new();
    for i in 0..33 {
        let s = Instant::now();
        let on = batch.to_device(dev, true).unwrap();
        let c = s.elapsed().as_secs_f64();
        sync(first(&on));
        if i >= 3 {
            v.push(c);
        }
    }
    median(v)
}

/// The 38.5 MB step: 64 × 3×224×224 f32 images + 64 i64 labels.
const B: usize = 64;
const IMAGE: usize = 3 * 224 * 224;

/// Median seconds of each phase of `steps` steps: (build, move, drop), and page faults per step.
fn phases(steps: usize, mut step: impl FnMut(&mut [f64; 3])) -> ([f64; 3], i64) {
    let mut all = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..3 {
        step(&mut [0.0; 3]);
    }
    let faults = minor_faults();
    for _ in 0..steps {
        let mut t = [0.0; 3];
        step(&mut t);
        for (a, v) in all.iter_mut().zip(t) {
            a.push(v);
        }
    }
    let per_step = (minor_faults() - faults) / steps as i64;
    (all.map(median), per_step)
}

fn main() {
    let Some(dev) = cuda_or_skip("bench batch") else {
        return;
    };
    let mut r = rng("bench batch");
    let torch = torch_rows("torch.txt");
    let mut t = Table::new(&format!(
        "# one block per batch\n\ndevice: {} ({}), copy threads: {}\n",
        dev.name(),
        dev.pcie_bus_id().unwrap_or_default(),
        pinnable::copy_threads()
    ));

    // --- An already-pinned 64 × 1 MiB + labels batch.
    let batch = batch_64x1mib(&mut r);
    let bytes: usize = batch.values().map(Tensor::nbytes).sum();
    let pinned = batch.pin_memory().unwrap();
    let raw = raw_one_copy(&dev, bytes);
    t.row(
        "raw: one cuMemcpyHtoDAsync of the batch's bytes + sync",
        raw,
        bytes,
        None,
    );
    let ours = time(5, 30, || {
        let on = pinned.to_device(&dev, true).unwrap();
        sync(on.values().next().unwrap());
    });
    let call = call_only(&dev, &pinned, |b| b.values().next().unwrap());
    t.note(&format!(
        "| ours: the to_device(true) call alone (CPU cost) | {:.3} ms | | | |\n",
        call * 1e3
    ));
    t.row(
        "ours: pinned 64 × 1 MiB + labels, to_device(true) + sync",
        ours,
        bytes,
        Some(("raw one copy", raw)),
    );
    if let Some(&th) = torch.get("torch_to_device_pinned_batch") {
        t.row(
            "ours: the same",
            ours,
            bytes,
            Some(("torch .to(cuda, non_blocking) + sync", th)),
        );
    }

    // --- 1000 × 4 KiB, pinned and pageable.
    let small: Vec<Tensor> = (0..1000)
        .map(|_| random_tensor(&mut r, DType::F32, &[1024]))
        .collect();
    let small_bytes = 1000 * 4096;
    let small_pinned = small.pin_memory().unwrap();
    let raw_small = raw_one_copy(&dev, small_bytes);
    t.row(
        "raw: one copy of 1000 × 4 KiB's bytes + sync",
        raw_small,
        small_bytes,
        None,
    );
    for (what, src, key) in [
        ("pinned", &small_pinned, "torch_1000x4k_pinned"),
        ("pageable", &small, "torch_1000x4k_pageable"),
    ] {
        let ours = time(5, 30, || sync(&src.to_device(&dev, true).unwrap()[0]));
        let call = call_only(&dev, src, |b| &b[0]);
        t.note(&format!(
            "| ours: 1000 × 4 KiB {what}, the to_device(true) call alone (CPU cost) | {:.3} ms | | | |\n",
            call * 1e3
        ));
        let name = format!("ours: 1000 × 4 KiB {what}, to_device(true) + sync");
        t.row(&name, ours, small_bytes, Some(("raw one copy", raw_small)));
        if let Some(&th) = torch.get(key) {
            t.row(&name, ours, small_bytes, Some(("torch, same", th)));
        }
    }
    let pin_small = time(5, 30, || drop(small.pin_memory().unwrap()));
    t.row(
        &format!(
            "ours: pin_memory of 1000 × 4 KiB ({:.2} µs per tensor)",
            pin_small * 1e3
        ),
        pin_small,
        small_bytes,
        torch
            .get("torch_pin_1000x4k")
            .map(|&v| ("torch pin_memory, same", v)),
    );

    // --- 38.5 MB: built fresh in pageable memory each step, or in place in pinned memory.
    let images: Vec<f32> = (0..B * IMAGE).map(|i| (i % 977) as f32).collect();
    let labels: Vec<i64> = (0..B as i64).collect();
    let step_bytes = B * IMAGE * 4 + B * 8;
    let move_pageable = |x: &Tensor, y: &Tensor| {
        let on = vec![x.clone(), y.clone()].to_device(&dev, true).unwrap();
        sync(&on[0]);
    };
    let (fresh, fresh_faults) = phases(30, |ph| {
        let s = Instant::now();
        let x = Tensor::from_vec(images.clone(), &[B, 3, 224, 224]).unwrap();
        let y = Tensor::from_vec(labels.clone(), &[B]).unwrap();
        ph[0] = s.elapsed().as_secs_f64();
        let s = Instant::now();
        move_pageable(&x, &y);
        ph[1] = s.elapsed().as_secs_f64();
        let s = Instant::now();
        drop((x, y));
        ph[2] = s.elapsed().as_secs_f64();
    });
    let mut xr = Tensor::from_vec(images.clone(), &[B, 3, 224, 224]).unwrap();
    let mut yr = Tensor::from_vec(labels.clone(), &[B]).unwrap();
    let (reused, reused_faults) = phases(30, |ph| {
        let s = Instant::now();
        xr.as_mut_slice::<f32>().unwrap().copy_from_slice(&images);
        yr.as_mut_slice::<i64>().unwrap().copy_from_slice(&labels);
        ph[0] = s.elapsed().as_secs_f64();
        let s = Instant::now();
        move_pageable(&xr, &yr);
        ph[1] = s.elapsed().as_secs_f64();
    });
    let pool = PinnedPool::global();
    let (in_place, in_place_faults) = phases(30, |ph| {
        let s = Instant::now();
        let mut layout = BatchLayout::new();
        let xs = layout.push(DType::F32, &[B, 3, 224, 224]).unwrap();
        let ys = layout.push(DType::I64, &[B]).unwrap();
        let mut b = layout.allocate_in(pool).unwrap();
        b.view_mut(xs).copy_from_slice(&images).unwrap();
        b.view_mut(ys).copy_from_slice(&labels).unwrap();
        let tensors = b.finish();
        ph[0] = s.elapsed().as_secs_f64();
        let s = Instant::now();
        let on = tensors.to_device(&dev, true).unwrap();
        sync(&on[0]);
        ph[1] = s.elapsed().as_secs_f64();
        let s = Instant::now();
        drop((tensors, on));
        ph[2] = s.elapsed().as_secs_f64();
    });
    for (what, [build, mv, drop_t], faults) in [
        ("fresh pageable Vec each step (before)", fresh, fresh_faults),
        (
            "the same pageable Vec rewritten each step",
            reused,
            reused_faults,
        ),
        (
            "built in place in a reused pinned block (after)",
            in_place,
            in_place_faults,
        ),
    ] {
        t.row(
            &format!("38.5 MB step, {what}: move only"),
            mv,
            step_bytes,
            None,
        );
        t.row(
            &format!(
                "38.5 MB step, {what}: build {:.3} + move {:.3} + drop {:.3} ms, {faults} page faults",
                build * 1e3,
                mv * 1e3,
                drop_t * 1e3
            ),
            build + mv + drop_t,
            step_bytes,
            Some(("fresh pageable step", fresh.iter().sum())),
        );
    }

    let stats = PinnedPool::global().stats();
    t.note(&format!("\npinned pool after the run:\n\n{stats}\n"));
    t.save("batch.md");
}
