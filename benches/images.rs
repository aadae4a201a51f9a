//! JPEG files to GPU batches, against PyTorch's `DataLoader` on the same files: 2048 synthetic
//! 500×375 JPEGs (quality 90), `Resize(256)` + `CenterCrop(224)`, batches of 64, normalised
//! with ImageNet's mean and deviation.
//!
//! 1. **One core**: our decoder alone per image (from memory), against PIL's (libjpeg-turbo)
//!    and `torchvision.io.decode_jpeg` on the same files; then each later stage alone (the
//!    file read, the crop and resize, the normalisation), so the loader's figure can be read
//!    as their sum.
//! 2. **The loader on the host** (`Device::cpu`): images/s at 4, 8, 14 and 16 workers, as
//!    steady-state throughput (the window's images over the window's time, after a warm-up),
//!    the consumer's wait over that window, and step percentiles beside them; beside it the
//!    machine's floor: as many threads decoding and transforming the files with no loader at
//!    all (`floor.rs`), and the CPUs' topology (hyperthreads share a core).
//! 3. **To the GPU** (skipped without one): the same, each batch moved without blocking and
//!    read by one kernel (a sum) on a compute stream, as the PyTorch twin does: `u8` pixels
//!    over the link (normalising on the device needs the gather's conversion,
//!    `Convert::normalize`; this bench has the `u8` row for it), and `f32` normalised on the
//!    host (four times the bytes). Ratios against PyTorch's best in the same run
//!    (`$PINNABLE_BENCH_OUT/torch_images.txt`, written by `bench/torch_images.py`).
//! 4. **Decoded on the device** (`device.rs`): the JPEGs' bytes over the link, decoded by the
//!    GPU's JPEG engines (or nvJPEG's CUDA backend) and resized and cropped by the crate's
//!    kernels, u8 and normalised f32, with the process's CPU time over the window, against
//!    torchvision's batched GPU decode alone and with a GPU resize.
//!
//! Every loader table has an auto row beside the rows at worker counts set by hand: the loader
//! tunes its workers and batches ahead (in the device-decode table with the codec's default
//! host share and engine threads), runs 3 s of untimed epochs, and is then timed as the others
//! are; the note under the table says where the tuning left them and when its last decision
//! came, and the auto row's shares of workers × the one-core rate and of the floor are of the
//! count the tuning left.
//!
//! The files: `$PINNABLE_BENCH_IMAGES_DIR` (default `$PINNABLE_BENCH_OUT/jpegs`), as
//! `bench/torch_images.py --generate DIR` writes them (PIL, `classNN/NNNN.jpg`); when the folder
//! holds none, this bench writes its own (jpeg-encoder) and says so. Writes the tables to
//! `$PINNABLE_BENCH_OUT/images.md`. Knobs: `PINNABLE_BENCH_WORKERS` (e.g. `4,8,14,16,auto`;
//! `auto` or `0` is the auto row; by default 4, 8, 14 and 16 workers as the cores allow, then
//! auto), `PINNABLE_BENCH_BATCHES` (batches in the measured window),
//! `PINNABLE_BENCH_FLOOR_BATCHES` (batches each floor thread makes, default 4),
//! `PINNABLE_BENCH_ONLY=device` (only the device-decode table) or `device-quick` (only its u8
//! rows, for `PINNABLE_BENCH_WORKERS` workers, `auto` among them), `PINNABLE_BENCH_PREFETCH`
//! (the device-decode loader's prefetch, default 2, except in the auto rows).

#[path = "images/device.rs"]
mod device;
#[path = "images/floor.rs"]
mod floor;
#[path = "images/gpu.rs"]
mod gpu;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use pinnable::formats::image::{
    DecodeOn, Decoder, IMAGENET_MEAN, IMAGENET_STD, ImageBatcher, ImageCodec, ImageFile,
    ImageFolder, Transform,
};
use pinnable::loader::{Batcher, Loader, SplitMix64};
use pinnable::{BatchLayout, DType, Device, Tensor, ToDevice};
use pinnable_harness::bench;
use pinnable_harness::bench::{
    AUTO, AutoRow, Report, Tuning, WorkersOrAuto, auto_notes, env_usize, keep_tuning, median,
    settle, torch_rows, workers_cell,
};
use pinnable_harness::kernels::Consumer;
use pinnable_harness::{cuda_or_skip, images, rng};

