//! The loader on the workload: batches of 64 × 3×224×224 f32 images + i64 labels
//! (38.5 MB), built sample by sample from a dataset whose `get` returns a zero-copy view into
//! one large in-memory array ("views"), or whose samples write their pixels straight into
//! their row of the batch's pinned block, as a decoder does ("decode": `Collator::write_rows`,
//! no buffer of the sample's own).
//!
//! On a GPU: steady-state time a batch (a window of batches after the warm-up, over their
//! number; per-step percentiles beside it) and GB/s for several worker counts, against the raw pinned
//! ceiling (a plain `cuMemcpyHtoDAsync` of one batch from pinned memory, timed with events as
//! `benches/transfer.rs` does) and against PyTorch's `DataLoader(pin_memory=True)` on the same
//! workload (read from `$PINNABLE_BENCH_OUT/torch_loader.txt`, written by
//! `bench/torch_loader.py` in the same run); then the overlap check: a per-batch "kernel"
//! (a host function holding a compute stream) longer than the copy, step time against the
//! kernel's own. Then the "gather" variant: the same images pinned once and each batch two
//! `Gather`s of their rows, stacked by the copy engine on the device (nothing collated on the
//! host). Without a GPU it prints `skipped: ...` for that part. Always: host-side collation
//! throughput (`Device::cpu()`).
//!
//! Every table has an auto row beside the rows at worker counts set by hand: the loader tunes
//! its workers and batches ahead, and is timed after 3 s of untimed epochs; the note under the
//! table says where the tuning left them and when its last decision came.
//!
//! Writes the tables to `$PINNABLE_BENCH_OUT/loader.md`. Knobs: `PINNABLE_BENCH_WORKERS`
//! (e.g. `1,2,4,auto`; `auto` or `0` is the auto row; by default 1, 2, 4, 8 and 12 workers, as
//! many as the cores allow, then auto), `PINNABLE_BENCH_BATCHES` (measured batches per run),
//! `PINNABLE_BENCH_IMAGES` (images in the array).

use std::time::{Duration, Instant};

use cudarc::driver::{result, sys};
use pinnable::loader::{Batcher, Collator, Dataset, FnDataset, Loader, Stack, TensorRows};
use pinnable::{DType, Device, Gather, Pinnable, PinnedPool, Tensor, ToDevice};
use pinnable_harness::bench;
use pinnable_harness::bench::{
    AUTO, AutoRow, Report, Throughput, Tuning, WorkersOrAuto, auto_notes, env_usize, event_time,
    keep_tuning, median, settle, torch_rows, workers_cell,
};
use pinnable_harness::kernels::Consumer;
use pinnable_harness::{cuda_or_skip, hold_stream, random_tensor, rng};

const BATCH: usize = 64;
const IMAGE: [usize; 3] = [3, 224, 224];
const WARMUP: usize = 16;

type Batch = (Tensor, Tensor);

/// The rows' worker counts: `PINNABLE_BENCH_WORKERS`, else 1 to 12 up to the cores, then
/// [`AUTO`].
fn worker_counts() -> Vec<usize> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    bench::worker_counts([1, 2, 4, 8, 12].into_iter().filter(|&w| w <= cores))
}

/// The "views" dataset: zero-copy views of `images`.
fn dataset(
    images: &TensorRows,
    len: usize,
) -> FnDataset<impl Fn(usize) -> pinnable::Result<(Tensor, i64)> + Send + Sync + 'static> {
    let images = images.clone();
    FnDataset::new(len, move |i| {
        Ok((images.get(i % images.len())?, (i % 1000) as i64))
    })
}

/// One run's steady-state figures.
struct Run {
    fig: Throughput,
    peak: usize,
    bound: usize,
    /// What the tuning did, in an auto row.
    tuning: Option<Tuning>,
}

impl AutoRow for Run {
    fn tuning(&self) -> Option<&Tuning> {
        self.tuning.as_ref()
    }
}

