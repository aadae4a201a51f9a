//! Copies of rows listed by a gather's start table.

use std::ops::Range;
use std::sync::Arc;

use crate::pieces::StartTable;
use crate::tensor::HostSrc;

/// RowCopies of `len` bytes, row `i` at `base + starts[i] * stride`: a gather's pieces, described by
/// its start table, so that planning and tracking a copy of many small rows costs nothing per
/// row; only the copy threads walk the rows.
#[derive(Clone)]
pub(crate) struct RowCopies {
    pub(crate) base: *const u8,
    /// Bytes between consecutive start units.
    pub(crate) stride: usize,
    /// Bytes per row.
    pub(crate) len: usize,
    pub(crate) starts: Arc<StartTable>,
}

/// RowCopies read this many rows ahead of the one being copied are prefetched, so the next rows'
/// first cache lines (and their pages' translations) are on their way while one is copied.
const PREFETCH_AHEAD: usize = 4;
/// The bytes prefetched from the start of each row (the hardware prefetcher takes over along a
/// longer row).
const PREFETCH_BYTES: usize = 256;
/// RowCopies at least this long are copied as views are, with non-temporal stores.
const STREAM_ROW: usize = 64 << 10;

impl RowCopies {
    pub(super) fn bytes(&self) -> usize {
        self.starts.len() * self.len
    }

    /// Row `i` as a contiguous view.
    pub(super) fn row(&self, i: usize) -> HostSrc {
        let start = self
            .starts
            .values(i..i + 1)
            .next()
            .expect("a row of the table");
        HostSrc {
            // SAFETY: the gather checked every row against the source, which the copy holds.
            ptr: unsafe { self.base.add(start * self.stride) },
            run: self.len,
            dims: Vec::new(),
        }
    }

    /// Copies rows `rows` one after another to `dst`.
    ///
    /// # Safety
    ///
    /// As [`run`](super::run): the rows are live and unwritten, and `dst` is valid for
    /// `rows.len() * len` bytes written by nothing else.
    pub(super) unsafe fn gather(&self, rows: Range<usize>, dst: *mut u8) {
        let ahead_from = (rows.start + PREFETCH_AHEAD).min(rows.end);
        let mut ahead = self.starts.values(ahead_from..rows.end);
        for (k, start) in self.starts.values(rows).enumerate() {
            if let Some(next) = ahead.next() {
                // SAFETY: row `next` lies within the source (checked by the gather).
                prefetch(unsafe { self.base.add(next * self.stride) }, self.len);
            }
            // SAFETY: row `start` lies within the source; row `k` of the output within `dst`.
            let (src, out) = unsafe { (self.base.add(start * self.stride), dst.add(k * self.len)) };
            if self.len >= STREAM_ROW {
                let view = HostSrc {
                    ptr: src,
                    run: self.len,
                    dims: Vec::new(),
                };
                // SAFETY: as above, forwarded from the caller.
                unsafe { view.gather_streaming(out) };
            } else {
                // SAFETY: as above; source and staging never overlap (caller).
                unsafe { std::ptr::copy_nonoverlapping(src, out, self.len) };
            }
        }
    }
}

/// Asks the CPU to start loading the first [`PREFETCH_BYTES`] of the `len` bytes at `ptr`.
fn prefetch(ptr: *const u8, len: usize) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    for at in (0..len.min(PREFETCH_BYTES)).step_by(64) {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: SSE is part of every x86-64 CPU; a prefetch reads nothing and never faults,
        // and `ptr + at` lies within the row.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ptr.wrapping_add(at).cast()) };
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = (ptr, len);
}
