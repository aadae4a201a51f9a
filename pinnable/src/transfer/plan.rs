//! Where a batch goes: what the first walk measures, the one reservation made from it, and
//! where the second walk places each tensor.
//!
//! Sources the copy engine reads as they are (a registered pinned block, device memory) are
//! grouped by the buffer they live in. A group whose tensors fill most of the span they touch
//! is *mirrored*: the span is copied whole, with one copy, and each tensor lands at the same
//! offset from the span's start as at its source. A pinned batch (one block) therefore moves
//! with one copy whatever order its tensors are walked in, and a moved batch comes back to the
//! host the same way. Tensors of other groups are placed one after another.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use crate::batch::{PART_ALIGN, part_align};
use crate::tensor::{Source, Storage};

/// A mirror may hold at most this share of bytes no moved tensor touches (1/8 of the bytes
/// moved), so a batch that moves a few tensors of a large block copies only those.
const MIRROR_WASTE_DIVISOR: usize = 8;

/// A buffer the copy engine reads as it is, and what the batch moves out of it.
pub(super) struct Group {
    /// A storage over the buffer: keeps it alive until the copies are issued.
    pub(super) storage: Arc<Storage>,
    /// The bytes the batch's tensors touch, from the buffer's start (the start rounded down
    /// to [`PART_ALIGN`]).
    pub(super) span: Range<usize>,
    /// The bytes the tensors would take placed one by one.
    used: usize,
    /// Where the span's mirror starts in the arena; `None` when tensors are placed one by one.
    pub(super) mirror: Option<usize>,
}

/// The sizes the first walk measured and, once reserved, the cursors of the second.
#[derive(Default)]
pub(super) struct Plan {
    /// Bytes of sources that need staging through pinned memory (pageable ones).
    pub(super) staged_bytes: usize,
    /// How many tensors the first walk noted: zero-size ones too need an arena to be parts of.
    tensors: usize,
    pub(super) groups: Vec<Group>,
    group_of: HashMap<usize, usize>,
    /// The last buffer looked up and its group: a batch's tensors mostly come in runs from one
    /// buffer, so most look-ups skip the map.
    last: Option<(usize, usize)>,
    /// Where the arena's region for tensors placed one by one starts, and its end.
    singles: Range<usize>,
    single_cursor: usize,
    staged_cursor: usize,
    /// Bytes of tensors placed one by one that belong to no group (gathered rows).
    extra_singles: usize,
}

/// Where the second walk puts a tensor that needs no staging.
pub(super) enum Slot {
    /// Inside its group's mirror, at this arena offset (where the tensor's span starts); the
    /// mirror's one copy moves it.
    Mirrored(usize),
    /// At this arena offset, with a copy of its own.
    Single(usize),
    /// Outside the arena: the walk moves more than it measured.
    Outside,
}

impl Plan {
    /// First walk: a source the copy engine reads directly (its span of its buffer).
    pub(super) fn note_direct(&mut self, src: &Source<'_>) {
        let (id, span) = (src.buffer, &src.span);
        let index = match self.group(id) {
            Some(index) => index,
            None => {
                self.groups.push(Group {
                    storage: src.hold(),
                    span: span.start / PART_ALIGN * PART_ALIGN..span.end,
                    used: 0,
                    mirror: None,
                });
                let index = self.groups.len() - 1;
                self.group_of.insert(id, index);
                self.last = Some((id, index));
                index
            }
        };
        self.tensors += 1;
        let g = &mut self.groups[index];
        g.span.start = g.span.start.min(span.start / PART_ALIGN * PART_ALIGN);
        g.span.end = g.span.end.max(span.end);
        g.used += part_align(span.len());
    }

    /// First walk: a source that needs staging takes `bytes`.
    pub(super) fn note_staged(&mut self, bytes: usize) {
        self.tensors += 1;
        self.staged_bytes += part_align(bytes);
    }

    /// First walk: a result of `bytes` is placed one by one in the arena, assembled by copies
    /// of its own (gathered rows).
    pub(super) fn note_single(&mut self, bytes: usize) {
        self.tensors += 1;
        self.extra_singles += part_align(bytes);
    }

    /// Second walk: where a result noted with [`note_single`](Self::note_single) goes, or
    /// `None` once the measured room is used up.
    pub(super) fn place_single(&mut self, bytes: usize) -> Option<usize> {
        if self.single_cursor + bytes > self.singles.end {
            return None;
        }
        let at = self.single_cursor;
        self.single_cursor += part_align(bytes);
        Some(at)
    }

    /// Lays out the arena: staged bytes first, then each mirrored group's span, then the
    /// tensors placed one by one. Returns the arena's size, or `None` when the batch moves no
    /// tensor (and needs no arena).
    pub(super) fn lay_out(&mut self) -> Option<usize> {
        if self.tensors == 0 {
            return None;
        }
        let mut end = self.staged_bytes;
        let mut singles = self.extra_singles;
        for g in &mut self.groups {
            let waste = g.span.len().saturating_sub(g.used);
            if waste <= g.used / MIRROR_WASTE_DIVISOR {
                g.mirror = Some(end);
                end += part_align(g.span.len());
            } else {
                singles += g.used;
            }
        }
        self.singles = end..end + singles;
        self.single_cursor = end;
        Some(self.singles.end)
    }

    /// The group of buffer `id`, if the first walk noted it.
    fn group(&mut self, id: usize) -> Option<usize> {
        match self.last {
            Some((last, index)) if last == id => Some(index),
            _ => {
                let index = *self.group_of.get(&id)?;
                self.last = Some((id, index));
                Some(index)
            }
        }
    }

    /// Second walk: where a direct source (its span of its buffer) goes.
    pub(super) fn place_direct(&mut self, src: &Source<'_>) -> Slot {
        let span = &src.span;
        let Some(index) = self.group(src.buffer) else {
            return Slot::Outside;
        };
        let g = &self.groups[index];
        match g.mirror {
            Some(at) if span.start >= g.span.start && span.end <= g.span.end => {
                Slot::Mirrored(at + span.start - g.span.start)
            }
            _ => self
                .place_single(span.len())
                .map_or(Slot::Outside, Slot::Single),
        }
    }

    /// Second walk: where a staged source of `bytes` goes (its staging offset and arena offset
    /// are equal), or `None` once the measured room is used up.
    pub(super) fn place_staged(&mut self, bytes: usize) -> Option<usize> {
        if self.staged_cursor + bytes > self.staged_bytes {
            return None;
        }
        let at = self.staged_cursor;
        self.staged_cursor += part_align(bytes);
        Some(at)
    }
}

/// The first byte of the pinned block staged sources are gathered into (the move's copies
/// keep the block itself).
pub(super) struct Staging {
    pub(super) ptr: *mut u8,
}

impl Staging {
    /// The address `offset` bytes into the block.
    /// (Computed without `add`'s in-bounds promise: the copy threads write there only at
    /// offsets the plan placed within the block.)
    pub(super) fn at(&self, offset: usize) -> *mut u8 {
        self.ptr.wrapping_add(offset)
    }
}
