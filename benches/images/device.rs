//! The device-decode mode of the images bench: the JPEGs' bytes over the link, decoded by the
//! GPU (`DeviceImageBatcher`: the JPEG engines in batches, nvJPEG's CUDA backend, or the host
//! decoder feeding the device's kernels), resized and cropped by the crate's kernels into
//! `[64, 3, 224, 224]` u8 or normalised f32 on the device. Each row: images/s over a steady
//! window after a warm-up, and the process's CPU time over that window (getrusage: user +
//! system) as cores busy, with and without host workers decoding a share of each batch.
//! Ratios against torchvision's batched GPU decode (`decode_jpeg(list, device='cuda')`) in
//! the same run: its best batch size and thread count decoding alone, and its decode +
//! resize + crop + normalise pipeline.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use pinnable::formats::image::{
    DeviceImageBatcher, ImageFolder, JpegDecoder, Transform, gpu_decoder,
};
use pinnable::loader::Loader;
use pinnable::{Device, Tensor};
use pinnable_harness::bench::Report;

const BATCH: usize = 64;

/// The process's CPU time so far (user + system), in seconds.
fn cpu_seconds() -> f64 {
    // SAFETY: an all-zero rusage is a valid value for the call to overwrite.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a live rusage the call writes.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// One measured configuration.
pub struct Row {
    pub images_per_s: f64,
    /// CPU seconds over wall seconds in the window.
    pub cores: f64,
}

/// `batches` batches after a warm-up of `2 × workers + 4`, the files cycled; `consume` reads
/// each batch's images on the device.
pub fn measure(
    files: &[PathBuf],
    transform: &Transform,
    batcher: DeviceImageBatcher,
    workers: usize,
    batches: usize,
    dev: &Device,
    consume: &dyn Fn(&Tensor),
) -> pinnable::Result<Row> {
    let warmup = 2 * workers + 4;
    let n = (warmup + batches) * BATCH;
    let list = (0..n).map(|i| (files[i % files.len()].clone(), (i % 1000) as i64));
    let folder = ImageFolder::from_list(list).transform(transform.clone());
    let loader = Loader::builder(folder)
        .batch_size(BATCH)
        .workers(workers)
        .prefetch(
            std::env::var("PINNABLE_BENCH_PREFETCH")
                .ok()
                .and_then(|p| p.parse().ok())
                .unwrap_or(2),
        )
        .device(dev.clone())
        .build(batcher)?;
    let mut epoch = loader.run_epoch(0);
    for b in epoch.by_ref().take(warmup) {
        consume(&b?.0);
    }
    let (start, cpu0) = (Instant::now(), cpu_seconds());
    let mut images = 0;
    for b in epoch.by_ref() {
        consume(&b?.0);
        images += BATCH;
    }
    let (wall, cpu) = (start.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
    Ok(Row {
        images_per_s: images as f64 / wall,
        cores: cpu / wall,
    })
}

/// The device-decode table: u8 and normalised f32, 1 to 4 workers driving the device's
/// decoders, then host workers taking a share beside them.
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
    for (k, v) in torch.iter().filter(|(k, _)| k.starts_with("tv_gpu_")) {
        rep.line(&format!("{k}: {v:.0} images/s"));
    }
    rep.line(
        "\ngoals: u8 ≥ 1.0× torchvision's best batched decode alone and ≥ 2× its decode + \
         resize pipeline with ≤ 2 cores busy; with host workers decoding a share ≥ 1.2× its \
         decode alone\n",
    );
    rep.line("| output | decoder | workers | host share | images/s | cores busy (process CPU / wall) | vs torchvision decode alone | vs torchvision decode + resize |");
    rep.line("| --- | --- | --- | --- | --- | --- | --- | --- |");
    let ratio = |v: f64, of: Option<f64>| of.map_or("—".into(), |o| format!("{:.2}×", v / o));
    if std::env::var("PINNABLE_BENCH_ONLY").is_ok_and(|v| v == "device-quick") {
        let workers: Vec<usize> = std::env::var("PINNABLE_BENCH_WORKERS")
            .unwrap_or_else(|_| "1,2,4".into())
            .split(',')
            .filter_map(|w| w.trim().parse().ok())
            .collect();
        for w in workers {
            match measure(
                files,
                eval,
                DeviceImageBatcher::new(dev),
                w,
                batches,
                dev,
                consume,
            ) {
                Ok(r) => rep.line(&format!(
                    "| u8 | quick | {w} | 0% | {:.0} | {:.2} | {} | {} |",
                    r.images_per_s,
                    r.cores,
                    ratio(r.images_per_s, decode),
                    ratio(r.images_per_s, pipeline)
                )),
                Err(e) => rep.line(&format!("- {w} workers: error: {e}")),
            }
        }
        return;
    }
    rep.line("\nthe loader with a consumer that takes batches and reads nothing:\n");
    for w in [2, 4] {
        match measure(
            files,
            eval,
            DeviceImageBatcher::new(dev),
            w,
            batches,
            dev,
            &|_| {},
        ) {
            Ok(r) => rep.line(&format!(
                "- {w} workers: {:.0} images/s, {:.2} cores",
                r.images_per_s, r.cores
            )),
            Err(e) => rep.line(&format!("- {w} workers: error: {e}")),
        }
    }
    rep.line("");
    let mut configs: Vec<(&str, &Transform, Option<JpegDecoder>, usize, f64)> = Vec::new();
    for w in [1, 2, 4] {
        configs.push(("u8", eval, None, w, 0.0));
    }
    configs.push(("f32 normalised", norm, None, 2, 0.0));
    configs.push(("f32 normalised", norm, None, 4, 0.0));
    if choice.decoder == JpegDecoder::Hardware {
        configs.push(("u8", eval, Some(JpegDecoder::Cuda), 4, 0.0));
    }
    for (w, share) in [(8, 0.25), (cores.min(16), 0.4), (cores.min(16), 0.55)] {
        configs.push(("u8", eval, None, w, share));
    }
    configs.push(("u8", eval, Some(JpegDecoder::Cpu), cores.min(16), 0.0));
    for (what, t, force, w, share) in configs {
        let mut batcher = DeviceImageBatcher::new(dev).cpu_share(share);
        if let Some(d) = force {
            batcher = batcher.decoder(d);
        }
        let name = format!("{:?}", batcher.chosen().decoder);
        match measure(files, t, batcher, w, batches, dev, consume) {
            Ok(r) => rep.line(&format!(
                "| {what} | {name} | {w} | {:.0}% | {:.0} | {:.2} | {} | {} |",
                share * 100.0,
                r.images_per_s,
                r.cores,
                ratio(r.images_per_s, decode),
                ratio(r.images_per_s, pipeline)
            )),
            Err(e) => rep.line(&format!(
                "| {what} | {name} | {w} | {:.0}% | error: {e} | | | |",
                share * 100.0
            )),
        }
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
