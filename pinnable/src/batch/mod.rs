//! Batches built in place in one pinned block ([`BatchLayout`], [`PinnedBatch`], [`TensorMut`]),
//! and the pinned tensor constructors built on them (`Tensor::empty_pinned` and the like).

mod tensors;

use std::marker::PhantomData;
use std::sync::Arc;

use crate::alloc::{PinnedBlock, PinnedPool};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::tensor::{Storage, Tensor, contiguous_strides};

/// Tensors inside one pinned block, and inside a moved batch's device allocation, start at
/// multiples of this many bytes (what CUDA's own allocator guarantees for an allocation).
pub(crate) const PART_ALIGN: usize = BatchLayout::PART_ALIGN;

/// `bytes` rounded up to a multiple of [`BatchLayout::PART_ALIGN`].
pub(crate) fn part_align(bytes: usize) -> usize {
    bytes.div_ceil(PART_ALIGN) * PART_ALIGN
}

/// One tensor of a [`BatchLayout`], by position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slot(usize);

impl Slot {
    /// The position in the layout (the index of the tensor [`PinnedBatch::finish`] returns).
    pub fn index(self) -> usize {
        self.0
    }
}

#[derive(Clone, Debug)]
struct Part {
    dtype: DType,
    shape: Vec<usize>,
    offset: usize,
    bytes: usize,
}

/// The tensors of a batch (dtype and shape each) and where each goes in the batch's block.
#[derive(Clone, Debug, Default)]
pub struct BatchLayout {
    parts: Vec<Part>,
    bytes: usize,
}

impl BatchLayout {
    /// Tensors inside one pinned block, and inside a moved batch's device allocation, start at
    /// multiples of this many bytes (what CUDA's own allocator guarantees for an allocation).
    pub const PART_ALIGN: usize = 256;
}

impl BatchLayout {
    /// An empty layout.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a contiguous tensor of `dtype` and `shape`; its bytes start at the next multiple of
    /// [`BatchLayout::PART_ALIGN`].
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] if the shape's byte count overflows.
    pub fn push(&mut self, dtype: DType, shape: &[usize]) -> Result<Slot> {
        let (_, n) = contiguous_strides(shape)?;
        let bytes = n
            .checked_mul(dtype.size())
            .ok_or_else(|| Error::Shape(format!("the byte count of shape {shape:?} overflows")))?;
        let offset = part_align(self.bytes);
        self.bytes = offset
            .checked_add(bytes)
            .ok_or_else(|| Error::Shape("the batch's byte count overflows".into()))?;
        self.parts.push(Part {
            dtype,
            shape: shape.to_vec(),
            offset,
            bytes,
        });
        Ok(Slot(self.parts.len() - 1))
    }

    /// How many tensors.
    pub fn len(&self) -> usize {
        self.parts.len()
    }

    /// Whether no tensor was added.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// The block's size: every tensor's bytes, each but the last rounded up to [`BatchLayout::PART_ALIGN`].
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Reserves the batch's one block from the process-wide pool.
    ///
    /// # Errors
    ///
    /// As [`PinnedPool::alloc`].
    pub fn allocate(&self) -> Result<PinnedBatch> {
        self.allocate_in(PinnedPool::global())
    }

    /// Reserves the batch's one block from `pool`. The tensors' elements are unspecified until
    /// written (whatever the block last held), except `bool` tensors, which start `false`.
    ///
    /// # Errors
    ///
    /// As [`PinnedPool::alloc`].
    pub fn allocate_in(&self, pool: &PinnedPool) -> Result<PinnedBatch> {
        let block = pool.alloc(self.bytes)?;
        for p in self.parts.iter().filter(|p| p.dtype == DType::Bool) {
            // SAFETY: the part lies within the fresh block, which nothing else references.
            unsafe { std::ptr::write_bytes(block.as_ptr().add(p.offset), 0, p.bytes) };
        }
        Ok(PinnedBatch {
            block: Arc::new(block),
            layout: self.clone(),
        })
    }
}

