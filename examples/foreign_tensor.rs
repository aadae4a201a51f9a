//! A tensor type that is *not* built on `pinnable::Tensor` — an audio clip as an audio crate
//! might store it, samples in a reference-counted buffer of its own — given `Pinnable` and
//! `ToDevice` by hand with the building blocks every batch uses:
//!
//! 1. `HostBytes`: the clip's own buffer, viewed as bytes (no copy);
//! 2. `Tensor::from_host_bytes`: a tensor over those bytes, with a dtype and a shape;
//! 3. `PinContext::pin_tensor` / `MoveContext::move_tensor`: the clip's bytes join the batch's
//!    one pinned block (one reservation, one copy) or its one device allocation, and come back
//!    as a pinned or device buffer carrying the copy's ready event.
//!
//!     cargo run --release --example foreign_tensor

use std::sync::Arc;

use pinnable::{
    DType, Device, HostBytes, MoveContext, PinContext, Pinnable, Result, Tensor, ToDevice, Walk,
};

/// The audio crate's sample buffer: interleaved f32 samples.
pub struct SampleBuf(Vec<f32>);

impl HostBytes for SampleBuf {
    fn host_bytes(&self) -> &[u8] {
        // SAFETY: f32 has no padding and every byte of it is initialised; the slice covers
        // exactly the vector's elements and lives as long as `self`, which never changes them.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast(), size_of_val(&self.0[..])) }
    }
}

/// Where a clip's samples are.
#[derive(Clone)]
enum Samples {
    /// The audio crate's own buffer, shared between clips.
    Host(Arc<SampleBuf>),
    /// Pinned or device memory from pinnable: bytes plus the ready event of the copy.
    Placed(Tensor),
}

/// An audio clip: `frames × channels` samples at `rate` Hz.
#[derive(Clone)]
pub struct Clip {
    samples: Samples,
    frames: usize,
    channels: usize,
    rate: u32,
}

impl Clip {
    fn new(samples: Vec<f32>, channels: usize, rate: u32) -> Clip {
        Clip {
            frames: samples.len() / channels,
            samples: Samples::Host(Arc::new(SampleBuf(samples))),
            channels,
            rate,
        }
    }

    /// The samples as a `[frames, channels]` f32 tensor: a view of the clip's own buffer when
    /// it is on the host (no copy), the placed buffer otherwise.
    fn tensor(&self) -> Result<Tensor> {
        match &self.samples {
            Samples::Host(buf) => {
                Tensor::from_host_bytes(buf.clone(), DType::F32, &[self.frames, self.channels], 0)
            }
            Samples::Placed(t) => Ok(t.clone()),
        }
    }

    fn placed(&self, t: Tensor) -> Clip {
        Clip {
            samples: Samples::Placed(t),
            ..self.clone()
        }
    }

    /// The samples on the host, for checking (waits for a pending copy).
    fn to_vec(&self) -> Result<Vec<f32>> {
        self.tensor()?.to_cpu(false)?.to_vec::<f32>()
    }
}

impl Pinnable for Clip {
    fn pin_with(&self, cx: &mut PinContext<'_>) -> Result<Self> {
        // The first walk measures the clip's bytes, the second places them in the batch's block.
        let pinned = cx.field("samples", |cx| cx.pin_tensor(&self.tensor()?))?;
        Ok(self.placed(pinned))
    }
}

impl ToDevice for Clip {
    fn to_device_with(&self, cx: &mut MoveContext<'_>) -> Result<Self> {
        let moved = cx.field("samples", |cx| cx.move_tensor(&self.tensor()?))?;
        Ok(self.placed(moved))
    }
}

#[derive(Pinnable, ToDevice)]
struct AudioBatch {
    clips: Vec<Clip>,
    labels: Tensor,
}

fn main() -> Result<()> {
    let clips: Vec<Clip> = (0..4)
        .map(|k| {
            let samples = (0..2 * 4800)
                .map(|i| ((i * (k + 1)) as f32 * 0.001).sin())
                .collect();
            Clip::new(samples, 2, 48_000)
        })
        .collect();
    let batch = AudioBatch {
        labels: Tensor::from_vec(vec![0i64, 1, 2, 3], &[4])?,
        clips,
    };

    let pinned = batch.pin_memory()?;
    let first = pinned.clips[0].tensor()?;
    assert!(first.is_pinned());
    // Every clip and the labels joined one reservation: one block, so the batch moves in one copy.
    for clip in &pinned.clips {
        assert!(clip.tensor()?.shares_block_with(&pinned.labels));
        assert_eq!(clip.rate, 48_000);
    }
    for (a, b) in pinned.clips.iter().zip(&batch.clips) {
        assert_eq!(a.to_vec()?, b.to_vec()?);
    }
    println!(
        "pinned {} clips of {} frames and the labels in one {} byte block",
        pinned.clips.len(),
        pinned.clips[0].frames,
        first.pinned_block().map_or(0, |b| b.len())
    );

    match Device::cuda(0) {
        Err(e) => println!("no CUDA device: {e}"),
        Ok(device) => {
            // From the pageable originals (staged) and from the pinned copy (one direct copy).
            for source in [&batch, &pinned] {
                let on_gpu = source.to_device(&device, true)?;
                let t = on_gpu.clips[3].tensor()?;
                assert_eq!(t.placement(), pinnable::Placement::Cuda(0));
                assert!(t.shares_block_with(&on_gpu.labels));
                for (a, b) in on_gpu.clips.iter().zip(&batch.clips) {
                    assert_eq!(a.to_vec()?, b.to_vec()?);
                }
            }
            println!(
                "moved to {} ({device}) and back: samples identical",
                device.name()
            );
        }
    }
    Ok(())
}
