//! Token batches, nanoGPT's workload: random windows of a `train.bin` of u16 tokens (raw, as
//! nanoGPT's `prepare.py` writes it) as `x`, `y` i64 batches on the GPU — the u16 windows cross
//! the link and the GPU widens them — at 12×1024, 64×2048
//! and 256×4096, through the loader in steady state (time per batch = the window's time / its
//! batches, after a warm-up; the consumer syncs each batch's copies), from shards read into
//! pinned memory and from the memory-mapped file. Against nanoGPT's `get_batch` on the same
//! file (`bench/nanogpt_get_batch.py`, same run, `$PINNABLE_BENCH_OUT/nanogpt.txt`); against
//! the link: one copy of the batch's bytes from pinned memory. Then the consumer's wait with a
//! 1 ms kernel per batch, as a share of the epoch. Without a GPU it prints `skipped: …` for that
//! part. Always: batches built on the host (`Device::cpu()`), and the cost of resuming a
//! 10⁶-batch epoch at batch 10 and at batch 999 990.
//!
//! Every table has auto rows beside the rows at worker counts set by hand: the loader tunes
//! its workers and batches ahead, runs 3 s of untimed epochs, and is then timed as the others
//! are; the note under the table says where the tuning left them and when its last decision
//! came.
//!
//! Writes `$PINNABLE_BENCH_OUT/tokens.md`. The token file is
//! `$PINNABLE_BENCH_DATA/pinnable-train.bin` (the system's temporary directory by default),
//! shared with the PyTorch twin and kept for it while `PINNABLE_BENCH_OUT` is set. Knobs:
//! `PINNABLE_BENCH_TOKENS` (tokens in the file; the twin reads the same variable),
//! `PINNABLE_BENCH_WORKERS` (e.g. `4,8,auto`; `auto` or `0` is the auto row; by default 4 and
//! 8 workers where the cores allow, then auto), `PINNABLE_BENCH_BATCHES` (measured batches per
//! run).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pinnable::formats::tokens::{Residency, TokenBatch, TokenShards, TokenWindows};
use pinnable::loader::{Loader, Position, SplitMix64};
use pinnable::{DType, Device};
use pinnable_harness::bench::{
    AUTO, AutoRow, Tuning, WorkersOrAuto, auto_notes, env_usize, keep_tuning, median, raw_one_copy,
    settle, torch_rows, worker_counts, workers_cell,
};
use pinnable_harness::{cuda_or_skip, hold_stream};

const SIZES: [(usize, usize); 3] = [(12, 1024), (64, 2048), (256, 4096)];
/// The goals: nanoGPT's time over ours.
const GOALS: [f64; 3] = [10.0, 0.0, 50.0];

struct Report {
    md: String,
}

impl Report {
    fn line(&mut self, s: &str) {
        println!("{s}");
        self.md.push_str(s);
        self.md.push('\n');
    }
}

/// `dir/pinnable-train.bin` of `n` random u16 tokens below GPT-2's vocabulary, as nanoGPT's
/// `train.bin`; kept when it already has that size (the PyTorch twin may have written it).
fn token_file(dir: &Path, n: usize) -> PathBuf {
    let path = dir.join("pinnable-train.bin");
    if std::fs::metadata(&path).is_ok_and(|m| m.len() == 2 * n as u64) {
        return path;
    }
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).expect("create train.bin"));
    let mut r = SplitMix64::new(1337);
    let mut chunk = Vec::with_capacity(1 << 20);
    for i in 0..n {
        chunk.extend_from_slice(&((r.next_u64() % 50257) as u16).to_le_bytes());
        if chunk.len() == 1 << 20 || i + 1 == n {
            f.write_all(&chunk).expect("write train.bin");
            chunk.clear();
        }
    }
    f.flush().expect("write train.bin");
    path
}

