//! Resuming, on the host: a run stopped at a random batch of a random epoch and resumed from its
//! position, with other worker counts and prefetch depths, delivers byte for byte what the
//! uninterrupted run delivers — for a dataset of samples, token windows and a seekable stream;
//! positions from other settings are refused, naming the setting; resuming costs the same at
//! batch 10 and at batch 10⁶.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use pinnable::formats::tokens::{TokenShards, TokenWindows};
use pinnable::loader::{FnDataset, IterSource, Loader, Position, Stack};
use pinnable::{DType, Device, Error, Tensor};
use pinnable_harness::samples::{collate, random_samples};
use pinnable_harness::tokens::{TempDir, random_tokens, shard_file, write};
use pinnable_harness::{bytes_of, random_tensor, rng};
use rand::Rng;
use rand::rngs::SmallRng;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const WORKERS: [usize; 3] = [1, 4, 8];
const EPOCHS: u64 = 3;

/// A batch as bytes.
type Bytes = Vec<Vec<u8>>;

/// Through its own bytes or string form, at random: what a checkpoint stores.
fn stored(r: &mut SmallRng, p: Position) -> Position {
    if r.random_bool(0.5) {
        Position::from_bytes(&p.to_bytes()).unwrap()
    } else {
        p.to_string().parse().unwrap()
    }
}

/// Runs `loader` (epochs from its next one to `EPOCHS`) through `bytes`; stops after `stop`
/// batches when given, returning the position there (or at the end).
macro_rules! run {
    ($loader:expr, $bytes:expr, $stop:expr, $out:expr) => {{
        let loader = &$loader;
        let stop: Option<usize> = $stop;
        let mut taken = 0;
        'run: while loader.next_epoch() < EPOCHS {
            let mut epoch = loader.iter();
            loop {
                if stop == Some(taken) {
                    // Batches made ahead are in flight here; they do not count.
                    let p = epoch.position();
                    assert_eq!(p, loader.position());
                    break 'run;
                }
                match epoch.next() {
                    Some(b) => {
                        $out.push($bytes(b.unwrap()));
                        taken += 1;
                    }
                    None => break,
                }
            }
        }
        loader.position()
    }};
}

#[test]
fn a_dataset_loader_resumes_byte_for_byte_with_1_4_and_8_workers() {
    let _s = serial();
    let mut r = rng("a_dataset_loader_resumes_byte_for_byte_with_1_4_and_8_workers");
    let n = r.random_range(40..120);
    let samples = random_samples(&mut r, n, (3, 4), 6);
    let batch_size = r.random_range(2..9);
    let seed = r.random();
    let drop_last = r.random_bool(0.5);
    let build = |workers: usize, prefetch: usize| {
        Loader::builder(samples.clone())
            .batch_size(batch_size)
            .shuffle(seed)
            .drop_last(drop_last)
            .workers(workers)
            .prefetch(prefetch)
    };
    let bytes = |b: Vec<Tensor>| -> Bytes { b.iter().map(bytes_of).collect() };
    let mut whole = Vec::new();
    let end = run!(build(4, 2).build(collate).unwrap(), bytes, None, whole);
    assert_eq!(end.epoch(), EPOCHS);
    let per_epoch = whole.len() / EPOCHS as usize;
    for before in WORKERS {
        for after in WORKERS {
            // A random batch of a random epoch (its first and its last included).
            let stop = r.random_range(0..=whole.len());
            let mut got = Vec::new();
            let first = build(before, r.random_range(0..5)).build(collate).unwrap();
            let p = run!(first, bytes, Some(stop), got);
            assert_eq!(
                (p.epoch() as usize, p.batch() as usize),
                (stop / per_epoch, stop % per_epoch),
                "{p}"
            );
            drop(first);
            let p = stored(&mut r, p);
            let second = build(after, r.random_range(0..5))
                .resume(p)
                .build(collate)
                .unwrap();
            assert_eq!(second.position(), p);
            run!(second, bytes, None, got);
            assert!(
                got == whole,
                "{before} then {after} workers, stopped at {p}"
            );
        }
    }
}

