//! `ToDevice`: stream-ordered copies of a batch to a CUDA device and back.
//!
//! A move to a device walks the batch twice (through the derive's or a hand-written
//! [`ToDevice::to_device_with`]). The first walk only measures: it checks every tensor and adds
//! up the bytes. Then the whole batch is reserved at once: one device allocation (the batch's
//! *arena*; each moved tensor is a view into it) and one pinned staging block for the pageable
//! sources. An out-of-memory error therefore comes back before anything is copied. The second
//! walk builds the result and plans the copies; only then are they issued. Staging copies run on
//! several threads, and as their pieces land in order, they go to the device as a few large
//! copies rather than one per tensor.
//!
//! One event recorded after the last copy is the *ready* event of every tensor of the result,
//! and is recorded on every pinned block the copies read, which keeps those blocks from being
//! reused or written until the copies are done.

use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{DevicePtr, sys};

use crate::alloc::{Fence, PinnedPool};
use crate::check;
use crate::copy::{self, HostCopy};
use crate::cuda::{CudaDevice, Device, Event};
use crate::error::{Error, Result};
use crate::path::{FieldPath, Walk};
use crate::tensor::{Data, DeviceBuffer, Ready, Storage, Tensor};

/// A value whose tensors can be moved to a CUDA device (or back to the host).
///
/// Derive it with `#[derive(ToDevice)]`, or implement [`to_device_with`](Self::to_device_with)
/// by moving each part through the [`MoveContext`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be moved to a device: it does not implement `ToDevice`",
    label = "`{Self}` does not implement `ToDevice`",
    note = "derive `ToDevice` for `{Self}` or implement it by hand; to carry the field over \
            unchanged instead, mark it `#[pinnable(skip)]` (it must then implement `Clone`)"
)]
pub trait ToDevice: Sized {
    /// The recursive step: a copy of `self` with every tensor moved through `cx`.
    ///
    /// # Errors
    ///
    /// Whatever moving a part returns, with its field path.
    fn to_device_with(&self, cx: &mut MoveContext<'_>) -> Result<Self>;

    /// A copy of `self` with every tensor on `device`.
    ///
    /// Pinned sources are copied asynchronously on the device's copy stream; pageable ones are
    /// staged through pinned memory by several threads first. With `non_blocking = false` this
    /// returns once the data is on the device; with `true` it returns at once, and every
    /// consumer (a [`Tensor::cuda_view`] on any stream, a host read) waits for the copy first.
    /// Tensors already on `device` are shared; non-tensor data is cloned.
    ///
    /// # Errors
    ///
    /// [`Error::CudaUnavailable`] when `device` is a CUDA device and there is none;
    /// [`Error::DeviceOutOfMemory`] when the batch does not fit (nothing is copied then);
    /// [`Error::Driver`] when a copy cannot be issued.
    fn to_device(&self, device: &Device, non_blocking: bool) -> Result<Self> {
        MoveContext::run(device, non_blocking, PinnedPool::global(), |cx| {
            self.to_device_with(cx)
        })
    }

    /// A copy of `self` with every tensor on the host: device tensors land in pinned memory,
    /// host tensors are shared. With `non_blocking = true` host reads of the result wait for
    /// the copies.
    ///
    /// # Errors
    ///
    /// As [`to_device`](Self::to_device).
    fn to_cpu(&self, non_blocking: bool) -> Result<Self> {
        self.to_device(&Device::cpu(), non_blocking)
    }
}

/// Device arena offsets are aligned to this many bytes (what CUDA's own allocator guarantees).
const ALIGN: usize = 256;
/// Staged bytes are sent to the device in copies of at least this many bytes (the last one
/// excepted): 8 MiB, or `PINNABLE_STAGE_CHUNK` bytes.
fn chunk() -> usize {
    static CHUNK: OnceLock<usize> = OnceLock::new();
    *CHUNK.get_or_init(|| {
        std::env::var("PINNABLE_STAGE_CHUNK")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(8 << 20)
    })
}

fn align(bytes: usize) -> usize {
    bytes.div_ceil(ALIGN) * ALIGN
}

/// A host-to-device copy from pinned memory.
struct Upload {
    src: *const u8,
    bytes: usize,
    dst: sys::CUdeviceptr,
    /// The source's storage: copies from the same storage whose offsets line up are merged.
    storage: *const Storage,
}

/// Which walk is running.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Check and add up bytes; results are placeholders.
    Measure,
    /// Build the result in the reserved arena and plan the copies.
    Build,
}

