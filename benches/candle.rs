//! candle fed with batches of 64 × 3×224×224 f32 images + 64 i64 labels (38.5 MB), against
//! candle's own `Tensor::to_device` of each field:
//! - **gathered**: the images pinned once; the loader makes each batch two `Gather`s of rows,
//!   which the copy engine stacks on the device (nothing collated on the host); each batch is
//!   handed to candle;
//! - **collated on the host**: samples are views of an in-memory array, collated into pinned
//!   memory by the loader's workers, moved, and handed to candle;
//! - **candle's CPU tensors**: a derived batch of candle CPU tensors through our
//!   `to_device(true)` (pageable memory, staged);
//! - **candle's own** `to_device` of each field, and the raw ceiling (one plain
//!   `cuMemcpyHtoDAsync` of the batch's bytes from pinned memory).
//!
//! Every figure of a stream of batches is its steady-state throughput: the time of a window of
//! batches after a warm-up over their number, with the consumer's wait over the same window and
//! per-step percentiles beside it (`pinnable_harness::bench::Throughput`). Each step ends with
//! candle's stream synchronized, so it includes the batch's copies. Ratios against candle's
//! own `to_device` come from repeats interleaved in this one process (candle's, then ours, in
//! every repeat), one ratio a repeat, reported as their median with its range.
//!
//! Prints a markdown table and writes it to `$PINNABLE_BENCH_OUT/candle.md`. Knobs:
//! `PINNABLE_BENCH_REPEATS` (7; at least 5), `PINNABLE_BENCH_BATCHES` (loader batches timed a
//! run, 200), `PINNABLE_BENCH_WORKERS` (host-collation workers, the first of a list; the cores less two),
//! `PINNABLE_BENCH_GATHER_WORKERS` (2). Needs the `candle-cuda` feature and a GPU.

use candle_core as candle;
use pinnable::loader::{Dataset, FnDataset, Loader, Stack, TensorRows};
use pinnable::{DType, Device, Gather, Pinnable, Tensor, ToDevice};
use pinnable_harness::bench::{self, Spread, Throughput, env_usize, raw_one_copy};
use pinnable_harness::{cuda_or_skip, random_tensor, rng};

const BATCH: usize = 64;
const IMAGE: [usize; 3] = [3, 224, 224];
/// Images in the arrays the loaders read.
const IMAGES: usize = 2048;
/// Loader batches before the window opens (past the prefetched backlog).
const WARMUP: usize = 16;
/// Steps of a loop that makes its own batches: warm-up, then timed.
const OWN: (usize, usize) = (5, 30);

#[derive(ToDevice)]
struct Batch {
    images: candle::Tensor,
    labels: candle::Tensor,
}

fn batch_bytes() -> usize {
    BATCH * IMAGE.iter().product::<usize>() * 4 + BATCH * 8
}

/// What every candle path shares: candle's device, ours on the same context, and the sources.
struct Setup {
    cdev: candle::Device,
    dev: Device,
    /// candle CPU tensors: the pageable batch both `to_device` loops move.
    batch: Batch,
    /// The host-collated loader's samples: views of a pageable array.
    rows: TensorRows,
    /// The same images pinned once, and their labels, for the gathered loader.
    pinned: Tensor,
    labels: Tensor,
    batches: usize,
    workers: usize,
    gather_workers: usize,
}

/// A loader batch on the device, handed to candle: the labels first, so that the images then
/// own the batch's device allocation alone and candle takes it over without a copy.
fn to_candle(x: Tensor, y: Tensor, cdev: &candle::Device) -> pinnable::Result<[candle::Tensor; 2]> {
    let y = y.into_candle(cdev)?;
    let x = x.into_candle(cdev)?;
    Ok([x, y])
}

/// Panics unless the first batch of a loader run holds rows 0..64 of the array and their
/// labels, read back from candle.
fn check_first(s: &Setup, [x, y]: &[candle::Tensor; 2]) {
    let labels = y.to_vec1::<i64>().expect("labels from candle");
    assert_eq!(
        labels,
        (0..BATCH as i64).collect::<Vec<_>>(),
        "the first batch's labels"
    );
    let got = x
        .get(BATCH - 1)
        .and_then(|r| r.flatten_all())
        .and_then(|r| r.narrow(0, 0, 16))
        .and_then(|r| r.to_vec1::<f32>())
        .expect("an image row from candle");
    let want = s
        .rows
        .get(BATCH - 1)
        .and_then(|r| r.to_vec::<f32>())
        .expect("the array's row");
    assert_eq!(got, want[..16], "the first batch's last image");
}

impl Setup {
    /// candle's own `Tensor::to_device` of each field, then a sync of candle's stream.
    fn theirs(&self) -> Throughput {
        let b = &self.batch;
        bench::stream(OWN.0, OWN.1, batch_bytes(), || {
            let images = b.images.to_device(&self.cdev).expect("candle's to_device");
            let labels = b.labels.to_device(&self.cdev).expect("candle's to_device");
            self.cdev.synchronize().expect("candle's sync");
            drop((images, labels));
        })
    }