fn token_shards(r: &mut SmallRng, dir: &TempDir, context: usize) -> Arc<TokenShards> {
    let paths: Vec<_> = (0..3)
        .map(|i| {
            let n = r.random_range(context * 4..context * 30);
            let t = random_tokens(r, n, 50257);
            write(
                dir.path(),
                &format!("{i}.bin"),
                &shard_file(pinnable::formats::tokens::ShardFormat::LlmC, DType::U16, &t),
            )
        })
        .collect();
    Arc::new(TokenShards::open(&paths).unwrap())
}

#[test]
fn a_token_loader_resumes_byte_for_byte_with_1_4_and_8_workers() {
    let _s = serial();
    let mut r = rng("a_token_loader_resumes_byte_for_byte_with_1_4_and_8_workers");
    let dir = TempDir::new("resume-tokens");
    let context = r.random_range(4..33);
    let shards = token_shards(&mut r, &dir, context);
    let batch_size = r.random_range(1..6);
    let seed = r.random();
    let (rank, world) = {
        let world = r.random_range(1..4);
        (r.random_range(0..world), world)
    };
    let build = |workers: usize, prefetch: usize| {
        Loader::builder(TokenWindows::new(shards.clone(), context).unwrap())
            .batch_size(batch_size)
            .shuffle(seed)
            .drop_last(true)
            .shard(rank, world)
            .workers(workers)
            .prefetch(prefetch)
    };
    let batcher = TokenWindows::new(shards.clone(), context)
        .unwrap()
        .batcher(DType::I64)
        .unwrap();
    let bytes = |b: pinnable::formats::tokens::TokenBatch| -> Bytes {
        vec![
            bytes_of(&b.x.tensor().unwrap()),
            bytes_of(&b.y.tensor().unwrap()),
        ]
    };
    let mut whole = Vec::new();
    run!(
        build(4, 2).build(batcher.clone()).unwrap(),
        bytes,
        None,
        whole
    );
    for before in WORKERS {
        for after in WORKERS {
            let stop = r.random_range(0..=whole.len());
            let mut got = Vec::new();
            let first = build(before, r.random_range(0..5))
                .build(batcher.clone())
                .unwrap();
            let p = stored(&mut r, run!(first, bytes, Some(stop), got));
            let second = build(after, r.random_range(0..5))
                .resume(p)
                .build(batcher.clone())
                .unwrap();
            run!(second, bytes, None, got);
            assert!(
                got == whole,
                "{before} then {after} workers, stopped at {p}"
            );
        }
    }
}

/// A stream of random tensors, the same every time for an epoch, that can start anywhere.
fn stream_items(seed: u64, epoch: u64, len: usize) -> Vec<Tensor> {
    let mut r = <SmallRng as rand::SeedableRng>::seed_from_u64(seed ^ epoch);
    (0..len)
        .map(|_| random_tensor(&mut r, DType::U16, &[3]))
        .collect()
}

#[test]
fn a_seekable_stream_resumes_byte_for_byte_and_an_unseekable_one_refuses() {
    let _s = serial();
    let mut r = rng("a_seekable_stream_resumes_byte_for_byte_and_an_unseekable_one_refuses");
    let (seed, len) = (r.random::<u64>(), r.random_range(30..90));
    let batch_size = r.random_range(1..6);
    let (rank, world) = {
        let world = r.random_range(1..4);
        (r.random_range(0..world), world)
    };
    let drop_last = r.random_bool(0.5);
    let opened = Arc::new(AtomicUsize::new(0));
    let read = opened.clone();
    let source = move || {
        let read = read.clone();
        IterSource::new(move |e| stream_items(seed, e, len).into_iter().map(Ok)).seekable(
            move |e, item| {
                read.fetch_add(1, Ordering::Relaxed);
                // Only the items from `item` on are made: nothing before is read.
                stream_items(seed, e, len)
                    .into_iter()
                    .skip(item as usize)
                    .map(Ok)
            },
        )
    };
    let build = |workers: usize| {
        Loader::builder(source())
            .batch_size(batch_size)
            .drop_last(drop_last)
            .shard(rank, world)
            .workers(workers)
    };
    let bytes = |b: Tensor| -> Bytes { vec![bytes_of(&b)] };
    let mut whole = Vec::new();
    run!(build(4).build(Stack).unwrap(), bytes, None, whole);
    for before in WORKERS {
        for after in WORKERS {
            let stop = r.random_range(0..=whole.len());
            let mut got = Vec::new();
            let p = run!(build(before).build(Stack).unwrap(), bytes, Some(stop), got);
            assert_eq!(p.samples(), None);
            let p = stored(&mut r, p);
            let second = build(after).resume(p).build(Stack).unwrap();
            run!(second, bytes, None, got);
            assert!(
                got == whole,
                "{before} then {after} workers, stopped at {p}"
            );
        }
    }
    assert!(
        opened.load(Ordering::Relaxed) > 0,
        "resumed streams were sought"
    );
    // Without a way to seek: refused mid-epoch, accepted at the start of an epoch.
    let plain = || IterSource::new(move |e| stream_items(seed, e, len).into_iter().map(Ok));
    let mid = Loader::builder(plain())
        .batch_size(batch_size)
        .build(Stack)
        .unwrap()
        .position();
    let mid: Position = mid
        .to_string()
        .replace("batch=0", "batch=1")
        .parse()
        .unwrap();
    let e = Loader::builder(plain())
        .batch_size(batch_size)
        .resume(mid)
        .build(Stack)
        .unwrap_err();
    assert!(
        matches!(&e, Error::Config { setting: "resume", problem } if problem.contains("seekable")),
        "{e}"
    );
    let start: Position = mid
        .to_string()
        .replace("epoch=0 batch=1", "epoch=2 batch=0")
        .parse()
        .unwrap();
    let l = Loader::builder(plain())
        .batch_size(batch_size)
        .resume(start)
        .build(Stack)
        .unwrap();
    assert_eq!(l.next_epoch(), 2);
    assert_eq!(l.iter().count(), len.div_ceil(batch_size));
}

