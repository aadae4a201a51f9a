//! Many GPUs, both ways a training job runs them:
//! - one process feeding every GPU: a loader per device (`build_per_device`), each epoch on a
//!   thread of its own, as each GPU's training step runs;
//! - one process per GPU, told its rank by the launcher (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`).
//!   Started with `RANK` set, the program is that rank: it loads its shard onto
//!   `cuda:LOCAL_RANK` and prints its throughput, under any launcher that sets the three
//!   variables (`examples/launch_ranks.sh` is the smallest one, for one machine). Started
//!   without, it plays the launcher itself, starting one rank a GPU, and adds up their figures.
//!
//! Each runs twice, from one pinned array of images:
//! - collated on the host: samples are views of the array, and the loader's workers write each
//!   batch into a pinned block that is then copied (each byte crosses host memory three times);
//! - collated on the device: each batch is a `Gather` of the array's rows, which the copy engine
//!   reads where they are (once). Without CUDA, the rows are gathered when the batch is read.
//!
//! Each prints every device's steady-state throughput (a window of batches after a warm-up,
//! over their number, with the consumer's wait and per-step percentiles beside it) and the
//! total against one GPU fed alone. Without
//! CUDA it runs both forms on the host (two "devices" that are `Device::cpu()`), smaller.
//!
//!     cargo run --release --example multi_gpu
//!     cargo build --release --example multi_gpu
//!     examples/launch_ranks.sh 2 target/release/examples/multi_gpu   # two ranks, by hand
//!
//! `PINNABLE_MULTI_GPU_BATCHES` sets the batches timed a device (150; 12 without CUDA),
//! `PINNABLE_MULTI_GPU_WORKERS` the workers a device (the cores a device, less two), and
//! `PINNABLE_MULTI_GPU_COLLATE` one mode (`host` or `device`; both by default).

use std::process::{Command, Stdio};

use pinnable::loader::{Batcher, Collator, Dataset, Launch, Loader, LoaderBuilder, Stack};
use pinnable::{Device, Gather, Tensor, ToDevice};
use pinnable_harness::bench::{self, Throughput};

const BATCH: usize = 64;
const IMAGE: [usize; 3] = [3, 224, 224];
/// Images in the in-memory array the samples are views of.
const IMAGES: usize = 512;
/// Batches timed per device, after the warm-up.
const WARMUP: usize = 8;

struct Setup {
    devices: Vec<Device>,
    batches: usize,
    workers: usize,
}

/// The devices to feed and the work for each: every GPU, or only `cuda:LOCAL_RANK` in a rank's
/// process. Without CUDA, two host "devices" (one for a rank).
fn setup(rank: Option<&Launch>) -> pinnable::Result<Setup> {
    let gpus = pinnable::Device::count();
    let devices: Vec<Device> = match (gpus, rank) {
        (0, None) => vec![Device::cpu(), Device::cpu()],
        (0, Some(_)) => vec![Device::cpu()],
        (_, Some(launch)) => vec![launch.device()?],
        (_, None) => (0..gpus)
            .map(Device::cuda)
            .collect::<pinnable::Result<_>>()?,
    };
    // Each GPU's share of the cores (a rank's too, one a GPU); two "devices" without CUDA.
    let shares = if gpus > 0 { gpus } else { 2 };
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    Ok(Setup {
        batches: std::env::var("PINNABLE_MULTI_GPU_BATCHES")
            .ok()
            .and_then(|b| b.parse().ok())
            .unwrap_or(if gpus > 0 { 150 } else { 12 }),
        // Leave each device's transfer thread and consumer a core.
        workers: std::env::var("PINNABLE_MULTI_GPU_WORKERS")
            .ok()
            .and_then(|w| w.parse().ok())
            .unwrap_or((cores / shares).saturating_sub(2).max(1)),
        devices,
    })
}

/// `len` samples: zero-copy views of one pinned array of images, and a label. Collated on the
/// host: the batcher ([`Stack`]) writes each batch into a pinned block of its own, which is
/// then copied to the device.
struct Images {
    images: Tensor,
    len: usize,
}

impl Dataset for Images {
    type Sample = (Tensor, i64);

    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, i: usize) -> pinnable::Result<(Tensor, i64)> {
        let k = i % IMAGES;
        Ok((
            self.images.narrow(0, k, 1)?.reshape(&IMAGE)?,
            (k % 1000) as i64,
        ))
    }
}

/// The same samples by index, gathered on the device: each batch is two [`Gather`]s of rows of
/// the pinned arrays, which the copy engine reads where they are, so nothing is collated on
/// the host.
struct Indices {
    len: usize,
}

impl Dataset for Indices {
    type Sample = usize;

    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, i: usize) -> pinnable::Result<usize> {
        Ok(i % IMAGES)
    }
}

#[derive(Clone)]
struct GatherRows {
    images: Tensor,
    labels: Tensor,
}

impl Batcher<usize> for GatherRows {
    type Batch = (Gather, Gather);