/// A batch's one pinned block while it is being written; see [below](#batches-built-in-place).
///
/// # Batches built in place
///
/// Batches built in place in pinned memory: one block per batch, writable views of it.
///
/// Say what the batch holds with a [`BatchLayout`], reserve its one block with
/// [`BatchLayout::allocate`], write each tensor through a [`TensorMut`] (safe Rust: typed
/// slices, row views, gathers from other tensors), and [`finish`](PinnedBatch::finish) it into
/// tensors. They share the block, which goes back to the pool when the last of them is dropped
/// and every copy reading it has finished. Offsets inside the block are multiples of
/// [`BatchLayout::PART_ALIGN`] bytes, the same as inside a moved batch's device allocation, so the whole
/// batch moves to a device with one copy.
///
/// ```
/// use pinnable::BatchLayout;
/// use pinnable::DType;
///
/// let mut layout = BatchLayout::new();
/// let images = layout.push(DType::F32, &[4, 3, 2, 2])?;
/// let labels = layout.push(DType::I64, &[4])?;
/// let mut batch = layout.allocate()?;
/// for (i, mut row) in batch.view_mut(images).rows_mut().enumerate() {
///     row.fill(i as f32)?; // in real life: copy sample i's image here
/// }
/// batch.view_mut(labels).copy_from_slice(&[3i64, 1, 4, 1])?;
/// let tensors = batch.finish();
/// assert!(tensors[0].shares_block_with(&tensors[1]));
/// assert_eq!(tensors[1].to_vec::<i64>()?, vec![3, 1, 4, 1]);
/// assert_eq!(tensors[0].to_vec::<f32>()?[12], 1.0);
/// # Ok::<(), pinnable::Error>(())
/// ```
pub struct PinnedBatch {
    block: Arc<PinnedBlock>,
    layout: BatchLayout,
}

impl PinnedBatch {
    /// The layout the batch was allocated with.
    pub fn layout(&self) -> &BatchLayout {
        &self.layout
    }

    /// The block the tensors will share.
    pub fn block(&self) -> &PinnedBlock {
        &self.block
    }

    /// A writable view of one tensor.
    ///
    /// # Panics
    ///
    /// If `slot` does not come from this batch's layout.
    pub fn view_mut(&mut self, slot: Slot) -> TensorMut<'_> {
        let part = &self.layout.parts[slot.0];
        // SAFETY: `&mut self` is exclusive over the block until the view is dropped; the part
        // lies within the block.
        unsafe {
            TensorMut::new(
                self.block.as_ptr().add(part.offset),
                part.dtype,
                &part.shape,
            )
        }
    }

    /// Writable views of every tensor at once, in layout order (they never overlap), for
    /// filling them side by side (on several threads, say).
    pub fn views_mut(&mut self) -> Vec<TensorMut<'_>> {
        let base = self.block.as_ptr();
        self.layout
            .parts
            .iter()
            // SAFETY: parts are disjoint ranges of the block, which `&mut self` holds exclusively
            // for as long as the views live.
            .map(|p| unsafe { TensorMut::new(base.add(p.offset), p.dtype, &p.shape) })
            .collect()
    }

    /// The batch's tensors, in layout order, sharing the block.
    pub fn finish(self) -> Vec<Tensor> {
        self.layout
            .parts
            .iter()
            .map(|p| {
                let storage = Storage::pinned(self.block.clone());
                Tensor::at(storage, p.dtype, &p.shape, p.offset)
                    .expect("the layout checked the shape")
            })
            .collect()
    }
}

/// Dimensions a view holds inline: enough for a batch of images (`[B, C, H, W]`) and more.
const INLINE_DIMS: usize = 6;

/// A view's shape, inline up to [`INLINE_DIMS`] dimensions, so that making a view of a row (one
/// per sample of a batch) allocates nothing.
#[derive(Clone)]
enum Dims {
    Inline {
        len: usize,
        dims: [usize; INLINE_DIMS],
    },
    Heap(Vec<usize>),
}

impl Dims {
    fn new(shape: &[usize]) -> Dims {
        if shape.len() <= INLINE_DIMS {
            let mut dims = [0; INLINE_DIMS];
            dims[..shape.len()].copy_from_slice(shape);
            Dims::Inline {
                len: shape.len(),
                dims,
            }
        } else {
            Dims::Heap(shape.to_vec())
        }
    }

    fn as_slice(&self) -> &[usize] {
        match self {
            Dims::Inline { len, dims } => &dims[..*len],
            Dims::Heap(v) => v,
        }
    }

    fn as_mut_slice(&mut self) -> &mut [usize] {
        match self {
            Dims::Inline { len, dims } => &mut dims[..*len],
            Dims::Heap(v) => v,
        }
    }
}

/// A writable, contiguous view of a tensor being built in pinned memory.
///
/// Every write is typed (a `bool` view only ever holds 0 or 1), so building a batch needs no
/// `unsafe`. Making a view allocates nothing (for up to six dimensions): a sample can be
/// written into its row of a batch without touching the heap.
pub struct TensorMut<'a> {
    ptr: *mut u8,
    dtype: DType,
    shape: Dims,
    _borrow: PhantomData<&'a mut [u8]>,
}