/// The batch's reserved memory: one device allocation whose first `staged_len` bytes mirror the
/// staging block byte for byte; the direct (already pinned) sources' region follows.
struct Arena {
    device: Arc<Storage>,
    dev_base: sys::CUdeviceptr,
    staging: Option<(Arc<Storage>, *mut u8)>,
    staged_len: usize,
    direct_len: usize,
}

/// A device-to-somewhere copy: from device memory to pinned host memory or another device.
struct DeviceCopy {
    src: sys::CUdeviceptr,
    /// The source's storage, which records the copy as a reader when it is on another stream.
    src_storage: Arc<Storage>,
    src_device: Arc<CudaDevice>,
    dst: Target,
    bytes: usize,
}

enum Target {
    Host(*mut u8),
    Device(sys::CUdeviceptr),
}

/// What [`ToDevice::to_device_with`] works through: the target, the field path for errors,
/// and the plan of copies that is carried out once the whole batch is reserved.
///
/// Implementations must walk the same tensors in the same order every time they are called on
/// the same value (the derive and the std impls do): the first walk measures, the second builds.
pub struct MoveContext<'a> {
    target: &'a Device,
    non_blocking: bool,
    pool: &'a PinnedPool,
    path: FieldPath,
    ready: Ready,
    pass: Pass,
    staged_bytes: usize,
    direct_bytes: usize,
    arena: Option<Arena>,
    staged_cursor: usize,
    direct_cursor: usize,
    reserved: usize,
    uploads: Vec<Upload>,
    staged: Vec<HostCopy>,
    /// Device destination of each staged copy, and whether it lies in the arena (mergeable).
    staged_dst: Vec<(sys::CUdeviceptr, bool)>,
    downloads: Vec<DeviceCopy>,
    /// Events the target stream must wait on before copying (sources still being filled).
    waits: Vec<Arc<Event>>,
    /// Sources and destinations kept alive until the copies are issued; pinned blocks among
    /// them get the ready event recorded on them.
    keep: Vec<Arc<Storage>>,
}

impl<'a> MoveContext<'a> {
    /// Walks the batch with `f` (twice when the target is a device: measure, then build),
    /// reserving every destination before the first copy, then issues the copies.
    ///
    /// # Errors
    ///
    /// Whatever `f` returns; [`Error::DeviceOutOfMemory`] if the batch does not fit; a driver
    /// error while issuing copies.
    pub fn run<T>(
        target: &'a Device,
        non_blocking: bool,
        pool: &'a PinnedPool,
        mut f: impl FnMut(&mut MoveContext<'a>) -> Result<T>,
    ) -> Result<T> {
        let mut cx = MoveContext {
            target,
            non_blocking,
            pool,
            path: FieldPath::new(),
            ready: Arc::new(OnceLock::new()),
            pass: Pass::Build,
            staged_bytes: 0,
            direct_bytes: 0,
            arena: None,
            staged_cursor: 0,
            direct_cursor: 0,
            reserved: 0,
            uploads: Vec::new(),
            staged: Vec::new(),
            staged_dst: Vec::new(),
            downloads: Vec::new(),
            waits: Vec::new(),
            keep: Vec::new(),
        };
        if target.ordinal().is_some() {
            cx.pass = Pass::Measure;
            drop(f(&mut cx)?);
            cx.reserve()?;
            cx.pass = Pass::Build;
            cx.path = FieldPath::new();
        }
        let value = f(&mut cx)?;
        cx.issue()?;
        Ok(value)
    }

    /// Reserves the arena and the staging block measured by the first walk.
    fn reserve(&mut self) -> Result<()> {
        let total = self.staged_bytes + self.direct_bytes;
        if total == 0 {
            return Ok(());
        }
        let dev = self.target.cuda_device("to_device")?.clone();
        let buf = self.alloc_device(&dev, total)?;
        let dev_base = buf.slice().device_ptr(&dev.copy_stream).0;
        let staging = if self.staged_bytes > 0 {
            let block = self.pool.alloc(self.staged_bytes)?;
            let base = block.as_ptr();
            let storage = Arc::new(Storage {
                data: Data::Pinned(block),
                ready: None,
            });
            // The device copies read the staging block after this move returns: keeping it
            // here records the ready event on it, so the pool holds it back until they finish.
            self.keep.push(storage.clone());
            Some((storage, base))
        } else {
            None
        };
        self.arena = Some(Arena {
            device: Arc::new(Storage {
                data: Data::Device(buf),
                ready: Some(self.ready.clone()),
            }),
            dev_base,
            staging,
            staged_len: self.staged_bytes,
            direct_len: self.direct_bytes,
        });
        Ok(())
    }

    fn alloc_device(&mut self, dev: &Arc<CudaDevice>, bytes: usize) -> Result<DeviceBuffer> {
        // SAFETY: the memory is uninitialised until the planned copies fill it; nothing reads it
        // before the ready event, which is recorded after them.
        match unsafe { dev.copy_stream.alloc::<u8>(bytes.max(1)) } {
            Ok(s) => {
                self.reserved += bytes;
                Ok(DeviceBuffer::new(s, dev.clone()))
            }
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                Err(Error::DeviceOutOfMemory {
                    device: self.target.to_string(),
                    requested: self.reserved + bytes,
                    free: self.target.free_memory().unwrap_or(0),
                })
            }
            Err(e) => Err(Error::driver("cuMemAllocAsync", e).at_path(&self.path.to_string())),
        }
    }

