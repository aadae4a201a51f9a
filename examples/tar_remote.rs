//! WebDataset tar shards over HTTP (feature `remote`): three shards (each sample a `.npy`
//! array and a `.cls` label) are served by a small web server on the loopback interface
//! (the one the tests use), opened by URL with a brace range — one `HEAD` a shard, then
//! ranged `GET`s of 64 KiB chunks, two ahead — and loaded shuffled. The batches must equal
//! those of the same shards read from the disk, in the same order; the server's count shows
//! that nothing was downloaded twice. Batches from the server go to the GPU when there is one
//! (else the GPU part prints `skipped:` and they stay in pinned host memory). An `s3://`
//! URL is opened the same way.
//!
//!     cargo run --example tar_remote --features remote
//!
//! With `PINNABLE_REQUIRE_GPU=1` a missing GPU is a failure.

use pinnable::formats::tar::{TarNpyBatcher, TarShards};
use pinnable::loader::Loader;
use pinnable::storage::Storage;
use pinnable::{Device, ToDevice};
use pinnable_harness::http::Server;
use pinnable_harness::npy::npy_file;
use pinnable_harness::tar::{Sample, shard};
use rand::Rng;

/// One shuffled epoch's batches delivered to `device`, read back: (features, labels).
fn epoch(shards: &TarShards, device: &Device) -> pinnable::Result<Vec<(Vec<f32>, Vec<i64>)>> {
    let loader = Loader::builder(shards.clone())
        .batch_size(16)
        .shuffle(2024)
        .workers(2)
        .device(device.clone())
        .build(TarNpyBatcher::new("npy").label("cls"))?;
    loader
        .iter()
        .map(|b| {
            let (x, y) = b?;
            let y = y.expect("every sample has a label");
            assert_eq!(x.device(), *device);
            Ok((
                x.to_cpu(false)?.to_vec::<f32>()?,
                y.to_cpu(false)?.to_vec::<i64>()?,
            ))
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut r = pinnable_harness::rng("tar_remote");
    let dir = std::env::temp_dir().join(format!("pinnable-tar-remote-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut bytes = 0;
    for s in 0..3 {
        let samples: Vec<Sample> = (0..r.random_range(40..80))
            .map(|i| {
                let values: Vec<u8> = (0..256)
                    .flat_map(|_| r.random::<f32>().to_le_bytes())
                    .collect();
                let label = r.random_range(0..1000i64).to_string().into_bytes();
                let fields = vec![
                    ("npy".into(), npy_file("<f4", &[16, 16], false, &values)),
                    ("cls".into(), label),
                ];
                (format!("s{s}/{i:04}"), fields)
            })
            .collect();
        let tar = shard(&samples).0;
        bytes += tar.len() as u64;
        std::fs::write(dir.join(format!("train-{s}.tar")), tar)?;
    }
    let server = Server::start(&dir);
    let url = format!("{}/train-{{0..2}}.tar", server.url());
    let remote = TarShards::open_with(&Storage::new().chunk_size(64 << 10).read_ahead(2), [&url])?
        .shuffle_buffer(32);
    let local =
        TarShards::open([format!("{}/train-{{0..2}}.tar", dir.display())])?.shuffle_buffer(32);
    assert_eq!(remote.len(), local.len());
    println!(
        "{url}: {} samples, {:.2} MB in 3 shards",
        remote.len(),
        bytes as f64 / 1e6
    );

    let want = epoch(&local, &Device::cpu())?;
    let device = pinnable_harness::cuda_or_skip("tar_remote: batches on the GPU")
        .unwrap_or_else(Device::cpu);
    let before = server.served();
    let got = epoch(&remote, &device)?;
    let served = server.served() - before;
    assert_eq!(got, want, "the remote batches differ from the local ones");
    // Each byte of the epoch's samples is fetched once: at most the shards' size.
    assert!(
        served <= bytes,
        "{served} bytes served for {bytes} bytes of shards"
    );
    println!(
        "one epoch from the server onto {device}: {} batches, equal to the local shards'; \
         {:.2} MB served ({:.0}% of the shards)",
        got.len(),
        served as f64 / 1e6,
        100.0 * served as f64 / bytes as f64
    );
    drop(server);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