// SAFETY: a TensorMut is an exclusive borrow of plain bytes, like `&mut [u8]`.
unsafe impl Send for TensorMut<'_> {}
// SAFETY: shared access hands out nothing that writes.
unsafe impl Sync for TensorMut<'_> {}

impl<'a> TensorMut<'a> {
    /// # Safety
    ///
    /// 1. `ptr` is valid for reads and writes of `shape`'s elements of `dtype`, aligned for it,
    ///    and holds valid values of it, for `'a`.
    /// 2. Nothing else reads or writes those bytes during `'a`.
    unsafe fn new(ptr: *mut u8, dtype: DType, shape: &[usize]) -> TensorMut<'a> {
        TensorMut {
            ptr,
            dtype,
            shape: Dims::new(shape),
            _borrow: PhantomData,
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The size of each dimension.
    pub fn shape(&self) -> &[usize] {
        self.shape.as_slice()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.shape().iter().product()
    }

    /// The bytes of the elements.
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }

    /// The elements as a mutable slice.
    ///
    /// # Errors
    ///
    /// [`Error::DTypeMismatch`] if `T` is not the dtype.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        if T::DTYPE != self.dtype {
            return Err(Error::DTypeMismatch {
                actual: self.dtype,
                requested: T::DTYPE,
            });
        }
        // SAFETY: `new`'s contract: valid, aligned, exclusively borrowed elements of `T`.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.cast(), self.numel()) })
    }

    /// Sets every element to `value`.
    ///
    /// # Errors
    ///
    /// [`Error::DTypeMismatch`] if `T` is not the dtype.
    pub fn fill<T: Element>(&mut self, value: T) -> Result<()> {
        self.as_mut_slice::<T>()?.fill(value);
        Ok(())
    }

    /// Sets every element to zero (`false`, `0`, `+0.0`), whatever the dtype.
    pub fn fill_zeros(&mut self) {
        // SAFETY: all-zero bytes are a valid value of every dtype; the view owns its bytes.
        unsafe { std::ptr::write_bytes(self.ptr, 0, self.nbytes()) };
    }

    /// Copies `src` in, element for element.
    ///
    /// # Errors
    ///
    /// [`Error::DTypeMismatch`], or [`Error::Shape`] if the lengths differ.
    pub fn copy_from_slice<T: Element>(&mut self, src: &[T]) -> Result<()> {
        let dst = self.as_mut_slice::<T>()?;
        if dst.len() != src.len() {
            return Err(Error::Shape(format!(
                "cannot copy {} elements into a view of {}",
                src.len(),
                dst.len()
            )));
        }
        dst.copy_from_slice(src);
        Ok(())
    }

    /// Copies a host tensor of the same dtype and shape in (any strides: views are gathered).
    /// Waits for a pending copy into `src` first.
    ///
    /// # Errors
    ///
    /// [`Error::DTypeMismatch`], [`Error::Shape`] if the shapes differ,
    /// [`Error::WrongPlacement`] for a device tensor.
    pub fn copy_from(&mut self, src: &Tensor) -> Result<()> {
        if src.dtype() != self.dtype {
            return Err(Error::DTypeMismatch {
                actual: src.dtype(),
                requested: self.dtype,
            });
        }
        if src.shape() != self.shape() {
            return Err(Error::Shape(format!(
                "cannot copy a tensor of shape {:?} into a view of shape {:?}",
                src.shape(),
                self.shape()
            )));
        }
        let gather = src.host_src("copy_from")?;
        // SAFETY: the source is live (held by `src`) and, being another storage's bytes or
        // read-only shared bytes, does not overlap this exclusively borrowed view, which has
        // room for exactly `gather.bytes()` bytes of the same dtype.
        unsafe { gather.gather_streaming(self.ptr) };
        Ok(())
    }

    /// A view of the elements `start..start + len` along the first dimension.
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] for a rank-0 view or a range out of bounds.
    pub fn narrow_mut(&mut self, start: usize, len: usize) -> Result<TensorMut<'_>> {
        let Some(&size) = self.shape().first() else {
            return Err(Error::Shape("cannot narrow a rank-0 view".into()));
        };
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::Shape(format!(
                "range {start}..{} is out of bounds for a first dimension of {size}",
                start.saturating_add(len)
            )));
        }
        let row = self.nbytes() / size.max(1);
        let mut shape = self.shape.clone();
        shape.as_mut_slice()[0] = len;
        // SAFETY: the range lies within this view, which is borrowed for the result's life.
        Ok(unsafe { TensorMut::new(self.ptr.add(start * row), self.dtype, shape.as_slice()) })
    }

    /// Views of each index along the first dimension (rank one less), which never overlap:
    /// row `i` of a stacked batch is sample `i`'s place.
    pub fn rows_mut(&mut self) -> impl ExactSizeIterator<Item = TensorMut<'_>> + '_ {
        let n = self.shape().first().copied().unwrap_or(0);
        let row = self.nbytes().checked_div(n).unwrap_or(0);
        let inner = Dims::new(self.shape().get(1..).unwrap_or_default());
        let (ptr, dtype) = (self.ptr, self.dtype);
        // SAFETY: rows are disjoint ranges of this view, borrowed for the iterator's life.
        (0..n).map(move |i| unsafe { TensorMut::new(ptr.add(i * row), dtype, inner.as_slice()) })
    }
}

