//! Sections 3 and 4 of the tar bench (the `remote` feature): the shards from the tests' local
//! web server, against the loopback ceiling and the local-file rates, over whole epochs and in
//! a steady window of one long epoch. The auto rows read through a `Storage` with its
//! defaults (the cache cap apart), their loaders' workers and batches ahead tuned.

use std::path::PathBuf;
use std::time::Instant;

use pinnable::formats::image::{ImageCodec, Transform};
use pinnable::formats::tar::{TarImageBatcher, TarSample, TarShards};
use pinnable::loader::{Batcher, Collator, Loader};
use pinnable::storage::Storage;
use pinnable::{Result, Tensor};
use pinnable_harness::bench::{
    AUTO, Report, Tuning, WorkersOrAuto, cpu_seconds, env_usize, settle, threads_cpu_seconds,
    workers_cell, workers_label,
};
use pinnable_harness::http::Server;

use super::{BATCH, SHARDS, decoding, fields_loader, keep_tuning, print_notes, seconds, settled};

/// Labels only: the `.cls` read, the `.jpg` left alone (over HTTP it still arrives: the rate of
/// the stream itself).
struct LabelsOnly;

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

/// A `PINNABLE_BENCH_*` knob, or `default`.
fn knob(name: &str, default: usize) -> usize {
    env_usize(&format!("PINNABLE_BENCH_{name}")).unwrap_or(default)
}

