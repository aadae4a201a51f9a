//! The main example: a custom training batch with nested containers, derived, pinned and
//! (when a CUDA device is present) moved to the GPU and back.
//!
//!     cargo run --release --example batch

use std::collections::HashMap;

use pinnable::{DType, Device, Pinnable, Tensor, ToDevice};

#[derive(Pinnable, ToDevice)]
struct Batch {
    images: Tensor,             // f32 [B, 3, H, W]
    labels: Tensor,             // i64 [B]
    masks: Option<Vec<Tensor>>, // one bool [H, W] per image
    extra: HashMap<String, Tensor>,
    ids: Vec<String>, // plain data: carried over unchanged
    #[pinnable(skip)]
    epoch: u32,
}

fn make_batch(b: usize, h: usize, w: usize) -> pinnable::Result<Batch> {
    let images: Vec<f32> = (0..b * 3 * h * w)
        .map(|i| (i % 251) as f32 / 251.0)
        .collect();
    let labels: Vec<i64> = (0..b as i64).map(|i| i * 7 % 10).collect();
    let masks = (0..b)
        .map(|k| Tensor::from_vec((0..h * w).map(|i| (i + k) % 3 == 0).collect(), &[h, w]))
        .collect::<pinnable::Result<Vec<_>>>()?;
    // A strided view: pinning makes a contiguous copy of exactly the viewed elements.
    let depth =
        Tensor::from_vec((0..h * w).map(|i| i as f32).collect(), &[h, w])?.transpose(0, 1)?;
    Ok(Batch {
        images: Tensor::from_vec(images, &[b, 3, h, w])?,
        labels: Tensor::from_vec(labels, &[b])?,
        masks: Some(masks),
        extra: HashMap::from([
            ("depth".to_string(), depth),
            (
                "weights".to_string(),
                Tensor::from_vec(vec![1.0f64; b], &[b])?,
            ),
        ]),
        ids: (0..b).map(|i| format!("sample-{i}")).collect(),
        epoch: 3,
    })
}

fn tensors(b: &Batch) -> Vec<(String, &Tensor)> {
    let mut v = vec![
        ("images".to_string(), &b.images),
        ("labels".to_string(), &b.labels),
    ];
    for (i, m) in b.masks.iter().flatten().enumerate() {
        v.push((format!("masks[{i}]"), m));
    }
    // In key order: two maps with the same keys may iterate them in different orders.
    let mut extra: Vec<_> = b.extra.iter().collect();
    extra.sort_by_key(|(k, _)| *k);
    for (k, t) in extra {
        v.push((format!("extra[{k:?}]"), t));
    }
    v
}

/// Whether two host tensors hold the same values, element by element (in logical order, so a
/// strided view compares with its contiguous copy).
fn same_values(a: &Tensor, b: &Tensor) -> pinnable::Result<bool> {
    if a.dtype() != b.dtype() {
        return Ok(false);
    }
    Ok(match a.dtype() {
        DType::Bool => a.to_vec::<bool>()? == b.to_vec::<bool>()?,
        DType::I64 => a.to_vec::<i64>()? == b.to_vec::<i64>()?,
        DType::F32 => a.to_vec::<f32>()? == b.to_vec::<f32>()?,
        DType::F64 => a.to_vec::<f64>()? == b.to_vec::<f64>()?,
        other => unimplemented!("this batch has no {other} tensor"),
    })
}

fn main() -> pinnable::Result<()> {
    let batch = make_batch(16, 64, 64)?;
    let pinned = batch.pin_memory()?;

    let all = tensors(&pinned);
    for (name, t) in &all {
        assert!(t.is_pinned(), "{name} is not pinned");
    }
    let backend = pinned
        .images
        .pinned_block()
        .map(|b| b.backend().to_string());
    println!(
        "pinned {} tensors ({} bytes) through the {} backend; ids and epoch carried over: {} ids, epoch {}",
        all.len(),
        all.iter().map(|(_, t)| t.nbytes()).sum::<usize>(),
        backend.unwrap_or_default(),
        pinned.ids.len(),
        pinned.epoch,
    );
    assert_eq!(
        pinned.extra["depth"].to_vec::<f32>()?,
        batch.extra["depth"].to_vec::<f32>()?
    );

    match Device::cuda(0) {
        Err(e) => println!("no CUDA device, so the batch stays pinned on the host: {e}"),
        Ok(device) => {
            let on_gpu = pinned.to_device(&device, true)?; // returns at once
            let back = on_gpu.to_cpu(false)?;
            let (sent, came_back) = (tensors(&batch), tensors(&back));
            assert_eq!(sent.len(), came_back.len());
            for ((name, a), (back_name, b)) in sent.iter().zip(came_back) {
                assert_eq!(name, &back_name);
                assert_eq!(a.shape(), b.shape(), "{name}");
                assert!(same_values(a, b)?, "{name} changed on the way");
            }
            println!(
                "CUDA device found: {} ({device}); moved the batch there with non_blocking=true \
                 and back, values identical",
                device.name()
            );
        }
    }
    println!("pinned pool:\n{}", pinnable::PinnedPool::global().stats());
    Ok(())
}
