//! DLPack: exports of host and device tensors, imports of other producers' tensors (host
//! without a copy; device on a GPU), the deleter contract and the errors.
#![cfg(feature = "dlpack")]

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use pinnable::interop::dlpack::ffi::{
    self, DLDataType, DLDevice, DLManagedTensorVersioned, DLTensor,
};
use pinnable::interop::dlpack::{DlpackTensor, from_dl_dtype, to_dl_dtype};
use pinnable::{DType, Pinnable, Tensor, ToDevice};
use pinnable_harness::{bytes_of, cuda_or_skip, random_host_view, random_tensor, rng};
use rand::Rng;

/// A producer of our own for import tests: owns its bytes, shape and strides, and counts
/// deleter calls.
struct Producer {
    managed: DLManagedTensorVersioned,
    _data: Vec<u64>,
    _shape: Vec<i64>,
    _strides: Option<Vec<i64>>,
    deleted: Arc<AtomicUsize>,
}

unsafe extern "C" fn producer_deleter(m: *mut DLManagedTensorVersioned) {
    // SAFETY: `manager_ctx` is the boxed producer, rebuilt once.
    let p = unsafe { Box::from_raw((*m).manager_ctx.cast::<Producer>()) };
    p.deleted.fetch_add(1, Ordering::SeqCst);
}

struct Spec {
    bytes: Vec<u8>,
    byte_offset: u64,
    dtype: DLDataType,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    device_type: i32,
    major: u32,
}

/// A foreign DLPack tensor over a copy of `spec.bytes` (8-byte aligned), and its deleter count.
fn produce(spec: Spec) -> (DlpackTensor, Arc<AtomicUsize>) {
    let (dl, deleted) = try_produce(spec);
    (dl.unwrap(), deleted)
}

/// As `produce`, with the result of taking the tensor in.
fn try_produce(spec: Spec) -> (pinnable::Result<DlpackTensor>, Arc<AtomicUsize>) {
    let mut data = vec![0u64; spec.bytes.len().div_ceil(8) + 1];
    // SAFETY: `data` has at least `bytes.len()` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(
            spec.bytes.as_ptr(),
            data.as_mut_ptr().cast(),
            spec.bytes.len(),
        )
    };
    let deleted = Arc::new(AtomicUsize::new(0));
    let mut shape = spec.shape;
    let mut strides = spec.strides;
    let p = Box::new(Producer {
        managed: DLManagedTensorVersioned {
            version: ffi::DLPackVersion {
                major: spec.major,
                minor: 1,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(producer_deleter),
            flags: 0,
            dl_tensor: DLTensor {
                data: data.as_mut_ptr().cast::<c_void>(),
                device: DLDevice {
                    device_type: spec.device_type,
                    device_id: 0,
                },
                ndim: shape.len() as i32,
                dtype: spec.dtype,
                shape: shape.as_mut_ptr(),
                strides: strides
                    .as_mut()
                    .map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()),
                byte_offset: spec.byte_offset,
            },
        },
        _data: data,
        _shape: shape,
        _strides: strides,
        deleted: deleted.clone(),
    });
    let p = Box::into_raw(p);
    // SAFETY: `p` is live; the deleter frees it; nothing writes the data.
    let dl = unsafe {
        (*p).managed.manager_ctx = p.cast();
        DlpackTensor::from_raw_versioned(&raw mut (*p).managed)
    };
    (dl, deleted)
}

fn spec(bytes: Vec<u8>, dtype: DType, shape: &[i64]) -> Spec {
    Spec {
        bytes,
        byte_offset: 0,
        dtype: to_dl_dtype(dtype),
        shape: shape.to_vec(),
        strides: None,
        device_type: ffi::KDL_CPU,
        major: 1,
    }
}

#[test]
fn every_dtype_maps_both_ways() {
    for dtype in DType::ALL {
        let dl = to_dl_dtype(dtype);
        assert_eq!(dl.lanes, 1);
        assert_eq!(dl.bits as usize, dtype.size() * 8);
        assert_eq!(from_dl_dtype(dl).unwrap(), dtype);
    }
    assert_eq!(to_dl_dtype(DType::BF16).code, ffi::KDL_BFLOAT);
    assert_eq!(to_dl_dtype(DType::Bool).code, ffi::KDL_BOOL);
}

