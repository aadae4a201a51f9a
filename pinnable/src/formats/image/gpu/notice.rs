//! What the device decoder says: its errors (nvJPEG's, as `Error::Interop`), and the notices
//! it prints once on standard error (a forced decoder, engines that failed).

use std::sync::OnceLock;

use super::JpegDecoder;
use crate::error::Error;

pub(super) fn nv_error(msg: String) -> Error {
    Error::Interop {
        library: "nvJPEG",
        message: msg,
    }
}

/// Says once per device and decoder that a forced decoder runs.
pub(super) fn say_forced(ordinal: usize, decoder: JpegDecoder) {
    static SAID: std::sync::Mutex<Vec<(usize, JpegDecoder)>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if !said.contains(&(ordinal, decoder)) {
        said.push((ordinal, decoder));
        eprintln!("pinnable: JPEGs for cuda:{ordinal} are decoded by {decoder} (forced)");
    }
}

/// Batches in a row the engines may fail before a worker stops giving them any.
pub(super) const ENGINE_STRIKES: u32 = 3;

/// Says once on standard error that the engines refused a batch, and once that a worker gave
/// up on them.
pub(super) fn say_engines_failed(why: &str, given_up: bool) {
    static SAID: OnceLock<()> = OnceLock::new();
    static GIVEN_UP: OnceLock<()> = OnceLock::new();
    SAID.get_or_init(|| {
        eprintln!(
            "pinnable: the JPEG engines failed a batch ({why}); its pictures are decoded by \
             nvJPEG's CUDA backend, one by one"
        );
    });
    if given_up {
        GIVEN_UP.get_or_init(|| {
            eprintln!(
                "pinnable: the JPEG engines failed {ENGINE_STRIKES} batches in a row ({why}); \
                 this worker decodes with nvJPEG's CUDA backend from now on"
            );
        });
    }
}
