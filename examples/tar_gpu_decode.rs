//! WebDataset tar shards of JPEGs decoded on the GPU: three shards of photographs-like JPEGs
//! (`.jpg` + `.cls`) are read by the loader's workers, each member's bytes copied once into
//! the batch's pinned block and decoded on the device — by its JPEG engines when it has them,
//! else nvJPEG's CUDA backend — then resized and cropped there (`TarImageBatcher` with the
//! loader's device a GPU: the codec's `DecodeOn::Auto`). The host path (the loader's device
//! the host: the workers decode) runs first and every image it
//! gives is checked pixel for pixel against the JPEG decoded on its own; the GPU's images must
//! then match it within the decoders' rounding (PSNR ≥ 40 dB), labels exactly. Without a GPU
//! the device part prints `skipped:`.
//!
//!     cargo run --example tar_gpu_decode --features image
//!
//! With `PINNABLE_REQUIRE_GPU=1` a missing GPU is a failure.

use std::path::Path;

use pinnable::formats::image::{Decoder, ImageCodec, Transform};
use pinnable::formats::tar::{TarImageBatcher, TarShards};
use pinnable::loader::{Loader, SplitMix64};
use pinnable::{Device, Tensor, ToDevice};
use pinnable_harness::images::{Jpeg, jpeg, picture};
use pinnable_harness::tar::{Sample, shard};
use rand::Rng;

/// One epoch's `(images u8 [B, 3, 56, 56], labels)`, read back on the host.
fn epoch(
    shards: &TarShards,
    batcher: TarImageBatcher,
    device: &Device,
) -> pinnable::Result<Vec<(Tensor, Vec<i64>)>> {
    let loader = Loader::builder(shards.clone())
        .batch_size(8)
        .workers(2)
        .device(device.clone())
        .build(batcher)?;
    loader
        .iter()
        .map(|b| {
            let (x, y) = b?;
            assert_eq!(x.device(), *device);
            Ok((x.to_cpu(false)?, y.to_cpu(false)?.to_vec::<i64>()?))
        })
        .collect()
}

fn psnr(a: &[u8], b: &[u8]) -> f64 {
    let mse = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
        .sum::<f64>()
        / a.len() as f64;
    10.0 * (255.0 * 255.0 / mse.max(1e-12)).log10()
}

fn main() -> pinnable::Result<()> {
    let mut r = pinnable_harness::rng("tar_gpu_decode");
    let dir = std::env::temp_dir().join(format!("pinnable-tar-gpu-decode-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (mut files, mut labels) = (Vec::new(), Vec::new());
    for s in 0..3 {
        let samples: Vec<Sample> = (0..r.random_range(10..20))
            .map(|i| {
                let (w, h) = (r.random_range(64..200), r.random_range(64..200));
                let bytes = jpeg(&picture(&mut r, w, h, 6.0), w, h, 90, Jpeg::Baseline, None);
                let label = r.random_range(0..1000i64);
                files.push(bytes.clone());
                labels.push(label);
                let fields = vec![
                    ("jpg".into(), bytes),
                    ("cls".into(), label.to_string().into_bytes()),
                ];
                (format!("s{s}/{i:04}"), fields)
            })
            .collect();
        std::fs::write(dir.join(format!("train-{s}.tar")), shard(&samples).0)?;
    }
    let shards = TarShards::open([format!("{}/train-{{0..2}}.tar", dir.display())])?;
    let transform = Transform::resized_center_crop(64, 56);
    println!(
        "{} JPEG samples in 3 shards; images resized to 64 and cropped to 56",
        shards.len()
    );

    // The host path: every image equals its JPEG decoded alone and transformed.
    // One batcher for both paths: the loader's device decides where it decodes.
    let codec = ImageCodec::new(transform.clone());
    let batcher = TarImageBatcher::new(codec.clone());
    let host = epoch(&shards, batcher.clone(), &Device::cpu())?;
    let mut decoder = Decoder::new();
    let mut k = 0;
    for (x, y) in &host {
        let rows = x.as_slice::<u8>()?.chunks(3 * 56 * 56);
        for (row, &label) in rows.zip(y) {
            let alone = transform.apply(
                decoder.decode(&files[k], Path::new("alone.jpg"))?,
                SplitMix64::new(0),
            )?;
            assert!(row == alone.as_slice::<u8>()?, "sample {k}");
            assert_eq!(label, labels[k]);
            k += 1;
        }
    }
    assert_eq!(k, files.len());
    println!("decoded on the host: {k} images, each equal to its JPEG decoded alone");

    // The device path.
    let Some(device) = pinnable_harness::cuda_or_skip("tar_gpu_decode: decoding on the GPU") else {
        std::fs::remove_dir_all(&dir)?;
        return Ok(());
    };
    println!("decoding on {device} with {}", codec.chosen(&device));
    let got = epoch(&shards, batcher, &device)?;
    assert_eq!(got.len(), host.len());
    let mut worst = f64::INFINITY;
    for ((gx, gy), (hx, hy)) in got.iter().zip(&host) {
        assert_eq!(gy, hy);
        worst = worst.min(psnr(gx.as_slice::<u8>()?, hx.as_slice::<u8>()?));
    }
    assert!(worst >= 40.0, "PSNR {worst:.1} dB");
    println!(
        "decoded on {device}: the same labels, images within {worst:.1} dB PSNR of the host's"
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
