//! One batch to several devices, pinned once (`ToDevices`): to every GPU of the machine, by
//! every route. On a one-GPU machine the device tests send two copies to that GPU (printing
//! `partly skipped: …`); without a GPU they skip (printing `skipped: …`).

use pinnable::{DType, Device, FanoutRoute, Pinnable, Tensor, ToDevice, ToDevices};
use pinnable_harness::{bytes_of, cuda_targets_or_skip, random_batch, random_tensor, rng};
use rand::Rng;
use rand::seq::SliceRandom;

/// The tests share the process-wide pool, whose counters one of them reads.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn fan_out_to_host_targets_pins_once() {
    let _serial = serial();
    let mut r = rng("fan_out_to_host_targets_pins_once");
    let batch: Vec<Tensor> = (0..5)
        .map(|_| {
            let n = r.random_range(1..50);
            random_tensor(&mut r, DType::I32, &[n])
        })
        .collect();
    let hosts = vec![Device::cpu(); r.random_range(1..9)];
    let copies = batch.to_devices(&hosts, false).unwrap();
    assert_eq!(copies.len(), hosts.len(), "one copy a target");
    for copy in &copies {
        for (src, got) in batch.iter().zip(copy) {
            assert!(got.is_pinned());
            assert!(
                got.shares_block_with(&copies[0][0]),
                "pinned once, shared by every target"
            );
            assert_eq!(bytes_of(got), bytes_of(src));
        }
    }
    assert!(batch.to_devices(&[], true).unwrap().is_empty());
}

#[test]
fn fan_out_to_every_device_matches_the_source_by_every_route() {
    let _serial = serial();
    let Some(devices) =
        cuda_targets_or_skip("fan_out_to_every_device_matches_the_source_by_every_route")
    else {
        return;
    };
    let mut r = rng("fan_out_to_every_device_matches_the_source_by_every_route");
    for i in 0..200 {
        let route = [
            FanoutRoute::Auto,
            FanoutRoute::HostToEach,
            FanoutRoute::HostThenPeer,
        ][i % 3];
        // Every device, in a new order each time: each in turn is the first (the source of
        // `HostThenPeer`'s peer copies).
        let mut targets = devices.clone();
        targets.shuffle(&mut r);
        let mut batch = random_batch(&mut r, 6);
        let expected: Vec<Vec<u8>> = batch.iter().map(bytes_of).collect();
        let copies = batch
            .to_devices_by(&targets, r.random_bool(0.5), route)
            .unwrap();
        assert_eq!(copies.len(), targets.len(), "one copy a target");
        // Overwrite the sources at once: the copies must hold what was there at the call.
        for t in &mut batch {
            if t.is_contiguous() && t.dtype() == DType::U8 {
                t.as_mut_slice::<u8>().unwrap().fill(0xAB);
            } else {
                *t = random_tensor(&mut r, t.dtype(), t.shape());
            }
        }
        for (k, copy) in copies.iter().enumerate() {
            let on = &targets[k];
            for t in copy {
                assert_eq!(t.device().ordinal(), on.ordinal(), "{route:?}");
            }
            let back = copy.to_cpu(false).unwrap();
            let got: Vec<Vec<u8>> = back.iter().map(bytes_of).collect();
            assert_eq!(got, expected, "target {k} ({on}), {route:?}, batch {i}");
        }
    }
}

#[test]
fn a_pinned_batch_fans_out_without_a_host_copy() {
    let _serial = serial();
    let Some(devices) = cuda_targets_or_skip("a_pinned_batch_fans_out_without_a_host_copy") else {
        return;
    };
    let mut r = rng("a_pinned_batch_fans_out_without_a_host_copy");
    let pinned = vec![random_tensor(&mut r, DType::F32, &[1 << 20])]
        .pin_memory()
        .unwrap();
    let pool = pinnable::PinnedPool::global();
    let before = pool.stats();
    let copies = pinned.to_devices(&devices, true).unwrap();
    assert_eq!(copies.len(), devices.len(), "one copy a target");
    let after = pool.stats();
    assert_eq!(
        after.hits + after.misses,
        before.hits + before.misses,
        "no new block"
    );
    for (copy, device) in copies.iter().zip(&devices) {
        assert_eq!(copy[0].device().ordinal(), device.ordinal());
        let back = copy.to_cpu(false).unwrap();
        assert_eq!(bytes_of(&back[0]), bytes_of(&pinned[0]), "on {device}");
    }
}
