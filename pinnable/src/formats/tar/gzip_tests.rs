//! Compressed shards through the loader: each epoch decompresses every shard once, in order,
//! whatever the workers, the shuffle buffer and the batch size, and the samples are the
//! plain shards'.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{ByteSource, TarSample, TarShards};
use crate::loader::{Dataset, Loader, SplitMix64};

fn member(out: &mut Vec<u8>, name: &str, data: &[u8]) {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[124..136].copy_from_slice(format!("{:011o}\0", data.len()).as_bytes());
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out.resize(out.len().next_multiple_of(512), 0);
}

fn gzipped(bytes: &[u8], level: u32) -> Vec<u8> {
    let mut out = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
    out.write_all(bytes).expect("compress in memory");
    out.finish().expect("compress in memory")
}

/// Shards of `counts[s]` samples (a `.bin` of random bytes, a `.cls`), plain and compressed.
fn shards(r: &mut SplitMix64, counts: &[usize]) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let plain: Vec<Vec<u8>> = counts
        .iter()
        .enumerate()
        .map(|(s, &n)| {
            let mut tar = Vec::new();
            for i in 0..n {
                let bin: Vec<u8> = (0..r.below(3000)).map(|_| r.next_u64() as u8).collect();
                member(&mut tar, &format!("{s}/{i:04}.bin"), &bin);
                member(
                    &mut tar,
                    &format!("{s}/{i:04}.cls"),
                    i.to_string().as_bytes(),
                );
            }
            tar.resize(tar.len() + 1024, 0);
            tar
        })
        .collect();
    let compressed = plain
        .iter()
        .map(|t| gzipped(t, 1 + r.below(9) as u32))
        .collect();
    (plain, compressed)
}

fn open(shards: &[Vec<u8>]) -> TarShards {
    TarShards::from_shards(shards.iter().enumerate().map(|(s, b)| {
        (
            format!("s{s}.tar"),
            Arc::new(b.clone()) as Arc<dyn ByteSource>,
        )
    }))
    .expect("shards")
}

/// The sums of each sample's `.bin` bytes and its label, in batch order.
fn epoch(shards: &TarShards, workers: usize, epoch: u64) -> Vec<i64> {
    Loader::builder(shards.clone())
        .batch_size(3)
        .shuffle(11)
        .workers(workers)
        .build_with(|samples: Vec<TarSample>, c| {
            let mut rows = Vec::new();
            for s in &samples {
                rows.push(s.bytes("bin")?.iter().map(|&b| i64::from(b)).sum());
                rows.push(s.class("cls")?);
            }
            let y = c.stack_scalars("rows", rows)?;
            c.finish()?.take(y)
        })
        .expect("a loader")
        .run_epoch(epoch)
        .flat_map(|b| b.expect("a batch").to_vec::<i64>().expect("i64"))
        .collect()
}

/// How many times each of the first `shards` compressed shards began decompressing.
fn starts(gz: &TarShards, shards: usize) -> Vec<usize> {
    let z = gz.index.gzip.as_ref().expect("compressed shards");
    (0..shards)
        .map(|s| {
            z.decoder(s)
                .expect("compressed")
                .starts
                .load(Ordering::Relaxed)
        })
        .collect()
}

