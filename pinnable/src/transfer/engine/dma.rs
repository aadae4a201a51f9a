//! The copy engine: copies straight from memory it reads as it is (registered pinned memory,
//! device memory), merged where they continue each other, and several host-to-device copies
//! in one `cuMemcpyBatchAsync` where the driver has it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys;

use super::Engine;
use crate::batch::PART_ALIGN;
use crate::cuda::CudaDevice;
use crate::error::{Error, Result};
use crate::tensor::DeviceBuffer;

/// Which way a direct copy goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    /// From registered pinned memory to the target device.
    HtoD,
    /// From a device to pinned memory.
    DtoH,
    /// From another device to the target device.
    DtoD,
}

/// A copy the copy engine makes without staging.
pub(crate) struct DirectCopy {
    pub(in crate::transfer) dir: Dir,
    pub(in crate::transfer) src: u64,
    pub(in crate::transfer) dst: u64,
    pub(in crate::transfer) bytes: usize,
    /// Identifies the source buffer: only copies from one buffer merge (two allocations may
    /// happen to be neighbours in memory, but no copy may span both).
    pub(in crate::transfer) src_id: usize,
    /// The source buffer, for device sources: peer copies name its device, and a copy issued on
    /// another device's stream is recorded as a reader of it.
    pub(in crate::transfer) src_buffer: Option<Arc<DeviceBuffer>>,
    /// Whether the source is pinned memory the device reads through its mapping (so the SMs
    /// can read it in place).
    pub(in crate::transfer) mapped: bool,
    /// The engine the caller asked for (`GatherRoute::Direct` or `Kernel`), if any.
    pub(in crate::transfer) force: Option<Engine>,
}

impl DirectCopy {
    pub(in crate::transfer) fn src_device(&self) -> Option<&Arc<CudaDevice>> {
        self.src_buffer.as_ref().map(|b| &b.device)
    }

    /// Extends `self` over `next` when `next` continues it in both source and destination
    /// memory (with at most alignment padding between them).
    fn absorb(&mut self, next: &DirectCopy) -> bool {
        let end = self.src + self.bytes as u64;
        let mergeable = self.dir == next.dir
            && self.src_id == next.src_id
            && self.force == next.force
            && next.src >= end
            && next.src - end < PART_ALIGN as u64
            && next.src.wrapping_sub(self.src) == next.dst.wrapping_sub(self.dst);
        if mergeable {
            self.bytes = (next.src + next.bytes as u64 - self.src) as usize;
        }
        mergeable
    }
}

/// The direct copies merged where they continue each other, in order.
pub(in crate::transfer) fn merge(direct: &[DirectCopy]) -> Vec<DirectCopy> {
    let mut runs: Vec<DirectCopy> = Vec::new();
    let mut i = 0;
    while i < direct.len() {
        let first = &direct[i];
        let mut run = DirectCopy {
            src_buffer: first.src_buffer.clone(),
            ..*first
        };
        i += 1;
        while i < direct.len() && run.absorb(&direct[i]) {
            i += 1;
        }
        if run.bytes > 0 {
            runs.push(run);
        }
    }
    runs
}

/// Issues `runs` on `dev`'s copy stream. Several host-to-device runs in a row (rows of a
/// gather, tensors of separate pinned blocks) go in one batched call where the driver has it.
pub(in crate::transfer) fn issue(dev: &Arc<CudaDevice>, runs: &[DirectCopy]) -> Result<()> {
    let mut at = 0;
    while at < runs.len() {
        let htod = runs[at..].iter().take_while(|r| r.dir == Dir::HtoD).count();
        if let Some(batch) = batch_copies().filter(|_| htod >= 2) {
            issue_htod_batch(dev, &runs[at..at + htod], batch)?;
            at += htod;
        } else {
            issue_one(dev, &runs[at])?;
            at += 1;
        }
    }
    Ok(())
}

/// `cuMemcpyBatchAsync` as CUDA 12.8 defines it.
type BatchFn = unsafe extern "C" fn(
    *mut sys::CUdeviceptr,
    *mut sys::CUdeviceptr,
    *mut usize,
    usize,
    *mut sys::CUmemcpyAttributes,
    *mut usize,
    usize,
    *mut usize,
    sys::CUstream,
) -> sys::CUresult;

/// Whether batching is off: `PINNABLE_COPY_BATCH=0`, or a batched call failed once.
static BATCH_OFF: AtomicBool = AtomicBool::new(false);

/// The driver's `cuMemcpyBatchAsync` (CUDA 12.8 and later), looked up at run time so a binary
/// that links the driver still starts on older ones; `None` without it, or when batching is
/// off.
fn batch_copies() -> Option<BatchFn> {
    static BATCH: OnceLock<Option<BatchFn>> = OnceLock::new();
    if BATCH_OFF.load(Ordering::Relaxed) {
        return None;
    }
    *BATCH.get_or_init(|| {
        if std::env::var("PINNABLE_COPY_BATCH").as_deref() == Ok("0") {
            return None;
        }
        let mut pfn: *mut std::ffi::c_void = std::ptr::null_mut();
        let mut found = sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        // SAFETY: the name is a C string; `pfn` and `found` are plain out-parameters. The
        // driver returns the entry point with the 12.8 ABI (the one `BatchFn` spells) or none.
        let r = unsafe {
            sys::cuGetProcAddress_v2(
                c"cuMemcpyBatchAsync".as_ptr(),
                &mut pfn,
                12080,
                sys::CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_DEFAULT as u64,
                &mut found,
            )
        };
        let ok = r == sys::CUresult::CUDA_SUCCESS
            && found == sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS;
        if !ok || pfn.is_null() {
            return None;
        }
        // SAFETY: a non-null entry point of `cuMemcpyBatchAsync` for CUDA 12.8, whose C
        // signature `BatchFn` matches.
        Some(unsafe { std::mem::transmute::<*mut std::ffi::c_void, BatchFn>(pfn) })
    })
}