impl std::fmt::Debug for TensorMut<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TensorMut({} {:?})", self.dtype, self.shape())
    }
}

/// Host-side unit tests over the heap test-double pool, so Miri can run them.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::PoolConfig;

    fn pool() -> PinnedPool {
        PinnedPool::heap(PoolConfig::default())
    }

    #[test]
    fn parts_start_at_aligned_offsets_in_one_block() {
        let mut layout = BatchLayout::new();
        let a = layout.push(DType::U8, &[3]).unwrap();
        let b = layout.push(DType::F64, &[2, 2]).unwrap();
        let c = layout.push(DType::Bool, &[5]).unwrap();
        assert_eq!((a.index(), b.index(), c.index()), (0, 1, 2));
        assert_eq!(
            layout.bytes(),
            2 * PART_ALIGN + 5,
            "the last part is not padded"
        );
        let pool = pool();
        let mut batch = layout.allocate_in(&pool).unwrap();
        assert_eq!(
            batch.view_mut(c).as_mut_slice::<bool>().unwrap(),
            &[false; 5]
        );
        batch.view_mut(a).copy_from_slice(&[1u8, 2, 3]).unwrap();
        batch.view_mut(b).fill(2.5f64).unwrap();
        let t = batch.finish();
        assert_eq!(t[0].to_vec::<u8>().unwrap(), [1, 2, 3]);
        assert_eq!(t[1].to_vec::<f64>().unwrap(), [2.5; 4]);
        assert!(t[0].shares_block_with(&t[2]));
        assert_eq!(pool.stats().allocations, 1);
        drop(t);
        assert_eq!(pool.stats().in_use_bytes, 0);
    }

    #[test]
    fn rows_and_narrow_views_write_their_own_bytes() {
        let mut layout = BatchLayout::new();
        let x = layout.push(DType::I32, &[3, 4]).unwrap();
        let pool = pool();
        let mut batch = layout.allocate_in(&pool).unwrap();
        let mut v = batch.view_mut(x);
        for (i, mut row) in v.rows_mut().enumerate() {
            row.fill(i as i32).unwrap();
        }
        v.narrow_mut(1, 1).unwrap().fill(-1i32).unwrap();
        assert!(v.narrow_mut(2, 2).is_err());
        let src = Tensor::from_vec((0..8).collect::<Vec<i32>>(), &[2, 4])
            .unwrap()
            .narrow(0, 1, 1)
            .unwrap();
        v.narrow_mut(2, 1).unwrap().copy_from(&src).unwrap();
        assert!(v.copy_from(&src).is_err(), "shapes differ");
        let t = batch.finish().pop().unwrap();
        assert_eq!(
            t.to_vec::<i32>().unwrap(),
            [0, 0, 0, 0, -1, -1, -1, -1, 4, 5, 6, 7]
        );
    }

    #[test]
    fn views_of_every_part_fill_side_by_side() {
        let mut layout = BatchLayout::new();
        for n in 1..5 {
            layout.push(DType::U16, &[n]).unwrap();
        }
        let pool = pool();
        let mut batch = layout.allocate_in(&pool).unwrap();
        std::thread::scope(|s| {
            for (i, mut v) in batch.views_mut().into_iter().enumerate() {
                s.spawn(move || v.fill(i as u16).unwrap());
            }
        });
        let t = batch.finish();
        for (i, t) in t.iter().enumerate() {
            assert_eq!(t.to_vec::<u16>().unwrap(), vec![i as u16; i + 1]);
        }
    }
}
