//! Our batches on burn's CUDA backend: the loader collates each batch into one pinned block,
//! and `to_burn_float` / `to_burn_int` hand that block to burn, whose CUDA backend copies it to
//! the GPU on its own stream straight from the block (no staging copy on either side) and
//! keeps the block until that copy has run. Checked here: the values after the move, for every
//! dtype burn's CUDA backend holds; the order of that copy when burn's stream is still busy
//! and the loader reuses the blocks; and the errors, named, on the CUDA device.
//!
//! Each test needs a GPU and prints `skipped: <test>: <reason>` without one.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use burn_tensor::{DType as BurnDType, Device, Int, Tensor as BurnTensor};
use pinnable::interop::burn::{BurnLoader, to_burn_float, to_burn_int};
use pinnable::loader::{Collator, FnDataset, Loader};
use pinnable::{DType, PinnedPool, PoolConfig, Tensor, ToDevice};
use pinnable_harness::{bytes_of, cuda_or_skip, random_tensor, rng};
use rand::Rng;

/// burn's CUDA device 0, or `None` after the skip line.
fn burn_cuda(test: &str) -> Option<Device> {
    cuda_or_skip(test).map(|_| Device::cuda(0usize))
}

/// A sample: a float row, a second float row in a narrower dtype, a label and a byte row.
type Sample = (Tensor, Tensor, i64, Tensor);
/// Our batch, one pinned block: `[B, F]` f32, `[B, H]` f16 or bf16, `[B]` i64, `[B, P]` u8.
type Ours = (Tensor, Tensor, Tensor, Tensor);
/// burn's batch, and the bytes of ours it was made from.
type Moved = (
    BurnTensor<2>,
    BurnTensor<2>,
    BurnTensor<1, Int>,
    BurnTensor<2, Int>,
    [Vec<u8>; 4],
);

fn collate(samples: Vec<Sample>, c: &mut Collator) -> pinnable::Result<Ours> {
    let x = c.stack("x", samples.iter().map(|s| &s.0))?;
    let h = c.stack("h", samples.iter().map(|s| &s.1))?;
    let y = c.stack_scalars("y", samples.iter().map(|s| s.2))?;
    let p = c.stack("p", samples.iter().map(|s| &s.3))?;
    let mut out = c.finish()?;
    Ok((out.take(x)?, out.take(h)?, out.take(y)?, out.take(p)?))
}

fn to_burn((x, h, y, p): Ours, device: &Device) -> pinnable::Result<Moved> {
    let bytes = [bytes_of(&x), bytes_of(&h), bytes_of(&y), bytes_of(&p)];
    Ok((
        to_burn_float(&x, device)?,
        to_burn_float(&h, device)?,
        to_burn_int(&y, device)?,
        to_burn_int(&p, device)?,
        bytes,
    ))
}

/// The bytes of a burn tensor, read back from the GPU.
fn burn_bytes<K: burn_tensor::kind::Basic, const D: usize>(t: &BurnTensor<D, K>) -> Vec<u8> {
    t.to_data().as_bytes().to_vec()
}

/// `n` random samples, with `f`, `w`, `px` elements in the rows and the narrow float `half`.
fn samples(
    r: &mut impl Rng,
    n: usize,
    (f, w, px): (usize, usize, usize),
    half: DType,
) -> Vec<Sample> {
    (0..n)
        .map(|_| {
            (
                random_tensor(r, DType::F32, &[f]),
                random_tensor(r, half, &[w]),
                r.random::<i64>(),
                random_tensor(r, DType::U8, &[px]),
            )
        })
        .collect()
}

/// The bytes sample `s` puts in each of the batch's four tensors.
fn sample_bytes(s: &Sample) -> [Vec<u8>; 4] {
    [
        bytes_of(&s.0),
        bytes_of(&s.1),
        s.2.to_ne_bytes().to_vec(),
        bytes_of(&s.3),
    ]
}

