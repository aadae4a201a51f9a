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
//!    `Storage` with a shuffle buffer of 256 samples, against the ceiling and the local-file
//!    rates above, with the bytes and requests an epoch and where the workers' time went.
//! 4. **Steady state** (with `remote`): an epoch of 16 shards lasts 10 to 20 ms, start-up and
//!    end included; the shards listed 40 times make one long epoch, read locally and over HTTP
//!    (fields only), each rate over a window of 1024 batches after 128, beside the ceiling of
//!    the listed shards fetched whole over 16 kept-open connections.
//!
//!    Sections 3 and 4 are in `tar/remote.rs`. Knobs: `PINNABLE_BENCH_CHUNK_KIB` (4096), `PINNABLE_BENCH_READ_AHEAD` (4),
//!    `PINNABLE_BENCH_CACHE_MIB` (`Storage::cache_bytes`, 256, the library's default),
//!    `PINNABLE_BENCH_THREADS` (runtime threads, 4); `PINNABLE_BENCH_DECODE=0` leaves the
//!    decoded rows out; `PINNABLE_BENCH_REPEAT` (40) and `PINNABLE_BENCH_WINDOW` (1024) set
//!    section 4's listings and window. Section 4 also gives each row's CPU time a sample and
//!    the rate it bounds over HTTP: the machine's cores over it (the server shares them).
//!
//! Every section has auto rows beside the rows at worker counts set by hand: the loader tunes
//! its workers and batches ahead, runs 3 s of untimed epochs, and is then timed as the others
//! are; the note under the table says where the tuning left them and when its last decision
//! came. Over HTTP the auto rows also keep `Storage`'s defaults for the chunk size, the
//! read-ahead (grown while the workers wait) and the runtime threads (sized to the host): the
//! chunk, read-ahead and threads knobs are the other rows' only.
//!
//! The files: `$PINNABLE_BENCH_IMAGES_DIR` (default `$PINNABLE_BENCH_OUT/jpegs`), as the
//! images bench finds or writes them; the shards go to `$PINNABLE_BENCH_OUT/tar-shards`
//! (written when missing). Knobs: `PINNABLE_BENCH_WORKERS` (e.g. `4,8,14,auto`; `auto` or `0`
//! is the auto row; by default 4, 8 and 14 workers as the cores allow, then auto),
//! `PINNABLE_BENCH_PREFETCH` (the fields-only loaders' batches ahead, 8, except in the auto
//! rows). Writes `$PINNABLE_BENCH_OUT/tar.md`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use pinnable::formats::image::{ImageBatcher, ImageCodec, ImageFolder, Transform};
use pinnable::formats::tar::{TarImageBatcher, TarSample, TarShards};
use pinnable::loader::{Batcher, Collator, EpochStats, Loader, Source};
use pinnable::{Result, Tensor, ToDevice};
use pinnable_harness::bench;
use pinnable_harness::bench::{
    AUTO, Report, Tuning, WorkersOrAuto, auto_notes, env_usize, median, settle, workers_label,
};
use pinnable_harness::tar::shard;
use pinnable_harness::{images, rng};

#[cfg(feature = "remote")]
#[path = "tar/remote.rs"]
mod remote;

const BATCH: usize = 64;
const SHARDS: usize = 16;

fn out_dir() -> PathBuf {
    std::env::var("PINNABLE_BENCH_OUT").map_or_else(
        |_| std::env::temp_dir().join("pinnable-bench-tar"),
        PathBuf::from,
    )
}

/// The rows' worker counts: `PINNABLE_BENCH_WORKERS`, else 4, 8 and 14 up to the cores (or the
/// cores, when fewer than 4), then [`AUTO`].
fn worker_counts() -> Vec<usize> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let v: Vec<usize> = [4, 8, 14].into_iter().filter(|&w| w <= cores).collect();
    bench::worker_counts(if v.is_empty() { vec![cores] } else { v })
}

/// For an auto row (`w` is [`AUTO`]): untimed epochs of `loader`, for its tuning to settle
/// before the timed ones; their figures. Nothing for a row at a worker count set by hand.
fn settled<S, B>(loader: &Loader<S, B>, w: usize) -> Vec<EpochStats>
where
    S: Source,
    B: Batcher<S::Sample> + 'static,
    B::Batch: ToDevice + 'static,
{
    if w == AUTO {
        settle(loader, |_| Ok(())).expect("the untimed epochs")
    } else {
        Vec::new()
    }
}

