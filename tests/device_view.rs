//! Writable device views: ordering against the copy that fills the tensor and the readers
//! after the write, and the uniqueness rule. Every test skips (printing `skipped: …`) without a
//! GPU, and fails instead under `PINNABLE_REQUIRE_GPU=1`.

use std::sync::{Mutex, MutexGuard};

use pinnable::{DType, Error, Pinnable, Tensor, ToDevice};
use pinnable_harness::{cuda_or_skip, hold_stream, random_tensor, rng};
use rand::Rng;

/// Some tests hold a stream on purpose to race a copy; they run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn cuda_view_mut_writes_in_place_after_the_copy_and_before_later_readers() {
    let _serial = serial();
    let Some(dev) =
        cuda_or_skip("cuda_view_mut_writes_in_place_after_the_copy_and_before_later_readers")
    else {
        return;
    };
    let mut r = rng("cuda_view_mut_writes_in_place_after_the_copy_and_before_later_readers");
    let stream = dev.cuda_context().unwrap().new_stream().unwrap();
    let copy = dev.copy_stream().unwrap().clone();
    for _ in 0..20 {
        let n = r.random_range(1..200_000);
        let src = random_tensor(&mut r, DType::F32, &[n])
            .pin_memory()
            .unwrap();
        let new: Vec<f32> = (0..n).map(|_| r.random()).collect();
        let new_on = stream.clone_htod(&new).unwrap();
        // Keep the copy in flight, so the write must wait for it ...
        hold_stream(&copy, 20);
        let mut on = src.to_device(&dev, true).unwrap();
        {
            let mut view = on.cuda_view_mut::<f32>(&stream).unwrap();
            assert_eq!(view.len(), n);
            // ... and the write itself late (a device copy: the call does not wait for it), so
            // the read below must wait for it.
            hold_stream(&stream, 20);
            view.copy_from(&new_on).unwrap();
        }
        let back = on.to_cpu(true).unwrap();
        assert_eq!(back.to_vec::<f32>().unwrap(), new);
        // A read-only view on a third stream sees the write too.
        let other = dev.cuda_context().unwrap().new_stream().unwrap();
        let view = on.cuda_view::<f32>(&other).unwrap();
        assert_eq!(view.to_vec().unwrap(), new);
    }
}

#[test]
fn cuda_view_mut_waits_for_readers_of_the_old_values() {
    let _serial = serial();
    let Some(dev) = cuda_or_skip("cuda_view_mut_waits_for_readers_of_the_old_values") else {
        return;
    };
    let mut r = rng("cuda_view_mut_waits_for_readers_of_the_old_values");
    let stream = dev.cuda_context().unwrap().new_stream().unwrap();
    let copy = dev.copy_stream().unwrap().clone();
    for _ in 0..10 {
        let n = r.random_range(1..100_000);
        let src = random_tensor(&mut r, DType::I32, &[n]);
        let mut on = src.to_device(&dev, false).unwrap();
        hold_stream(&copy, 20);
        let back = on.to_cpu(true).unwrap(); // reads the old values, late
        {
            let mut view = on.cuda_view_mut::<i32>(&stream).unwrap();
            view.fill_zeros().unwrap();
        }
        assert_eq!(back.to_vec::<i32>().unwrap(), src.to_vec::<i32>().unwrap());
        assert!(
            on.to_cpu(false)
                .unwrap()
                .to_vec::<i32>()
                .unwrap()
                .iter()
                .all(|&x| x == 0)
        );
    }
}