const BATCH: usize = 64;

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The rows' worker counts: `PINNABLE_BENCH_WORKERS`, else 4 to 16 up to the cores (or the
/// cores, when fewer than 4), then [`AUTO`].
fn worker_counts() -> Vec<usize> {
    let counts: Vec<usize> = [4, 8, 14, 16]
        .into_iter()
        .filter(|&w| w <= cores())
        .collect();
    bench::worker_counts(if counts.is_empty() {
        vec![cores()]
    } else {
        counts
    })
}

/// The JPEG files, written first when the folder has none.
fn files() -> (Vec<PathBuf>, String) {
    let dir = std::env::var("PINNABLE_BENCH_IMAGES_DIR")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("PINNABLE_BENCH_OUT").map(|d| Path::new(&d).join("jpegs")))
        .unwrap_or_else(|_| std::env::temp_dir().join("pinnable-bench-jpegs"));
    let listed = |dir: &Path| {
        let folder = ImageFolder::open(dir).ok()?;
        Some(
            (0..folder.len())
                .map(|i| folder.path(i).unwrap().to_path_buf())
                .collect::<Vec<_>>(),
        )
    };
    if let Some(files) = listed(&dir) {
        return (files, format!("{} (as found)", dir.display()));
    }
    let mut r = rng("bench images (files)");
    images::write_folder(&mut r, &dir, 8, 256, (500, 375));
    let files = listed(&dir).expect("the files just written");
    (
        files,
        format!(
            "{} (written by this bench with jpeg-encoder: not PIL's files)",
            dir.display()
        ),
    )
}

/// Median over `passes` passes of `f` over every input, per input, in milliseconds.
fn per_item<T>(inputs: &[T], passes: usize, mut f: impl FnMut(&T)) -> f64 {
    let times: Vec<f64> = (0..passes)
        .map(|_| {
            let t = Instant::now();
            inputs.iter().for_each(&mut f);
            t.elapsed().as_secs_f64() / inputs.len() as f64 * 1e3
        })
        .collect();
    median(times)
}

/// Our one-core costs per image, in ms: the file read and decode, and each transform.
struct Stages {
    read_decode: f64,
    eval: f64,
    norm: f64,
}

/// One core, stage by stage.
fn one_core(files: &[PathBuf], torch: &HashMap<String, f64>, rep: &mut Report) -> Stages {
    let bytes: Vec<Vec<u8>> = files
        .iter()
        .map(|p| std::fs::read(p).expect("read"))
        .collect();
    let mean_kib = bytes.iter().map(Vec::len).sum::<usize>() as f64 / bytes.len() as f64 / 1024.0;
    let mut d = Decoder::new();
    let decode = per_item(&bytes, 3, |b| {
        d.decode(b, Path::new("bench")).expect("decode");
    });
    let read = per_item(files, 3, |p| {
        std::hint::black_box(std::fs::read(p).expect("read"));
    });
    let decoded: Vec<_> = bytes
        .iter()
        .take(256)
        .map(|b| {
            Decoder::new()
                .decode(b, Path::new("bench"))
                .expect("decode")
                .clone()
        })
        .collect();
    let eval = Transform::resized_center_crop(256, 224);
    let train = Transform::random_resized_crop(224).flip(0.5);
    let norm = eval
        .clone()
        .normalize(DType::F32, IMAGENET_MEAN, IMAGENET_STD)
        .expect("normalize");
    // Each into the same row, as a worker writes its batch.
    let mut layout = BatchLayout::new();
    let u8_row = layout.push(DType::U8, &[3, 224, 224]).expect("layout");
    let f32_row = layout.push(DType::F32, &[3, 224, 224]).expect("layout");
    let mut block = layout.allocate().expect("pinned row");
    let mut stage = |t: &Transform| {
        let slot = if t.dtype() == DType::U8 {
            u8_row
        } else {
            f32_row
        };
        let mut row = block.view_mut(slot);
        per_item(&decoded, 3, |im| {
            t.write(im, &mut row, SplitMix64::new(1))
                .expect("transform");
        })
    };
    let (eval_ms, train_ms, norm_ms) = (stage(&eval), stage(&train), stage(&norm));
    let row = |rep: &mut Report, what: &str, ours: f64, key: &str| {
        let theirs = torch
            .get(key)
            .map_or("—".to_string(), |v| format!("{v:.3} ms"));
        let ratio = torch
            .get(key)
            .map_or("—".to_string(), |v| format!("{:.2}×", v / ours));
        rep.line(&format!("| {what} | {ours:.3} ms | {theirs} | {ratio} |"));
    };
    rep.line(&format!(
        "## one core, per image ({} files, {mean_kib:.1} KiB mean)\n",
        files.len()
    ));
    rep.line("| stage | ours | PyTorch side | their time / ours |");
    rep.line("| --- | --- | --- | --- |");
    row(
        rep,
        "decode, from memory (vs PIL: libjpeg-turbo)",
        decode,
        "pil_decode_ms",
    );
    row(
        rep,
        "decode, from memory (vs torchvision.io.decode_jpeg)",
        decode,
        "decode_jpeg_ms",
    );
    row(rep, "read the file (page cache)", read, "read_ms");
    row(
        rep,
        "resize 256 + center crop 224, u8 (vs PIL)",
        eval_ms,
        "pil_resize_crop_ms",
    );
    row(rep, "random-resized crop 224 + flip, u8", train_ms, "");
    row(
        rep,
        "resize + crop, normalised f32 written",
        norm_ms,
        "pil_to_tensor_normalize_ms",
    );
    // The same crop as PIL's of the first file (written by the twin beside its figures).
    let pil = std::env::var("PINNABLE_BENCH_OUT")
        .ok()
        .and_then(|d| std::fs::read(Path::new(&d).join("torch_images_pil_crop.u8")).ok());
    if let Some(pil) = pil {
        let ours = eval
            .apply(&decoded[0], SplitMix64::new(0))
            .expect("transform");
        let ours = ours.to_vec::<u8>().expect("u8");
        if ours.len() == pil.len() {
            let d: Vec<u8> = ours.iter().zip(&pil).map(|(a, b)| a.abs_diff(*b)).collect();
            let mean = d.iter().map(|&v| f64::from(v)).sum::<f64>() / d.len() as f64;
            rep.line(&format!(
                "\nthe first file's resize + crop against PIL's (libjpeg-turbo's decode, PIL's \
                 resize): {:.1}% of values equal, mean |difference| {mean:.3}, max {}",
                100.0 * d.iter().filter(|&&v| v == 0).count() as f64 / d.len() as f64,
                d.iter().max().copied().unwrap_or(0)
            ));
        }
    }
    let total = read + decode + eval_ms;
    rep.line(&format!(
        "\nours, read + decode + resize/crop: {total:.3} ms per image on one core: at most \
         {:.0} images/s per core, {:.0} on {} cores\n",
        1e3 / total,
        1e3 / total * cores() as f64,
        cores()
    ));
    Stages {
        read_decode: read + decode,
        eval: eval_ms,
        norm: norm_ms,
    }
}

