//! Layout maths: row-major strides, the span a view touches, and strided host gathers.

use std::ops::{Deref, DerefMut};

use crate::error::{Error, Result};

/// Dimensions held inline; a tensor of higher rank keeps its sizes and strides on the heap.
const INLINE: usize = 6;

/// A tensor's sizes or strides. Up to [`INLINE`] dimensions live inline, so cloning a tensor,
/// taking a view or placing it in a batch allocates nothing for them.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Dims {
    Inline { len: u8, dims: [usize; INLINE] },
    Heap(Vec<usize>),
}

impl Dims {
    /// `n` zeros.
    pub(crate) fn zeros(n: usize) -> Dims {
        if n <= INLINE {
            Dims::Inline {
                len: n as u8,
                dims: [0; INLINE],
            }
        } else {
            Dims::Heap(vec![0; n])
        }
    }
}

impl Dims {
    /// Removes dimension `i`, shifting the later ones down.
    ///
    /// # Panics
    ///
    /// If `i` is out of range (callers check it first).
    pub(crate) fn remove(&mut self, i: usize) {
        match self {
            Dims::Inline { len, dims } => {
                let n = usize::from(*len);
                assert!(i < n, "dimension {i} out of range for {n}");
                dims.copy_within(i + 1..n, i);
                *len -= 1;
            }
            Dims::Heap(v) => {
                v.remove(i);
            }
        }
    }
}

impl From<&[usize]> for Dims {
    fn from(v: &[usize]) -> Dims {
        let mut d = Dims::zeros(v.len());
        d.copy_from_slice(v);
        d
    }
}

impl Deref for Dims {
    type Target = [usize];

    fn deref(&self) -> &[usize] {
        match self {
            Dims::Inline { len, dims } => &dims[..usize::from(*len)],
            Dims::Heap(v) => v,
        }
    }
}

impl DerefMut for Dims {
    fn deref_mut(&mut self) -> &mut [usize] {
        match self {
            Dims::Inline { len, dims } => &mut dims[..usize::from(*len)],
            Dims::Heap(v) => v,
        }
    }
}

impl std::fmt::Debug for Dims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self[..].fmt(f)
    }
}

/// Row-major strides for `shape` and its element count, or an error if the count overflows.
pub(crate) fn contiguous_strides(shape: &[usize]) -> Result<(Dims, usize)> {
    let mut strides = Dims::zeros(shape.len());
    let mut n: usize = 1;
    for (i, &d) in shape.iter().enumerate().rev() {
        strides[i] = n;
        n = n.checked_mul(d).ok_or_else(|| {
            Error::Shape(format!("the element count of shape {shape:?} overflows"))
        })?;
    }
    Ok((strides, n))
}

/// Whether `shape` with `strides` is laid out row-major with no gaps.
pub(crate) fn is_contiguous(shape: &[usize], strides: &[usize]) -> bool {
    let mut expected = 1;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != expected {
            return false;
        }
        expected *= d;
    }
    true
}

/// Whether no two indices of `shape` reach the same element through `strides`: true when,
/// taking the dimensions longer than one by increasing stride, each stride passes every
/// element the shorter-stride dimensions reach (what every transpose and narrow of a
/// row-major layout satisfies).
pub(crate) fn non_overlapping(shape: &[usize], strides: &[usize]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let mut dims: Vec<(usize, usize)> = shape
        .iter()
        .zip(strides)
        .filter(|(d, _)| **d > 1)
        .map(|(&d, &s)| (s, d))
        .collect();
    dims.sort_unstable();
    let mut reach: usize = 0;
    for (s, d) in dims {
        if s <= reach {
            return false;
        }
        match (d - 1).checked_mul(s).and_then(|r| r.checked_add(reach)) {
            Some(r) => reach = r,
            None => return false,
        }
    }
    true
}

/// The element range `[first, last + 1)` a view at `offset` touches.
pub(crate) fn span(shape: &[usize], strides: &[usize], offset: usize) -> (usize, usize) {
    if shape.contains(&0) {
        return (offset, offset);
    }
    let last: usize = shape.iter().zip(strides).map(|(&d, &s)| (d - 1) * s).sum();
    (offset, offset + last + 1)
}

/// A strided run of host bytes to gather into a contiguous destination, with dimensions
/// that are contiguous with their inner neighbour merged.
#[derive(Clone, Debug)]
pub(crate) struct HostSrc {
    pub(crate) ptr: *const u8,
    /// Bytes per innermost contiguous run.
    pub(crate) run: usize,
    /// Outer dimensions (sizes and byte strides) over the runs, outermost first.
    pub(crate) dims: Vec<(usize, usize)>,
}