#[test]
fn each_epoch_decompresses_every_shard_once_and_reads_the_plain_samples() {
    let mut r = SplitMix64::for_test("each_epoch_decompresses_every_shard_once");
    let counts: Vec<usize> = (0..2 + r.below(4))
        .map(|_| 1 + r.below(60) as usize)
        .collect();
    let (plain, compressed) = shards(&mut r, &counts);
    let buffer = 1 + r.below(40) as usize;
    let plain = open(&plain).shuffle_buffer(buffer);
    let gz = open(&compressed).shuffle_buffer(buffer);
    assert_eq!(gz.len(), plain.len());
    let starts = |gz: &TarShards| starts(gz, counts.len());
    assert_eq!(
        starts(&gz),
        vec![1; counts.len()],
        "the index pass: once each"
    );
    for (e, workers) in [(0, 1), (1, 4), (2, 2)] {
        let want = epoch(&plain, 1, e);
        assert_eq!(epoch(&gz, workers, e), want, "epoch {e}, {workers} workers");
        assert_eq!(starts(&gz), vec![2 + e as usize; counts.len()], "epoch {e}");
    }
    // Nothing is held once the epoch is taken.
    let z = gz.index.gzip.as_ref().expect("compressed shards");
    assert_eq!(z.held(), 0);
    // By hand, in order: the decoder goes forward (one more start for each shard).
    for i in 0..gz.len() {
        let (a, b) = (plain.get(i).expect("plain"), gz.get(i).expect("gz"));
        assert_eq!(a.bytes("bin").expect("plain"), b.bytes("bin").expect("gz"));
    }
    assert_eq!(starts(&gz), vec![5; counts.len()]);
}

#[test]
fn a_resumed_epoch_holds_few_samples_before_its_position() {
    let mut r = SplitMix64::for_test("a_resumed_epoch_holds_few_samples_before_its_position");
    let n = 2600 + r.below(400) as usize;
    let mut tar = Vec::new();
    for i in 0..n {
        member(&mut tar, &format!("{i:05}.cls"), i.to_string().as_bytes());
    }
    let shards = open(&[gzipped(&tar, 1)]).shuffle_buffer(1);
    let build = || Loader::builder(shards.clone()).batch_size(50).workers(2);
    let labels = |samples: Vec<TarSample>, c: &mut crate::loader::Collator| {
        let y = samples
            .iter()
            .map(|s| s.class("cls"))
            .collect::<crate::Result<Vec<_>>>()?;
        let y = c.stack_scalars("y", y)?;
        c.finish()?.take(y)
    };
    let loader = build().build_with(labels).expect("a loader");
    let stop = 48 + r.below(4) as usize;
    let mut epoch = loader.iter();
    for _ in 0..stop {
        epoch.next().expect("a batch").expect("a batch");
    }
    let saved = epoch.position();
    drop(epoch);
    let resumed = build().resume(saved).build_with(labels).expect("a loader");
    let mut epoch = resumed.iter();
    let first = epoch.next().expect("a batch").expect("a batch");
    let want: Vec<i64> = (stop * 50..stop * 50 + 50).map(|i| i as i64).collect();
    assert_eq!(first.to_vec::<i64>().expect("i64"), want);
    let z = shards.index.gzip.as_ref().expect("compressed");
    // The samples before the position that a late first batch could still want, and those
    // of the batches made ahead: not the 2400 and more before it.
    let held = z.held();
    assert!(held <= 1024 + 200, "{held} samples held");
    let rest: Vec<i64> = epoch
        .flat_map(|b| b.expect("a batch").to_vec::<i64>().expect("i64"))
        .collect();
    assert_eq!(rest.len(), n - (stop + 1) * 50);
    // Those before the position stay held until the next epoch's plan.
    assert!(z.held() <= 1024, "{} samples held", z.held());
}

