//! Many GPUs, both ways a training job runs them:
//! - one process feeding every GPU: a loader per device (`build_per_device`), each epoch on a
//!   thread of its own, as each GPU's training step runs;
//! - one process per GPU, told its rank by the launcher (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`).
//!   Started with `RANK` set, the program is that rank: it loads its shard onto
//!   `cuda:LOCAL_RANK` and prints its figures, under any launcher that sets the three
//!   variables (`examples/launch_ranks.sh` is the smallest one, for one machine). Started
//!   without, it plays the launcher itself, starting one rank a GPU, and adds up their figures.
//!
//! Each runs twice, from one pinned array of images:
//! - collated on the host: samples are views of the array, and the loader's workers write each
//!   batch into a pinned block that is then copied (each byte crosses host memory three times);
//! - collated on the device: each batch is a `Gather` of the array's rows, which the copy engine
//!   reads where they are (once). Without CUDA, the rows are gathered when the batch is read.
//!
//! Both forms are measured alike, so their totals compare:
//! - each device (a thread, or a rank) warms up: `Loader::bound` batches, as many as the pinned
//!   blocks its loader may hold (so its pool has grown before anything is timed), and 8 at the
//!   least;
//! - it keeps taking batches, at its steady state, until a start common to every device: in
//!   one process, the end of the last device's warm-up; for ranks, a wall-clock instant the
//!   launcher picks ahead (its own start-up and warm-up times, doubled, and 2 s at the least)
//!   and passes in `PINNABLE_MULTI_GPU_START`, in ns since the UNIX epoch (a rank started
//!   without it starts at the end of its own warm-up);
//! - its window opens at the end of its first batch at or after that start, and runs 2 s.
//!
//! Each device prints its window's throughput (its bytes over its length, with the consumer's
//! wait and per-step percentiles beside it), when it was warm and where its window lies, from
//! the common start. A total is the bytes of every window over their union (from the first
//! window's start to the last one's end), against one GPU fed alone (measured the same way, on
//! the shard the first device reads when every device runs); beside it, the plain sum of the
//! devices' own rates and how long every window ran at once (from the last start to the first
//! end), so a reader sees whether the devices ran together.
//! Without CUDA both forms run on the host ("devices" that are `Device::cpu()`, two of them),
//! smaller: an array of 128 images, batches of 16, windows of 0.25 s, and a start 0.5 s ahead
//! at the least.
//!
//!     cargo run --release --example multi_gpu
//!     cargo build --release --example multi_gpu
//!     examples/launch_ranks.sh 2 target/release/examples/multi_gpu   # two ranks, by hand
//!
//! `PINNABLE_MULTI_GPU_BATCHES` sets the batches timed a device in place of a window's time
//! (CI times 2), `PINNABLE_MULTI_GPU_WORKERS` the workers a device (the cores a device, less
//! two), and `PINNABLE_MULTI_GPU_COLLATE` one mode (`host` or `device`; both by default).
//!
//! A rank prints one line a collation mode: `rank <rank> <batches> <bytes> <warm-up's end>
//! <window's start> <window's end> (…)`, the times in ns since the UNIX epoch.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pinnable::loader::{Batcher, Collator, Dataset, Launch, Loader, LoaderBuilder, Stack};
use pinnable::{Device, Gather, Tensor, ToDevice};
use pinnable_harness::bench::{Throughput, Window};

const IMAGE: [usize; 3] = [3, 224, 224];
/// Images a batch (38.5 MB), and in the in-memory array the samples are views of (308 MB).
const BATCH: usize = 64;
const IMAGES: usize = 512;
/// The same without CUDA, smaller: in CI's debug build each process fills its array, and each
/// device takes a batch, in a fraction of the time.
const HOST_BATCH: usize = 16;
const HOST_IMAGES: usize = 128;
/// Batches a device takes before its window at the least, however few pinned blocks its
/// loader holds.
const WARMUP: usize = 8;
/// A device's window, unless `PINNABLE_MULTI_GPU_BATCHES` sets a count of batches; shorter
/// without CUDA.
const WINDOW: Duration = Duration::from_secs(2);
const HOST_WINDOW: Duration = Duration::from_millis(250);
/// Batches a device's epoch holds besides a counted window: its warm-up, its wait for the
/// common start and a 2 s window. 16384 batches of 38.5 MB are 630 GB, 10 s at 60 GB/s (a
/// window cut short by its epoch's end says so).
const SPARE: usize = 1 << 14;
/// How far ahead the launcher sets its ranks' common start, at the least: with CUDA, and
/// without (where every rank runs on the host).
const LEAD: Duration = Duration::from_secs(2);
const HOST_LEAD: Duration = Duration::from_millis(500);
/// The variable a rank reads its window's start from: ns since the UNIX epoch.
const START: &str = "PINNABLE_MULTI_GPU_START";

