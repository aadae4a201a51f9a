//! The loader on the host (`Device::cpu()`): order, randomness, sharding, errors, shutdown and
//! the pinned-memory bound, on fresh random data. Every test runs alone (they count the
//! loader's threads), under one lock.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pinnable::formats::npy::NpyArray;
use pinnable::loader::{Batcher, Collator, Dataset, FnDataset, Launch, Loader, Stack, TensorRows};
use pinnable::{DType, Device, Error, PinnedPool, PoolConfig, Tensor};
use pinnable_harness::samples::{Sample, collate, random_samples};
use pinnable_harness::{bytes_of, random_tensor, rng};
use rand::Rng;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The loader's threads alive in this process (`loader-w<i>` and `loader-transfer`; the test
/// binary's own main thread is `loader-<hash>`).
fn loader_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("loader-w") || name.trim_end() == "loader-transfer")
        .count()
}

/// The loader's threads alive once those that were joined have left: `join` returns when a
/// thread has finished, a moment before the kernel takes it out of `/proc/self/task`, so a
/// count of 0 is waited for (up to 2 s) before it is reported otherwise.
fn loader_threads_after_join() -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let n = loader_threads();
        if n == 0 || std::time::Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

fn own_pool() -> PinnedPool {
    PinnedPool::new(PoolConfig::default())
}

/// A batch as plain bytes, for byte-for-byte comparison.
type Bytes = Vec<Vec<u8>>;

fn epoch_bytes<B>(loader: &Loader<Vec<Sample>, B>, epoch: u64) -> Vec<Bytes>
where
    B: Batcher<Sample, Batch = Vec<Tensor>> + 'static,
{
    loader
        .run_epoch(epoch)
        .map(|b| {
            let b = b.unwrap();
            assert!(
                b.iter()
                    .all(|t| t.is_pinned() && t.shares_block_with(&b[0]))
            );
            b.iter().map(bytes_of).collect()
        })
        .collect()
}

fn labels_of(batches: &[Bytes]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            b[4].chunks(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        })
        .collect()
}

/// Opens a `.npy` file a test wrote.
fn open_npy(path: impl AsRef<std::path::Path>) -> pinnable::Result<NpyArray> {
    // SAFETY: the tests write their files before opening them and never while they are mapped.
    unsafe { NpyArray::open_mapped(path) }
}

#[test]
fn same_batches_byte_for_byte_for_1_2_and_8_workers() {
    let _s = serial();
    let mut r = rng("same_batches_byte_for_byte_for_1_2_and_8_workers");
    let n = r.random_range(150..250);
    let batch = r.random_range(3..17);
    let seed = r.random();
    let samples = random_samples(&mut r, n, (5, 7), 9);
    let runs: Vec<Vec<Bytes>> = [1, 2, 8]
        .into_iter()
        .map(|workers| {
            let loader = Loader::builder(samples.clone())
                .batch_size(batch)
                .shuffle(seed)
                .workers(workers)
                .pool(own_pool())
                .build_with(collate)
                .unwrap();
            epoch_bytes(&loader, 3)
        })
        .collect();
    assert_eq!(runs[0], runs[1]);
    assert_eq!(runs[0], runs[2]);
    // And they are the batcher's output on the samples in sampler order.
    let order = pinnable::loader::Sampler::new(n, batch)
        .unwrap()
        .shuffle(seed)
        .batches(3);
    let pool = own_pool();
    for (got, indices) in runs[0].iter().zip(&order) {
        let picked = indices.iter().map(|&i| samples[i].clone()).collect();
        let want = collate(picked, &mut Collator::new(&pool)).unwrap();
        assert_eq!(got, &want.iter().map(bytes_of).collect::<Bytes>());
    }
    assert_eq!(loader_threads_after_join(), 0);
}

fn labels_via_for<B>(loader: &Loader<Vec<Sample>, B>) -> Vec<i64>
where
    B: Batcher<Sample, Batch = Vec<Tensor>> + 'static,
{
    let mut labels = Vec::new();
    for batch in loader {
        labels.extend(batch.unwrap()[4].to_vec::<i64>().unwrap());
    }
    labels
}

