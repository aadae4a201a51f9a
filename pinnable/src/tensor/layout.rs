//! Layout maths: row-major strides, the span a view touches, and strided host gathers.

use crate::error::{Error, Result};

/// Row-major strides for `shape` and its element count, or an error if the count overflows.
pub(crate) fn contiguous_strides(shape: &[usize]) -> Result<(Vec<usize>, usize)> {
    let mut strides = vec![0; shape.len()];
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
        if self.run == 0 {
            return;
        }
        let mut idx = vec![0usize; self.dims.len()];
        let total = self.bytes() / self.run;
        let mut src = self.ptr;
        for k in 0..total {
            // SAFETY: each run lies within the source (caller) and `dst` has room (caller).
            unsafe { std::ptr::copy_nonoverlapping(src, dst.add(k * self.run), self.run) };
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

#[cfg(test)]
mod tests {
    use super::non_overlapping;

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
}
