//! Device memory for a batch of the device decoder: stream-ordered allocations owned like a
//! tensor's, and uploads from pinned memory on the worker's stream.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, sys};

use crate::cuda::CudaDevice;
use crate::error::{Error, Result};
use crate::tensor::DeviceBuffer;

/// `bytes` of the device's memory for a batch's output, allocated in `stream`'s order (the
/// worker's: nothing ties it to other workers' batches) and owned like a tensor's.
///
/// It is freed on the device's release stream, not on `stream`: a free waits for the
/// buffer's readers (the consumer's streams), and a decoding stream must never wait on
/// another stream. Its thread waits for it on the host before each batch the engines decode
/// (they write when called, not in the stream's order); had the stream waited for the
/// consumer's reads, each batch would wait for the consumer. The free waits for the
/// allocation's point on `stream` (recorded here) and for the batch's writes, which the caller
/// records with [`written_on`] after its kernels.
pub(super) fn device_buffer(
    dev: &Arc<CudaDevice>,
    stream: &Arc<CudaStream>,
    bytes: usize,
) -> Result<Arc<DeviceBuffer>> {
    let bytes = bytes.max(1);
    // SAFETY: the stream is the worker's, of this device's context; every element of the
    // output is written by the kernels before anything reads it.
    let slice = unsafe { dev.alloc_on(stream, bytes) }
        .map_err(|e| Error::driver("cuMemAllocFromPoolAsync", e))?;
    let ptr = slice.leak();
    // SAFETY: `ptr` is the allocation just made, `bytes` long, and this slice its only owner:
    // it frees it once, on the release stream, after the readers its buffer records, the
    // first of which is the allocation's point on `stream` (recorded next).
    let slice = unsafe { dev.release_stream.upgrade_device_ptr::<u8>(ptr, bytes) };
    let buffer = DeviceBuffer::new(slice, dev.clone());
    written_on(&buffer, stream)?;
    Ok(Arc::new(buffer))
}

/// Records `stream`'s work so far as a reader of `buffer`: its free waits for it. If the
/// event cannot be recorded, the stream is waited for instead, so a free never overtakes it.
pub(super) fn written_on(buffer: &DeviceBuffer, stream: &CudaStream) -> Result<()> {
    match stream.record_event(None) {
        Ok(event) => {
            buffer.add_reader(event);
            Ok(())
        }
        Err(e) => {
            // Without the event the free could overtake the writes: let them finish first.
            let _ = stream.synchronize();
            Err(Error::driver("cuEventRecord", e))
        }
    }
}

/// Device memory a worker reuses from batch to batch on its own stream (decoded pictures,
/// filtered rows, the kernels' tables): one batch's use is ordered after the last one's on
/// that stream, so it needs no events; it grows when a batch needs more.
#[derive(Default)]
pub(super) struct Scratch {
    slice: Option<CudaSlice<u8>>,
}

impl Scratch {
    /// The device address of at least `bytes` bytes, in `stream`'s order.
    pub(super) fn get(
        &mut self,
        dev: &Arc<CudaDevice>,
        stream: &Arc<CudaStream>,
        bytes: usize,
    ) -> Result<u64> {
        if self.slice.as_ref().is_none_or(|s| s.len() < bytes) {
            // The old one is freed in the stream's order, after the batches that used it.
            self.slice = None;
            let grown = bytes.max(1).saturating_add(bytes / 4);
            // SAFETY: the stream is the worker's, of this device's context; everything read
            // from the scratch is written first on the same stream.
            let slice = unsafe { dev.alloc_on(stream, grown) }
                .map_err(|e| Error::driver("cuMemAllocFromPoolAsync", e))?;
            self.slice = Some(slice);
        }
        let slice = self.slice.as_ref().expect("allocated just above");
        Ok(slice.device_ptr(stream).0)
    }
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
