//! DLPack, both ways, without a copy: a pinned batch tensor (and a transposed view of it) is
//! exported as a `DLManagedTensorVersioned` — what PyTorch's `torch.from_dlpack`, JAX, CuPy
//! or NumPy take — whose data pointer is the tensor's own memory; handed over raw and taken
//! back, it is the same storage with the same values (the legacy, unversioned form too). On a
//! GPU the same round trip runs on device memory, exported for the stream its consumer works
//! on, so the consumer's kernels wait for the copy without the host blocking (else the GPU
//! part prints `skipped:`).
//!
//!     cargo run --example dlpack_roundtrip --features dlpack
//!
//! With `PINNABLE_REQUIRE_GPU=1` a missing GPU is a failure.

use pinnable::interop::dlpack::{DlpackTensor, ffi, from_dl_dtype};
use pinnable::{DType, Pinnable, Placement, Tensor, ToDevice};
use rand::Rng;

fn main() -> pinnable::Result<()> {
    let mut r = pinnable_harness::rng("dlpack_roundtrip");
    let values: Vec<f32> = (0..8 * 16).map(|_| r.random()).collect();
    let batch = Tensor::from_vec(values.clone(), &[8, 16])?.pin_memory()?;
    let at = batch.as_slice::<f32>()?.as_ptr();

    // Host: the export describes the tensor's own memory (a view keeps its strides).
    for t in [batch.clone(), batch.transpose(0, 1)?] {
        let dl = t.to_dlpack()?;
        let d = dl.dl_tensor();
        assert_eq!(dl.device().device_type, ffi::KDL_CPU);
        assert_eq!(from_dl_dtype(d.dtype)?, DType::F32);
        assert_eq!((d.data as *const f32, d.byte_offset), (at, 0), "no copy");
        assert_ne!(dl.flags() & ffi::FLAG_READ_ONLY, 0);
        println!(
            "exported {:?} strides {:?} at the tensor's own address, read-only",
            dl.shape(),
            dl.strides().unwrap_or(&[])
        );
        // Handed over raw, as a consumer takes it (a Python capsule holds this pointer), and
        // taken back as another library's tensor: a tensor over the same memory.
        let raw = dl.into_raw_versioned()?;
        // SAFETY: `raw` came from `into_raw_versioned` just above, is handed over once, and
        // nothing writes its data.
        let back = Tensor::from_dlpack(unsafe { DlpackTensor::from_raw_versioned(raw)? })?;
        assert_eq!(
            back.to_dlpack()?.dl_tensor().data as *const f32,
            at,
            "no copy"
        );
        assert_eq!(back.to_vec::<f32>()?, t.to_vec::<f32>()?);
        // Handed over within Rust, it comes back as the tensor it was.
        assert!(Tensor::from_dlpack(t.to_dlpack()?)?.shares_storage_with(&batch));
    }
    let raw = batch.to_dlpack()?.into_raw_legacy()?;
    // SAFETY: as above, for the legacy form.
    let back = Tensor::from_dlpack(unsafe { DlpackTensor::from_raw_legacy(raw)? })?;
    assert_eq!(back.to_vec::<f32>()?, values);
    println!("host: versioned and legacy round trips give back the same memory and values");

    // GPU: device memory, exported for a stream.
    let Some(device) = pinnable_harness::cuda_or_skip("dlpack_roundtrip: device memory") else {
        return Ok(());
    };
    let on = batch.to_device(&device, true)?; // the copy may still be running
    // Imported back here, the consumer is the device's copy stream (a foreign consumer names
    // its own; Python's `__dlpack__(stream=…)` passes it).
    let stream = device
        .copy_stream()
        .expect("a CUDA device has a copy stream");
    let dl = on.to_dlpack_on(stream)?;
    assert_eq!(dl.device().device_type, ffi::KDL_CUDA);
    let ptr = dl.dl_tensor().data;
    let raw = dl.into_raw_versioned()?;
    // SAFETY: as above; the memory is device memory of `device`, alive until the deleter.
    let back = Tensor::from_dlpack(unsafe { DlpackTensor::from_raw_versioned(raw)? })?;
    assert_eq!(
        back.placement(),
        Placement::Cuda(device.ordinal().unwrap_or(0))
    );
    assert_eq!(back.to_cpu(false)?.to_vec::<f32>()?, values);
    assert_eq!(
        back.to_dlpack_on(stream)?.dl_tensor().data,
        ptr,
        "no device copy"
    );
    println!("{device}: exported for a stream and imported back: same device memory, same values");
    Ok(())
}