/// Issues host-to-device runs as one `cuMemcpyBatchAsync`, each read in stream order. If the
/// driver refuses the batch, batching is turned off for the process and the runs go one by one
/// (a copy the batch may already have enqueued is then made twice, with the same bytes).
fn issue_htod_batch(dev: &Arc<CudaDevice>, runs: &[DirectCopy], batch: BatchFn) -> Result<()> {
    let mut dsts: Vec<sys::CUdeviceptr> = runs.iter().map(|r| r.dst).collect();
    let mut srcs: Vec<sys::CUdeviceptr> = runs.iter().map(|r| r.src).collect();
    let mut sizes: Vec<usize> = runs.iter().map(|r| r.bytes).collect();
    let mut attrs = [sys::CUmemcpyAttributes {
        srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
        srcLocHint: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        },
        dstLocHint: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: dev.ordinal as i32,
        },
        flags: 0,
    }];
    let mut attr_at = [0usize];
    let mut failed_at = usize::MAX;
    crate::transfer::fault::enqueue("cuMemcpyBatchAsync")?;
    // SAFETY: the arrays hold `runs.len()` entries and outlive the call; every range lies
    // within a live buffer, as for single copies (see `issue_one`); one attribute applies to
    // every copy from index 0; sources are read in stream order.
    let r = unsafe {
        batch(
            dsts.as_mut_ptr(),
            srcs.as_mut_ptr(),
            sizes.as_mut_ptr(),
            runs.len(),
            attrs.as_mut_ptr(),
            attr_at.as_mut_ptr(),
            1,
            &mut failed_at,
            dev.copy_stream.cu_stream(),
        )
    };
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    BATCH_OFF.store(true, Ordering::Relaxed);
    runs.iter().try_for_each(|run| issue_one(dev, run))
}

/// Issues one merged run.
fn issue_one(dev: &Arc<CudaDevice>, run: &DirectCopy) -> Result<()> {
    let stream = &dev.copy_stream;
    if let (Dir::DtoD, Some(src)) = (run.dir, run.src_device()) {
        // Over the direct link when there is one; the driver stages through the host else.
        crate::cuda::peer_access(dev, src);
    }
    crate::transfer::fault::enqueue("cuMemcpyAsync")?;
    // SAFETY: source and destination ranges lie within live buffers (sources are held by
    // the move until issued and then by the ready event or their owners; destinations are
    // fresh allocations of this move), and the stream waited for sources still being filled.
    let r = unsafe {
        match run.dir {
            Dir::HtoD => sys::cuMemcpyHtoDAsync_v2(
                run.dst,
                run.src as *const std::ffi::c_void,
                run.bytes,
                stream.cu_stream(),
            ),
            Dir::DtoH => sys::cuMemcpyDtoHAsync_v2(
                run.dst as *mut std::ffi::c_void,
                run.src,
                run.bytes,
                stream.cu_stream(),
            ),
            Dir::DtoD => sys::cuMemcpyPeerAsync(
                run.dst,
                dev.ctx.cu_ctx(),
                run.src,
                run.src_device().expect("a device source").ctx.cu_ctx(),
                run.bytes,
                stream.cu_stream(),
            ),
        }
    };
    check_cu(r, "cuMemcpyAsync")?;
    // Any device source is recorded as read until this point: on another device so its
    // free waits, and on this one so a later in-place write (`cuda_view_mut`) waits too.
    if let Some(src) = &run.src_buffer {
        let read = stream
            .record_event(None)
            .map_err(|e| Error::driver("cuEventRecord", e))?;
        src.add_reader(read);
    }
    Ok(())
}

pub(crate) fn check_cu(r: sys::CUresult, call: &'static str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::driver(call, cudarc::driver::DriverError(r)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(src: u64, dst: u64, bytes: usize, src_id: usize) -> DirectCopy {
        DirectCopy {
            dir: Dir::HtoD,
            src,
            dst,
            bytes,
            src_id,
            src_buffer: None,
            mapped: true,
            force: None,
        }
    }

    #[test]
    fn neighbouring_copies_of_one_buffer_merge_across_padding() {
        let mut a = copy(4096, 1 << 20, 1000, 7);
        assert!(a.absorb(&copy(4096 + 1024, (1 << 20) + 1024, 500, 7)));
        assert_eq!(a.bytes, 1524);
        // A different shift between source and destination: no merge.
        assert!(!a.absorb(&copy(4096 + 1536, (1 << 20) + 2048, 10, 7)));
        // A gap of a whole alignment unit or more: no merge.
        assert!(!a.absorb(&copy(4096 + 1524 + 256, (1 << 20) + 1524 + 256, 10, 7)));
    }

    #[test]
    fn copies_forced_onto_different_engines_never_merge() {
        let mut a = copy(4096, 1 << 20, 1000, 7);
        let mut b = copy(4096 + 1000, (1 << 20) + 1000, 500, 7);
        b.force = Some(Engine::CopyEngine);
        assert!(!a.absorb(&b));
        a.force = Some(Engine::CopyEngine);
        assert!(a.absorb(&b));
    }

    #[test]
    fn copies_of_two_buffers_never_merge_even_when_adjacent() {
        let mut a = copy(4096, 1 << 20, 4096, 1);
        assert!(!a.absorb(&copy(8192, (1 << 20) + 4096, 4096, 2)));
        assert_eq!(a.bytes, 4096);
    }
}
