//! `Gather`: rows of a dataset stacked where they land. On the host against a gather done by
//! hand, on a CUDA device (skipping, with `skipped: …` on its own line, without one) with the
//! source overwritten right after each non-blocking call, through the loader, and to every
//! GPU of the machine (on a one-GPU machine, twice to that GPU, printing `partly skipped: …`).

use pinnable::loader::{FnDataset, Loader};
use pinnable::{
    DType, Device, Gather, GatherRoute, Pinnable, PinnedPool, Placement, PoolConfig, Tensor,
    ToDevice,
};
use pinnable_harness::{bytes_of, cuda_or_skip, cuda_targets_or_skip, random_tensor, rng};
use rand::Rng;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;

const DTYPES: [DType; 5] = [DType::U8, DType::I32, DType::F32, DType::I64, DType::BF16];

/// A random source of `n` rows, each of `row` elements (as `[n, 2, row / 2]` when even),
/// pinned or not.
fn source(r: &mut SmallRng, n: usize, row: usize, pinned: bool) -> Tensor {
    let dtype = DTYPES[r.random_range(0..DTYPES.len())];
    let shape = if row.is_multiple_of(2) {
        vec![n, 2, row / 2]
    } else {
        vec![n, row]
    };
    let t = random_tensor(r, dtype, &shape);
    if pinned { t.pin_memory().unwrap() } else { t }
}

/// Random rows of `n`: runs of consecutive rows, single rows and repeats.
fn random_rows(r: &mut SmallRng, n: usize, count: usize) -> Vec<usize> {
    let mut rows = Vec::with_capacity(count);
    while rows.len() < count {
        let start = r.random_range(0..n);
        let run = r.random_range(1..=4).min(n - start).min(count - rows.len());
        rows.extend(start..start + run);
    }
    rows
}

/// What the gather must hold: the rows' bytes one after another.
fn expected(source: &Tensor, rows: &[usize]) -> Vec<u8> {
    rows.iter()
        .flat_map(|&i| bytes_of(&source.narrow(0, i, 1).unwrap()))
        .collect()
}

#[test]
fn a_host_gather_holds_the_rows_in_order() {
    let mut r = rng("a_host_gather_holds_the_rows_in_order");
    for _ in 0..100 {
        let n = r.random_range(1..40);
        let (row, pinned) = (r.random_range(1..300), r.random_bool(0.5));
        let src = source(&mut r, n, row, pinned);
        let count = r.random_range(0..50);
        let rows = random_rows(&mut r, n, count);
        let g = Gather::rows(&src, rows.iter().copied()).unwrap();
        let mut shape = src.shape().to_vec();
        shape[0] = rows.len();
        assert_eq!(g.shape(), shape);
        assert_eq!((g.len(), g.dtype()), (rows.len(), src.dtype()));
        assert!(g.is_pending());
        let t = g.tensor().unwrap();
        assert!(t.is_pinned() && t.is_contiguous());
        assert_eq!(t.shape(), &shape[..]);
        assert_eq!(bytes_of(&t), expected(&src, &rows));
        // Moving a host gather to the host copies nothing yet.
        assert!(g.to_cpu(true).unwrap().is_pending());
    }
}

#[test]
fn a_strided_source_is_gathered_row_by_row() {
    let mut r = rng("a_strided_source_is_gathered_row_by_row");
    let base = random_tensor(&mut r, DType::F32, &[6, 9]);
    let src = base.transpose(0, 1).unwrap(); // 9 rows of 6, strided
    let rows = [8, 0, 1, 2, 5, 5];
    let t = Gather::rows(&src, rows).unwrap().into_tensor().unwrap();
    assert_eq!(t.shape(), &[6, 6]);
    assert_eq!(bytes_of(&t), expected(&src, &rows));
}

