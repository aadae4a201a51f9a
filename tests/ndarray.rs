//! ndarray interop: zero-copy views of host tensors (pageable, pinned, strided), writable views
//! under the copy-on-write rule, tensors from owned arrays, and the errors.
#![cfg(feature = "ndarray")]

use ndarray::{Array, ArrayD, Axis, IxDyn, ShapeBuilder, s};
use pinnable::{BatchLayout, DType, Pinnable, Tensor};
use pinnable_harness::{random_tensor, rng};
use rand::Rng;

/// Every element of `t` read through `as_array` equals `to_vec`'s, in the same order.
macro_rules! assert_view_matches {
    ($t:expr, $ty:ty) => {{
        let t = &$t;
        let view = t.as_array::<$ty>().unwrap();
        assert_eq!(view.shape(), t.shape());
        let strides: Vec<usize> = view.strides().iter().map(|&s| s as usize).collect();
        for (&d, (&a, &b)) in t.shape().iter().zip(strides.iter().zip(t.strides())) {
            assert!(d <= 1 || a == b, "strides {strides:?} vs {:?}", t.strides());
        }
        assert_eq!(
            view.iter().copied().collect::<Vec<$ty>>(),
            t.to_vec::<$ty>().unwrap()
        );
    }};
}

fn random_shape(r: &mut impl Rng) -> Vec<usize> {
    (0..r.random_range(1..5))
        .map(|_| r.random_range(1..7))
        .collect()
}

#[test]
fn as_array_views_every_dtype_without_a_copy() {
    let mut r = rng("as_array_views_every_dtype_without_a_copy");
    for _ in 0..20 {
        for dtype in DType::ALL {
            let shape = random_shape(&mut r);
            let t = random_tensor(&mut r, dtype, &shape);
            let pinned = t.pin_memory().unwrap();
            for t in [&t, &pinned] {
                match dtype {
                    DType::Bool => assert_view_matches!(t, bool),
                    DType::U8 => assert_view_matches!(t, u8),
                    DType::U16 => assert_view_matches!(t, u16),
                    DType::U32 => assert_view_matches!(t, u32),
                    DType::U64 => assert_view_matches!(t, u64),
                    DType::I8 => assert_view_matches!(t, i8),
                    DType::I16 => assert_view_matches!(t, i16),
                    DType::I32 => assert_view_matches!(t, i32),
                    DType::I64 => assert_view_matches!(t, i64),
                    DType::F16 => assert_view_matches!(t, half::f16),
                    DType::BF16 => assert_view_matches!(t, half::bf16),
                    DType::F32 => assert_view_matches!(t, f32),
                    DType::F64 => assert_view_matches!(t, f64),
                    other => panic!("no case for {other}"),
                }
            }
            if dtype == DType::F64 {
                // Zero-copy: the view's first element is the tensor's.
                let v = pinned.as_array::<f64>().unwrap();
                let s = pinned.as_slice::<f64>().unwrap();
                assert_eq!(v.as_ptr(), s.as_ptr());
            }
        }
    }
}

#[test]
fn as_array_of_strided_views_keeps_their_strides() {
    let mut r = rng("as_array_of_strided_views_keeps_their_strides");
    for _ in 0..50 {
        let shape = [
            r.random_range(2..6),
            r.random_range(2..6),
            r.random_range(2..6),
        ];
        let base = random_tensor(&mut r, DType::F32, &shape);
        let base = if r.random_bool(0.5) {
            base.pin_memory().unwrap()
        } else {
            base
        };
        let (d0, d1) = (r.random_range(0..3), r.random_range(0..3));
        let t = base.transpose(d0, d1).unwrap();
        let dim = r.random_range(0..3);
        let start = r.random_range(0..t.shape()[dim]);
        let t = t.narrow(dim, start, t.shape()[dim] - start).unwrap();
        let view = t.as_array::<f32>().unwrap();
        let expected: Vec<isize> = t.strides().iter().map(|&s| s as isize).collect();
        for (i, (&d, (&a, &b))) in t
            .shape()
            .iter()
            .zip(view.strides().iter().zip(&expected))
            .enumerate()
        {
            assert!(
                d <= 1 || a == b,
                "dim {i}: {:?} vs {expected:?}",
                view.strides()
            );
        }
        // The same elements as ndarray's own view of the same operations.
        let a = base.as_array::<f32>().unwrap();
        let mut a = a.view();
        a.swap_axes(d0, d1);
        let a = a.slice_axis(Axis(dim), (start..).into());
        assert_eq!(view, a);
    }
}

