//! Token batches on the GPU: 200 random batches — random formats, residencies, dtypes, batch
//! sizes and contexts — read back from the device equal to the reference built from the files;
//! a run stopped mid-epoch and resumed on the device, with other worker counts, delivers the
//! batches of the uninterrupted run. Without a GPU each test prints `skipped: …` (a failure
//! under `PINNABLE_REQUIRE_GPU=1`).

use pinnable::formats::tokens::{Residency, ShardFormat, TokenBatch, TokenShards, TokenWindows};
use pinnable::loader::{Loader, Position};
use pinnable::{DType, Device, Placement, Tensor, ToDevice};
use pinnable_harness::tokens::{FORMATS, TempDir, random_shards};
use pinnable_harness::{cuda_or_skip, rng};
use rand::Rng;
use rand::seq::IndexedRandom;

fn open(
    paths: &[std::path::PathBuf],
    format: ShardFormat,
    residency: Residency,
    vocab: u32,
) -> pinnable::Result<TokenShards> {
    // The vocabulary check lets i32 batches of u32 tokens be widened on the GPU.
    let options = TokenShards::options()
        .format(format)
        .residency(residency)
        .vocab(u64::from(vocab));
    // SAFETY: the tests write their shards before opening them, and never while they are open.
    unsafe { options.open_mapped(paths) }
}

/// `t`, on the device, read back as i64.
fn on_device_as_i64(t: &Tensor, dev: &Device) -> Vec<i64> {
    assert_eq!(t.placement(), Placement::Cuda(dev.ordinal().unwrap()));
    let host = t.to_cpu(false).unwrap();
    match host.dtype() {
        DType::I64 => host.to_vec::<i64>().unwrap(),
        _ => host
            .to_vec::<i32>()
            .unwrap()
            .into_iter()
            .map(i64::from)
            .collect(),
    }
}

fn xy(batch: &TokenBatch, dev: &Device) -> (Vec<i64>, Vec<i64>) {
    (
        on_device_as_i64(&batch.x.tensor().unwrap(), dev),
        on_device_as_i64(&batch.y.tensor().unwrap(), dev),
    )
}

#[test]
fn two_hundred_random_batches_reach_the_device_equal_to_the_reference() {
    let test = "two_hundred_random_batches_reach_the_device_equal_to_the_reference";
    let Some(dev) = cuda_or_skip(test) else {
        return;
    };
    let mut r = rng(test);
    let mut checked = 0;
    let mut runs = 0;
    while checked < 200 {
        runs += 1;
        let dir = TempDir::new("tokens-gpu");
        let (format, token_type) = *FORMATS.choose(&mut r).unwrap();
        let residency = *[Residency::Pinned, Residency::Mapped, Residency::Auto]
            .choose(&mut r)
            .unwrap();
        let dtype = *[DType::I64, DType::I32].choose(&mut r).unwrap();
        let vocab = match (token_type, dtype) {
            (DType::U16, _) => 1 << 16,
            (_, DType::I32) => 1 << 31,
            _ => u32::MAX,
        };
        let context = if r.random_bool(0.3) {
            r.random_range(1..16)
        } else {
            r.random_range(16..2049)
        };
        let (paths, reference) =
            random_shards(&mut r, dir.path(), format, token_type, context, vocab);
        let shards = open(&paths, format, residency, vocab).unwrap();
        let windows = TokenWindows::new(shards, context).unwrap();
        let batcher = windows.batcher(dtype).unwrap();
        let loader = Loader::builder(windows)
            .batch_size(r.random_range(1..65))
            .shuffle(r.random())
            .workers(r.random_range(1..5))
            .device(dev.clone())
            .build(batcher)
            .unwrap();
        let epoch = r.random_range(0..4);
        let order = loader.sampler().batches(epoch);
        for (batch, indices) in loader.run_epoch(epoch).zip(&order).take(20) {
            let batch = batch.unwrap();
            assert_eq!(batch.x.shape(), vec![indices.len(), context]);
            assert_eq!(batch.x.dtype(), dtype);
            assert!(
                xy(&batch, &dev) == reference.batch(indices),
                "{format} {residency} {dtype}, context {context}"
            );
            checked += 1;
        }
    }
    println!("{checked} batches from {runs} loaders read back equal to the reference");
}

#[test]
fn a_run_resumed_on_the_device_delivers_the_uninterrupted_batches() {
    let test = "a_run_resumed_on_the_device_delivers_the_uninterrupted_batches";
    let Some(dev) = cuda_or_skip(test) else {
        return;
    };
    let mut r = rng(test);
    let dir = TempDir::new("tokens-gpu-resume");
    let context = r.random_range(64..1025);
    let (paths, reference) = random_shards(
        &mut r,
        dir.path(),
        ShardFormat::LlmC,
        DType::U16,
        context,
        50257,
    );
    let shards = std::sync::Arc::new(TokenShards::open(&paths).unwrap());
    let (batch_size, seed) = (r.random_range(1..9), r.random::<u64>());
    let build = |workers: usize, prefetch: usize| {
        let windows = TokenWindows::new(shards.clone(), context).unwrap();
        let batcher = windows.batcher(DType::I64).unwrap();
        (
            Loader::builder(windows)
                .batch_size(batch_size)
                .shuffle(seed)
                .workers(workers)
                .prefetch(prefetch)
                .device(dev.clone()),
            batcher,
        )
    };
    let (b, batcher) = build(4, 2);
    let loader = b.build(batcher).unwrap();
    let epochs = 2u64;
    let whole: Vec<(Vec<i64>, Vec<i64>)> = (0..epochs)
        .flat_map(|e| {
            loader
                .run_epoch(e)
                .map(|b| xy(&b.unwrap(), &dev))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        whole[..loader.len()].to_vec(),
        loader
            .sampler()
            .batches(0)
            .iter()
            .map(|ix| reference.batch(ix))
            .collect::<Vec<_>>()
    );
    for (before, after) in [(1, 8), (8, 1), (4, 4)] {
        let stop = r.random_range(0..=whole.len());
        let (b, batcher) = build(before, r.random_range(0..5));
        let first = b.build(batcher).unwrap();
        let mut got = Vec::new();
        'run: for e in 0..epochs {
            let mut epoch = first.run_epoch(e);
            loop {
                if got.len() == stop {
                    break 'run;
                }
                match epoch.next() {
                    Some(b) => got.push(xy(&b.unwrap(), &dev)),
                    None => break,
                }
            }
        }
        let p: Position = first.position().to_string().parse().unwrap();
        drop(first);
        let (b, batcher) = build(after, r.random_range(0..5));
        let second = b.resume(p).build(batcher).unwrap();
        while second.next_epoch() < epochs {
            for b in &second {
                got.push(xy(&b.unwrap(), &dev));
            }
        }
        assert!(
            got == whole,
            "{before} then {after} workers, stopped at {p}"
        );
    }
    // A batch moved on again stays put on its device.
    let (b, batcher) = build(1, 0);
    let batch = b.build(batcher).unwrap().iter().next().unwrap().unwrap();
    let again = batch.to_device(&dev, false).unwrap();
    assert_eq!(xy(&again, &dev), whole[0]);
}
