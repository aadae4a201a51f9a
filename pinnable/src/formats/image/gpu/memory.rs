//! Device memory for a batch of the device decoder: stream-ordered allocations owned like a
//! tensor's, and uploads from pinned memory on the worker's stream.

use std::sync::Arc;

use cudarc::driver::{CudaStream, sys};

use crate::cuda::CudaDevice;
use crate::error::{Error, Result};
use crate::tensor::DeviceBuffer;

/// `bytes` of the device's memory, in the copy stream's order, owned like a tensor's.
pub(super) fn device_buffer(dev: &Arc<CudaDevice>, bytes: usize) -> Result<Arc<DeviceBuffer>> {
    // SAFETY: every byte the kernels or decoders read is written first on the worker's stream
    // (decoded pictures, tables, filtered rows); the output's every element is written.
    let slice = unsafe { dev.alloc(bytes.max(1)) }
        .map_err(|e| Error::driver("cuMemAllocFromPoolAsync", e))?;
    Ok(Arc::new(DeviceBuffer::new(slice, dev.clone())))
}

/// Copies `len` bytes of pinned memory at `src` to device address `dst` on `stream`.
///
/// # Safety
///
/// 1. `src` is valid for `len` bytes until the stream passes this point.
/// 2. `dst` addresses `len` bytes of device memory ordered before this point on the stream.
pub(super) unsafe fn upload(
    stream: &CudaStream,
    dst: u64,
    src: *const u8,
    len: usize,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: forwarded from the caller.
    unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, stream.cu_stream()) }
        .result()
        .map_err(|e| Error::driver("cuMemcpyHtoDAsync", e))
}