// SAFETY: a HostSrc is a description of bytes that outlive the copy that uses it (the copy
// holds the source tensor); it is only read.
unsafe impl Send for HostSrc {}
// SAFETY: as for Send.
unsafe impl Sync for HostSrc {}

impl HostSrc {
    /// The gather of a view at `ptr` with `shape` and `strides` (in elements of `elem` bytes).
    pub(crate) fn new(ptr: *const u8, elem: usize, shape: &[usize], strides: &[usize]) -> HostSrc {
        let mut run = elem;
        let mut dims: Vec<(usize, usize)> = Vec::new();
        let mut inner_contig = true;
        for (&d, &s) in shape.iter().zip(strides).rev() {
            if d == 1 {
                continue;
            }
            let s = s * elem;
            if inner_contig && s == run {
                run *= d;
            } else {
                inner_contig = false;
                dims.insert(0, (d, s));
            }
        }
        if shape.contains(&0) {
            run = 0;
            dims.clear();
        }
        HostSrc { ptr, run, dims }
    }

    /// Total bytes gathered.
    pub(crate) fn bytes(&self) -> usize {
        self.run * self.dims.iter().map(|d| d.0).product::<usize>()
    }

    /// The part of the gather whose outermost index lies in `range` (by runs when there is no
    /// outer dimension: then `range` is in bytes), and the byte offset it lands at.
    pub(crate) fn split(&self, range: std::ops::Range<usize>) -> (HostSrc, usize) {
        match self.dims.first() {
            None => (
                HostSrc {
                    // SAFETY: `range` lies within the run.
                    ptr: unsafe { self.ptr.add(range.start) },
                    run: range.len(),
                    dims: Vec::new(),
                },
                range.start,
            ),
            Some(&(_, stride)) => {
                let inner = self.bytes() / self.dims[0].0;
                let mut dims = self.dims.clone();
                dims[0].0 = range.len();
                (
                    HostSrc {
                        // SAFETY: `range` lies within the outer dimension.
                        ptr: unsafe { self.ptr.add(range.start * stride) },
                        run: self.run,
                        dims,
                    },
                    range.start * inner,
                )
            }
        }
    }

    /// How many pieces [`split`](Self::split) can cut along, and the bytes of one piece.
    pub(crate) fn split_unit(&self) -> (usize, usize) {
        match self.dims.first() {
            None => (self.run, 1),
            Some(&(d, _)) => (d, self.bytes() / d.max(1)),
        }
    }

    /// Copies the described bytes, contiguously, to `dst`.
    ///
    /// # Safety
    ///
    /// 1. The source bytes are live and not written during the call.
    /// 2. `dst` is valid for [`bytes`](Self::bytes) bytes of writes and does not overlap them.
    pub(crate) unsafe fn gather(&self, dst: *mut u8) {
        // SAFETY: forwarded from the caller.
        unsafe { self.gather_with(dst, |s, d, n| std::ptr::copy_nonoverlapping(s, d, n)) }
    }

    /// As [`gather`](Self::gather), for bytes the CPU will not read next (pinned memory that a
    /// device copy reads): long runs are written with non-temporal stores, which go to memory
    /// without first reading each destination line into the cache, a quarter less memory
    /// traffic for a host copy feeding a device copy.
    ///
    /// # Safety
    ///
    /// As [`gather`](Self::gather).
    pub(crate) unsafe fn gather_streaming(&self, dst: *mut u8) {
        // SAFETY: forwarded from the caller.
        unsafe { self.gather_with(dst, copy_streaming) }
    }

    /// # Safety
    ///
    /// As [`gather`](Self::gather); `copy` copies `n` bytes between non-overlapping ranges.
    unsafe fn gather_with(&self, dst: *mut u8, copy: unsafe fn(*const u8, *mut u8, usize)) {
        if self.run == 0 {
            return;
        }
        let mut idx = vec![0usize; self.dims.len()];
        let total = self.bytes() / self.run;
        let mut src = self.ptr;
        for k in 0..total {
            // SAFETY: each run lies within the source (caller) and `dst` has room (caller).
            unsafe { copy(src, dst.add(k * self.run), self.run) };
            // Advance the odometer over the outer dimensions.
            let mut d = self.dims.len();
            while d > 0 {
                d -= 1;
                idx[d] += 1;
                let (size, stride) = self.dims[d];
                if idx[d] < size {
                    // SAFETY: stays within the source's span.
                    src = unsafe { src.add(stride) };
                    break;
                }
                // SAFETY: rewinds to the start of this dimension, within the span.
                src = unsafe { src.sub((size - 1) * stride) };
                idx[d] = 0;
            }
        }
    }
}

