//! The device-decode mode of the images bench: the JPEGs' bytes over the link, decoded by the
//! GPU (`ImageCodec` with `DecodeOn::Device`: the JPEG engines in batches, nvJPEG's CUDA backend, or the host
//! decoder feeding the device's kernels), resized and cropped by the crate's kernels into
//! `[64, 3, 224, 224]` u8 or normalised f32 on the device. Each row: images/s over a steady
//! window after a warm-up, and the process's CPU time over that window (getrusage: user +
//! system) as cores busy, with and without host workers decoding a share of each batch; then
//! how long the epoch took to end (its workers stopped and joined), timed apart. Beside the
//! rows at worker counts set by hand, an auto row: u8, the codec's default host share and
//! engine threads, the workers and batches ahead tuned by the loader over 3 s of untimed
//! epochs before its window. Ratios against torchvision's batched GPU decode
//! (`decode_jpeg(list, device='cuda')`) in the same run: its best batch size and thread count
//! decoding alone, and its decode + resize + crop + normalise pipeline.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use pinnable::formats::image::{
    DecodeOn, ImageBatcher, ImageCodec, ImageFolder, JpegDecoder, Transform, gpu_decoder,
};
use pinnable::loader::Loader;
use pinnable::{Device, Tensor};
use pinnable_harness::bench::{
    AUTO, AutoRow, Report, Tuning, WorkersOrAuto, auto_notes, busy_threads, cpu_seconds, env_usize,
    keep_tuning, parse_worker, percentile, settle, threads_cpu, threads_cpu_seconds, workers_cell,
};

const BATCH: usize = 64;

/// (workers, share of each batch the host decodes) for the rows with host workers beside the
/// device's decoders: the host decodes ~0.4k images/s a core where the engines make tens of
/// thousands, so its share is small.
const HOST_SHARES: [(usize, f64); 3] = [(8, 0.06), (16, 0.10), (16, 0.14)];

/// One measured configuration.
pub struct Row {
    pub images_per_s: f64,
    /// CPU seconds over wall seconds in the window.
    pub cores: f64,
    /// The same for the loader's threads alone (workers, the transfer thread, and the threads
    /// nvJPEG starts in them).
    pub loader_cores: f64,
    /// Milliseconds the epoch took to end after the window (its workers stop and are joined).
    pub end_ms: f64,
    /// The consumer's steps (one batch taken and read) in the window, in milliseconds: median,
    /// 95th percentile and longest.
    pub steps_ms: [f64; 3],
    /// The threads busy over the window (at least 0.05 cores), `name: cores`.
    pub threads: String,
    /// What the tuning did, in an auto row.
    pub tuning: Option<Tuning>,
}