/// Runs one epoch of `warmup + batches` batches through `consume`; times the part after the
/// warm-up (blocks allocated, pipeline full). With [`AUTO`] workers, after untimed epochs for
/// the tuning to settle.
fn run(
    images: &TensorRows,
    decode: bool,
    workers: usize,
    batches: usize,
    device: &Device,
    consume: impl FnMut(&Batch),
) -> pinnable::Result<Run> {
    let len = (WARMUP + batches) * BATCH;
    if decode {
        // Samples are indices; each writes its image into its row of the batch, in place.
        let (rows, n) = (images.clone(), images.len());
        let loader = Loader::builder(FnDataset::new(len, Ok))
            .batch_size(BATCH)
            .workers_or_auto(workers)
            .device(device.clone())
            .build_with(move |ix: Vec<usize>, c| {
                let labels = c.stack_scalars("labels", ix.iter().map(|i| (i % 1000) as i64))?;
                let rows = rows.clone();
                let x = c.write_rows("images", DType::F32, &IMAGE, ix, move |i, row, _| {
                    row.copy_from(&rows.get(i % n)?)
                })?;
                let mut out = c.finish()?;
                Ok((out.take(x)?, out.take(labels)?))
            })?;
        return time_epoch(&loader, workers == AUTO, consume, Ok);
    }
    let loader = Loader::builder(dataset(images, len))
        .batch_size(BATCH)
        .workers_or_auto(workers)
        .device(device.clone())
        .build(Stack)?;
    time_epoch(&loader, workers == AUTO, consume, Ok)
}

/// As [`run`], with nothing collated on the host: each batch is two [`Gather`]s of rows of
/// the pinned arrays `images` and `labels`, stacked by the copy engine on the device.
fn run_gathered(
    images: &Tensor,
    labels: &Tensor,
    workers: usize,
    batches: usize,
    device: &Device,
    consume: impl FnMut(&Batch),
) -> pinnable::Result<Run> {
    let n = images.shape()[0];
    let (im, lb) = (images.clone(), labels.clone());
    let loader = Loader::builder(FnDataset::new((WARMUP + batches) * BATCH, move |i| {
        Ok(i % n)
    }))
    .batch_size(BATCH)
    .workers_or_auto(workers)
    .device(device.clone())
    .build_with(move |rows: Vec<usize>, _c| {
        Ok((
            Gather::rows(&im, rows.iter().copied())?,
            Gather::rows(&lb, rows)?,
        ))
    })?;
    time_epoch(
        &loader,
        workers == AUTO,
        consume,
        |(x, y): (Gather, Gather)| Ok((x.into_tensor()?, y.into_tensor()?)),
    )
}

/// Times one epoch of `loader` after the warm-up (throughput over the window, the consumer's
/// wait over it); `tensors` turns each batch into the tensors `consume` reads. An `auto`
/// loader (workers and batches ahead tuned) first runs untimed epochs for its tuning to
/// settle.
fn time_epoch<D, B>(
    loader: &Loader<D, B>,
    auto: bool,
    mut consume: impl FnMut(&Batch),
    tensors: impl Fn(B::Batch) -> pinnable::Result<Batch>,
) -> pinnable::Result<Run>
where
    D: Dataset + 'static,
    B: Batcher<D::Sample> + 'static,
    B::Batch: ToDevice + 'static,
{
    let bytes = BATCH * IMAGE.iter().product::<usize>() * 4 + BATCH * 8;
    let settling = if auto {
        settle(loader, |b| {
            consume(&tensors(b)?);
            Ok(())
        })?
    } else {
        Vec::new()
    };
    let (fig, stats) = bench::epoch(loader.run_epoch(0), WARMUP, bytes, |b| {
        consume(&tensors(b)?);
        Ok(())
    })?;
    Ok(Run {
        fig,
        peak: stats.pinned_peak_bytes,
        bound: stats.pinned_bound_bytes,
        tuning: auto.then(|| Tuning::new(&settling, &stats)),
    })
}

