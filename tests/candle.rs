//! candle interop: host round trips keep values, shapes, strides and dtypes; dtypes one side
//! lacks fail clearly; candle tensors move with a batch (CPU targets here, the GPU with the
//! `candle-cuda` feature) and are consumed by candle's own ops on candle's stream.
#![cfg(feature = "candle")]

use candle_core as candle;
use pinnable::{DType, Error, Tensor};
#[cfg(feature = "candle-cuda")]
use pinnable::{Device, ToDevice};
#[cfg(feature = "candle-cuda")]
use pinnable_harness::random_tensor;
use pinnable_harness::{bytes_of, random_host_view, rng};
use rand::Rng;

/// The dtypes both sides have.
fn shared(d: DType) -> bool {
    !matches!(d, DType::Bool | DType::U16 | DType::U64 | DType::I8)
}

#[test]
fn every_shared_dtype_round_trips_through_candle_on_the_host() {
    let mut r = rng("every_shared_dtype_round_trips_through_candle_on_the_host");
    for _ in 0..10 {
        for dtype in DType::ALL {
            let t = random_host_view(&mut r, dtype);
            let c = match t.to_candle(&candle::Device::Cpu) {
                Ok(c) => c,
                Err(Error::Interop { library, message }) => {
                    assert!(!shared(dtype), "{dtype}: {message}");
                    assert_eq!(library, "candle");
                    assert!(message.contains(&dtype.to_string()), "{message}");
                    continue;
                }
                Err(e) => panic!("{dtype}: {e}"),
            };
            assert!(shared(dtype));
            assert_eq!(c.dims(), t.shape());
            let back = Tensor::from_candle(&c).unwrap();
            assert_eq!((back.dtype(), back.shape()), (dtype, t.shape()));
            assert!(back.is_contiguous());
            assert_eq!(bytes_of(&back), bytes_of(&t), "{dtype} {:?}", t.shape());
        }
    }
}

#[test]
fn candle_strided_views_are_gathered_by_the_one_copy() {
    let mut r = rng("candle_strided_views_are_gathered_by_the_one_copy");
    for _ in 0..20 {
        let dims = [
            r.random_range(1..6),
            r.random_range(2..7),
            r.random_range(1..5),
        ];
        let n: usize = dims.iter().product();
        let values: Vec<f32> = (0..n).map(|_| r.random()).collect();
        let c = candle::Tensor::from_vec(values, &dims[..], &candle::Device::Cpu).unwrap();
        let view = match r.random_range(0..3) {
            0 => c.transpose(0, 2).unwrap(),
            1 => c.narrow(1, 1, dims[1] - 1).unwrap(),
            _ => c.permute((1, 2, 0)).unwrap(),
        };
        let ours = Tensor::from_candle(&view).unwrap();
        assert_eq!(ours.shape(), view.dims());
        let expected = view.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(ours.to_vec::<f32>().unwrap(), expected);
    }
}

#[test]
fn candle_only_dtypes_fail_clearly() {
    let c = candle::Tensor::zeros(4, candle::DType::F8E4M3, &candle::Device::Cpu).unwrap();
    let e = Tensor::from_candle(&c).unwrap_err();
    assert!(
        matches!(&e, Error::Interop { message, .. } if message.contains("F8E4M3")),
        "{e}"
    );
}

#[test]
fn a_candle_write_waits_for_our_read_of_its_storage() {
    // `from_candle` copies under candle's read lock; candle's in-place writes take the write
    // lock, so a write racing the copy lands before or after it, never during.
    let mut r = rng("a_candle_write_waits_for_our_read_of_its_storage");
    let values: Vec<f32> = (0..1 << 20).map(|_| r.random()).collect();
    let c = candle::Tensor::from_vec(values.clone(), values.len(), &candle::Device::Cpu).unwrap();
    let writer = {
        let c = c.clone();
        std::thread::spawn(move || {
            for _ in 0..20 {
                c.zero_set().unwrap();
            }
        })
    };
    for _ in 0..20 {
        let got = Tensor::from_candle(&c).unwrap().to_vec::<f32>().unwrap();
        assert!(
            got == values || got.iter().all(|&x| x == 0.0),
            "a copy saw a half-written tensor"
        );
    }
    writer.join().unwrap();
}

