//! Size classes: how a request is rounded to a block size that can be cached and reused.
//!
//! A request is first rounded up to whole pages. Up to 16 pages every page count is its own
//! class; above that each power of two of pages is split into 8 equal steps, so a block is at
//! most 1/8 larger than its page-rounded request (PyTorch rounds to a power of two and wastes
//! up to 1/2: issues #95823, #150517). A class holds blocks of exactly one capacity, so a block
//! taken from a class's free list is never smaller than a request mapped to that class
//! (the bug fixed by PyTorch PR #192722 cannot happen).

use super::backend::page_size;

/// Sub-classes per power of two.
const STEPS_LOG2: u32 = 3;

/// A size class: an index into the pool's free lists and the capacity of its blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SizeClass {
    /// Dense index, 1 for a one-page block; grows with the capacity.
    pub(crate) index: usize,
    /// The bytes every block of this class holds (a multiple of the page size).
    pub(crate) capacity: usize,
}

/// How many classes there can be: enough for any `usize` request.
pub(crate) const CLASS_COUNT: usize = (((usize::BITS - STEPS_LOG2) as usize + 1) << STEPS_LOG2) + 1;

impl SizeClass {
    /// The class of a request of `bytes` bytes (0 is treated as 1), or `None` when the rounded
    /// size does not fit in `usize`.
    pub(crate) fn of(bytes: usize) -> Option<SizeClass> {
        Self::with_page(bytes, page_size())
    }

    /// As [`of`](Self::of) with an explicit page size (a power of two).
    pub(crate) fn with_page(bytes: usize, page: usize) -> Option<SizeClass> {
        let pages = bytes.max(1).div_ceil(page);
        let steps = 1usize << STEPS_LOG2;
        let (index, class_pages) = if pages <= 2 * steps {
            (pages, pages)
        } else {
            // pages lies in [2^p, 2^(p+1)) with p > STEPS_LOG2; one step is 2^(p - STEPS_LOG2).
            let p = usize::BITS - 1 - pages.leading_zeros();
            let step_log2 = p - STEPS_LOG2;
            let m = pages.div_ceil(1 << step_log2); // in steps..=2*steps
            let index = ((step_log2 as usize) << STEPS_LOG2) + m;
            (index, m.checked_mul(1usize << step_log2)?)
        };
        let capacity = class_pages.checked_mul(page)?;
        Some(SizeClass { index, capacity })
    }

    /// The class with this index (inverse of [`of`](Self::of)'s index).
    pub(crate) fn from_index(index: usize) -> SizeClass {
        Self::from_index_with_page(index, page_size())
    }

    fn from_index_with_page(index: usize, page: usize) -> SizeClass {
        let steps = 1usize << STEPS_LOG2;
        let pages = if index <= 2 * steps {
            index
        } else {
            // index = step_log2 * steps + m with m in steps..2*steps
            let step_log2 = (index - steps) >> STEPS_LOG2;
            (index - (step_log2 << STEPS_LOG2)) << step_log2
        };
        SizeClass {
            index,
            capacity: pages.saturating_mul(page),
        }
    }
}

/// The capacity a request of `bytes` bytes is rounded to by every [`PinnedPool`](super::PinnedPool):
/// whole pages, then at most 1/8 more (8 size classes per power of two).
///
/// [`PinnedPool::rounded_size`](super::PinnedPool::rounded_size) for users.
pub(crate) fn rounded_size(bytes: usize) -> usize {
    SizeClass::of(bytes)
        .expect("request too large to round to a size class")
        .capacity
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;

    fn check(bytes: usize) {
        let c = SizeClass::with_page(bytes, PAGE).unwrap();
        assert!(c.capacity >= bytes.max(1), "{bytes}: {c:?}");
        assert_eq!(c.capacity % PAGE, 0);
        assert!(
            c.capacity as u128 <= bytes as u128 * 9 / 8 + PAGE as u128,
            "{bytes}: {c:?} wastes more than 1/8 + a page"
        );
        assert!(c.index < CLASS_COUNT);
    }

    #[test]
    fn small_requests_are_page_rounded() {
        assert_eq!(SizeClass::with_page(0, PAGE).unwrap().capacity, PAGE);
        assert_eq!(SizeClass::with_page(1, PAGE).unwrap().capacity, PAGE);
        assert_eq!(
            SizeClass::with_page(PAGE + 1, PAGE).unwrap().capacity,
            2 * PAGE
        );
        assert_eq!(
            SizeClass::with_page(16 * PAGE, PAGE).unwrap().capacity,
            16 * PAGE
        );
        assert_eq!(
            SizeClass::with_page(16 * PAGE + 1, PAGE).unwrap().capacity,
            18 * PAGE
        );
    }

    #[test]
    fn classes_waste_at_most_an_eighth_plus_a_page() {
        let n = if cfg!(miri) { 2_000 } else { 200_000 };
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..n {
            // xorshift: sizes spread over 1 B ..= 1 GiB on a log scale
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let bits = (x % 31) as u32; // 0..=30
            let bytes = 1 + (x >> 32) as usize % (1usize << bits);
            check(bytes);
        }
        for p in 0..31 {
            for d in [0usize, 1, PAGE - 1, PAGE, PAGE + 1] {
                check((1usize << p).saturating_sub(d).max(1));
                check((1usize << p) + d);
            }
        }
    }

    #[test]
    fn index_is_monotonic_and_one_capacity_per_index() {
        let mut last = SizeClass::with_page(1, PAGE).unwrap();
        let step = if cfg!(miri) { 997 } else { 1 };
        for pages in (1..20_000usize).step_by(step) {
            let c = SizeClass::with_page(pages * PAGE, PAGE).unwrap();
            assert!(c.index >= last.index && c.capacity >= last.capacity);
            if c.index == last.index {
                assert_eq!(c.capacity, last.capacity, "one capacity per index");
            } else {
                assert!(c.capacity > last.capacity);
            }
            last = c;
        }
    }

    #[test]
    fn from_index_inverts_of() {
        let step = if cfg!(miri) { 97 } else { 1 };
        for pages in (1..100_000usize).step_by(step) {
            let c = SizeClass::with_page(pages * PAGE - 1, PAGE).unwrap();
            assert_eq!(SizeClass::from_index_with_page(c.index, PAGE), c);
        }
    }

    #[test]
    fn huge_requests_do_not_overflow() {
        assert!(SizeClass::with_page(usize::MAX, PAGE).is_none());
        let c = SizeClass::with_page(usize::MAX / 4, PAGE).unwrap();
        assert!(c.capacity >= usize::MAX / 4 && c.index < CLASS_COUNT);
    }
}
