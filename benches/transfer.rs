//! Host-to-device and back: our path against the raw driver ceiling and against PyTorch on the
//! same GPU (read from `$PINNABLE_BENCH_OUT/torch.txt`, written by `bench/torch_baseline.py` in
//! the same run). Prints a markdown table and writes it to `$PINNABLE_BENCH_OUT/transfer.md`.

use std::collections::HashMap;

use cudarc::driver::{result, sys};
use pinnable::{DType, Pinnable, PinnedPool, Tensor, ToDevice};
use pinnable_harness::bench::{Table, batch_64x1mib, check, event_time, time, torch_rows};
use pinnable_harness::{cuda_or_skip, random_tensor, rng};

const MIB: usize = 1 << 20;

fn main() {
    let Some(dev) = cuda_or_skip("bench transfer") else {
        return;
    };
    let mut r = rng("bench transfer");
    let torch = torch_rows("torch.txt");
    let stream = dev.copy_stream().unwrap().clone();
    let ctx = dev.cuda_context().unwrap().clone();
    ctx.bind_to_thread().unwrap();

    let mut t = Table::new(&format!(
        "# transfer bench\n\ndevice: {} ({}), copy threads: {}\n",
        dev.name(),
        dev.pcie_bus_id().unwrap_or_default(),
        pinnable::copy_threads()
    ));

    // --- 256 MiB from pinned memory: the raw ceiling vs ours.
    let n = 256 * MIB;
    // SAFETY: plain allocations of n bytes, freed at the end of main.
    let raw_host = unsafe { result::malloc_host(n, 0) }.unwrap() as *mut u8;
    // SAFETY: the block is n bytes long.
    unsafe { std::ptr::write_bytes(raw_host, 7, n) };
    // SAFETY: a device allocation of n bytes.
    let raw_dev = unsafe { result::malloc_sync(n) }.unwrap();
    let raw_h2d = event_time(&stream, 20, || {
        // SAFETY: both buffers are n bytes and live.
        check(unsafe {
            sys::cuMemcpyHtoDAsync_v2(raw_dev, raw_host.cast(), n, stream.cu_stream())
        });
    });
    t.row(
        "raw cuMemcpyHtoDAsync, 256 MiB pinned (ceiling)",
        raw_h2d,
        n,
        None,
    );

    let big = random_tensor(&mut r, DType::F32, &[n / 4]);
    let big_pinned = big.pin_memory().unwrap();
    let ours_h2d = time(3, 20, || {
        let on = big_pinned.to_device(&dev, true).unwrap();
        on.ready_event().unwrap().synchronize().unwrap();
    });
    t.row(
        "ours to_device, 256 MiB pinned (alloc + copy + sync)",
        ours_h2d,
        n,
        Some(("raw ceiling", raw_h2d)),
    );
    if let Some(&th) = torch.get("torch_h2d_256mib_pinned") {
        t.row(
            "ours to_device, 256 MiB pinned",
            ours_h2d,
            n,
            Some(("torch copy_ pinned", th)),
        );
    }

    let ours_pageable = time(3, 20, || {
        let on = big.to_device(&dev, true).unwrap();
        on.ready_event().unwrap().synchronize().unwrap();
    });
    let raw_pageable = big.as_slice::<f32>().unwrap().as_ptr();
    let raw_pageable_t = time(2, 10, || {
        // SAFETY: the source is n live bytes, the destination n bytes.
        check(unsafe { sys::cuMemcpyHtoD_v2(raw_dev, raw_pageable.cast(), n) });
    });
    t.row(
        "raw cuMemcpyHtoD, 256 MiB pageable",
        raw_pageable_t,
        n,
        None,
    );
    t.row(
        "ours to_device, 256 MiB pageable (staged)",
        ours_pageable,
        n,
        Some(("raw pageable", raw_pageable_t)),
    );
    if let Some(&th) = torch.get("torch_h2d_256mib_pageable") {
        t.row(
            "ours to_device, 256 MiB pageable (staged)",
            ours_pageable,
            n,
            Some(("torch copy_ pageable", th)),
        );
    }

    // --- The batch: 64 x 1 MiB f32 + i64 labels.
    let batch = batch_64x1mib(&mut r);
    let batch_bytes: usize = batch.values().map(Tensor::nbytes).sum();

    let ours_pin = time(5, 30, || drop(batch.pin_memory().unwrap()));
    t.row(
        "ours pin_memory, 64×1 MiB + labels (warm)",
        ours_pin,
        batch_bytes,
        torch
            .get("torch_pin_batch")
            .map(|&v| ("torch pin_memory", v)),
    );
    let pinned = batch.pin_memory().unwrap();
    let sync = |b: &HashMap<String, Tensor>| {
        b.values()
            .next()
            .unwrap()
            .ready_event()
            .unwrap()
            .synchronize()
            .unwrap()
    };
    let ours_move = time(5, 30, || sync(&pinned.to_device(&dev, true).unwrap()));
    t.row(
        "ours to_device, pinned batch (+ sync)",
        ours_move,
        batch_bytes,
        torch
            .get("torch_to_device_pinned_batch")
            .map(|&v| ("torch .to(cuda, non_blocking)", v)),
    );
    let ours_e2e = time(5, 30, || sync(&batch.to_device(&dev, true).unwrap()));
    t.row(
        "ours to_device, pageable batch end to end (staged + copy + sync)",
        ours_e2e,
        batch_bytes,
        torch
            .get("torch_end_to_end_batch")
            .map(|&v| ("torch pin_memory + .to + sync", v)),
    );
    let ours_e2e_pin = time(5, 30, || {
        sync(&batch.pin_memory().unwrap().to_device(&dev, true).unwrap())
    });
    t.row(
        "ours pin_memory then to_device, pageable batch end to end",
        ours_e2e_pin,
        batch_bytes,
        torch
            .get("torch_end_to_end_batch")
            .map(|&v| ("torch pin_memory + .to + sync", v)),
    );

    // --- 256 MiB device to host.
    let on = big_pinned.to_device(&dev, false).unwrap();
    let raw_d2h = event_time(&stream, 20, || {
        // SAFETY: both buffers are n bytes and live.
        check(unsafe {
            sys::cuMemcpyDtoHAsync_v2(raw_host.cast(), raw_dev, n, stream.cu_stream())
        });
    });
    t.row(
        "raw cuMemcpyDtoHAsync, 256 MiB into pinned (ceiling)",
        raw_d2h,
        n,
        None,
    );
    let ours_d2h = time(3, 20, || {
        let back = on.to_cpu(true).unwrap();
        back.ready_event().unwrap().synchronize().unwrap();
    });
    t.row(
        "ours to_cpu, 256 MiB into pinned (+ sync)",
        ours_d2h,
        n,
        Some(("raw ceiling", raw_d2h)),
    );
    if let Some(&th) = torch.get("torch_d2h_256mib_pinned") {
        t.row(
            "ours to_cpu, 256 MiB into pinned",
            ours_d2h,
            n,
            Some(("torch copy_ into pinned", th)),
        );
    }

    let stats = PinnedPool::global().stats();
    t.note(&format!("\npinned pool after the run:\n\n{stats}\n"));
    if let Some((_, torch_reserved)) = torch.get_key_value("torch_pinned_reserved_bytes") {
        t.note(&format!(
            "torch pinned reserved bytes after its run: {torch_reserved}\n"
        ));
    }

    // SAFETY: allocated above, freed once; nothing uses them after this.
    unsafe {
        result::free_host(raw_host.cast()).unwrap();
        result::free_sync(raw_dev).unwrap();
    }
    t.save("transfer.md");
}