#[test]
fn shuffle_is_reproducible_from_seed_and_epoch_and_differs_across_epochs() {
    let _s = serial();
    let mut r = rng("shuffle_is_reproducible_from_seed_and_epoch_and_differs_across_epochs");
    let samples = random_samples(&mut r, 97, (5, 7), 9);
    let seed: u64 = r.random();
    let make = |workers| {
        Loader::builder(samples.clone())
            .batch_size(10)
            .shuffle(seed)
            .workers(workers)
            .pool(own_pool())
            .build_with(collate)
            .unwrap()
    };
    let (a, b) = (make(2), make(3));
    let e0 = labels_of(&epoch_bytes(&a, 0));
    assert_eq!(e0, labels_of(&epoch_bytes(&b, 0)), "same seed and epoch");
    let e1 = labels_of(&epoch_bytes(&a, 1));
    assert_ne!(e0, e1, "another epoch, another order");
    let mut sorted = e1.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..97).collect::<Vec<i64>>(), "a permutation");
    // `for batch in &loader` runs the next epoch and advances; set_epoch resets.
    assert_eq!(labels_via_for(&a), e0);
    assert_eq!(labels_via_for(&a), e1);
    a.set_epoch(0);
    assert_eq!(labels_via_for(&a), e0);
}

#[test]
fn shards_are_disjoint_equal_and_cover_the_epoch() {
    let _s = serial();
    let mut r = rng("shards_are_disjoint_equal_and_cover_the_epoch");
    let n = r.random_range(40..120);
    let world = r.random_range(2..6);
    let seed = r.random();
    let labels: Vec<i64> = (0..n as i64).collect();
    let data: Vec<(Tensor, i64)> = labels
        .iter()
        .map(|&l| (Tensor::from_vec1(vec![l as f32]), l))
        .collect();
    for drop_last in [false, true] {
        let parts: Vec<Vec<i64>> = (0..world)
            .map(|rank| {
                let loader = Loader::builder(data.clone())
                    .batch_size(4)
                    .shuffle(seed)
                    .drop_last(drop_last)
                    .shard(rank, world)
                    .workers(2)
                    .pool(own_pool())
                    .build(Stack)
                    .unwrap();
                loader
                    .run_epoch(5)
                    .flat_map(|b| b.unwrap().1.to_vec::<i64>().unwrap())
                    .collect()
            })
            .collect();
        let len = parts[0].len();
        assert!(parts.iter().all(|p| p.len() == len), "equal: {parts:?}");
        let mut all = parts.concat();
        all.sort_unstable();
        if drop_last {
            // Tail dropped (shards and short batches): disjoint, no repeats.
            let before = all.len();
            all.dedup();
            assert_eq!(all.len(), before, "disjoint");
            assert_eq!(len, n / world / 4 * 4);
        } else {
            // Padded with repeats from the start: covering, every sample at least once.
            assert_eq!(all.len(), n.div_ceil(world) * world);
            all.dedup();
            assert_eq!(all, labels, "covering");
        }
    }
}

#[test]
fn an_error_in_sample_k_surfaces_with_k_and_the_loader_stops() {
    let _s = serial();
    let mut r = rng("an_error_in_sample_k_surfaces_with_k_and_the_loader_stops");
    let n = 200;
    let k = r.random_range(0..n);
    let pool = own_pool();
    let data = FnDataset::new(n, move |i| {
        if i == k {
            return Err(Error::Field {
                path: "record.pixels".into(),
                message: "truncated JPEG".into(),
            });
        }
        Ok(Tensor::from_vec1(vec![i as u16; 16]))
    });
    let loader = Loader::builder(data)
        .batch_size(8)
        .shuffle(r.random())
        .workers(4)
        .pool(pool.clone())
        .build(Stack)
        .unwrap();
    let position = loader
        .sampler()
        .indices(0)
        .iter()
        .position(|&i| i == k)
        .unwrap();
    let results: Vec<_> = loader.run_epoch(0).collect();
    assert_eq!(
        results.len(),
        position / 8 + 1,
        "batches before it, then the error"
    );
    let err = results.last().unwrap().as_ref().unwrap_err();
    assert!(
        matches!(err, Error::Sample { index, .. } if *index == k),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        format!("sample {k} failed while loading: `record.pixels`: truncated JPEG")
    );
    drop(results);
    assert_eq!(loader_threads_after_join(), 0, "threads joined");
    assert_eq!(pool.stats().in_use_bytes, 0, "blocks returned");
}

