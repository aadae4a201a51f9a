//! Host-side unit tests of tensors (views, gathers, copy-on-write, borrowed bytes): no OS or
//! driver call, so Miri can run them.

use std::sync::Arc;

use super::*;
use crate::alloc::{PinnedPool, PoolConfig};
use crate::batch::BatchLayout;

#[test]
fn views_share_storage_and_gather_in_row_major_order() {
    let t = Tensor::from_vec((0..24).collect::<Vec<i64>>(), &[2, 3, 4]).unwrap();
    let tt = t.transpose(0, 2).unwrap();
    assert_eq!(tt.shape(), &[4, 3, 2]);
    assert!(tt.shares_storage_with(&t) && !tt.is_contiguous());
    assert_eq!(tt.to_vec::<i64>().unwrap()[..6], [0, 12, 4, 16, 8, 20]);
    let n = t.narrow(1, 1, 2).unwrap();
    assert_eq!(
        n.to_vec::<i64>().unwrap(),
        [4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23]
    );
    let s = t.select(2, 3).unwrap();
    assert_eq!(s.shape(), &[2, 3]);
    assert_eq!(s.to_vec::<i64>().unwrap(), [3, 7, 11, 15, 19, 23]);
    assert!(t.select(0, 2).is_err() && t.select(3, 0).is_err());
    assert!(t.narrow(1, 2, 2).is_err());
    assert_eq!(t.reshape(&[6, 4]).unwrap().shape(), &[6, 4]);
    assert!(tt.reshape(&[24]).is_err());
    let c = tt.contiguous().unwrap();
    assert!(c.is_contiguous() && !c.shares_storage_with(&t));
    assert_eq!(c.to_vec::<i64>().unwrap(), tt.to_vec::<i64>().unwrap());
}

#[test]
fn writes_never_reach_another_tensor() {
    let mut a = Tensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
    let b = a.clone();
    a.as_mut_slice::<f32>().unwrap()[0] = 9.0;
    assert_eq!(
        b.to_vec::<f32>().unwrap(),
        [1.0; 4],
        "the clone kept its values"
    );
    assert_eq!(a.to_vec::<f32>().unwrap()[0], 9.0);
    // In place when unique.
    let ptr = a.as_slice::<f32>().unwrap().as_ptr();
    a.as_mut_slice::<f32>().unwrap()[1] = 8.0;
    assert_eq!(a.as_slice::<f32>().unwrap().as_ptr(), ptr);
}

#[test]
fn pinned_parts_write_in_place_unless_shared() {
    let pool = PinnedPool::heap(PoolConfig::default());
    let mut layout = BatchLayout::new();
    layout.push(DType::U32, &[3]).unwrap();
    layout.push(DType::U32, &[3]).unwrap();
    let mut batch = layout.allocate_in(&pool).unwrap();
    for mut v in batch.views_mut() {
        v.fill(5u32).unwrap();
    }
    let mut parts = batch.finish();
    let other = parts[1].clone();
    parts[0].as_mut_slice::<u32>().unwrap()[0] = 1;
    assert!(
        parts[0].shares_block_with(&parts[1]),
        "unique part: written in place"
    );
    assert_eq!(
        parts[1].pinned_block().unwrap().as_ptr(),
        parts[0].pinned_block().unwrap().as_ptr()
    );
    assert_eq!(parts[0].to_vec::<u32>().unwrap(), [1, 5, 5]);
    assert_eq!(other.to_vec::<u32>().unwrap(), [5, 5, 5]);
}

#[test]
fn borrowed_bytes_are_checked_and_viewed_without_a_copy() {
    let bytes: Arc<Vec<u8>> = Arc::new((0..64).collect());
    let t = Tensor::from_host_bytes(bytes.clone(), DType::U8, &[4, 8], 32).unwrap();
    assert_eq!(
        t.select(0, 1).unwrap().to_vec::<u8>().unwrap(),
        (40..48).collect::<Vec<_>>()
    );
    assert!(Tensor::from_host_bytes(bytes.clone(), DType::U8, &[5, 8], 32).is_err());
    let bools = Arc::new(vec![0u8, 1, 2]);
    assert!(Tensor::from_host_bytes(bools.clone(), DType::Bool, &[2], 0).is_ok());
    assert!(
        Tensor::from_host_bytes(bools, DType::Bool, &[3], 0).is_err(),
        "2 is no bool"
    );
    // A write goes to a private copy; the borrowed bytes stay as they were.
    let mut w = Tensor::from_host_bytes(bytes.clone(), DType::U8, &[4], 0).unwrap();
    w.as_mut_slice::<u8>().unwrap()[0] = 200;
    assert_eq!(bytes[0], 0);
    assert_eq!(w.to_vec::<u8>().unwrap(), [200, 1, 2, 3]);
}

