//! The images bench on the GPU: the host loader's batches moved to the device and read there
//! (u8, f32 made on the host, f32 made on the device), each at the worker counts and auto,
//! then the device-decode table and the link's share.

use cudarc::driver::sys::CUevent_flags;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use pinnable::formats::image::{IMAGENET_MEAN, IMAGENET_STD, ImageFile, Transform};
use pinnable::loader::Batcher;
use pinnable::{DType, Device, Tensor};
use pinnable_harness::bench::{Report, raw_one_copy};
use pinnable_harness::kernels::Consumer;

use super::{
    BATCH, COLUMNS, cores, device, keep_tuning, on_host, print_notes, window, window_row,
    window_with,
};

/// The consumer: one kernel reads every byte of the batch after its copy, then a sync of the
/// compute stream, as the twin's `x.sum()` and synchronize do. `asleep`: the sync waits on an
/// event that blocks the thread instead of spinning a core in the driver (the device-decode
/// table counts the process's CPU, and a consumer's spin is not the loader's work).
pub fn reader(consumer: &Consumer, asleep: bool) -> impl Fn(&Tensor) + '_ {
    let (kernels, compute, sum_ptr) = (
        &consumer.kernels,
        consumer.stream.clone(),
        consumer.sum_ptr(),
    );
    let done = asleep.then(|| {
        compute
            .context()
            .new_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC))
            .expect("an event")
    });
    move |x: &Tensor| {
        match kernels {
            Some(k) => {
                // The view orders the compute stream after the batch's copy; it lives until
                // the kernel reading through it is queued.
                if x.dtype() == DType::U8 {
                    let v = x.cuda_view::<u8>(&compute).expect("device view");
                    k.read_sum(&compute, v.device_ptr(), x.numel() / 4, sum_ptr);
                } else {
                    let v = x.cuda_view::<f32>(&compute).expect("device view");
                    k.read_sum(&compute, v.device_ptr(), x.numel(), sum_ptr);
                }
            }
            None => {
                x.ready_event()
                    .expect("event")
                    .wait_on(&compute)
                    .expect("wait");
            }
        }
        match &done {
            Some(e) => {
                e.record(&compute).expect("record");
                e.synchronize().expect("sync");
            }
            None => compute.synchronize().expect("sync"),
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub fn gpu_part(
    dev: &Device,
    files: &[PathBuf],
    workers: &[usize],
    batches: usize,
    best: Option<(&str, f64)>,
    (eval, u8_cost): (&Transform, f64),
    (norm, f32_cost): (&Transform, f64),
    floors: &[(usize, f64)],
    torch: &HashMap<String, f64>,
    rep: &mut Report,
) {
    let consumer = Consumer::new(dev);
    let kernels = &consumer.kernels;
    let read = &reader(&consumer, false);
    let asleep = reader(&consumer, true);
    rep.line(&format!(
        "\n## {} ({}): batches moved to the device and read there by {}\n",
        dev.name(),
        dev.pcie_bus_id().unwrap_or_default(),
        if kernels.is_some() {
            "one kernel (a sum over every byte)"
        } else {
            "a sync (no CUDA compiler here, so no kernel)"
        }
    ));
    rep.line(
        "goals: ≥ 2× PyTorch's best images/s on the same cores, ≥ 8000 images/s on 16 cores\n",
    );
    rep.line(COLUMNS);
    let mut notes = Vec::new();
    for &w in workers {
        let m = window(files, eval, w, batches, dev, read);
        keep_tuning(&mut notes, "u8 over the link", &m);
        rep.line(&window_row("u8 over the link", w, m, best, u8_cost, floors));
    }
    for &w in workers {
        let m = window(files, norm, w, batches, dev, read);
        keep_tuning(&mut notes, "f32 normalised on the host", &m);
        rep.line(&window_row(
            "f32 normalised on the host",
            w,
            m,
            best,
            f32_cost,
            &[],
        ));
    }
    // u8 over the link, normalised to f32 on the device by the gather's conversion.
    for &w in workers {
        let host = on_host(eval);
        let batcher = move |samples: Vec<ImageFile>, c: &mut pinnable::loader::Collator| {
            let (x, y) = host.batch(samples, c)?;
            let b = x.shape()[0];
            let to = pinnable::Convert::normalize(DType::F32, &IMAGENET_MEAN, &IMAGENET_STD)?;
            Ok((
                pinnable::Gather::rows(&x, 0..b)?.convert(to)?,
                pinnable::Gather::rows(&y, 0..b)?,
            ))
        };
        let tensors =
            |(x, y): (pinnable::Gather, pinnable::Gather)| Ok((x.into_tensor()?, y.into_tensor()?));
        let m = window_with(files, w, batches, dev, batcher, tensors, read);
        keep_tuning(&mut notes, "u8 over the link, f32 made on the device", &m);
        rep.line(&window_row(
            "u8 over the link, f32 made on the device",
            w,
            m,
            best,
            u8_cost,
            floors,
        ));
    }
    print_notes(&notes, rep);
    device::table(
        dev,
        files,
        batches,
        (eval, norm),
        torch,
        cores(),
        &asleep,
        rep,
    );
    // The link's share: one raw copy of each batch's bytes from pinned memory.
    let u8_batch = BATCH * 3 * 224 * 224 + 8 * BATCH;
    for (name, bytes) in [("u8", u8_batch), ("f32", 4 * u8_batch)] {
        let t = raw_one_copy(dev, bytes);
        rep.line(&format!(
            "\nthe link, {name}: one raw copy of a batch's {:.1} MB takes {:.3} ms: at most {:.0} images/s",
            bytes as f64 / 1e6,
            t * 1e3,
            BATCH as f64 / t
        ));
    }
    std::thread::sleep(Duration::from_millis(10));
}