// `ToDevice` for candle tensors comes with candle's CUDA backend.
#[cfg(feature = "candle-cuda")]
#[derive(ToDevice)]
struct Batch {
    images: candle::Tensor,
    labels: candle::Tensor,
    extra: Vec<candle::Tensor>,
    ours: Tensor,
}

#[cfg(feature = "candle-cuda")]
/// A batch of candle CPU tensors with fresh random values, and the values.
fn random_batch(r: &mut impl Rng) -> (Batch, Vec<f32>, Vec<i64>) {
    let b = r.random_range(1..9);
    let dims = (b, 3, r.random_range(1..17), r.random_range(1..17));
    let n = dims.0 * dims.1 * dims.2 * dims.3;
    let images: Vec<f32> = (0..n).map(|_| r.random()).collect();
    let labels: Vec<i64> = (0..b).map(|_| r.random()).collect();
    let cpu = &candle::Device::Cpu;
    let extra = (0..r.random_range(0..4))
        .map(|i| {
            let len = r.random_range(0..100);
            match i % 3 {
                0 => candle::Tensor::from_vec(
                    (0..len).map(|_| r.random::<u32>()).collect(),
                    len,
                    cpu,
                ),
                1 => candle::Tensor::from_vec(
                    (0..len).map(|_| r.random::<f64>()).collect(),
                    len,
                    cpu,
                ),
                _ => candle::Tensor::from_vec(
                    (0..len).map(|_| half::bf16::from_f32(r.random())).collect(),
                    len,
                    cpu,
                ),
            }
            .unwrap()
        })
        .collect();
    let batch = Batch {
        images: candle::Tensor::from_vec(images.clone(), dims, cpu).unwrap(),
        labels: candle::Tensor::from_vec(labels.clone(), b, cpu).unwrap(),
        extra,
        ours: random_tensor(r, DType::F32, &[b, 2]),
    };
    (batch, images, labels)
}

#[cfg(feature = "candle-cuda")]
fn same(a: &candle::Tensor, b: &candle::Tensor) -> bool {
    let bytes = |t: &candle::Tensor| {
        Tensor::from_candle(&t.to_device(&candle::Device::Cpu).unwrap())
            .map(|t| bytes_of(&t))
            .unwrap()
    };
    a.dims() == b.dims() && a.dtype() == b.dtype() && bytes(a) == bytes(b)
}

#[cfg(feature = "candle-cuda")]
#[test]
fn a_batch_with_candle_fields_moves_to_the_host_unchanged() {
    let mut r = rng("a_batch_with_candle_fields_moves_to_the_host_unchanged");
    for _ in 0..20 {
        let (batch, ..) = random_batch(&mut r);
        let moved = batch.to_device(&Device::cpu(), true).unwrap();
        assert!(same(&moved.images, &batch.images));
        assert!(same(&moved.labels, &batch.labels));
        assert_eq!(moved.extra.len(), batch.extra.len());
        for (a, b) in moved.extra.iter().zip(&batch.extra) {
            assert!(same(a, b));
        }
        assert_eq!(bytes_of(&moved.ours), bytes_of(&batch.ours));
    }
}

#[cfg(feature = "candle-cuda")]
mod gpu {
    use super::*;
    use pinnable_harness::cuda_or_skip;

    fn candle_device(test: &str) -> Option<(candle::Device, Device)> {
        cuda_or_skip(test)?;
        let c = candle::Device::new_cuda(0).expect("candle's CUDA device");
        let ours = Device::from_candle(&c).expect("our device from candle's");
        Some((c, ours))
    }