/// `batches` batches after a warm-up of `2 × workers + 4`, the files cycled; `consume` reads
/// each batch's images on the device. The epoch runs on past the window, so that its end
/// (workers stopped and joined) is timed apart: a stream's window holds steady batches only.
/// With [`AUTO`] workers the loader tunes its workers and batches ahead, runs untimed epochs
/// first for the tuning to settle, and its warm-up and tail are sized for as many workers as
/// cores.
pub fn measure(
    files: &[PathBuf],
    batcher: ImageBatcher,
    workers: usize,
    batches: usize,
    dev: &Device,
    consume: &dyn Fn(&Tensor),
) -> pinnable::Result<Row> {
    let prefetch = env_usize("PINNABLE_BENCH_PREFETCH").unwrap_or(2);
    let auto = workers == AUTO;
    let (warmup, tail) = if auto {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (2 * cores + 4, 2 * cores + 2)
    } else {
        (2 * workers + 4, workers * prefetch + 2)
    };
    let n = (warmup + batches + tail) * BATCH;
    let list = (0..n).map(|i| (files[i % files.len()].clone(), (i % 1000) as i64));
    let folder = ImageFolder::from_list(list);
    let loader = Loader::builder(folder)
        .batch_size(BATCH)
        .workers_prefetch_or_auto(workers, prefetch)
        .device(dev.clone())
        .build(batcher)?;
    let settling = if auto {
        settle(&loader, |b| {
            consume(&b.0);
            Ok(())
        })?
    } else {
        Vec::new()
    };
    let mut epoch = loader.run_epoch(0);
    for b in epoch.by_ref().take(warmup) {
        consume(&b?.0);
    }
    let threads0 = threads_cpu();
    let (start, cpu0, loader0) = (
        Instant::now(),
        cpu_seconds(),
        threads_cpu_seconds("loader-"),
    );
    let mut images = 0;
    let mut steps = Vec::with_capacity(batches);
    let mut last = start;
    for b in epoch.by_ref().take(batches) {
        consume(&b?.0);
        images += BATCH;
        let now = Instant::now();
        steps.push((now - last).as_secs_f64() * 1e3);
        last = now;
    }
    let (wall, cpu) = (start.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
    let loader_cpu = threads_cpu_seconds("loader-") - loader0;
    let threads = busy_threads(&threads0, &threads_cpu(), wall, 0.05);
    steps.sort_by(f64::total_cmp);
    let at = |p: f64| {
        if steps.is_empty() {
            0.0
        } else {
            percentile(&steps, p)
        }
    };
    let tuning = auto.then(|| Tuning::new(&settling, &epoch.stats()));
    let end = Instant::now();
    drop(epoch);
    Ok(Row {
        images_per_s: images as f64 / wall,
        cores: cpu / wall,
        loader_cores: loader_cpu / wall,
        end_ms: end.elapsed().as_secs_f64() * 1e3,
        steps_ms: [at(0.50), at(0.95), steps.last().copied().unwrap_or(0.0)],
        threads,
        tuning,
    })
}

impl AutoRow for Row {
    fn tuning(&self) -> Option<&Tuning> {
        self.tuning.as_ref()
    }
}

/// The device-decode table: u8 and normalised f32, 1 to 4 workers driving the device's
/// decoders and the auto row, then host workers taking a share beside them.
#[allow(clippy::too_many_arguments)]
pub fn table(
    dev: &Device,
    files: &[PathBuf],
    batches: usize,
    (eval, norm): (&Transform, &Transform),
    torch: &HashMap<String, f64>,
    cores: usize,
    consume: &dyn Fn(&Tensor),
    rep: &mut Report,
) {
    let choice = gpu_decoder(dev);
    rep.line(&format!(
        "\n## decoded on the device: the files' bytes over the link, pixels made there\n\n\
         decoder: {choice}\n"
    ));
    let decode = torch.get("tv_gpu_decode_best").copied();
    let pipeline = torch.get("tv_gpu_pipeline_best").copied();
    let mut twin: Vec<_> = torch
        .iter()
        .filter(|(k, _)| k.starts_with("tv_gpu_"))
        .collect();
    twin.sort_by(|a, b| a.0.cmp(b.0));
    for (k, v) in twin {
        // `*_cores`: the twin's process CPU over its window, in cores.
        match k.strip_suffix("_cores") {
            Some(row) => rep.line(&format!("{row}: {v:.2} cores busy")),
            None => rep.line(&format!("{k}: {v:.0} images/s")),
        }
    }
    rep.line(
        "\ngoals: u8 ≥ 1.0× torchvision's best batched decode alone and ≥ 2× its decode + \
         resize pipeline with ≤ 2 cores busy; with host workers decoding a share ≥ 1.2× its \
         decode alone\n",
    );
    rep.line("| output | decoder | engine threads | workers | host share | images/s | cores busy (process CPU / wall; the loader's threads) | vs torchvision decode alone | vs torchvision decode + resize | step p50 / p95 / max | epoch end (workers joined) | threads busy (cores) |");
    rep.line("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let ratio = |v: f64, of: Option<f64>| of.map_or("—".into(), |o| format!("{:.2}×", v / o));
    let mut notes = Vec::new();
    // `knobs`: the host share and engine threads, or `None` for the codec's defaults.
    let mut row = |what: &str,
                   t: &Transform,
                   force: Option<JpegDecoder>,
                   w: usize,
                   knobs: Option<(f64, usize)>| {
        let mut codec = ImageCodec::new(t.clone()).decode_on(DecodeOn::Device);
        let (share, engines) = match knobs {
            Some((share, engines)) => {
                codec = codec.cpu_share(share).engine_threads(engines);
                (format!("{:.0}%", share * 100.0), engines.to_string())
            }
            None => ("default".to_owned(), "default".to_owned()),
        };
        if let Some(d) = force {
            codec = codec.jpeg_decoder(d);
        }
        let name = format!("{:?}", codec.chosen(dev).decoder);
        let batcher = ImageBatcher::new(codec);
        let m = measure(files, batcher, w, batches, dev, consume);
        let w = workers_cell(w);
        keep_tuning(&mut notes, format!("{what}, {name}"), &m);
        rep.line(
            &match m {
                Ok(r) => format!(
                    "| {what} | {name} | {engines} | {w} | {share} | {:.0} | {:.2}; {:.2} | {} | {} | {:.2} / {:.2} / {:.1} ms | {:.1} ms | {} |",
                    r.images_per_s,
                    r.cores,
                    r.loader_cores,
                    ratio(r.images_per_s, decode),
                    ratio(r.images_per_s, pipeline),
                    r.steps_ms[0],
                    r.steps_ms[1],
                    r.steps_ms[2],
                    r.end_ms,
                    r.threads
                ),
                Err(e) => format!(
                    "| {what} | {name} | {engines} | {w} | {share} | error: {e} | | | | | | |"
                ),
            },
        );
    };
    // `device-quick`: u8 rows only, for `PINNABLE_BENCH_WORKERS` (each `workers`,
    // `workers:host share` or `workers:host share:engine threads`; `auto` workers alone keep
    // the codec's defaults).
    if std::env::var("PINNABLE_BENCH_ONLY").is_ok_and(|v| v == "device-quick") {
        let rows = std::env::var("PINNABLE_BENCH_WORKERS").unwrap_or_else(|_| "1,2,4".into());
        for spec in rows.split(',') {
            let mut parts = spec.trim().split(':');
            let w = parts.next().and_then(parse_worker);
            let share = parts.next().and_then(|s| s.parse().ok());
            let engines = parts.next().and_then(|s| s.parse().ok());
            let knobs = match (w, share, engines) {
                (Some(AUTO), None, None) => None,
                _ => Some((share.unwrap_or(0.0), engines.unwrap_or(1))),
            };
            if let Some(w) = w {
                row("u8", eval, None, w, knobs);
            }
        }
        if let Some(note) = auto_notes(&notes) {
            rep.line(&note);
        }
        return;
    }
    for w in [1, 2, 4] {
        row("u8", eval, None, w, Some((0.0, 1)));
    }
    row("u8", eval, None, 2, Some((0.0, 2)));
    row("u8", eval, None, AUTO, None);
    row("f32 normalised", norm, None, 2, Some((0.0, 1)));
    row("f32 normalised", norm, None, 4, Some((0.0, 1)));
    if choice.decoder == JpegDecoder::Hardware {
        row("u8", eval, Some(JpegDecoder::Cuda), 4, Some((0.0, 1)));
    }
    // Host workers spend cores for speed: two threads in the engines' call beside them.
    for (w, share) in HOST_SHARES {
        row("u8", eval, None, w.min(cores), Some((share, 2)));
    }
    row(
        "u8",
        eval,
        Some(JpegDecoder::Cpu),
        cores.min(16),
        Some((0.0, 1)),
    );
    if let Some(note) = auto_notes(&notes) {
        rep.line(&note);
    }
    let mean = files
        .iter()
        .take(256)
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum::<u64>() as f64
        / files.len().clamp(1, 256) as f64;
    rep.line(&format!(
        "\nover the link per image: {:.1} KiB of JPEG, where the u8 crop is 147 KiB and the f32 \
         one 588 KiB",
        mean / 1024.0
    ));
}