#[test]
fn a_worker_panic_is_an_error_not_a_hang() {
    let _s = serial();
    let pool = own_pool();
    let data = FnDataset::new(64, |i| {
        assert!(i != 37, "decoder bug on sample 37");
        Ok(Tensor::from_vec1(vec![i as u8; 4]))
    });
    let loader = Loader::builder(data)
        .batch_size(4)
        .workers(3)
        .pool(pool.clone())
        .build(Stack)
        .unwrap();
    let start = Instant::now();
    let results: Vec<_> = loader.iter().collect();
    assert!(start.elapsed() < Duration::from_secs(30));
    assert_eq!(results.len(), 10);
    let err = results[9].as_ref().unwrap_err();
    assert!(matches!(err, Error::Sample { index: 37, .. }), "{err}");
    assert!(
        err.to_string()
            .contains("panicked: decoder bug on sample 37"),
        "{err}"
    );
    // A panicking batcher too.
    let loader = Loader::builder((0..10).collect::<Vec<i64>>())
        .batch_size(3)
        .workers(2)
        .pool(pool.clone())
        .build_with(|s: Vec<i64>, c: &mut Collator| {
            let x = c.stack_scalars("x", s.iter().copied())?;
            if s.contains(&7) {
                panic!("batcher bug");
            }
            c.finish()?.take(x)
        })
        .unwrap();
    let results: Vec<_> = loader.iter().collect();
    assert_eq!(results.len(), 3);
    assert!(
        matches!(&results[2], Err(Error::Panicked { message, .. }) if message == "batcher bug")
    );
    assert_eq!(loader_threads_after_join(), 0);
}

#[test]
fn dropping_mid_epoch_joins_threads_and_returns_every_block() {
    let _s = serial();
    let mut r = rng("dropping_mid_epoch_joins_threads_and_returns_every_block");
    let images = random_tensor(&mut r, DType::F32, &[300, 3, 8, 8]);
    let pool = own_pool();
    let before = pool.stats().in_use_bytes;
    assert_eq!(loader_threads_after_join(), 0);
    let loader = Loader::builder(TensorRows::new(images).unwrap())
        .batch_size(16)
        .shuffle(r.random())
        .workers(4)
        .prefetch(3)
        .pool(pool.clone())
        .build(Stack)
        .unwrap();
    for taken in [0, 1, 5] {
        let mut epoch = loader.iter();
        let kept: Vec<Tensor> = epoch.by_ref().take(taken).map(|b| b.unwrap()).collect();
        std::thread::sleep(Duration::from_millis(20)); // let the workers fill the pipeline
        assert_eq!(loader_threads(), 4 + 1, "4 workers and the transfer thread");
        assert!(pool.stats().in_use_bytes > before);
        let start = Instant::now();
        drop(epoch);
        assert!(start.elapsed() < Duration::from_secs(5), "prompt");
        assert_eq!(loader_threads_after_join(), 0, "every thread joined");
        let held: usize = kept
            .iter()
            .map(|t| t.pinned_block().unwrap().capacity())
            .sum();
        assert_eq!(
            pool.stats().in_use_bytes,
            before + held,
            "only the kept batches"
        );
        drop(kept);
        assert_eq!(pool.stats().in_use_bytes, before);
    }
    // Dropping the loader after its epochs leaves nothing behind either.
    drop(loader);
    assert_eq!(pool.stats().in_use_bytes, before);
}

