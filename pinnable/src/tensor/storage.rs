//! The memory behind tensors: pageable vectors, pinned blocks and device buffers.
//!
//! One [`Storage`] may back many tensors: a pinned batch is one block with every tensor a view
//! at its own offset, and a moved batch is one device allocation likewise.

use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaEvent, CudaSlice};

use super::Placement;
use crate::alloc::PinnedBlock;
use crate::cuda::{CudaDevice, Event};
use crate::dtype::Element;
use crate::error::Result;

/// The memory behind one or more tensors.
///
/// Invariant: storages over one shared buffer cover disjoint bytes (a tensor's bytes are its
/// storage's alone); tensors whose bytes overlap (clones, views) share one storage. A tensor
/// whose storage no other tensor holds may therefore write its bytes in place. Outside this
/// module's parent a storage is an opaque handle: what it holds is read through
/// [`Source`](super::Source), and a move's results get theirs from an [`Arena`](super::Arena),
/// which keeps this invariant for them.
pub(crate) struct Storage {
    pub(super) data: Data,
    /// Set when the bytes arrive by an asynchronous copy: readers wait on it first.
    pub(super) ready: Option<Ready>,
}

/// The event that marks an asynchronous copy's completion, filled in once the copy is enqueued.
pub(crate) type Ready = Arc<OnceLock<Arc<Event>>>;

/// A storage's bytes: a pageable buffer of its own, or a part of a shared pinned block or
/// device allocation (the tensor's offset says where in it). Private to `tensor`: other modules
/// see a buffer only as a [`Memory`](super::Memory).
pub(super) enum Data {
    Host(HostBuf),
    /// Read-only host bytes owned elsewhere (a memory-mapped file, another library's array).
    External(External),
    Pinned(Arc<PinnedBlock>),
    Device(Arc<DeviceBuffer>),
}

impl Data {
    /// Another handle on the same shared buffer (`None` for pageable memory, which is never
    /// shared between storages).
    pub(super) fn share(&self) -> Option<Data> {
        match self {
            Data::Host(_) => None,
            Data::External(e) => Some(Data::External(e.clone())),
            Data::Pinned(b) => Some(Data::Pinned(b.clone())),
            Data::Device(d) => Some(Data::Device(d.clone())),
        }
    }
}

impl Storage {
    /// Storage with no pending copy into it.
    pub(super) fn new(data: Data) -> Storage {
        Storage { data, ready: None }
    }

    /// A part of a shared buffer, filled by the copy that `ready` will mark.
    pub(super) fn part(data: Data, ready: Option<Ready>) -> Arc<Storage> {
        Arc::new(Storage { data, ready })
    }

    /// Pageable bytes of a tensor's own, taken over from a vector.
    pub(crate) fn host(buf: HostBuf) -> Arc<Storage> {
        Arc::new(Storage::new(Data::Host(buf)))
    }

    /// A part of a pinned block, filled already (or by a copy the caller waits for itself).
    pub(crate) fn pinned(block: Arc<PinnedBlock>) -> Arc<Storage> {
        Storage::part(Data::Pinned(block), None)
    }

    /// Device memory of its own (an import from another library), filled by the work `ready`
    /// marks.
    #[cfg(any(feature = "dlpack", feature = "candle-cuda"))]
    pub(crate) fn device(buf: DeviceBuffer, ready: Ready) -> Arc<Storage> {
        Storage::part(Data::Device(Arc::new(buf)), Some(ready))
    }

    /// Where the buffer is, for code outside `tensor` that copies from it.
    pub(crate) fn memory(&self) -> super::Memory<'_> {
        match &self.data {
            Data::Host(h) => super::Memory::Pageable(h.ptr.as_ptr()),
            Data::External(e) => super::Memory::Pageable(e.ptr.as_ptr()),
            Data::Pinned(b) => super::Memory::Pinned(b),
            Data::Device(d) => super::Memory::Device(d),
        }
    }

    /// Identifies the buffer: equal for every storage over one pinned block or device
    /// allocation.
    pub(crate) fn buffer_id(&self) -> usize {
        match &self.data {
            Data::Host(h) => h.ptr.as_ptr() as usize,
            Data::External(e) => Arc::as_ptr(&e.owner).cast::<u8>() as usize,
            Data::Pinned(b) => Arc::as_ptr(b) as usize,
            Data::Device(d) => Arc::as_ptr(d) as usize,
        }
    }

    pub(super) fn placement(&self) -> Placement {
        match &self.data {
            Data::Host(_) | Data::External(_) => Placement::Pageable,
            Data::Pinned(_) => Placement::Pinned,
            Data::Device(d) => Placement::Cuda(d.device.ordinal),
        }
    }

    /// Waits for the asynchronous copy that fills this storage, if any.
    pub(crate) fn wait_ready(&self) -> Result<()> {
        if let Some(event) = self.ready_event() {
            event.synchronize()?;
        }
        Ok(())
    }

    /// The event of the asynchronous copy that fills this storage, once it is enqueued.
    pub(crate) fn ready_event(&self) -> Option<&Arc<Event>> {
        self.ready.as_ref()?.get()
    }

    /// The host address of the bytes (pageable or pinned); `None` on a device.
    pub(super) fn host_ptr(&self) -> Option<*mut u8> {
        match &self.data {
            Data::Host(h) => Some(h.ptr.as_ptr()),
            Data::External(e) => Some(e.ptr.as_ptr()),
            Data::Pinned(b) => Some(b.as_ptr()),
            Data::Device(_) => None,
        }
    }
}