/// Loaders built per device share the shards, each rank with its own run and decoders: run
/// at once, each gives the plain shards' batches, and a shard is decompressed once by the index
/// pass and once by each rank's run (twice by the run that wraps to the epoch's start to give
/// every rank as many samples), not again and again as the ranks' reads interleave.
#[test]
fn loaders_per_device_stream_their_own_runs_at_once() {
    let mut r = SplitMix64::for_test("loaders_per_device_stream_their_own_runs_at_once");
    let counts: Vec<usize> = (0..1 + r.below(4))
        .map(|_| 20 + r.below(80) as usize)
        .collect();
    let (plain, compressed) = shards(&mut r, &counts);
    let run = |shards: TarShards| -> Vec<Vec<i64>> {
        let devices = [crate::Device::cpu(), crate::Device::cpu()];
        let loaders = Loader::builder(shards.shuffle_buffer(8))
            .batch_size(4)
            .shuffle(3)
            .workers(2)
            .build_per_device(
                &devices,
                |samples: Vec<TarSample>, c: &mut crate::loader::Collator| {
                    let y = samples
                        .iter()
                        .map(|s| s.class("cls"))
                        .collect::<crate::Result<Vec<_>>>()?;
                    let y = c.stack_scalars("y", y)?;
                    c.finish()?.take(y)
                },
            )
            .expect("loaders");
        std::thread::scope(|scope| {
            let epochs: Vec<_> = loaders
                .iter()
                .map(|l| {
                    scope.spawn(move || {
                        l.iter()
                            .flat_map(|b| b.expect("a batch").to_vec::<i64>().expect("i64"))
                            .collect::<Vec<i64>>()
                    })
                })
                .collect();
            epochs
                .into_iter()
                .map(|e| e.join().expect("an epoch"))
                .collect()
        })
    };
    let want = run(open(&plain));
    let gz = open(&compressed);
    assert_eq!(run(gz.clone()), want);
    let z = gz.index.gzip.as_ref().expect("compressed");
    for s in 0..counts.len() {
        let starts = z
            .decoder(s)
            .expect("compressed")
            .starts
            .load(Ordering::Relaxed);
        assert!(starts <= 4, "shard {s} decompressed {starts} times");
    }
}

/// A rank's run repeats samples from the start of the epoch's order when the ranks' counts
/// would differ (an odd total over two ranks): a repeated sample is decompressed once and
/// handed to each take, so no shard is decompressed twice in an epoch.
#[test]
fn a_rank_whose_run_repeats_a_sample_decompresses_each_shard_once() {
    let mut r = SplitMix64::for_test("a_rank_whose_run_repeats_a_sample");
    // Several settings: a repeat that needs no second decode passes either way.
    for _round in 0..8 {
        let mut counts: Vec<usize> = (0..2 + r.below(3))
            .map(|_| 1 + r.below(40) as usize)
            .collect();
        if counts.iter().sum::<usize>() % 2 == 0 {
            counts[0] += 1; // an odd total: one rank's run repeats a sample
        }
        let (plain, compressed) = shards(&mut r, &counts);
        let buffer = 1 + r.below(16) as usize;
        let plain = open(&plain).shuffle_buffer(buffer);
        let gz = open(&compressed).shuffle_buffer(buffer);
        let z = gz.index.gzip.as_ref().expect("compressed shards");
        let starts = || starts(&gz, counts.len());
        let ranked = |shards: &TarShards, rank: usize, workers: usize| -> Vec<i64> {
            Loader::builder(shards.clone())
                .batch_size(2)
                .shuffle(3)
                .shard(rank, 2)
                .workers(workers)
                .build_with(|samples: Vec<TarSample>, c| {
                    let rows: Vec<i64> = samples
                        .iter()
                        .map(|s| Ok(s.bytes("bin")?.iter().map(|&b| i64::from(b)).sum()))
                        .collect::<crate::Result<_>>()?;
                    let y = c.stack_scalars("rows", rows)?;
                    c.finish()?.take(y)
                })
                .expect("a loader")
                .run_epoch(0)
                .flat_map(|b| b.expect("a batch").to_vec::<i64>().expect("i64"))
                .collect()
        };
        for rank in 0..2 {
            let before = starts();
            let workers = 1 + r.below(3) as usize;
            assert_eq!(
                ranked(&gz, rank, workers),
                ranked(&plain, rank, 1),
                "rank {rank}"
            );
            let after = starts();
            for (s, (b, a)) in before.iter().zip(&after).enumerate() {
                assert!(
                    a - b <= 1,
                    "rank {rank}: shard {s} decompressed {} times",
                    a - b
                );
            }
        }
        assert_eq!(z.held(), 0, "nothing held once both epochs are taken");
    }
}