/// The floor: for 1 thread and each worker count, the median images/s of three runs of that
/// many threads decoding and transforming (`eval`, `u8`) with no loader; printed against the
/// one-core stages (`per_image`, ms) and against one thread.
fn floor_table(
    files: &[PathBuf],
    eval: &Transform,
    workers: &[usize],
    per_image: f64,
    rep: &mut Report,
) -> Vec<(usize, f64)> {
    let batches = env_usize("PINNABLE_BENCH_FLOOR_BATCHES").unwrap_or(4);
    rep.line(&format!("CPUs: {}\n", floor::Cpus::read()));
    rep.line(&format!(
        "## the floor: N threads each reading, decoding and transforming ({batches} batches of \
         {BATCH} into one block of its own after one warm-up batch), no loader; median of 3\n"
    ));
    rep.line("| threads | images/s | per thread | of threads × the one-core stages | of threads × 1 thread |");
    rep.line("| --- | --- | --- | --- | --- |");
    let mut counts = vec![1];
    counts.extend(workers.iter().copied().filter(|&w| w != 1 && w != AUTO));
    let mut floors: Vec<(usize, f64)> = Vec::new();
    for n in counts {
        let runs = (0..3)
            .map(|_| floor::images_per_s(files, eval, n, BATCH, batches))
            .collect();
        let f = median(runs);
        let one = floors.first().map_or(f, |&(_, one)| one);
        rep.line(&format!(
            "| {n} | {f:.0} | {:.0} | {:.0}% | {:.0}% |",
            f / n as f64,
            100.0 * f * per_image / 1e3 / n as f64,
            100.0 * f / (one * n as f64)
        ));
        floors.push((n, f));
    }
    rep.line("");
    floors
}

/// A steady-state window of a loader run.
struct Window {
    /// The workers: the count set by hand, or where the tuning left it.
    workers: usize,
    /// What the tuning did, in an auto row.
    tuning: Option<Tuning>,
    images_per_s: f64,
    wait_share: f64,
    /// The workers' time loading and collating over workers × the window.
    busy: f64,
    /// Milliseconds a sample spent writing itself (read, decode, transform), in the workers.
    written_ms: f64,
    p50: f64,
    p95: f64,
}

