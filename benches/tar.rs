//! WebDataset tar shards on the host: the same JPEG files as the images bench, packed into 16
//! shards (`classNN/NNNN` keys, a `.jpg` and a `.cls` each), read from the page cache.
//!
//! 1. **Fields only** (no decoding): samples/s of a loader whose batcher reads every byte of
//!    each sample's `.jpg` (a checksum) and collates the labels, against the sequential-read
//!    ceiling: one `cat` of the shards to `/dev/null`, in samples/s of the same shards.
//! 2. **Images decoded**: images/s of [`TarImageBatcher`] (resize 256 + center crop 224, `u8`),
//!    against [`ImageFolder`] + [`ImageBatcher`] on the same files with the same transform and
//!    worker count; Python webdataset's twin is `bench/webdataset_twin.py` (same shards).
//!
//! 3. **Over HTTP** (with the `remote` feature): the shards served by the tests' local web
//!    server (tests/support/http.rs: `sendfile`, a thread a connection). First the floor:
//!    the loopback HTTP ceiling (every shard fetched whole by 1, 4 and 16 parallel plain
//!    `GET`s, bodies discarded; the best is "the ceiling") and object_store's `get` alone
//!    (all shards at once, bodies drained). Then ours, fields only and decoded, through
//!    [`Remote`] with a shuffle buffer of 256 samples, against the ceiling and the local-file
//!    rates above, with the bytes and requests an epoch and where the workers' time went.
//! 4. **Steady state** (with `remote`): an epoch of 16 shards lasts 10 to 20 ms, start-up and
//!    end included; the shards listed 40 times make one long epoch, read locally and over HTTP
//!    (fields only), each rate over a window of 1024 batches after 128, beside the ceiling of
//!    the listed shards fetched whole over 16 kept-open connections.
//!
//!    Knobs: `PINNABLE_BENCH_CHUNK_KIB` (4096), `PINNABLE_BENCH_READ_AHEAD` (4),
//!    `PINNABLE_BENCH_THREADS` (runtime threads, 4); `PINNABLE_BENCH_DECODE=0` leaves the
//!    decoded rows out.
//!
//! The files: `$PINNABLE_BENCH_IMAGES_DIR` (default `$PINNABLE_BENCH_OUT/jpegs`), as the
//! images bench finds or writes them; the shards go to `$PINNABLE_BENCH_OUT/tar-shards`
//! (written when missing). Knobs: `PINNABLE_BENCH_WORKERS` (e.g. `4,8,14`). Writes
//! `$PINNABLE_BENCH_OUT/tar.md`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use pinnable::formats::image::{ImageBatcher, ImageFolder, Transform};
use pinnable::formats::tar::{TarImageBatcher, TarSample, TarShards};
use pinnable::loader::{Batcher, Collator, Loader};
use pinnable::{Result, Tensor};
use pinnable_harness::bench::{Report, median};
use pinnable_harness::tar::shard;
use pinnable_harness::{images, rng};

#[cfg(feature = "remote")]
use pinnable::formats::tar::Remote;
#[cfg(feature = "remote")]
use pinnable_harness::http::Server;

const BATCH: usize = 64;
const SHARDS: usize = 16;

fn out_dir() -> PathBuf {
    std::env::var("PINNABLE_BENCH_OUT").map_or_else(
        |_| std::env::temp_dir().join("pinnable-bench-tar"),
        PathBuf::from,
    )
}

fn worker_counts() -> Vec<usize> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if let Ok(list) = std::env::var("PINNABLE_BENCH_WORKERS") {
        return list
            .split(',')
            .filter_map(|w| w.trim().parse().ok())
            .collect();
    }
    let v: Vec<usize> = [4, 8, 14].into_iter().filter(|&w| w <= cores).collect();
    if v.is_empty() { vec![cores] } else { v }
}

/// Whether the decoded-images rows run (`PINNABLE_BENCH_DECODE=0` leaves them out).
fn decoding() -> bool {
    std::env::var("PINNABLE_BENCH_DECODE").map_or(true, |v| v != "0")
}