#[test]
fn as_array_mut_writes_in_place_when_unique() {
    let mut r = rng("as_array_mut_writes_in_place_when_unique");
    for pinned in [false, true] {
        let shape = random_shape(&mut r);
        let mut t = random_tensor(&mut r, DType::I32, &shape);
        if pinned {
            t = t.pin_memory().unwrap();
        }
        let before = t.as_slice::<i32>().unwrap().as_ptr();
        let values: Vec<i32> = (0..t.numel()).map(|_| r.random()).collect();
        t.as_array_mut::<i32>()
            .unwrap()
            .iter_mut()
            .zip(&values)
            .for_each(|(x, v)| *x = *v);
        assert_eq!(
            t.as_slice::<i32>().unwrap().as_ptr(),
            before,
            "wrote in place"
        );
        assert_eq!(t.to_vec::<i32>().unwrap(), values);
        assert_eq!(t.is_pinned(), pinned);
    }
}

#[test]
fn as_array_mut_of_a_unique_strided_view_writes_through_its_strides() {
    let mut r = rng("as_array_mut_of_a_unique_strided_view_writes_through_its_strides");
    let (a, b) = (r.random_range(2..8), r.random_range(2..8));
    let mut t = random_tensor(&mut r, DType::F64, &[a, b])
        .transpose(0, 1)
        .unwrap();
    let col = r.random_range(0..a);
    let v: f64 = r.random();
    t.as_array_mut::<f64>()
        .unwrap()
        .index_axis_mut(Axis(1), col)
        .fill(v);
    assert_eq!(t.strides(), &[1, b], "kept its strides: no copy");
    let back = t.transpose(0, 1).unwrap();
    assert!(back.is_contiguous());
    let rows = back.as_array::<f64>().unwrap();
    assert!(rows.index_axis(Axis(0), col).iter().all(|&x| x == v));
}

#[test]
fn as_array_mut_of_a_shared_tensor_writes_a_private_copy() {
    let mut r = rng("as_array_mut_of_a_shared_tensor_writes_a_private_copy");
    for pinned in [false, true] {
        let shape = random_shape(&mut r);
        let mut t = random_tensor(&mut r, DType::U16, &shape);
        if pinned {
            t = t.pin_memory().unwrap();
        }
        let other = t.clone();
        let original = other.to_vec::<u16>().unwrap();
        t.as_array_mut::<u16>().unwrap().fill(7);
        assert_eq!(
            other.to_vec::<u16>().unwrap(),
            original,
            "the clone is untouched"
        );
        assert!(t.to_vec::<u16>().unwrap().iter().all(|&x| x == 7));
        assert!(!t.shares_storage_with(&other));
        assert_eq!(
            t.is_pinned(),
            pinned,
            "the copy stays in the same kind of memory"
        );
    }
}

#[test]
fn from_array_takes_the_allocation_over_in_any_axis_order() {
    let mut r = rng("from_array_takes_the_allocation_over_in_any_axis_order");
    for _ in 0..30 {
        let shape = random_shape(&mut r);
        let n: usize = shape.iter().product();
        let data: Vec<i64> = (0..n).map(|_| r.random()).collect();
        let fortran = r.random_bool(0.5);
        let a = if fortran {
            Array::from_shape_vec(IxDyn(&shape).f(), data).unwrap()
        } else {
            Array::from_shape_vec(IxDyn(&shape), data).unwrap()
        };
        let mut a = a;
        if shape.len() >= 2 && r.random_bool(0.5) {
            a.swap_axes(0, shape.len() - 1);
        }
        let ptr = a.as_ptr();
        let expected = a.clone();
        let t = Tensor::from_array(a);
        assert_eq!(t.dtype(), DType::I64);
        assert_eq!(t.shape(), expected.shape());
        let view = t.as_array::<i64>().unwrap();
        assert_eq!(view.as_ptr(), ptr, "no copy");
        assert_eq!(view, expected.view());
        assert_eq!(
            t.to_vec::<i64>().unwrap(),
            expected.iter().copied().collect::<Vec<_>>()
        );
    }
}

#[test]
fn from_array_copies_slices_and_negative_strides() {
    let mut r = rng("from_array_copies_slices_and_negative_strides");
    let (a, b) = (r.random_range(3..9), r.random_range(3..9));
    let full = ArrayD::from_shape_fn(IxDyn(&[a, b]), |_| r.random::<f32>());

    let sliced = full.slice(s![1.., ..;2]).to_owned().into_dyn(); // to_owned: a fresh, full allocation
    let t = Tensor::from_array(sliced.clone());
    assert_eq!(t.as_array::<f32>().unwrap(), sliced.view());

    let mut part = full.clone();
    part.slice_collapse(s![1.., ..]); // a slice of a larger allocation
    let t = Tensor::from_array(part.clone());
    assert!(t.is_contiguous());
    assert_eq!(t.as_array::<f32>().unwrap(), part.view());

    let mut flipped = full.clone();
    flipped.invert_axis(Axis(1)); // a negative stride
    let t: Tensor = flipped.clone().into();
    assert!(t.is_contiguous());
    assert_eq!(t.as_array::<f32>().unwrap(), flipped.view());

    let empty = ArrayD::<bool>::from_shape_vec(IxDyn(&[0, 3]), vec![]).unwrap();
    let t = Tensor::from_array(empty);
    assert_eq!((t.shape(), t.dtype()), (&[0usize, 3][..], DType::Bool));
    assert_eq!(t.as_array::<bool>().unwrap().len(), 0);
}