#[test]
fn bad_rows_are_refused_with_the_row_named() {
    let t = Tensor::from_vec(vec![1u8; 12], &[4, 3]).unwrap();
    let e = Gather::rows(&t, [0, 4]).unwrap_err().to_string();
    assert!(e.contains("row 4") && e.contains("4 rows"), "{e}");
    let scalar = Tensor::from_vec(vec![1u8], &[]).unwrap();
    let e = Gather::rows(&scalar, [0]).unwrap_err().to_string();
    assert!(e.contains("rank-0"), "{e}");
}

#[derive(Pinnable, ToDevice)]
struct Batch {
    images: Gather,
    labels: Gather,
    extra: Tensor,
}

#[test]
fn pinning_keeps_pinned_rows_in_place_and_gathers_pageable_ones_into_the_batch_block() {
    let mut r = rng("pinning_keeps_pinned_rows_in_place");
    let images = source(&mut r, 30, 48, true);
    let labels = source(&mut r, 30, 1, false);
    let rows = random_rows(&mut r, 30, 12);
    let batch = Batch {
        images: Gather::rows(&images, rows.iter().copied()).unwrap(),
        labels: Gather::rows(&labels, rows.iter().copied()).unwrap(),
        extra: random_tensor(&mut r, DType::U16, &[5]),
    };
    let pinned = batch.pin_memory().unwrap();
    assert!(pinned.images.is_pending(), "pinned rows need no copy");
    assert!(!pinned.labels.is_pending());
    let labels_t = pinned.labels.tensor().unwrap();
    assert!(
        labels_t.shares_block_with(&pinned.extra),
        "one block for the batch"
    );
    assert_eq!(bytes_of(&labels_t), expected(&labels, &rows));
    assert_eq!(
        bytes_of(&pinned.images.tensor().unwrap()),
        expected(&images, &rows)
    );
    assert_eq!(bytes_of(&pinned.extra), bytes_of(&batch.extra));
}

#[test]
fn the_loader_gathers_each_batch_from_a_pinned_dataset_on_the_host() {
    let mut r = rng("the_loader_gathers_each_batch_from_a_pinned_dataset_on_the_host");
    let n = r.random_range(20..200);
    let row = r.random_range(1..100);
    let images = source(&mut r, n, row, true);
    let labels = Tensor::pinned_from_fn(&[n], |i| i as i64).unwrap();
    let batch_size = r.random_range(1..9);
    let (im, lb) = (images.clone(), labels.clone());
    let loader = Loader::builder(FnDataset::new(n, Ok))
        .batch_size(batch_size)
        .shuffle(r.random())
        .workers(r.random_range(1..4))
        .pool(PinnedPool::new(PoolConfig::default()))
        .build_with(move |rows: Vec<usize>, _c| {
            Ok(Batch {
                images: Gather::rows(&im, rows.iter().copied())?,
                labels: Gather::rows(&lb, rows.iter().copied())?,
                extra: Tensor::from_vec1(vec![rows.len() as u32]),
            })
        })
        .unwrap();
    let mut seen = vec![0; n];
    for b in loader.run_epoch(0) {
        let b = b.unwrap();
        let rows = b.labels.tensor().unwrap().to_vec::<i64>().unwrap();
        let rows: Vec<usize> = rows.into_iter().map(|i| i as usize).collect();
        assert_eq!(
            bytes_of(&b.images.tensor().unwrap()),
            expected(&images, &rows)
        );
        for i in rows {
            seen[i] += 1;
        }
    }
    assert!(seen.iter().all(|&k| k == 1), "every sample once");
}