/// The JPEG files and their labels, as the images bench uses them (written when missing).
fn files() -> ImageFolder {
    let dir = std::env::var("PINNABLE_BENCH_IMAGES_DIR")
        .map_or_else(|_| out_dir().join("jpegs"), PathBuf::from);
    if let Ok(f) = ImageFolder::open(&dir)
        && !f.is_empty()
    {
        return f;
    }
    println!("writing 2048 JPEGs to {} (jpeg-encoder)", dir.display());
    images::write_folder(&mut rng("bench tar (files)"), &dir, 8, 256, (500, 375));
    ImageFolder::open(&dir).expect("the files just written")
}

/// The files packed into `SHARDS` shards in file order; their paths.
fn shards(folder: &ImageFolder) -> Vec<PathBuf> {
    let dir = out_dir().join("tar-shards");
    std::fs::create_dir_all(&dir).expect("shard folder");
    let paths: Vec<PathBuf> = (0..SHARDS)
        .map(|s| dir.join(format!("train-{s:06}.tar")))
        .collect();
    if paths.iter().all(|p| p.exists()) {
        return paths;
    }
    let per = folder.len().div_ceil(SHARDS);
    for (s, path) in paths.iter().enumerate() {
        let samples: Vec<_> = (s * per..((s + 1) * per).min(folder.len()))
            .map(|i| {
                let file = folder.path(i).unwrap();
                let key = format!(
                    "{}/{}",
                    file.parent()
                        .and_then(Path::file_name)
                        .unwrap()
                        .to_string_lossy(),
                    file.file_stem().unwrap().to_string_lossy()
                );
                let label = folder.label(i).unwrap().to_string().into_bytes();
                (
                    key,
                    vec![
                        ("jpg".into(), std::fs::read(file).unwrap()),
                        ("cls".into(), label),
                    ],
                )
            })
            .collect();
        std::fs::write(path, shard(&samples).0).expect("write a shard");
    }
    paths
}

/// Labels only: the `.cls` read, the `.jpg` left alone (over HTTP it still arrives: the rate of
/// the stream itself).
#[cfg(feature = "remote")]
struct LabelsOnly;

#[cfg(feature = "remote")]
impl Batcher<TarSample> for LabelsOnly {
    type Batch = Tensor;

    fn batch(&self, samples: Vec<TarSample>, c: &mut Collator) -> Result<Tensor> {
        let labels = samples
            .iter()
            .map(|s| s.class("cls"))
            .collect::<Result<Vec<_>>>()?;
        let y = c.stack_scalars("labels", labels)?;
        c.finish()?.take(y)
    }
}

/// Fields only: every byte of the `.jpg` read (a checksum), labels and checksums collated.
struct FieldsOnly;

impl Batcher<TarSample> for FieldsOnly {
    type Batch = (Tensor, Tensor);

    fn batch(&self, samples: Vec<TarSample>, c: &mut Collator) -> Result<(Tensor, Tensor)> {
        let mut sums = Vec::with_capacity(samples.len());
        let mut labels = Vec::with_capacity(samples.len());
        for s in &samples {
            let bytes = s.bytes("jpg")?;
            sums.push(
                bytes
                    .iter()
                    .fold(0u64, |a, &b| a.wrapping_add(u64::from(b))) as i64,
            );
            labels.push(s.class("cls")?);
        }
        let x = c.stack_scalars("sums", sums)?;
        let y = c.stack_scalars("labels", labels)?;
        let mut out = c.finish()?;
        Ok((out.take(x)?, out.take(y)?))
    }
}

