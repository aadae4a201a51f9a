//! A gather's piece starts as the gather kernels read them, built where the gather is built.
//!
//! A batch of 32 MiB in rows of 256 B names 131072 pieces. Written into the kernels' table
//! when the batch moves, they would cost the move a tenth of its time on the host; written
//! once, when the gather is made (on a loader's worker, beside the training step), into pinned
//! memory, a move only asks the copy engine to bring them to the device. They are kept as u32s
//! where every one fits (half the bytes), else as u64s.

use std::sync::Arc;

use crate::alloc::{PinnedBlock, PinnedPool};

/// Piece starts, in units of the source's first dimension, as the kernels read them.
pub(crate) struct StartTable {
    data: Data,
    len: usize,
    wide: bool,
}

enum Data {
    /// In a pinned block, ready for the copy engine.
    Pinned(Arc<PinnedBlock>),
    /// On the heap (no CUDA, or no pinned memory to spare): copied into a move's own table.
    Heap(Vec<u8>),
}

impl StartTable {
    /// `values` as the kernels read them: in a pinned block of the process-wide pool where
    /// there is a GPU and the pool gives one, else on the heap.
    pub(crate) fn new(values: &[usize]) -> StartTable {
        let wide = values.iter().any(|&v| v > u32::MAX as usize);
        let bytes = values.len() * if wide { 8 } else { 4 };
        let block = (bytes > 0 && crate::cuda::is_available())
            .then(|| PinnedPool::global().alloc(bytes).ok())
            .flatten()
            .map(Arc::new);
        let mut table = StartTable {
            data: Data::Heap(Vec::new()),
            len: values.len(),
            wide,
        };
        match block {
            Some(block) => {
                // SAFETY: the block was just allocated and nothing else refers to it; it holds
                // at least `bytes`.
                let dst = unsafe { block.as_mut_slice() };
                write(values, wide, dst);
                table.data = Data::Pinned(block);
            }
            None => {
                let mut dst = vec![0u8; bytes];
                write(values, wide, &mut dst);
                table.data = Data::Heap(dst);
            }
        }
        table
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

    /// The pinned block holding the table, if it is in one.
    pub(crate) fn pinned(&self) -> Option<&Arc<PinnedBlock>> {
        match &self.data {
            Data::Pinned(b) => Some(b),
            Data::Heap(_) => None,
        }
    }

    /// The starts in `range` of the table, in order, for the host to read.
    ///
    /// # Panics
    ///
    /// If `range` reaches past the table.
    pub(crate) fn values(&self, range: std::ops::Range<usize>) -> impl Iterator<Item = usize> {
        let bytes = match &self.data {
            // SAFETY: the table is written once, in `new`, before anyone can read it; nothing
            // writes the block afterwards.
            Data::Pinned(b) => unsafe { &b.as_slice()[..self.bytes()] },
            Data::Heap(v) => &v[..],
        };
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
        match &self.data {
            Data::Heap(v) => Some(v),
            Data::Pinned(_) => None,
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
        let bytes = t.heap().map(<[u8]>::to_vec).unwrap_or_else(|| {
            // SAFETY: nothing writes the table after it is built.
            unsafe { t.pinned().unwrap().as_slice()[..12].to_vec() }
        });
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
}
