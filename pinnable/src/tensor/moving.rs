//! What a move reads from a tensor, and where its results live.
//!
//! A move asks each tensor once for its [`Source`]: where its buffer is (a [`Memory`]), which
//! buffer it is, the bytes the tensor touches and the copy that is still filling them. It
//! places its results through an [`Arena`]: the one destination buffer it reserved, whose
//! parts become the result tensors. Outside `tensor`, code deals in these and in bytes; the
//! storages themselves, and the rule for when results share one, stay here.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use super::storage::{Data, DeviceBuffer, Ready, Storage};
use super::{Placement, Tensor};
use crate::alloc::{BackendKind, PinnedBlock};
use crate::cuda::Event;
use crate::dtype::DType;
use crate::error::Result;

/// Where a tensor's buffer is, as a copy reads it.
#[derive(Clone, Copy)]
pub(crate) enum Memory<'a> {
    /// Pageable host memory starting at this address: the copy engine cannot read it, so a
    /// move stages it through pinned memory.
    Pageable(*mut u8),
    /// A pinned block.
    Pinned(&'a Arc<PinnedBlock>),
    /// Memory of a CUDA device.
    Device(&'a Arc<DeviceBuffer>),
}

impl Memory<'_> {
    /// The address of the buffer's first byte: a device address, or a host address as a
    /// number.
    pub(crate) fn base(self) -> u64 {
        match self {
            Memory::Pageable(p) => p as u64,
            Memory::Pinned(b) => b.as_ptr() as u64,
            Memory::Device(d) => d.device_ptr(),
        }
    }

    /// Whether the buffer is pinned memory the device reads in place through its mapping.
    pub(crate) fn is_device_mapped(self) -> bool {
        matches!(self, Memory::Pinned(b) if b.is_device_mapped())
    }

    /// Whether the buffer is pinned memory registered with the CUDA driver, which the copy
    /// engine reads as it is (`mlock`ed memory is pinned but not registered: copies stage it).
    pub(crate) fn is_registered_pinned(self) -> bool {
        matches!(self, Memory::Pinned(b) if b.backend() != BackendKind::Mlock)
    }

    /// Where a tensor over this buffer lives.
    pub(crate) fn placement(self) -> Placement {
        match self {
            Memory::Pageable(_) => Placement::Pageable,
            Memory::Pinned(_) => Placement::Pinned,
            Memory::Device(d) => Placement::Cuda(d.device.ordinal),
        }
    }
}

/// A tensor's bytes as a move reads them, from [`Tensor::source`].
pub(crate) struct Source<'a> {
    /// Where the buffer is.
    pub(crate) memory: Memory<'a>,
    /// Identifies the buffer: equal for every tensor over one pinned block or device
    /// allocation.
    pub(crate) buffer: usize,
    /// The bytes the tensor touches, from the buffer's start.
    pub(crate) span: Range<usize>,
    /// The asynchronous copy that fills the bytes, once it is enqueued.
    pub(crate) ready: Option<&'a Arc<Event>>,
    storage: &'a Arc<Storage>,
}

impl Source<'_> {
    /// A handle that keeps the bytes alive (until the copies that read them are issued).
    pub(crate) fn hold(&self) -> Arc<Storage> {
        self.storage.clone()
    }
}

impl Tensor {
    /// What a move needs to know about this tensor's bytes, asked once per tensor moved.
    pub(crate) fn source(&self) -> Source<'_> {
        let storage = self.storage();
        Source {
            memory: storage.memory(),
            buffer: storage.buffer_id(),
            span: self.byte_span(),
            ready: storage.ready_event(),
            storage,
        }
    }
}

/// The destination of a move: one buffer (a device allocation, or a pinned block when moving
/// to the host) whose parts become the result tensors, each ready when the move's copies are.
///
/// It keeps [`Storage`]'s invariant for the results: tensors placed whole-span from sources
/// that share a storage (clones, views) get one result storage between them, so results whose
/// bytes overlap never have two.
pub(crate) struct Arena {
    data: Data,
    base: u64,
    ready: Ready,
    /// The result storage of each source storage placed by [`mirrored`](Self::mirrored).
    mirrored: HashMap<usize, Arc<Storage>>,
    last_mirrored: Option<(usize, Arc<Storage>)>,
}

impl Arena {
    /// An arena over a device allocation; its results wait on `ready`.
    pub(crate) fn device(buf: DeviceBuffer, ready: &Ready) -> Arena {
        let base = buf.device_ptr();
        Arena::over(Data::Device(Arc::new(buf)), base, ready)
    }

    /// An arena over a device allocation shared with work still being recorded on it (the
    /// device image decoder adds its readers after the arena exists); results wait on `ready`.
    #[cfg(feature = "image")]
    pub(crate) fn device_shared(buf: Arc<DeviceBuffer>, ready: &Ready) -> Arena {
        let base = buf.device_ptr();
        Arena::over(Data::Device(buf), base, ready)
    }

    /// An arena over a pinned block; its results wait on `ready`.
    pub(crate) fn pinned(block: Arc<PinnedBlock>, ready: &Ready) -> Arena {
        let base = block.as_ptr() as u64;
        Arena::over(Data::Pinned(block), base, ready)
    }

    fn over(data: Data, base: u64, ready: &Ready) -> Arena {
        Arena {
            data,
            base,
            ready: ready.clone(),
            mirrored: HashMap::new(),
            last_mirrored: None,
        }
    }

    /// The address `offset` bytes into the buffer (a device address, or a host address as a
    /// number).
    pub(crate) fn at(&self, offset: usize) -> u64 {
        self.base + offset as u64
    }

    /// A storage of its own over the buffer: no other result overlaps the bytes it is for.
    fn part(&self) -> Arc<Storage> {
        let data = self.data.share().expect("an arena is a shared buffer");
        Storage::part(data, Some(self.ready.clone()))
    }

    /// `t`'s elements copied contiguous to `offset`.
    pub(crate) fn contiguous(&self, t: &Tensor, offset: usize) -> Tensor {
        t.placed_in(self.part(), offset, true)
    }

    /// `t`'s whole span copied to `offset`, where the result keeps `t`'s strides.
    pub(crate) fn spanned(&self, t: &Tensor, offset: usize) -> Tensor {
        t.placed_in(self.part(), offset, false)
    }

    /// As [`spanned`](Self::spanned), for a span copied with others of its buffer in one
    /// mirror: results from one source storage share one result storage.
    pub(crate) fn mirrored(&mut self, t: &Tensor, offset: usize) -> Tensor {
        let storage = if Arc::strong_count(t.storage()) == 1 {
            // No other tensor holds this source storage, so no other result can overlap.
            self.part()
        } else {
            self.shared_part(Arc::as_ptr(t.storage()) as usize)
        };
        t.placed_in(storage, offset, false)
    }

    fn shared_part(&mut self, key: usize) -> Arc<Storage> {
        if let Some((last, storage)) = &self.last_mirrored
            && *last == key
        {
            return storage.clone();
        }
        let storage = match self.mirrored.get(&key) {
            Some(s) => s.clone(),
            None => {
                let s = self.part();
                self.mirrored.insert(key, s.clone());
                s
            }
        };
        self.last_mirrored = Some((key, storage.clone()));
        storage
    }

    /// A contiguous tensor of `shape` assembled at `offset` (gathered rows).
    ///
    /// # Errors
    ///
    /// As [`Tensor::at`].
    pub(crate) fn tensor(&self, dtype: DType, shape: &[usize], offset: usize) -> Result<Tensor> {
        Tensor::at(self.part(), dtype, shape, offset)
    }
}