/// Host bytes that start where the test says within a vector: any slice is a valid answer
/// under the [`HostBytes`] contract, however its first byte is aligned.
struct Shifted {
    bytes: Vec<u8>,
    start: usize,
}

impl Shifted {
    /// `len` bytes `0, 1, 2, ...` whose first byte's address is `misalign` past a multiple of 8.
    fn new(len: usize, misalign: usize) -> Shifted {
        let bytes: Vec<u8> = (0..len + 8).map(|i| i as u8).collect();
        let start = (0..8)
            .find(|s| (bytes.as_ptr() as usize + s) % 8 == misalign)
            .expect("some start in 0..8 has each residue");
        Shifted { bytes, start }
    }
}

impl HostBytes for Shifted {
    fn host_bytes(&self) -> &[u8] {
        &self.bytes[self.start..]
    }
}

#[test]
fn from_host_bytes_reads_whole_aligned_elements_or_refuses() {
    // Every first-byte alignment of the owner's slice and every byte offset: a tensor that is
    // made must read exactly the elements at its offset, through an aligned slice.
    for misalign in 0..8 {
        for offset in 0..12 {
            let owner = Arc::new(Shifted::new(32, misalign));
            let have = owner.host_bytes().to_vec();
            let made = Tensor::from_host_bytes(owner, DType::U32, &[2], offset);
            let Ok(t) = made else {
                continue;
            };
            let want: Vec<u32> = have[offset..offset + 8]
                .chunks(4)
                .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
                .collect();
            assert_eq!(
                t.to_vec::<u32>().unwrap(),
                want,
                "misalign {misalign}, byte_offset {offset}: read other bytes"
            );
            let slice = t.as_slice::<u32>().unwrap();
            assert!(slice.as_ptr().is_aligned(), "a misaligned &[u32]");
            assert_eq!(slice, &want[..]);
        }
    }
    // The case from the report: one byte into the buffer, three more of offset, u32.
    let err = Tensor::from_host_bytes(Arc::new(Shifted::new(32, 1)), DType::U32, &[2], 3)
        .expect_err("a byte offset of 3 is not a whole number of u32 elements");
    assert!(err.to_string().contains("multiple of 4"), "{err}");
    // An aligned start at a whole-element offset is accepted.
    let t = Tensor::from_host_bytes(Arc::new(Shifted::new(32, 0)), DType::U32, &[2], 4).unwrap();
    assert_eq!(t.numel(), 2);
}

/// A safe `HostBytes` whose answer shrinks after the first call (the trait cannot stop it).
struct Shrinking {
    first: Vec<u8>,
    later: Vec<u8>,
    calls: std::sync::atomic::AtomicUsize,
}

impl HostBytes for Shrinking {
    fn host_bytes(&self) -> &[u8] {
        use std::sync::atomic::Ordering;
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            &self.first
        } else {
            &self.later
        }
    }
}

/// Where `got` first differs from `want` (a length difference counts), for short messages.
fn first_difference(got: &[u8], want: &[u8]) -> Option<usize> {
    let n = got.len().min(want.len());
    (0..n)
        .find(|&i| got[i] != want[i])
        .or((got.len() != want.len()).then_some(n))
}

