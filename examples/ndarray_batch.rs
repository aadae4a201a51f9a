//! Samples built with ndarray straight into a batch's pinned block: no pageable batch, no
//! second copy. Each sample is computed with ndarray (here: a synthetic image, normalised per
//! channel) and written through `TensorMut::as_array_mut` into its row of the batch; the batch
//! then moves to the GPU in one copy when there is one.
//!
//!     cargo run --release --features ndarray --example ndarray_batch

use ndarray::{Array3, Axis, s};
use pinnable::{BatchLayout, DType, Device, Result, ToDevice};

const MEAN: [f32; 3] = [0.485, 0.456, 0.406];
const STD: [f32; 3] = [0.229, 0.224, 0.225];

/// Sample `k`: a `[3, h, w]` image with values in [0, 1].
fn sample(k: usize, h: usize, w: usize) -> Array3<f32> {
    Array3::from_shape_fn((3, h, w), |(c, y, x)| {
        ((k * 31 + c * 7 + y * w + x) % 256) as f32 / 255.0
    })
}

fn main() -> Result<()> {
    let (b, h, w) = (16, 64, 64);
    let mut layout = BatchLayout::new();
    let images = layout.push(DType::F32, &[b, 3, h, w])?;
    let labels = layout.push(DType::I64, &[b])?;
    let mut batch = layout.allocate()?;

    for (k, mut row) in batch.view_mut(images).rows_mut().enumerate() {
        let mut dst = row.as_array_mut::<f32>()?;
        dst.assign(&sample(k, h, w)); // the one host write of this sample's bytes
        for (c, mut channel) in dst.axis_iter_mut(Axis(0)).enumerate() {
            channel.mapv_inplace(|v| (v - MEAN[c]) / STD[c]);
        }
    }
    batch
        .view_mut(labels)
        .as_array_mut::<i64>()?
        .iter_mut()
        .enumerate()
        .for_each(|(k, l)| *l = (k % 10) as i64);
    let tensors = batch.finish();
    let (images, labels) = (&tensors[0], &tensors[1]);
    assert!(images.is_pinned() && images.shares_block_with(labels));

    // Read back through a zero-copy view: sample 5, channel 1, row 2.
    let view = images.as_array::<f32>()?;
    let expected = sample(5, h, w)
        .slice(s![1, 2, ..])
        .mapv(|v| (v - MEAN[1]) / STD[1]);
    assert_eq!(view.slice(s![5, 1, 2, ..]), expected);
    println!(
        "built {b} samples of {:?} with ndarray in one pinned block of {} bytes",
        &images.shape()[1..],
        images.pinned_block().map_or(0, |bl| bl.len())
    );

    match Device::cuda(0) {
        Err(e) => println!("no CUDA device: {e}"),
        Ok(device) => {
            let on_gpu = tensors.to_device(&device, true)?;
            let back = on_gpu.to_cpu(false)?;
            assert_eq!(back[0].as_array::<f32>()?, view);
            assert_eq!(back[1].to_vec::<i64>()?, labels.to_vec::<i64>()?);
            println!(
                "moved to {} ({device}) in one copy and back: identical",
                device.name()
            );
        }
    }
    Ok(())
}