/// One pass of object_store's `get` alone over every shard, all at once on `runtime`, bodies
/// drained and discarded; the bytes read.
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
pub fn over_http(
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
    let cache = knob("CACHE_MIB", 256) << 20;
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

    let remote = Storage::new()
        .chunk_size(chunk << 10)
        .cache_bytes(cache)
        .read_ahead(ahead)
        .threads(threads);
    // The auto rows': the defaults for the chunk size, the read-ahead and the runtime threads.
    let defaults = Storage::new().cache_bytes(cache);
    let before = server.served();
    let t = Instant::now();
    let tar = TarShards::open_with(&remote, [&pattern])
        .expect("open the shards over HTTP")
        .shuffle_buffer(256);
    let index = t.elapsed().as_secs_f64();
    let indexed = server.served() - before;
    let auto_tar = local.iter().any(|l| l.0 == AUTO).then(|| {
        TarShards::open_with(&defaults, [&pattern])
            .expect("open the shards over HTTP")
            .shuffle_buffer(256)
    });
    rep.line(&format!(
        "\n# over HTTP (the tests' local server, sendfile, a thread a connection; {cores} cores; \
         {} KiB chunks, {ahead} read ahead, {} MiB cap on held samples, {threads} runtime \
         threads, shuffle buffer 256; the auto rows: `Storage`'s defaults, 4 MiB chunks, the \
         read-ahead grown from 4 while the workers wait, runtime threads half the cores within \
         2 to 8, the same cap)\n",
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
    let mut notes = Vec::new();
    for &(w, fields, decoded) in local {
        let label = workers_label(w);
        rep.line(&format!(
            "| local files, fields only, {label} | {:.2} | {fields:.0} | {:.2}× | 1.00× | — |",
            fields * bytes as f64 / n as f64 / 1e9,
            fields * bytes as f64 / n as f64 / 1e9 / ceiling,
        ));
        // An auto row reads through the default settings.
        let (tar, label) = match &auto_tar {
            Some(defaults) if w == AUTO => (defaults, format!("{label}, `Storage` defaults")),
            _ => (&tar, label),
        };
        let loader = fields_loader(tar, w);
        let settling = settled(&loader, w);
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
        keep_tuning(&mut notes, "fields only", w, &loader, &settling);
        let per_epoch = (server.served() - before) as f64 / 4.0 / bytes as f64;
        let requests = (server.log().len() - asked) as f64 / 4.0;
        ours_best = ours_best.max(gb(s));
        rep.line(&format!(
            "| **ours over HTTP, fields only, {label}** | {:.2} | {:.0} | {:.2}× | {:.2}× | \
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
            .workers_or_auto(w)
            .build(LabelsOnly)
            .unwrap();
        let settling = settled(&loader, w);
        let before = server.served();
        let s = seconds(|| loader.iter().map(|b| b.unwrap().numel()).sum(), n);
        keep_tuning(&mut notes, "the stream alone", w, &loader, &settling);
        let per_epoch = (server.served() - before) as f64 / 4.0 / bytes as f64;
        rep.line(&format!(
            "| ours over HTTP, the stream alone (labels read, `.jpg` bytes not), {label} | \
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
            .workers_or_auto(w)
            .build(TarImageBatcher::new(ImageCodec::new(transform.clone())))
            .unwrap();
        let settling = settled(&loader, w);
        let before = server.served();
        let s = seconds(|| loader.iter().map(|b| b.unwrap().1.numel()).sum(), n);
        keep_tuning(&mut notes, "images decoded", w, &loader, &settling);
        let per_epoch = (server.served() - before) as f64 / 4.0 / bytes as f64;
        rep.line(&format!(
            "| ours over HTTP, images decoded, {label} | {:.2} | {:.0} | — | {:.2}× of \
             {decoded:.0}/s | {per_epoch:.3}× the shards |",
            gb(s),
            n as f64 / s,
            n as f64 / s / decoded
        ));
    }
    print_notes(&notes, true, rep);
    steady(
        rep,
        &server,
        paths,
        &names,
        (n, bytes),
        (&remote, &defaults),
        local,
    );
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

/// The shards listed this many times make the long epoch of [`steady`]
/// (`PINNABLE_BENCH_REPEAT`, 40).
static REPEAT: std::sync::LazyLock<usize> =
    std::sync::LazyLock::new(|| env_usize("PINNABLE_BENCH_REPEAT").unwrap_or(40));
/// Batches skipped at a long epoch's start, then timed.
const SKIP: usize = 128;
/// Batches timed (`PINNABLE_BENCH_WINDOW`, 1024).
static WINDOW: std::sync::LazyLock<usize> =
    std::sync::LazyLock::new(|| env_usize("PINNABLE_BENCH_WINDOW").unwrap_or(1024));

/// Cores busy over a window: the whole process, the loader's workers, the runtime's threads
/// (`pinnable-remote`); the rest is the server's threads and the consumer.
struct Cores {
    process: f64,
    loader: f64,
    runtime: f64,
}

impl Cores {
    fn now() -> [f64; 3] {
        [
            cpu_seconds(),
            threads_cpu_seconds("loader-"),
            threads_cpu_seconds("pinnable-remote"),
        ]
    }

    fn since(then: [f64; 3], wall: f64) -> Cores {
        let now = Cores::now();
        Cores {
            process: (now[0] - then[0]) / wall,
            loader: (now[1] - then[1]) / wall,
            runtime: (now[2] - then[2]) / wall,
        }
    }
}

impl std::fmt::Display for Cores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.1} ({:.1} workers, {:.1} runtime, {:.1} rest)",
            self.process,
            self.loader,
            self.runtime,
            self.process - self.loader - self.runtime
        )
    }
}

/// Samples/s of `tar`, fields only, with `w` workers, over a window of [`WINDOW`] batches after
/// [`SKIP`] of one epoch (which must hold more), and the cores busy over it. With [`AUTO`]
/// workers, after untimed epochs for the tuning to settle, and what it did.
fn window_rate(tar: &TarShards, w: usize) -> (f64, Cores, Option<Tuning>) {
    let loader = fields_loader(tar, w);
    let settling = if w == AUTO {
        settle(&loader, |_| Ok(())).expect("the untimed epochs")
    } else {
        Vec::new()
    };
    let mut epoch = loader.iter();
    for b in epoch.by_ref().take(SKIP) {
        b.unwrap();
    }
    let (t, cpu) = (Instant::now(), Cores::now());
    let mut k = 0;
    for b in epoch.by_ref().take(*WINDOW) {
        k += b.unwrap().1.numel();
    }
    let s = t.elapsed().as_secs_f64();
    let cores = Cores::since(cpu, s);
    assert_eq!(k, *WINDOW * BATCH, "the epoch holds the window");
    let tuning = (w == AUTO).then(|| Tuning::new(&settling, &epoch.stats()));
    (k as f64 / s, cores, tuning)
}

/// Section 4, steady state. An epoch of the 16 shards lasts 10 to 20 ms, so the rows above
/// weigh start-up (threads, connections, first chunks) and the epoch's end as much as the
/// stream. Here the shards listed [`REPEAT`] times make one long epoch, read locally and over
/// HTTP with the same settings (shuffle buffer 256), each rate taken over a window of
/// [`WINDOW`] batches after [`SKIP`]; the ceiling is every listed shard fetched whole over 16
/// connections kept open. The auto row reads over HTTP through `defaults`, the others through
/// `remote`.
fn steady(
    rep: &mut Report,
    server: &Server,
    paths: &[PathBuf],
    names: &[String],
    (n, bytes): (usize, u64),
    (remote, defaults): (&Storage, &Storage),
    local: &[(usize, f64, f64)],
) {
    let long: Vec<String> = (0..*REPEAT).flat_map(|_| names.iter().cloned()).collect();
    let total = bytes * *REPEAT as u64;
    let t = Instant::now();
    assert_eq!(server.get_whole(&long, SHARDS), total);
    let ceiling = total as f64 / t.elapsed().as_secs_f64() / 1e9;
    let per_sample = bytes as f64 / n as f64;
    let on_disk =
        TarShards::open((0..*REPEAT).flat_map(|_| paths.iter().map(|p| p.display().to_string())))
            .expect("open the listed shards")
            .shuffle_buffer(256);
    let listed = |storage: &Storage| {
        TarShards::open_with(
            storage,
            long.iter().map(|name| format!("{}/{name}", server.url())),
        )
        .expect("open the listed shards over HTTP")
        .shuffle_buffer(256)
    };
    let over_http = listed(remote);
    let auto_http = local.iter().any(|l| l.0 == AUTO).then(|| listed(defaults));
    rep.line(&format!(
        "\n# steady state: the {SHARDS} shards listed {} times, one epoch of {} \
         samples, fields only, a window of {} batches after {SKIP}\n",
        *REPEAT,
        n * *REPEAT,
        *WINDOW
    ));
    rep.line(&format!(
        "HTTP ceiling, every listed shard fetched whole over {SHARDS} connections kept open: \
         {ceiling:.2} GB/s ({:.0} samples/s)\n",
        ceiling * 1e9 / per_sample
    ));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    rep.line(&format!(
        "| workers | local files, samples/s (GB/s) | over HTTP, samples/s (GB/s) | HTTP / local \
         | HTTP / ceiling | ceiling / local | cores busy, local | cores busy, HTTP (the server's \
         threads in the rest) | CPU a sample, local; HTTP | HTTP's CPU bound: {cores} cores at \
         its CPU a sample (/ local) | HTTP / its CPU bound |"
    ));
    rep.line("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let mut notes = Vec::new();
    for &(w, ..) in local {
        let http = match &auto_http {
            Some(defaults) if w == AUTO => defaults,
            _ => &over_http,
        };
        let (l, l_cores, l_tuning) = window_rate(&on_disk, w);
        let (h, h_cores, h_tuning) = window_rate(http, w);
        notes.extend(l_tuning.map(|t| ("local files".to_owned(), t)));
        notes.extend(h_tuning.map(|t| ("over HTTP, `Storage` defaults".to_owned(), t)));
        let gb = |r: f64| r * per_sample / 1e9;
        // Over HTTP every sample also costs the runtime's receiving and the server's sending,
        // on the same cores: however the work is spread, the rate cannot pass the cores over
        // the CPU time a sample takes.
        let bound = cores * h / h_cores.process;
        rep.line(&format!(
            "| {} | {l:.0} ({:.2}) | {h:.0} ({:.2}) | {:.2}× | {:.2}× | {:.2}× | {l_cores} | \
             {h_cores} | {:.1}; {:.1} µs | {bound:.0} ({:.2}×) | {:.2}× |",
            workers_cell(w),
            gb(l),
            gb(h),
            h / l,
            gb(h) / ceiling,
            ceiling / gb(l),
            l_cores.process / l * 1e6,
            h_cores.process / h * 1e6,
            bound / l,
            h / bound,
        ));
    }
    print_notes(&notes, false, rep);
}