/// Host memory owned elsewhere that tensors can view without a copy: a memory-mapped file,
/// an array another library owns. Tensors only read it; a write through
/// [`Tensor::as_mut_slice`](crate::Tensor::as_mut_slice) goes to a private copy.
///
/// A safe trait: an implementation may return any slice its signature allows. The crate asks
/// once, when a tensor is made over the value
/// ([`Tensor::from_host_bytes`](crate::Tensor::from_host_bytes)), checks the tensor against that
/// answer, and from then on reads only that answer's bytes, never asking again. That answer
/// stays valid for as long as the tensor lives whatever the implementation does: it borrows
/// the value, which the tensor keeps alive in its `Arc` (whose contents never move) and never
/// borrows mutably. So an implementation that answers differently later (shorter, elsewhere)
/// cannot make a tensor read out of bounds; its tensors keep the first answer.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use pinnable::{DType, HostBytes, Tensor};
///
/// /// Little-endian u16 samples inside a larger record.
/// struct Record { raw: Vec<u8> }
///
/// impl HostBytes for Record {
///     fn host_bytes(&self) -> &[u8] {
///         &self.raw
///     }
/// }
///
/// let raw: Vec<u8> = (0..16).collect();
/// let t = Tensor::from_host_bytes(Arc::new(Record { raw }), DType::U8, &[4], 4)?;
/// assert_eq!(t.to_vec::<u8>()?, vec![4, 5, 6, 7]);
/// # Ok::<(), pinnable::Error>(())
/// ```
pub trait HostBytes: Send + Sync + 'static {
    /// The bytes. Asked once per tensor made over the value; see the trait docs.
    fn host_bytes(&self) -> &[u8];
}

/// Bytes copied into a vector aligned for every dtype (8 bytes, the largest element): a
/// `Vec<u8>` promises only byte alignment.
pub(crate) struct AlignedCopy(Vec<u64>, usize);

impl AlignedCopy {
    pub(crate) fn of(bytes: &[u8]) -> AlignedCopy {
        let mut copy = vec![0u64; bytes.len().div_ceil(8)];
        // SAFETY: `copy` has at least `bytes.len()` bytes; the two do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), copy.as_mut_ptr().cast(), bytes.len())
        };
        AlignedCopy(copy, bytes.len())
    }
}

impl HostBytes for AlignedCopy {
    fn host_bytes(&self) -> &[u8] {
        // SAFETY: the vector holds at least `self.1` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast(), self.1) }
    }
}

impl HostBytes for Vec<u8> {
    fn host_bytes(&self) -> &[u8] {
        self
    }
}

/// Host bytes owned elsewhere, as the owner answered once: the address and length are read
/// when the storage is made and kept, so later answers of the owner never matter.
pub(crate) struct External {
    owner: Arc<dyn HostBytes>,
    ptr: NonNull<u8>,
    len: usize,
}

impl External {
    /// Asks `owner` for its bytes, once.
    pub(crate) fn new(owner: Arc<dyn HostBytes>) -> External {
        let bytes = owner.host_bytes();
        let (ptr, len) = (NonNull::from(bytes).cast::<u8>(), bytes.len());
        External { owner, ptr, len }
    }

    /// The bytes the owner answered with.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` and `len` are the slice `owner.host_bytes()` returned, a shared borrow of
        // `*owner`. That value lives as long as `self.owner` does, at the same address (an
        // `Arc`'s contents never move), and is never borrowed mutably while we hold a handle on
        // it (`Arc::get_mut` fails while this one exists; we never call it): so the borrow may
        // last as long as `self`, and the bytes stay valid and unchanged for it, whatever later
        // calls return.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for External {
    fn clone(&self) -> External {
        External {
            owner: self.owner.clone(),
            ptr: self.ptr,
            len: self.len,
        }
    }
}