#[test]
fn cuda_view_mut_refuses_shared_strided_host_and_mistyped_tensors() {
    let _serial = serial();
    let Some(dev) = cuda_or_skip("cuda_view_mut_refuses_shared_strided_host_and_mistyped_tensors")
    else {
        return;
    };
    let stream = dev.cuda_context().unwrap().new_stream().unwrap();
    let mut on = Tensor::from_vec(vec![1.5f32; 12], &[3, 4])
        .unwrap()
        .to_device(&dev, true)
        .unwrap();

    let clone = on.clone();
    let err = on.cuda_view_mut::<f32>(&stream).err().unwrap();
    assert!(matches!(err, Error::Shared { tensors: 2, .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "`cuda_view_mut` writes in place, but 2 tensors share this cuda:0 tensor's storage \
         (clones or views of it); drop the others first, or write into a tensor of its own"
    );
    drop(clone);

    let err = on.cuda_view_mut::<i32>(&stream).err().unwrap();
    assert_eq!(
        err.to_string(),
        "dtype mismatch: the tensor holds f32, not i32"
    );

    let mut strided = on.transpose(0, 1).unwrap();
    drop(on);
    let err = strided.cuda_view_mut::<f32>(&stream).err().unwrap();
    assert_eq!(
        err.to_string(),
        "invalid shape: cuda_view_mut needs a contiguous tensor; this view is strided"
    );

    let mut host = Tensor::from_vec(vec![1u8; 3], &[3]).unwrap();
    let err = host.cuda_view_mut::<u8>(&stream).err().unwrap();
    assert_eq!(
        err.to_string(),
        "`cuda_view_mut` needs a CUDA tensor (move it with `to_device` first), but the tensor is on cpu"
    );
}

#[test]
fn a_leaked_writable_view_still_orders_later_reads_after_its_writes() {
    let _serial = serial();
    let test = "a_leaked_writable_view_still_orders_later_reads_after_its_writes";
    let Some(dev) = cuda_or_skip(test) else {
        return;
    };
    let mut r = rng(test);
    let stream = dev.cuda_context().unwrap().new_stream().unwrap();
    for _ in 0..5 {
        let n = r.random_range(1..100_000);
        let mut on = random_tensor(&mut r, DType::F32, &[n])
            .to_device(&dev, false)
            .unwrap();
        let new: Vec<f32> = (0..n).map(|_| r.random()).collect();
        let new_on = stream.clone_htod(&new).unwrap();
        let mut view = on.cuda_view_mut::<f32>(&stream).unwrap();
        // The write runs late; the view is leaked (safe code), so its drop never records it.
        hold_stream(&stream, 50);
        view.copy_from(&new_on).unwrap();
        std::mem::forget(view);
        // The read must still come after the write.
        assert_eq!(on.to_cpu(false).unwrap().to_vec::<f32>().unwrap(), new);
        let other = dev.cuda_context().unwrap().new_stream().unwrap();
        let view = on.cuda_view::<f32>(&other).unwrap();
        assert_eq!(view.to_vec().unwrap(), new);
    }
}

#[test]
fn a_leaked_read_view_still_orders_later_writes_after_its_reads() {
    let _serial = serial();
    let test = "a_leaked_read_view_still_orders_later_writes_after_its_reads";
    let Some(dev) = cuda_or_skip(test) else {
        return;
    };
    let mut r = rng(test);
    let ctx = dev.cuda_context().unwrap();
    let (reader, writer) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    for _ in 0..5 {
        let n = r.random_range(1..100_000);
        let host = random_tensor(&mut r, DType::F32, &[n]);
        let mut on = host.to_device(&dev, false).unwrap();
        let mut seen = reader.alloc_zeros::<f32>(n).unwrap();
        let view = on.cuda_view::<f32>(&reader).unwrap();
        // The read runs late; the view is leaked, so its drop never records it.
        hold_stream(&reader, 50);
        view.copy_to(&mut seen).unwrap();
        std::mem::forget(view);
        // The overwrite must still wait for that read.
        {
            let mut w = on.cuda_view_mut::<f32>(&writer).unwrap();
            w.fill_zeros().unwrap();
        }
        assert_eq!(
            reader.clone_dtoh(&seen).unwrap(),
            host.to_vec::<f32>().unwrap()
        );
        assert!(
            on.to_cpu(false)
                .unwrap()
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .all(|&x| x == 0.0)
        );
        // The leaked view keeps the memory: dropping the tensor must not free it under the read.
        drop(on);
    }
}

#[test]
fn a_view_reads_on_its_own_stream_after_the_copy() {
    let _serial = serial();
    let test = "a_view_reads_on_its_own_stream_after_the_copy";
    let Some(dev) = cuda_or_skip(test) else {
        return;
    };
    let mut r = rng(test);
    let ctx = dev.cuda_context().unwrap();
    let stream = ctx.new_stream().unwrap();
    let copy = dev.copy_stream().unwrap().clone();
    for _ in 0..5 {
        let n = r.random_range(1..100_000);
        let src = random_tensor(&mut r, DType::F32, &[n])
            .pin_memory()
            .unwrap();
        let want = src.to_vec::<f32>().unwrap();
        hold_stream(&copy, 20); // the copy runs late: every read below must wait for it
        let on = src.to_device(&dev, true).unwrap();
        let view = on.cuda_view::<f32>(&stream).unwrap();
        assert_eq!(view.len(), n);
        assert!(std::sync::Arc::ptr_eq(view.stream(), &stream));
        let mut mine = stream.alloc_zeros::<f32>(n).unwrap();
        view.copy_to(&mut mine).unwrap();
        let mut host = vec![0f32; n];
        view.copy_to_host(&mut host).unwrap();
        assert_eq!(host, want);
        // The cudarc view, on the view's own stream (the `unsafe` contract).
        // SAFETY: used on `view.stream()` only, while the view lives.
        let theirs = stream.clone_dtoh(&unsafe { view.as_cuda_view() }).unwrap();
        assert_eq!(theirs, want);
        drop(view);
        assert_eq!(stream.clone_dtoh(&mine).unwrap(), want);
        let mut wrong = vec![0f32; n + 1];
        let view = on.cuda_view::<f32>(&stream).unwrap();
        let err = view.copy_to_host(&mut wrong).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "invalid shape: copy_to_host needs {n} elements, as many as the view holds, not {}",
                n + 1
            )
        );
    }
}
