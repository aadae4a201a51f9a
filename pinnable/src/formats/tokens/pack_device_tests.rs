//! The packing kernel's model, run on the host over what a worker stages, against the host
//! path.

use super::{Layout, PackedBatcher, stage};
use crate::dtype::DType;
use crate::formats::tokens::{PackedBatch, PackedDocs, TokenDocs};
use crate::loader::{Budget, BudgetPlan, Collator, SplitMix64};
use crate::{Device, PinnedPool, Tensor};

/// A test's random numbers (its seed printed).
struct Rng(SplitMix64);

impl Rng {
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.0.below((hi - lo) as u64) as usize
    }

    fn coin(&mut self) -> bool {
        self.0.next_u64() & 1 == 1
    }

    fn u32(&mut self) -> u32 {
        (self.0.next_u64() >> 33) as u32
    }

    fn u16(&mut self) -> u16 {
        (self.0.next_u64() >> 48) as u16
    }
}

/// What `pack.cu` writes, thread by thread (`t`), with the same search and casts: the output
/// dtype's values widened to i64 (`i32` when `narrow`).
#[derive(Debug, PartialEq)]
struct Fields {
    ids: Vec<i64>,
    labels: Vec<i64>,
    positions: Vec<i64>,
    seq: Vec<i32>,
    mask: Vec<u8>,
}

