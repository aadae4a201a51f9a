//! What the benches share: the figure of a stream of batches ([`Throughput`], steady-state
//! throughput over a window), figures from interleaved repeats ([`Spread`]), wall and device
//! timers for single calls, PyTorch's figures from the same run, and a markdown table of
//! ratios.
//!
//! Two kinds of figure, never mixed: a stream of batches (a loader, a training loop) is
//! measured by its throughput over a window ([`Window`], [`epoch`], [`stream`]); one call
//! repeated on its own (a copy, an allocation) by the median of its repeats ([`time`],
//! [`event_time`], [`median`]), which is fair there because no repeat waits for another.
//!
//! Rows at worker counts set by hand have an auto row beside them, whose workers and batches
//! ahead the loader tunes ([`worker_counts`], [`WorkersOrAuto`], [`settle`], [`Tuning`]).

mod auto;
mod repeats;
mod throughput;

pub use auto::{
    AUTO, AutoRow, SETTLE, Tuning, WorkersOrAuto, auto_note, auto_notes, keep_tuning, parse_worker,
    parse_workers, settle, worker_counts, workers_cell, workers_label,
};
pub use repeats::Spread;
pub use throughput::{Throughput, Window, epoch, percentile, stream};

use std::collections::HashMap;
use std::time::Instant;

use cudarc::driver::{CudaStream, result, sys};
use pinnable::{DType, Device, Tensor};
use rand::Rng;

/// The benches' batch: 64 f32 tensors of 1 MiB (`x0` … `x63`) and 64 i64 `labels`, as
/// `bench/torch_baseline.py` builds it too.
pub fn batch_64x1mib(r: &mut impl Rng) -> HashMap<String, Tensor> {
    let mut batch: HashMap<String, Tensor> = (0..64)
        .map(|i| {
            (
                format!("x{i}"),
                crate::random_tensor(r, DType::F32, &[1 << 18]),
            )
        })
        .collect();
    batch.insert("labels".into(), crate::random_tensor(r, DType::I64, &[64]));
    batch
}

/// The median of `v` (the upper one for an even count): for repeats of one call, never for the
/// steps of a stream (see [`Throughput`]).
///
/// # Panics
///
/// If `v` is empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median wall time of `f` in seconds over `iters` runs after `warmup` runs: for one call
/// repeated, each run complete before the next (a copy and its sync), never for a stream.
pub fn time(warmup: usize, iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..warmup {
        f();
    }
    median(
        (0..iters)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

/// Median device time in seconds of what `f` enqueues on `stream`, between two events, over
/// `iters` runs after 3 warm-ups.
///
/// # Panics
///
/// If the driver refuses an event (a bench failure).
pub fn event_time(stream: &CudaStream, iters: usize, f: impl Fn()) -> f64 {
    let ctx = stream.context();
    let mut v = Vec::new();
    for i in 0..iters + 3 {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let (a, b) = (ctx.new_event(flags).unwrap(), ctx.new_event(flags).unwrap());
        a.record(stream).unwrap();
        f();
        b.record(stream).unwrap();
        let ms = a.elapsed_ms(&b).unwrap();
        if i >= 3 {
            v.push(f64::from(ms) / 1e3);
        }
    }
    median(v)
}

/// Panics with the result's name unless a raw driver call succeeded.
///
/// # Panics
///
/// When `r` is not `CUDA_SUCCESS`.
pub fn check(r: sys::CUresult) {
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "driver call failed: {r:?}");
}

/// PyTorch's figures (`name seconds` lines) from `$PINNABLE_BENCH_OUT/<file>`, written by the
/// baseline script in the same run; empty when absent.
pub fn torch_rows(file: &str) -> HashMap<String, f64> {
    let Ok(dir) = std::env::var("PINNABLE_BENCH_OUT") else {
        return HashMap::new();
    };
    let Ok(text) = std::fs::read_to_string(format!("{dir}/{file}")) else {
        return HashMap::new();
    };
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_owned(), v.trim().parse().ok()?))
        })
        .collect()
}

/// Wall time of one plain `cuMemcpyHtoDAsync` of `bytes` from pinned memory, plus a stream
/// sync: the ceiling for moving a pinned batch with one copy.
///
/// # Panics
///
/// If `dev` is not a CUDA device or the driver refuses.
pub fn raw_one_copy(dev: &Device, bytes: usize) -> f64 {
    let stream = dev.copy_stream().unwrap().clone();
    dev.cuda_context().unwrap().bind_to_thread().unwrap();
    // SAFETY: plain allocations of `bytes`, freed below.
    let host = unsafe { result::malloc_host(bytes, 0) }.unwrap() as *mut u8;
    // SAFETY: the block is `bytes` long.
    unsafe { std::ptr::write_bytes(host, 7, bytes) };
    // SAFETY: a device allocation of `bytes`.
    let dst = unsafe { result::malloc_sync(bytes) }.unwrap();
    let t = time(5, 30, || {
        // SAFETY: both buffers are `bytes` long and live.
        check(unsafe { sys::cuMemcpyHtoDAsync_v2(dst, host.cast(), bytes, stream.cu_stream()) });
        stream.synchronize().unwrap();
    });
    // SAFETY: allocated above, freed once.
    unsafe {
        result::free_host(host.cast()).unwrap();
        result::free_sync(dst).unwrap();
    }
    t
}

