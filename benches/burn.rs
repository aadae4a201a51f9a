//! burn fed with batches of 64 × 3×224×224 f32 images (38.5 MB) as burn tensors on burn's
//! default device — its CPU backend (flex) here, CUDA device 0 when built in `burn-cuda/`
//! (`cargo bench --manifest-path burn-cuda/Cargo.toml --bench burn_on_cuda`) — through two
//! loaders over the same in-memory images:
//! - **ours**: `BurnLoader` over our `Loader` — samples are views of the image array, collated
//!   by our workers into one pinned block per batch (reused), which becomes burn's tensor with
//!   no copy of ours (`to_burn_float`): the CPU backend reads the block in place, the CUDA
//!   backend copies it to the GPU on its stream straight from the block;
//! - **burn's own** `DataLoader` (`DataLoaderBuilder` with as many workers, and the device
//!   set): each sample a `Vec<f32>`, batched by concatenating them into a fresh `Vec` that
//!   becomes burn's `TensorData` on the device, the way burn's examples batch.
//!
//! The ceiling beside them: one batch, already collated into a pinned block, made into a burn
//! tensor on the device again and again (on CUDA, burn's upload of a ready batch alone).
//!
//! Each figure is batches/s over whole epochs after a warm-up epoch; the two loaders run in
//! turns, repeated, in this one process, and the ratio is the median of the repeats' ratios.
//! Each batch is consumed by reading one element of the burn tensor back (so burn has made it,
//! and on CUDA the copy has run).
//!
//! Prints a markdown table and writes it to `$PINNABLE_BENCH_OUT/burn.md`. Knobs:
//! `PINNABLE_BENCH_REPEATS` (5), `PINNABLE_BENCH_EPOCHS` (epochs timed a repeat, 4),
//! `PINNABLE_BENCH_WORKERS` (workers of both loaders; the cores less one, at least 1).

use std::sync::Arc;
use std::time::Instant;

use burn_core::data::dataloader::batcher::Batcher as BurnBatcher;
use burn_core::data::dataloader::{DataLoader, DataLoaderBuilder};
use burn_core::data::dataset::InMemDataset;
use burn_tensor::{Device, Tensor as BurnTensor, TensorData};
use pinnable::interop::burn::{BurnLoader, to_burn_float};
use pinnable::loader::{Loader, Stack, TensorRows};
use pinnable::{DType, Pinnable, Tensor};
use pinnable_harness::bench::{Spread, Table, env_usize, median};
use pinnable_harness::{random_tensor, rng};

const BATCH: usize = 64;
const IMAGE: [usize; 3] = [3, 224, 224];
/// Images in the array both loaders read: 4 batches an epoch.
const IMAGES: usize = 256;

fn image_len() -> usize {
    IMAGE.iter().product()
}

/// burn's batcher: the samples' floats concatenated into one `TensorData`.
#[derive(Clone)]
struct ImageBatcher;

impl BurnBatcher<Vec<f32>, BurnTensor<4>> for ImageBatcher {
    fn batch(&self, items: Vec<Vec<f32>>, device: &Device) -> BurnTensor<4> {
        let n = items.len();
        let mut all = Vec::with_capacity(n * image_len());
        for item in &items {
            all.extend_from_slice(item);
        }
        BurnTensor::from_data(
            TensorData::new(all, [n, IMAGE[0], IMAGE[1], IMAGE[2]]),
            device,
        )
    }
}

/// Consumes a batch: one element read back, so burn has made the tensor.
fn consume(t: BurnTensor<4>) {
    assert_eq!(t.dims()[0], BATCH);
    let one: Vec<f32> = t
        .slice([0..1, 0..1, 0..1, 0..1])
        .to_data()
        .try_to_vec()
        .unwrap();
    std::hint::black_box(one);
}