#[test]
fn arrays_round_trip_through_tensors_and_pinning() {
    let mut r = rng("arrays_round_trip_through_tensors_and_pinning");
    for _ in 0..20 {
        let shape = random_shape(&mut r);
        let a = ArrayD::from_shape_fn(IxDyn(&shape), |_| half::bf16::from_f32(r.random()));
        let pinned = Tensor::from_array(a.clone()).pin_memory().unwrap();
        assert!(pinned.is_pinned());
        assert_eq!(pinned.as_array::<half::bf16>().unwrap(), a.view());
        assert_eq!(pinned.as_array::<half::bf16>().unwrap().to_owned(), a);
    }
}

#[test]
fn tensor_mut_builds_samples_with_ndarray_in_pinned_memory() {
    let mut r = rng("tensor_mut_builds_samples_with_ndarray_in_pinned_memory");
    let (n, h, w) = (
        r.random_range(1..6),
        r.random_range(1..9),
        r.random_range(1..9),
    );
    let samples: Vec<ArrayD<f32>> = (0..n)
        .map(|_| ArrayD::from_shape_fn(IxDyn(&[h, w]), |_| r.random()))
        .collect();
    let mut layout = BatchLayout::new();
    let images = layout.push(DType::F32, &[n, h, w]).unwrap();
    let labels = layout.push(DType::I64, &[n]).unwrap();
    let mut batch = layout.allocate().unwrap();
    for (mut row, sample) in batch.view_mut(images).rows_mut().zip(&samples) {
        row.as_array_mut::<f32>().unwrap().assign(sample);
    }
    let mut lv = batch.view_mut(labels);
    let mut la = lv.as_array_mut::<i64>().unwrap();
    la.iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = i as i64 * 3);
    let tensors = batch.finish();
    assert!(tensors[0].is_pinned() && tensors[0].shares_block_with(&tensors[1]));
    let got = tensors[0].as_array::<f32>().unwrap();
    for (i, sample) in samples.iter().enumerate() {
        assert_eq!(got.index_axis(Axis(0), i), sample.view());
    }
    assert_eq!(
        tensors[1].to_vec::<i64>().unwrap(),
        (0..n as i64).map(|i| i * 3).collect::<Vec<_>>()
    );
}

#[test]
fn wrong_dtype_is_a_clear_error() {
    let mut t = Tensor::from_vec(vec![1i64, 2, 3], &[3]).unwrap();
    let err = t.as_array::<f32>().unwrap_err();
    assert_eq!(
        err.to_string(),
        "dtype mismatch: the tensor holds i64, not f32"
    );
    let err = t.as_array_mut::<i32>().unwrap_err();
    assert_eq!(
        err.to_string(),
        "dtype mismatch: the tensor holds i64, not i32"
    );

    let mut layout = BatchLayout::new();
    let slot = layout.push(DType::U8, &[4]).unwrap();
    let mut batch = layout.allocate().unwrap();
    let err = batch.view_mut(slot).as_array_mut::<i8>().unwrap_err();
    assert_eq!(
        err.to_string(),
        "dtype mismatch: the tensor holds u8, not i8"
    );
}

#[test]
fn device_tensors_are_refused_with_a_clear_error() {
    let Some(device) =
        pinnable_harness::cuda_or_skip("device_tensors_are_refused_with_a_clear_error")
    else {
        return;
    };
    let t = Tensor::from_vec(vec![1.0f32; 8], &[2, 4]).unwrap();
    let mut on_gpu = pinnable::ToDevice::to_device(&t, &device, true).unwrap();
    let err = on_gpu.as_array::<f32>().unwrap_err();
    assert_eq!(
        err.to_string(),
        "`as_array` needs a host tensor (move it with `to_cpu` first), but the tensor is on cuda:0"
    );
    let err = on_gpu.as_array_mut::<f32>().unwrap_err();
    assert!(
        err.to_string()
            .starts_with("`as_array_mut` needs a host tensor"),
        "{err}"
    );
}
