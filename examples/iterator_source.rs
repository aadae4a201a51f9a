//! A source that cannot be indexed — records read front to back from a text file, as from a
//! log or a socket — given to the loader as an `IterSource` (PyTorch's `IterableDataset`).
//! The loader's workers take the stream's records in turn and collate them into pinned
//! batches; two ranks split the stream record by record; a run stopped mid-epoch resumes from
//! its saved position, the source reopening the file at the next record (`seekable`) instead
//! of reading the ones before. Batches go to the GPU when there is one (else the GPU part
//! prints `skipped:` and they stay in pinned host memory).
//!
//!     cargo run --example iterator_source
//!
//! With `PINNABLE_REQUIRE_GPU=1` a missing GPU is a failure.

use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::Arc;

use pinnable::loader::{IterSource, Loader, Position, Stack};
use pinnable::{Device, Error, Tensor, ToDevice};
use rand::Rng;

/// A record: four features and a label.
type Record = (Tensor, i64);

/// One line, `label<TAB>f0 f1 f2 f3`, parsed.
fn parse(line: std::io::Result<String>) -> pinnable::Result<Record> {
    let line = line?;
    let bad = || Error::other(format!("not `label<TAB>4 features`: {line:?}"));
    let (label, features) = line.split_once('\t').ok_or_else(bad)?;
    let features: Vec<f32> = features
        .split(' ')
        .map(|v| v.parse().map_err(|_| bad()))
        .collect::<pinnable::Result<_>>()?;
    if features.len() != 4 {
        return Err(bad());
    }
    Ok((
        Tensor::from_vec1(features),
        label.parse().map_err(|_| bad())?,
    ))
}

/// The records of `path` from byte `offset` on.
fn records(
    path: &PathBuf,
    offset: u64,
) -> Box<dyn Iterator<Item = pinnable::Result<Record>> + Send> {
    let opened = std::fs::File::open(path).and_then(|mut f| {
        f.seek(SeekFrom::Start(offset))?;
        Ok(f)
    });
    match opened {
        Ok(f) => Box::new(BufReader::new(f).lines().map(parse)),
        Err(e) => Box::new(std::iter::once(Err(Error::io(path, e)))),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut r = pinnable_harness::rng("iterator_source");
    let dir = std::env::temp_dir().join(format!("pinnable-iterator-source-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = Arc::new(dir.join("records.tsv"));

    // The file, and beside it the byte offset of every line: what lets the source seek.
    let n = r.random_range(300..500);
    let (mut labels, mut offsets, mut text) = (Vec::new(), Vec::new(), String::new());
    for _ in 0..n {
        let label = r.random_range(0..1000i64);
        let f: Vec<String> = (0..4)
            .map(|_| format!("{:.3}", r.random::<f32>()))
            .collect();
        offsets.push(text.len() as u64);
        text.push_str(&format!("{label}\t{}\n", f.join(" ")));
        labels.push(label);
    }
    std::fs::File::create(path.as_ref())?.write_all(text.as_bytes())?;
    let offsets = Arc::new(offsets);

    let source = || {
        let (p, q) = (path.clone(), path.clone());
        let offsets = offsets.clone();
        IterSource::new(move |_epoch| records(&p, 0)).seekable(move |_epoch, item| {
            let at = offsets.get(item as usize).copied().unwrap_or(u64::MAX);
            records(&q, at)
        })
    };
    let device = pinnable_harness::cuda_or_skip("iterator_source: batches on the GPU")
        .unwrap_or_else(Device::cpu);
    let builder = |rank, workers| {
        Loader::builder(source())
            .batch_size(16)
            .shard(rank, 2)
            .workers(workers)
            .device(device.clone())
    };
    // A batch's labels, read back on the host; its features checked to be [B, 4].
    let labels_of = |b: pinnable::Result<(Tensor, Tensor)>| -> pinnable::Result<Vec<i64>> {
        let (x, y) = b?;
        assert_eq!(x.shape(), [y.shape()[0], 4]);
        y.to_cpu(false)?.to_vec::<i64>()
    };

    // Two ranks: rank `k` takes records k, k + 2, k + 4, …
    let mut whole = Vec::new();
    for rank in 0..2 {
        let loader = builder(rank, 2).build(Stack)?;
        let batches = loader
            .iter()
            .map(labels_of)
            .collect::<pinnable::Result<Vec<_>>>()?;
        let got: Vec<i64> = batches.iter().flatten().copied().collect();
        assert_eq!(
            got,
            labels
                .iter()
                .skip(rank)
                .step_by(2)
                .copied()
                .collect::<Vec<_>>()
        );
        println!(
            "rank {rank} of 2: {} records in {} batches on {device}",
            got.len(),
            batches.len()
        );
        if rank == 0 {
            whole = batches;
        }
    }

    // Rank 0 stops after 3 batches and resumes with another worker count.
    let loader = builder(0, 2).build(Stack)?;
    let mut run = loader.iter();
    for _ in 0..3 {
        run.next().ok_or("the epoch ended early")??;
    }
    let saved = run.position().to_string();
    drop(run);
    let position: Position = saved.parse()?;
    let resumed = builder(0, 1).resume(position).build(Stack)?;
    let rest = resumed
        .iter()
        .map(labels_of)
        .collect::<pinnable::Result<Vec<_>>>()?;
    assert_eq!(rest, whole[3..]);
    println!(
        "stopped after 3 batches at {saved}; resumed: the remaining {} batches, equal",
        rest.len()
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
