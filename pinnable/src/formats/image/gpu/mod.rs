//! JPEGs decoded on the GPU (the codec's device path): the encoded bytes cross the link, the
//! pixels are made on the device.
//!
//! ```text
//!  a sample ─► its bytes, read once into the batch's pinned block ─► headers parsed (size,
//!     EXIF orientation) ─► crop box, flip and filter taps drawn on the host as the CPU path
//!     draws them (seed, epoch, index) ─► decoded: the JPEG engines (nvJPEG's hardware backend,
//!     batched), nvJPEG's CUDA backend for what the engines refuse (progressive, unusual
//!     sampling), the host decoder for what nvJPEG does not read (PNG, CMYK, corrupt files) ─►
//!     the image kernels: resize + crop + flip + u8 or normalised floats, `[N, 3, S, S]`
//! ```
//!
//! nvJPEG is loaded at run time (`libnvjpeg.so.13` or `.12`, see [`gpu_decoder`]): nothing is
//! needed to build. Which decoder runs is chosen once per device and said once on standard
//! error; [`gpu_decoder`] tells it and why, and [`ImageCodec::jpeg_decoder`](super::ImageCodec::jpeg_decoder)
//! forces one.
//! Every decoder gives the same crop boxes and flips (they are drawn before decoding, from the
//! file's headers), so a batch is the same function of (seed, epoch, index) whichever decoded
//! it; values differ by the decoders' rounding only (nvJPEG's IDCT and chroma upsampling are
//! not libjpeg's): within 40 dB PSNR of the host path.
//!
//! nvJPEG's own scratch memory (its device buffers and pinned staging, per thread, kept from
//! batch to batch) comes from its default allocators: `nvjpegCreateEx`'s callbacks carry no
//! device or stream, and the crate's device pool hands out stream-ordered memory whose owner
//! must know both. The crate's own memory: the files' bytes, pinned, from the loader's pool;
//! the decoded pictures, the filtered rows and the kernels' tables in device memory each
//! decoding thread keeps from batch to batch (grown when a batch needs more); the output from
//! the device's pool. A thread's decoding work goes on a stream of its own, so one thread's
//! batches never wait for another's. A thread's decoding state (its stream, nvJPEG's handles,
//! its scratch) outlives it: when a loader's workers end with their epoch, the next epoch's
//! workers take the states back rather than create them again, which stalled every epoch's
//! start and end; [`Device::empty_cache`](crate::Device::empty_cache) frees them.

mod backend;
pub(crate) mod batch;
pub(crate) mod inputs;
mod memory;
mod notice;
pub(crate) mod nvjpeg;
pub(crate) mod plan;
mod search;
mod worker;

use std::fmt;
use std::sync::{Mutex, OnceLock};

use crate::cuda::Device;

/// Which decoder turns a batch's JPEGs into pixels on the device.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JpegDecoder {
    /// The GPU's JPEG engines (nvJPEG's hardware backend), in batches; what they refuse goes
    /// to nvJPEG's CUDA backend, what that refuses to the host.
    Hardware,
    /// nvJPEG's CUDA backend (Huffman decoding on the host or the GPU, the rest on the SMs),
    /// one picture at a time; what it refuses goes to the host.
    Cuda,
    /// The host's decoder (zune-jpeg, png) on the loader's workers; the pictures cross the
    /// link decoded and the kernels make the batch.
    Cpu,
}

impl fmt::Display for JpegDecoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            JpegDecoder::Hardware => "the GPU's JPEG engines (nvJPEG hardware backend)",
            JpegDecoder::Cuda => "nvJPEG's CUDA backend",
            JpegDecoder::Cpu => "the host decoder",
        })
    }
}

/// The decoder chosen for a device, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecoderChoice {
    /// The decoder.
    pub decoder: JpegDecoder,
    /// Why it, and not a faster one: the library found (path and version), or what was
    /// missing or refused.
    pub reason: String,
}

impl fmt::Display for DecoderChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.decoder, self.reason)
    }
}

/// Per ordinal: the decoder chosen, once.
/// Each slot is leaked once per ordinal (a handful a process), so a choice is read without
/// copying it.
static CHOSEN: Mutex<Vec<&'static OnceLock<DecoderChoice>>> = Mutex::new(Vec::new());