/// Checks every batch burn got against the samples, in the loader's order: burn's tensors hold
/// the bytes of our batch, in our dtypes, and our batch holds the samples.
fn check_batches(batches: &[Moved], data: &[Sample], order: &[usize], half: DType, seed: u64) {
    let half_burn = if half == DType::F16 {
        BurnDType::F16
    } else {
        BurnDType::BF16
    };
    let mut at = 0;
    for (k, (x, h, y, p, ours)) in batches.iter().enumerate() {
        let b = x.dims()[0];
        assert_eq!(
            (x.dtype(), h.dtype(), y.dtype(), p.dtype()),
            (BurnDType::F32, half_burn, BurnDType::I64, BurnDType::U8),
            "batch {k}: our dtypes are kept (seed {seed})"
        );
        let got = [burn_bytes(x), burn_bytes(h), burn_bytes(y), burn_bytes(p)];
        let mut expected: [Vec<u8>; 4] = Default::default();
        for &i in &order[at..at + b] {
            for (e, s) in expected.iter_mut().zip(sample_bytes(&data[i])) {
                e.extend(s);
            }
        }
        for (t, name) in ["x", "h", "y", "p"].iter().enumerate() {
            assert!(
                ours[t] == expected[t],
                "batch {k} {name}: our batch is not its samples (seed {seed})"
            );
            assert!(
                got[t] == ours[t],
                "batch {k} {name}: burn's CUDA tensor differs from our batch (seed {seed})"
            );
        }
        at += b;
    }
    assert_eq!(at, order.len(), "every sample once (seed {seed})");
}

#[test]
fn loader_batches_become_burn_cuda_tensors_with_their_values() {
    let test = "loader_batches_become_burn_cuda_tensors_with_their_values";
    let Some(device) = burn_cuda(test) else {
        return;
    };
    let mut r = rng(test);
    let seed = pinnable_harness::run_seed();
    for half in [DType::F16, DType::BF16] {
        let n = r.random_range(40..200);
        let dims = (
            r.random_range(1..300),
            r.random_range(1..64),
            r.random_range(1..500),
        );
        let data = samples(&mut r, n, dims, half);
        let batch = r.random_range(1..17);
        let shared = data.clone();
        let loader = Loader::builder(FnDataset::new(n, move |i| Ok(shared[i].clone())))
            .batch_size(batch)
            .shuffle(r.random())
            .workers(r.random_range(1..5))
            .build_with(collate)
            .unwrap();
        let order = loader.sampler().indices(0);
        let burn = BurnLoader::new(loader, device.clone(), to_burn);
        let batches: Vec<Moved> = burn_core::data::dataloader::DataLoader::iter(&burn)
            .map(|b| b.unwrap())
            .collect();
        assert_eq!(batches.len(), n.div_ceil(batch));
        check_batches(&batches, &data, &order, half, seed);
    }
}

/// A 4096² matrix of random values on `device`, to keep burn's stream busy with.
fn matrix(device: &Device, r: &mut impl Rng) -> BurnTensor<2> {
    let n = 4096;
    let values: Vec<f32> = (0..n * n)
        .map(|_| r.random_range(-1.0..1.0) / n as f32)
        .collect();
    BurnTensor::<2>::from_data(burn_tensor::TensorData::new(values, [n, n]), device)
}

/// Enqueues `steps` products of `b` on burn's stream of this thread, without waiting; the sum
/// of the last one, to wait for them with.
fn busy(b: &BurnTensor<2>, steps: usize) -> BurnTensor<1> {
    let mut a = b.clone();
    for _ in 0..steps {
        a = a.matmul(b.clone());
    }
    a.sum()
}

/// Waits for `t` (one number read back).
fn wait(t: BurnTensor<1>) {
    let v: Vec<f32> = t.to_data().convert::<f32>().try_to_vec().unwrap();
    std::hint::black_box(v);
}