fn mib(b: usize) -> f64 {
    b as f64 / (1 << 20) as f64
}

fn main() {
    let mut r = rng("bench loader");
    let gpu = cuda_or_skip("bench loader (GPU part)");
    let batches =
        env_usize("PINNABLE_BENCH_BATCHES").unwrap_or(if gpu.is_some() { 200 } else { 24 });
    let count =
        env_usize("PINNABLE_BENCH_IMAGES").unwrap_or(if gpu.is_some() { 2048 } else { 256 });
    let images = TensorRows::new(random_tensor(
        &mut r,
        DType::F32,
        &[count, IMAGE[0], IMAGE[1], IMAGE[2]],
    ))
    .expect("rows");
    let batch_bytes = BATCH * IMAGE.iter().product::<usize>() * 4 + BATCH * 8;
    let workers = worker_counts();
    let mut rep = Report::default();
    rep.line(&format!(
        "# loader bench\n\nbatch: {BATCH} × {IMAGE:?} f32 + {BATCH} i64 = {:.1} MB; array of {count} images \
         ({:.2} GB); {batches} batches measured after {WARMUP}; cores: {}\n",
        batch_bytes as f64 / 1e6,
        (count * IMAGE.iter().product::<usize>() * 4) as f64 / 1e9,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    ));

    // --- Host side: collation into pinned memory, consumer does nothing.
    rep.line(
        "## host: collation into pinned memory (Device::cpu, the consumer only takes batches)\n",
    );
    rep.line(
        "| variant | workers | per batch (window / batches) | GB/s | consumer wait | steps | \
         pinned peak / bound |",
    );
    rep.line("| --- | --- | --- | --- | --- | --- | --- |");
    let mut notes = Vec::new();
    for decode in [false, true] {
        let name = if decode { "decode" } else { "views" };
        for &w in &workers {
            let m = run(&images, decode, w, batches, &Device::cpu(), |_| {});
            keep_tuning(&mut notes, name, &m);
            let w = workers_cell(w);
            match m {
                Ok(m) => rep.line(&format!(
                    "| {name} | {w} | {:.2} ms | {:.1} | {} | {} | {:.0} / {:.0} MiB |",
                    m.fig.per_batch() * 1e3,
                    m.fig.gigabytes_per_second(),
                    m.fig.wait(),
                    m.fig.percentiles(),
                    mib(m.peak),
                    mib(m.bound)
                )),
                Err(e) => rep.line(&format!("| {name} | {w} | error: {e} | | | | |")),
            }
        }
    }
    if let Some(note) = auto_notes(&notes) {
        rep.line(&note);
    }

    if let Some(dev) = gpu {
        gpu_part(&dev, &images, &workers, batches, batch_bytes, &mut rep);
    }
    rep.save("loader.md");
}