#[test]
fn host_exports_share_memory_and_round_trip_every_dtype() {
    let mut r = rng("host_exports_share_memory_and_round_trip_every_dtype");
    for _ in 0..10 {
        for dtype in DType::ALL {
            let t = random_host_view(&mut r, dtype);
            let dl = t.to_dlpack().unwrap();
            assert_eq!(
                dl.version(),
                Some(ffi::DLPackVersion { major: 1, minor: 0 })
            );
            assert_eq!(dl.flags(), ffi::FLAG_READ_ONLY);
            assert_eq!(
                dl.device(),
                DLDevice {
                    device_type: ffi::KDL_CPU,
                    device_id: 0
                }
            );
            assert_eq!(dl.dl_tensor().dtype, to_dl_dtype(dtype));
            let as_i64 = |v: &[usize]| v.iter().map(|&x| x as i64).collect::<Vec<_>>();
            assert_eq!(dl.shape(), as_i64(t.shape()));
            assert_eq!(dl.strides().unwrap(), as_i64(t.strides()));
            assert_eq!(dl.dl_tensor().byte_offset, 0);
            let data = dl.dl_tensor().data;
            let back = Tensor::from_dlpack(dl).unwrap();
            assert_eq!(
                (back.dtype(), back.shape(), back.strides()),
                (dtype, t.shape(), t.strides())
            );
            assert_eq!(bytes_of(&back), bytes_of(&t));
            if t.numel() > 0 {
                // The same memory: the import reads the export's first element.
                let first = back.to_dlpack().unwrap().dl_tensor().data;
                assert_eq!(first, data);
            }
        }
    }
}

#[test]
fn exports_keep_the_tensor_alive_in_both_forms() {
    let mut r = rng("exports_keep_the_tensor_alive_in_both_forms");
    let t = random_tensor(&mut r, DType::F32, &[5, 7])
        .narrow(1, 2, 4)
        .unwrap();
    let expected = t.to_vec::<f32>().unwrap();
    let legacy = t.to_dlpack().unwrap().into_raw_legacy().unwrap();
    drop(t);
    // SAFETY: an export of ours, handed back once, unwritten.
    let back =
        Tensor::from_dlpack(unsafe { DlpackTensor::from_raw_legacy(legacy).unwrap() }).unwrap();
    assert_eq!(back.to_vec::<f32>().unwrap(), expected);
    assert_eq!(back.strides(), &[7, 1]);
}

#[test]
fn host_imports_are_zero_copy_views_and_call_the_deleter_once() {
    let mut r = rng("host_imports_are_zero_copy_views_and_call_the_deleter_once");
    let (a, b) = (r.random_range(2..9), r.random_range(2..9));
    let values: Vec<i32> = (0..a * b).map(|_| r.random()).collect();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    // Column-major, 4 bytes in.
    let mut padded = vec![0u8; 4];
    padded.extend_from_slice(&bytes);
    let (dl, deleted) = produce(Spec {
        byte_offset: 4,
        strides: Some(vec![1, a as i64]),
        ..spec(padded, DType::I32, &[a as i64, b as i64])
    });
    let t = Tensor::from_dlpack(dl).unwrap();
    assert_eq!((t.shape(), t.strides()), (&[a, b][..], &[1, a][..]));
    let mut expected = Vec::new();
    for i in 0..a {
        for j in 0..b {
            expected.push(values[j * a + i]);
        }
    }
    assert_eq!(t.to_vec::<i32>().unwrap(), expected);
    let view = t.transpose(0, 1).unwrap();
    assert!(view.is_contiguous());
    assert_eq!(view.as_slice::<i32>().unwrap(), &values[..]);

    // Pinning copies out; a write goes to a private copy; the producer keeps its bytes.
    let pinned = t.pin_memory().unwrap();
    assert_eq!(pinned.to_vec::<i32>().unwrap(), expected);
    let mut w = view.clone();
    w.as_mut_slice::<i32>().unwrap()[0] ^= 1;
    assert_eq!(view.as_slice::<i32>().unwrap(), &values[..]);

    drop(t);
    drop(w);
    assert_eq!(
        deleted.load(Ordering::SeqCst),
        0,
        "a view still holds the memory"
    );
    drop(view);
    assert_eq!(deleted.load(Ordering::SeqCst), 1);
    drop(pinned);
    assert_eq!(deleted.load(Ordering::SeqCst), 1);
}