struct Setup {
    devices: Vec<Device>,
    length: Length,
    workers: usize,
    /// Images in the array.
    images: usize,
    /// Images a batch.
    batch: usize,
}

impl Setup {
    /// Bytes a batch carries: its images and their labels.
    fn batch_bytes(&self) -> usize {
        self.batch * (IMAGE.iter().product::<usize>() * 4 + 8)
    }

    /// Samples a device's epoch holds.
    fn epoch(&self) -> usize {
        self.length.epoch() * self.batch
    }
}

/// How long each device's window runs.
#[derive(Clone, Copy, Debug)]
enum Length {
    /// This many batches.
    Batches(usize),
    /// Until the first batch that ends this long after the window's start (or the epoch's end).
    Time(Duration),
}

impl Length {
    fn done(self, batches: usize, elapsed: Duration) -> bool {
        match self {
            Length::Batches(n) => batches >= n,
            Length::Time(t) => batches > 0 && elapsed >= t,
        }
    }

    /// Batches a device's epoch holds: a counted window's and the [`SPARE`].
    fn epoch(self) -> usize {
        SPARE
            + match self {
                Length::Batches(n) => n,
                Length::Time(_) => 0,
            }
    }
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
    let batches = std::env::var("PINNABLE_MULTI_GPU_BATCHES")
        .ok()
        .and_then(|b| b.parse().ok())
        .filter(|&b| b > 0);
    Ok(Setup {
        length: match (batches, gpus) {
            (Some(b), _) => Length::Batches(b),
            (None, 0) => Length::Time(HOST_WINDOW),
            (None, _) => Length::Time(WINDOW),
        },
        // Leave each device's transfer thread and consumer a core.
        workers: std::env::var("PINNABLE_MULTI_GPU_WORKERS")
            .ok()
            .and_then(|w| w.parse().ok())
            .unwrap_or((cores / shares).saturating_sub(2).max(1)),
        images: if gpus > 0 { IMAGES } else { HOST_IMAGES },
        batch: if gpus > 0 { BATCH } else { HOST_BATCH },
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
        let k = i % self.images.shape()[0];
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
    images: usize,
}

impl Dataset for Indices {
    type Sample = usize;

    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, i: usize) -> pinnable::Result<usize> {
        Ok(i % self.images)
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

/// The pinned arrays both datasets read: `n` images and their labels.
fn arrays(n: usize) -> pinnable::Result<(Tensor, Tensor)> {
    let images = Tensor::pinned_from_fn(&[n, IMAGE[0], IMAGE[1], IMAGE[2]], |i| {
        ((i * 2_654_435_761) % 1000) as f32 / 1000.0
    })?;
    let labels = Tensor::pinned_from_fn(&[n], |k| (k % 1000) as i64)?;
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

/// Now on the wall clock, which every process of the machine reads alike: ns since the UNIX
/// epoch.
fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The instant every device's window opens at (ns since the UNIX epoch): each device, once
/// warm, keeps taking batches until one ends at or after it, and its window opens there.
struct Start {
    /// Devices still warming up: the last to finish sets the instant, at the end of its
    /// warm-up.
    warming: AtomicUsize,
    /// The instant; 0 while it is not set.
    at: AtomicU64,
}

impl Start {
    /// Set when the last of `devices` has warmed up (the devices of one process).
    fn when_warm(devices: usize) -> Start {
        Start {
            warming: AtomicUsize::new(devices),
            at: AtomicU64::new(0),
        }
    }

    /// Fixed beforehand (a rank's, picked by the launcher).
    fn at(ns: u64) -> Start {
        Start {
            warming: AtomicUsize::new(0),
            at: AtomicU64::new(ns.max(1)),
        }
    }

    /// A device has warmed up (or failed before it did) at `now`.
    fn arrive(&self, now: u64) {
        let last = self
            .warming
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| w.checked_sub(1));
        if last == Ok(1) {
            self.at.store(now, Ordering::Release);
        }
    }

    fn get(&self) -> Option<u64> {
        Some(self.at.load(Ordering::Acquire)).filter(|&at| at > 0)
    }
}

/// A device's arrival at the [`Start`], made when dropped if the device did not get there (its
/// run failed), so the others do not wait for it.
struct Arrival<'a>(Option<&'a Start>);

impl Arrival<'_> {
    fn arrive(&mut self, now: u64) {
        if let Some(start) = self.0.take() {
            start.arrive(now);
        }
    }
}

impl Drop for Arrival<'_> {
    fn drop(&mut self) {
        self.arrive(now_ns());
    }
}