/// Lines of a bench's report, printed as they come and kept for a markdown file.
#[derive(Default)]
pub struct Report {
    md: String,
}

impl Report {
    /// Prints `s` and keeps it.
    pub fn line(&mut self, s: &str) {
        println!("{s}");
        self.md.push_str(s);
        self.md.push('\n');
    }

    /// Writes the lines to `$PINNABLE_BENCH_OUT/<file>` when that is set.
    ///
    /// # Panics
    ///
    /// If the file cannot be written.
    pub fn save(&self, file: &str) {
        if let Ok(dir) = std::env::var("PINNABLE_BENCH_OUT") {
            std::fs::write(format!("{dir}/{file}"), &self.md).expect("write the bench report");
        }
    }
}

/// A markdown table of figures, printed as it grows and written to `$PINNABLE_BENCH_OUT`.
pub struct Table {
    md: String,
}

impl Table {
    /// A table whose text starts with `head` (a title line, the device, ...).
    pub fn new(head: &str) -> Table {
        let head = format!(
            "{head}\n| figure | ours | throughput | compared with | ratio (their time / ours) |\n| --- | --- | --- | --- | --- |\n"
        );
        print!("{head}");
        Table { md: head }
    }

    /// One figure: our time in seconds for `bytes`, and what it is compared with.
    pub fn row(&mut self, what: &str, ours: f64, bytes: usize, against: Option<(&str, f64)>) {
        let gbs = bytes as f64 / ours / 1e9;
        let (name, ratio) = match against {
            Some((name, t)) => (name.to_owned(), format!("{:.2}×", t / ours)),
            None => ("—".into(), "—".into()),
        };
        let line = format!(
            "| {what} | {:.3} ms | {gbs:.1} GB/s | {name} | {ratio} |\n",
            ours * 1e3
        );
        print!("{line}");
        self.md.push_str(&line);
    }

    /// Free text after the table.
    pub fn note(&mut self, text: &str) {
        print!("{text}");
        self.md.push_str(text);
    }

    /// Writes the table to `$PINNABLE_BENCH_OUT/<file>` when that is set.
    ///
    /// # Panics
    ///
    /// If the file cannot be written.
    pub fn save(&self, file: &str) {
        if let Ok(dir) = std::env::var("PINNABLE_BENCH_OUT") {
            std::fs::write(format!("{dir}/{file}"), &self.md).expect("write the bench table");
        }
    }
}

/// The process's CPU time so far (user + system), in seconds.
pub fn cpu_seconds() -> f64 {
    // SAFETY: an all-zero rusage is a valid value for the call to overwrite.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a live rusage the call writes.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// CPU seconds run so far by this process's threads whose names start with `prefix` (the
/// loader's are `loader-…`). Threads that ended are not counted.
pub fn threads_cpu_seconds(prefix: &str) -> f64 {
    threads_cpu()
        .iter()
        .filter(|(name, ..)| name.starts_with(prefix))
        .map(|(.., s)| s)
        .sum()
}

/// Every live thread of this process: its name, id and CPU seconds so far, from
/// `/proc/self/task/*/schedstat` (nanoseconds); empty where there is no such file.
pub fn threads_cpu() -> Vec<(String, u64, f64)> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for t in tasks.flatten() {
        let id = t.file_name().to_string_lossy().parse().unwrap_or(0);
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let stat = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
        let ns = stat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        out.push((comm.trim_end().to_owned(), id, ns as f64 * 1e-9));
    }
    out
}

/// The threads that ran at least `least` cores between two [`threads_cpu`] readings `wall`
/// seconds apart, busiest first, as `name: cores` (threads of one name summed; the process's
/// first thread is `main`).
pub fn busy_threads(
    then: &[(String, u64, f64)],
    now: &[(String, u64, f64)],
    wall: f64,
    least: f64,
) -> String {
    let mut by_name: HashMap<&str, f64> = HashMap::new();
    for (name, id, s) in now {
        let before = then
            .iter()
            .find(|(_, i, _)| i == id)
            .map_or(0.0, |(.., b)| *b);
        // The main thread apart from the threads that took its name (the driver's).
        let name = if *id == u64::from(std::process::id()) {
            "main"
        } else {
            name.as_str()
        };
        *by_name.entry(name).or_default() += (s - before) / wall;
    }
    let mut busy: Vec<_> = by_name.into_iter().filter(|(_, c)| *c >= least).collect();
    busy.sort_by(|a, b| b.1.total_cmp(&a.1));
    busy.iter()
        .map(|(n, c)| format!("{n}: {c:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A bench knob: the environment variable `name` as a number, or `None` when unset or not one.
pub fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok()?.trim().parse().ok()
}
