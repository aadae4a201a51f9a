//! burn interop: round trips through `TensorData` keep values, shapes and dtypes; contiguous
//! tensors are shared without a copy; burn-only dtypes convert or fail clearly.
#![cfg(feature = "burn")]

use burn_tensor::{BoolStore, DType as BurnDType, TensorData};
use pinnable::interop::burn::{from_burn_dtype, to_burn_dtype};
use pinnable::{DType, Pinnable, Tensor};
use pinnable_harness::{bytes_of, random_host_view, random_tensor, rng};
use rand::Rng;

#[test]
fn every_dtype_round_trips_pageable_pinned_and_strided() {
    let mut r = rng("every_dtype_round_trips_pageable_pinned_and_strided");
    for _ in 0..10 {
        for dtype in DType::ALL {
            let t = random_host_view(&mut r, dtype);
            let data = t.to_tensor_data().unwrap();
            assert_eq!(data.dtype(), to_burn_dtype(dtype));
            assert_eq!(data.shape().as_slice(), t.shape());
            assert_eq!(data.as_bytes(), bytes_of(&t).as_slice(), "row-major bytes");
            let back = Tensor::from_tensor_data(data).unwrap();
            assert_eq!((back.dtype(), back.shape()), (dtype, t.shape()));
            assert!(back.is_contiguous());
            assert_eq!(bytes_of(&back), bytes_of(&t));
        }
    }
}

#[test]
fn contiguous_tensors_and_aligned_data_cross_without_a_copy() {
    let mut r = rng("contiguous_tensors_and_aligned_data_cross_without_a_copy");
    let t = random_tensor(&mut r, DType::F32, &[8, 16])
        .pin_memory()
        .unwrap();
    let data = TensorData::try_from(&t).unwrap();
    assert_eq!(
        data.as_bytes().as_ptr(),
        t.as_slice::<f32>().unwrap().as_ptr().cast()
    );

    let values: Vec<i64> = (0..r.random_range(1..100)).map(|_| r.random()).collect();
    let given = values.clone();
    let ptr = given.as_ptr();
    let n = values.len();
    let t = Tensor::try_from(TensorData::new(given, [n])).unwrap();
    assert_eq!(t.as_slice::<i64>().unwrap().as_ptr(), ptr);
    assert_eq!(t.to_vec::<i64>().unwrap(), values);
}

#[test]
fn burn_writes_never_reach_the_tensor() {
    let mut r = rng("burn_writes_never_reach_the_tensor");
    let t = random_tensor(&mut r, DType::F64, &[32]);
    let before = t.to_vec::<f64>().unwrap();
    let mut data = t.to_tensor_data().unwrap();
    data.as_mut_slice::<f64>().unwrap().fill(-1.0);
    assert_eq!(t.to_vec::<f64>().unwrap(), before);
    assert!(data.as_slice::<f64>().unwrap().iter().all(|&x| x == -1.0));
}

#[test]
fn burn_only_dtypes_convert_or_fail_clearly() {
    let mut r = rng("burn_only_dtypes_convert_or_fail_clearly");
    let bools: Vec<bool> = (0..20).map(|_| r.random()).collect();

    let words: Vec<u8> = bools
        .iter()
        .flat_map(|&b| (b as u32).to_ne_bytes())
        .collect();
    let as_u32 =
        TensorData::try_from_bytes_vec(words, [4, 5], BurnDType::Bool(BoolStore::U32)).unwrap();
    let t = Tensor::from_tensor_data(as_u32).unwrap();
    assert_eq!((t.dtype(), t.shape()), (DType::Bool, &[4usize, 5][..]));
    assert_eq!(t.to_vec::<bool>().unwrap(), bools);

    let bytes: Vec<u8> = bools.iter().map(|&b| b as u8).collect();
    let as_u8 =
        TensorData::try_from_bytes_vec(bytes, [20], BurnDType::Bool(BoolStore::U8)).unwrap();
    assert_eq!(
        Tensor::from_tensor_data(as_u8)
            .unwrap()
            .to_vec::<bool>()
            .unwrap(),
        bools
    );

    let bad =
        TensorData::try_from_bytes_vec(vec![0, 1, 7], [3], BurnDType::Bool(BoolStore::U8)).unwrap();
    assert_eq!(
        Tensor::from_tensor_data(bad).unwrap_err().to_string(),
        "burn: bool elements must be 0 or 1"
    );

    let x: f32 = r.random();
    let flex =
        TensorData::try_from_bytes_vec(x.to_ne_bytes().to_vec(), [1], BurnDType::Flex32).unwrap();
    assert_eq!(
        Tensor::from_tensor_data(flex)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![x]
    );

    let q = BurnDType::QFloat(Default::default());
    let err = from_burn_dtype(q).unwrap_err().to_string();
    assert!(err.starts_with("burn: QFloat("), "{err}");
    assert!(
        err.ends_with("has no dtype here; dequantize or convert it on burn's side first"),
        "{err}"
    );
}

