#[cfg(feature = "candle-cuda")]
mod apart;
mod engine;
mod fault;
mod issue;
mod plan;
mod stacked;

pub(crate) use stacked::Stacking;

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaStream, sys};

use crate::alloc::PinnedPool;
use crate::check;
use crate::copy::HostCopy;
use crate::cuda::{Device, Event};
use crate::error::{Error, Result};
use crate::path::{FieldPath, Walk};
use crate::tensor::{Arena, DeviceBuffer, Memory, Placement, Ready, Source, Tensor};
use engine::dma::{Dir, DirectCopy};
use issue::Copies;
use plan::{Plan, Slot, Staging};

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
///
/// # How a move runs
///
/// `ToDevice`: stream-ordered copies of a batch to a CUDA device and back.
///
/// A move walks the batch twice (through the derive's or a hand-written
/// [`ToDevice::to_device_with`]). The first walk only measures: it checks every tensor and adds
/// up the bytes (`plan`). Then the whole batch is reserved at once: one destination (the
/// batch's *arena*: a device allocation, or a pinned block when moving to the host; each moved
/// tensor is a view into it) and one pinned staging block for pageable sources. An
/// out-of-memory error therefore comes back before anything is copied. The second walk builds
/// the result and plans the copies; then they are issued (`issue`): a pinned batch (one
/// block) as one copy, staged bytes as a few large copies that start while staging goes on.
///
/// One event recorded after the last copy is the *ready* event of every tensor of the result,
/// and is recorded on every pinned block the copies read or write, which keeps those blocks
/// from being reused or written until the copies are done.
pub trait ToDevice: Sized {
    /// The recursive step: a copy of `self` with every tensor moved through `cx`.
    ///
    /// # Errors
    ///
    /// Whatever moving a part returns, with its field path.
    fn to_device_with(&self, cx: &mut MoveContext<'_>) -> Result<Self>;

    /// The first of a move's two walks: checks and measures every tensor of `self` through
    /// `cx` in the order [`to_device_with`](Self::to_device_with) moves them, building
    /// nothing. The default runs `to_device_with` and drops what it returns; the derive and
    /// this crate's impls walk without building (a thousand tensors measured, not cloned).
    ///
    /// # Errors
    ///
    /// As [`to_device_with`](Self::to_device_with).
    fn measure_with(&self, cx: &mut MoveContext<'_>) -> Result<()> {
        self.to_device_with(cx).map(drop)
    }

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
        MoveContext::run_ready(
            device,
            non_blocking,
            PinnedPool::global(),
            |cx| self.measure_with(cx),
            |cx| self.to_device_with(cx),
        )
        .map(|(moved, _)| moved)
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

/// Which walk is running.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Check and add up bytes; results are placeholders.
    Measure,
    /// Build the result in the reserved arena and plan the copies.
    Build,
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
    pass: Pass,
    /// The event every result tensor waits on, set once the copies are issued.
    ready: Ready,
    plan: Plan,
    /// The batch's destination, reserved after the first walk: results are its parts.
    arena: Option<Arena>,
    staging: Option<Staging>,
    /// Streams of other libraries that consume the result: each waits for the copies.
    consumers: Vec<Arc<CudaStream>>,
    /// Tensors moved into allocations of their own, for candle.
    #[cfg(feature = "candle-cuda")]
    apart: apart::Apart,
    /// Device bytes allocated so far, for out-of-memory messages.
    reserved: usize,
    copies: Copies,
}

impl<'a> MoveContext<'a> {
    /// Walks the batch with `f` twice (measure, then build), reserving every destination in
    /// between, then issues the copies.
    ///
    /// # Errors
    ///
    /// Whatever `f` returns; [`Error::DeviceOutOfMemory`] if the batch does not fit; a driver
    /// error while issuing copies. Nothing is copied when an error comes back before the
    /// copies are issued.
    pub fn run<T>(
        target: &'a Device,
        non_blocking: bool,
        pool: &'a PinnedPool,
        mut f: impl FnMut(&mut MoveContext<'a>) -> Result<T>,
    ) -> Result<T> {
        let f = std::cell::RefCell::new(&mut f);
        Self::run_ready(
            target,
            non_blocking,
            pool,
            |cx| (f.borrow_mut())(cx).map(drop),
            |cx| (f.borrow_mut())(cx),
        )
        .map(|(value, _)| value)
    }

    /// As [`run`](Self::run), with the first walk `measure` (which builds nothing) apart from
    /// the second, `build`; also returns the move's ready event (`None` when it copied
    /// nothing): a caller that keeps something until the copies finish waits on it, instead
    /// of recording an event of its own.
    pub(crate) fn run_ready<T>(
        target: &'a Device,
        non_blocking: bool,
        pool: &'a PinnedPool,
        measure: impl FnOnce(&mut MoveContext<'a>) -> Result<()>,
        build: impl FnOnce(&mut MoveContext<'a>) -> Result<T>,
    ) -> Result<(T, Option<Arc<crate::cuda::Event>>)> {
        let mut cx = MoveContext {
            target,
            non_blocking,
            pool,
            path: FieldPath::new(),
            pass: Pass::Measure,
            ready: Arc::new(OnceLock::new()),
            plan: Plan::default(),
            arena: None,
            staging: None,
            consumers: Vec::new(),
            #[cfg(feature = "candle-cuda")]
            apart: apart::Apart::default(),
            reserved: 0,
            copies: Copies::default(),
        };
        measure(&mut cx)?;
        cx.reserve()?;
        cx.pass = Pass::Build;
        cx.path = FieldPath::new();
        // The first launch starts copies that run while `build` walks the batch: whether
        // `build` fails or panics, the blocks those copies read are fenced before the context
        // (and with it the move's hold on them) goes.
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            cx.launch().and_then(|()| build(&mut cx))
        }));
        match built {
            Ok(Ok(value)) => {
                let ready = cx.ready.clone();
                cx.issue()?;
                Ok((value, ready.get().cloned()))
            }
            Ok(Err(e)) => {
                cx.fence_launched();
                Err(e)
            }
            Err(panic) => {
                cx.fence_launched();
                std::panic::resume_unwind(panic)
            }
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

    /// Moves one tensor: takes its place in the batch's reservation and plans its copy.
    ///
    /// # Errors
    ///
    /// [`Error::NotDenseCpu`] for a source that is not dense data, allocation errors,
    /// [`Error::CudaUnavailable`].
    pub fn move_tensor(&mut self, t: &Tensor) -> Result<Tensor> {
        Ok(self.route(t)?.unwrap_or_else(|| t.clone()))
    }

    /// The first walk's step for one tensor: checks it and notes the room it takes, as
    /// [`move_tensor`](Self::move_tensor) does then, without building a placeholder.
    ///
    /// # Errors
    ///
    /// As [`move_tensor`](Self::move_tensor).
    pub fn measure_tensor(&mut self, t: &Tensor) -> Result<()> {
        self.route(t).map(drop)
    }

    /// Moves `t` by whichever way it takes; `None` for the first walk (nothing built) and for
    /// a tensor that stays as it is.
    fn route(&mut self, t: &Tensor) -> Result<Option<Tensor>> {
        let src = t.source();
        match (src.memory.placement(), self.target.ordinal()) {
            (p, None) if p.is_host() => Ok(None),
            (Placement::Cuda(n), Some(m)) if n == m => Ok(None),
            (p, Some(_)) if p.is_host() => {
                check::dense_cpu(t, &self.path)?;
                if src.memory.is_registered_pinned() && t.is_contiguous() {
                    self.direct(t, &src)
                } else {
                    self.staged(t)
                }
            }
            _ => self.direct(t, &src),
        }
    }

    /// Reserves what the first walk measured: the arena, the allocations of tensors moved
    /// apart, and the staging block.
    fn reserve(&mut self) -> Result<()> {
        if let Some(total) = self.plan.lay_out() {
            self.arena = Some(self.own_destination(total)?);
        }
        let staging_bytes = self.plan.staged_bytes;
        #[cfg(feature = "candle-cuda")]
        let staging_bytes = staging_bytes + self.reserve_apart()?;
        if staging_bytes > 0 {
            let block = Arc::new(self.pool.alloc(staging_bytes)?);
            let ptr = block.as_ptr();
            // The device copies read the staging block after this move returns: recording the
            // ready event on it holds it back in the pool until they finish.
            self.copies.blocks.push(block.clone());
            self.staging = Some(Staging { ptr });
        }
        let Some(arena) = &self.arena else {
            return Ok(());
        };
        for g in &self.plan.groups {
            let memory = g.storage.memory();
            // Every group's block is read by this move's copies: it gets the ready event.
            if let Memory::Pinned(b) = memory {
                self.copies.blocks.push(b.clone());
            }
            if let Some(at) = g.mirror {
                self.copies.direct.push(direct_copy(
                    memory,
                    g.storage.buffer_id(),
                    g.span.clone(),
                    arena.at(at),
                    self.target,
                ));
            }
        }
        Ok(())
    }

    fn alloc_device(&mut self, bytes: usize) -> Result<DeviceBuffer> {
        let dev = self.target.cuda_device("to_device")?.clone();
        // SAFETY: the memory is uninitialised until the planned copies fill it; nothing reads it
        // before the ready event, which is recorded after them.
        match unsafe { dev.alloc(bytes.max(1)) } {
            Ok(s) => {
                self.reserved += bytes;
                Ok(DeviceBuffer::new(s, dev))
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

    /// A destination of `bytes`: the arena, or one outside it for a walk that moves more than
    /// it measured.
    fn own_destination(&mut self, bytes: usize) -> Result<Arena> {
        if self.target.ordinal().is_some() {
            let buf = self.alloc_device(bytes)?;
            Ok(Arena::device(buf, &self.ready))
        } else {
            let block = Arc::new(self.pool.alloc(bytes)?);
            self.copies.blocks.push(block.clone());
            Ok(Arena::pinned(block, &self.ready))
        }
    }

    /// The batch's arena, reserved after the first walk.
    fn arena(&self) -> &Arena {
        self.arena.as_ref().expect("a placed tensor has an arena")
    }

    /// Makes the copies wait for a source that is itself still being filled.
    fn wait_for(&mut self, ready: Option<&Arc<Event>>) {
        if let Some(event) = ready
            && !event.is_complete()
            && !self
                .copies
                .waits
                .last()
                .is_some_and(|w| Arc::ptr_eq(w, event))
        {
            self.copies.waits.push(event.clone());
        }
    }

    /// A source the copy engine reads as it is: registered pinned memory or device memory.
    /// Its span is copied (a strided view keeps its strides).
    fn direct(&mut self, t: &Tensor, src: &Source<'_>) -> Result<Option<Tensor>> {
        // Noted in both walks: mirrors are copied right after the first one.
        self.wait_for(src.ready);
        if self.pass == Pass::Measure {
            self.plan.note_direct(src);
            return Ok(None);
        }
        let moved = match self.plan.place_direct(src) {
            Slot::Mirrored(at) => {
                let arena = self.arena.as_mut().expect("placed in the arena");
                arena.mirrored(t, at)
            }
            Slot::Single(at) => {
                let arena = self.arena.as_ref().expect("placed in the arena");
                let dst = arena.at(at);
                let copy = direct_copy(src.memory, src.buffer, src.span.clone(), dst, self.target);
                self.copies.direct.push(copy);
                arena.spanned(t, at)
            }
            Slot::Outside => {
                let own = self.own_destination(src.span.len())?;
                self.copy_alone(src, own.at(0));
                own.spanned(t, 0)
            }
        };
        Ok(Some(moved))
    }

    /// Plans a direct copy of `src`'s span to `dst`, outside any group: no group holds that
    /// buffer alive until the copy is issued, nor noted its block, so this does.
    fn copy_alone(&mut self, src: &Source<'_>, dst: u64) {
        let copy = direct_copy(src.memory, src.buffer, src.span.clone(), dst, self.target);
        self.copies.direct.push(copy);
        self.copies.keep.push(src.hold());
        if let Memory::Pinned(b) = src.memory {
            self.copies.note_block(b);
        }
    }

    /// A source that is staged through pinned memory by the copy threads, then copied.
    fn staged(&mut self, t: &Tensor) -> Result<Option<Tensor>> {
        let bytes = t.nbytes();
        if self.pass == Pass::Measure {
            self.plan.note_staged(bytes);
            return Ok(None);
        }
        if bytes == 0 {
            let at = self.plan.place_staged(0).unwrap_or(0);
            return Ok(Some(self.arena().contiguous(t, at)));
        }
        let slot = self.plan.place_staged(bytes).and_then(|at| {
            let arena = self.arena.as_ref()?;
            Some((at, self.staging.as_ref()?.at(at), arena.at(at)))
        });
        match slot {
            Some((at, stage, dst)) => {
                self.stage(t, stage, dst, true)?;
                Ok(Some(self.arena().contiguous(t, at)))
            }
            None => {
                let own = self.own_destination(bytes)?;
                self.stage_alone(t, own.at(0))?;
                Ok(Some(own.contiguous(t, 0)))
            }
        }
    }

    /// Plans gathering `t` into `stage` and the device copy of those bytes to `dst`
    /// (`mergeable`: both lie in the arena, where staging block and device mirror each other).
    fn stage(&mut self, t: &Tensor, stage: *mut u8, dst: u64, mergeable: bool) -> Result<()> {
        let src = t.host_src("to_device")?;
        self.copies.staged.push(HostCopy {
            src: src.into(),
            dst: stage,
        });
        self.copies.staged_dst.push(Some((dst, mergeable)));
        self.copies.keep.push(t.storage().clone());
        Ok(())
    }

    /// As [`stage`](Self::stage), through a pinned block of its own (the walk staged more than
    /// it measured).
    fn stage_alone(&mut self, t: &Tensor, dst: u64) -> Result<()> {
        let block = Arc::new(self.pool.alloc(t.nbytes())?);
        self.stage(t, block.as_ptr(), dst, false)?;
        self.copies.blocks.push(block);
        Ok(())
    }

    /// Names a stream of another library that will consume what this move produces: before
    /// the move returns, the stream waits for its copies (and, if the move fails, for whatever
    /// copies were already issued), so work queued on it afterwards sees the data. Call it in
    /// both walks, before moving the tensors it consumes.
    pub fn order_stream(&mut self, stream: &Arc<CudaStream>) {
        if !self.consumers.iter().any(|s| Arc::ptr_eq(s, stream)) {
            self.consumers.push(stream.clone());
        }
    }
}

/// A copy of `span` of the buffer `src` (identified by `buffer`) to `dst` on (or from)
/// `target`, by whichever engine the issue gives it.
fn direct_copy(
    src: Memory<'_>,
    buffer: usize,
    span: Range<usize>,
    dst: u64,
    target: &Device,
) -> DirectCopy {
    let (dir, src_buffer) = match src {
        Memory::Device(d) if target.ordinal().is_some() => (Dir::DtoD, Some(d.clone())),
        Memory::Device(d) => (Dir::DtoH, Some(d.clone())),
        Memory::Pageable(_) | Memory::Pinned(_) => (Dir::HtoD, None),
    };
    DirectCopy {
        dir,
        src_id: buffer,
        src: src.base() + span.start as u64,
        dst,
        bytes: span.len(),
        src_buffer,
        mapped: src.is_device_mapped(),
        force: None,
    }
}

impl Walk for MoveContext<'_> {
    fn path(&self) -> &FieldPath {
        &self.path
    }

    fn path_mut(&mut self) -> &mut FieldPath {
        &mut self.path
    }
}