/// One run's steady-state figures.
struct Run {
    /// Seconds per batch over the measured window.
    step: f64,
    /// The consumer's wait over the window, and over the whole epoch so far.
    wait_window: f64,
    wait_epoch: f64,
    /// Host time building one batch (one worker), and moving it (the transfer thread).
    build: f64,
    transfer: f64,
    batches: usize,
    /// What the tuning did, in an auto row.
    tuning: Option<Tuning>,
}

impl AutoRow for Run {
    fn tuning(&self) -> Option<&Tuning> {
        self.tuning.as_ref()
    }
}

/// Runs one epoch of `b`×`t` batches of `shards` to `device`; times `batches` batches after a
/// warm-up, each handed to `consume`. With [`AUTO`] workers, the loader first runs untimed
/// epochs for its tuning to settle.
fn run(
    shards: &Arc<TokenShards>,
    (b, t): (usize, usize),
    workers: usize,
    device: &Device,
    batches: usize,
    mut consume: impl FnMut(&TokenBatch),
) -> pinnable::Result<Run> {
    let windows = TokenWindows::new(shards.clone(), t)?;
    let batcher = windows.batcher(DType::I64)?;
    let loader = Loader::builder(windows)
        .batch_size(b)
        .shuffle(7)
        .drop_last(true)
        .workers_or_auto(workers)
        .device(device.clone())
        .build(batcher)?;
    let settling = if workers == AUTO {
        settle(&loader, |b| {
            consume(&b);
            Ok(())
        })?
    } else {
        Vec::new()
    };
    let mut epoch = loader.run_epoch(0);
    let warmup = (epoch.remaining().unwrap_or(0) / 4).min(16);
    let batches = batches.min(epoch.remaining().unwrap_or(0) - warmup);
    for batch in epoch.by_ref().take(warmup) {
        consume(&batch?);
    }
    let (before, start) = (epoch.stats(), Instant::now());
    for batch in epoch.by_ref().take(batches) {
        consume(&batch?);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let s = epoch.stats();
    let per = |d: Duration| d.as_secs_f64() / s.batches.max(1) as f64;
    Ok(Run {
        step: elapsed / batches.max(1) as f64,
        wait_window: (s.waited - before.waited).as_secs_f64() / elapsed,
        wait_epoch: s.wait_share(),
        build: per(s.collate),
        transfer: per(s.transfer),
        batches,
        tuning: (workers == AUTO).then(|| Tuning::new(&settling, &s)),
    })
}

fn ms(s: f64) -> String {
    format!("{:.3} ms", s * 1e3)
}

fn main() {
    let gpu = cuda_or_skip("bench tokens (GPU part)");
    let out = std::env::var("PINNABLE_BENCH_OUT").ok().map(PathBuf::from);
    let dir =
        std::env::var("PINNABLE_BENCH_DATA").map_or_else(|_| std::env::temp_dir(), PathBuf::from);
    let n = env_usize("PINNABLE_BENCH_TOKENS").unwrap_or(if gpu.is_some() {
        256 << 20
    } else {
        32 << 20
    });
    let batches =
        env_usize("PINNABLE_BENCH_BATCHES").unwrap_or(if gpu.is_some() { 200 } else { 24 });
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = worker_counts([4, 8].into_iter().filter(|&w| w < cores || w == 4));
    let t = Instant::now();
    let file = token_file(&dir, n);
    let mut rep = Report { md: String::new() };
    rep.line(&format!(
        "# token batches: random windows of nanoGPT's train.bin ({n} u16 tokens, {:.0} MB, \
         ready in {:.1} s)\n\ncores: {cores}; {batches} batches measured after a warm-up; x, y \
         i64: on the host built by the loader's workers, on the GPU gathered from the u16 tokens \
         and widened there\n",
        2.0 * n as f64 / 1e6,
        t.elapsed().as_secs_f64()
    ));
    let t = Instant::now();
    let pinned = Arc::new(
        TokenShards::options()
            .residency(Residency::Pinned)
            .open([&file])
            .expect("read train.bin into pinned memory"),
    );
    let read_in = t.elapsed().as_secs_f64();
    // SAFETY: the bench wrote (or checked) the file above and nothing writes it while mapped.
    let mapped = Arc::new(
        unsafe {
            TokenShards::options()
                .residency(Residency::Mapped)
                .open_mapped([&file])
        }
        .expect("map train.bin"),
    );
    rep.line(&format!(
        "opened: read into pinned memory in {:.1} ms ({:.1} GB/s); mapped\n",
        read_in * 1e3,
        2.0 * n as f64 / read_in / 1e9
    ));
    let sources = [("pinned", &pinned), ("mapped", &mapped)];

    host_part(&sources, &workers, batches, &mut rep);
    resume_part(&dir, &mut rep);
    if let Some(dev) = gpu {
        gpu_part(&dev, &sources, &workers, batches, &mut rep);
    }
    drop((pinned, mapped));
    if let Some(out) = out {
        std::fs::write(out.join("tokens.md"), &rep.md).expect("write tokens.md");
    } else {
        let _ = std::fs::remove_file(&file);
    }
}

fn host_part(
    sources: &[(&str, &Arc<TokenShards>)],
    workers: &[usize],
    batches: usize,
    rep: &mut Report,
) {
    rep.line("## on the host (Device::cpu: the consumer only takes batches)\n");
    rep.line("| batch × context | source | workers | per batch | x, y GB/s | build (one worker) | consumer wait |");
    rep.line("| --- | --- | --- | --- | --- | --- | --- |");
    let mut notes = Vec::new();
    for (b, t) in SIZES {
        for (name, shards) in sources {
            for &w in workers {
                let m = run(shards, (b, t), w, &Device::cpu(), batches, |_| {});
                keep_tuning(&mut notes, format!("{b}×{t}, {name}"), &m);
                let w = workers_cell(w);
                let line = match m {
                    Ok(m) => format!(
                        "| {b}×{t} | {name} | {w} | {} | {:.1} | {} | {:.0}% |",
                        ms(m.step),
                        (2 * b * t * 8) as f64 / m.step / 1e9,
                        ms(m.build),
                        100.0 * m.wait_window
                    ),
                    Err(e) => format!("| {b}×{t} | {name} | {w} | error: {e} | | | |"),
                };
                rep.line(&line);
            }
        }
    }
    if let Some(note) = auto_notes(&notes) {
        rep.line(&note);
    }
}

/// Time to the first batch of a loader over a 10⁶-batch epoch resumed at `batch`.
fn resume_once(windows: &TokenWindows, position: Position, batch: u64) -> f64 {
    let p: Position = position
        .to_string()
        .replace("batch=0", &format!("batch={batch}"))
        .parse()
        .expect("a position");
    let start = Instant::now();
    let loader = Loader::builder(windows.clone())
        .batch_size(1)
        .shuffle(7)
        .workers(2)
        .resume(p)
        .build(windows.batcher(DType::I64).expect("batcher"))
        .expect("resume");
    let mut epoch = loader.iter();
    epoch.next().expect("a batch").expect("a batch");
    let t = start.elapsed().as_secs_f64();
    assert_eq!(epoch.remaining().unwrap_or(0) as u64, 1_000_000 - batch - 1);
    t
}

fn resume_part(dir: &Path, rep: &mut Report) {
    // 8 000 001 tokens: 10⁶ windows of 8 + 1, one a batch.
    let path = dir.join(format!("pinnable-resume-{}.bin", std::process::id()));
    let mut r = SplitMix64::new(5);
    let bytes: Vec<u8> = (0..8_000_001)
        .flat_map(|_| ((r.next_u64() % 50257) as u16).to_le_bytes())
        .collect();
    std::fs::write(&path, bytes).expect("write resume.bin");
    let windows = TokenWindows::new(TokenShards::open([&path]).expect("read"), 8).expect("windows");
    let position = Loader::builder(windows.clone())
        .batch_size(1)
        .shuffle(7)
        .build(windows.batcher(DType::I64).expect("batcher"))
        .expect("loader")
        .position();
    let time = |batch| {
        median(
            (0..7)
                .map(|_| resume_once(&windows, position, batch))
                .collect(),
        )
    };
    time(10);
    let (early, late) = (time(10), time(999_990));
    rep.line(&format!(
        "\n## resume: a 10⁶-batch shuffled epoch, time to the first batch\n\nat batch 10: {}; \
         at batch 999 990: {} (ratio {:.2}); both compute the epoch's order (10⁶ windows) and \
         load only the batches from the position on\n",
        ms(early),
        ms(late),
        late / early
    ));
    let _ = std::fs::remove_file(&path);
}

/// The consumer on the GPU: waits for the batch's copies on a compute stream, runs a kernel of
/// `spin_ns` nanoseconds and a read of every byte of `x` and `y` when the bench's kernels are
/// loaded (else holds the stream as long), then syncs the stream.
struct Consumer(pinnable_harness::kernels::Consumer);

impl Consumer {
    fn new(dev: &Device) -> Consumer {
        Consumer(pinnable_harness::kernels::Consumer::new(dev))
    }

    /// Waits until the batch is on the device, as nanoGPT's loop does after `get_batch`
    /// (`torch.cuda.synchronize()`): the host waits for the batch's ready event.
    fn wait(&self, b: &TokenBatch) {
        let x = b.x.tensor().expect("x");
        if let Some(ready) = x.ready_event() {
            ready.synchronize().expect("sync");
        }
    }

    fn step(&self, b: &TokenBatch, spin_ns: u64) {
        let (x, y) = (b.x.tensor().expect("x"), b.y.tensor().expect("y"));
        match &self.0.kernels {
            Some(k) => {
                let (vx, vy) = (
                    x.cuda_view::<i64>(&self.0.stream).expect("view"),
                    y.cuda_view::<i64>(&self.0.stream).expect("view"),
                );
                if spin_ns > 0 {
                    k.spin(&self.0.stream, spin_ns);
                }
                let sum = self.0.sum_ptr();
                for v in [&vx, &vy] {
                    // The i64 tokens read as pairs of f32: every byte is read once.
                    let ptr = v.device_ptr();
                    k.read_sum(&self.0.stream, ptr, 2 * v.len(), sum);
                }
            }
            None => {
                for t in [&x, &y] {
                    if let Some(e) = t.ready_event() {
                        e.wait_on(&self.0.stream).expect("wait");
                    }
                }
                if spin_ns > 0 {
                    hold_stream(&self.0.stream, spin_ns.div_ceil(1_000_000));
                }
            }
        }
        self.0.stream.synchronize().expect("sync");
    }
}

fn gpu_part(
    dev: &Device,
    sources: &[(&str, &Arc<TokenShards>)],
    workers: &[usize],
    batches: usize,
    rep: &mut Report,
) {
    let nanogpt = torch_rows("nanogpt.txt");
    let consumer = Consumer::new(dev);
    rep.line(&format!(
        "\n## {} ({}): batches to the device; the consumer {} and syncs\n",
        dev.name(),
        dev.pcie_bus_id().unwrap_or_default(),
        if consumer.0.kernels.is_some() {
            "reads every byte of x and y with a kernel after their copy"
        } else {
            "waits for the copies on a compute stream (no CUDA compiler here, so no kernel)"
        }
    ));
    rep.line("| batch × context | source | workers | consumer | per batch | nanoGPT get_batch | speed-up (goal) | i64 bytes: one copy (the link) | u16 bytes: one copy | build (one worker) | transfer | consumer wait |");
    rep.line("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let mut notes = Vec::new();
    for ((b, t), goal) in SIZES.into_iter().zip(GOALS) {
        let theirs = nanogpt.get(&format!("nanogpt_get_batch_{b}x{t}")).copied();
        let link_i64 = raw_one_copy(dev, 2 * b * t * 8);
        let link_u16 = raw_one_copy(dev, b * (t + 1) * 2);
        for (name, shards) in sources {
            for &w in workers {
                for reads in [false, true] {
                    let m = run(shards, (b, t), w, dev, batches, |x| {
                        if reads {
                            consumer.step(x, 0);
                        } else {
                            consumer.wait(x);
                        }
                    });
                    let what = if reads { "reads x, y" } else { "waits" };
                    keep_tuning(&mut notes, format!("{b}×{t}, {name}, {what}"), &m);
                    let w = workers_cell(w);
                    let line = match m {
                        Ok(m) => format!(
                            "| {b}×{t} | {name} | {w} | {what} | {} | {} | {} | {} | {} | {} | {} | {:.0}% |",
                            ms(m.step),
                            theirs.map_or("—".into(), ms),
                            theirs.map_or("—".into(), |s| format!(
                                "{:.1}×{}",
                                s / m.step,
                                if goal > 0.0 {
                                    format!(" (≥ {goal}×)")
                                } else {
                                    String::new()
                                }
                            )),
                            ms(link_i64),
                            ms(link_u16),
                            ms(m.build),
                            ms(m.transfer),
                            100.0 * m.wait_window
                        ),
                        Err(e) => {
                            format!(
                                "| {b}×{t} | {name} | {w} | {what} | error: {e} | | | | | | | |"
                            )
                        }
                    };
                    rep.line(&line);
                }
            }
        }
    }
    rep.line(
        "\nper batch: the window's wall time / its batches. Consumers: *waits* takes each batch \
         and waits on the host until it is on the device, as nanoGPT's loop does after \
         `get_batch` (`torch.cuda.synchronize()`, the twin's figure): the like-for-like \
         comparison; *reads x, y* also launches a kernel reading every byte of x and of y on a \
         compute stream and syncs that stream (two launches and a round trip more per batch). \
         Only the u16 windows cross the link (x's and y's read apart: twice the u16 column), \
         read where they lie from the pinned shards, or staged by the workers from the mapped \
         file (build, divided by the workers); the i64 column is what a host-built batch would \
         move. Bounds: the link for the u16 bytes, the transfer thread's move per batch \
         (transfer: one launch reading the shared table of starts where it lies, an arena \
         allocation, the ready event), the consumer's own calls.\n",
    );
    if let Some(note) = auto_notes(&notes) {
        rep.line(&format!("{}\n", note.trim_start()));
    }

    // A 1 ms kernel per batch: the loader must keep up within it.
    rep.line("## the consumer's wait with a 1 ms kernel per batch (goal: ≤ 1% of the epoch)\n");
    rep.line("| batch × context | source | workers | batches | per batch | wait, whole epoch | wait, after the warm-up |");
    rep.line("| --- | --- | --- | --- | --- | --- | --- |");
    // The most workers set by hand (4 when the list has none), and the auto row when the list
    // has it.
    let fixed = workers.iter().copied().filter(|&w| w != AUTO).max();
    let auto = workers.contains(&AUTO);
    let counts: Vec<usize> = fixed
        .or((!auto).then_some(4))
        .into_iter()
        .chain(auto.then_some(AUTO))
        .collect();
    let mut notes = Vec::new();
    for (b, t) in SIZES {
        for (name, shards) in sources {
            for &w in &counts {
                // The epoch, up to 5000 batches (5 s): its start-up wait is part of the figure.
                let m = run(shards, (b, t), w, dev, 5000, |x| {
                    consumer.step(x, 1_000_000)
                });
                keep_tuning(&mut notes, format!("{b}×{t}, {name}"), &m);
                let w = workers_cell(w);
                let line = match m {
                    Ok(m) => format!(
                        "| {b}×{t} | {name} | {w} | {} | {} | {:.2}% | {:.2}% |",
                        m.batches,
                        ms(m.step),
                        100.0 * m.wait_epoch,
                        100.0 * m.wait_window
                    ),
                    Err(e) => format!("| {b}×{t} | {name} | {w} | error: {e} | | | |"),
                };
                rep.line(&line);
            }
        }
    }
    if let Some(note) = auto_notes(&notes) {
        rep.line(&note);
    }
}