fn gpu_part(
    dev: &Device,
    images: &TensorRows,
    workers: &[usize],
    batches: usize,
    batch_bytes: usize,
    rep: &mut Report,
) {
    let torch = torch_rows("torch_loader.txt");
    let stream = dev.copy_stream().expect("copy stream").clone();
    dev.cuda_context()
        .expect("context")
        .bind_to_thread()
        .expect("bind");

    // The raw ceiling: one batch's bytes from pinned memory, one copy.
    // SAFETY: plain allocations of `batch_bytes`, freed at the end of this function.
    let host = unsafe { result::malloc_host(batch_bytes, 0) }.expect("cuMemHostAlloc") as *mut u8;
    // SAFETY: the block is `batch_bytes` long.
    unsafe { std::ptr::write_bytes(host, 7, batch_bytes) };
    // SAFETY: a device allocation of `batch_bytes`.
    let raw_dev = unsafe { result::malloc_sync(batch_bytes) }.expect("cuMemAlloc");
    let ceiling = event_time(&stream, 30, || {
        // SAFETY: both buffers are `batch_bytes` long and live.
        let r = unsafe {
            sys::cuMemcpyHtoDAsync_v2(raw_dev, host.cast(), batch_bytes, stream.cu_stream())
        };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    });
    // Ours, source already pinned: one batch moved again and again, each move synced before
    // the next (one call repeated, not a stream: the median of the repeats).
    let pinned = dataset(images, BATCH);
    let samples: Vec<(Tensor, i64)> = (0..BATCH).map(|i| pinned.get(i).expect("sample")).collect();
    let one: Batch = Stack
        .batch(samples, &mut Collator::new(PinnedPool::global()))
        .expect("collate");
    let mut moved = Vec::new();
    for _ in 0..30 {
        let t = Instant::now();
        let on = one.to_device(dev, true).expect("move");
        on.0.ready_event()
            .expect("event")
            .synchronize()
            .expect("sync");
        moved.push(t.elapsed().as_secs_f64());
    }
    let pinned_move = median(moved);
    let best_torch = ["torch_loader_w0", "torch_loader_w4", "torch_loader_w8"]
        .iter()
        .filter_map(|k| torch.get(*k).map(|&v| (*k, v)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    let consumer = Consumer::new(dev);
    let (kernels, compute, sum_ptr) = (
        &consumer.kernels,
        consumer.stream.clone(),
        consumer.sum_ptr(),
    );
    rep.line(&format!(
        "\n## {} ({}): batches to the device, each read by {} on a compute stream\n",
        dev.name(),
        dev.pcie_bus_id().unwrap_or_default(),
        if kernels.is_some() {
            "one kernel (every image element summed) after its copy, then a sync of that stream"
        } else {
            "a sync of its copy (no CUDA compiler here, so no kernel)"
        }
    ));
    rep.line(&format!(
        "raw cuMemcpyHtoDAsync of one batch from pinned memory (the ceiling): {:.3} ms, {:.1} GB/s",
        ceiling * 1e3,
        batch_bytes as f64 / ceiling / 1e9
    ));
    rep.line(&format!(
        "ours, one already-pinned batch to_device + sync: {:.3} ms, {:.1} GB/s",
        pinned_move * 1e3,
        batch_bytes as f64 / pinned_move / 1e9
    ));
    for (k, v) in &torch {
        rep.line(&format!("{k}: {:.3} ms per batch", v * 1e3));
    }
    rep.line(
        "\n| variant | workers | per batch (window / batches) | GB/s | / ceiling (≥ 0.85) | \
         vs best torch (≥ 10×) | consumer wait | steps | pinned peak / bound |",
    );
    rep.line("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    // The consumer: reads the batch with a kernel ordered after its copy (the view makes the
    // compute stream wait on the ready event), then syncs, as a loop reading its loss would.
    let read = |b: &Batch, spin_ns: u64| match &kernels {
        Some(k) => {
            let view = b.0.cuda_view::<f32>(&compute).expect("device view");
            if spin_ns > 0 {
                k.spin(&compute, spin_ns);
            }
            let ptr = view.device_ptr();
            k.read_sum(&compute, ptr, b.0.numel(), sum_ptr);
            drop(view);
            compute.synchronize().expect("sync");
        }
        None => {
            b.0.ready_event()
                .expect("event")
                .wait_on(&compute)
                .expect("wait");
            if spin_ns > 0 {
                hold_stream(&compute, spin_ns.div_ceil(1_000_000));
            }
            compute.synchronize().expect("sync");
        }
    };
    let sync = |b: &Batch| read(b, 0);
    // One row of the table: a run's figures against the ceiling and PyTorch.
    let row = |name: &str, w: usize, m: pinnable::Result<Run>| match (workers_cell(w), m) {
        (w, Ok(m)) => format!(
            "| {name} | {w} | {:.3} ms | {:.1} | {:.2} | {} | {} | {} | {:.0} / {:.0} MiB |",
            m.fig.per_batch() * 1e3,
            m.fig.gigabytes_per_second(),
            ceiling / m.fig.per_batch(),
            best_torch.map_or("—".into(), |(k, t)| format!(
                "{:.1}× ({k})",
                t / m.fig.per_batch()
            )),
            m.fig.wait(),
            m.fig.percentiles(),
            mib(m.peak),
            mib(m.bound)
        ),
        (w, Err(e)) => format!("| {name} | {w} | error: {e} | | | | | | |"),
    };
    let mut notes = Vec::new();
    for decode in [false, true] {
        for &w in workers {
            let name = if decode { "decode" } else { "views" };
            let m = run(images, decode, w, batches, dev, sync);
            keep_tuning(&mut notes, name, &m);
            rep.line(&row(name, w, m));
        }
    }

    // Nothing collated on the host: the same images, pinned once, gathered on the device.
    let pinned_images = images.tensor().pin_memory().expect("pin the array");
    let labels =
        Tensor::pinned_from_fn(&[pinned_images.shape()[0]], |i| (i % 1000) as i64).expect("labels");
    let auto = workers.contains(&AUTO).then_some(AUTO);
    for w in [1, 2].into_iter().chain(auto) {
        let m = run_gathered(&pinned_images, &labels, w, batches, dev, sync);
        keep_tuning(&mut notes, "gather (pinned array)", &m);
        rep.line(&row("gather (pinned array)", w, m));
    }
    drop(pinned_images);
    if let Some(note) = auto_notes(&notes) {
        rep.line(&note);
    }

    // Overlap: a per-batch kernel longer than the copy (a spin of twice the copy's time, then
    // the read), on the compute stream after the batch's ready event. Step time against the
    // same kernels on a batch already on the device.
    let spin_ns = (2.0 * ceiling * 1e9) as u64;
    let resident = one.to_device(dev, false).expect("move");
    // The kernel alone, run and synced 20 times: one call repeated, so the median of repeats.
    let kernel_alone = median(
        (0..20)
            .map(|_| {
                let t = Instant::now();
                read(&resident, spin_ns);
                t.elapsed().as_secs_f64()
            })
            .collect(),
    );
    rep.line(&format!(
        "\n## overlap: a {:.2} ms per-batch kernel, longer than the copy (alone, on a resident batch: {:.3} ms per step)\n",
        spin_ns as f64 / 1e6,
        kernel_alone * 1e3
    ));
    rep.line(
        "| variant | workers | per batch (window / batches) | per batch / kernel (≤ 1.05) | \
         consumer wait (≤ 2%) | steps | pinned peak / bound |",
    );
    rep.line("| --- | --- | --- | --- | --- | --- | --- |");
    let mut notes = Vec::new();
    for &w in workers.iter().filter(|&&w| w >= 4 || w == AUTO) {
        let batches = batches.min(100);
        let m = run(images, false, w, batches, dev, |b| read(b, spin_ns));
        keep_tuning(&mut notes, "views", &m);
        let w = workers_cell(w);
        match m {
            Ok(m) => rep.line(&format!(
                "| views | {w} | {:.3} ms | {:.3} | {:.2}% | {} | {:.0} / {:.0} MiB |",
                m.fig.per_batch() * 1e3,
                m.fig.per_batch() / kernel_alone,
                100.0 * m.fig.wait_share().unwrap_or(0.0),
                m.fig.percentiles(),
                mib(m.peak),
                mib(m.bound)
            )),
            Err(e) => rep.line(&format!("| views | {w} | error: {e} | | | | |")),
        }
    }
    if let Some(note) = auto_notes(&notes) {
        rep.line(&note);
    }
    std::thread::sleep(Duration::from_millis(10));
    // SAFETY: allocated above, freed once; the copies that used them were synchronised.
    unsafe {
        stream.synchronize().expect("sync");
        result::free_host(host.cast()).expect("free");
        result::free_sync(raw_dev).expect("free");
    }
}