/// Seconds for one epoch of `loader`-like iteration, median of three after a warm-up.
fn seconds(mut epoch: impl FnMut() -> usize, items: usize) -> f64 {
    epoch();
    median(
        (0..3)
            .map(|_| {
                let t = Instant::now();
                assert_eq!(epoch(), items);
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

fn main() {
    let folder = files();
    let paths = shards(&folder);
    let n = folder.len();
    let bytes: u64 = paths
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    let mut rep = Report::default();
    rep.line(&format!(
        "# tar shards: {n} samples in {SHARDS} shards, {:.1} MiB, batches of {BATCH}\n",
        bytes as f64 / (1 << 20) as f64
    ));

    let cat = seconds(
        || {
            let ok = Command::new("cat")
                .args(&paths)
                .stdout(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "cat the shards");
            n
        },
        n,
    );
    rep.line("| figure | samples/s | GB/s | against the `cat` ceiling |");
    rep.line("| --- | --- | --- | --- |");
    rep.line(&format!(
        "| `cat` of the shards (the sequential-read ceiling) | {:.0} | {:.2} | 1.00× |",
        n as f64 / cat,
        bytes as f64 / cat / 1e9
    ));
    let pattern = format!(
        "{}/train-{{000000..{:06}}}.tar",
        paths[0].parent().unwrap().display(),
        SHARDS - 1
    );
    let t = Instant::now();
    let tar = TarShards::open([&pattern]).expect("open the shards");
    rep.line(&format!(
        "| index pass at open (headers only) | {:.0} | — | {:.2} ms in all |",
        n as f64 / t.elapsed().as_secs_f64(),
        t.elapsed().as_secs_f64() * 1e3
    ));
    let mut local_rates = Vec::new();
    for &w in &worker_counts() {
        let loader = Loader::builder(tar.clone())
            .batch_size(BATCH)
            .shuffle(1)
            .workers(w)
            .build(FieldsOnly)
            .unwrap();
        let s = seconds(|| loader.iter().map(|b| b.unwrap().1.numel()).sum(), n);
        local_rates.push((w, n as f64 / s, 0.0));
        rep.line(&format!(
            "| fields only, {w} workers | {:.0} | {:.2} | {:.2}× |",
            n as f64 / s,
            bytes as f64 / s / 1e9,
            cat / s
        ));
    }

    let decode = decoding();
    if decode {
        rep.line(
            "\n| images decoded (resize 256, crop 224, u8) | images/s | ImageFolder images/s | \
             ratio |",
        );
        rep.line("| --- | --- | --- | --- |");
    }
    let transform = Transform::resized_center_crop(256, 224);
    let folder = folder.transform(transform.clone());
    for &w in worker_counts().iter().filter(|_| decode) {
        let ours = Loader::builder(tar.clone())
            .batch_size(BATCH)
            .shuffle(1)
            .workers(w)
            .build(TarImageBatcher::new(transform.clone()))
            .unwrap();
        let s = seconds(|| ours.iter().map(|b| b.unwrap().1.numel()).sum(), n);
        let theirs = Loader::builder(folder.clone())
            .batch_size(BATCH)
            .shuffle(1)
            .workers(w)
            .build(ImageBatcher)
            .unwrap();
        let f = seconds(|| theirs.iter().map(|b| b.unwrap().1.numel()).sum(), n);
        if let Some(r) = local_rates.iter_mut().find(|r| r.0 == w) {
            r.2 = n as f64 / s;
        }
        rep.line(&format!(
            "| tar shards, {w} workers | {:.0} | {:.0} | {:.2}× |",
            n as f64 / s,
            n as f64 / f,
            f / s
        ));
    }
    #[cfg(feature = "remote")]
    over_http(&mut rep, &paths, n, bytes, &local_rates);
    #[cfg(not(feature = "remote"))]
    let _ = local_rates;
    rep.save("tar.md");
}

/// A `PINNABLE_BENCH_*` knob, or `default`.
#[cfg(feature = "remote")]
fn knob(name: &str, default: usize) -> usize {
    std::env::var(format!("PINNABLE_BENCH_{name}"))
        .ok()
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

/// One pass of object_store's `get` alone over every shard, all at once on `runtime`, bodies
/// drained and discarded; the bytes read.
#[cfg(feature = "remote")]
fn store_pass(
    runtime: &tokio::runtime::Runtime,
    store: &std::sync::Arc<dyn object_store::ObjectStore>,
    names: &[String],
) -> u64 {
    use futures_util::StreamExt;
    use object_store::ObjectStoreExt;
    runtime.block_on(async {
        let tasks: Vec<_> = names
            .iter()
            .map(|name| {
                let store = store.clone();
                let path = object_store::path::Path::from(name.as_str());
                tokio::spawn(async move {
                    let mut body = store.get(&path).await.expect("get a shard").into_stream();
                    let mut read = 0;
                    while let Some(piece) = body.next().await {
                        read += piece.expect("its body").len() as u64;
                    }
                    read
                })
            })
            .collect();
        let mut read = 0;
        for t in tasks {
            read += t.await.expect("a get task");
        }
        read
    })
}

/// Section 3: the shards from the local web server; `local` holds (workers, fields-only
/// samples/s, decoded images/s) from the local files.
#[cfg(feature = "remote")]
fn over_http(
    rep: &mut Report,
    paths: &[PathBuf],
    n: usize,
    bytes: u64,
    local: &[(usize, f64, f64)],
) {
    let server = Server::start(paths[0].parent().unwrap());
    let names: Vec<String> = paths
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let pattern = format!("{}/train-{{000000..{:06}}}.tar", server.url(), SHARDS - 1);
    let chunk = knob("CHUNK_KIB", 4096);
    let ahead = knob("READ_AHEAD", 4);
    let threads = knob("THREADS", 4);
    let cache = 48 << 20;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());

    // The floor: what any client of this server reaches over loopback.
    let gb = |s: f64| bytes as f64 / s / 1e9;
    let mut ceiling = 0f64;
    let mut floor_rows = Vec::new();
    for conns in [1, 4, SHARDS] {
        let s = seconds(
            || {
                assert_eq!(server.get_whole(&names, conns), bytes);
                n
            },
            n,
        );
        ceiling = ceiling.max(gb(s));
        floor_rows.push((
            format!("plain `GET`s of whole shards, {conns} connections"),
            s,
        ));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("a runtime");
    let store: std::sync::Arc<dyn object_store::ObjectStore> = std::sync::Arc::new(
        object_store::http::HttpBuilder::new()
            .with_url(server.url())
            .with_client_options(object_store::ClientOptions::new().with_allow_http(true))
            .build()
            .expect("an HTTP store"),
    );
    let s = seconds(
        || {
            assert_eq!(store_pass(&runtime, &store, &names), bytes);
            n
        },
        n,
    );
    floor_rows.push((
        format!("object_store `get` of whole shards, {SHARDS} at once, {threads} runtime threads"),
        s,
    ));
    drop(runtime);

    let remote = Remote::new()
        .chunk_size(chunk << 10)
        .cache_bytes(cache)
        .read_ahead(ahead)
        .threads(threads);
    let before = server.served();
    let t = Instant::now();
    let tar = remote
        .open([&pattern])
        .expect("open the shards over HTTP")
        .shuffle_buffer(256);
    let index = t.elapsed().as_secs_f64();
    let indexed = server.served() - before;
    rep.line(&format!(
        "\n# over HTTP (the tests' local server, sendfile, a thread a connection; {cores} cores; \
         {} KiB chunks, {ahead} read ahead, {} MiB cap on held samples, {threads} runtime \
         threads, shuffle buffer 256)\n",
        chunk,
        cache >> 20
    ));
    rep.line(&format!(
        "index pass: {:.1} ms, {:.1} MiB read ({:.1}% of the shards)\n",
        index * 1e3,
        indexed as f64 / (1 << 20) as f64,
        100.0 * indexed as f64 / bytes as f64
    ));
    let best_local = local.iter().map(|l| l.1).fold(0f64, f64::max);
    let local_gb = best_local * bytes as f64 / n as f64 / 1e9;
    rep.line(
        "| figure | GB/s | items/s | against the HTTP ceiling | against local files | bytes \
         read an epoch |",
    );
    rep.line("| --- | --- | --- | --- | --- | --- |");
    for (what, s) in &floor_rows {
        rep.line(&format!(
            "| {what} | {:.2} | {:.0} | {:.2}× | {:.2}× | 1.00× the shards |",
            gb(*s),
            n as f64 / s,
            gb(*s) / ceiling,
            gb(*s) / local_gb
        ));
    }
    let transform = Transform::resized_center_crop(256, 224);
    let mut ours_best = 0f64;
    for &(w, fields, decoded) in local {
        rep.line(&format!(
            "| local files, fields only, {w} workers | {:.2} | {fields:.0} | {:.2}× | 1.00× | — |",
            fields * bytes as f64 / n as f64 / 1e9,
            fields * bytes as f64 / n as f64 / 1e9 / ceiling,
        ));
        let loader = Loader::builder(tar.clone())
            .batch_size(BATCH)
            .shuffle(1)
            .workers(w)
            .build(FieldsOnly)
            .unwrap();
        let (before, asked) = (server.served(), server.log().len());
        // The workers' time in `get` (waiting for the stream) and in the batcher, last epoch.
        let mut spent = (0.0, 0.0);
        let s = seconds(
            || {
                let mut epoch = loader.iter();
                let k = (&mut epoch).map(|b| b.unwrap().1.numel()).sum();
                let stats = epoch.stats();
                spent = (stats.load.as_secs_f64(), stats.collate.as_secs_f64());
                k
            },
            n,
        );
        let per_epoch = (server.served() - before) as f64 / 4.0 / bytes as f64;
        let requests = (server.log().len() - asked) as f64 / 4.0;
        ours_best = ours_best.max(gb(s));
        rep.line(&format!(
            "| **ours over HTTP, fields only, {w} workers** | {:.2} | {:.0} | {:.2}× | {:.2}× | \
             {per_epoch:.3}× the shards, {requests:.0} requests ({:.2} a MiB); workers {:.0}% \
             in `get`, {:.0}% in the batcher |",
            gb(s),
            n as f64 / s,
            gb(s) / ceiling,
            n as f64 / s / fields,
            requests / (bytes as f64 / (1 << 20) as f64),
            100.0 * spent.0 / (spent.0 + spent.1).max(1e-9),
            100.0 * spent.1 / (spent.0 + spent.1).max(1e-9),
        ));
        let loader = Loader::builder(tar.clone())
            .batch_size(BATCH)
            .shuffle(1)
            .workers(w)
            .build(LabelsOnly)
            .unwrap();
        let before = server.served();
        let s = seconds(|| loader.iter().map(|b| b.unwrap().numel()).sum(), n);
        let per_epoch = (server.served() - before) as f64 / 4.0 / bytes as f64;
        rep.line(&format!(
            "| ours over HTTP, the stream alone (labels read, `.jpg` bytes not), {w} workers | \
             {:.2} | {:.0} | {:.2}× | — | {per_epoch:.3}× the shards |",
            gb(s),
            n as f64 / s,
            gb(s) / ceiling,
        ));
        if !decoding() {
            continue;
        }
        let loader = Loader::builder(tar.clone())
            .batch_size(BATCH)
            .shuffle(1)
            .workers(w)
            .build(TarImageBatcher::new(transform.clone()))
            .unwrap();
        let before = server.served();
        let s = seconds(|| loader.iter().map(|b| b.unwrap().1.numel()).sum(), n);
        let per_epoch = (server.served() - before) as f64 / 4.0 / bytes as f64;
        rep.line(&format!(
            "| ours over HTTP, images decoded, {w} workers | {:.2} | {:.0} | — | {:.2}× of \
             {decoded:.0}/s | {per_epoch:.3}× the shards |",
            gb(s),
            n as f64 / s,
            n as f64 / s / decoded
        ));
    }
    steady(rep, &server, paths, &names, (n, bytes), &remote, local);
    // With few cores the client's reads and the workers' own work (the checksum) take turns
    // on the same cores: the rate both allow is then the harmonic sum of the two.
    let shared = 1.0 / (1.0 / ceiling + 1.0 / local_gb);
    rep.line(&format!(
        "\nWhen the HTTP reads and the workers' own work share saturated cores, the rate both \
         allow is 1 / (1 / ceiling + 1 / local) = {shared:.2} GB/s: ours at best {:.2}× of it.",
        ours_best / shared
    ));
    rep.line(&format!(
        "\nHTTP ceiling {ceiling:.2} GB/s (the best plain-`GET` row) against local fields only at \
         {local_gb:.2} GB/s: {:.2}×. {} Ours at best: {:.2}× the ceiling, {:.2}× local.",
        ceiling / local_gb,
        if ceiling < 0.8 * local_gb {
            "Loopback HTTP cannot reach 0.8× of the local rate here: the figure to meet is 0.8× \
             of the ceiling."
        } else {
            "The local rate is within the ceiling's reach: the figure to meet is 0.8× of it."
        },
        ours_best / ceiling,
        ours_best / local_gb
    ));
}

/// The shards listed this many times make the long epoch of [`steady`].
#[cfg(feature = "remote")]
const REPEAT: usize = 40;
/// Batches skipped at a long epoch's start, then timed.
#[cfg(feature = "remote")]
const SKIP: usize = 128;
#[cfg(feature = "remote")]
const WINDOW: usize = 1024;

/// Samples/s of `tar`, fields only, with `w` workers, over a window of [`WINDOW`] batches after
/// [`SKIP`] of one epoch (which must hold more).
#[cfg(feature = "remote")]
fn window_rate(tar: &TarShards, w: usize) -> f64 {
    let loader = Loader::builder(tar.clone())
        .batch_size(BATCH)
        .shuffle(1)
        .workers(w)
        .build(FieldsOnly)
        .unwrap();
    let mut epoch = loader.iter();
    for b in epoch.by_ref().take(SKIP) {
        b.unwrap();
    }
    let t = Instant::now();
    let mut k = 0;
    for b in epoch.by_ref().take(WINDOW) {
        k += b.unwrap().1.numel();
    }
    let s = t.elapsed().as_secs_f64();
    assert_eq!(k, WINDOW * BATCH, "the epoch holds the window");
    k as f64 / s
}

/// Section 4, steady state. An epoch of the 16 shards lasts 10 to 20 ms, so the rows above
/// weigh start-up (threads, connections, first chunks) and the epoch's end as much as the
/// stream. Here the shards listed [`REPEAT`] times make one long epoch, read locally and over
/// HTTP with the same settings (shuffle buffer 256), each rate taken over a window of
/// [`WINDOW`] batches after [`SKIP`]; the ceiling is every listed shard fetched whole over 16
/// connections kept open.
#[cfg(feature = "remote")]
fn steady(
    rep: &mut Report,
    server: &Server,
    paths: &[PathBuf],
    names: &[String],
    (n, bytes): (usize, u64),
    remote: &Remote,
    local: &[(usize, f64, f64)],
) {
    let long: Vec<String> = (0..REPEAT).flat_map(|_| names.iter().cloned()).collect();
    let total = bytes * REPEAT as u64;
    let t = Instant::now();
    assert_eq!(server.get_whole(&long, SHARDS), total);
    let ceiling = total as f64 / t.elapsed().as_secs_f64() / 1e9;
    let per_sample = bytes as f64 / n as f64;
    let on_disk =
        TarShards::open((0..REPEAT).flat_map(|_| paths.iter().map(|p| p.display().to_string())))
            .expect("open the listed shards")
            .shuffle_buffer(256);
    let over_http = remote
        .open(long.iter().map(|name| format!("{}/{name}", server.url())))
        .expect("open the listed shards over HTTP")
        .shuffle_buffer(256);
    rep.line(&format!(
        "\n# steady state: the {SHARDS} shards listed {REPEAT} times, one epoch of {} \
         samples, fields only, a window of {WINDOW} batches after {SKIP}\n",
        n * REPEAT
    ));
    rep.line(&format!(
        "HTTP ceiling, every listed shard fetched whole over {SHARDS} connections kept open: \
         {ceiling:.2} GB/s ({:.0} samples/s)\n",
        ceiling * 1e9 / per_sample
    ));
    rep.line(
        "| workers | local files, samples/s (GB/s) | over HTTP, samples/s (GB/s) | HTTP / local \
         | HTTP / ceiling | ceiling / local |",
    );
    rep.line("| --- | --- | --- | --- | --- | --- |");
    for &(w, ..) in local {
        let l = window_rate(&on_disk, w);
        let h = window_rate(&over_http, w);
        let gb = |r: f64| r * per_sample / 1e9;
        rep.line(&format!(
            "| {w} | {l:.0} ({:.2}) | {h:.0} ({:.2}) | {:.2}× | {:.2}× | {:.2}× |",
            gb(l),
            gb(h),
            h / l,
            gb(h) / ceiling,
            ceiling / gb(l)
        ));
    }
}
