//! One pinned block per batch: pinning places a whole batch in one block, batches are built in
//! place, and the sharing rules hold (the block lives while any tensor does; writes never
//! reach another tensor; a copy-out gets its own block).

use std::collections::HashMap;

use pinnable::BatchLayout;
const PART_ALIGN: usize = BatchLayout::PART_ALIGN;
use pinnable::{BackendChoice, DType, Error, Pinnable, PinnedPool, PoolConfig, Tensor};
use pinnable_harness::{bytes_of, random_tensor, rng};
use rand::Rng;

#[derive(Pinnable, Clone)]
struct Batch {
    images: Tensor,
    labels: Tensor,
    masks: Vec<Tensor>,
    extra: HashMap<String, Tensor>,
    ids: Vec<String>,
}

fn random_batch(r: &mut impl Rng) -> Batch {
    let b = r.random_range(1..9);
    let (h, w) = (r.random_range(1..17), r.random_range(1..17));
    Batch {
        images: random_tensor(r, DType::F32, &[b, 3, h, w]),
        labels: random_tensor(r, DType::I64, &[b]),
        masks: (0..r.random_range(0..4))
            .map(|_| random_tensor(r, DType::Bool, &[h, w]))
            .collect(),
        extra: HashMap::from([
            ("weights".to_string(), random_tensor(r, DType::F16, &[b])),
            ("offsets".to_string(), random_tensor(r, DType::U8, &[w])),
        ]),
        ids: (0..b).map(|i| format!("sample-{i}")).collect(),
    }
}

fn tensors(b: &Batch) -> Vec<&Tensor> {
    let mut v = vec![&b.images, &b.labels];
    v.extend(&b.masks);
    let mut keys: Vec<_> = b.extra.keys().collect();
    keys.sort();
    v.extend(keys.into_iter().map(|k| &b.extra[k]));
    v
}

/// A pool of our own over the page-locked backend, so its counters see only this test.
fn pool() -> PinnedPool {
    PinnedPool::new(PoolConfig::default().backend(BackendChoice::Mlock))
}

#[test]
fn a_derived_batch_pins_into_one_block_with_equal_values() {
    let mut r = rng("a_derived_batch_pins_into_one_block_with_equal_values");
    let pool = pool();
    for _ in 0..20 {
        let batch = random_batch(&mut r);
        let pinned = batch.pin_memory_in(&pool).unwrap();
        let (src, got) = (tensors(&batch), tensors(&pinned));
        for (s, p) in src.iter().zip(&got) {
            assert!(p.is_pinned());
            assert!(
                p.shares_block_with(got[0]),
                "{p:?} is in a block of its own"
            );
            assert!(!p.shares_storage_with(got[0]) || std::ptr::eq(*p, got[0]));
            assert_eq!(p.shape(), s.shape());
            assert_eq!(bytes_of(p), bytes_of(s));
        }
        assert_eq!(pinned.ids, batch.ids);
        let block = pinned.images.pinned_block().unwrap();
        let aligned: usize = src
            .iter()
            .map(|t| t.nbytes().div_ceil(PART_ALIGN) * PART_ALIGN)
            .sum();
        assert_eq!(
            block.len(),
            aligned,
            "one block holding every tensor, aligned"
        );
    }
    drop(pool);
}

#[test]
fn a_batch_pins_with_one_allocation() {
    let mut r = rng("a_batch_pins_with_one_allocation");
    let pool = pool();
    let batch = random_batch(&mut r);
    let before = pool.stats();
    let pinned = batch.pin_memory_in(&pool).unwrap();
    let after = pool.stats();
    assert_eq!(after.hits + after.misses - before.hits - before.misses, 1);
    drop(pinned);
}