/// Runs at least this long are written with non-temporal stores by
/// [`HostSrc::gather_streaming`]; shorter ones are cheaper through the cache.
const STREAM_MIN: usize = 64 << 10;

/// Copies `n` bytes from `src` to `dst`, with non-temporal stores when the run is long.
///
/// # Safety
///
/// 1. `src` is valid for `n` bytes of reads and `dst` for `n` bytes of writes; they do not
///    overlap.
unsafe fn copy_streaming(src: *const u8, dst: *mut u8, n: usize) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if n >= STREAM_MIN {
        // SAFETY: forwarded from the caller.
        unsafe { stream_x86_64(src, dst, n) };
        return;
    }
    // SAFETY: forwarded from the caller.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
}

/// # Safety
///
/// As [`copy_streaming`].
#[cfg(all(target_arch = "x86_64", not(miri)))]
unsafe fn stream_x86_64(src: *const u8, dst: *mut u8, n: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    // Plain copies up to the first 16-byte-aligned destination byte, and of the tail.
    let head = dst.align_offset(16).min(n);
    // SAFETY: within both ranges (caller).
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut i = head;
    while i + 64 <= n {
        // SAFETY: SSE2 is part of every x86-64 CPU; the 64 bytes at `i` lie within both ranges
        // (caller), the loads are unaligned loads, and `dst + i` is 16-byte aligned.
        unsafe {
            for k in (0..64).step_by(16) {
                let v = _mm_loadu_si128(src.add(i + k).cast::<__m128i>());
                _mm_stream_si128(dst.add(i + k).cast::<__m128i>(), v);
            }
        }
        i += 64;
    }
    // SAFETY: the tail lies within both ranges (caller); the fence orders the streaming stores
    // before any later store, so whoever is told the copy finished sees every byte.
    unsafe {
        std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), n - i);
        _mm_sfence();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_overlapping_accepts_permuted_and_narrowed_layouts_and_rejects_aliases() {
        assert!(non_overlapping(&[2, 3, 4], &[12, 4, 1]));
        assert!(non_overlapping(&[4, 3, 2], &[1, 4, 12])); // reversed axes
        assert!(non_overlapping(&[2, 2, 4], &[12, 4, 1])); // narrowed: gaps, no aliases
        assert!(non_overlapping(&[1, 5], &[0, 1])); // a length-1 axis's stride is never used
        assert!(non_overlapping(&[0, 3], &[0, 0])); // nothing to alias
        assert!(!non_overlapping(&[3, 2], &[1, 2])); // (2, 0) and (0, 1) meet
        assert!(!non_overlapping(&[2, 2], &[1, 1]));
        assert!(!non_overlapping(&[4], &[0])); // a broadcast
        assert!(!non_overlapping(&[3, usize::MAX], &[usize::MAX, 2])); // overflow is refused
    }

    #[test]
    fn streaming_copies_are_exact_at_any_alignment_and_length() {
        // A fixed-seed generator: these lengths and offsets exercise the head, the 64-byte
        // body and the tail at every alignment.
        let mut x = 0x9E37_79B9_7F4A_7C15_u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let max = if cfg!(miri) {
            2 * STREAM_MIN + 100
        } else {
            4 * STREAM_MIN
        };
        let src: Vec<u8> = (0..max + 64).map(|_| next() as u8).collect();
        for _ in 0..if cfg!(miri) { 3 } else { 40 } {
            let n = (STREAM_MIN - 100) + (next() as usize % (max - STREAM_MIN));
            let (so, d_off) = (next() as usize % 64, next() as usize % 64);
            let mut dst = vec![0u8; n + 128];
            // SAFETY: both ranges are inside their vectors and do not overlap.
            unsafe { copy_streaming(src.as_ptr().add(so), dst.as_mut_ptr().add(d_off), n) };
            assert_eq!(
                &dst[d_off..d_off + n],
                &src[so..so + n],
                "n={n} so={so} do={d_off}"
            );
            assert!(
                dst[..d_off].iter().all(|&b| b == 0),
                "wrote before the range"
            );
            assert!(
                dst[d_off + n..].iter().all(|&b| b == 0),
                "wrote past the range"
            );
        }
    }
}