/// A device's window on the wall clock (ns since the UNIX epoch) and the bytes its batches
/// carried.
#[derive(Clone, Copy, Debug)]
struct Interval {
    start: u64,
    end: u64,
    bytes: u64,
}

impl Interval {
    fn seconds(self) -> f64 {
        self.end.saturating_sub(self.start) as f64 / 1e9
    }

    /// The device's own rate over its window, GB/s.
    fn rate(self) -> f64 {
        self.bytes as f64 / self.seconds() / 1e9
    }
}

/// Where a device's run lies from the common start `at`: when its warm-up ended (`warm`), and
/// its window.
fn lies(warm: u64, window: Interval, at: u64) -> String {
    let ms = |t: u64| (t as i128 - at as i128) as f64 / 1e6;
    let late = if warm > at {
        " (after the start: its window opened late)"
    } else {
        ""
    };
    format!(
        "warm at {:+.1} ms{late}, window {:+.1} to {:+.1} ms from the common start",
        ms(warm),
        ms(window.start),
        ms(window.end)
    )
}

/// A device's run: its figures over its window, and where the window lies.
struct Timed {
    fig: Throughput,
    interval: Interval,
    /// From its epoch's start to the end of its warm-up.
    warmed: Duration,
    /// The end of its warm-up (ns since the UNIX epoch).
    warm: u64,
    /// Whether its epoch ended before the window's time was up.
    cut: bool,
}

/// Runs an epoch of `loader`, each batch read when its copy is done: a warm-up of at least
/// [`WARMUP`] and [`Loader::bound`] batches, batches until the common `start`, then the
/// window ([`Setup::length`]).
fn drive<D, B>(loader: &Loader<D, B>, start: &Start, s: &Setup) -> pinnable::Result<Timed>
where
    D: Dataset + 'static,
    B: Batcher<D::Sample> + 'static,
    B::Batch: ToDevice + Arrived + 'static,
{
    let mut arrival = Arrival(Some(start));
    let warmup = WARMUP.max(loader.bound());
    let begun = Instant::now();
    let mut epoch = loader.run_epoch(0);
    // A step ends when the consumer is done with its batch; the window opens at the end of the
    // first step that ends at or after the start, once warm. Until then the loader runs at its
    // steady state (a device idle until the start would find its pool full, and take the first
    // batches of its window for free).
    let mut window = Window::new(1, s.batch_bytes());
    let (mut taken, mut warmed, mut warm) = (0, Duration::ZERO, 0);
    let (opened, opened_ns) = loop {
        let Some(batch) = epoch.next() else {
            return Err(failed(format!(
                "{}: its epoch ended after {taken} batches, before the common start",
                loader.device()
            )));
        };
        batch?.wait()?;
        taken += 1;
        let now = now_ns();
        if taken == warmup {
            (warmed, warm) = (begun.elapsed(), now);
            arrival.arrive(now);
        }
        if taken >= warmup && start.get().is_some_and(|at| now >= at) {
            window.step_with(&epoch.stats());
            break (Instant::now(), now_ns());
        }
    };
    let (mut batches, mut cut) = (0, false);
    while !s.length.done(batches, opened.elapsed()) {
        let Some(batch) = epoch.next() else {
            cut = true;
            break;
        };
        batch?.wait()?;
        window.step_with(&epoch.stats());
        batches += 1;
    }
    if batches == 0 {
        return Err(failed(format!(
            "{}: its epoch ended at the common start, before any batch was timed",
            loader.device()
        )));
    }
    let fig = window.finish();
    let interval = Interval {
        start: opened_ns,
        end: opened_ns + (fig.window * 1e9) as u64,
        bytes: (fig.batches * fig.batch_bytes) as u64,
    };
    Ok(Timed {
        fig,
        interval,
        warmed,
        warm,
        cut,
    })
}

/// `; its epoch ended first` for a window cut short.
fn cut_short(cut: bool) -> &'static str {
    if cut { "; its epoch ended first" } else { "" }
}

