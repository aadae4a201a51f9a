//! Remote tar shards (feature `remote`) against servers the tests start: a local HTTP server
//! (tests/support/http.rs) serving the same shard files as the local source reads, with its
//! faults, and an S3-compatible server (moto) when one can be started.

use std::path::Path;
use std::time::{Duration, Instant};

use pinnable::Error;
use pinnable::formats::tar::{TarSample, TarShards};
use pinnable::loader::{Collator, Dataset, Loader};
use pinnable::storage::Storage;
use pinnable::{Result, Tensor};
use pinnable_harness::http::{Fault, Server};
use pinnable_harness::rng;
use pinnable_harness::s3::Moto;
use pinnable_harness::tar::{Sample, contents, folder, gzip, random_shards, shard};
use rand::Rng;

/// Settings that fail fast: small chunks (several per shard), short timeouts, few retries.
fn remote() -> Storage {
    Storage::new()
        .chunk_size(64 << 10)
        .read_ahead(2)
        .timeout(Duration::from_secs(5))
        .retries(3)
}

fn labels(samples: Vec<TarSample>, c: &mut Collator) -> Result<Tensor> {
    let y = c.stack_scalars(
        "labels",
        samples
            .iter()
            .map(|s| s.class("cls"))
            .collect::<Result<Vec<_>>>()?,
    )?;
    c.finish()?.take(y)
}

/// One epoch's batches of labels: shuffled, a shuffle buffer, rank 1 of 2.
fn epoch(shards: &TarShards, workers: usize) -> Vec<Vec<i64>> {
    Loader::builder(shards.clone())
        .batch_size(6)
        .shuffle(5)
        .shard(1, 2)
        .workers(workers)
        .build_with(labels)
        .unwrap()
        .run_epoch(3)
        .map(|b| b.unwrap().to_vec::<i64>().unwrap())
        .collect()
}

/// The same pattern over the server: `train-{000..N}.tar` under its root.
fn url_pattern(server: &Server, shards: usize) -> String {
    format!("{}/train-{{000..{:03}}}.tar", server.url(), shards - 1)
}