#[test]
fn device_tensors_are_refused_with_a_clear_error() {
    let Some(device) =
        pinnable_harness::cuda_or_skip("device_tensors_are_refused_with_a_clear_error")
    else {
        return;
    };
    let t = Tensor::from_vec(vec![1u8; 4], &[4]).unwrap();
    let on = pinnable::ToDevice::to_device(&t, &device, false).unwrap();
    assert_eq!(
        on.to_tensor_data().unwrap_err().to_string(),
        "`to_tensor_data` needs a host tensor (move it with `to_cpu` first), but the tensor is on cuda:0"
    );
}

#[test]
fn burn_tensors_of_host_tensors_keep_values_and_float_or_int_dtypes() {
    use burn_tensor::{Device, Int};
    use pinnable::interop::burn::{to_burn_float, to_burn_int};

    let mut r = rng("burn_tensors_of_host_tensors_keep_values_and_float_or_int_dtypes");
    let device = Device::default();
    let shape = [r.random_range(1..9), r.random_range(1..9), 3];
    for pinned in [false, true] {
        let pin = |t: Tensor| if pinned { t.pin_memory().unwrap() } else { t };
        let x = pin(random_tensor(&mut r, DType::F32, &shape));
        let b: burn_tensor::Tensor<3> = to_burn_float(&x, &device).unwrap();
        assert_eq!(b.dims(), shape);
        assert_eq!(b.dtype(), BurnDType::F32);
        assert_eq!(
            b.to_data().try_to_vec::<f32>().unwrap(),
            x.to_vec::<f32>().unwrap()
        );

        let y = pin(random_tensor(&mut r, DType::I32, &shape[..1]));
        let b: burn_tensor::Tensor<1, Int> = to_burn_int(&y, &device).unwrap();
        assert_eq!(b.dtype(), BurnDType::I32, "an int dtype is kept");
        assert_eq!(
            b.to_data().try_to_vec::<i32>().unwrap(),
            y.to_vec::<i32>().unwrap()
        );

        // u8 pixels as floats: converted by burn to its float dtype, values kept.
        let p = pin(random_tensor(&mut r, DType::U8, &shape));
        let b: burn_tensor::Tensor<3> = to_burn_float(&p, &device).unwrap();
        let expected: Vec<f32> = p
            .to_vec::<u8>()
            .unwrap()
            .iter()
            .map(|&v| f32::from(v))
            .collect();
        assert_eq!(
            b.to_data().convert::<f32>().try_to_vec::<f32>().unwrap(),
            expected
        );
    }
}

#[test]
fn burn_tensors_of_the_wrong_rank_are_an_error_not_a_panic() {
    use pinnable::interop::burn::{to_burn_float, to_burn_int};

    let mut r = rng("burn_tensors_of_the_wrong_rank_are_an_error_not_a_panic");
    let device = burn_tensor::Device::default();
    let rows = r.random_range(1..5);
    let t = random_tensor(&mut r, DType::F32, &[rows, 4]);
    let e = to_burn_float::<3>(&t, &device).unwrap_err().to_string();
    assert!(
        e.contains("to_burn_float::<3>") && e.contains("2 dimensions"),
        "{e}"
    );
    let e = to_burn_int::<1>(&t, &device).unwrap_err().to_string();
    assert!(
        e.contains("to_burn_int::<1>") && e.contains("reshape"),
        "{e}"
    );
}

#[test]
fn burns_cpu_backend_reads_a_contiguous_tensor_in_place() {
    use pinnable::interop::burn::to_burn_float;

    let mut r = rng("burns_cpu_backend_reads_a_contiguous_tensor_in_place");
    let shape = [r.random_range(1..64), 3, 8, 8];
    let t = random_tensor(&mut r, DType::F32, &shape)
        .pin_memory()
        .unwrap();
    let ours = t.as_slice::<f32>().unwrap().as_ptr();
    let b: burn_tensor::Tensor<4> = to_burn_float(&t, &burn_tensor::Device::flex()).unwrap();
    let data = b.into_data();
    assert_eq!(
        data.as_bytes().as_ptr(),
        ours.cast(),
        "no copy on either side"
    );
    assert_eq!(
        data.as_slice::<f32>().unwrap(),
        t.as_slice::<f32>().unwrap()
    );
}