#[test]
fn gathers_reach_the_device_intact_with_the_source_overwritten_at_once() {
    let test = "gathers_reach_the_device_intact_with_the_source_overwritten_at_once";
    let Some(dev) = cuda_or_skip(test) else {
        return;
    };
    let mut r = rng(test);
    for i in 0..200 {
        let n = r.random_range(1..48);
        // TensorRows from a few bytes (gathered on the host) to 1 MiB of f32 (copied straight).
        let row = if r.random_bool(0.5) {
            r.random_range(1..2000)
        } else {
            r.random_range(16_000..262_144)
        };
        let pinned = r.random_bool(0.7);
        let mut src = source(&mut r, n, row, pinned);
        let rows = if r.random_bool(0.2) {
            (0..n).collect()
        } else {
            let count = r.random_range(0..40);
            random_rows(&mut r, n, count)
        };
        let want = expected(&src, &rows);
        let len = r.random_range(0..100);
        let extra = random_tensor(&mut r, DType::F32, &[len]);
        let route = [GatherRoute::Auto, GatherRoute::Direct, GatherRoute::Host][i % 3];
        let batch = Batch {
            images: Gather::rows(&src, rows.iter().copied())
                .unwrap()
                .route(route),
            labels: Gather::rows(&src, rows.iter().rev().copied()).unwrap(),
            extra: extra.clone(),
        };
        let moved = batch.to_device(&dev, r.random_bool(0.8)).unwrap();
        drop(batch);
        // The source is this test's alone again: overwritten in place, at once.
        overwrite(&mut src);
        let images = moved.images.tensor().unwrap();
        assert_eq!(images.placement(), Placement::Cuda(0));
        assert!(images.is_contiguous());
        let back = images.to_cpu(false).unwrap();
        assert_eq!(
            bytes_of(&back),
            want,
            "batch {i}: {n} rows of {row}, pinned: {pinned}"
        );
        let back = moved.labels.tensor().unwrap().to_cpu(false).unwrap();
        let mut rev = rows.clone();
        rev.reverse();
        let per_row = want.len().checked_div(rows.len()).unwrap_or(0);
        let want_rev: Vec<u8> = rev
            .iter()
            .flat_map(|&k| {
                let at = rows.iter().position(|&x| x == k).unwrap() * per_row;
                want[at..at + per_row].to_vec()
            })
            .collect();
        assert_eq!(bytes_of(&back), want_rev, "batch {i}");
        assert_eq!(
            bytes_of(&moved.extra.to_cpu(false).unwrap()),
            bytes_of(&extra)
        );
    }
}

/// Writes new values over every element, in place when the tensor is its storage's only user.
fn overwrite(t: &mut Tensor) {
    macro_rules! fill {
        ($ty:ty, $v:expr) => {
            t.as_mut_slice::<$ty>().unwrap().fill($v)
        };
    }
    match t.dtype() {
        DType::U8 => fill!(u8, 0xAB),
        DType::I32 => fill!(i32, -7),
        DType::F32 => fill!(f32, 9.5),
        DType::I64 => fill!(i64, -3),
        DType::BF16 => fill!(half::bf16, half::bf16::from_f32(2.0)),
        other => unreachable!("no source of {other}"),
    }
}

#[test]
fn rows_of_a_device_dataset_are_gathered_on_the_device_and_back() {
    let test = "rows_of_a_device_dataset_are_gathered_on_the_device_and_back";
    let Some(dev) = cuda_or_skip(test) else {
        return;
    };
    let mut r = rng(test);
    for _ in 0..50 {
        let n = r.random_range(1..30);
        let row = r.random_range(1..5000);
        let host = source(&mut r, n, row, false);
        let on_dev = host.to_device(&dev, true).unwrap();
        let count = r.random_range(0..30);
        let rows = random_rows(&mut r, n, count);
        let g = Gather::rows(&on_dev, rows.iter().copied()).unwrap();
        assert_eq!(g.placement(), Placement::Cuda(0));
        let stacked = g.to_device(&dev, true).unwrap().into_tensor().unwrap();
        assert_eq!(stacked.placement(), Placement::Cuda(0));
        assert_eq!(
            bytes_of(&stacked.to_cpu(false).unwrap()),
            expected(&host, &rows)
        );
        // To the host: one copy a run into pinned memory.
        let back = g.to_cpu(false).unwrap().into_tensor().unwrap();
        assert!(back.is_pinned());
        assert_eq!(bytes_of(&back), expected(&host, &rows));
        // Pending, gathered on demand.
        assert_eq!(
            bytes_of(&g.tensor().unwrap().to_cpu(false).unwrap()),
            expected(&host, &rows)
        );
        // A device source cannot be pinned.
        assert!(g.pin_memory().is_err());
    }
}