    /// The device tensors are moved to.
    pub fn device(&self) -> &'a Device {
        self.target
    }

    /// Whether the caller asked not to wait for the copies.
    pub fn non_blocking(&self) -> bool {
        self.non_blocking
    }

    /// The pool staging blocks and host destinations come from.
    pub fn pool(&self) -> &'a PinnedPool {
        self.pool
    }

    /// Where in the batch the current value sits.
    pub fn path(&self) -> &FieldPath {
        &self.path
    }

    /// An error about the current value, carrying its field path.
    pub fn error(&self, message: impl Into<String>) -> Error {
        Error::Field {
            path: self.path.to_string(),
            message: message.into(),
        }
    }

    /// Moves one tensor: takes its place in the batch's reservation and plans its copy.
    ///
    /// # Errors
    ///
    /// [`Error::NotDenseCpu`] for a source that is not dense data, allocation errors,
    /// [`Error::CudaUnavailable`].
    pub fn move_tensor(&mut self, t: &Tensor) -> Result<Tensor> {
        let src_placement = t.placement();
        match (src_placement.is_host(), self.target.ordinal()) {
            (true, None) => Ok(t.clone()),
            (false, Some(n)) if t.device().ordinal() == Some(n) => Ok(t.clone()),
            (true, Some(_)) => self.upload(t),
            (false, None) => self.download(t),
            (false, Some(_)) => self.device_to_device(t),
        }
    }

    /// A fresh device buffer outside the arena, for a walk that moves more than it measured.
    fn device_buffer(&mut self, bytes: usize) -> Result<DeviceBuffer> {
        let dev = self.target.cuda_device("to_device")?.clone();
        self.alloc_device(&dev, bytes)
    }

    /// Where `t`'s `bytes` go on the device when they need no staging: a place in the arena's
    /// direct region, or a buffer of their own once the measured room is used up. Returns the
    /// result tensor and its device address.
    fn place_direct(
        &mut self,
        t: &Tensor,
        bytes: usize,
        contiguous: bool,
    ) -> Result<(Tensor, sys::CUdeviceptr)> {
        if let Some((arena, offset, dst)) = self.direct_slot(bytes) {
            return Ok((t.placed_in(&arena, offset, contiguous), dst));
        }
        let buf = self.device_buffer(bytes)?;
        let dst = buf.slice().device_ptr(&buf.device.copy_stream).0;
        Ok((self.result(t, Data::Device(buf), contiguous), dst))
    }

    /// A place in the arena's direct region, if the measured room is not used up.
    fn direct_slot(&mut self, bytes: usize) -> Option<(Arc<Storage>, usize, sys::CUdeviceptr)> {
        let arena = self.arena.as_ref()?;
        if self.direct_cursor + bytes > arena.direct_len {
            return None;
        }
        let offset = arena.staged_len + self.direct_cursor;
        self.direct_cursor += align(bytes);
        Some((arena.device.clone(), offset, arena.dev_base + offset as u64))
    }

    fn wait_for(&mut self, t: &Tensor) {
        if let Some(event) = t.storage().ready.as_ref().and_then(|r| r.get())
            && !event.is_complete()
        {
            self.waits.push(event.clone());
        }
    }

    fn result(&mut self, t: &Tensor, data: Data, contiguous: bool) -> Tensor {
        let out = t.with_storage(
            Storage {
                data,
                ready: Some(self.ready.clone()),
            },
            contiguous,
        );
        self.keep.push(t.storage().clone());
        self.keep.push(out.storage().clone());
        out
    }

    fn upload(&mut self, t: &Tensor) -> Result<Tensor> {
        check::dense_cpu(t, &self.path)?;
        let bytes = t.nbytes();
        let direct = t.is_contiguous()
            && t.pinned_block()
                .is_some_and(|b| b.backend() != crate::alloc::BackendKind::Mlock);
        if self.pass == Pass::Measure {
            if direct {
                self.direct_bytes += align(bytes);
            } else {
                self.staged_bytes += align(bytes);
            }
            return Ok(t.clone());
        }
        if direct {
            self.wait_for(t);
            let (out, dst) = self.place_direct(t, bytes, true)?;
            let base = t
                .storage()
                .host_ptr()
                .expect("pinned tensors are on the host");
            self.uploads.push(Upload {
                // SAFETY: the offset lies within the block.
                src: unsafe { base.add(t.byte_offset()) },
                bytes,
                dst,
                storage: Arc::as_ptr(t.storage()),
            });
            self.keep.push(t.storage().clone());
            return Ok(out);
        }
        let src = t.host_src("to_device")?;
        let in_arena = self.arena.as_ref().and_then(|a| {
            let (_, base) = a.staging.as_ref()?;
            (self.staged_cursor + bytes <= a.staged_len).then(|| {
                let offset = self.staged_cursor;
                // SAFETY: `offset + bytes` lies within the staging block (checked above).
                let stage = unsafe { base.add(offset) };
                (a.device.clone(), offset, stage, a.dev_base + offset as u64)
            })
        });
        let out = match in_arena {
            Some((arena, offset, stage, dst)) => {
                self.staged_cursor += align(bytes);
                self.staged.push(HostCopy { src, dst: stage });
                self.staged_dst.push((dst, true));
                t.placed_in(&arena, offset, true)
            }
            None => {
                let buf = self.device_buffer(bytes)?;
                let dst = buf.slice().device_ptr(&buf.device.copy_stream).0;
                let block = self.pool.alloc(bytes)?;
                self.staged.push(HostCopy {
                    src,
                    dst: block.as_ptr(),
                });
                self.staged_dst.push((dst, false));
                self.keep.push(Arc::new(Storage {
                    data: Data::Pinned(block),
                    ready: None,
                }));
                self.result(t, Data::Device(buf), true)
            }
        };
        self.keep.push(t.storage().clone());
        Ok(out)
    }

    fn span_bytes(t: &Tensor) -> (usize, usize) {
        let (first, end) = t.span();
        let elem = t.dtype().size();
        (first * elem, (end - first) * elem)
    }

    fn download(&mut self, t: &Tensor) -> Result<Tensor> {
        let Data::Device(src) = &t.storage().data else {
            unreachable!("a non-host tensor is on a device")
        };
        let (start, bytes) = Self::span_bytes(t);
        let block = self.pool.alloc(bytes)?;
        let dst = block.as_ptr();
        let (src_ptr, _) = src.slice().device_ptr(&src.device.copy_stream);
        self.wait_for(t);
        self.downloads.push(DeviceCopy {
            src: src_ptr + start as u64,
            src_storage: t.storage().clone(),
            src_device: src.device.clone(),
            dst: Target::Host(dst),
            bytes,
        });
        let contiguous = t.is_contiguous();
        Ok(self.result(t, Data::Pinned(block), contiguous))
    }

    fn device_to_device(&mut self, t: &Tensor) -> Result<Tensor> {
        let (start, bytes) = Self::span_bytes(t);
        if self.pass == Pass::Measure {
            self.direct_bytes += align(bytes);
            return Ok(t.clone());
        }
        let Data::Device(src) = &t.storage().data else {
            unreachable!("a non-host tensor is on a device")
        };
        let src_ptr = src.slice().device_ptr(&src.device.copy_stream).0;
        let src_device = src.device.clone();
        self.wait_for(t);
        let contiguous = t.is_contiguous();
        let (out, dst) = self.place_direct(t, bytes, contiguous)?;
        self.downloads.push(DeviceCopy {
            src: src_ptr + start as u64,
            src_storage: t.storage().clone(),
            src_device,
            dst: Target::Device(dst),
            bytes,
        });
        self.keep.push(t.storage().clone());
        Ok(out)
    }

    /// Issues every planned copy, records the ready event and hands it to the results.
    fn issue(self) -> Result<()> {
        let nothing =
            self.uploads.is_empty() && self.staged.is_empty() && self.downloads.is_empty();
        if nothing {
            return Ok(());
        }
        // Copies to the host run on the source device's copy stream; everything else on the
        // target's.
        let dev: Arc<CudaDevice> = match self.target.ordinal() {
            Some(_) => self.target.cuda_device("to_device")?.clone(),
            None => self.downloads[0].src_device.clone(),
        };
        let stream = &dev.copy_stream;
        dev.ctx
            .bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        for w in &self.waits {
            w.wait_on(stream)?;
        }
        for u in merge_uploads(&self.uploads) {
            // SAFETY: `src..src + bytes` lies within one live pinned block (held in `keep`, then
            // guarded by the ready event recorded below); `dst..dst + bytes` within a fresh
            // device allocation on this stream.
            let r = unsafe {
                sys::cuMemcpyHtoDAsync_v2(u.dst, u.src.cast(), u.bytes, stream.cu_stream())
            };
            check_cu(r, "cuMemcpyHtoDAsync")?;
        }
        if !self.staged.is_empty() {
            let pieces = copy::plan(&self.staged);
            let frontier = Mutex::new(Frontier {
                done: vec![false; pieces.len()],
                next: 0,
                pending: None,
            });
            let (staged, staged_dst, ctx) = (&self.staged, &self.staged_dst, &dev.ctx);
            let send = |run: Run| -> Result<()> {
                // SAFETY: the run's staging bytes were written by finished pieces (and are guarded
                // by the ready event from here on); its device range lies in a live allocation.
                let r = unsafe {
                    sys::cuMemcpyHtoDAsync_v2(
                        run.dst,
                        run.src.cast(),
                        run.bytes,
                        stream.cu_stream(),
                    )
                };
                check_cu(r, "cuMemcpyHtoDAsync")
            };
            let on_piece = |i: usize| -> Result<()> {
                ctx.bind_to_thread()
                    .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
                // The lock orders the device copies by staging address so runs can be merged;
                // only this move's copy threads contend for it.
                let mut f = frontier.lock().unwrap_or_else(|e| e.into_inner());
                f.done[i] = true;
                while f.next < pieces.len() && f.done[f.next] {
                    let p = &pieces[f.next];
                    let (dst, mergeable) = staged_dst[p.copy];
                    let piece = Run {
                        // SAFETY: within the piece's staging destination.
                        src: unsafe { staged[p.copy].dst.add(p.dst.start) },
                        dst: dst + p.dst.start as u64,
                        bytes: p.dst.len(),
                        mergeable,
                    };
                    f.next += 1;
                    let merged = f.pending.as_mut().is_some_and(|run| run.absorb(&piece));
                    if !merged && let Some(run) = f.pending.replace(piece) {
                        send(run)?;
                    }
                    if f.pending.as_ref().is_some_and(|r| r.bytes >= chunk()) {
                        send(f.pending.take().expect("checked"))?;
                    }
                }
                if f.next == pieces.len()
                    && let Some(run) = f.pending.take()
                {
                    send(run)?;
                }
                Ok(())
            };
            // SAFETY: sources are held in `keep`; each destination is a staging block written by
            // nothing else.
            unsafe {
                copy::run_pieces(staged, &pieces, copy::Share::ThreeQuarters, Some(&on_piece))?
            };
        }
        for d in &self.downloads {
            // SAFETY: source and destination are live allocations of at least `bytes` (held in
            // `keep`), and the stream waited for the source to be ready.
            let r = unsafe {
                match d.dst {
                    Target::Host(p) => {
                        sys::cuMemcpyDtoHAsync_v2(p.cast(), d.src, d.bytes, stream.cu_stream())
                    }
                    Target::Device(p) => sys::cuMemcpyPeerAsync(
                        p,
                        dev.ctx.cu_ctx(),
                        d.src,
                        d.src_device.ctx.cu_ctx(),
                        d.bytes,
                        stream.cu_stream(),
                    ),
                }
            };
            check_cu(r, "cuMemcpyAsync")?;
            if !Arc::ptr_eq(&d.src_device, &dev)
                && let Data::Device(src) = &d.src_storage.data
            {
                {
                    let read = stream
                        .record_event(None)
                        .map_err(|e| Error::driver("cuEventRecord", e))?;
                    src.add_reader(read);
                }
            }
        }
        let event = Arc::new(dev.record()?);
        for s in &self.keep {
            if let Data::Pinned(b) = &s.data {
                b.record_use(event.clone() as Arc<dyn Fence>);
            }
        }
        let _ = self.ready.set(event.clone());
        if !self.non_blocking {
            event.synchronize()?;
        }
        Ok(())
    }
}

