//! The rows of images decoded on the workers and resized on the GPU
//! ([`ImageBatcher::on_device`]): the workers only read and decode; one kernel crops, resizes
//! (and normalises) each batch on the copy stream as it moves.

use std::path::PathBuf;

use pinnable::image::{ImageBatcher, Transform};
use pinnable::{Device, Tensor};
use pinnable_harness::bench::Report;

use super::{window_row, window_with};

/// One row a worker count for `u8` and for `f32` normalised on the device; `decode_cost` is our
/// one-core read + decode per image (ms), the workers' whole share now.
#[allow(clippy::too_many_arguments)]
pub fn rows(
    dev: &Device,
    files: &[PathBuf],
    workers: &[usize],
    batches: usize,
    best: Option<(&str, f64)>,
    (eval, norm): (&Transform, &Transform),
    decode_cost: f64,
    read: &dyn Fn(&Tensor),
    rep: &mut Report,
) {
    for (name, t) in [
        ("u8, decoded on the workers, resized on the GPU", eval),
        (
            "f32, decoded on the workers, resized + normalised on the GPU",
            norm,
        ),
    ] {
        for &w in workers {
            let m = window_with(
                files,
                t,
                w,
                batches,
                dev,
                ImageBatcher::on_device(),
                |(x, y)| Ok((x.into_tensor()?, y)),
                read,
            );
            rep.line(&window_row(name, w, m, best, decode_cost, &[]));
        }
    }
}
