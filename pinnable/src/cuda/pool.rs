//! The device memory batches are reserved from: a stream-ordered memory pool of the crate's
//! own, so that keeping freed batch memory cached changes no setting of the device's default
//! pool, which every other library in the process allocates from.

use cudarc::driver::{CudaSlice, CudaStream, DriverError, result, sys};

/// A stream-ordered memory pool on one device, never destroyed (like the primary context the
/// crate keeps retained).
pub(crate) struct MemPool(sys::CUmemoryPool);

// SAFETY: a memory pool is a driver handle any thread may allocate from; the driver serialises
// its use.
unsafe impl Send for MemPool {}
// SAFETY: as for Send; nothing here mutates the handle.
unsafe impl Sync for MemPool {}

impl MemPool {
    /// A pool of device `ordinal`'s memory that keeps what is freed cached for the next batch
    /// (its release threshold is unbounded; `Device::empty_cache` trims it), or `None` when
    /// the driver refuses one.
    pub(crate) fn create(ordinal: usize) -> Option<MemPool> {
        // SAFETY: every field of the props is an integer or a pointer, for which zero is valid
        // (no handle types, no security attributes, no size limit).
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location = sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal as i32,
        };
        // SAFETY: `props` is a valid, initialised description that outlives the call.
        let pool = unsafe { result::mem_pool::create(&props) }.ok()?;
        let mut keep = u64::MAX;
        // SAFETY: the pool was just made; the attribute takes a u64 that outlives the call.
        let _ = unsafe {
            result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep as *mut u64).cast(),
            )
        };
        // Nothing allocated from the pool waits for a stream it did not ask to: memory freed
        // on one stream is reused on another only once the free is done (or the stream
        // already waits for it), never by making the allocating stream wait. The device
        // decoder's threads wait for their own streams on the host (nvJPEG's engines do not
        // follow stream order), so those streams must depend on nothing but their own work.
        let mut off = 0i32;
        // SAFETY: as above; the attribute takes an int.
        let _ = unsafe {
            result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
                (&mut off as *mut i32).cast(),
            )
        };
        Some(MemPool(pool))
    }

    /// The driver's handle.
    pub(crate) fn raw(&self) -> sys::CUmemoryPool {
        self.0
    }

    /// `bytes` of the pool's memory, allocated in `stream`'s order and freed in it when the
    /// slice is dropped.
    ///
    /// # Safety
    ///
    /// 1. `stream`'s context is current and belongs to the pool's device.
    /// 2. The memory is uninitialised: nothing reads it before something writes it.
    pub(crate) unsafe fn alloc(
        &self,
        stream: &std::sync::Arc<CudaStream>,
        bytes: usize,
    ) -> Result<CudaSlice<u8>, DriverError> {
        let mut ptr = 0;
        // SAFETY: the pool and the stream are live; `ptr` is an out-parameter.
        unsafe { sys::cuMemAllocFromPoolAsync(&mut ptr, bytes, self.0, stream.cu_stream()) }
            .result()?;
        // SAFETY: `ptr` is a fresh allocation of `bytes` bytes made in `stream`'s order; the
        // slice frees it in that order (cuMemFreeAsync frees memory of any pool).
        Ok(unsafe { stream.upgrade_device_ptr::<u8>(ptr, bytes) })
    }
}