/// Seconds a batch over `epochs` epochs of `loader`, after one epoch of warm-up.
fn seconds_per_batch(loader: &dyn DataLoader<BurnTensor<4>>, epochs: usize) -> f64 {
    for b in loader.iter() {
        consume(b.unwrap());
    }
    let start = Instant::now();
    let mut batches = 0;
    for _ in 0..epochs {
        for b in loader.iter() {
            consume(b.unwrap());
            batches += 1;
        }
    }
    start.elapsed().as_secs_f64() / batches as f64
}

// `pub`: burn-cuda/ runs it from its one test binary.
pub fn main() {
    let repeats = env_usize("PINNABLE_BENCH_REPEATS").unwrap_or(5).max(1);
    let epochs = env_usize("PINNABLE_BENCH_EPOCHS").unwrap_or(4).max(1);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let workers = env_usize("PINNABLE_BENCH_WORKERS").unwrap_or(cores.saturating_sub(1).max(1));
    let device = Device::default();

    let mut r = rng("burn bench");
    let mut shape = vec![IMAGES];
    shape.extend(IMAGE);
    let images = random_tensor(&mut r, DType::F32, &shape);
    let rows: Vec<Vec<f32>> = images
        .to_vec::<f32>()
        .unwrap()
        .chunks(image_len())
        .map(<[f32]>::to_vec)
        .collect();

    let loader = Loader::builder(TensorRows::new(images.clone()).unwrap())
        .batch_size(BATCH)
        .workers(workers)
        .build(Stack)
        .unwrap();
    let ours = BurnLoader::new(loader, device.clone(), |t: Tensor, d: &Device| {
        to_burn_float::<4>(&t, d)
    });
    let theirs = DataLoaderBuilder::new(ImageBatcher)
        .batch_size(BATCH)
        .num_workers(workers)
        .set_device(device.clone())
        .build(InMemDataset::new(rows));
    let theirs: Arc<dyn DataLoader<BurnTensor<4>>> = theirs;

    // The ceiling: a ready pinned batch made into a burn tensor, as often as an epoch's batches.
    let ready = images
        .narrow(0, 0, BATCH)
        .unwrap()
        .contiguous()
        .unwrap()
        .pin_memory()
        .unwrap();
    let ceiling = || {
        let batches = epochs * IMAGES / BATCH;
        consume(to_burn_float::<4>(&ready, &device).unwrap());
        let start = Instant::now();
        for _ in 0..batches {
            consume(to_burn_float::<4>(&ready, &device).unwrap());
        }
        start.elapsed().as_secs_f64() / batches as f64
    };

    let (mut ours_s, mut theirs_s, mut ceiling_s, mut ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..repeats {
        let t = seconds_per_batch(&*theirs, epochs);
        let o = seconds_per_batch(&ours, epochs);
        ceiling_s.push(ceiling());
        theirs_s.push(t);
        ours_s.push(o);
        ratios.push(t / o);
    }
    let bytes = BATCH * image_len() * 4;
    let mut table = Table::new(&format!(
        "## burn: 64 × 3×224×224 f32 batches into burn tensors on {device:?} ({workers} \
         workers, {cores} cores)\n"
    ));
    let (o, t, c) = (median(ours_s), median(theirs_s), median(ceiling_s));
    table.row(
        "ceiling: a ready pinned batch made a burn tensor",
        c,
        bytes,
        None,
    );
    table.row("burn's own DataLoader", t, bytes, None);
    table.row("ours through BurnLoader", o, bytes, Some(("burn's own", t)));
    table.row(
        "ours through BurnLoader",
        o,
        bytes,
        Some(("the ceiling", c)),
    );
    let spread = Spread::ratios(ratios);
    table.note(&format!(
        "\nbatches/s: ours {:.1}, burn's own {:.1}, ceiling {:.1}; ours / burn's own over {} \
         repeats: median {:.2}× (range {:.2}–{:.2}×)\n",
        1.0 / o,
        1.0 / t,
        1.0 / c,
        spread.len(),
        spread.median(),
        spread.min(),
        spread.max()
    ));
    table.save("burn.md");
}