/// The setting a refused position names.
fn refused(e: Error) -> &'static str {
    match e {
        Error::Resume { setting, .. } => {
            assert!(e.to_string().contains(setting));
            setting
        }
        other => panic!("not a refusal: {other}"),
    }
}

#[test]
fn positions_from_other_settings_are_refused_naming_the_setting() {
    let _s = serial();
    let mut r = rng("positions_from_other_settings_are_refused_naming_the_setting");
    let n = r.random_range(50..100);
    let data: Vec<Tensor> = (0..n).map(|i| Tensor::from_vec1(vec![i as u32])).collect();
    let (bs, seed) = (r.random_range(2..6), r.random::<u64>());
    let builder = |n: usize| {
        Loader::builder(data[..n].to_vec())
            .batch_size(bs)
            .shuffle(seed)
            .shard(1, 2)
            .workers(1)
    };
    let loader = builder(n).build(Stack).unwrap();
    let mut epoch = loader.run_epoch(0);
    epoch.next().unwrap().unwrap();
    let p = epoch.position();
    drop(epoch);
    assert_eq!((p.epoch(), p.batch()), (0, 1));
    builder(n).resume(p).build(Stack).unwrap();
    let refuse = |b: pinnable::loader::LoaderBuilder<Vec<Tensor>>| {
        refused(b.resume(p).build(Stack).unwrap_err())
    };
    assert_eq!(refuse(builder(n - 1)), "dataset length");
    assert_eq!(refuse(builder(n).batch_size(bs + 1)), "batch size");
    assert_eq!(refuse(builder(n).shard(1, 3)), "world size");
    assert_eq!(refuse(builder(n).shard(0, 2)), "rank");
    assert_eq!(refuse(builder(n).shuffle(seed ^ 1)), "seed");
    assert_eq!(
        refuse(Loader::builder(data.clone()).batch_size(bs).shard(1, 2)),
        "seed"
    );
    assert_eq!(refuse(builder(n).drop_last(true)), "drop_last");
    let past: Position = p
        .to_string()
        .replace("batch=1", "batch=100000")
        .parse()
        .unwrap();
    assert_eq!(
        refused(builder(n).resume(past).build(Stack).unwrap_err()),
        "batch"
    );
    // A stream's position is not a dataset's, and the other way round.
    let stream = Loader::builder(IterSource::new(|_| {
        (0..10u32).map(|i| Ok(Tensor::from_vec1(vec![i])))
    }))
    .batch_size(bs)
    .shard(1, 2);
    assert_eq!(
        refused(stream.resume(p).build(Stack).unwrap_err()),
        "dataset length"
    );
    // Per-device loaders take the position of any one of them.
    let devices = [Device::cpu(), Device::cpu()];
    let per = Loader::builder(data.clone())
        .batch_size(bs)
        .shuffle(seed)
        .workers(1);
    let loaders = per.build_per_device(&devices, Stack).unwrap();
    let whole: Vec<Vec<Vec<u8>>> = loaders
        .iter()
        .map(|l| l.run_epoch(1).map(|b| bytes_of(&b.unwrap())).collect())
        .collect();
    let mut e = loaders[1].run_epoch(1);
    let k = r.random_range(0..e.remaining().unwrap());
    for _ in 0..k {
        e.next().unwrap().unwrap();
    }
    let p = e.position();
    drop(e);
    let resumed = Loader::builder(data.clone())
        .batch_size(bs)
        .shuffle(seed)
        .workers(2)
        .resume(p)
        .build_per_device(&devices, Stack)
        .unwrap();
    for (l, whole) in resumed.iter().zip(&whole) {
        let rest: Vec<Vec<u8>> = l.iter().map(|b| bytes_of(&b.unwrap())).collect();
        assert_eq!(rest, whole[k..]);
    }
}