#[test]
fn http_shards_yield_the_local_samples_in_the_local_order() {
    let mut r = rng("http_shards_yield_the_local_samples_in_the_local_order");
    let dir = folder("http-same");
    let counts: Vec<usize> = (0..r.random_range(2..6))
        .map(|_| r.random_range(20..400))
        .collect();
    let (pattern, _) = random_shards(&dir, &mut r, &counts);
    let server = Server::start(&dir);
    let local = TarShards::open([&pattern]).unwrap().shuffle_buffer(32);
    let over_http = TarShards::open_with(&remote(), [url_pattern(&server, counts.len())])
        .unwrap()
        .shuffle_buffer(32);
    assert_eq!(over_http.len(), local.len());
    for (s, &n) in counts.iter().enumerate() {
        assert_eq!(over_http.shard_len(s), Some(n), "shard {s}");
    }
    assert_eq!(contents(&over_http), contents(&local));
    let want = epoch(&local, 1);
    assert!(!want.is_empty());
    assert_eq!(
        epoch(&over_http, 3),
        want,
        "the local order, with 3 workers"
    );
    // Plain `TarShards::open` takes URLs too.
    let opened = TarShards::open([url_pattern(&server, counts.len())]).unwrap();
    assert_eq!(opened.len(), local.len());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Shards of samples with one large member each (`.bin`, 40 to 120 KiB) and a `.cls`.
fn large_shards(dir: &Path, r: &mut impl Rng, counts: &[usize]) -> (u64, Vec<Vec<Sample>>) {
    let mut total = 0;
    let mut all = Vec::new();
    for (s, &n) in counts.iter().enumerate() {
        let samples: Vec<Sample> = (0..n)
            .map(|i| {
                let len = r.random_range(40 << 10..120 << 10);
                let bin: Vec<u8> = (0..len).map(|_| r.random()).collect();
                let class = r.random_range(0..1000i64).to_string().into_bytes();
                (
                    format!("{s}-{i:04}"),
                    vec![("bin".into(), bin), ("cls".into(), class)],
                )
            })
            .collect();
        let bytes = shard(&samples).0;
        total += bytes.len() as u64;
        std::fs::write(dir.join(format!("train-{s:03}.tar")), bytes).unwrap();
        all.push(samples);
    }
    (total, all)
}

/// Sums of every `.bin` member's bytes and the labels of a batch, in batch order.
fn sums(samples: Vec<TarSample>, c: &mut Collator) -> Result<Tensor> {
    let sums = samples
        .iter()
        .map(|s| {
            s.bytes("bin")
                .map(|b| b.iter().map(|&x| u64::from(x)).sum::<u64>() as i64)
        })
        .collect::<Result<Vec<i64>>>()?;
    let y = c.stack_scalars("sums", sums)?;
    c.finish()?.take(y)
}

#[test]
fn the_index_pass_reads_headers_only_and_every_epoch_reads_each_shard_byte_once() {
    let mut r = rng("the_index_pass_reads_headers_only_and_every_epoch_reads_each_shard_byte_once");
    let dir = folder("http-bytes");
    let counts: Vec<usize> = (0..4).map(|_| r.random_range(20..60)).collect();
    let (total, samples) = large_shards(&dir, &mut r, &counts);
    // The bytes a sample's members hold: an epoch reads at least these.
    let data: u64 = samples
        .iter()
        .flatten()
        .flat_map(|(_, f)| f.iter().map(|(_, b)| b.len() as u64))
        .sum();
    let want: u64 = samples
        .iter()
        .flatten()
        .map(|(_, f)| f[0].1.iter().map(|&x| u64::from(x)).sum::<u64>())
        .sum();
    let server = Server::start(&dir);
    let pattern = url_pattern(&server, counts.len());
    // Settings the old cache re-read under: a shuffle buffer spanning many chunks, a cap on
    // held bytes far under what the buffer holds, several workers.
    for case in 0..3 {
        let chunk = r.random_range(64 << 10..1 << 20);
        let ahead = r.random_range(0..6);
        let cap = r.random_range(0..4 << 20);
        let buffer = r.random_range(1..80);
        let workers = r.random_range(1..5);
        let before = server.served();
        let shards = TarShards::open_with(
            &remote()
                .chunk_size(chunk)
                .read_ahead(ahead)
                .cache_bytes(cap),
            [&pattern],
        )
        .unwrap()
        .shuffle_buffer(buffer);
        let indexed = server.served() - before;
        // One 4 KiB window a sample, against 40 to 120 KiB of member data.
        assert!(
            (indexed as f64) < 0.15 * total as f64,
            "the index pass read {indexed} of {total} bytes"
        );
        let loader = Loader::builder(shards)
            .batch_size(r.random_range(1..9))
            .shuffle(r.random())
            .workers(workers)
            .build_with(sums)
            .unwrap();
        let settings = format!(
            "case {case}: {chunk} B chunks, {ahead} ahead, {cap} B cap, buffer {buffer}, \
             {workers} workers"
        );
        for epoch in 0..2 {
            let before = server.served();
            let got: i64 = loader
                .iter()
                .flat_map(|b| b.unwrap().to_vec::<i64>().unwrap())
                .sum();
            assert_eq!(
                got as u64, want,
                "every byte of every .bin, epoch {epoch}, {settings}"
            );
            let read = server.served() - before;
            assert!(
                read >= data && read as f64 <= 1.05 * total as f64,
                "epoch {epoch} read {read} bytes of shards of {total} ({data} of members), \
                 {settings}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn any_chunks_read_ahead_cap_and_buffer_give_the_local_samples_in_the_local_order() {
    let mut r = rng("any_chunks_read_ahead_cap_and_buffer_give_the_local_samples");
    let dir = folder("http-property");
    let counts: Vec<usize> = (0..r.random_range(2..6))
        .map(|_| r.random_range(5..90))
        .collect();
    let (_, _) = large_shards(&dir, &mut r, &counts);
    let pattern = format!(
        "{}/train-{{000..{:03}}}.tar",
        dir.display(),
        counts.len() - 1
    );
    let local = TarShards::open([&pattern]).unwrap();
    let server = Server::start(&dir);
    let over_http = url_pattern(&server, counts.len());
    let started = Instant::now();
    for case in 0..6 {
        let chunk = r.random_range(1..40) << 15;
        let ahead = r.random_range(0..8);
        let cap = r.random_range(0..8 << 20);
        let buffer = r.random_range(1..300);
        let world = r.random_range(1..4);
        let rank = r.random_range(0..world);
        let (batch, seed, epoch) = (r.random_range(1..12), r.random(), r.random_range(0..5));
        let workers = r.random_range(1..5);
        let settings = format!(
            "case {case}: {chunk} B chunks, {ahead} ahead, {cap} B cap, buffer {buffer}, rank \
             {rank} of {world}, batch {batch}, seed {seed}, epoch {epoch}, {workers} workers"
        );
        let run = |shards: TarShards, workers| -> Vec<Vec<i64>> {
            Loader::builder(shards.shuffle_buffer(buffer))
                .batch_size(batch)
                .shuffle(seed)
                .shard(rank, world)
                .workers(workers)
                .build_with(sums)
                .unwrap()
                .run_epoch(epoch)
                .map(|b| b.unwrap().to_vec::<i64>().unwrap())
                .collect()
        };
        let remote = TarShards::open_with(
            &remote()
                .chunk_size(chunk)
                .read_ahead(ahead)
                .cache_bytes(cap),
            [&over_http],
        )
        .unwrap();
        let want = run(local.clone(), 1);
        assert!(!want.is_empty(), "{settings}");
        assert_eq!(run(remote, workers), want, "{settings}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "six cases took {:?}",
        started.elapsed()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_connection_dropped_midway_is_resumed_where_it_stopped() {
    let mut r = rng("a_connection_dropped_midway_is_resumed");
    let dir = folder("http-drop");
    let counts: Vec<usize> = (0..3).map(|_| r.random_range(200..500)).collect();
    let (pattern, _) = random_shards(&dir, &mut r, &counts);
    let server = Server::start(&dir);
    let local = TarShards::open([&pattern]).unwrap();
    let over_http = TarShards::open_with(&remote(), [url_pattern(&server, 3)]).unwrap();
    // Dropped during the epoch's reads (the index pass is over).
    let victim = format!("train-{:03}.tar", r.random_range(0..3));
    server.fault(&victim, Fault::DropOnce);
    let before = server.log().len();
    assert_eq!(contents(&over_http), contents(&local));
    // A request after the drop asked for the rest of a range, not all of it again.
    let gets: Vec<(u64, u64)> = server.log()[before..]
        .iter()
        .filter(|l| l.path == victim && l.method == "GET")
        .filter_map(|l| l.range)
        .collect();
    let resumed = gets
        .iter()
        .any(|a| gets.iter().any(|b| b.0 > a.0 && b.0 < a.1 && b.1 == a.1));
    assert!(
        resumed,
        "no request resumed inside the dropped range: {gets:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_or_refused_shard_is_an_error_naming_its_url_and_a_500_is_retried() {
    let mut r = rng("a_missing_or_refused_shard");
    let dir = folder("http-404");
    let counts: Vec<usize> = (0..4).map(|_| r.random_range(5..30)).collect();
    let (_, _) = random_shards(&dir, &mut r, &counts);
    let server = Server::start(&dir);
    let s = r.random_range(0..4);
    let name = format!("train-{s:03}.tar");
    let url = format!("{}/{name}", server.url());
    for (fault, code) in [(Fault::NotFound, "404"), (Fault::Forbidden, "403")] {
        server.fault(&name, fault);
        let started = Instant::now();
        let err = TarShards::open_with(&remote(), [url_pattern(&server, 4)]).unwrap_err();
        match &err {
            Error::Tar { shard, .. } => assert_eq!(shard, &url),
            other => panic!("not a tar error: {other}"),
        }
        assert!(err.to_string().contains(code), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5), "not retried");
    }
    // A 500, then a good answer: opened as if nothing happened.
    server.fault(&name, Fault::ErrorOnce);
    let shards = TarShards::open_with(&remote(), [url_pattern(&server, 4)]).unwrap();
    assert_eq!(shards.shard_len(s), Some(counts[s]));
    assert!(server.log().iter().any(|l| l.status == 500));
    // A shard that exists on no server: its URL named.
    let missing = format!("{}/nothing-here.tar", server.url());
    let err = TarShards::open_with(&remote(), [&missing]).unwrap_err();
    assert!(err.to_string().contains(&missing), "{err}");
    // A glob needs a listing, which a web server does not give.
    let err =
        TarShards::open_with(&remote(), [format!("{}/train-*.tar", server.url())]).unwrap_err();
    assert!(err.to_string().contains("brace range"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn resume_over_http_continues_the_run_and_other_shards_are_refused() {
    let mut r = rng("resume_over_http_continues_the_run");
    let dir = folder("http-resume");
    let counts: Vec<usize> = (0..4).map(|_| r.random_range(10..60)).collect();
    let (_, _) = random_shards(&dir, &mut r, &counts);
    let server = Server::start(&dir);
    let shards = TarShards::open_with(&remote(), [url_pattern(&server, 4)])
        .unwrap()
        .shuffle_buffer(12);
    let build = |shards: &TarShards, workers| {
        Loader::builder(shards.clone())
            .batch_size(4)
            .shuffle(8)
            .workers(workers)
    };
    let loader = build(&shards, 3).build_with(labels).unwrap();
    loader.set_epoch(2);
    let all: Vec<Vec<i64>> = loader
        .iter()
        .map(|b| b.unwrap().to_vec::<i64>().unwrap())
        .collect();
    let stop = r.random_range(0..all.len());
    loader.set_epoch(2);
    let mut epoch = loader.iter();
    for _ in 0..stop {
        epoch.next().unwrap().unwrap();
    }
    let saved = epoch.position().to_string();
    drop(epoch);
    let rest: Vec<Vec<i64>> = build(&shards, 1)
        .resume(saved.parse().unwrap())
        .build_with(labels)
        .unwrap()
        .iter()
        .map(|b| b.unwrap().to_vec::<i64>().unwrap())
        .collect();
    assert_eq!(rest, all[stop..], "stopped after {stop} batches");
    // The same number of samples in other shards: the list is listed in another order.
    let reordered = TarShards::open_with(
        &remote(),
        [format!("{}/train-{{003..000}}.tar", server.url())],
    )
    .unwrap()
    .shuffle_buffer(12);
    assert_eq!(reordered.len(), shards.len());
    let err = build(&reordered, 1)
        .resume(saved.parse().unwrap())
        .build_with(labels)
        .unwrap_err();
    assert!(
        matches!(&err, Error::Resume { setting, .. } if setting.contains("shard-list")),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_resumed_epoch_reads_again_little_before_its_position() {
    let mut r = rng("a_resumed_epoch_reads_again_little_before_its_position");
    let dir = folder("http-resume-bytes");
    let counts: Vec<usize> = (0..4).map(|_| r.random_range(1000..1200)).collect();
    let n: usize = counts.iter().sum();
    let (_, _) = random_shards(&dir, &mut r, &counts);
    let total: u64 = (0..4)
        .map(|s| {
            std::fs::metadata(dir.join(format!("train-{s:03}.tar")))
                .unwrap()
                .len()
        })
        .sum();
    let server = Server::start(&dir);
    let (chunk, buffer, batch) = (64 << 10, 64, 50);
    let shards = TarShards::open_with(&remote().chunk_size(chunk), [url_pattern(&server, 4)])
        .unwrap()
        .shuffle_buffer(buffer);
    let seed = r.random();
    let build = |workers| {
        Loader::builder(shards.clone())
            .batch_size(batch)
            .shuffle(seed)
            .workers(workers)
    };
    let loader = build(2).build_with(labels).unwrap();
    let all: Vec<Vec<i64>> = loader
        .run_epoch(1)
        .map(|b| b.unwrap().to_vec::<i64>().unwrap())
        .collect();
    let stop = all.len() * 4 / 5 + r.random_range(0..all.len() / 10);
    let mut epoch = loader.run_epoch(1);
    for _ in 0..stop {
        epoch.next().unwrap().unwrap();
    }
    let saved = epoch.position().to_string();
    drop(epoch);
    let before = server.served();
    let rest: Vec<Vec<i64>> = build(3)
        .resume(saved.parse().unwrap())
        .build_with(labels)
        .unwrap()
        .iter()
        .map(|b| b.unwrap().to_vec::<i64>().unwrap())
        .collect();
    assert_eq!(rest, all[stop..], "stopped after {stop} batches");
    let read = server.served() - before;
    // The samples after the position, the 1024 before it and the buffer's, a third over for
    // uneven samples, and the chunks read ahead: well under the whole epoch.
    let left = n - stop * batch;
    let bound = (left + 1024 + buffer) as f64 / n as f64 * total as f64 * 1.3 + 4.0 * chunk as f64;
    assert!(bound < 0.8 * total as f64, "a bound that cannot fail");
    assert!(
        (read as f64) < bound,
        "the resumed epoch read {read} of {total} bytes ({left} of {n} samples left)"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn s3_shards_through_an_s3_compatible_server() {
    let Some(mut moto) = Moto::start_or_skip("s3_shards_through_an_s3_compatible_server") else {
        return;
    };
    let mut r = rng("s3_shards_through_an_s3_compatible_server");
    let dir = folder("s3");
    let counts: Vec<usize> = (0..3).map(|_| r.random_range(20..200)).collect();
    let (pattern, _) = random_shards(&dir, &mut r, &counts);
    assert_eq!(moto.request("PUT", "/shards", &[]).unwrap(), 200);
    for s in 0..3 {
        let bytes = std::fs::read(dir.join(format!("train-{s:03}.tar"))).unwrap();
        let status = moto
            .request("PUT", &format!("/shards/data/train-{s:03}.tar"), &bytes)
            .unwrap();
        assert_eq!(status, 200);
    }
    let s3 = |patterns: &[&str]| {
        TarShards::open_with(
            &remote()
                .option("aws_endpoint", format!("http://127.0.0.1:{}", moto.port))
                .option("aws_allow_http", "true")
                .option("aws_access_key_id", "test")
                .option("aws_secret_access_key", "test")
                .option("aws_region", "us-east-1"),
            patterns,
        )
    };
    let local = TarShards::open([&pattern]).unwrap().shuffle_buffer(32);
    let braces = s3(&["s3://shards/data/train-{000..002}.tar"])
        .unwrap()
        .shuffle_buffer(32);
    assert_eq!(contents(&braces), contents(&local));
    assert_eq!(epoch(&braces, 2), epoch(&local, 1));
    // A glob, through the bucket's listing: the same shards in the same order.
    let globbed = s3(&["s3://shards/data/train-*.tar"]).unwrap();
    let names: Vec<&str> = globbed.shard_names().collect();
    assert_eq!(
        names,
        (0..3)
            .map(|s| format!("s3://shards/data/train-{s:03}.tar"))
            .collect::<Vec<_>>()
    );
    assert_eq!(contents(&globbed), contents(&local));
    let err = s3(&["s3://shards/data/train-009.tar"]).unwrap_err();
    assert!(
        err.to_string().contains("s3://shards/data/train-009.tar")
            && err.to_string().contains("404"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Over HTTP as from files: gzip-compressed shards (told by their bytes) read sample for
/// sample equal to their plain tar, in the plain order, the compressed bytes read once an
/// epoch; a damaged shard gives the samples before the damage, then the same error.
#[test]
fn gzip_and_damaged_shards_over_http_read_as_the_local_files() {
    let mut r = rng("gzip_and_damaged_shards_over_http_read_as_the_local_files");
    let dir = folder("http-gzip");
    let counts: Vec<usize> = (0..r.random_range(2..5))
        .map(|_| r.random_range(5..120))
        .collect();
    let (pattern, all) = random_shards(&dir, &mut r, &counts);
    let mut compressed = 0;
    for s in 0..counts.len() {
        let bytes = std::fs::read(dir.join(format!("train-{s:03}.tar"))).unwrap();
        let gz = gzip(&bytes, r.random_range(1..=9));
        compressed += gz.len() as u64;
        std::fs::write(dir.join(format!("gz-{s:03}.tar.gz")), gz).unwrap();
    }
    let server = Server::start(&dir);
    let local = TarShards::open([&pattern]).unwrap().shuffle_buffer(32);
    let url = format!(
        "{}/gz-{{000..{:03}}}.tar.gz",
        server.url(),
        counts.len() - 1
    );
    let before = server.served();
    let over_http = TarShards::open_with(&remote(), [url])
        .unwrap()
        .shuffle_buffer(32);
    // Once each, and the first window (4 KiB) that tells gzip from plain.
    let indexed = server.served() - before;
    let bound = compressed + 4096 * counts.len() as u64;
    assert!(
        indexed <= bound,
        "the index pass read {indexed} of {compressed} bytes"
    );
    assert_eq!(contents(&over_http), contents(&local));
    let want = epoch(&local, 1);
    let before = server.served();
    assert_eq!(
        epoch(&over_http, 3),
        want,
        "the local order, with 3 workers"
    );
    let read = server.served() - before;
    assert!(
        read <= compressed,
        "an epoch read {read} bytes of {compressed}"
    );
    // A header spoiled after a whole sample: the samples before it, then the damage.
    let samples = &all[0];
    let (mut bytes, starts) = shard(samples);
    let bad = r
        .random_range(1..samples.len().max(2))
        .min(samples.len() - 1);
    bytes[starts[bad] as usize + 3] ^= 0x55;
    std::fs::write(dir.join("damaged.tar"), bytes).unwrap();
    let local = TarShards::open([dir.join("damaged.tar").to_str().unwrap()]).unwrap();
    let over_http =
        TarShards::open_with(&remote(), [format!("{}/damaged.tar", server.url())]).unwrap();
    assert_eq!(over_http.len(), local.len());
    let until_error = |shards: &TarShards| -> (usize, String) {
        let n = (0..shards.len())
            .take_while(|&i| shards.get(i).is_ok())
            .count();
        let Err(Error::Tar {
            offset, problem, ..
        }) = shards.get(n)
        else {
            panic!("no damage at {n}")
        };
        (n, format!("{offset}: {problem}"))
    };
    assert_eq!(until_error(&over_http), until_error(&local));
    assert_eq!(until_error(&local).0, bad);
    std::fs::remove_dir_all(&dir).unwrap();
}