/// For an auto row, keeps what the tuning did (`settling`, then the last epoch of `loader`)
/// for the note under its table, as `what`.
fn keep_tuning<S, B>(
    notes: &mut Vec<(String, Tuning)>,
    what: &str,
    w: usize,
    loader: &Loader<S, B>,
    settling: &[EpochStats],
) where
    S: Source,
    B: Batcher<S::Sample> + 'static,
    B::Batch: ToDevice + 'static,
{
    if w == AUTO
        && let Some(last) = loader.stats()
    {
        notes.push((what.to_owned(), Tuning::new(settling, &last)));
    }
}

/// The note under a table with auto rows; `whole_epochs`: its figures are whole epochs (the
/// median of three after one), of which the tuning's figures are the last's.
fn print_notes(notes: &[(String, Tuning)], whole_epochs: bool, rep: &mut Report) {
    if let Some(note) = auto_notes(notes) {
        rep.line(&note);
        if whole_epochs {
            rep.line(
                "\nEach figure is the median of three epochs after one more: the timed epoch \
                 above is the last of them.",
            );
        }
    }
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

/// Batches the fields-only loaders make ahead (`PINNABLE_BENCH_PREFETCH`). Over HTTP the
/// workers share the cores with the runtime's and the server's threads, and a worker put off
/// the CPU holds up every batch after its own; the loader's default of 2 left them idle a
/// third of the time (0.75× the local rate against 0.90× with 8, on an H100 host). Local
/// files read no faster with more.
const PREFETCH: usize = 8;

/// A loader of `tar`'s samples, fields only: batches of [`BATCH`], shuffled with seed 1, `w`
/// workers, [`PREFETCH`] batches ahead; for [`AUTO`], both tuned.
fn fields_loader(tar: &TarShards, w: usize) -> Loader<TarShards, FieldsOnly> {
    Loader::builder(tar.clone())
        .batch_size(BATCH)
        .shuffle(1)
        .workers_prefetch_or_auto(w, env_usize("PINNABLE_BENCH_PREFETCH").unwrap_or(PREFETCH))
        .build(FieldsOnly)
        .expect("a fields-only loader")
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
    let mut notes = Vec::new();
    for &w in &worker_counts() {
        let loader = fields_loader(&tar, w);
        let settling = settled(&loader, w);
        let s = seconds(|| loader.iter().map(|b| b.unwrap().1.numel()).sum(), n);
        keep_tuning(&mut notes, "fields only", w, &loader, &settling);
        local_rates.push((w, n as f64 / s, 0.0));
        rep.line(&format!(
            "| fields only, {} | {:.0} | {:.2} | {:.2}× |",
            workers_label(w),
            n as f64 / s,
            bytes as f64 / s / 1e9,
            cat / s
        ));
    }
    print_notes(&notes, true, &mut rep);

    let decode = decoding();
    if decode {
        rep.line(
            "\n| images decoded (resize 256, crop 224, u8) | images/s | ImageFolder images/s | \
             ratio |",
        );
        rep.line("| --- | --- | --- | --- |");
    }
    let codec = ImageCodec::new(Transform::resized_center_crop(256, 224));
    let mut notes = Vec::new();
    for &w in worker_counts().iter().filter(|_| decode) {
        let ours = Loader::builder(tar.clone())
            .batch_size(BATCH)
            .shuffle(1)
            .workers_or_auto(w)
            .build(TarImageBatcher::new(codec.clone()))
            .unwrap();
        let settling = settled(&ours, w);
        let s = seconds(|| ours.iter().map(|b| b.unwrap().1.numel()).sum(), n);
        keep_tuning(&mut notes, "tar shards", w, &ours, &settling);
        let theirs = Loader::builder(folder.clone())
            .batch_size(BATCH)
            .shuffle(1)
            .workers_or_auto(w)
            .build(ImageBatcher::new(codec.clone()))
            .unwrap();
        let settling = settled(&theirs, w);
        let f = seconds(|| theirs.iter().map(|b| b.unwrap().1.numel()).sum(), n);
        keep_tuning(&mut notes, "ImageFolder", w, &theirs, &settling);
        if let Some(r) = local_rates.iter_mut().find(|r| r.0 == w) {
            r.2 = n as f64 / s;
        }
        rep.line(&format!(
            "| tar shards, {} | {:.0} | {:.0} | {:.2}× |",
            workers_label(w),
            n as f64 / s,
            n as f64 / f,
            f / s
        ));
    }
    print_notes(&notes, true, &mut rep);
    #[cfg(feature = "remote")]
    remote::over_http(&mut rep, &paths, n, bytes, &local_rates);
    #[cfg(not(feature = "remote"))]
    let _ = local_rates;
    rep.save("tar.md");
}
