//! One batch to two GPUs (`ToDevices`): each route against one host-to-device copy of the
//! batch, two such copies at once (the aggregate ceiling), and two `to_device` calls one after
//! the other. Prints a markdown table and writes it to `$PINNABLE_BENCH_OUT/fanout.md`.
//!
//! Each figure is one call and its sync, repeated (the median of the repeats): no stream of
//! batches runs here.

use cudarc::driver::{result, sys};
use pinnable::{DType, Device, FanoutRoute, Pinnable, Tensor, ToDevice, ToDevices};
use pinnable_harness::bench::{Table, check, time};
use pinnable_harness::{cuda_pair_or_skip, random_tensor, rng};

const BYTES: usize = 256 << 20;

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
    let Some((d0, d1)) = cuda_pair_or_skip("bench fanout") else {
        return;
    };
    let mut r = rng("bench fanout");
    let devices = [d0.clone(), d1.clone()];
    let mut t = Table::new(&format!(
        "# one batch to two GPUs\n\ndevices: {} ({}), {} ({})\n",
        d0.name(),
        d0.pcie_bus_id().unwrap_or_default(),
        d1.name(),
        d1.pcie_bus_id().unwrap_or_default()
    ));
    let one = raw_copies(&devices[..1]);
    t.row(
        "raw: one cuMemcpyHtoDAsync of 256 MiB + sync (one GPU's ceiling)",
        one,
        BYTES,
        None,
    );
    let both = raw_copies(&devices);
    t.row(
        "raw: the same to both GPUs at once (aggregate ceiling)",
        both,
        2 * BYTES,
        Some(("2 × one GPU", 2.0 * one)),
    );

    let batch: Vec<Tensor> = vec![random_tensor(&mut r, DType::F32, &[BYTES / 4])];
    let pinned = batch.pin_memory().unwrap();
    let sequential = time(3, 20, || {
        for d in &devices {
            drop(pinned.to_device(d, false).unwrap());
        }
    });
    t.row(
        "ours: two to_device(false) calls, one after the other",
        sequential,
        2 * BYTES,
        None,
    );
    for (name, route) in [
        ("Auto", FanoutRoute::Auto),
        ("HostToEach", FanoutRoute::HostToEach),
        ("HostThenPeer", FanoutRoute::HostThenPeer),
    ] {
        let ours = time(3, 20, || {
            drop(pinned.to_devices_by(&devices, false, route).unwrap())
        });
        let what = format!("ours: pinned 256 MiB to_devices_by({name}) + sync");
        t.row(&what, ours, 2 * BYTES, Some(("one GPU's one copy", one)));
        t.row(
            &what,
            ours,
            2 * BYTES,
            Some(("two calls in sequence", sequential)),
        );
        t.row(&what, ours, 2 * BYTES, Some(("raw to both at once", both)));
    }
    let on0 = pinned.to_device(&d0, false).unwrap();
    let d2d = time(3, 20, || drop(on0.to_device(&d1, false).unwrap()));
    t.row(
        "ours: 256 MiB cuda:0 → cuda:1, to_device(false)",
        d2d,
        BYTES,
        Some(("one host copy", one)),
    );
    drop(on0);
    let pageable = time(2, 10, || drop(batch.to_devices(&devices, false).unwrap()));
    t.row(
        "ours: pageable 256 MiB to_devices(Auto) (pinned once) + sync",
        pageable,
        2 * BYTES,
        Some(("one GPU's one copy", one)),
    );
    let pageable_seq = time(2, 10, || {
        for d in &devices {
            drop(batch.to_device(d, false).unwrap());
        }
    });
    t.row(
        "ours: pageable 256 MiB, two to_device(false) calls (staged twice)",
        pageable_seq,
        2 * BYTES,
        Some(("to_devices", pageable)),
    );
    t.note(&format!(
        "\nAuto resolves to {:?} for two devices.\n",
        FanoutRoute::Auto.resolve(&devices)
    ));
    t.save("fanout.md");
}