/// Which decoder JPEGs moved to `device` get, and why: the GPU's JPEG engines where the library
/// and the engines are there; else nvJPEG's CUDA backend (no engines on this GPU or driver:
/// `NVJPEG_STATUS_ARCH_MISMATCH`, or a container that hides them); else the host decoder
/// (no nvJPEG library, or the host as the device). Decided once per device, said once on
/// standard error.
///
/// nvJPEG is looked for only where the user points or the system's administrator installs
/// (a library in a folder any user can write to would run its code in this process):
/// `PINNABLE_NVJPEG` (a path; when set, only there), then `libnvjpeg.so.13` and `.12` by the
/// system loader (`LD_LIBRARY_PATH`, the ldconfig cache), then CUDA toolkits (`$CUDA_HOME`,
/// `$CUDA_PATH`, `$CUDA_ROOT`, `/usr/local/cuda*`). A Python environment's NVIDIA wheels
/// (`nvidia/cu13/lib` of the `nvidia-nvjpeg` wheel, `nvidia/nvjpeg/lib` of
/// `nvidia-nvjpeg-cu12`, torchvision's copy in `torchvision.libs`) are searched only when
/// asked: `PINNABLE_NVJPEG_FROM_PYTHON=1` for the active environment (`$VIRTUAL_ENV`, else
/// `$CONDA_PREFIX`), or `PINNABLE_NVJPEG_FROM_PYTHON=/path/to/env` (its `sys.prefix`).
/// `~/.local` and `/opt` are never searched. When nothing is found, the reason lists where it
/// looked.
///
/// # Examples
///
/// ```
/// use pinnable::Device;
/// use pinnable::formats::image::{JpegDecoder, gpu_decoder};
///
/// let choice = gpu_decoder(&Device::cpu());
/// assert_eq!(choice.decoder, JpegDecoder::Cpu);
/// println!("JPEGs are decoded by {choice}");
/// ```
pub fn gpu_decoder(device: &Device) -> DecoderChoice {
    match chosen_slot(device) {
        Some(slot) => slot.clone(),
        None => DecoderChoice {
            decoder: JpegDecoder::Cpu,
            reason: "the device is the host".into(),
        },
    }
}

/// [`gpu_decoder`]'s decoder alone, without copying its reason (asked once a batch).
pub(crate) fn chosen_decoder(device: &Device) -> JpegDecoder {
    chosen_slot(device).map_or(JpegDecoder::Cpu, |c| c.decoder)
}

/// The decoder chosen for `device`, chosen on the first call; `None` for the host.
fn chosen_slot(device: &Device) -> Option<&'static DecoderChoice> {
    let ordinal = device.ordinal()?;
    let slot = {
        let mut chosen = CHOSEN.lock().unwrap_or_else(|e| e.into_inner());
        if chosen.len() <= ordinal {
            chosen.resize_with(ordinal + 1, || Box::leak(Box::default()));
        }
        chosen[ordinal]
    };
    Some(slot.get_or_init(|| {
        let choice = choose(device, nvjpeg::Library::get());
        eprintln!("pinnable: JPEGs for {device} are decoded by {choice}");
        choice
    }))
}

/// The fastest decoder `device` can run with `library`.
fn choose(device: &Device, library: Result<&'static nvjpeg::Library, String>) -> DecoderChoice {
    let library = match library {
        Ok(l) => l,
        Err(why) => {
            return DecoderChoice {
                decoder: JpegDecoder::Cpu,
                reason: why,
            };
        }
    };
    let found = format!("nvJPEG {} at {}", library.version(), library.path.display());
    let dev = match device.cuda_device("gpu_decoder") {
        Ok(d) => d,
        Err(e) => {
            return DecoderChoice {
                decoder: JpegDecoder::Cpu,
                reason: e.to_string(),
            };
        }
    };
    if let Err(e) = dev.ctx.bind_to_thread() {
        return DecoderChoice {
            decoder: JpegDecoder::Cpu,
            reason: format!("cuCtxSetCurrent failed with {:?}", e.0),
        };
    }
    let hardware = backend::Backend::open(library, nvjpeg::BACKEND_HARDWARE);
    let refused = match hardware {
        Ok(_) => {
            return DecoderChoice {
                decoder: JpegDecoder::Hardware,
                reason: found,
            };
        }
        Err((msg, status)) if status == nvjpeg::ARCH_MISMATCH => format!(
            "{msg}: this GPU or driver has no JPEG engines (A100, H100, H200, B200 and Ampere \
             or later data-center GPUs do; a container may hide them)"
        ),
        Err((msg, _)) => msg,
    };
    match backend::Backend::open(library, nvjpeg::BACKEND_DEFAULT) {
        Ok(_) => DecoderChoice {
            decoder: JpegDecoder::Cuda,
            reason: format!("{found}; the hardware backend is off: {refused}"),
        },
        Err((msg, _)) => DecoderChoice {
            decoder: JpegDecoder::Cpu,
            reason: format!("{found}, but {refused}, and {msg}"),
        },
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod thread_tests;
