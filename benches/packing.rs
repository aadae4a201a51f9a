//! Packed batches for varlen attention: long-tailed documents from a u16 shard (each ended by
//! the separator 50256, as nanoGPT's `prepare.py` writes them), packed into rows of 8192 tokens,
//! 8 and 64 rows a batch, through the loader — on the host (`Device::cpu()`), and to the GPU
//! (the u16 tokens cross the link and are widened there; labels, positions, `cu_seqlens` and
//! `seq_idx` are written by the workers into the batch's pinned block), and built on the GPU
//! (`PackedBatcher::on_device`: only the u16 tokens and `cu_seqlens` cross; one kernel writes
//! every field). Reports the real-token
//! fraction of the plan, the time to index and plan, ms a batch over a steady window after a
//! warm-up (the consumer syncs each batch), and the consumer's wait beside a 1 ms step, as a
//! share of the window. Against Hugging Face's `DataCollatorWithFlattening` + `.pin_memory()
//! .to('cuda', non_blocking=True)` on the same documents (`bench/packing_twin.py`, same run,
//! `$PINNABLE_BENCH_OUT/packing_twin.txt`). Without a GPU it prints `skipped: …` for that part.
//!
//! Both tables have auto rows beside the rows at worker counts set by hand: the loader tunes
//! its workers and batches ahead, runs 3 s of untimed epochs, and is then timed as the others
//! are; the note under the table says where the tuning left them and when its last decision
//! came.
//!
//! Writes `$PINNABLE_BENCH_OUT/packing.md`. The document file is
//! `$PINNABLE_BENCH_DATA/pinnable-docs.bin` (the system's temporary directory by default),
//! shared with the twin (whichever runs first writes it; both reuse it). Knobs:
//! `PINNABLE_BENCH_TOKENS` (tokens in the file, when written), `PINNABLE_BENCH_WORKERS`
//! (e.g. `4,8,auto`; `auto` or `0` is the auto row; by default 2, 4 and 8 workers where the
//! cores allow, then auto), `PINNABLE_BENCH_BATCHES` (measured batches per run).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use pinnable::formats::tokens::{PackedBatch, PackedDocs, Separator, TokenDocs, TokenShards};
use pinnable::loader::{Budget, BudgetPlan, Loader, SplitMix64};
use pinnable::{DType, Device};
use pinnable_harness::bench::{
    AUTO, AutoRow, Tuning, WorkersOrAuto, auto_notes, env_usize, keep_tuning, settle, torch_rows,
    worker_counts, workers_cell,
};
use pinnable_harness::kernels::Consumer;
use pinnable_harness::{cuda_or_skip, hold_stream};

const SEPARATOR: u16 = 50256;
const ROW: usize = 8192;
const ROWS: [usize; 2] = [8, 64];
/// The goals: the twin's time over ours.
const GOAL: f64 = 300.0;

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

/// `dir/pinnable-docs.bin`: about `n` u16 tokens in documents of Pareto lengths (shape 1.3,
/// from 100 tokens, at most a row), each ended by the separator; kept when it exists (the twin
/// may have written it).
fn docs_file(dir: &Path, n: usize) -> PathBuf {
    let path = dir.join("pinnable-docs.bin");
    if path.exists() {
        return path;
    }
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).expect("create docs"));
    let mut r = SplitMix64::new(1337);
    let mut written = 0;
    while written < n {
        let u = (r.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let len = ((100.0 / (1.0 - u).powf(1.0 / 1.3)).floor() as usize).clamp(1, ROW);
        let mut doc: Vec<u8> = Vec::with_capacity(2 * len);
        for _ in 0..len - 1 {
            doc.extend_from_slice(&((r.next_u64() % 50256) as u16).to_le_bytes());
        }
        doc.extend_from_slice(&SEPARATOR.to_le_bytes());
        f.write_all(&doc).expect("write docs");
        written += len;
    }
    f.flush().expect("write docs");
    path
}

/// One run's steady-state figures.
struct Run {
    step: f64,
    wait: f64,
    build: f64,
    batches: usize,
    /// What the tuning did, in an auto row.
    tuning: Option<Tuning>,
}

impl AutoRow for Run {
    fn tuning(&self) -> Option<&Tuning> {
        self.tuning.as_ref()
    }
}

