//! A complete training loop's input side: a synthetic image dataset saved as `.npy` files (as
//! `np.save` would write them), memory-mapped, served sample by sample as zero-copy views,
//! collated by the loader's workers straight into pinned memory, moved to the GPU when there is
//! one, and consumed by a per-batch step. Prints a progress line and, per epoch, where the time
//! went.
//!
//!     cargo run --release --example train_loop
//!     cargo run --release --example train_loop -- --in-memory --epochs 3 --workers 4
//!
//! Options: `--epochs N`, `--batch-size N`, `--workers N`, `--samples N`, `--in-memory` (serve
//! views of one array held in memory instead of the mapped file), `--cpu` (stay on the host
//! even with a GPU).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use pinnable::formats::npy::NpyArray;
use pinnable::loader::{Collator, Dataset, Loader, TensorRows};
use pinnable::{Device, Tensor, ToDevice};

const CHANNELS: usize = 3;
const SIDE: usize = 32;

#[derive(ToDevice)]
struct Batch {
    images: Tensor,  // f32 [B, 3, 32, 32]
    labels: Tensor,  // i64 [B]
    indices: Tensor, // i64 [B]: the samples' dataset indices, so a step can check what arrived
}

struct Options {
    epochs: u64,
    batch_size: usize,
    workers: usize,
    samples: usize,
    in_memory: bool,
    cpu: bool,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        epochs: 2,
        batch_size: 64,
        workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
        samples: 4096,
        in_memory: false,
        cpu: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut number = |name: &str| -> Result<usize, String> {
            args.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match a.as_str() {
            "--epochs" => o.epochs = number("--epochs")? as u64,
            "--batch-size" => o.batch_size = number("--batch-size")?,
            "--workers" => o.workers = number("--workers")?,
            "--samples" => o.samples = number("--samples")?,
            "--in-memory" => o.in_memory = true,
            "--cpu" => o.cpu = true,
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(o)
}

/// A synthetic image: every pixel of image `i` depends on `i`, so each row can be checked.
fn pixel(i: usize, k: usize) -> f32 {
    ((i * 31 + k) % 97) as f32 / 97.0
}

fn label(i: usize) -> i64 {
    (i % 10) as i64
}

/// Checks a batch read back on the host: each row holds the image and label of the sample
/// its index names.
fn check(b: &Batch) -> pinnable::Result<()> {
    let per = CHANNELS * SIDE * SIDE;
    let (images, labels) = (b.images.as_slice::<f32>()?, b.labels.as_slice::<i64>()?);
    for (row, &i) in b.indices.as_slice::<i64>()?.iter().enumerate() {
        let i = i as usize;
        assert_eq!(labels[row], label(i), "label of sample {i}");
        let image = &images[row * per..(row + 1) * per];
        assert!(
            image.iter().enumerate().all(|(k, &x)| x == pixel(i, k)),
            "image of sample {i} in row {row}"
        );
    }
    Ok(())
}

/// Writes a C-order `.npy` file (format version 1.0) as NumPy's `np.save` does.
fn save_npy(path: &Path, descr: &str, shape: &[usize], data: &[u8]) -> std::io::Result<()> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    f.write_all(b"\x93NUMPY\x01\x00")?;
    f.write_all(&(header.len() as u16).to_le_bytes())?;
    f.write_all(header.as_bytes())?;
    f.write_all(data)?;
    f.flush()
}

fn as_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: f32 and i64 are plain data without padding; the slice covers exactly `v`.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}