#[test]
fn the_copy_runs_in_burns_stream_order_while_the_loader_reuses_its_blocks() {
    let test = "the_copy_runs_in_burns_stream_order_while_the_loader_reuses_its_blocks";
    let Some(device) = burn_cuda(test) else {
        return;
    };
    let mut r = rng(test);
    let seed = pinnable_harness::run_seed();
    // How long the products keep burn's stream busy (the kernels compiled by a first run):
    // enough of them for 50 ms at least.
    let b = matrix(&device, &mut r);
    wait(busy(&b, 1));
    let mut steps = 10;
    let delay = loop {
        let started = Instant::now();
        wait(busy(&b, steps));
        let took = started.elapsed();
        if took > Duration::from_millis(50) || steps >= 10_000 {
            break took;
        }
        steps *= 4;
    };
    assert!(
        delay > Duration::from_millis(50),
        "{steps} products of 4096² took {delay:?}: too little to delay the copies"
    );
    println!("{steps} products of 4096² keep burn's stream busy {delay:?}");

    let n = r.random_range(300..500);
    let dims = (
        r.random_range(100..2000),
        r.random_range(1..64),
        r.random_range(1..500),
    );
    let data = samples(&mut r, n, dims, DType::BF16);
    let batch = r.random_range(4..9);
    let shared = data.clone();
    // A pool of its own, so the blocks seen are this loader's and are reused between batches.
    let pool = PinnedPool::new(PoolConfig::new());
    let loader = Loader::builder(FnDataset::new(n, move |i| Ok(shared[i].clone())))
        .batch_size(batch)
        .shuffle(r.random())
        .workers(2)
        .prefetch(1)
        .pool(pool.clone())
        .build_with(collate)
        .unwrap();
    let order = loader.sampler().indices(0);
    let blocks = std::sync::Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    let seen = blocks.clone();
    let burn = BurnLoader::new(loader, device.clone(), move |b: Ours, d: &Device| {
        seen.lock().unwrap().insert(b.0.data_ptr());
        to_burn(b, d)
    });

    // burn's stream busy for `delay`; every batch's copy is queued behind it, and our batch
    // (the only handle of ours on its block) is dropped as soon as burn has it.
    let queued = Instant::now();
    let pending = busy(&b, steps);
    let mut first = None;
    let mut batches = Vec::new();
    for b in burn_core::data::dataloader::DataLoader::iter(&burn) {
        batches.push(b.unwrap());
        first.get_or_insert(queued.elapsed());
    }
    let first = first.expect("batches");
    wait(pending);
    assert!(
        first < delay / 2,
        "the first batch reached burn {first:?} after its stream was given {delay:?} of work: \
         the copies were not queued behind it"
    );
    let distinct = blocks.lock().unwrap().len();
    assert!(
        distinct < batches.len(),
        "{} batches in {distinct} blocks: the loader never reused a block",
        batches.len()
    );
    check_batches(&batches, &data, &order, DType::BF16, seed);
}

#[test]
fn errors_on_the_cuda_device_are_named_not_panics() {
    let test = "errors_on_the_cuda_device_are_named_not_panics";
    let Some(ours) = cuda_or_skip(test) else {
        return;
    };
    let device = Device::cuda(0usize);
    let mut r = rng(test);
    let rows = r.random_range(1..9);
    let t = random_tensor(&mut r, DType::F32, &[rows, 4]);

    // A batch already on our GPU: refused, saying what to do.
    let on_gpu = t.to_device(&ours, false).unwrap();
    let e = to_burn_float::<2>(&on_gpu, &device)
        .unwrap_err()
        .to_string();
    assert!(e.contains("to_cpu") && e.contains("cuda:0"), "{e}");
    // The wrong rank: an error naming the call and the rank, before burn sees it.
    let e = to_burn_float::<3>(&t, &device).unwrap_err().to_string();
    assert!(
        e.contains("to_burn_float::<3>") && e.contains("2 dimensions"),
        "{e}"
    );

    // A failing sample: burn's iterator yields the batches before it, then an error naming it.
    let bad = r.random_range(0..32);
    let loader = Loader::builder(FnDataset::new(32, move |i| {
        if i == bad {
            return Err(pinnable::Error::Config {
                setting: "sample",
                problem: format!("record {i} is corrupt"),
            });
        }
        Tensor::from_vec(vec![i as f32; 4], &[4])
    }))
    .batch_size(4)
    .build_with(|s: Vec<Tensor>, c: &mut Collator| {
        let x = c.stack("x", s.iter())?;
        let mut out = c.finish()?;
        out.take(x)
    })
    .unwrap();
    let burn = BurnLoader::new(loader, device.clone(), |x: Tensor, d: &Device| {
        to_burn_float::<2>(&x, d)
    });
    let results: Vec<_> = burn_core::data::dataloader::DataLoader::iter(&burn).collect();
    assert_eq!(results.len(), bad / 4 + 1, "the epoch ends at the error");
    for (k, res) in results.into_iter().enumerate() {
        match res {
            Ok(x) => {
                let v: Vec<f32> = x.to_data().try_to_vec().unwrap();
                let expected: Vec<f32> = (k * 4..k * 4 + 4).flat_map(|i| [i as f32; 4]).collect();
                assert_eq!(v, expected, "batch {k}");
            }
            Err(e) => {
                assert_eq!(k, bad / 4, "only the failing sample's batch fails: {e}");
                let message = e.to_string();
                assert!(message.contains(&format!("sample {bad}")), "{message}");
                assert!(
                    message.contains(&format!("record {bad} is corrupt")),
                    "{message}"
                );
            }
        }
    }
}