#[test]
fn pinned_bytes_held_never_exceed_the_bound_with_a_slow_consumer() {
    let _s = serial();
    let mut r = rng("pinned_bytes_held_never_exceed_the_bound_with_a_slow_consumer");
    let images = random_tensor(&mut r, DType::F32, &[256, 3, 16, 16]);
    let pool = own_pool();
    let (workers, prefetch) = (r.random_range(1..5), r.random_range(0..4));
    let loader = Loader::builder(TensorRows::new(images).unwrap())
        .batch_size(8)
        .workers(workers)
        .prefetch(prefetch)
        .pool(pool.clone())
        .build(Stack)
        .unwrap();
    assert_eq!(loader.bound(), prefetch + workers + 1);
    let mut block = 0;
    let mut seen_in_use = 0;
    for batch in &loader {
        let batch = batch.unwrap();
        block = batch.pinned_block().unwrap().capacity();
        std::thread::sleep(Duration::from_millis(3)); // the consumer is the bottleneck
        seen_in_use = seen_in_use.max(pool.stats().in_use_bytes);
    }
    let bound = loader.bound() * block;
    let peak = pool.stats().peak_in_use_bytes;
    assert!(peak <= bound, "peak {peak} > bound {bound}");
    assert!(
        seen_in_use >= (prefetch + workers) * block,
        "the workers ran ahead up to the bound: {seen_in_use} of {bound}"
    );
    let stats = loader.stats().unwrap();
    assert_eq!(stats.pinned_bound_bytes, bound);
    assert!(stats.pinned_peak_bytes <= bound);
    assert!(stats.waited < stats.elapsed);
    println!("{stats}");
}

#[test]
fn drop_last_and_a_short_last_batch() {
    let _s = serial();
    let mut r = rng("drop_last_and_a_short_last_batch");
    let n = r.random_range(20..60);
    let batch = r.random_range(3..7);
    let n = if n % batch == 0 { n + 1 } else { n };
    let data: Vec<Tensor> = (0..n).map(|i| Tensor::from_vec1(vec![i as i32])).collect();
    for drop_last in [false, true] {
        let loader = Loader::builder(data.clone())
            .batch_size(batch)
            .drop_last(drop_last)
            .workers(2)
            .pool(own_pool())
            .build(Stack)
            .unwrap();
        let sizes: Vec<usize> = loader.iter().map(|b| b.unwrap().shape()[0]).collect();
        let full = n / batch;
        assert_eq!(sizes[..full], vec![batch; full][..]);
        if drop_last {
            assert_eq!(sizes.len(), full);
        } else {
            assert_eq!(sizes.len(), full + 1);
            assert_eq!(sizes[full], n % batch, "the short last batch");
        }
        assert_eq!(loader.len(), sizes.len());
    }
}

#[test]
fn the_epoch_is_an_exact_size_iterator() {
    let _s = serial();
    let data: Vec<Tensor> = (0..50).map(|i| Tensor::from_vec1(vec![i as f64])).collect();
    let loader = Loader::builder(data)
        .batch_size(7)
        .workers(2)
        .pool(own_pool())
        .build(Stack)
        .unwrap();
    let mut epoch = loader.iter();
    assert_eq!(epoch.remaining(), Some(8));
    for left in (0..8).rev() {
        epoch.next().unwrap().unwrap();
        assert_eq!(epoch.remaining(), Some(left));
        assert_eq!(epoch.size_hint(), (left, Some(left)));
    }
    assert!(epoch.next().is_none());
    assert_eq!(
        loader_threads_after_join(),
        0,
        "joined right after the last batch"
    );
}

/// Writes `data` as a version-1 `.npy` file, as `np.save` does.
fn write_npy(path: &PathBuf, descr: &str, fortran: bool, shape: &[usize], data: &[u8]) {
    let bytes = pinnable_harness::npy::npy_file(descr, shape, fortran, data);
    std::fs::write(path, bytes).unwrap();
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("pinnable-{}-{name}", std::process::id()))
}