// SAFETY: the owner is `Send + Sync` and `ptr` only reads bytes it keeps alive (see `bytes`).
unsafe impl Send for External {}
// SAFETY: as for Send; shared access only reads.
unsafe impl Sync for External {}

/// A `Vec<T>`'s allocation, type-erased: tensors built from vectors take them over without a copy.
pub(crate) struct HostBuf {
    ptr: NonNull<u8>,
    bytes: usize,
    len: usize,
    cap: usize,
    free: unsafe fn(NonNull<u8>, usize, usize),
}

/// # Safety
///
/// 1. `ptr`, `len`, `cap` are the parts of a `Vec<T>` that was leaked and is rebuilt once.
unsafe fn free_vec<T>(ptr: NonNull<u8>, len: usize, cap: usize) {
    // SAFETY: forwarded from the caller.
    drop(unsafe { Vec::from_raw_parts(ptr.as_ptr().cast::<T>(), len, cap) });
}

impl HostBuf {
    pub(crate) fn from_vec<T: Element>(v: Vec<T>) -> HostBuf {
        let mut v = ManuallyDrop::new(v);
        let bytes = v.len() * size_of::<T>();
        HostBuf {
            // SAFETY: a Vec's pointer is never null (dangling but aligned when empty).
            ptr: unsafe { NonNull::new_unchecked(v.as_mut_ptr().cast()) },
            bytes,
            len: v.len(),
            cap: v.capacity(),
            free: free_vec::<T>,
        }
    }

    /// `bytes` zeroed bytes, aligned for every dtype.
    pub(crate) fn zeroed(bytes: usize) -> HostBuf {
        let mut buf = HostBuf::from_vec(vec![0u64; bytes.div_ceil(8)]);
        buf.bytes = bytes;
        buf
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // SAFETY: built by `from_vec`, dropped once.
        unsafe { (self.free)(self.ptr, self.len, self.cap) }
    }
}

// SAFETY: HostBuf owns its Vec's allocation exclusively and the element types are Send + Sync.
unsafe impl Send for HostBuf {}
// SAFETY: as for Send; shared access only reads (writes need `&mut Tensor` and a unique Arc).
unsafe impl Sync for HostBuf {}

/// Device memory owned by a tensor, with the events of consumers that still read it.
pub(crate) struct DeviceBuffer {
    slice: ManuallyDrop<CudaSlice<u8>>,
    pub(crate) device: Arc<CudaDevice>,
    readers: Mutex<Readers>,
    /// For memory another library allocated: what returns it (dropped instead of freeing).
    foreign: Option<Box<dyn std::any::Any + Send + Sync>>,
    /// Handed to another library, which frees it: dropping does nothing.
    released: bool,
}

impl DeviceBuffer {
    pub(crate) fn new(slice: CudaSlice<u8>, device: Arc<CudaDevice>) -> DeviceBuffer {
        DeviceBuffer {
            slice: ManuallyDrop::new(slice),
            device,
            readers: Mutex::new(Readers::default()),
            foreign: None,
            released: false,
        }
    }