#[test]
fn empty_and_rank_zero_imports() {
    let (dl, deleted) = produce(spec(vec![], DType::F64, &[0, 3]));
    let t = Tensor::from_dlpack(dl).unwrap();
    assert_eq!(
        (t.shape(), t.dtype(), t.numel()),
        (&[0usize, 3][..], DType::F64, 0)
    );
    assert_eq!(
        deleted.load(Ordering::SeqCst),
        1,
        "nothing to keep: returned at once"
    );
    let (dl, _) = produce(spec(7.5f32.to_ne_bytes().to_vec(), DType::F32, &[]));
    let t = Tensor::from_dlpack(dl).unwrap();
    assert_eq!((t.rank(), t.to_vec::<f32>().unwrap()), (0, vec![7.5]));
}

/// Imports `s` and returns the error message, checking that the deleter ran.
fn import_error(s: Spec) -> String {
    let (dl, deleted) = produce(s);
    let err = Tensor::from_dlpack(dl).unwrap_err().to_string();
    assert_eq!(
        deleted.load(Ordering::SeqCst),
        1,
        "the deleter runs on errors too: {err}"
    );
    err
}

#[test]
fn unsupported_imports_are_clear_errors_and_return_the_memory() {
    let complex = Spec {
        dtype: DLDataType {
            code: ffi::KDL_COMPLEX,
            bits: 64,
            lanes: 1,
        },
        ..spec(vec![0; 16], DType::F32, &[2])
    };
    assert_eq!(
        import_error(complex),
        "dlpack: 64-bit complex elements (type code 5) have no dtype here"
    );
    let fp8 = Spec {
        dtype: DLDataType {
            code: 10,
            bits: 8,
            lanes: 1,
        },
        ..spec(vec![0; 4], DType::U8, &[4])
    };
    assert_eq!(
        import_error(fp8),
        "dlpack: 8-bit fp8/fp6/fp4 elements (type code 10) have no dtype here"
    );
    let lanes = Spec {
        dtype: DLDataType {
            code: ffi::KDL_FLOAT,
            bits: 32,
            lanes: 4,
        },
        ..spec(vec![0; 32], DType::F32, &[2])
    };
    assert_eq!(
        import_error(lanes),
        "dlpack: vector elements (4 lanes of 32 bits) have no dtype here; only scalars do"
    );
    let negative = Spec {
        strides: Some(vec![-1]),
        ..spec(vec![0; 12], DType::I32, &[3])
    };
    assert_eq!(
        import_error(negative),
        "dlpack: negative strides [-1] are not supported; make the tensor contiguous on the \
         producer's side first"
    );
    let opencl = Spec {
        device_type: 4,
        ..spec(vec![0; 4], DType::U8, &[4])
    };
    assert_eq!(
        import_error(opencl),
        "dlpack: device type 4 is not supported; only CPU (1), CUDA (2) and CUDA host (3) \
         memory can be imported"
    );
    let misaligned = Spec {
        byte_offset: 2,
        ..spec(vec![0; 12], DType::F32, &[2])
    };
    assert!(import_error(misaligned).contains("is not aligned to 4 bytes"));
    let bools = spec(vec![0, 1, 2], DType::Bool, &[3]);
    assert_eq!(import_error(bools), "dlpack: bool elements must be 0 or 1");
    let negative_size = spec(vec![0; 4], DType::U8, &[-4]);
    assert_eq!(import_error(negative_size), "dlpack: negative size in [-4]");
}

#[test]
fn another_major_version_is_refused_when_taken_in_and_returned() {
    let v2 = Spec {
        major: 2,
        ..spec(vec![0; 4], DType::U8, &[4])
    };
    let (dl, deleted) = try_produce(v2);
    assert_eq!(
        dl.unwrap_err().to_string(),
        "dlpack: DLPack 2.1 is not supported; only 1.x is"
    );
    assert_eq!(deleted.load(Ordering::SeqCst), 1);
}

#[test]
fn legacy_foreign_tensors_cannot_change_form() {
    let (dl, deleted) = produce(spec(vec![1, 2, 3], DType::U8, &[3]));
    let err = dl.into_raw_legacy().unwrap_err();
    assert_eq!(
        err.to_string(),
        "dlpack: a versioned DLManagedTensorVersioned from another library has no legacy form"
    );
    assert_eq!(deleted.load(Ordering::SeqCst), 1);
}