fn model(tokens: &[u32], cu: &[i32], docs: u32, real: u32, total: u32, pad: u32) -> Fields {
    let mut f = Fields {
        ids: vec![],
        labels: vec![],
        positions: vec![],
        seq: vec![],
        mask: vec![],
    };
    for t in 0..total {
        if t < real {
            let (mut lo, mut hi) = (0u32, docs);
            while hi - lo > 1 {
                let mid = (lo + hi) / 2;
                if cu[mid as usize] as u32 <= t {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            let start = cu[lo as usize] as u32;
            let tok = i64::from(tokens[t as usize]);
            f.ids.push(tok);
            f.labels.push(if t == start { -100 } else { tok });
            f.positions.push(i64::from(t - start));
            f.seq.push(lo as i32);
            f.mask.push(1);
        } else {
            f.ids.push(i64::from(pad));
            f.labels.push(-100);
            f.positions.push(0);
            f.seq.push(-1);
            f.mask.push(0);
        }
    }
    f
}

fn ints(t: &Tensor) -> Vec<i64> {
    match t.dtype() {
        DType::I64 => t.to_vec::<i64>().unwrap(),
        _ => t
            .to_vec::<i32>()
            .unwrap()
            .into_iter()
            .map(i64::from)
            .collect(),
    }
}

/// Random documents of `wide` (u32) or u16 tokens, packed by a random plan.
fn random_packed(r: &mut Rng, wide: bool) -> PackedDocs {
    let n = r.range(5, 80);
    let docs: Vec<Tensor> = (0..n)
        .map(|_| {
            let len = r.range(1, 600);
            if wide {
                Tensor::from_vec1((0..len).map(|_| r.u32()).collect::<Vec<_>>())
            } else {
                Tensor::from_vec1((0..len).map(|_| r.u16()).collect::<Vec<_>>())
            }
        })
        .collect();
    let docs = TokenDocs::from_dataset(docs).unwrap();
    let budget = Budget::Packed {
        row_tokens: r.range(600, 3000),
        rows: r.range(1, 5),
    };
    let plan = BudgetPlan::options(budget)
        .shuffle(r.0.next_u64())
        .build(docs.lengths().clone())
        .unwrap();
    PackedDocs::new(docs, plan).unwrap()
}

/// On random batches (u16 and u32 tokens, i64 and i32, fixed shape or not, with and without
/// `seq_idx`, random pad ids), the kernel's model over the staged block equals the host path
/// field by field, and the device layout keeps every field apart and in bounds.
#[test]
fn the_kernels_model_equals_the_host_path() {
    let mut r = Rng(SplitMix64::for_test(
        "the_kernels_model_equals_the_host_path",
    ));
    let pool = PinnedPool::global();
    let mut seen = [[false; 2]; 2];
    for _ in 0..60 {
        let wide = r.coin();
        let packed = random_packed(&mut r, wide);
        let dtype = if r.coin() { DType::I64 } else { DType::I32 };
        let (fixed, with_seq) = (r.coin(), r.coin());
        seen[usize::from(fixed)][usize::from(with_seq)] = true;
        let pad = if wide { r.u32() } else { u32::from(r.u16()) };
        let b: PackedBatcher = packed
            .batcher(dtype)
            .unwrap()
            .fixed_shape(fixed)
            .seq_idx(with_seq)
            .pad_id(pad)
            .unwrap();
        let epoch = r.range(0, 3) as u64;
        for slot in 0..packed.plan().len().min(6) {
            let pieces = b.pieces(epoch, slot).unwrap();
            let host = b
                .batch_of(pieces.clone(), &mut Collator::new(pool))
                .unwrap();
            let cu = host.cu_seqlens_host.to_vec();
            let total = host.labels.shape()[1];
            let real = host.real_tokens;
            let block = stage(&b, &pieces, &cu, pool).unwrap();
            let at = super::align(cu.len() * 4);
            // SAFETY: the block was filled by `stage`: `cu` then `real` tokens at `at`.
            let (staged_cu, tokens) = unsafe {
                let p = block.as_ptr();
                let cu = std::slice::from_raw_parts(p.cast::<i32>(), cu.len()).to_vec();
                let tokens: Vec<u32> = if wide {
                    std::slice::from_raw_parts(p.add(at).cast::<u32>(), real).to_vec()
                } else {
                    let t = std::slice::from_raw_parts(p.add(at).cast::<u16>(), real);
                    t.iter().map(|&v| u32::from(v)).collect()
                };
                (cu, tokens)
            };
            assert_eq!(staged_cu, cu);
            let m = model(
                &tokens,
                &staged_cu,
                pieces.len() as u32,
                real as u32,
                total as u32,
                pad,
            );
            assert_eq!(m.ids, ints(&host.input_ids.tensor().unwrap()), "input_ids");
            assert_eq!(m.labels, ints(&host.labels), "labels");
            assert_eq!(m.positions, ints(&host.position_ids), "position_ids");
            match &host.seq_idx {
                Some(s) => assert_eq!(m.seq, s.to_vec::<i32>().unwrap(), "seq_idx"),
                None => assert!(!with_seq),
            }
            match &host.padding_mask {
                Some(s) => assert_eq!(m.mask, s.to_vec::<u8>().unwrap(), "padding_mask"),
                None => assert!(!fixed),
            }
            let l = Layout::of(&b, total, cu.len(), real);
            let e = dtype.size();
            let mut parts = vec![
                (l.ids, total * e),
                (l.labels, total * e),
                (l.positions, total * e),
                (l.cu, cu.len() * 4),
                (l.tokens, real * if wide { 4 } else { 2 }),
            ];
            parts.extend(l.seq.map(|s| (s, total * 4)));
            parts.extend(l.mask.map(|s| (s, total)));
            parts.sort_unstable();
            assert!(parts.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0), "{l:?}");
            assert_eq!(l.bytes, l.tokens + real * if wide { 4 } else { 2 });
            assert_eq!(l.bytes - l.cu, at + real * if wide { 4 } else { 2 });
        }
    }
    assert_eq!(seen, [[true; 2]; 2], "every mode was drawn");
}

/// A batch for the host is written on the host whether or not CUDA batches are built on the
/// device: the same values, nothing pending, every tensor on the host.
#[test]
fn a_host_batch_is_written_on_the_host_either_way() {
    let mut r = Rng(SplitMix64::for_test(
        "a_host_batch_is_written_on_the_host_either_way",
    ));
    let packed = random_packed(&mut r, false);
    let pool = PinnedPool::global();
    let built = packed.batcher(DType::I64).unwrap();
    let written = built.clone().device_built(false);
    for slot in 0..packed.plan().len().min(4) {
        let a = built.batch_at(0, slot, &mut Collator::new(pool)).unwrap();
        let b = written.batch_at(0, slot, &mut Collator::new(pool)).unwrap();
        assert!(!a.input_ids.is_pending());
        assert_eq!(a.labels.device(), Device::cpu());
        let ids = |b: &PackedBatch| b.input_ids.tensor().unwrap().to_vec::<i64>().unwrap();
        assert_eq!(ids(&a), ids(&b), "slot {slot}");
        assert_eq!(
            a.labels.to_vec::<i64>().unwrap(),
            b.labels.to_vec::<i64>().unwrap()
        );
        assert_eq!(a.cu_seqlens_host, b.cu_seqlens_host);
    }
}