/// A run of bytes to send to the device in one copy.
struct Run {
    src: *const u8,
    dst: sys::CUdeviceptr,
    bytes: usize,
    /// Whether neighbouring runs may be merged with this one (both in the batch's arena, where
    /// the staging block and the device mirror each other, padding included).
    mergeable: bool,
}

impl Run {
    /// Extends `self` over `next` when `next` follows it in both host and device memory (with
    /// at most the arena's alignment padding between them).
    fn absorb(&mut self, next: &Run) -> bool {
        let end = self.src as usize + self.bytes;
        let gap = (next.src as usize).wrapping_sub(end);
        let same_shift = (next.src as usize).wrapping_sub(self.src as usize) as u64
            == next.dst.wrapping_sub(self.dst);
        if self.mergeable && next.mergeable && gap < ALIGN && same_shift {
            self.bytes = next.src as usize + next.bytes - self.src as usize;
            true
        } else {
            false
        }
    }
}

/// Which staged pieces have landed, and the run not yet sent.
struct Frontier {
    done: Vec<bool>,
    next: usize,
    pending: Option<Run>,
}

// SAFETY: the raw pointers in a pending run point into the staging block, which outlives the
// move; the frontier is only touched under its mutex.
unsafe impl Send for Frontier {}

/// Merges uploads that read neighbouring bytes of one pinned block into neighbouring device
/// bytes, so a batch pinned into one block moves in few copies.
fn merge_uploads(uploads: &[Upload]) -> Vec<Run> {
    let mut out: Vec<(Run, *const Storage)> = Vec::with_capacity(uploads.len());
    for u in uploads {
        let run = Run {
            src: u.src,
            dst: u.dst,
            bytes: u.bytes,
            mergeable: true,
        };
        if let Some((last, storage)) = out.last_mut()
            && *storage == u.storage
            && last.absorb(&run)
        {
            continue;
        }
        out.push((run, u.storage));
    }
    out.into_iter().map(|(r, _)| r).collect()
}

fn check_cu(r: sys::CUresult, call: &'static str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::driver(call, cudarc::driver::DriverError(r)))
    }
}

impl Walk for MoveContext<'_> {
    fn path_mut(&mut self) -> &mut FieldPath {
        &mut self.path
    }
}