#[test]
fn host_bytes_are_read_once_and_every_read_uses_that_answer() {
    use std::sync::atomic::Ordering;
    let n = if cfg!(miri) { 1 << 10 } else { 64 << 10 };
    let owner = Arc::new(Shrinking {
        first: (0..n).map(|i| (i * 7 + 3) as u8).collect(),
        later: vec![0xEE; 4],
        calls: Default::default(),
    });
    let want = owner.first.clone();
    let t = Tensor::from_host_bytes(owner.clone(), DType::U8, &[n / 64, 64], 0).unwrap();
    let check = |what: &str, got: &[u8], want: &[u8]| {
        let at = first_difference(got, want);
        assert!(
            at.is_none(),
            "{what}: read other bytes (first difference at byte {at:?})"
        );
    };
    // Every host read: a copy out, a slice, a view, a strided gather, a pinned copy and a
    // write into a batch.
    check("to_vec", &t.to_vec::<u8>().unwrap(), &want);
    check("as_slice", t.as_slice::<u8>().unwrap(), &want);
    check(
        "select",
        &t.select(0, 3).unwrap().to_vec::<u8>().unwrap(),
        &want[192..256],
    );
    let column: Vec<u8> = want.iter().step_by(64).copied().collect();
    let tt = t.transpose(0, 1).unwrap().contiguous().unwrap();
    check("contiguous", &tt.to_vec::<u8>().unwrap()[..n / 64], &column);
    let pool = PinnedPool::heap(PoolConfig::default());
    let pinned = crate::pin::PinContext::run(&pool, |cx| cx.pin_tensor(&t)).unwrap();
    check("pinned copy", &pinned.to_vec::<u8>().unwrap(), &want);
    let mut layout = BatchLayout::new();
    let slot = layout.push(DType::U8, &[n / 64, 64]).unwrap();
    let mut batch = layout.allocate_in(&pool).unwrap();
    batch.view_mut(slot).copy_from(&t).unwrap();
    check(
        "copy_from",
        &batch.finish()[0].to_vec::<u8>().unwrap(),
        &want,
    );
    assert_eq!(
        owner.calls.load(Ordering::SeqCst),
        1,
        "asked once, when made"
    );
}

/// `n` random u32s from `rng`, and their bytes.
fn random_u32s(rng: &mut crate::loader::SplitMix64, n: usize) -> (Vec<u32>, Vec<u8>) {
    let values: Vec<u32> = (0..n).map(|_| rng.next_u64() as u32).collect();
    let bytes = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    (values, bytes)
}

#[test]
fn a_source_names_the_memory_buffer_and_bytes_a_move_reads() {
    let mut rng = crate::loader::SplitMix64::for_test("a_source_names_the_memory");
    let (rows, cols) = (2 + rng.below(5) as usize, 2 + rng.below(6) as usize);
    let k = 1 + rng.below(cols as u64 - 1) as usize;
    let (values, _) = random_u32s(&mut rng, rows * cols);
    let h = Tensor::from_vec(values, &[rows, cols]).unwrap();
    let src = h.source();
    let Memory::Pageable(ptr) = src.memory else {
        panic!("a vector's tensor is pageable")
    };
    assert_eq!(
        ptr.cast_const(),
        h.as_slice::<u32>().unwrap().as_ptr().cast()
    );
    assert_eq!(src.span, 0..rows * cols * 4);
    assert!(src.ready.is_none() && src.memory.placement() == Placement::Pageable);
    // A view touches its own bytes of the same buffer.
    let v = h.narrow(1, k, cols - k).unwrap();
    let vs = v.source();
    assert_eq!(vs.buffer, src.buffer);
    assert_eq!(vs.span, k * 4..rows * cols * 4);

    let pool = PinnedPool::heap(PoolConfig::default());
    let mut layout = BatchLayout::new();
    layout.push(DType::U32, &[rows]).unwrap();
    layout.push(DType::U32, &[cols]).unwrap();
    let parts = layout.allocate_in(&pool).unwrap().finish();
    let (a, b) = (parts[0].source(), parts[1].source());
    let (Memory::Pinned(ba), Memory::Pinned(bb)) = (a.memory, b.memory) else {
        panic!("a pinned batch's tensors are pinned")
    };
    assert!(Arc::ptr_eq(ba, bb), "one block behind the batch");
    assert_eq!(a.buffer, b.buffer);
    assert_ne!(a.buffer, src.buffer);
    assert_eq!((a.span.len(), b.span.len()), (rows * 4, cols * 4));
    assert!(a.span.end <= b.span.start, "the parts do not overlap");
    assert_eq!(a.memory.base(), ba.as_ptr() as u64);
}