/// A process started as rank `RANK` of `WORLD_SIZE` on `cuda:LOCAL_RANK`, by this example
/// or another launcher: one line a collation mode, `rank <rank> <batches> <bytes> <warm-up's
/// end> <window's start> <window's end> (…)`, the times in ns since the UNIX epoch.
fn rank() -> pinnable::Result<()> {
    let launch = Launch::from_env()?;
    let common = match std::env::var(START) {
        Ok(at) => Some(at.trim().parse::<u64>().map_err(|e| {
            failed(format!(
                "{START}={at}: not a time in ns since the UNIX epoch ({e})"
            ))
        })?),
        Err(_) => None,
    };
    let s = setup(Some(&launch))?;
    let device = &s.devices[0];
    let len = launch.world * s.epoch();
    let (images, labels) = arrays(s.images)?;
    for mode in Collate::chosen() {
        let start = common.map_or_else(|| Start::when_warm(1), Start::at);
        let run = match mode {
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
                &start,
                &s,
            )?,
            Collate::Device => drive(
                &as_rank(
                    Loader::builder(Indices {
                        len,
                        images: s.images,
                    }),
                    &s,
                    launch,
                )?
                .build(GatherRows {
                    images: images.clone(),
                    labels: labels.clone(),
                })?,
                &start,
                &s,
            )?,
        };
        let Interval {
            start: t0,
            end,
            bytes,
        } = run.interval;
        let whence = match common {
            Some(at) => format!("; {}", lies(run.warm, run.interval, at)),
            None => String::new(),
        };
        println!(
            "rank {r} {} {bytes} {} {t0} {end} (collated on the {}; rank {r} of {} on {device}: \
             {}{whence}{})",
            run.fig.batches,
            run.warm,
            mode.name(),
            launch.world,
            run.fig,
            cut_short(run.cut),
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
    let b = b.batch_size(s.batch).workers(s.workers);
    if s.devices[0].is_cpu() {
        // Without CUDA every rank runs on the host, as the rest of the example does.
        Ok(b.shard(launch.rank, launch.world))
    } else {
        Ok(b.launch(launch))
    }
}

/// The total of devices run at once, `what`: the bytes of every window over their union, and
/// the ratio to `one` device alone (GB/s); beside it the sum of the devices' own rates, and how
/// long every window ran at once.
fn total(what: &str, windows: &[Interval], one: f64) {
    let first = windows.iter().map(|w| w.start).min().unwrap_or(0);
    let last = windows.iter().map(|w| w.end).max().unwrap_or(0);
    let union = Interval {
        start: first,
        end: last,
        bytes: windows.iter().map(|w| w.bytes).sum(),
    };
    let together = union.rate();
    let sum: f64 = windows.iter().map(|w| w.rate()).sum();
    let latest_start = windows.iter().map(|w| w.start).max().unwrap_or(0);
    let earliest_end = windows.iter().map(|w| w.end).min().unwrap_or(0);
    let overlap = (earliest_end as i128 - latest_start as i128) as f64 / 1e6;
    let span = union.seconds() * 1e3;
    println!(
        "{what}: {together:.1} GB/s together, {:.2}× one device alone ({:.2} GB in the \
         {span:.1} ms from the first window's start to the last one's end)",
        together / one,
        union.bytes as f64 / 1e9,
    );
    let ran = if overlap >= 0.0 {
        format!(
            "all ran at once for {overlap:.1} ms of those {span:.1} ms ({:.0}%)",
            100.0 * overlap / span
        )
    } else {
        format!(
            "never all ran at once: the last opened {:.1} ms after the first closed",
            -overlap
        )
    };
    println!(
        "    the devices' own rates add up to {sum:.1} GB/s ({:.2}× one device alone); their \
         windows {ran}",
        sum / one
    );
}

/// The three runs of one collation mode: one device alone, one process for every device, one
/// process a device. `ready` is how long this process took to be ready to load (its CUDA
/// start-up, its arrays): with the devices' warm-up, what the ranks' common start allows for.
fn run<D, B>(
    s: &Setup,
    mode: Collate,
    ready: Duration,
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
    // One GPU alone: the baseline. It takes device 0's shard of the runs of every device, so it
    // reads the images device 0 reads there: the whole array would miss the CPU's caches more
    // often than a shard does (without CUDA, two devices made 2.7× one device's rate so).
    let alone = Loader::builder(dataset(n * s.epoch()))
        .shard(0, n)
        .batch_size(s.batch)
        .workers(s.workers)
        .device(s.devices[0].clone())
        .build(batcher.clone())?;
    let alone = drive(&alone, &Start::when_warm(1), s)?;
    let one = alone.interval.rate();
    println!(
        "collated on the {m}, one device alone: {}{}",
        alone.fig,
        cut_short(alone.cut)
    );

    // One process, every device.
    let loaders = Loader::builder(dataset(n * s.epoch()))
        .batch_size(s.batch)
        .workers(s.workers)
        .build_per_device(&s.devices, batcher)?;
    let start = Start::when_warm(n);
    let runs: Vec<pinnable::Result<Timed>> = std::thread::scope(|scope| {
        let start = &start;
        let handles: Vec<_> = loaders
            .iter()
            .map(|l| scope.spawn(move || drive(l, start, s)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a device's thread panicked"))
            .collect()
    });
    drop(loaders);
    let runs = runs.into_iter().collect::<pinnable::Result<Vec<_>>>()?;
    let at = start.get().unwrap_or(0);
    for (k, run) in runs.iter().enumerate() {
        println!(
            "collated on the {m}, one process, device {k}: {}; {}{}",
            run.fig,
            lies(run.warm, run.interval, at),
            cut_short(run.cut)
        );
    }
    let windows: Vec<Interval> = runs.iter().map(|r| r.interval).collect();
    total(
        &format!("collated on the {m}, one process, {n} devices"),
        &windows,
        one,
    );

    // One process per device, as a launcher starts them, from a common start far enough ahead
    // for each to start up and warm up as this process did.
    let warmed = runs.iter().map(|r| r.warmed).max().unwrap_or_default();
    let least = if s.devices.iter().all(Device::is_cpu) {
        HOST_LEAD
    } else {
        LEAD
    };
    let lead = (2 * (ready + warmed)).max(least);
    let exe = std::env::current_exe()
        .map_err(|e| failed(format!("cannot find this program to start its ranks: {e}")))?;
    let at = now_ns() + lead.as_nanos() as u64;
    let mut started = Vec::with_capacity(n);
    for k in 0..n {
        let rank = Command::new(&exe)
            .env("PINNABLE_MULTI_GPU_COLLATE", m)
            .env(START, at.to_string())
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
    let mut windows = Vec::with_capacity(n);
    for (k, out) in finished.into_iter().enumerate() {
        let out = out.map_err(|e| failed(format!("rank {k} did not finish: {e}")))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().find(|l| l.starts_with("rank ")).unwrap_or("");
        let figures: Vec<u64> = line
            .split_whitespace()
            .skip(2)
            .take(5)
            .map_while(|f| f.parse().ok())
            .collect();
        let &[batches, bytes, warm, start, end] = figures.as_slice() else {
            return Err(failed(format!("rank {k} failed ({}): {text}", out.status)));
        };
        let w = Interval { start, end, bytes };
        println!(
            "collated on the {m}, one process a device, rank {k} on {}: {batches} batches in \
             {:.1} ms, {:.1} GB/s; {}",
            s.devices[k],
            w.seconds() * 1e3,
            w.rate(),
            lies(warm, w, at)
        );
        windows.push(w);
    }
    total(
        &format!(
            "collated on the {m}, one process a device, {n} ranks (their start set {:.1} s ahead)",
            lead.as_secs_f64()
        ),
        &windows,
        one,
    );
    Ok(())
}

fn main() -> pinnable::Result<()> {
    // Started by a launcher: be its rank.
    if std::env::var_os("RANK").is_some() {
        return rank();
    }
    let begun = Instant::now();
    let s = setup(None)?;
    println!(
        "{} device(s): {}; {} workers a device; batches of {} images ({:.1} MB) from an array \
         of {}; {} a device",
        s.devices.len(),
        s.devices
            .iter()
            .map(|d| format!("{d} ({})", d.name()))
            .collect::<Vec<_>>()
            .join(", "),
        s.workers,
        s.batch,
        s.batch_bytes() as f64 / 1e6,
        s.images,
        match s.length {
            Length::Batches(n) => format!("{n} batches timed"),
            Length::Time(t) => format!("windows of {t:?}"),
        },
    );
    let (images, labels) = arrays(s.images)?;
    let ready = begun.elapsed();
    for mode in Collate::chosen() {
        match mode {
            Collate::Host => run(
                &s,
                mode,
                ready,
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
                let n = s.images;
                run(&s, mode, ready, |len| Indices { len, images: n }, batcher)?;
            }
        }
    }
    Ok(())
}

fn failed(message: String) -> pinnable::Error {
    pinnable::Error::other(message)
}
