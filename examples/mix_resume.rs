//! A weighted mix of three corpora (`Mix`), stopped mid-epoch and resumed: 60% web, 30% code,
//! 10% math, drawn sample by sample; the small corpora cycle, reshuffled at each pass. The run
//! saves its position after a few batches of epoch 1 (as a checkpoint would, as text), a new
//! loader with another worker count resumes from it, and the resumed batches must equal the
//! rest of the uninterrupted epoch. Batches go to the GPU when there is one (else the GPU part
//! prints `skipped:` and they stay in pinned host memory).
//!
//!     cargo run --example mix_resume
//!
//! With `PINNABLE_REQUIRE_GPU=1` a missing GPU is a failure.

use pinnable::loader::{Collator, Dataset, Loader, LoaderBuilder, Mix, Position};
use pinnable::{Device, Tensor, ToDevice};
use rand::Rng;

const NAMES: [&str; 3] = ["web", "code", "math"];

/// A corpus of `len` samples; sample `i` of corpus `s` is the id `s * 1_000_000 + i`, so a
/// batch tells which corpus each sample came from.
fn corpus(s: usize, len: usize) -> Vec<i64> {
    (0..len).map(|i| (s * 1_000_000 + i) as i64).collect()
}

/// The batcher: the samples' ids, stacked into a pinned `i64 [B]`.
fn ids(samples: Vec<i64>, c: &mut Collator) -> pinnable::Result<Tensor> {
    let ids = c.stack_scalars("ids", samples)?;
    c.finish()?.take(ids)
}

/// Every batch of an epoch iterator, read back on the host.
fn read(
    batches: impl Iterator<Item = pinnable::Result<Tensor>>,
) -> pinnable::Result<Vec<Vec<i64>>> {
    batches.map(|b| b?.to_cpu(false)?.to_vec::<i64>()).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut r = pinnable_harness::rng("mix_resume");
    let sizes = [
        r.random_range(700..1000),
        r.random_range(100..300),
        r.random_range(20..60),
    ];
    let sources = || -> Vec<(Vec<i64>, f64)> {
        let weights = [0.6, 0.3, 0.1];
        (0..3).map(|s| (corpus(s, sizes[s]), weights[s])).collect()
    };
    let seed: u64 = r.random();
    let device = pinnable_harness::cuda_or_skip("mix_resume: batches on the GPU")
        .unwrap_or_else(Device::cpu);
    let builder = |workers| -> pinnable::Result<LoaderBuilder<Mix<Vec<i64>>>> {
        Ok(Loader::builder(Mix::weighted(sources())?)
            .batch_size(32)
            .shuffle(seed)
            .workers(workers)
            .device(device.clone()))
    };

    // The uninterrupted epoch 1.
    let loader = builder(3)?.build(ids)?;
    let epoch = read(loader.run_epoch(1))?;
    let mut drawn = [0usize; 3];
    for id in epoch.iter().flatten() {
        drawn[(id / 1_000_000) as usize] += 1;
    }
    let total: usize = drawn.iter().sum();
    println!(
        "corpora of {sizes:?} samples; epoch 1: {} batches on {device}; drawn: {}",
        epoch.len(),
        (0..3)
            .map(|s| format!(
                "{} {:.1}%",
                NAMES[s],
                100.0 * drawn[s] as f64 / total as f64
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    // The epoch's length: the largest corpus read through once at its 60% share (the default
    // stop rule); each corpus's part is its share, give or take the draws' randomness.
    assert_eq!(total, Mix::weighted(sources())?.len());
    for (s, share) in [0.6, 0.3, 0.1].into_iter().enumerate() {
        assert!(
            (drawn[s] as f64 / total as f64 - share).abs() < 0.07,
            "{drawn:?}"
        );
    }

    // Stopped after a few batches of epoch 1; the position saved as text.
    let stop = r.random_range(1..epoch.len() - 1);
    loader.set_epoch(1);
    let mut run = loader.iter();
    let before = read(run.by_ref().take(stop))?;
    let saved = run.position().to_string();
    drop(run);
    assert_eq!(before, epoch[..stop]);
    println!("stopped after {stop} batches: {saved}");

    // A new loader, with another worker count, resumes from the text.
    let position: Position = saved.parse()?;
    let resumed = builder(1)?.resume(position).build(ids)?;
    let rest = read(resumed.iter())?;
    assert_eq!(rest, epoch[stop..], "the resumed batches differ");
    println!(
        "resumed with 1 worker: {} batches, equal to the uninterrupted epoch's last {}",
        rest.len(),
        epoch.len() - stop
    );
    Ok(())
}