    #[test]
    fn candle_batches_moved_without_blocking_feed_candle_ops_on_its_stream() {
        let test = "candle_batches_moved_without_blocking_feed_candle_ops_on_its_stream";
        let Some((cdev, dev)) = candle_device(test) else {
            return;
        };
        let mut r = rng(test);
        for _ in 0..200 {
            let (batch, images, labels) = random_batch(&mut r);
            let extra_before: Vec<Tensor> = batch
                .extra
                .iter()
                .map(|t| Tensor::from_candle(t).unwrap())
                .collect();
            let moved = batch.to_device(&dev, true).unwrap();
            // The sources are overwritten right away; the copies must not see it.
            batch.images.zero_set().unwrap();
            batch.labels.zero_set().unwrap();
            for t in &batch.extra {
                t.zero_set().unwrap();
            }
            assert!(moved.images.device().same_device(&cdev));
            // Consumed at once by candle's own kernels, on candle's stream.
            let doubled = moved.images.affine(2.0, 1.0).unwrap();
            let twice = (&moved.labels + &moved.labels).unwrap();
            let got = doubled.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let want: Vec<f32> = images.iter().map(|&x| 2.0 * x + 1.0).collect();
            assert_eq!(got, want);
            let got = twice.to_vec1::<i64>().unwrap();
            let want: Vec<i64> = labels.iter().map(|&x| x.wrapping_add(x)).collect();
            assert_eq!(got, want);
            for (t, before) in moved.extra.iter().zip(&extra_before) {
                assert!(t.device().same_device(&cdev));
                let back = Tensor::from_candle(&t.to_device(&candle::Device::Cpu).unwrap());
                assert_eq!(bytes_of(&back.unwrap()), bytes_of(before));
            }
            assert_eq!(moved.ours.device(), dev);
        }
    }

    #[test]
    fn device_tensors_cross_both_ways_ordered_against_candles_own_writes() {
        let test = "device_tensors_cross_both_ways_ordered_against_candles_own_writes";
        let Some((cdev, dev)) = candle_device(test) else {
            return;
        };
        let mut r = rng(test);
        for _ in 0..20 {
            let rows = r.random_range(1..50);
            let t = random_tensor(&mut r, DType::F32, &[rows, 7]);
            let host = t.to_vec::<f32>().unwrap();
            // One tensor moved by itself owns its allocation: handed over.
            let alone = t.to_device(&dev, true).unwrap();
            let c = alone.into_candle(&cdev).unwrap();
            assert_eq!(c.flatten_all().unwrap().to_vec1::<f32>().unwrap(), host);
            // A tensor of a batch shares the batch's allocation: copied, and still ours.
            let pair = vec![t.clone(), t.clone()].to_device(&dev, true).unwrap();
            let c = pair[1].to_candle(&cdev).unwrap();
            assert_eq!(c.flatten_all().unwrap().to_vec1::<f32>().unwrap(), host);
            assert_eq!(
                pair[1].to_cpu(false).unwrap().to_vec::<f32>().unwrap(),
                host
            );
            // A host tensor goes straight into candle's memory.
            let c = t.to_candle(&cdev).unwrap();
            assert_eq!(c.flatten_all().unwrap().to_vec1::<f32>().unwrap(), host);
            // candle's device memory, copied on candle's stream: candle's in-place write
            // queued right after the import does not reach our copy, and the copy is ours.
            let c2 = c.affine(1.0, 0.5).unwrap();
            let mut ours = Tensor::from_candle(&c2).unwrap();
            let zeros = c2.zeros_like().unwrap();
            c2.slice_set(&zeros, 0, 0).unwrap();
            let want: Vec<f32> = host.iter().map(|&x| x + 0.5).collect();
            assert_eq!(ours.to_cpu(false).unwrap().to_vec::<f32>().unwrap(), want);
            assert!(
                c2.flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
                    .iter()
                    .all(|&x| x == 0.0),
                "candle's own write landed"
            );
            let stream = dev.copy_stream().unwrap().clone();
            assert!(
                ours.cuda_view_mut::<f32>(&stream).is_ok(),
                "the copy is ours to write"
            );
        }
    }

    #[test]
    fn candle_tensors_need_a_device_made_from_candles() {
        let test = "candle_tensors_need_a_device_made_from_candles";
        let Some((_, _)) = candle_device(test) else {
            return;
        };
        let (batch, ..) = random_batch(&mut rng(test));
        let plain = Device::cuda(0).unwrap();
        match batch.to_device(&plain, true) {
            Err(Error::Interop { message, .. }) => {
                assert!(message.contains("Device::from_candle"), "{message}")
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("moved to a device candle does not know"),
        }
    }
}