#[test]
fn batches_built_in_place_hold_what_was_written() {
    let mut r = rng("batches_built_in_place_hold_what_was_written");
    let pool = pool();
    let (b, d) = (r.random_range(1..20), r.random_range(1..50));
    let rows: Vec<Vec<f32>> = (0..b)
        .map(|_| (0..d).map(|_| r.random()).collect())
        .collect();
    let labels: Vec<i64> = (0..b).map(|_| r.random()).collect();
    let sample = random_tensor(&mut r, DType::BF16, &[d, 3])
        .transpose(0, 1)
        .unwrap();

    let mut layout = BatchLayout::new();
    let x = layout.push(DType::F32, &[b, d]).unwrap();
    let y = layout.push(DType::I64, &[b]).unwrap();
    let z = layout.push(DType::BF16, &[3, d]).unwrap();
    let flags = layout.push(DType::Bool, &[b]).unwrap();
    let mut batch = layout.allocate_in(&pool).unwrap();
    for (row, src) in batch.view_mut(x).rows_mut().zip(&rows) {
        let mut row = row;
        row.copy_from_slice(src).unwrap();
    }
    batch.view_mut(y).copy_from_slice(&labels).unwrap();
    batch.view_mut(z).copy_from(&sample).unwrap();
    let out = batch.finish();
    assert_eq!(out.len(), 4);
    assert_eq!(out[x.index()].to_vec::<f32>().unwrap(), rows.concat());
    assert_eq!(out[y.index()].to_vec::<i64>().unwrap(), labels);
    assert_eq!(bytes_of(&out[z.index()]), bytes_of(&sample));
    assert_eq!(
        out[flags.index()].to_vec::<bool>().unwrap(),
        vec![false; b],
        "bools start false"
    );
    assert!(out.iter().all(|t| t.shares_block_with(&out[0])));
}

#[test]
fn pinned_constructors_hold_what_they_were_given() {
    let mut r = rng("pinned_constructors_hold_what_they_were_given");
    let shape = [r.random_range(1..9), r.random_range(1..9)];
    let n = shape[0] * shape[1];
    let values: Vec<i32> = (0..n).map(|_| r.random()).collect();

    let t = Tensor::pinned_from_iter(&shape, values.iter().copied()).unwrap();
    assert!(t.is_pinned());
    assert_eq!(t.to_vec::<i32>().unwrap(), values);
    let t = Tensor::pinned_from_fn(&shape, |i| values[i]).unwrap();
    assert_eq!(t.to_vec::<i32>().unwrap(), values);
    let t = Tensor::pinned_from_rows(&shape, |i, row: &mut [i32]| {
        row.copy_from_slice(&values[i * shape[1]..(i + 1) * shape[1]])
    })
    .unwrap();
    assert_eq!(t.to_vec::<i32>().unwrap(), values);
    for dtype in DType::ALL {
        let z = Tensor::zeros_pinned(dtype, &shape).unwrap();
        assert!(bytes_of(&z).iter().all(|&b| b == 0), "{dtype}");
        let mut e = Tensor::empty_pinned(dtype, &shape).unwrap();
        assert_eq!((e.dtype(), e.shape()), (dtype, &shape[..]));
        if dtype == DType::Bool {
            assert_eq!(e.to_vec::<bool>().unwrap(), vec![false; n]);
        }
        if dtype == DType::F64 {
            e.as_mut_slice::<f64>().unwrap().fill(2.5);
            assert_eq!(e.to_vec::<f64>().unwrap(), vec![2.5; n]);
        }
    }
}

#[test]
fn wrong_counts_and_dtypes_are_errors() {
    let short = Tensor::pinned_from_iter(&[2, 3], [1u8, 2, 3]);
    assert!(matches!(short, Err(Error::Shape(m)) if m.contains("holds 6 elements")));
    let long = Tensor::pinned_from_iter(&[2], [1u8, 2, 3]);
    assert!(matches!(long, Err(Error::Shape(m)) if m.contains("more")));
    let mut layout = BatchLayout::new();
    let s = layout.push(DType::F32, &[4]).unwrap();
    let mut batch = layout.allocate().unwrap();
    let err = batch.view_mut(s).as_mut_slice::<i64>().unwrap_err();
    assert!(matches!(err, Error::DTypeMismatch { .. }), "{err}");
    let err = batch.view_mut(s).copy_from_slice(&[1.0f32; 3]).unwrap_err();
    assert!(
        err.to_string().contains("3 elements into a view of 4"),
        "{err}"
    );
    let other = Tensor::from_vec(vec![0f32; 5], &[5]).unwrap();
    let err = batch.view_mut(s).copy_from(&other).unwrap_err();
    assert!(err.to_string().contains("shape [5]"), "{err}");
}

