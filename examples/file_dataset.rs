//! Your own dataset, one file a sample: `Dataset::get` reads its file with `?` on
//! `std::io::Error` and reports a record it cannot parse with `Error::other`. The loader
//! collates the samples into pinned batches, moves them to the GPU when there is one, and the
//! last epoch, run over a damaged copy of one file, shows a failed sample arriving as an error
//! that names its index and the file.
//!
//!     cargo run --release --example file_dataset

use std::path::PathBuf;

use pinnable::loader::{Collator, Dataset, Loader};
use pinnable::{Device, Error, Tensor, ToDevice};

/// Features of one record.
const FEATURES: usize = 8;

/// A record on disk: an i64 label, then `FEATURES` f32 values, little-endian.
const RECORD_BYTES: usize = 8 + 4 * FEATURES;

struct Record {
    label: i64,
    features: Tensor,
}

struct Records {
    paths: Vec<PathBuf>,
}

impl Dataset for Records {
    type Sample = Record;

    fn len(&self) -> usize {
        self.paths.len()
    }

    fn get(&self, index: usize) -> pinnable::Result<Record> {
        let path = &self.paths[index];
        let bytes = std::fs::read(path)?;
        if bytes.len() != RECORD_BYTES {
            return Err(Error::other(format!(
                "`{}` holds {} bytes, a record is {RECORD_BYTES}",
                path.display(),
                bytes.len()
            )));
        }
        let (label, rest) = bytes.split_at(8);
        let features: Vec<f32> = rest
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok(Record {
            label: i64::from_le_bytes(label.try_into().map_err(Error::other)?),
            features: Tensor::from_vec(features, &[FEATURES])?,
        })
    }
}

#[derive(ToDevice)]
struct Batch {
    features: Tensor, // f32 [B, FEATURES]
    labels: Tensor,   // i64 [B]
}

fn collate(samples: Vec<Record>, c: &mut Collator) -> pinnable::Result<Batch> {
    let features = c.stack("features", samples.iter().map(|r| &r.features))?;
    let labels = c.stack_scalars("labels", samples.iter().map(|r| r.label))?;
    let mut out = c.finish()?;
    Ok(Batch {
        features: out.take(features)?,
        labels: out.take(labels)?,
    })
}

fn main() -> pinnable::Result<()> {
    let dir = std::env::temp_dir().join(format!("file-dataset-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut paths = Vec::new();
    for i in 0..1000u32 {
        let mut record = i64::from(i % 10).to_le_bytes().to_vec();
        for k in 0..FEATURES as u32 {
            record.extend_from_slice(&((i * 31 + k) as f32 / 7.0).to_le_bytes());
        }
        let path = dir.join(format!("{i:05}.rec"));
        std::fs::write(&path, record)?;
        paths.push(path);
    }
    let device = Device::cuda(0).unwrap_or_else(|_| Device::cpu());
    let loader = Loader::builder(Records {
        paths: paths.clone(),
    })
    .batch_size(64)
    .shuffle(7)
    .workers(4)
    .device(device.clone())
    .build_with(collate)?;
    println!("{} records in batches of 64, on {device}", paths.len());

    for epoch in 0..2 {
        let (mut batches, mut label_sum) = (0, 0);
        for batch in loader.run_epoch(epoch) {
            let batch = batch?.to_cpu(false)?;
            label_sum += batch.labels.as_slice::<i64>()?.iter().sum::<i64>();
            batches += 1;
        }
        println!("epoch {epoch}: {batches} batches, labels summing to {label_sum}");
        if let Some(stats) = loader.stats() {
            println!("{stats}");
        }
    }

    // A damaged file: its sample fails, and the loader delivers the error in the batch's place.
    std::fs::write(&paths[123], b"short")?;
    let failed = loader.run_epoch(2).find_map(|batch| batch.err());
    match &failed {
        Some(e) => println!("with a damaged file, the epoch ends with: {e}"),
        None => println!("the damaged file was not read"),
    }
    std::fs::remove_dir_all(&dir)?;
    match failed {
        Some(Error::Sample { index: 123, .. }) => Ok(()),
        other => Err(Error::other(format!(
            "expected sample 123 to fail, got {other:?}"
        ))),
    }
}
