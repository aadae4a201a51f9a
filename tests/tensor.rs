//! The tensor type: construction, views, reads and copy-on-write, on fresh random data.

use pinnable::{DType, Error, Placement, Tensor};
use pinnable_harness::{bytes_of, random_tensor, rng};
use rand::Rng;

#[test]
fn from_vec_round_trips_every_dtype() {
    let mut r = rng("from_vec_round_trips_every_dtype");
    for dtype in DType::ALL {
        let shape = [r.random_range(1..5), r.random_range(1..7)];
        let t = random_tensor(&mut r, dtype, &shape);
        assert_eq!(t.dtype(), dtype);
        assert_eq!(t.shape(), &shape);
        assert_eq!(bytes_of(&t).len(), shape[0] * shape[1] * dtype.size());
        assert_eq!(t.placement(), Placement::Pageable);
        assert!(t.is_contiguous());
    }
}

#[test]
fn wrong_shape_is_an_error_not_a_panic() {
    let err = Tensor::from_vec(vec![1.0f32; 5], &[2, 3]).unwrap_err();
    assert!(matches!(err, Error::Shape(_)), "{err}");
    assert_eq!(
        err.to_string(),
        "invalid shape: shape [2, 3] holds 6 elements but 5 were given"
    );
    let err = Tensor::from_vec(vec![0u8; 0], &[usize::MAX, 3]).unwrap_err();
    assert!(err.to_string().contains("overflows"), "{err}");
}

#[test]
fn dtype_mismatch_is_an_error() {
    let t = Tensor::from_vec(vec![1i64, 2], &[2]).unwrap();
    let err = t.to_vec::<f32>().unwrap_err();
    assert_eq!(
        err.to_string(),
        "dtype mismatch: the tensor holds i64, not f32"
    );
}

#[test]
fn transpose_and_narrow_read_the_right_elements() {
    let mut r = rng("transpose_and_narrow_read_the_right_elements");
    for _ in 0..50 {
        let (a, b, c) = (
            r.random_range(1..6),
            r.random_range(1..6),
            r.random_range(1..6),
        );
        let data: Vec<i32> = (0..a * b * c).map(|_| r.random()).collect();
        let t = Tensor::from_vec(data.clone(), &[a, b, c]).unwrap();
        let at = |i: usize, j: usize, k: usize| data[(i * b + j) * c + k];

        let tt = t.transpose(0, 2).unwrap();
        assert_eq!(tt.shape(), &[c, b, a]);
        let mut expected = Vec::new();
        for k in 0..c {
            for j in 0..b {
                for i in 0..a {
                    expected.push(at(i, j, k));
                }
            }
        }
        assert_eq!(tt.to_vec::<i32>().unwrap(), expected);

        let start = r.random_range(0..b);
        let len = r.random_range(0..=b - start);
        let n = t.narrow(1, start, len).unwrap();
        let mut expected = Vec::new();
        for i in 0..a {
            for j in start..start + len {
                for k in 0..c {
                    expected.push(at(i, j, k));
                }
            }
        }
        assert_eq!(n.to_vec::<i32>().unwrap(), expected);
        assert!(n.shares_storage_with(&t));
    }
}

#[test]
fn out_of_range_views_are_errors() {
    let t = Tensor::from_vec(vec![0u8; 6], &[2, 3]).unwrap();
    assert!(t.transpose(0, 2).is_err());
    assert!(t.narrow(1, 2, 2).is_err());
    assert!(t.narrow(2, 0, 1).is_err());
    assert!(t.narrow(1, usize::MAX, 2).is_err());
}

#[test]
fn as_mut_slice_on_shared_storage_copies_first() {
    let mut r = rng("as_mut_slice_on_shared_storage_copies_first");
    let data: Vec<f32> = (0..64).map(|_| r.random()).collect();
    let original = Tensor::from_vec(data.clone(), &[8, 8]).unwrap();
    let mut view = original.transpose(0, 1).unwrap();
    let expected_t = view.to_vec::<f32>().unwrap();
    view.as_mut_slice::<f32>().unwrap()[0] = 42.0;
    assert!(!view.shares_storage_with(&original));
    assert!(view.is_contiguous());
    assert_eq!(
        original.to_vec::<f32>().unwrap(),
        data,
        "the source never sees the write"
    );
    let got = view.to_vec::<f32>().unwrap();
    assert_eq!(got[0], 42.0);
    assert_eq!(got[1..], expected_t[1..]);
}

#[test]
fn as_mut_slice_on_unique_storage_writes_in_place() {
    let mut t = Tensor::from_vec(vec![1u16, 2, 3], &[3]).unwrap();
    t.as_mut_slice::<u16>().unwrap()[1] = 9;
    assert_eq!(t.to_vec::<u16>().unwrap(), vec![1, 9, 3]);
}

#[test]
fn zero_size_tensors_work() {
    let t = Tensor::from_vec(Vec::<f64>::new(), &[0, 4]).unwrap();
    assert_eq!(t.numel(), 0);
    assert_eq!(t.to_vec::<f64>().unwrap(), Vec::<f64>::new());
    assert!(
        t.transpose(0, 1)
            .unwrap()
            .to_vec::<f64>()
            .unwrap()
            .is_empty()
    );
}

#[test]
fn reshape_needs_contiguous_data() {
    let t = Tensor::from_vec((0..12).collect::<Vec<i64>>(), &[3, 4]).unwrap();
    assert_eq!(
        t.reshape(&[4, 3]).unwrap().to_vec::<i64>().unwrap(),
        (0..12).collect::<Vec<_>>()
    );
    assert!(t.transpose(0, 1).unwrap().reshape(&[12]).is_err());
    assert!(t.reshape(&[5]).is_err());
}