#[test]
fn one_remaining_tensor_keeps_the_block_until_dropped() {
    let mut r = rng("one_remaining_tensor_keeps_the_block_until_dropped");
    let pool = pool();
    let start = pool.stats().in_use_bytes;
    let batch = random_batch(&mut r);
    let expected = bytes_of(&batch.labels);
    let pinned = batch.pin_memory_in(&pool).unwrap();
    let held = pool.stats().in_use_bytes;
    assert!(held > start);
    let labels = pinned.labels.clone();
    drop(pinned);
    assert_eq!(
        pool.stats().in_use_bytes,
        held,
        "the whole block stays while a tensor lives"
    );
    assert_eq!(bytes_of(&labels), expected);
    drop(labels);
    assert_eq!(
        pool.stats().in_use_bytes,
        start,
        "the block went back with the last tensor"
    );
}

#[test]
fn copy_out_gets_a_block_of_its_own() {
    let mut r = rng("copy_out_gets_a_block_of_its_own");
    let pool = pool();
    let batch = random_batch(&mut r);
    let pinned = batch.pin_memory_in(&pool).unwrap();
    let own = pinned.labels.to_own_block().unwrap();
    assert!(own.is_pinned());
    assert!(!own.shares_block_with(&pinned.labels));
    assert_eq!(bytes_of(&own), bytes_of(&batch.labels));
    let labels_block = own.pinned_block().unwrap().len();
    assert_eq!(
        labels_block,
        batch.labels.nbytes(),
        "just the one tensor's bytes"
    );
}

#[test]
fn a_write_to_one_shared_tensor_does_not_change_another() {
    let mut r = rng("a_write_to_one_shared_tensor_does_not_change_another");
    let pool = pool();
    let batch = random_batch(&mut r);
    let mut pinned = batch.pin_memory_in(&pool).unwrap();
    let before: Vec<Vec<u8>> = tensors(&pinned).iter().map(|t| bytes_of(t)).collect();

    // In place: no clone shares the labels, so the write stays in the batch's block.
    let block = pinned.labels.pinned_block().unwrap().as_ptr();
    let fresh: Vec<i64> = (0..pinned.labels.numel()).map(|_| r.random()).collect();
    pinned
        .labels
        .as_mut_slice::<i64>()
        .unwrap()
        .copy_from_slice(&fresh);
    assert_eq!(
        pinned.labels.pinned_block().unwrap().as_ptr(),
        block,
        "written in place"
    );
    assert_eq!(pinned.labels.to_vec::<i64>().unwrap(), fresh);
    let after: Vec<Vec<u8>> = tensors(&pinned).iter().map(|t| bytes_of(t)).collect();
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        if i != 1 {
            assert_eq!(b, a, "tensor {i} changed when the labels were written");
        }
    }

    // Copy on write: a clone shares the images, so the write goes to a private copy.
    let kept = pinned.images.clone();
    let n = pinned.images.numel();
    pinned.images.as_mut_slice::<f32>().unwrap().fill(7.0);
    assert_eq!(bytes_of(&kept), before[0], "the clone was changed");
    assert_eq!(pinned.images.to_vec::<f32>().unwrap(), vec![7.0; n]);
    assert!(!pinned.images.shares_block_with(&kept));
}

#[test]
fn host_bytes_views_are_read_only_and_zero_copy() {
    let mut r = rng("host_bytes_views_are_read_only_and_zero_copy");
    let values: Vec<u8> = (0..64).map(|_| r.random()).collect();
    let owner = std::sync::Arc::new(values.clone());
    let mut t = Tensor::from_host_bytes(owner.clone(), DType::U16, &[4, 4], 32).unwrap();
    assert_eq!(bytes_of(&t), values[32..].to_vec());
    t.as_mut_slice::<u16>().unwrap().fill(1);
    assert_eq!(*owner, values, "the owner's bytes were written");
    let err = Tensor::from_host_bytes(owner.clone(), DType::U16, &[4, 5], 32).unwrap_err();
    assert!(err.to_string().contains("do not fit"), "{err}");
    let err = Tensor::from_host_bytes(owner, DType::U16, &[2], 3).unwrap_err();
    assert!(err.to_string().contains("multiple of 2"), "{err}");
    let pinned = t.pin_memory().unwrap();
    assert_eq!(pinned.to_vec::<u16>().unwrap(), vec![1; 16]);
}