    fn batch(&self, rows: Vec<usize>, _c: &mut Collator) -> pinnable::Result<(Gather, Gather)> {
        Ok((
            Gather::rows(&self.images, rows.iter().copied())?,
            Gather::rows(&self.labels, rows)?,
        ))
    }
}

/// The pinned arrays both datasets read: images and their labels.
fn arrays() -> pinnable::Result<(Tensor, Tensor)> {
    let images = Tensor::pinned_from_fn(&[IMAGES, IMAGE[0], IMAGE[1], IMAGE[2]], |i| {
        ((i * 2_654_435_761) % 1000) as f32 / 1000.0
    })?;
    let labels = Tensor::pinned_from_fn(&[IMAGES], |k| (k % 1000) as i64)?;
    Ok((images, labels))
}

/// Where batches are collated.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Collate {
    /// Into a pinned block by the loader's workers, then copied.
    Host,
    /// By the copy engine, straight from the pinned arrays ([`Gather`]).
    Device,
}

impl Collate {
    fn name(self) -> &'static str {
        match self {
            Collate::Host => "host",
            Collate::Device => "device",
        }
    }

    /// The modes `PINNABLE_MULTI_GPU_COLLATE` asks for (`host`, `device`; both by default).
    fn chosen() -> Vec<Collate> {
        match std::env::var("PINNABLE_MULTI_GPU_COLLATE").as_deref() {
            Ok("host") => vec![Collate::Host],
            Ok("device") => vec![Collate::Device],
            _ => vec![Collate::Host, Collate::Device],
        }
    }
}

/// A batch whose first tensor's copy can be waited for.
trait Arrived {
    fn wait(&self) -> pinnable::Result<()>;
}

impl Arrived for (Tensor, Tensor) {
    fn wait(&self) -> pinnable::Result<()> {
        match self.0.ready_event() {
            Some(e) => e.synchronize(),
            None => Ok(()),
        }
    }
}

impl Arrived for (Gather, Gather) {
    fn wait(&self) -> pinnable::Result<()> {
        match self.0.tensor()?.ready_event() {
            Some(e) => e.synchronize(),
            None => Ok(()),
        }
    }
}

fn batch_bytes() -> usize {
    BATCH * IMAGE.iter().product::<usize>() * 4 + BATCH * 8
}

/// Runs one epoch of `loader`, each batch read when its copy is done; the throughput over
/// the batches after the warm-up.
fn drive<D, B>(loader: &Loader<D, B>) -> pinnable::Result<Throughput>
where
    D: Dataset + 'static,
    B: Batcher<D::Sample> + 'static,
    B::Batch: ToDevice + Arrived + 'static,
{
    let (fig, _) = bench::epoch(loader.run_epoch(0), WARMUP, batch_bytes(), |b| b.wait())?;
    Ok(fig)
}

/// GB/s of `batches` in a window of `seconds` (a rank's figures, read from its line).
fn gbs(batches: usize, seconds: f64) -> f64 {
    (batches * batch_bytes()) as f64 / seconds / 1e9
}

/// A process started as rank `RANK` of `WORLD_SIZE` on `cuda:LOCAL_RANK`, by this example
/// or another launcher: one line a collation mode, `rank <rank> <batches> <window seconds>
/// (…)`.
fn rank() -> pinnable::Result<()> {
    let launch = Launch::from_env()?;
    let s = setup(Some(&launch))?;
    let device = &s.devices[0];
    let len = launch.world * (WARMUP + s.batches) * BATCH;
    let (images, labels) = arrays()?;
    for mode in Collate::chosen() {
        let fig = match mode {
            Collate::Host => drive(
                &as_rank(
                    Loader::builder(Images {
                        images: images.clone(),
                        len,
                    }),
                    &s,
                    launch,
                )?
                .build(Stack)?,
            )?,
            Collate::Device => drive(
                &as_rank(Loader::builder(Indices { len }), &s, launch)?.build(GatherRows {
                    images: images.clone(),
                    labels: labels.clone(),
                })?,
            )?,
        };
        println!(
            "rank {r} {} {:.6} (collated on the {}; rank {r} of {} on {device}: {fig})",
            fig.batches,
            fig.window,
            mode.name(),
            launch.world,
            r = launch.rank,
        );
    }
    Ok(())
}

/// A rank's loader: its batch size, workers, shard (`RANK` of `WORLD_SIZE`) and device
/// (`cuda:LOCAL_RANK`). A real job calls `launch_from_env()` on its builder.
fn as_rank<D: Dataset>(
    b: LoaderBuilder<D>,
    s: &Setup,
    launch: Launch,
) -> pinnable::Result<LoaderBuilder<D>> {
    let b = b.batch_size(BATCH).workers(s.workers);
    if s.devices[0].is_cpu() {
        // Without CUDA every rank runs on the host, as the rest of the example does.
        Ok(b.shard(launch.rank, launch.world))
    } else {
        Ok(b.launch(launch))
    }
}

