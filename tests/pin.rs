//! `pin_memory()` through the std container impls, over the page-locked backend.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use pinnable::{DType, Error, PinContext, Pinnable, Placement, Tensor, Walk};
use pinnable::{TensorMeta, dense_cpu};
use pinnable_harness::{bytes_of, random_tensor, rng};
use rand::Rng;

fn random_shape(r: &mut impl Rng) -> Vec<usize> {
    (0..r.random_range(0..4))
        .map(|_| r.random_range(0..6))
        .collect()
}

fn assert_pinned_copy(src: &Tensor, pinned: &Tensor) {
    assert!(pinned.is_pinned(), "{pinned:?} is not pinned");
    assert!(!src.is_pinned(), "the source was changed");
    assert_eq!(pinned.dtype(), src.dtype());
    assert_eq!(pinned.shape(), src.shape());
    assert_eq!(bytes_of(pinned), bytes_of(src));
}

#[test]
fn every_dtype_pins_i64_included() {
    let mut r = rng("every_dtype_pins_i64_included");
    for dtype in DType::ALL {
        let shape = random_shape(&mut r);
        let t = random_tensor(&mut r, dtype, &shape);
        let p = t.pin_memory().unwrap();
        assert_pinned_copy(&t, &p);
        assert!(p.is_contiguous());
    }
}

#[test]
fn non_contiguous_views_pin_as_contiguous_copies() {
    let mut r = rng("non_contiguous_views_pin_as_contiguous_copies");
    for _ in 0..30 {
        let shape = [
            r.random_range(1..9),
            r.random_range(1..9),
            r.random_range(1..9),
        ];
        let t = random_tensor(&mut r, DType::F32, &shape);
        let start = r.random_range(0..shape[1]);
        let view = t
            .transpose(0, 2)
            .unwrap()
            .narrow(1, start, shape[1] - start)
            .unwrap();
        let p = view.pin_memory().unwrap();
        assert!(p.is_contiguous());
        assert_pinned_copy(&view, &p);
    }
}

#[test]
fn already_pinned_tensors_are_shared_not_copied() {
    let mut r = rng("already_pinned_tensors_are_shared_not_copied");
    let t = random_tensor(&mut r, DType::U8, &[1000]);
    let p = t.pin_memory().unwrap();
    let again = p.pin_memory().unwrap();
    assert!(again.shares_storage_with(&p));
}

#[test]
fn zero_size_tensors_pin() {
    let t = Tensor::from_vec(Vec::<i64>::new(), &[0, 3]).unwrap();
    let p = t.pin_memory().unwrap();
    assert!(p.is_pinned());
    assert_eq!(p.shape(), &[0, 3]);
    assert!(p.to_vec::<i64>().unwrap().is_empty());
}

#[test]
fn std_containers_round_trip_values_exactly() {
    let mut r = rng("std_containers_round_trip_values_exactly");
    let mut t = || {
        let dtype = DType::ALL[r.random_range(0..DType::ALL.len())];
        let shape = random_shape(&mut r);
        random_tensor(&mut r, dtype, &shape)
    };
    type Batch = (
        Option<Vec<Tensor>>,
        HashMap<String, Tensor>,
        BTreeMap<u32, Box<Tensor>>,
        VecDeque<[Tensor; 2]>,
        Arc<(Tensor, String, f32)>,
        Option<Tensor>,
    );
    let batch: Batch = (
        Some(vec![t(), t(), t()]),
        HashMap::from([("a".to_string(), t()), ("b".to_string(), t())]),
        BTreeMap::from([(7, Box::new(t()))]),
        VecDeque::from([[t(), t()]]),
        Arc::new((t(), "plain".to_string(), 0.5)),
        None,
    );
    let p = batch.pin_memory().unwrap();
    for (a, b) in batch.0.as_ref().unwrap().iter().zip(p.0.as_ref().unwrap()) {
        assert_pinned_copy(a, b);
    }
    for (k, v) in &batch.1 {
        assert_pinned_copy(v, &p.1[k]);
    }
    assert_pinned_copy(&batch.2[&7], &p.2[&7]);
    for (a, b) in batch.3[0].iter().zip(&p.3[0]) {
        assert_pinned_copy(a, b);
    }
    assert_pinned_copy(&batch.4.0, &p.4.0);
    assert_eq!(p.4.1, "plain");
    assert_eq!(p.4.2, 0.5);
    assert!(p.5.is_none());
}

/// A library author's tensor that lives on a device: the dense-CPU check must refuse it.
#[derive(Clone)]
struct OnDevice(DType);

impl TensorMeta for OnDevice {
    fn dtype_name(&self) -> String {
        self.0.name().into()
    }
    fn placement(&self) -> Placement {
        Placement::Cuda(0)
    }
}

impl Pinnable for OnDevice {
    fn pin_with(&self, cx: &mut PinContext<'_>) -> pinnable::Result<Self> {
        dense_cpu(self, cx.path())?;
        Ok(self.clone())
    }
}

#[test]
fn pin_rejects_device_tensor_with_container_path() {
    let batch = HashMap::from([(
        "mask".to_string(),
        vec![None, Some((OnDevice(DType::F32), OnDevice(DType::I64)))],
    )]);
    let err = PinContext::run(pinnable::PinnedPool::global(), |cx| {
        cx.root("batch", |cx| batch.pin_with(cx))
    })
    .err()
    .unwrap();
    assert!(matches!(err, Error::NotDenseCpu { .. }));
    assert_eq!(
        err.to_string(),
        r#"cannot pin `batch["mask"][1].0` (f32 tensor on cuda:0): only dense CPU tensors can be pinned"#
    );
}

#[test]
fn a_failed_pin_loses_nothing() {
    let mut r = rng("a_failed_pin_loses_nothing");
    let good = random_tensor(&mut r, DType::F32, &[64]);
    let before = bytes_of(&good);
    let batch = (good.clone(), OnDevice(DType::U8));
    assert!(batch.pin_memory().is_err());
    assert!(!batch.0.is_pinned());
    assert_eq!(bytes_of(&batch.0), before);
}

#[test]
fn large_batches_pin_through_parallel_copies() {
    let mut r = rng("large_batches_pin_through_parallel_copies");
    let batch: Vec<Tensor> = (0..24)
        .map(|_| random_tensor(&mut r, DType::F32, &[256, 1024]))
        .collect();
    let strided = random_tensor(&mut r, DType::I16, &[512, 2048])
        .transpose(0, 1)
        .unwrap();
    let p = (batch.clone(), strided.clone()).pin_memory().unwrap();
    for (a, b) in batch.iter().zip(&p.0) {
        assert_pinned_copy(a, b);
    }
    assert_pinned_copy(&strided, &p.1);
}

#[test]
fn cuda_is_unavailable_here_without_panicking() {
    if pinnable::Device::is_available() {
        println!("skipped: cuda_is_unavailable_here_without_panicking: a CUDA device is present");
        return;
    }
    assert_eq!(pinnable::Device::count(), 0);
    let reason = pinnable::Device::unavailable_reason().unwrap();
    let err = pinnable::Device::cuda(0).unwrap_err();
    assert!(matches!(err, Error::CudaUnavailable { .. }));
    assert_eq!(
        err.to_string(),
        format!(
            "CUDA is unavailable: {reason}; to run without a GPU, use `Device::cpu()` \
             (batches stay pinned in host memory)"
        )
    );
    // Moving host data to the host shares it and needs no driver.
    let t = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    assert!(
        pinnable::ToDevice::to_cpu(&t, true)
            .unwrap()
            .shares_storage_with(&t)
    );
}
