//! The GPU side of the soundness holes closed in `SAFETY.md`: each test here uses only API that
//! existed before the fixes, so it can be run against an older build to see the hole, and
//! fails there. Every test skips (printing `skipped: …`) without a GPU, and fails instead under
//! `PINNABLE_REQUIRE_GPU=1`.

use std::sync::{Mutex, MutexGuard};

use pinnable_harness::{cuda_or_skip, hold_stream, rng};
use rand::Rng;

/// The tests hold streams on purpose to race copies; they run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn the_context_users_get_orders_their_own_cudarc_work_between_streams() {
    let _serial = serial();
    let test = "the_context_users_get_orders_their_own_cudarc_work_between_streams";
    let Some(dev) = cuda_or_skip(test) else {
        return;
    };
    let mut r = rng(test);
    let ctx = dev.cuda_context().unwrap();
    let (a, b) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    for _ in 0..5 {
        let n = r.random_range(1..100_000);
        let old: Vec<f32> = (0..n).map(|_| r.random_range(1.0..2.0)).collect();
        let mut slice = a.clone_htod(&old).unwrap();
        a.synchronize().unwrap();
        // A late write on `a`, then a read on `b`: safe cudarc code, which cudarc orders only
        // while its event tracking is on.
        hold_stream(&a, 50);
        a.memset_zeros(&mut slice).unwrap();
        let seen = b.clone_dtoh(&slice).unwrap();
        assert!(
            seen.iter().all(|&x| x == 0.0),
            "the read on another stream did not wait for the write"
        );
    }
    assert!(
        ctx.is_event_tracking(),
        "cuda_context() hands out untracked state"
    );
    assert!(
        dev.copy_stream().unwrap().context().is_event_tracking(),
        "copy_stream() hands out untracked state"
    );
}

/// DLPack exports of device tensors.
#[cfg(feature = "dlpack")]
mod dlpack {
    use cudarc::driver::{DevicePtrMut, result};
    use pinnable::{DType, Pinnable, ToDevice};
    use pinnable_harness::{cuda_or_skip, hold_stream, random_tensor, rng};
    use rand::Rng;

    use super::serial;

    /// A consumer of a DLPack export on its own stream: a device-to-device read of the export,
    /// queued late, then the deleter, then our tensor dropped and its memory reused by the next
    /// move. What the consumer read must be what was exported.
    fn consumer_reads_the_export(
        dev: &pinnable::Device,
        r: &mut impl Rng,
        export: impl Fn(
            &pinnable::Tensor,
            &std::sync::Arc<cudarc::driver::CudaStream>,
        ) -> pinnable::Result<pinnable::interop::dlpack::DlpackTensor>,
    ) -> pinnable::Result<()> {
        let consumer = dev.cuda_context().unwrap().new_stream().unwrap();
        for _ in 0..5 {
            let n = r.random_range(1 << 16..1 << 20);
            let src = random_tensor(r, DType::F32, &[n]).pin_memory().unwrap();
            let on = src.to_device(dev, false).unwrap();
            let dl = export(&on, &consumer)?;
            let mut seen = consumer.alloc_zeros::<f32>(n).unwrap();
            hold_stream(&consumer, 100);
            {
                let (dst, _record) = seen.device_ptr_mut(&consumer);
                // SAFETY: `dl` addresses `n` f32 of device memory, which the DLPack contract lets
                // the consumer read on its stream until it calls the deleter; `dst` holds `n`.
                unsafe {
                    result::memcpy_dtod_async(
                        dst,
                        dl.dl_tensor().data as u64,
                        n * 4,
                        consumer.cu_stream(),
                    )
                }
                .unwrap();
            }
            drop(dl); // the deleter: the consumer is done, as far as the host can tell
            drop(on);
            // The next batch: same size, so the device's pool hands it the same memory.
            let next = random_tensor(r, DType::F32, &[n]).pin_memory().unwrap();
            let _next_on = next.to_device(dev, true).unwrap();
            assert_eq!(
                consumer.clone_dtoh(&seen).unwrap(),
                src.to_vec::<f32>().unwrap(),
                "the consumer's queued read saw the memory reused"
            );
        }
        Ok(())
    }

    #[test]
    fn a_device_export_is_ordered_on_its_consumer_stream_or_refused() {
        let _serial = serial();
        let test = "a_device_export_is_ordered_on_its_consumer_stream_or_refused";
        let Some(dev) = cuda_or_skip(test) else {
            return;
        };
        let mut r = rng(test);
        // Named consumer stream: ordered.
        consumer_reads_the_export(&dev, &mut r, |t, s| t.to_dlpack_on(s)).unwrap();
        // No stream named: nothing can order the consumer's work, so the export must be refused.
        match consumer_reads_the_export(&dev, &mut r, |t, _| t.to_dlpack()) {
            Ok(()) => panic!("a device tensor was exported with no consumer stream to order"),
            Err(e) => assert!(
                e.to_string().contains("to_dlpack_on"),
                "the refusal says what to do: {e}"
            ),
        }
    }
}