#[test]
fn an_npy_file_is_a_memory_mapped_dataset_of_rows() {
    let _s = serial();
    let mut r = rng("an_npy_file_is_a_memory_mapped_dataset_of_rows");
    let rows = r.random_range(5..40);
    let t = random_tensor(&mut r, DType::F32, &[rows, 3, 4]);
    let path = temp_path("images.npy");
    write_npy(&path, "<f4", false, &[rows, 3, 4], &bytes_of(&t));
    let npy = open_npy(&path).unwrap();
    assert_eq!(npy.len(), rows);
    assert_eq!(npy.tensor().shape(), &[rows, 3, 4]);
    assert_eq!(bytes_of(npy.tensor()), bytes_of(&t));
    let k = r.random_range(0..rows);
    let sample = npy.get(k).unwrap();
    assert!(
        sample.shares_storage_with(npy.tensor()),
        "a view of the mapping"
    );
    assert_eq!(bytes_of(&sample), bytes_of(&t.select(0, k).unwrap()));
    // Through the loader: the same bytes as the array, in order.
    let loader = Loader::builder(npy)
        .batch_size(4)
        .workers(2)
        .pool(own_pool())
        .build(Stack)
        .unwrap();
    let all: Vec<u8> = loader.iter().flat_map(|b| bytes_of(&b.unwrap())).collect();
    assert_eq!(all, bytes_of(&t));

    let bad = temp_path("fortran.npy");
    write_npy(&bad, "<f4", true, &[2, 2], &[0; 16]);
    let e = open_npy(&bad).unwrap_err().to_string();
    assert!(
        e.contains(&bad.display().to_string()) && e.contains("Fortran"),
        "{e}"
    );
    write_npy(&bad, ">i8", false, &[2], &[0; 16]);
    let e = open_npy(&bad).unwrap_err().to_string();
    assert!(e.contains("big-endian"), "{e}");
    write_npy(&bad, "<f4", false, &[100], &[0; 16]);
    let e = open_npy(&bad).unwrap_err().to_string();
    assert!(e.contains("truncated"), "{e}");
    let e = open_npy(temp_path("missing.npy")).unwrap_err().to_string();
    assert!(e.contains("No such file"), "{e}");
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&bad);
}

#[test]
fn launch_picks_cuda_local_rank_or_says_why_not() {
    let _s = serial();
    let launch = Launch {
        rank: 3,
        world: 4,
        local_rank: 1000,
    };
    let built =
        Loader::builder(vec![0u8; 8])
            .launch(launch)
            .build_with(|s: Vec<u8>, c: &mut Collator| {
                c.stack_scalars("x", s).and_then(|x| c.finish()?.take(x))
            });
    if Device::count() == 0 {
        // No CUDA device at all: the same program runs on the host, sharded as launched.
        let loader = built.unwrap();
        assert!(loader.device().is_cpu());
        assert_eq!(loader.sampler().rank_and_world(), (3, 4));
    } else {
        // A machine with GPUs, but not 1001 of them: refused at build, naming LOCAL_RANK.
        let e = built.unwrap_err();
        assert!(matches!(e, Error::CudaUnavailable { .. }), "{e}");
        assert!(
            e.to_string().contains("LOCAL_RANK=1000 asks for cuda:1000"),
            "{e}"
        );
    }
    let builder = Loader::builder(vec![1i64, 2, 3, 4, 5])
        .shard(1, 2)
        .workers(1);
    let loader = builder
        .build_with(|s: Vec<i64>, c: &mut Collator| {
            c.stack_scalars("x", s).and_then(|x| c.finish()?.take(x))
        })
        .unwrap();
    let got: Vec<i64> = loader
        .iter()
        .flat_map(|b| b.unwrap().to_vec::<i64>().unwrap())
        .collect();
    assert_eq!(
        got,
        [2, 4, 1],
        "rank 1 of 2: every other index, padded from the start"
    );
}