#[test]
fn device_exports_wait_for_the_copy_and_device_imports_share_memory() {
    let Some(dev) =
        cuda_or_skip("device_exports_wait_for_the_copy_and_device_imports_share_memory")
    else {
        return;
    };
    let mut r = rng("device_exports_wait_for_the_copy_and_device_imports_share_memory");
    let consumer = dev.cuda_context().unwrap().new_stream().unwrap();
    for _ in 0..20 {
        let n = r.random_range(1..100_000);
        let src = random_tensor(&mut r, DType::F32, &[n])
            .pin_memory()
            .unwrap();
        pinnable_harness::hold_stream(dev.copy_stream().unwrap(), 10);
        let on = src.to_device(&dev, true).unwrap();
        let dl = on.to_dlpack_on(&consumer).unwrap();
        assert_eq!(
            dl.device(),
            DLDevice {
                device_type: ffi::KDL_CUDA,
                device_id: 0
            }
        );
        // The consumer reads the raw pointer on its stream: it must see the copied values.
        let ptr = dl.dl_tensor().data as u64;
        let mut host = vec![0f32; n];
        // SAFETY: `ptr` addresses `n` f32 of device memory the export keeps alive.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(&mut host, ptr, consumer.cu_stream())
                .unwrap();
        }
        consumer.synchronize().unwrap();
        assert_eq!(host, src.to_vec::<f32>().unwrap());
        // Import it back: the same device memory, readable by our own copies.
        let back = Tensor::from_dlpack(dl).unwrap();
        assert_eq!(back.placement(), pinnable::Placement::Cuda(0));
        assert_eq!(back.to_cpu(false).unwrap().to_vec::<f32>().unwrap(), host);
        let again = back.to_dlpack_on(&consumer).unwrap();
        assert_eq!(again.dl_tensor().data as u64, ptr, "no device copy");
    }
}

#[test]
fn our_own_export_comes_back_as_the_same_storage() {
    let mut r = rng("our_own_export_comes_back_as_the_same_storage");
    let n = r.random_range(1..64);
    let t = random_tensor(&mut r, DType::I32, &[n])
        .pin_memory()
        .unwrap();
    let before = t.to_vec::<i32>().unwrap();
    let back = Tensor::from_dlpack(t.to_dlpack().unwrap()).unwrap();
    assert!(
        back.shares_storage_with(&t),
        "a second storage over the same bytes"
    );
    // So a write through either goes to a private copy and never reaches the other.
    let mut back = back;
    back.as_mut_slice::<i32>().unwrap().fill(-1);
    assert_eq!(
        t.to_vec::<i32>().unwrap(),
        before,
        "the write reached the original"
    );
    assert!(back.to_vec::<i32>().unwrap().iter().all(|&v| v == -1));
}

#[test]
fn foreign_device_memory_is_read_only_and_device_bools_are_refused() {
    let Some(dev) = cuda_or_skip("foreign_device_memory_is_read_only_and_device_bools_are_refused")
    else {
        return;
    };
    let mut r = rng("foreign_device_memory_is_read_only_and_device_bools_are_refused");
    let n = r.random_range(1..1000);
    let src = random_tensor(&mut r, DType::F32, &[n]);
    let on = src.to_device(&dev, false).unwrap();
    // Through the raw form, as a foreign producer hands it over: no longer known as ours.
    let copy = dev.copy_stream().unwrap();
    let raw = on.to_dlpack_on(copy).unwrap().into_raw_versioned().unwrap();
    // SAFETY: `raw` came from `into_raw_versioned` just above and nothing writes its data.
    let mut imported =
        Tensor::from_dlpack(unsafe { DlpackTensor::from_raw_versioned(raw) }.unwrap()).unwrap();
    let stream = dev.cuda_context().unwrap().new_stream().unwrap();
    let err = imported
        .cuda_view_mut::<f32>(&stream)
        .map(|_| ())
        .unwrap_err();
    assert!(err.to_string().contains("another library owns"), "{err}");
    assert_eq!(bytes_of(&imported.to_cpu(false).unwrap()), bytes_of(&src));

    let flags = random_tensor(&mut r, DType::Bool, &[16])
        .to_device(&dev, false)
        .unwrap();
    let raw = flags
        .to_dlpack_on(copy)
        .unwrap()
        .into_raw_versioned()
        .unwrap();
    // SAFETY: as above.
    let err =
        Tensor::from_dlpack(unsafe { DlpackTensor::from_raw_versioned(raw) }.unwrap()).unwrap_err();
    assert!(
        err.to_string().contains("bool tensors on a CUDA device"),
        "{err}"
    );
}
