//! A derived batch of candle tensors moves to the GPU with one `to_device`, and candle's own
//! ops consume it at once, on candle's stream.
//!
//! ```sh
//! cargo run --release --example candle_batch --features candle-cuda   # needs nvcc to build
//! ```
//!
//! `ToDevice` for candle tensors comes with candle's CUDA backend (`candle-cuda`; on a machine
//! without a CUDA toolkit, `eval "$(scripts/cuda-build-env.sh)"` first). Without a GPU the
//! same code runs on the CPU.

use std::time::Instant;

use candle_core as candle;
use pinnable::{Device, ToDevice};

/// Images and labels as candle builds them on the host.
#[derive(ToDevice)]
struct Batch {
    images: candle::Tensor,
    labels: candle::Tensor,
}

/// candle's `cuda:0` when a GPU is there.
fn candle_device() -> candle::Device {
    if pinnable::Device::is_available() {
        match candle::Device::new_cuda(0) {
            Ok(d) => return d,
            Err(e) => println!("candle cannot open cuda:0 ({e}); running on the CPU"),
        }
    }
    candle::Device::Cpu
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cdev = candle_device();
    // Our handle on the same GPU and context, so moved tensors are candle's tensors of `cdev`.
    let device = Device::from_candle(&cdev)?;
    println!("device: {device}");

    let cpu = &candle::Device::Cpu;
    let images = candle::Tensor::rand(0f32, 1f32, (64, 3, 224, 224), cpu)?;
    let labels = candle::Tensor::arange(0i64, 64, cpu)?;
    let batch = Batch { images, labels };
    let host_mean = batch.images.mean_all()?.to_scalar::<f32>()?;

    for step in 0..3 {
        let start = Instant::now();
        // One reservation, one staged copy pipeline for the whole batch; returns before the
        // copies finish. candle's stream waits for them, so candle ops queued now see the data.
        let on = batch.to_device(&device, true)?;
        let issued = start.elapsed();
        let mean = on.images.mean_all()?.to_scalar::<f32>()?;
        let label_sum = on.labels.sum_all()?.to_scalar::<i64>()?;
        println!(
            "step {step}: to_device returned in {:.3} ms, mean {mean:.6} (host {host_mean:.6}), \
             label sum {label_sum}, done in {:.3} ms",
            issued.as_secs_f64() * 1e3,
            start.elapsed().as_secs_f64() * 1e3
        );
        assert!((mean - host_mean).abs() < 1e-4);
        assert_eq!(label_sum, 63 * 64 / 2);
        assert!(on.images.device().same_device(&cdev));
    }
    Ok(())
}