/// `batches` batches of `packed` to `device` after a warm-up, each handed to `consume`;
/// built on the device (`PackedBatcher::device_built`) when `on_device`. With [`AUTO`]
/// workers, the loader first runs untimed epochs for its tuning to settle.
fn run(
    packed: &PackedDocs,
    (workers, on_device): (usize, bool),
    device: &Device,
    batches: usize,
    mut consume: impl FnMut(&PackedBatch),
) -> pinnable::Result<Run> {
    let batcher = packed.batcher(DType::I64)?.device_built(on_device);
    let loader = Loader::builder(packed.clone())
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
    Ok(Run {
        step: elapsed / batches.max(1) as f64,
        wait: (s.waited - before.waited).as_secs_f64() / elapsed,
        build: s.collate.as_secs_f64() / s.batches.max(1) as f64,
        batches,
        tuning: (workers == AUTO).then(|| Tuning::new(&settling, &s)),
    })
}

fn ms(s: f64) -> String {
    format!("{:.3} ms", s * 1e3)
}

fn main() {
    let gpu = cuda_or_skip("bench packing (GPU part)");
    let out = std::env::var("PINNABLE_BENCH_OUT").ok().map(PathBuf::from);
    let dir =
        std::env::var("PINNABLE_BENCH_DATA").map_or_else(|_| std::env::temp_dir(), PathBuf::from);
    let n = env_usize("PINNABLE_BENCH_TOKENS").unwrap_or(if gpu.is_some() {
        64 << 20
    } else {
        16 << 20
    });
    let batches =
        env_usize("PINNABLE_BENCH_BATCHES").unwrap_or(if gpu.is_some() { 200 } else { 24 });
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = worker_counts([2, 4, 8].into_iter().filter(|&w| w < cores || w == 2));
    let file = docs_file(&dir, n);
    let t = Instant::now();
    let shards = TokenShards::open([&file]).expect("read the documents into pinned memory");
    let read = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let docs = Arc::new(TokenDocs::split(shards, SEPARATOR.into(), Separator::End).expect("split"));
    let index = t.elapsed().as_secs_f64();
    let mut rep = Report { md: String::new() };
    rep.line(&format!(
        "# packed batches: {} long-tailed documents, {} u16 tokens ({:.0} MB); read into pinned \
         memory in {}, indexed (split at {SEPARATOR}) in {}\n\ncores: {cores}; {batches} \
         batches measured after a warm-up; rows of {ROW} tokens, best fit over a sort window of \
         4096 documents; input_ids, labels, position_ids i64 [1, total], cu_seqlens and \
         seq_idx i32\n",
        docs.len(),
        docs.tokens(),
        2.0 * docs.tokens() as f64 / 1e6,
        ms(read),
        ms(index),
    ));
    let mut plans = Vec::new();
    rep.line("| batch | batches an epoch | real tokens / budget | plan an epoch |");
    rep.line("| --- | --- | --- | --- |");
    for rows in ROWS {
        let t = Instant::now();
        let plan = BudgetPlan::options(Budget::Packed {
            row_tokens: ROW,
            rows,
        })
        .sort_window(4096)
        .shuffle(7)
        .build(docs.lengths().clone())
        .expect("plan");
        let planned = t.elapsed().as_secs_f64();
        let real: usize = plan.batches(0).iter().flatten().map(|p| p.len).sum();
        let fraction = real as f64 / (plan.len() * plan.max_tokens()) as f64;
        rep.line(&format!(
            "| {rows}×{ROW} | {} | {:.2}% | {} |",
            plan.len(),
            100.0 * fraction,
            ms(planned)
        ));
        plans.push((rows, PackedDocs::new(docs.clone(), plan).expect("packed")));
    }

    rep.line("\n## on the host (Device::cpu: the consumer only takes batches)\n");
    rep.line("| batch | workers | per batch | build (one worker) | consumer wait |");
    rep.line("| --- | --- | --- | --- | --- |");
    let mut notes = Vec::new();
    for (rows, packed) in &plans {
        for &w in &workers {
            let m = run(packed, (w, false), &Device::cpu(), batches, |_| {});
            keep_tuning(&mut notes, format!("{rows}×{ROW}"), &m);
            let w = workers_cell(w);
            let line = match m {
                Ok(m) => format!(
                    "| {rows}×{ROW} | {w} | {} | {} | {:.0}% |",
                    ms(m.step),
                    ms(m.build),
                    100.0 * m.wait
                ),
                Err(e) => format!("| {rows}×{ROW} | {w} | error: {e} | | |"),
            };
            rep.line(&line);
        }
    }
    if let Some(note) = auto_notes(&notes) {
        rep.line(&note);
    }
    if let Some(dev) = gpu {
        gpu_part(&dev, &plans, &workers, batches, &mut rep);
    }
    if let Some(out) = out {
        std::fs::write(out.join("packing.md"), &rep.md).expect("write packing.md");
    }
}