#[test]
fn arena_results_share_a_storage_exactly_where_their_sources_do() {
    let mut rng = crate::loader::SplitMix64::for_test("arena_results_share");
    let (rows, cols, m) = (
        2 + rng.below(6) as usize,
        2 + rng.below(6) as usize,
        1 + rng.below(9) as usize,
    );
    let (s_values, s_bytes) = random_u32s(&mut rng, rows * cols);
    let (o_values, o_bytes) = random_u32s(&mut rng, m);
    let s = Tensor::from_vec(s_values, &[rows, cols]).unwrap();
    let rows_after_first = s.narrow(0, 1, rows - 1).unwrap();
    let transposed = s.transpose(0, 1).unwrap();
    let o = Tensor::from_vec(o_values.clone(), &[m]).unwrap();
    let t_bytes: Vec<u8> = transposed
        .to_vec::<u32>()
        .unwrap()
        .iter()
        .flat_map(|v| v.to_ne_bytes())
        .collect();

    // The arena as a move's copies leave it: `s`'s span, `o`, and the transpose contiguous.
    let o_at = s_bytes.len().next_multiple_of(16);
    let t_at = (o_at + o_bytes.len()).next_multiple_of(16);
    let pool = PinnedPool::heap(PoolConfig::default());
    let block = Arc::new(pool.alloc(t_at + t_bytes.len()).unwrap());
    {
        // SAFETY: the block was just allocated; nothing else refers to its bytes while this
        // slice lives.
        let dst = unsafe { block.as_mut_slice() };
        dst[..s_bytes.len()].copy_from_slice(&s_bytes);
        dst[o_at..o_at + o_bytes.len()].copy_from_slice(&o_bytes);
        dst[t_at..t_at + t_bytes.len()].copy_from_slice(&t_bytes);
    }
    let ready = Arc::new(std::sync::OnceLock::new());
    let mut arena = Arena::pinned(block.clone(), &ready);
    assert_eq!(arena.at(o_at), block.as_ptr() as u64 + o_at as u64);

    let rs = arena.mirrored(&s, 0);
    let rr = arena.mirrored(&rows_after_first, rows_after_first.source().span.start);
    let rt = arena.mirrored(&transposed, 0);
    let ro = arena.mirrored(&o, o_at);
    assert_eq!(rs.to_vec::<u32>().unwrap(), s.to_vec::<u32>().unwrap());
    assert_eq!(
        rr.to_vec::<u32>().unwrap(),
        rows_after_first.to_vec::<u32>().unwrap()
    );
    assert_eq!(
        rt.to_vec::<u32>().unwrap(),
        transposed.to_vec::<u32>().unwrap()
    );
    assert_eq!(rt.strides(), transposed.strides(), "a mirror keeps strides");
    assert_eq!(ro.to_vec::<u32>().unwrap(), o_values);
    // Sources that share a storage give results that share one; others get their own.
    assert!(rs.shares_storage_with(&rr) && rs.shares_storage_with(&rt));
    assert!(!ro.shares_storage_with(&rs) && ro.shares_block_with(&rs));
    assert!(rs.is_pinned() && rs.is_ready());

    // Placed alone, a span or a contiguous copy is a storage of its own.
    let spanned = arena.spanned(&transposed, 0);
    assert!(!spanned.shares_storage_with(&rt) && spanned.shares_block_with(&rt));
    assert_eq!(
        spanned.to_vec::<u32>().unwrap(),
        rt.to_vec::<u32>().unwrap()
    );
    let contiguous = arena.contiguous(&transposed, t_at);
    assert!(contiguous.is_contiguous());
    assert_eq!(
        contiguous.to_vec::<u32>().unwrap(),
        transposed.to_vec::<u32>().unwrap()
    );
    let assembled = arena.tensor(DType::U32, &[m], o_at).unwrap();
    assert_eq!(assembled.to_vec::<u32>().unwrap(), o_values);

    // What the sharing is for: a write through one result never reaches an overlapping one.
    // (Its private copy comes from the process-wide pool, which asks the driver: not under
    // Miri, which runs everything above.)
    if cfg!(miri) {
        return;
    }
    let before = rr.to_vec::<u32>().unwrap();
    let mut written = rs.clone();
    drop(rs);
    let flipped = !written.to_vec::<u32>().unwrap()[cols];
    written.as_mut_slice::<u32>().unwrap()[cols] = flipped;
    assert_eq!(rr.to_vec::<u32>().unwrap(), before);
    assert_eq!(written.to_vec::<u32>().unwrap()[cols], flipped);
}