impl AutoRow for Window {
    fn tuning(&self) -> Option<&Tuning> {
        self.tuning.as_ref()
    }
}

/// The note under a loader table with auto rows.
fn print_notes(notes: &[(String, Tuning)], rep: &mut Report) {
    if let Some(note) = auto_notes(notes) {
        rep.line(&note);
    }
}

/// Runs `files` (cycled to `warmup + batches` batches) through the loader with `transform`
/// onto `device`; `consume` reads each batch's images. Times the window after the warm-up.
fn window(
    files: &[PathBuf],
    transform: &Transform,
    workers: usize,
    batches: usize,
    device: &Device,
    consume: impl FnMut(&Tensor),
) -> pinnable::Result<Window> {
    window_with(
        files,
        workers,
        batches,
        device,
        on_host(transform),
        Ok,
        consume,
    )
}

/// The host path's batcher for `transform` (the workers decode, whatever the device).
fn on_host(transform: &Transform) -> ImageBatcher {
    ImageBatcher::new(ImageCodec::new(transform.clone()).decode_on(DecodeOn::Host))
}

/// [`window`] with a batcher of one's own (a conversion on the device, say); `images` turns
/// each batch into the images `consume` reads.
#[allow(clippy::too_many_arguments)]
fn window_with<B>(
    files: &[PathBuf],
    workers: usize,
    batches: usize,
    device: &Device,
    batcher: B,
    images: impl Fn(B::Batch) -> pinnable::Result<(Tensor, Tensor)>,
    mut consume: impl FnMut(&Tensor),
) -> pinnable::Result<Window>
where
    B: Batcher<ImageFile> + 'static,
    B::Batch: ToDevice + 'static,
{
    // An auto row's workers (and batches ahead) are at most the cores: its warm-up and tail
    // are sized for as many.
    let auto = workers == AUTO;
    let most = if auto { cores() } else { workers };
    let warmup = 2 * most + 4;
    // The epoch runs on past the window: its end (workers stopped and joined) is not a
    // steady batch.
    let tail = 2 * most + 2;
    let n = (warmup + batches + tail) * BATCH;
    let list = (0..n).map(|i| (files[i % files.len()].clone(), (i % 1000) as i64));
    let folder = ImageFolder::from_list(list);
    let loader = Loader::builder(folder)
        .batch_size(BATCH)
        .workers_or_auto(workers)
        .device(device.clone())
        .build(batcher)?;
    let settling = if auto {
        settle(&loader, |b| {
            consume(&images(b)?.0);
            Ok(())
        })?
    } else {
        Vec::new()
    };
    let mut epoch = loader.run_epoch(0);
    for b in epoch.by_ref().take(warmup) {
        consume(&images(b?)?.0);
    }
    let before = epoch.stats();
    let start = Instant::now();
    let mut steps = Vec::with_capacity(batches);
    let mut last = start;
    for b in epoch.by_ref().take(batches) {
        consume(&images(b?)?.0);
        let now = Instant::now();
        steps.push((now - last).as_secs_f64());
        last = now;
    }
    let elapsed = start.elapsed();
    let after = epoch.stats();
    let waited = after.waited.saturating_sub(before.waited);
    let busy = (after.load + after.collate).saturating_sub(before.load + before.collate);
    let written = after.written.saturating_sub(before.written);
    let samples = after.samples.saturating_sub(before.samples).max(1);
    let images = steps.len() * BATCH;
    let workers = if auto { after.workers } else { workers };
    // Percentiles of the steps go beside the window's throughput, never instead of it.
    steps.sort_by(f64::total_cmp);
    let percentile = |p: usize| steps.get(steps.len() * p / 100).copied().unwrap_or(0.0);
    Ok(Window {
        workers,
        tuning: auto.then(|| Tuning::new(&settling, &after)),
        images_per_s: images as f64 / elapsed.as_secs_f64(),
        wait_share: waited.as_secs_f64() / elapsed.as_secs_f64().max(1e-9),
        busy: busy.as_secs_f64() / (workers as f64 * elapsed.as_secs_f64()).max(1e-9),
        written_ms: written.as_secs_f64() * 1e3 / samples as f64,
        p50: percentile(50),
        p95: percentile(95),
    })
}

