//! WebDataset tar shards to the device: writes four shards of uneven size (each sample a
//! `.npy` array and a `.cls` label), streams them shuffled as rank 0 of 2, stops midway,
//! and resumes from the saved position with another worker count, checking that the
//! resumed batches are the ones the uninterrupted run delivered.
//!
//! `cargo run --example tar_shards` (the GPU when there is one, else the host).

use pinnable::formats::tar::{TarNpyBatcher, TarShards};
use pinnable::loader::{Loader, Position};
use pinnable::{Device, Tensor, ToDevice};
use pinnable_harness::tar::{Sample, shard};
use rand::{Rng, SeedableRng};

/// A `.npy` file of `f32` values `[4, 8]`.
fn npy(values: &[f32]) -> Vec<u8> {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    pinnable_harness::npy::npy_file("<f4", &[4, 8], false, &data)
}

fn host(t: &Option<Tensor>) -> pinnable::Result<Vec<i64>> {
    match t {
        Some(t) => t.to_cpu(false)?.to_vec::<i64>(),
        None => Ok(Vec::new()),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut r = rand::rngs::SmallRng::seed_from_u64(7);
    let dir = std::env::temp_dir().join(format!("pinnable-tar-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut label = 0i64;
    for (s, n) in [40usize, 7, 25, 60].into_iter().enumerate() {
        let samples: Vec<Sample> = (0..n)
            .map(|i| {
                label += 1;
                let values: Vec<f32> = (0..32).map(|_| r.random()).collect();
                (
                    format!("shard{s}/{i:06}"),
                    vec![
                        ("npy".into(), npy(&values)),
                        ("cls".into(), label.to_string().into_bytes()),
                    ],
                )
            })
            .collect();
        std::fs::write(dir.join(format!("train-{s:04}.tar")), shard(&samples).0)?;
    }
    let pattern = format!("{}/train-{{0000..0003}}.tar", dir.display());
    let shards = TarShards::open([&pattern])?.shuffle_buffer(32);
    println!(
        "{} samples in shards of {:?}",
        shards.len(),
        (0..4)
            .filter_map(|s| shards.shard_len(s))
            .collect::<Vec<_>>()
    );

    let device = match Device::cuda(0) {
        Ok(d) => d,
        Err(e) => {
            println!("no GPU ({e}): batches stay in pinned host memory");
            Device::cpu()
        }
    };
    let build = |workers| {
        Loader::builder(shards.clone())
            .batch_size(16)
            .shuffle(2024)
            .shard(0, 2) // rank 0 of 2: `launch_from_env()` in a real run
            .workers(workers)
            .device(device.clone())
    };

    let loader = build(4).build(TarNpyBatcher::new("npy").label("cls"))?;
    println!("rank 0 of 2: {} batches an epoch", loader.len());
    loader.set_epoch(1);
    let mut all = Vec::new();
    for batch in &loader {
        let (x, y) = batch?;
        assert_eq!(x.shape()[1..], [4, 8]);
        all.push(host(&y)?);
    }

    // The run stops after 3 batches and saves where it was.
    loader.set_epoch(1);
    let mut epoch = loader.iter();
    for _ in 0..3 {
        epoch.next().ok_or("the epoch ended early")??;
    }
    let saved = epoch.position().to_string();
    drop(epoch);
    println!("saved: {saved}");

    // A restart with another worker count goes on from batch 3.
    let position: Position = saved.parse()?;
    let resumed = build(2)
        .resume(position)
        .build(TarNpyBatcher::new("npy").label("cls"))?;
    let mut rest = Vec::new();
    for batch in &resumed {
        rest.push(host(&batch?.1)?);
    }
    assert_eq!(rest, all[3..]);
    println!(
        "resumed: {} batches, the same as the uninterrupted run's last {}; first labels {:?}",
        rest.len(),
        all.len() - 3,
        &rest[0][..4]
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