/// Time to the first batch of a loader over 10⁶ batches resumed at `batch`, and the samples
/// its dataset loaded.
fn resume_cost(batch: u64) -> (f64, usize, Vec<usize>) {
    const BATCHES: usize = 1_000_000;
    let loaded = Arc::new(Mutex::new(Vec::new()));
    let log = loaded.clone();
    let data = FnDataset::new(BATCHES * 2, move |i| {
        log.lock().unwrap().push(i);
        Ok(Tensor::from_vec1(vec![i as u64]))
    });
    let base = Loader::builder(FnDataset::new(BATCHES * 2, |_| Ok(())))
        .batch_size(2)
        .shuffle(11)
        .workers(1)
        .build(|_: Vec<()>, _: &mut pinnable::loader::Collator| Ok(()))
        .unwrap()
        .position();
    let p: Position = base
        .to_string()
        .replace("epoch=0 batch=0", &format!("epoch=3 batch={batch}"))
        .parse()
        .unwrap();
    let start = Instant::now();
    let loader = Loader::builder(data)
        .batch_size(2)
        .shuffle(11)
        .workers(2)
        .prefetch(1)
        .resume(p)
        .build(Stack)
        .unwrap();
    let mut epoch = loader.iter();
    let first = epoch.next().unwrap().unwrap();
    let t = start.elapsed().as_secs_f64();
    let left = epoch.remaining().unwrap();
    drop(epoch);
    assert_eq!(left, BATCHES - batch as usize - 1);
    let want = &loader
        .sampler()
        .batches_from(3, batch as usize)
        .next()
        .unwrap();
    assert_eq!(
        first.to_vec::<u64>().unwrap(),
        want.iter().map(|&i| i as u64).collect::<Vec<_>>()
    );
    // Only the batches from the position on were loaded (the first, and those in flight).
    let next: Vec<usize> = loader
        .sampler()
        .batches_from(3, batch as usize)
        .take(4)
        .flatten()
        .collect();
    let loaded = loaded.lock().unwrap().clone();
    assert!(
        loaded.iter().all(|i| next.contains(i)),
        "{loaded:?} outside {next:?}"
    );
    (t, loaded.len(), want.clone())
}

#[test]
fn resuming_costs_the_same_at_batch_10_and_at_batch_a_million() {
    let _s = serial();
    // Warm the allocator and the page cache of the order's memory first.
    resume_cost(10);
    let (mut early, mut late) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..5 {
        let (t, loaded, first) = resume_cost(10);
        early = early.min(t);
        assert!(
            loaded <= 2 * 4,
            "{loaded} samples loaded to resume at batch 10"
        );
        assert!(first.len() == 2);
        let (t, loaded, _) = resume_cost(999_990);
        late = late.min(t);
        // The bound: the batches in flight (prefetch + workers + 1), of 2 samples each.
        assert!(
            loaded <= 2 * 4,
            "{loaded} samples loaded to resume at batch 999990"
        );
    }
    println!(
        "resume to the first batch over 10^6 batches: at batch 10 {:.1} ms, at batch 999990 {:.1} ms",
        early * 1e3,
        late * 1e3
    );
    // Both compute the epoch's order (O(dataset)) and nothing else: the same cost. A busy
    // machine only ever adds time, so each is the best of five runs, alternated so that a
    // slow spell hits both alike.
    assert!(late < early * 2.0 + 0.05, "{late} s against {early} s");
}