/// The images as one array (held in memory, or saved and memory-mapped) and the labels.
fn dataset(o: &Options, dir: &Path) -> pinnable::Result<(TensorRows, Vec<i64>)> {
    let per = CHANNELS * SIDE * SIDE;
    let pixels: Vec<f32> = (0..o.samples * per)
        .map(|k| pixel(k / per, k % per))
        .collect();
    let labels: Vec<i64> = (0..o.samples).map(label).collect();
    let shape = [o.samples, CHANNELS, SIDE, SIDE];
    if o.in_memory {
        return Ok((TensorRows::new(Tensor::from_vec(pixels, &shape)?)?, labels));
    }
    let (images_npy, labels_npy) = (dir.join("images.npy"), dir.join("labels.npy"));
    save_npy(&images_npy, "<f4", &shape, as_bytes(&pixels))
        .map_err(|e| pinnable::Error::io(&images_npy, e))?;
    save_npy(&labels_npy, "<i8", &[o.samples], as_bytes(&labels))
        .map_err(|e| pinnable::Error::io(&labels_npy, e))?;
    drop(pixels);
    // From here on, the data is what a Python user saved: no conversion step.
    // SAFETY: this program wrote the two files above and nothing writes them while mapped.
    let images = unsafe { NpyArray::open_mapped(&images_npy) }?;
    // SAFETY: as above.
    let labels = unsafe { NpyArray::open_mapped(&labels_npy) }?
        .tensor()
        .to_vec::<i64>()?;
    Ok((TensorRows::new(images.tensor().clone())?, labels))
}

fn progress(done: usize, total: usize, started: Instant, waited_share: f64) {
    let width = 30;
    let filled = done * width / total.max(1);
    let rate = done as f64 / started.elapsed().as_secs_f64().max(1e-9);
    eprint!(
        "\r[{}{}] {done}/{total} batches, {rate:.0} batches/s, waiting for data {:.0}%   ",
        "=".repeat(filled),
        " ".repeat(width - filled),
        100.0 * waited_share
    );
}

fn main() -> pinnable::Result<()> {
    let o = options().map_err(pinnable::Error::other)?;
    let dir: PathBuf = std::env::temp_dir().join(format!("train-loop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| pinnable::Error::io(&dir, e))?;
    let (images, labels) = dataset(&o, &dir)?;
    let device = match Device::cuda(0) {
        Ok(d) if !o.cpu => d,
        _ => Device::cpu(),
    };
    println!(
        "{} samples of {CHANNELS}x{SIDE}x{SIDE} f32 ({}), batches of {}, {} worker threads, on {device}",
        images.len(),
        if o.in_memory {
            "views of an in-memory array"
        } else {
            "views of a memory-mapped .npy"
        },
        o.batch_size,
        o.workers
    );

    let loader = Loader::builder(images)
        .batch_size(o.batch_size)
        .shuffle(2024)
        .drop_last(true)
        .workers(o.workers)
        .device(device.clone())
        .build_with(move |samples: Vec<Tensor>, c: &mut Collator| {
            let images = c.stack("images", &samples)?;
            // The collator knows which dataset indices the batch holds.
            let ys: Vec<i64> = c.indices().iter().map(|&i| labels[i]).collect();
            let at: Vec<i64> = c.indices().iter().map(|&i| i as i64).collect();
            let lab = c.stack_scalars("labels", ys)?;
            let idx = c.stack_scalars("indices", at)?;
            let mut out = c.finish()?;
            Ok(Batch {
                images: out.take(images)?,
                labels: out.take(lab)?,
                indices: out.take(idx)?,
            })
        })?;

    for epoch in 0..o.epochs {
        loader.set_epoch(epoch);
        let started = Instant::now();
        let total = loader.len();
        let batches = loader.iter();
        let (mut seen, mut checksum) = (0, 0.0f64);
        for (step, batch) in batches.enumerate() {
            let batch = batch?;
            // The step. On a GPU, a real model would launch kernels on its stream after
            // `batch.images.cuda_view(&stream)`; here the step waits for the copy and reads
            // one batch in 20 back. On the host, it reduces the batch.
            if device.is_cpu() || step % 20 == 0 {
                let host = batch.to_cpu(false)?;
                check(&host)?;
                checksum += host
                    .images
                    .as_slice::<f32>()?
                    .iter()
                    .map(|&x| f64::from(x))
                    .sum::<f64>();
                seen += host.labels.numel();
            } else if let Some(ready) = batch.images.ready_event() {
                ready.synchronize()?;
            }
            if step % 8 == 0 || step + 1 == total {
                let stats = loader.stats().unwrap_or_default();
                progress(step + 1, total, started, stats.wait_share());
            }
        }
        eprintln!();
        println!("epoch {epoch}: checksum {checksum:.1} over {seen} images read on the host");
        if let Some(stats) = loader.stats() {
            println!("{stats}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
