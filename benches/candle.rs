//! candle: a derived batch of candle CPU tensors (64 × 3×224×224 f32 images + 64 i64 labels,
//! 38.5 MB) to the GPU through our `to_device`, against candle's own `Tensor::to_device` of
//! each field and against the raw ceiling (one plain `cuMemcpyHtoDAsync` of the batch's bytes
//! from pinned memory); and the same batches through the loader, handed to candle.
//!
//! Every timing ends with candle's stream synchronized, so it includes the copies. Writes the
//! table to `$PINNABLE_BENCH_OUT/candle.md`. Needs the `candle-cuda` feature and a GPU.

use std::time::Instant;

use candle_core as candle;
use pinnable::loader::{Loader, Rows, Stack};
use pinnable::{DType, Device, Tensor, ToDevice};
use pinnable_harness::bench::{Table, median, raw_one_copy, time};
use pinnable_harness::{cuda_or_skip, random_tensor, rng};

const BATCH: usize = 64;
const IMAGE: [usize; 3] = [3, 224, 224];

#[derive(ToDevice)]
struct Batch {
    images: candle::Tensor,
    labels: candle::Tensor,
}

fn main() {
    let Some(gpu) = cuda_or_skip("bench candle") else {
        return;
    };
    let cdev = candle::Device::new_cuda(0).expect("candle's cuda:0");
    let dev = Device::from_candle(&cdev).expect("our device from candle's");
    let mut r = rng("bench candle");
    let cpu = &candle::Device::Cpu;
    let batch = Batch {
        images: candle::Tensor::rand(0f32, 1f32, (BATCH, IMAGE[0], IMAGE[1], IMAGE[2]), cpu)
            .unwrap(),
        labels: candle::Tensor::arange(0i64, BATCH as i64, cpu).unwrap(),
    };
    let bytes = BATCH * IMAGE.iter().product::<usize>() * 4 + BATCH * 8;
    let sync = || cdev.synchronize().unwrap();

    let raw = raw_one_copy(&gpu, bytes);
    let theirs = time(5, 30, || {
        let images = batch.images.to_device(&cdev).unwrap();
        let labels = batch.labels.to_device(&cdev).unwrap();
        sync();
        drop((images, labels));
    });
    let ours = time(5, 30, || {
        let on = batch.to_device(&dev, true).unwrap();
        sync();
        drop(on);
    });

    // Through the loader: samples are views of one in-memory array; each batch is collated
    // into pinned memory, moved, and handed to candle (one device-to-device copy per field:
    // the batch's tensors share one allocation, and candle owns one allocation per tensor).
    let images = Rows::new(random_tensor(
        &mut r,
        DType::F32,
        &[2048, IMAGE[0], IMAGE[1], IMAGE[2]],
    ))
    .unwrap();
    let (warmup, batches) = (16, 200);
    let workers =
        std::thread::available_parallelism().map_or(4, |n| n.get().saturating_sub(2).max(1));
    let data = pinnable::loader::FnDataset::new((warmup + batches) * BATCH, move |i| {
        Ok((
            pinnable::loader::Dataset::get(&images, i % 2048)?,
            (i % 1000) as i64,
        ))
    });
    let loader = Loader::builder(data)
        .batch_size(BATCH)
        .workers(workers)
        .device(dev.clone())
        .build(Stack)
        .unwrap();
    let mut epoch = loader.epoch(0);
    let mut steps = Vec::new();
    let mut last = Instant::now();
    for (i, b) in epoch.by_ref().enumerate() {
        let (x, y): (Tensor, Tensor) = b.unwrap();
        let x = x.into_candle(&cdev).unwrap();
        let y = y.into_candle(&cdev).unwrap();
        sync();
        drop((x, y));
        if i >= warmup {
            steps.push(last.elapsed().as_secs_f64());
        }
        last = Instant::now();
    }
    let loader_step = median(steps);

    let mut table = Table::new(&format!(
        "## candle: a 64 × 3×224×224 f32 + 64 i64 batch to the GPU ({})\n\n\
         {} loader workers. Ratios are the compared time over ours.\n",
        gpu.name(),
        workers
    ));
    table.row(
        "candle CPU tensors → `to_device(true)` + sync",
        ours,
        bytes,
        Some(("candle's `Tensor::to_device` per field + sync", theirs)),
    );
    table.row(
        "same",
        ours,
        bytes,
        Some(("raw pinned `cuMemcpyHtoDAsync` (ceiling)", raw)),
    );
    table.row(
        "through the loader, handed to candle (step)",
        loader_step,
        bytes,
        Some(("candle's `Tensor::to_device` per field + sync", theirs)),
    );
    table.row(
        "same",
        loader_step,
        bytes,
        Some(("raw pinned `cuMemcpyHtoDAsync` (ceiling)", raw)),
    );
    table.row("candle's own `to_device`", theirs, bytes, None);
    table.row("raw pinned copy (ceiling)", raw, bytes, None);
    table.note(&format!("\n{}\n", epoch.stats()));
    table.save("candle.md");
}