    /// The same candle CPU tensors through our `to_device(true)`, then the same sync.
    fn direct(&self) -> Throughput {
        bench::stream(OWN.0, OWN.1, batch_bytes(), || {
            let on = self
                .batch
                .to_device(&self.dev, true)
                .expect("our to_device");
            self.cdev.synchronize().expect("candle's sync");
            drop(on);
        })
    }

    /// The gathered loader, each batch handed to candle and candle's stream synced.
    fn gathered(&self) -> pinnable::Result<(Throughput, String)> {
        let (images, labels) = (self.pinned.clone(), self.labels.clone());
        let loader = Loader::builder(FnDataset::new((WARMUP + self.batches) * BATCH, |i| {
            Ok(i % IMAGES)
        }))
        .batch_size(BATCH)
        .workers(self.gather_workers)
        .device(self.dev.clone())
        .build_with(move |rows: Vec<usize>, _c| {
            Ok((
                Gather::rows(&images, rows.iter().copied())?,
                Gather::rows(&labels, rows)?,
            ))
        })?;
        self.drive(loader.run_epoch(0), |(x, y): (Gather, Gather)| {
            Ok((x.into_tensor()?, y.into_tensor()?))
        })
    }

    /// The host-collated loader, each batch handed to candle and candle's stream synced.
    fn collated(&self) -> pinnable::Result<(Throughput, String)> {
        let rows = self.rows.clone();
        let data = FnDataset::new((WARMUP + self.batches) * BATCH, move |i| {
            Ok((rows.get(i % IMAGES)?, (i % 1000) as i64))
        });
        let loader = Loader::builder(data)
            .batch_size(BATCH)
            .workers(self.workers)
            .device(self.dev.clone())
            .build(Stack)?;
        self.drive(loader.run_epoch(0), Ok)
    }

    /// Runs a loader's epoch to candle; checks the first batch; the figure and the pinned
    /// memory the loader held (peak / bound).
    fn drive<T>(
        &self,
        epoch: pinnable::loader::Epoch<T>,
        tensors: impl Fn(T) -> pinnable::Result<(Tensor, Tensor)>,
    ) -> pinnable::Result<(Throughput, String)> {
        let mut first = true;
        let (fig, stats) = bench::epoch(epoch, WARMUP, batch_bytes(), |b| {
            let (x, y) = tensors(b)?;
            let on = to_candle(x, y, &self.cdev)?;
            if std::mem::take(&mut first) {
                check_first(self, &on);
            }
            self.cdev.synchronize().expect("candle's sync");
            drop(on);
            Ok(())
        })?;
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        let held = format!(
            "{:.0} / {:.0} MiB",
            mib(stats.pinned_peak_bytes),
            mib(stats.pinned_bound_bytes)
        );
        Ok((fig, held))
    }
}

/// One variant's figures over the repeats.
#[derive(Default)]
struct Runs {
    figs: Vec<Throughput>,
    /// candle's own time a batch over ours, one a repeat.
    ratios: Vec<f64>,
    held: Option<String>,
}

impl Runs {
    fn push(&mut self, fig: Throughput, theirs: &Throughput) {
        self.ratios.push(theirs.per_batch() / fig.per_batch());
        self.figs.push(fig);
    }

    fn times(&self) -> Spread {
        Spread::seconds(self.figs.iter().map(Throughput::per_batch).collect())
    }

    /// The repeat whose throughput is the median of the repeats' (its step percentiles are
    /// the ones shown).
    fn median_run(&self) -> &Throughput {
        let mut by_time: Vec<&Throughput> = self.figs.iter().collect();
        by_time.sort_by(|a, b| a.per_batch().total_cmp(&b.per_batch()));
        by_time[by_time.len() / 2]
    }

    /// A summary row: time a batch, GB/s, wait and steps of the median repeat, ratios.
    fn row(&self, what: &str, raw: f64) -> String {
        let m = self.median_run();
        let ratio = if self.ratios.is_empty() {
            "—".into()
        } else {
            format!("**{}**", Spread::ratios(self.ratios.clone()))
        };
        format!(
            "| {what} | {} | {:.1} | {} | {} | {ratio} | {:.2}× | {} |",
            self.times(),
            m.gigabytes_per_second(),
            m.wait(),
            m.percentiles(),
            raw / m.per_batch(),
            self.held.as_deref().unwrap_or("—"),
        )
    }
}

