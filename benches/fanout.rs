//! One batch to every GPU of the machine (`ToDevices`, N ≥ 2 devices): each route at N against
//! one host-to-device copy to one GPU, N such copies at once (the aggregate ceiling; a fan-out's
//! bar is 0.9× its speed or more), and N `to_device` calls one after the other. Prints a
//! markdown table and the route `FanoutRoute::Auto` takes at N, and writes both to
//! `$PINNABLE_BENCH_OUT/fanout.md`. With fewer than two GPUs it prints `skipped: …`.
//!
//! Each figure is one call and its sync, repeated (the median of the repeats): no stream of
//! batches runs here.

use cudarc::driver::{result, sys};
use pinnable::{DType, Device, FanoutRoute, Pinnable, Tensor, ToDevice, ToDevices};
use pinnable_harness::bench::{Table, check, time};
use pinnable_harness::{cuda_devices_or_skip, random_tensor, rng, skip_line};

const BYTES: usize = 256 << 20;
/// The bar for fanning out: at least this fraction of N raw copies at once (their time / ours).
const BAR: f64 = 0.9;

/// Raw copies of `BYTES` from one pinned buffer to each of `devices` at once, each on its own
/// device's copy stream, then a sync of each: the ceiling for fanning out.
fn raw_copies(devices: &[Device]) -> f64 {
    // SAFETY: a plain allocation of BYTES, freed below.
    let host =
        unsafe { result::malloc_host(BYTES, sys::CU_MEMHOSTALLOC_PORTABLE) }.unwrap() as *mut u8;
    // SAFETY: the block is BYTES long.
    unsafe { std::ptr::write_bytes(host, 3, BYTES) };
    let dsts: Vec<_> = devices
        .iter()
        .map(|d| {
            d.cuda_context().unwrap().bind_to_thread().unwrap();
            // SAFETY: a device allocation of BYTES on the bound device.
            unsafe { result::malloc_sync(BYTES) }.unwrap()
        })
        .collect();
    let t = time(3, 20, || {
        for (d, &dst) in devices.iter().zip(&dsts) {
            d.cuda_context().unwrap().bind_to_thread().unwrap();
            let stream = d.copy_stream().unwrap();
            // SAFETY: both buffers are BYTES long and live.
            check(unsafe {
                sys::cuMemcpyHtoDAsync_v2(dst, host.cast(), BYTES, stream.cu_stream())
            });
        }
        for d in devices {
            d.synchronize().unwrap();
        }
    });
    for (d, dst) in devices.iter().zip(dsts) {
        d.cuda_context().unwrap().bind_to_thread().unwrap();
        // SAFETY: allocated above, freed once.
        unsafe { result::free_sync(dst) }.unwrap();
    }
    // SAFETY: allocated above, freed once.
    unsafe { result::free_host(host.cast()) }.unwrap();
    t
}

fn main() {
    let Some(devices) = cuda_devices_or_skip("bench fanout") else {
        return;
    };
    let n = devices.len();
    if n < 2 {
        skip_line("skipped: bench fanout: needs two CUDA devices, found one");
        return;
    }
    let mut r = rng("bench fanout");
    let names: String = devices
        .iter()
        .map(|d| {
            format!(
                "\n- {d}: {} ({})",
                d.name(),
                d.pcie_bus_id().unwrap_or_default()
            )
        })
        .collect();
    let mut t = Table::new(&format!("# one batch to {n} GPUs\n\ndevices:{names}\n"));
    let one = raw_copies(&devices[..1]);
    t.row(
        "raw: one cuMemcpyHtoDAsync of 256 MiB + sync (one GPU's ceiling)",
        one,
        BYTES,
        None,
    );
    let all = raw_copies(&devices);
    t.row(
        &format!("raw: the same to all {n} GPUs at once (aggregate ceiling)"),
        all,
        n * BYTES,
        Some((&format!("{n} × one GPU"), n as f64 * one)),
    );
    let batch: Vec<Tensor> = vec![random_tensor(&mut r, DType::F32, &[BYTES / 4])];
    let ratios = pinned_rows(&mut t, &devices, &batch.pin_memory().unwrap(), one, all);
    pageable_rows(&mut t, &devices, &batch, one);
    t.note(&format!(
        "\nAuto takes {:?} for {n} devices. Against raw copies to all {n} at once (bar: \
         {BAR:.2}× or more): {}.\n",
        FanoutRoute::Auto.resolve(&devices),
        ratios.join(", ")
    ));
    t.save("fanout.md");
}

/// The rows of a pinned batch: `devices.len()` calls in sequence, each route at once against
/// the raw ceilings (`one` GPU's copy, `all` at once), and one device-to-device copy. Returns
/// each route's ratio against `all`, for the note under the table.
fn pinned_rows(
    t: &mut Table,
    devices: &[Device],
    pinned: &Vec<Tensor>,
    one: f64,
    all: f64,
) -> Vec<String> {
    let n = devices.len();
    let sequential = time(3, 20, || {
        for d in devices {
            drop(pinned.to_device(d, false).unwrap());
        }
    });
    t.row(
        &format!("ours: {n} to_device(false) calls, one after the other"),
        sequential,
        n * BYTES,
        None,
    );
    let mut ratios = Vec::new();
    for (name, route) in [
        ("Auto", FanoutRoute::Auto),
        ("HostToEach", FanoutRoute::HostToEach),
        ("HostThenPeer", FanoutRoute::HostThenPeer),
    ] {
        let ours = time(3, 20, || {
            drop(pinned.to_devices_by(devices, false, route).unwrap())
        });
        let what = format!("ours: pinned 256 MiB to_devices_by({name}) to {n} GPUs + sync");
        t.row(
            &what,
            ours,
            n * BYTES,
            Some((&format!("raw to all {n} at once"), all)),
        );
        let in_sequence = format!("{n} calls in sequence");
        t.row(&what, ours, n * BYTES, Some((&in_sequence, sequential)));
        t.row(&what, ours, n * BYTES, Some(("one GPU's one copy", one)));
        let ratio = all / ours;
        let under = if ratio < BAR { " (under the bar)" } else { "" };
        ratios.push(format!("{name} {ratio:.2}×{under}"));
    }
    let on0 = pinned.to_device(&devices[0], false).unwrap();
    let d2d = time(3, 20, || drop(on0.to_device(&devices[1], false).unwrap()));
    t.row(
        "ours: 256 MiB cuda:0 → cuda:1, to_device(false)",
        d2d,
        BYTES,
        Some(("one host copy", one)),
    );
    ratios
}

/// The rows of a pageable batch: pinned once for every device, against staged once a device.
fn pageable_rows(t: &mut Table, devices: &[Device], batch: &Vec<Tensor>, one: f64) {
    let n = devices.len();
    let pageable = time(2, 10, || drop(batch.to_devices(devices, false).unwrap()));
    t.row(
        &format!("ours: pageable 256 MiB to_devices(Auto) to {n} GPUs (pinned once) + sync"),
        pageable,
        n * BYTES,
        Some(("one GPU's one copy", one)),
    );
    let staged = time(2, 10, || {
        for d in devices {
            drop(batch.to_device(d, false).unwrap());
        }
    });
    t.row(
        &format!("ours: pageable 256 MiB, {n} to_device(false) calls (staged {n} times)"),
        staged,
        n * BYTES,
        Some(("to_devices", pageable)),
    );
}
