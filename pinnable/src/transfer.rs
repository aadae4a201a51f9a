//! `ToDevice`: stream-ordered copies of a batch to a CUDA device and back.
//!
//! A move runs in two phases. The walk over the batch (the derive's or a hand-written
//! [`ToDevice::to_device_with`]) reserves every destination: device memory on the target's copy
//! stream and, for pageable sources, pinned staging blocks. Only when the whole batch is
//! reserved are copies issued, so an out-of-memory error leaves nothing half-moved. One event
//! recorded after the last copy is the *ready* event of every tensor of the result, and is
//! recorded on every pinned block the copies read, which keeps those blocks from being reused
//! or written until the copies are done.

use std::ops::Range;
use std::sync::{Arc, OnceLock};

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

/// A host-to-device copy from pinned memory: source block, offset, device destination.
struct Upload {
    src: *const u8,
    bytes: usize,
    dst: sys::CUdeviceptr,
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
pub struct MoveContext<'a> {
    target: &'a Device,
    non_blocking: bool,
    pool: &'a PinnedPool,
    path: FieldPath,
    ready: Ready,
    reserved: usize,
    uploads: Vec<Upload>,
    staged: Vec<HostCopy>,
    /// Device destinations of `staged`, by index.
    staged_dst: Vec<sys::CUdeviceptr>,
    downloads: Vec<DeviceCopy>,
    /// Events the target stream must wait on before copying (sources still being filled).
    waits: Vec<Arc<Event>>,
    /// Sources and destinations kept alive until the copies are issued; pinned blocks among
    /// them get the ready event recorded on them.
    keep: Vec<Arc<Storage>>,
}

impl<'a> MoveContext<'a> {
    /// Runs `f` with a fresh context (reserving every destination), then issues the copies.
    ///
    /// # Errors
    ///
    /// Whatever `f` returns, or a driver error while issuing copies.
    pub fn run<T>(
        target: &'a Device,
        non_blocking: bool,
        pool: &'a PinnedPool,
        f: impl FnOnce(&mut MoveContext<'a>) -> Result<T>,
    ) -> Result<T> {
        let mut cx = MoveContext {
            target,
            non_blocking,
            pool,
            path: FieldPath::new(),
            ready: Arc::new(OnceLock::new()),
            reserved: 0,
            uploads: Vec::new(),
            staged: Vec::new(),
            staged_dst: Vec::new(),
            downloads: Vec::new(),
            waits: Vec::new(),
            keep: Vec::new(),
        };
        let value = f(&mut cx)?;
        cx.issue()?;
        Ok(value)
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

    /// Moves one tensor: reserves its destination now and plans its copy.
    ///
    /// # Errors
    ///
    /// [`Error::DeviceOutOfMemory`], allocation errors from the pool, [`Error::CudaUnavailable`].
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

    fn device_buffer(&mut self, bytes: usize) -> Result<DeviceBuffer> {
        let dev = self.target.cuda_device("to_device")?.clone();
        // SAFETY: the memory is uninitialised until the planned copy fills it; nothing reads it
        // before the ready event, which is recorded after that copy.
        let slice = unsafe { dev.copy_stream.alloc::<u8>(bytes.max(1)) };
        match slice {
            Ok(s) => {
                self.reserved += bytes;
                Ok(DeviceBuffer::new(s, dev))
            }
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                Err(Error::DeviceOutOfMemory {
                    device: self.target.to_string(),
                    path: self.path.to_string(),
                    requested: self.reserved + bytes,
                    free: self.target.free_memory().unwrap_or(0),
                })
            }
            Err(e) => Err(Error::driver("cuMemAllocAsync", e).at_path(&self.path.to_string())),
        }
    }

    fn wait_for(&mut self, t: &Tensor) {
        if let Some(event) = t.storage().ready.as_ref().and_then(|r| r.get()) {
            if !event.is_complete() {
                self.waits.push(event.clone());
            }
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
        let buf = self.device_buffer(bytes)?;
        let (dst, _) = buf.slice().device_ptr(&buf.device.copy_stream);
        let direct = t.is_contiguous()
            && t.pinned_block()
                .is_some_and(|b| b.backend() != crate::alloc::BackendKind::Mlock);
        if direct {
            self.wait_for(t);
            let base = t
                .storage()
                .host_ptr()
                .expect("pinned tensors are on the host");
            self.uploads.push(Upload {
                // SAFETY: the offset lies within the block.
                src: unsafe { base.add(t.byte_offset()) },
                bytes,
                dst,
            });
        } else {
            let block = self.pool.alloc(bytes)?;
            let src = t.host_src("to_device")?;
            self.staged.push(HostCopy {
                src,
                dst: block.as_ptr(),
            });
            self.staged_dst.push(dst);
            self.keep.push(Arc::new(Storage {
                data: Data::Pinned(block),
                ready: None,
            }));
        }
        Ok(self.result(t, Data::Device(buf), true))
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
        let Data::Device(src) = &t.storage().data else {
            unreachable!("a non-host tensor is on a device")
        };
        let src_ptr = src.slice().device_ptr(&src.device.copy_stream).0;
        let src_device = src.device.clone();
        let (start, bytes) = Self::span_bytes(t);
        let buf = self.device_buffer(bytes)?;
        let (dst, _) = buf.slice().device_ptr(&buf.device.copy_stream);
        self.wait_for(t);
        self.downloads.push(DeviceCopy {
            src: src_ptr + start as u64,
            src_storage: t.storage().clone(),
            src_device,
            dst: Target::Device(dst),
            bytes,
        });
        let contiguous = t.is_contiguous();
        Ok(self.result(t, Data::Device(buf), contiguous))
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
        for u in &self.uploads {
            // SAFETY: `src` is a live pinned block of at least `bytes` (held in `keep`, then
            // guarded by the ready event recorded below); `dst` is a fresh device allocation of
            // at least `bytes` on this stream.
            let r = unsafe {
                sys::cuMemcpyHtoDAsync_v2(u.dst, u.src.cast(), u.bytes, stream.cu_stream())
            };
            check_cu(r, "cuMemcpyHtoDAsync")?;
        }
        if !self.staged.is_empty() {
            let staged_dst = &self.staged_dst;
            let staged = &self.staged;
            let ctx = &dev.ctx;
            let on_piece = |i: usize, range: Range<usize>| -> Result<()> {
                ctx.bind_to_thread()
                    .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
                // SAFETY: the staging block holds the piece's bytes (just written, and guarded by
                // the ready event from here on); the device range lies in its fresh allocation.
                let r = unsafe {
                    sys::cuMemcpyHtoDAsync_v2(
                        staged_dst[i] + range.start as u64,
                        staged[i].dst.add(range.start).cast(),
                        range.len(),
                        stream.cu_stream(),
                    )
                };
                check_cu(r, "cuMemcpyHtoDAsync")
            };
            // SAFETY: sources are held in `keep`; each destination is a fresh staging block.
            unsafe { copy::run(&self.staged, Some(&on_piece))? };
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
            if !Arc::ptr_eq(&d.src_device, &dev) {
                if let Data::Device(src) = &d.src_storage.data {
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