fn main() {
    let Some(gpu) = cuda_or_skip("bench candle") else {
        return;
    };
    let cdev = candle::Device::new_cuda(0).expect("candle's cuda:0");
    let dev = Device::from_candle(&cdev).expect("our device from candle's");
    let mut r = rng("bench candle");
    let cpu = &candle::Device::Cpu;
    let repeats = env_usize("PINNABLE_BENCH_REPEATS").unwrap_or(7).max(5);
    let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
    let rows = TensorRows::new(random_tensor(
        &mut r,
        DType::F32,
        &[IMAGES, IMAGE[0], IMAGE[1], IMAGE[2]],
    ))
    .expect("rows");
    let pinned = rows.tensor().pin_memory().expect("pin the array");
    let s = Setup {
        batch: Batch {
            images: candle::Tensor::rand(0f32, 1f32, (BATCH, IMAGE[0], IMAGE[1], IMAGE[2]), cpu)
                .expect("candle images"),
            labels: candle::Tensor::arange(0i64, BATCH as i64, cpu).expect("candle labels"),
        },
        labels: Tensor::pinned_from_fn(&[IMAGES], |i| (i % 1000) as i64).expect("labels"),
        pinned,
        rows,
        batches: env_usize("PINNABLE_BENCH_BATCHES").unwrap_or(200).max(1),
        // The first of a list (as `benches/loader` takes), or the cores less two.
        workers: std::env::var("PINNABLE_BENCH_WORKERS")
            .ok()
            .and_then(|w| w.split(',').next()?.trim().parse().ok())
            .unwrap_or(cores.saturating_sub(2).max(1)),
        gather_workers: env_usize("PINNABLE_BENCH_GATHER_WORKERS").unwrap_or(2),
        cdev,
        dev,
    };
    let bytes = batch_bytes();

    // The ceiling is one copy repeated, each synced before the next: the median of its
    // repeats, not a stream.
    let raw = raw_one_copy(&gpu, bytes);
    let (mut own, mut gathered, mut collated, mut direct) = (
        Runs::default(),
        Runs::default(),
        Runs::default(),
        Runs::default(),
    );
    let mut log = String::new();
    for k in 1..=repeats {
        let theirs = s.theirs();
        let (g, g_held) = s.gathered().expect("the gathered loader");
        let (c, c_held) = s.collated().expect("the host-collated loader");
        let d = s.direct();
        for (what, fig) in [
            ("candle's own", &theirs),
            ("gathered", &g),
            ("collated", &c),
            ("candle CPU tensors, ours", &d),
        ] {
            let line = format!("repeat {k}, {what}: {fig}\n");
            print!("{line}");
            log.push_str(&line);
        }
        gathered.held = Some(g_held);
        collated.held = Some(c_held);
        gathered.push(g, &theirs);
        collated.push(c, &theirs);
        direct.push(d, &theirs);
        own.figs.push(theirs);
    }

    let mut md = format!(
        "## candle: a 64 × 3×224×224 f32 + 64 i64 batch (38.5 MB) to the GPU ({})\n\n\
         {repeats} repeats in one process, interleaved: candle's own `to_device`, then each of \
         ours, in every repeat. Every figure is a stream's steady-state throughput: a window of \
         batches after a warm-up ({} after {WARMUP} from a loader; {} after {} for a loop that \
         makes its own batches), its time over its batches; each step ends with candle's stream \
         synchronized. Ratios: candle's own time a batch over ours in the same repeat, their \
         median (range). Loader workers: {} gathering, {} collating on the host.\n\n\
         | figure | time a batch: median (range) | GB/s | consumer wait | steps (median repeat) \
         | × candle's own `to_device` | × raw ceiling | pinned held (peak / bound) |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |\n",
        s.dev.name(),
        s.batches,
        OWN.1,
        OWN.0,
        s.gather_workers,
        s.workers,
    );
    for (what, runs) in [
        ("candle's own `Tensor::to_device` per field + sync", &own),
        (
            "candle fed by the loader, **gathered** (a pinned array, each batch a `Gather` of rows)",
            &gathered,
        ),
        (
            "candle fed by the loader, collated on the host (views into pinned batches)",
            &collated,
        ),
        ("candle CPU tensors → our `to_device(true)` + sync", &direct),
    ] {
        md.push_str(&runs.row(what, raw));
        md.push('\n');
    }
    md.push_str(&format!(
        "| raw pinned `cuMemcpyHtoDAsync` of the batch's bytes + sync (ceiling; median of 30 \
         single copies) | {:.3} ms | {:.1} | — | — | — | 1.00× | — |\n",
        raw * 1e3,
        bytes as f64 / raw / 1e9
    ));
    let goal = Spread::ratios(gathered.ratios.clone());
    let met = gathered.ratios.iter().filter(|&&x| x >= 4.0).count();
    md.push_str(&format!(
        "\nGoal: candle fed by the loader, gathered, ≥ 4× candle's own `to_device` as \
         throughput: **{}**, {goal}; ≥ 4× in {met} of {repeats} repeats.\n\n\
         Every repeat:\n\n```\n{log}```\n",
        if goal.median() >= 4.0 {
            "met"
        } else {
            "not met"
        },
    ));
    println!("\n{md}");
    if let Ok(dir) = std::env::var("PINNABLE_BENCH_OUT") {
        std::fs::write(format!("{dir}/candle.md"), &md).expect("write candle.md");
    }
}
