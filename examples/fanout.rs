//! One batch to every GPU (`ToDevices`): a derived batch is pinned once and copied to each
//! device from that one pinned block, side by side over each GPU's own link (or, past four
//! GPUs that reach each other, once to the first and on over NVLink). Each copy is read back
//! and checked against the batch, by every route. Without a GPU the batch fans out to two
//! host targets instead, pinned once and shared by both, and the GPU part prints `skipped:`.
//!
//!     cargo run --example fanout
//!
//! With `PINNABLE_REQUIRE_GPU=1` a missing GPU is a failure.

use pinnable::{Device, FanoutRoute, Pinnable, Tensor, ToDevice, ToDevices};
use rand::Rng;

/// What every replica of a data-parallel model sees at one step.
#[derive(Pinnable, ToDevice)]
struct Batch {
    images: Tensor, // u8 [B, 3, 32, 32]
    labels: Tensor, // i64 [B]
}

fn random_batch(r: &mut impl Rng, b: usize) -> pinnable::Result<Batch> {
    let pixels: Vec<u8> = (0..b * 3 * 32 * 32).map(|_| r.random()).collect();
    let labels: Vec<i64> = (0..b).map(|_| r.random_range(0..10)).collect();
    Ok(Batch {
        images: Tensor::from_vec(pixels, &[b, 3, 32, 32])?,
        labels: Tensor::from_vec1(labels),
    })
}

/// Checks that `copy` holds `batch`'s values and lies on `device`.
fn check(copy: &Batch, batch: &Batch, device: &Device) -> pinnable::Result<()> {
    assert_eq!(copy.images.device(), *device);
    assert_eq!(copy.labels.device(), *device);
    let back = copy.images.to_cpu(false)?;
    assert_eq!(back.to_vec::<u8>()?, batch.images.to_vec::<u8>()?);
    let back = copy.labels.to_cpu(false)?;
    assert_eq!(back.to_vec::<i64>()?, batch.labels.to_vec::<i64>()?);
    Ok(())
}

fn main() -> pinnable::Result<()> {
    let mut r = pinnable_harness::rng("fanout");
    let batch = random_batch(&mut r, 64)?;

    // On the host: two targets share the one pinned copy.
    let hosts = [Device::cpu(), Device::cpu()];
    let copies = batch.to_devices(&hosts, false)?;
    for copy in &copies {
        check(copy, &batch, &Device::cpu())?;
        assert!(copy.images.is_pinned());
    }
    assert!(copies[0].images.shares_block_with(&copies[1].images));
    println!("2 host targets: one pinned copy, shared by both, equal to the batch");

    // Every GPU: one copy each, by each route.
    let Some(devices) = pinnable_harness::cuda_devices_or_skip("fanout: the copy to every GPU")
    else {
        return Ok(());
    };
    for route in [
        FanoutRoute::Auto,
        FanoutRoute::HostToEach,
        FanoutRoute::HostThenPeer,
    ] {
        let copies = batch.to_devices_by(&devices, true, route)?;
        assert_eq!(copies.len(), devices.len());
        for (copy, device) in copies.iter().zip(&devices) {
            check(copy, &batch, device)?;
        }
        println!(
            "{} GPU(s) by {route:?} (taken: {:?}): every copy equal to the batch",
            devices.len(),
            route.resolve(&devices)
        );
    }
    Ok(())
}