/// A table row; `per_image` is our one-core cost (ms), so `w` workers could at most make
/// `w / per_image` images a second if nothing but the stages took time. An auto row's `w` is
/// the count the tuning left.
fn window_row(
    name: &str,
    w: usize,
    m: pinnable::Result<Window>,
    best: Option<(&str, f64)>,
    per_image: f64,
    floors: &[(usize, f64)],
) -> String {
    let cell = workers_cell(w);
    let w = m.as_ref().map_or(w, |m| m.workers);
    let floor = floors.iter().find(|(n, _)| *n == w).map(|(_, f)| *f);
    match m {
        Ok(m) => format!(
            "| {name} | {cell} | {:.0} | {} | {:.0}% | {} | {:.0}% / {:.3} ms | {:.1}% | {:.2} / {:.2} ms |",
            m.images_per_s,
            best.map_or("—".into(), |(k, v)| format!(
                "{:.2}× ({k})",
                m.images_per_s / v
            )),
            100.0 * m.images_per_s * per_image / 1e3 / w as f64,
            floor.map_or("—".into(), |f| format!(
                "{:.0}%",
                100.0 * m.images_per_s / f
            )),
            100.0 * m.busy,
            m.written_ms,
            100.0 * m.wait_share,
            m.p50 * 1e3,
            m.p95 * 1e3
        ),
        Err(e) => format!("| {name} | {cell} | error: {e} | | | | | | |"),
    }
}

/// The columns of every loader table.
const COLUMNS: &str = "| variant | workers | images/s | vs PyTorch's best | of workers × the one-core rate | of the floor (as many threads, no loader) | workers busy / ms an image in them | consumer wait | step p50 / p95 |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |";

fn main() {
    let gpu = cuda_or_skip("bench images (GPU part)");
    let torch = torch_rows("torch_images.txt");
    let (files, origin) = files();
    let workers = worker_counts();
    let batches =
        env_usize("PINNABLE_BENCH_BATCHES").unwrap_or(if gpu.is_some() { 160 } else { 24 });
    let mut rep = Report::default();
    rep.line(&format!(
        "# images bench\n\n{} JPEGs in {origin}; batches of {BATCH}, resize 256 + center crop 224; \
         {batches} batches measured after a warm-up of 2 × workers + 4; {} cores\n",
        files.len(),
        cores()
    ));
    // `PINNABLE_BENCH_ONLY=device`: only the device-decode table (the one-core stages, the
    // floors and the host loader's rows are skipped).
    if std::env::var("PINNABLE_BENCH_ONLY").is_ok_and(|v| v.starts_with("device")) {
        if let Some(dev) = gpu {
            let eval = Transform::resized_center_crop(256, 224);
            let norm = eval
                .clone()
                .normalize(DType::F32, IMAGENET_MEAN, IMAGENET_STD)
                .expect("normalize");
            let consumer = Consumer::new(&dev);
            let read = gpu::reader(&consumer, true);
            device::table(
                &dev,
                &files,
                batches,
                (&eval, &norm),
                &torch,
                cores(),
                &read,
                &mut rep,
            );
        }
        rep.save("images.md");
        return;
    }
    let stages = one_core(&files, &torch, &mut rep);
    let eval = Transform::resized_center_crop(256, 224);
    let floors = floor_table(
        &files,
        &eval,
        &workers,
        stages.read_decode + stages.eval,
        &mut rep,
    );

    // PyTorch's best images/s in this run, over decoders and worker counts.
    let best = torch
        .iter()
        .filter(|(k, _)| k.starts_with("torch_images_"))
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(k, v)| (k.as_str(), *v));
    for (k, v) in torch.iter().filter(|(k, _)| k.starts_with("torch_images_")) {
        rep.line(&format!("{k}: {v:.0} images/s"));
    }
    let norm = eval
        .clone()
        .normalize(DType::F32, IMAGENET_MEAN, IMAGENET_STD)
        .expect("normalize");

    rep.line("\n## the loader on the host (Device::cpu, the consumer only takes batches)\n");
    rep.line(COLUMNS);
    let u8_cost = stages.read_decode + stages.eval;
    let f32_cost = stages.read_decode + stages.norm;
    let mut notes = Vec::new();
    for &w in &workers {
        let m = window(&files, &eval, w, batches, &Device::cpu(), |_| {});
        keep_tuning(&mut notes, "u8", &m);
        rep.line(&window_row("u8", w, m, best, u8_cost, &floors));
    }
    print_notes(&notes, &mut rep);
    if let Some(dev) = gpu {
        gpu::gpu_part(
            &dev,
            &files,
            &workers,
            batches,
            best,
            (&eval, u8_cost),
            (&norm, f32_cost),
            &floors,
            &torch,
            &mut rep,
        );
    }
    rep.save("images.md");
}
