//! A gather's piece starts as the gather kernels read them, built where the gather is built.
//!
//! A batch of 32 MiB in rows of 256 B names 131072 pieces. Written into the kernels' table
//! when the batch moves, they would cost the move a tenth of its time on the host; written
//! once, when the gather is made (on a loader's worker, beside the training step), into pinned
//! memory, a move only asks the copy engine to bring them to the device. They are kept as u32s
//! where every one fits (half the bytes), else as u64s.

use std::sync::Arc;

use crate::alloc::{PinnedBlock, PinnedPool};

/// Piece starts, in units of the source's first dimension, as the kernels read them: `len`
/// of them from the `first`th of `words` on (tables cut from one list share its memory).
pub(crate) struct StartTable {
    words: Arc<Words>,
    first: usize,
    len: usize,
    wide: bool,
}

/// Where a table's words are.
enum Words {
    /// In a pinned block, ready for the copy engine.
    Pinned(Arc<PinnedBlock>),
    /// On the heap (no CUDA, or no pinned memory to spare): copied into a move's own table.
    Heap(Vec<u8>),
}

impl StartTable {
    /// `values` as the kernels read them: in a pinned block of the process-wide pool where
    /// there is a GPU and the pool gives one, else on the heap.
    pub(crate) fn new(values: &[usize]) -> StartTable {
        let (words, wide) = Self::written(values);
        StartTable {
            words: Arc::new(words),
            first: 0,
            len: values.len(),
            wide,
        }
    }

    /// `values` written once and cut in two at `at`: two tables in one block, the second
    /// right after the first, so a launch that moves both reads them as one (a batch's `x`
    /// and `y` windows).
    pub(crate) fn split(values: &[usize], at: usize) -> (StartTable, StartTable) {
        let at = at.min(values.len());
        let (words, wide) = Self::written(values);
        let words = Arc::new(words);
        let head = StartTable {
            words: words.clone(),
            first: 0,
            len: at,
            wide,
        };
        let tail = StartTable {
            words,
            first: at,
            len: values.len() - at,
            wide,
        };
        (head, tail)
    }

    /// Whether `next`'s starts lie right after these, in the same memory.
    pub(crate) fn is_continued_by(&self, next: &StartTable) -> bool {
        Arc::ptr_eq(&self.words, &next.words)
            && next.first == self.first + self.len
            && next.wide == self.wide
    }

    /// Where this table's bytes start within its memory.
    pub(crate) fn byte_offset(&self) -> usize {
        self.first * if self.wide { 8 } else { 4 }
    }

    /// `values` as the kernels read them, in a pinned block or on the heap; and whether they
    /// are u64s.
    fn written(values: &[usize]) -> (Words, bool) {
        let wide = values.iter().any(|&v| v > u32::MAX as usize);
        let bytes = values.len() * if wide { 8 } else { 4 };
        let block = (bytes > 0 && crate::cuda::is_available())
            .then(|| PinnedPool::global().alloc(bytes).ok())
            .flatten()
            .map(Arc::new);
        let words = match block {
            Some(block) => {
                // SAFETY: the block was just allocated and nothing else refers to it; it holds
                // at least `bytes`.
                let dst = unsafe { block.as_mut_slice() };
                write(values, wide, dst);
                Words::Pinned(block)
            }
            None => {
                let mut dst = vec![0u8; bytes];
                write(values, wide, &mut dst);
                Words::Heap(dst)
            }
        };
        (words, wide)
    }

    /// How many starts.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the starts are u64s (else u32s).
    pub(crate) fn is_wide(&self) -> bool {
        self.wide
    }

    /// The table's bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.len * if self.wide { 8 } else { 4 }
    }

    /// The pinned block holding the table (from [`byte_offset`](Self::byte_offset) on), if it
    /// is in one.
    pub(crate) fn pinned(&self) -> Option<&Arc<PinnedBlock>> {
        match &*self.words {
            Words::Pinned(b) => Some(b),
            Words::Heap(_) => None,
        }
    }

    /// The starts in `range` of the table, in order, for the host to read.
    ///
    /// # Panics
    ///
    /// If `range` reaches past the table.
    pub(crate) fn values(&self, range: std::ops::Range<usize>) -> impl Iterator<Item = usize> {
        let bytes = self.as_bytes();
        let width = if self.wide { 8 } else { 4 };
        let wide = self.wide;
        bytes[range.start * width..range.end * width]
            .chunks_exact(width)
            .map(move |b| match wide {
                true => u64::from_ne_bytes(b.try_into().expect("8 bytes")) as usize,
                false => u32::from_ne_bytes(b.try_into().expect("4 bytes")) as usize,
            })
    }

    /// The table's bytes on the heap, if it is not in a pinned block.
    pub(crate) fn heap(&self) -> Option<&[u8]> {
        match &*self.words {
            Words::Heap(v) => Some(&v[self.byte_offset()..self.byte_offset() + self.bytes()]),
            Words::Pinned(_) => None,
        }
    }

    /// The table's bytes, wherever they are.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match &*self.words {
            Words::Heap(_) => self.heap().expect("on the heap"),
            // SAFETY: nothing writes a table of starts once it is built; the block holds the
            // whole list the table was cut from.
            Words::Pinned(b) => unsafe {
                &b.as_slice()[self.byte_offset()..self.byte_offset() + self.bytes()]
            },
        }
    }
}

/// Writes `values` as native-endian u32s or u64s into `dst`.
fn write(values: &[usize], wide: bool, dst: &mut [u8]) {
    if wide {
        for (v, out) in values.iter().zip(dst.chunks_exact_mut(8)) {
            out.copy_from_slice(&(*v as u64).to_ne_bytes());
        }
    } else {
        for (v, out) in values.iter().zip(dst.chunks_exact_mut(4)) {
            out.copy_from_slice(&(*v as u32).to_ne_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_are_u32s_unless_one_does_not_fit() {
        let t = StartTable::new(&[7, 0, 3]);
        assert!(!t.is_wide());
        assert_eq!((t.len(), t.bytes()), (3, 12));
        let bytes = t.as_bytes();
        let got: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|b| u32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(got, [7, 0, 3]);
        assert_eq!(t.values(0..3).collect::<Vec<_>>(), [7, 0, 3]);
        assert_eq!(t.values(1..3).collect::<Vec<_>>(), [0, 3]);
        assert_eq!(t.values(2..2).count(), 0);
        if usize::BITS > 32 {
            let big = u32::MAX as usize + 5;
            let t = StartTable::new(&[1, big]);
            assert!(t.is_wide());
            assert_eq!(t.bytes(), 16);
            assert_eq!(t.values(0..2).collect::<Vec<_>>(), [1, big]);
        }
    }

    #[test]
    fn a_split_list_is_two_tables_one_after_the_other() {
        let values: Vec<usize> = (0..9).map(|i| i * 37 % 11).collect();
        let (x, y) = StartTable::split(&values, 4);
        assert_eq!((x.len(), y.len()), (4, 5));
        assert!(x.is_continued_by(&y));
        assert!(!y.is_continued_by(&x));
        assert!(!x.is_continued_by(&StartTable::new(&values[4..])));
        let as_u32 = |t: &StartTable| -> Vec<usize> {
            t.as_bytes()
                .chunks_exact(4)
                .map(|b| u32::from_ne_bytes(b.try_into().unwrap()) as usize)
                .collect()
        };
        assert_eq!(as_u32(&x), values[..4]);
        assert_eq!(as_u32(&y), values[4..]);
        assert_eq!(y.byte_offset(), 16);
        assert_eq!(y.values(1..5).collect::<Vec<_>>(), values[5..]);
    }
}