/// Waits on a stream for every tensor of the batch, then runs a step of `step_ns` (a kernel
/// when the bench's kernels load, else the stream held as long), then syncs.
fn consume(c: &Consumer, b: &PackedBatch, step_ns: u64) {
    let ids = b.input_ids.tensor().expect("input_ids");
    let mut tensors = vec![&ids, &b.labels, &b.position_ids, &b.cu_seqlens];
    tensors.extend(b.seq_idx.as_ref());
    for t in tensors {
        if let Some(e) = t.ready_event() {
            e.wait_on(&c.stream).expect("wait");
        }
    }
    if step_ns > 0 {
        match &c.kernels {
            Some(k) => k.spin(&c.stream, step_ns),
            None => hold_stream(&c.stream, step_ns.div_ceil(1_000_000)),
        }
    }
    c.stream.synchronize().expect("sync");
}

fn gpu_part(
    dev: &Device,
    plans: &[(usize, PackedDocs)],
    workers: &[usize],
    batches: usize,
    rep: &mut Report,
) {
    let twin = torch_rows("packing_twin.txt");
    let consumer = Consumer::new(dev);
    rep.line(&format!(
        "\n## {} ({}): batches to the device; the consumer waits for every tensor on a stream \
         and syncs (then: beside a 1 ms step)\n",
        dev.name(),
        dev.pcie_bus_id().unwrap_or_default(),
    ));
    rep.line(
        "built: `host` = workers write every field (u16 tokens widened on the GPU); `device` = \
         PackedBatcher::on_device, only the u16 tokens and cu_seqlens cross, one kernel writes \
         the rest\n",
    );
    rep.line("| batch | built | workers | per batch | HF collator + to(cuda) | speed-up (goal ≥ 300×) | build (one worker) | wait beside a 1 ms step |");
    rep.line("| --- | --- | --- | --- | --- | --- | --- | --- |");
    let mut notes = Vec::new();
    for (rows, packed) in plans {
        let theirs = twin.get(&format!("packing_collator_{rows}x{ROW}")).copied();
        for (&w, on) in workers.iter().flat_map(|w| [(w, false), (w, true)]) {
            let built = if on { "device" } else { "host" };
            let m = run(packed, (w, on), dev, batches, |b| consume(&consumer, b, 0));
            let step = run(packed, (w, on), dev, batches, |b| {
                consume(&consumer, b, 1_000_000)
            });
            keep_tuning(
                &mut notes,
                format!("{rows}×{ROW}, built on the {built}"),
                &m,
            );
            keep_tuning(
                &mut notes,
                format!("{rows}×{ROW}, built on the {built}, beside a 1 ms step"),
                &step,
            );
            let w = workers_cell(w);
            let line = match (m, step) {
                (Ok(m), Ok(s)) => format!(
                    "| {rows}×{ROW} | {built} | {w} | {} | {} | {} | {} | {:.2}% ({} batches) |",
                    ms(m.step),
                    theirs.map_or("—".into(), ms),
                    theirs.map_or("—".into(), |t| format!(
                        "{:.0}×{}",
                        t / m.step,
                        if t / m.step >= GOAL { "" } else { " (below)" }
                    )),
                    ms(m.build),
                    100.0 * s.wait,
                    s.batches
                ),
                (Err(e), _) | (_, Err(e)) => {
                    format!("| {rows}×{ROW} | {built} | {w} | error: {e} | | | | |")
                }
            };
            rep.line(&line);
        }
    }
    if let Some(note) = auto_notes(&notes) {
        rep.line(&note);
    }
}