    /// `bytes` of device memory at `ptr` that another library allocated; `owner` keeps it
    /// alive and returns it when dropped, after every recorded reader has finished.
    ///
    /// # Safety
    ///
    /// 1. `ptr` addresses `bytes` bytes of `device`'s memory, live until `owner` is dropped.
    #[cfg(feature = "dlpack")]
    pub(crate) unsafe fn foreign(
        ptr: cudarc::driver::sys::CUdeviceptr,
        bytes: usize,
        device: Arc<CudaDevice>,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> DeviceBuffer {
        // SAFETY: the memory is valid for `bytes` bytes (caller); the slice never frees it:
        // `drop` gives the pointer back with `leak`.
        let slice = unsafe { device.copy_stream.upgrade_device_ptr::<u8>(ptr, bytes) };
        DeviceBuffer {
            slice: ManuallyDrop::new(slice),
            device,
            readers: Mutex::new(Readers::default()),
            foreign: Some(owner),
            released: false,
        }
    }

    /// The device address of the first byte.
    pub(crate) fn device_ptr(&self) -> cudarc::driver::sys::CUdeviceptr {
        use cudarc::driver::DevicePtr;
        self.slice.device_ptr(&self.device.copy_stream).0
    }

    /// Makes `stream` wait for every consumer recorded as reading this buffer. Readers still
    /// open (read views not dropped: leaked, or on other tensors of the buffer) cannot be
    /// waited for by event: for those, the host waits for their streams' whole contexts. They
    /// stay open (a live view may enqueue more reads) until their views are dropped.
    pub(crate) fn wait_readers_on(&self, stream: &cudarc::driver::CudaStream) -> Result<()> {
        let mut readers = self.lock_readers();
        let mut synced: Vec<&Arc<cudarc::driver::CudaContext>> = Vec::new();
        for (_, ctx) in &readers.open {
            if !synced.iter().any(|c| Arc::ptr_eq(c, ctx)) {
                ctx.synchronize()
                    .map_err(|e| crate::error::Error::driver("cuCtxSynchronize", e))?;
                synced.push(ctx);
            }
        }
        drop(synced);
        readers.recorded.retain(|r| !r.is_complete());
        for r in readers.recorded.iter() {
            stream
                .wait(r)
                .map_err(|e| crate::error::Error::driver("cuStreamWaitEvent", e))?;
        }
        Ok(())
    }

    /// Notes a read view opened for work on a stream of `ctx`, whose end is recorded when the
    /// view is dropped ([`close_reader`](Self::close_reader)); returns its key.
    pub(crate) fn open_reader(&self, ctx: Arc<cudarc::driver::CudaContext>) -> u64 {
        let mut readers = self.lock_readers();
        readers.next_key += 1;
        let key = readers.next_key;
        readers.open.push((key, ctx));
        key
    }

    /// The read view `key` is done: its work ends at `event` (`None`: already finished).
    pub(crate) fn close_reader(&self, key: u64, event: Option<CudaEvent>) {
        let mut readers = self.lock_readers();
        readers.open.retain(|(k, _)| *k != key);
        if let Some(e) = event {
            readers.recorded.retain(|r| !r.is_complete());
            readers.recorded.push(e);
        }
    }

    fn lock_readers(&self) -> std::sync::MutexGuard<'_, Readers> {
        self.readers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives the allocation up without freeing it: its address and size. Whoever takes it over
    /// frees it, after the work that uses it (which must include this buffer's recorded
    /// readers and the copies that fill it; a fresh buffer of a move has none of the first).
    #[cfg(feature = "candle-cuda")]
    pub(crate) fn release(mut self) -> (cudarc::driver::sys::CUdeviceptr, usize) {
        debug_assert!(
            self.foreign.is_none(),
            "only our own allocations are given away"
        );
        self.released = true;
        // SAFETY: taken once; `released` keeps `drop` from touching the slice again.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        let bytes = slice.len();
        (slice.leak(), bytes)
    }

    /// Whether another library owns this memory (a DLPack or candle import): it is read-only here.
    pub(crate) fn is_foreign(&self) -> bool {
        self.foreign.is_some()
    }

    /// Records work on another stream that reads this buffer; the buffer is freed only after it.
    pub(crate) fn add_reader(&self, event: CudaEvent) {
        let mut readers = self.lock_readers();
        readers.recorded.retain(|r| !r.is_complete());
        readers.recorded.push(event);
    }
}

/// The consumers that read a device buffer on streams other than its copy stream.
#[derive(Default)]
struct Readers {
    /// Their work, recorded.
    recorded: Vec<CudaEvent>,
    /// Read views still open, by key, with their streams' contexts. (A view holds the buffer,
    /// so one leaked keeps it from ever being freed.)
    open: Vec<(u64, Arc<cudarc::driver::CudaContext>)>,
    next_key: u64,
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if let Some(owner) = self.foreign.take() {
            // Memory another library owns cannot be freed in stream order: wait here for
            // everything that reads it, then hand it back.
            let readers = std::mem::take(&mut self.lock_readers().recorded);
            for r in &readers {
                let _ = r.synchronize();
            }
            // SAFETY: dropped exactly once, here; `leak` does not free the memory.
            let _ = unsafe { ManuallyDrop::take(&mut self.slice) }.leak();
            drop(owner);
            return;
        }
        // The buffer is freed in the order of its slice's stream (the copy stream it was
        // allocated on, or the release stream of the device decoder's batches); make that
        // stream wait for every consumer that read it on another stream first.
        let readers = std::mem::take(&mut self.lock_readers().recorded);
        let stream = self.slice.stream().clone();
        for r in &readers {
            let _ = stream.wait(r);
        }
        // SAFETY: dropped exactly once, here.
        unsafe { ManuallyDrop::drop(&mut self.slice) };
    }
}