/// The three runs of one collation mode: one device alone, one process for every device, one
/// process a device.
fn run<D, B>(
    s: &Setup,
    mode: Collate,
    dataset: impl Fn(usize) -> D,
    batcher: B,
) -> pinnable::Result<()>
where
    D: Dataset + 'static,
    B: Batcher<D::Sample> + Clone + 'static,
    B::Batch: ToDevice + Arrived + 'static,
{
    let n = s.devices.len();
    let m = mode.name();
    // One GPU alone: the baseline.
    let alone = Loader::builder(dataset((WARMUP + s.batches) * BATCH))
        .batch_size(BATCH)
        .workers(s.workers)
        .device(s.devices[0].clone())
        .build(batcher.clone())?;
    let alone = drive(&alone)?;
    let one = alone.gigabytes_per_second();
    println!("collated on the {m}, one device alone: {alone}");

    // One process, every device.
    let loaders = Loader::builder(dataset(n * (WARMUP + s.batches) * BATCH))
        .batch_size(BATCH)
        .workers(s.workers)
        .build_per_device(&s.devices, batcher)?;
    let runs: Vec<pinnable::Result<Throughput>> = std::thread::scope(|scope| {
        let handles: Vec<_> = loaders
            .iter()
            .map(|l| scope.spawn(move || drive(l)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a device's thread panicked"))
            .collect()
    });
    let mut total = 0.0;
    for (k, run) in runs.into_iter().enumerate() {
        let fig = run?;
        total += fig.gigabytes_per_second();
        println!("collated on the {m}, one process, device {k}: {fig}");
    }
    println!(
        "collated on the {m}, one process, {n} devices: {total:.1} GB/s together, {:.2}× one \
         device alone",
        total / one
    );
    drop(loaders);

    // One process per device, as a launcher starts them.
    if s.devices.iter().all(Device::is_cpu) {
        println!("one process a device: skipped, it needs CUDA devices to give each rank its own");
        return Ok(());
    }
    let exe = std::env::current_exe()
        .map_err(|e| failed(format!("cannot find this program to start its ranks: {e}")))?;
    let mut started = Vec::with_capacity(n);
    for k in 0..n {
        let rank = Command::new(&exe)
            .env("PINNABLE_MULTI_GPU_COLLATE", m)
            .env("RANK", k.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_RANK", k.to_string())
            .stdout(Stdio::piped())
            .spawn();
        match rank {
            Ok(rank) => started.push(rank),
            Err(e) => {
                // Leave no rank running on the GPUs behind us.
                for mut rank in started {
                    let _ = rank.kill();
                    let _ = rank.wait();
                }
                return Err(failed(format!("cannot start rank {k}: {e}")));
            }
        }
    }
    // Every rank has finished before any result is read, so none outlives an error.
    let finished: Vec<_> = started
        .into_iter()
        .map(std::process::Child::wait_with_output)
        .collect();
    let mut total = 0.0;
    for (k, out) in finished.into_iter().enumerate() {
        let out = out.map_err(|e| failed(format!("rank {k} did not finish: {e}")))?;
        let line = String::from_utf8_lossy(&out.stdout);
        let figures: Vec<&str> = line.split_whitespace().collect();
        let (Some(b), Some(t)) = (
            figures
                .as_slice()
                .get(2)
                .and_then(|b| b.parse::<usize>().ok()),
            figures
                .as_slice()
                .get(3)
                .and_then(|t| t.parse::<f64>().ok()),
        ) else {
            return Err(failed(format!("rank {k} failed ({}): {line}", out.status)));
        };
        total += gbs(b, t);
        println!(
            "collated on the {m}, one process a device, rank {k} on cuda:{k}: {b} batches in {t:.3} s, {:.1} GB/s",
            gbs(b, t)
        );
    }
    println!(
        "collated on the {m}, one process a device, {n} ranks: {total:.1} GB/s together, {:.2}× one device alone",
        total / one
    );
    Ok(())
}

fn main() -> pinnable::Result<()> {
    // Started by a launcher: be its rank.
    if std::env::var_os("RANK").is_some() {
        return rank();
    }
    let s = setup(None)?;
    println!(
        "{} device(s): {}; {} workers a device; batches of {:.1} MB, {} timed a device",
        s.devices.len(),
        s.devices
            .iter()
            .map(|d| format!("{d} ({})", d.name()))
            .collect::<Vec<_>>()
            .join(", "),
        s.workers,
        batch_bytes() as f64 / 1e6,
        s.batches
    );
    let (images, labels) = arrays()?;
    for mode in Collate::chosen() {
        match mode {
            Collate::Host => run(
                &s,
                mode,
                |len| Images {
                    images: images.clone(),
                    len,
                },
                Stack,
            )?,
            Collate::Device => {
                let batcher = GatherRows {
                    images: images.clone(),
                    labels: labels.clone(),
                };
                run(&s, mode, |len| Indices { len }, batcher)?;
            }
        }
    }
    Ok(())
}

fn failed(message: String) -> pinnable::Error {
    pinnable::Error::other(message)
}
