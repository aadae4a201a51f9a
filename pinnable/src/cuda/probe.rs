//! Whether a driver and a device are there: the probe, made once per process, before anything
//! calls into cudarc (which panics without a driver library).

use std::sync::OnceLock;

use cudarc::driver::result;

#[cfg(test)]
use super::Device;
use crate::error::{Error, Result, result_name};

/// The outcome of probing the driver: the device count, or why there is no CUDA.
static PROBE: OnceLock<std::result::Result<usize, String>> = OnceLock::new();

fn probe() -> std::result::Result<usize, String> {
    if std::env::var_os("PINNABLE_DISABLE_CUDA").is_some_and(|v| !v.is_empty() && v != "0") {
        return Err("disabled by the PINNABLE_DISABLE_CUDA environment variable".into());
    }
    // SAFETY: `is_culib_present` only tries to dlopen the driver library; it calls no driver code.
    // (Linked at build time instead, the library is there or the program would not start.)
    #[cfg(not(feature = "cuda-linked"))]
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("the CUDA driver library (libcuda.so) was not found; \
                    install the NVIDIA driver or run on a machine with a GPU"
            .into());
    }
    result::init().map_err(|e| format!("cuInit failed with {}", result_name(e.0)))?;
    let count = result::device::get_count()
        .map_err(|e| format!("cuDeviceGetCount failed with {}", result_name(e.0)))?;
    if count <= 0 {
        return Err("the CUDA driver is installed but sees no device".into());
    }
    Ok(count as usize)
}

pub(super) fn probed() -> Result<usize> {
    PROBE
        .get_or_init(probe)
        .clone()
        .map_err(|reason| Error::CudaUnavailable { reason })
}

/// Whether a CUDA driver is installed and sees at least one device. Never panics.
///
/// The answer is computed once per process. Setting `PINNABLE_DISABLE_CUDA=1` before the first
/// call makes it `false`, which forces the page-locked (`mlock`) backend on a GPU machine.
///
/// # Examples
///
/// ```
/// if pinnable::Device::is_available() {
///     println!("{} CUDA device(s)", pinnable::Device::count());
/// }
/// ```
pub(crate) fn is_available() -> bool {
    probed().is_ok()
}

/// How many CUDA devices the driver sees; 0 without a driver.
pub(crate) fn device_count() -> usize {
    probed().unwrap_or(0)
}

/// Why CUDA is unavailable, or `None` when it is available.
pub(crate) fn unavailable_reason() -> Option<String> {
    probed().err().map(|e| match e {
        Error::CudaUnavailable { reason } => reason,
        other => other.to_string(),
    })
}

/// CUDA device 0, or `None` after printing `skipped: <test>: <reason>`.
///
/// # Panics
///
/// Without a device under `PINNABLE_REQUIRE_GPU=1`.
#[cfg(test)]
pub(crate) fn cuda_or_skip(test: &str) -> Option<Device> {
    match Device::cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            let required = std::env::var("PINNABLE_REQUIRE_GPU").is_ok_and(|v| v == "1");
            assert!(!required, "{test}: PINNABLE_REQUIRE_GPU=1 but {e}");
            use std::io::Write;
            let _ = std::io::stderr().write_all(format!("skipped: {test}: {e}\n").as_bytes());
            None
        }
    }
}