/// The rows a gathered batch holds, read back from its gathered labels (label `i` for row `i`).
fn rows_named_by(labels: &Gather) -> Vec<usize> {
    let labels = labels.tensor().unwrap().to_cpu(false).unwrap();
    labels
        .to_vec::<i64>()
        .unwrap()
        .into_iter()
        .map(|i| i as usize)
        .collect()
}

#[test]
fn the_loader_gathers_batches_on_the_device_from_a_pinned_dataset() {
    let test = "the_loader_gathers_batches_on_the_device_from_a_pinned_dataset";
    let Some(dev) = cuda_or_skip(test) else {
        return;
    };
    let mut r = rng(test);
    let n = 500;
    let images = source(&mut r, n, 24_000, true);
    let labels = Tensor::pinned_from_fn(&[n], |i| i as i64).unwrap();
    let (im, lb) = (images.clone(), labels.clone());
    let pool = PinnedPool::new(PoolConfig::default());
    let loader = Loader::builder(FnDataset::new(n, Ok))
        .batch_size(r.random_range(1..20))
        .shuffle(r.random())
        .workers(r.random_range(1..4))
        .device(dev)
        .pool(pool.clone())
        .build_with(move |rows: Vec<usize>, _c| {
            Ok(Batch {
                // Copied straight from the pinned array, one copy a run.
                images: Gather::rows(&im, rows.iter().copied())?.route(GatherRoute::Direct),
                labels: Gather::rows(&lb, rows.iter().copied())?,
                extra: Tensor::from_vec1(vec![rows.len() as u32]),
            })
        })
        .unwrap();
    let mut seen = vec![0; n];
    for b in loader.run_epoch(3) {
        let b = b.unwrap();
        let images_t = b.images.tensor().unwrap();
        assert_eq!(images_t.placement(), Placement::Cuda(0));
        let rows = rows_named_by(&b.labels);
        assert_eq!(
            bytes_of(&images_t.to_cpu(false).unwrap()),
            expected(&images, &rows)
        );
        for i in rows {
            seen[i] += 1;
        }
    }
    assert!(seen.iter().all(|&k| k == 1), "every sample once");
    assert_eq!(
        pool.stats().in_use_bytes,
        0,
        "no pinned batch blocks: nothing collated"
    );
}

#[test]
fn a_gathered_batch_fans_out_to_every_device() {
    let test = "a_gathered_batch_fans_out_to_every_device";
    let Some(devices) = cuda_targets_or_skip(test) else {
        return;
    };
    use pinnable::{FanoutRoute, ToDevices};
    let mut r = rng(test);
    for i in 0..200 {
        let n = r.random_range(1..32);
        let (row, pinned) = (r.random_range(1..40_000), r.random_bool(0.7));
        let mut src = source(&mut r, n, row, pinned);
        let count = r.random_range(0..32);
        let rows = random_rows(&mut r, n, count);
        let want = expected(&src, &rows);
        let g = Gather::rows(&src, rows.iter().copied()).unwrap();
        let route = [
            FanoutRoute::Auto,
            FanoutRoute::HostToEach,
            FanoutRoute::HostThenPeer,
        ][i % 3];
        // Every device, in a new order each time: each in turn is the first (the source of
        // `HostThenPeer`'s peer copies).
        let mut targets = devices.clone();
        targets.shuffle(&mut r);
        let copies = g.to_devices_by(&targets, true, route).unwrap();
        assert_eq!(copies.len(), targets.len(), "one copy a target");
        drop(g);
        overwrite(&mut src);
        for (c, on) in copies.iter().zip(&targets) {
            let t = c.tensor().unwrap();
            assert_eq!(t.device().ordinal(), on.ordinal());
            assert_eq!(
                bytes_of(&t.to_cpu(false).unwrap()),
                want,
                "{route:?}, to {on}, batch {i}"
            );
        }
    }
}

#[test]
fn gathering_loaders_feed_every_device_at_once_each_its_own_shard() {
    let test = "gathering_loaders_feed_every_device_at_once_each_its_own_shard";
    let Some(devices) = cuda_targets_or_skip(test) else {
        return;
    };
    let mut r = rng(test);
    let n = devices.len() * r.random_range(100..300);
    // No more bytes in all than with two devices, whatever their number.
    let row = r.random_range(1..60_000 / devices.len());
    let images = source(&mut r, n, row, true);
    let labels = Tensor::pinned_from_fn(&[n], |i| i as i64).unwrap();
    let (im, lb) = (images.clone(), labels.clone());
    let pool = PinnedPool::new(PoolConfig::default());
    let loaders = Loader::builder(FnDataset::new(n, Ok))
        .batch_size(r.random_range(1..20))
        .shuffle(r.random())
        .workers(r.random_range(1..3))
        .pool(pool.clone())
        .build_per_device(&devices, move |rows: Vec<usize>, _: &mut _| {
            Ok((
                Gather::rows(&im, rows.iter().copied())?,
                Gather::rows(&lb, rows)?,
            ))
        })
        .unwrap();
    // Each loader on a thread of its own, as each GPU's training step runs.
    let shares: Vec<Vec<usize>> = std::thread::scope(|s| {
        let handles: Vec<_> = loaders
            .iter()
            .zip(&devices)
            .map(|(loader, device)| {
                let images = &images;
                s.spawn(move || {
                    let mut seen = Vec::new();
                    for b in loader.run_epoch(5) {
                        let (g_images, g_labels) = b.unwrap();
                        let t = g_images.tensor().unwrap();
                        assert_eq!(t.device().ordinal(), device.ordinal());
                        let rows = rows_named_by(&g_labels);
                        assert_eq!(bytes_of(&t.to_cpu(false).unwrap()), expected(images, &rows));
                        seen.extend(rows);
                    }
                    seen
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let sizes: Vec<usize> = shares.iter().map(Vec::len).collect();
    assert_eq!(
        sizes,
        vec![n / devices.len(); devices.len()],
        "equal shares"
    );
    let mut all = shares.concat();
    all.sort_unstable();
    assert_eq!(all, (0..n).collect::<Vec<_>>(), "disjoint and complete");
    assert_eq!(
        pool.stats().peak_in_use_bytes,
        0,
        "no pinned batch block, ever: the workers only pick rows"
    );
}

#[test]
fn a_host_gather_moved_to_the_host_stays_pending() {
    let t = Tensor::from_vec(vec![1u16, 2, 3, 4], &[4]).unwrap();
    let g = Gather::rows(&t, [3, 1]).unwrap();
    let moved = g.to_device(&Device::cpu(), false).unwrap();
    assert!(moved.is_pending());
    assert_eq!(moved.tensor().unwrap().to_vec::<u16>().unwrap(), vec![4, 2]);
    let stacked = Gather::from(t.clone());
    assert!(!stacked.is_pending());
    assert_eq!((stacked.len(), stacked.shape()), (4, vec![4]));
    let scalar = Gather::from(Tensor::from_vec(vec![5u8], &[]).unwrap());
    assert_eq!(scalar.len(), 1);
    let empty = Gather::rows(&t, []).unwrap();
    assert!(empty.is_empty());
    assert_eq!(empty.tensor().unwrap().shape(), &[0]);
    assert!(format!("{g:?}").contains("pending"), "{g:?}");
}
