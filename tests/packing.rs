//! Variable-length documents: packed batches equal Hugging Face's `DataCollatorWithFlattening`
//! (a hand-computed case, and the fixture its script writes); token-budget batches never go
//! over budget; every rank gets the same number of batches; the order does not depend on the
//! worker count; a run resumes at any batch; an over-budget document is an error naming it, or
//! is split; on a GPU, packed batches equal the host path.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use pinnable::formats::npy::NpyArray;
use pinnable::formats::tokens::{
    IGNORE_INDEX, PackedBatch, PackedDocs, Separator, TokenDocs, TokenShards,
};
use pinnable::loader::{Budget, BudgetPlan, Collator, Dataset, Loader, Piece, Position};
use pinnable::{DType, Error, PinnedPool, Tensor, ToDevice};
use pinnable_harness::tokens::{TempDir, token_bytes, write};
use pinnable_harness::{cuda_or_skip, rng};
use rand::Rng;

/// Pinned batches come from page-locked memory, which `ulimit -l` bounds on a machine without
/// CUDA: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// `n` documents of random u16 tokens, long-tailed lengths up to `max`.
fn random_docs(r: &mut impl Rng, n: usize, max: usize) -> Vec<Vec<u16>> {
    (0..n)
        .map(|_| {
            let len = if r.random_bool(0.1) {
                r.random_range(1..=max)
            } else {
                r.random_range(1..=max.div_ceil(8))
            };
            (0..len).map(|_| r.random_range(0..50257u16)).collect()
        })
        .collect()
}

fn token_docs(docs: &[Vec<u16>]) -> TokenDocs {
    let tensors: Vec<Tensor> = docs.iter().map(|d| Tensor::from_vec1(d.clone())).collect();
    TokenDocs::from_dataset(tensors).unwrap()
}

fn as_i64(t: &Tensor) -> Vec<i64> {
    match t.dtype() {
        DType::I64 => t.to_vec::<i64>().unwrap(),
        DType::I32 => t
            .to_vec::<i32>()
            .unwrap()
            .into_iter()
            .map(i64::from)
            .collect(),
        other => panic!("unexpected dtype {other}"),
    }
}

/// A batch's values on the host: input_ids, labels, position_ids, cu_seqlens, seq_idx.
#[derive(Debug, PartialEq)]
struct Values {
    input_ids: Vec<i64>,
    labels: Vec<i64>,
    position_ids: Vec<i64>,
    cu_seqlens: Vec<i32>,
    seq_idx: Vec<i32>,
    max_seqlen: usize,
}

fn values(b: &PackedBatch) -> Values {
    let host = |t: &Tensor| t.to_cpu(false).unwrap();
    Values {
        input_ids: as_i64(&host(&b.input_ids.tensor().unwrap())),
        labels: as_i64(&host(&b.labels)),
        position_ids: as_i64(&host(&b.position_ids)),
        cu_seqlens: host(&b.cu_seqlens).to_vec::<i32>().unwrap(),
        seq_idx: b
            .seq_idx
            .as_ref()
            .map(|s| host(s).to_vec::<i32>().unwrap())
            .unwrap_or_default(),
        max_seqlen: b.max_seqlen,
    }
}

/// What Hugging Face's `DataCollatorWithFlattening(return_flash_attn_kwargs=True,
/// return_seq_idx=True)` makes of `pieces`, written from its definition.
fn flattening_reference(docs: &[Vec<u16>], pieces: &[Piece]) -> Values {
    let mut v = Values {
        input_ids: vec![],
        labels: vec![],
        position_ids: vec![],
        cu_seqlens: vec![0],
        seq_idx: vec![],
        max_seqlen: 0,
    };
    for (k, p) in pieces.iter().enumerate() {
        let ids: Vec<i64> = docs[p.sample][p.start..p.start + p.len]
            .iter()
            .map(|&t| i64::from(t))
            .collect();
        v.labels.push(IGNORE_INDEX);
        v.labels.extend_from_slice(&ids[1..]);
        v.position_ids.extend(0..ids.len() as i64);
        v.seq_idx.extend(std::iter::repeat_n(k as i32, ids.len()));
        v.cu_seqlens
            .push(v.cu_seqlens.last().unwrap() + ids.len() as i32);
        v.max_seqlen = v.max_seqlen.max(ids.len());
        v.input_ids.extend(ids);
    }
    v
}

fn packed(docs: &TokenDocs, budget: Budget, seed: u64, window: usize) -> PackedDocs {
    let plan = BudgetPlan::options(budget)
        .shuffle(seed)
        .sort_window(window)
        .build(docs.lengths().clone())
        .unwrap();
    PackedDocs::new(docs.clone(), plan).unwrap()
}

/// Three documents in one batch, every field computed by hand from Hugging Face's
/// definitions; then the same batch in fixed shape.
#[test]
fn hand_computed_batch_matches_the_flattening_collator() {
    let _s = serial();
    let docs = token_docs(&[vec![5, 6, 7], vec![8, 9], vec![10]]);
    let budget = Budget::Tokens {
        max_tokens: 8,
        count_padding: false,
    };
    let plan = BudgetPlan::options(budget)
        .sort_window(1)
        .build(docs.lengths().clone())
        .unwrap();
    assert_eq!(plan.len(), 1);
    let packed = PackedDocs::new(docs, plan).unwrap();
    let batcher = packed.batcher(DType::I64).unwrap();
    let pool = PinnedPool::global();
    let b = batcher.batch_at(0, 0, &mut Collator::new(pool)).unwrap();
    let want = Values {
        input_ids: vec![5, 6, 7, 8, 9, 10],
        labels: vec![-100, 6, 7, -100, 9, -100],
        position_ids: vec![0, 1, 2, 0, 1, 0],
        cu_seqlens: vec![0, 3, 5, 6],
        seq_idx: vec![0, 0, 0, 1, 1, 2],
        max_seqlen: 3,
    };
    assert_eq!(values(&b), want);
    assert_eq!(b.input_ids.shape(), vec![1, 6]);
    assert_eq!(&b.cu_seqlens_host[..], &[0, 3, 5, 6]);
    assert!(b.padding_mask.is_none());

    let fixed = batcher.clone().fixed_shape(true).pad_id(3).unwrap();
    let b = fixed.batch_at(0, 0, &mut Collator::new(pool)).unwrap();
    let want = Values {
        input_ids: vec![5, 6, 7, 8, 9, 10, 3, 3],
        labels: vec![-100, 6, 7, -100, 9, -100, -100, -100],
        position_ids: vec![0, 1, 2, 0, 1, 0, 0, 0],
        cu_seqlens: vec![0, 3, 5, 6, 6, 6, 6, 6, 6],
        seq_idx: vec![0, 0, 0, 1, 1, 2, -1, -1],
        max_seqlen: 3,
    };
    assert_eq!(values(&b), want);
    let mask = b.padding_mask.as_ref().unwrap().to_vec::<u8>().unwrap();
    assert_eq!(mask, vec![1, 1, 1, 1, 1, 1, 0, 0]);
    assert_eq!(b.real_tokens, 6);
}

/// Random batches of random documents, i64 and i32, equal the flattening collator's
/// definition for the same pieces in the same order.
#[test]
fn random_batches_equal_the_flattening_definition() {
    let _s = serial();
    let mut r = rng("random_batches_equal_the_flattening_definition");
    let docs = random_docs(&mut r, 300, 500);
    let td = token_docs(&docs);
    let p = packed(
        &td,
        Budget::Packed {
            row_tokens: 512,
            rows: 2,
        },
        r.random(),
        64,
    );
    for dtype in [DType::I64, DType::I32] {
        let batcher = p.batcher(dtype).unwrap();
        let epoch = r.random_range(0..4);
        for slot in 0..p.len() {
            let b = batcher
                .batch_at(epoch, slot, &mut Collator::new(PinnedPool::global()))
                .unwrap();
            assert_eq!(b.input_ids.dtype(), dtype);
            assert_eq!(values(&b), flattening_reference(&docs, &b.pieces));
        }
    }
}

/// The fixture `bench/packing_twin.py --write-reference tests/data/packing` writes with Hugging
/// Face's collator itself: documents, the documents of each batch, and the collator's output.
#[test]
fn batches_equal_hugging_faces_collator_output() {
    let _s = serial();
    let test = "batches_equal_hugging_faces_collator_output";
    // Written by bench/packing_twin.py --write-reference on a machine with transformers.
    let Some(dir) = pinnable_harness::fixture_or_skip(test, "tests/data/packing") else {
        return;
    };
    let load = |name: &str| -> Tensor {
        // SAFETY: the fixture is only read.
        let a = unsafe { NpyArray::open_mapped(dir.join(name)) }.unwrap();
        a.tensor().clone()
    };
    let (tokens, lengths, sizes, members) = (
        load("docs.npy"),
        load("lengths.npy"),
        load("batch_sizes.npy"),
        load("batch_docs.npy"),
    );
    let tokens = tokens.to_vec::<u16>().unwrap();
    let mut docs = Vec::new();
    let mut at = 0;
    for len in lengths.to_vec::<i64>().unwrap() {
        docs.push(tokens[at..at + len as usize].to_vec());
        at += len as usize;
    }
    let td = token_docs(&docs);
    let plan = BudgetPlan::options(Budget::Tokens {
        max_tokens: td.tokens(),
        count_padding: false,
    })
    .build(td.lengths().clone())
    .unwrap();
    let batcher = PackedDocs::new(td, plan)
        .unwrap()
        .batcher(DType::I64)
        .unwrap();
    let members = members.to_vec::<i64>().unwrap();
    let mut first = 0;
    let sizes = sizes.to_vec::<i64>().unwrap();
    assert!(!sizes.is_empty());
    for (k, &n) in sizes.iter().enumerate() {
        let pieces: Vec<Piece> = members[first..first + n as usize]
            .iter()
            .map(|&d| Piece {
                sample: d as usize,
                start: 0,
                len: docs[d as usize].len(),
            })
            .collect();
        first += n as usize;
        let b = batcher
            .batch_of(pieces, &mut Collator::new(PinnedPool::global()))
            .unwrap();
        let got = values(&b);
        let want = |f: &str| load(&format!("batch{k}_{f}.npy"));
        assert_eq!(got.input_ids, as_i64(&want("input_ids")), "batch {k}");
        assert_eq!(want("input_ids").shape(), b.input_ids.shape().as_slice());
        assert_eq!(got.labels, as_i64(&want("labels")), "batch {k}");
        assert_eq!(got.position_ids, as_i64(&want("position_ids")), "batch {k}");
        let seq = want("seq_idx");
        assert_eq!(seq.dtype(), DType::I32);
        assert_eq!(got.seq_idx, seq.to_vec::<i32>().unwrap(), "batch {k}");
        let cu = want("cu_seq_lens_q");
        assert_eq!(cu.dtype(), DType::I32);
        assert_eq!(got.cu_seqlens, cu.to_vec::<i32>().unwrap(), "batch {k}");
        let max = want("max_length_q").to_vec::<i64>().unwrap();
        assert_eq!(got.max_seqlen as i64, max[0], "batch {k}");
    }
}

/// Through the loader, for both kinds of budget and random settings: no batch holds more
/// tokens (or, counting padding, more padded tokens) than its budget, nor a piece longer than
/// a row.
#[test]
fn batches_never_exceed_the_budget() {
    let _s = serial();
    let mut r = rng("batches_never_exceed_the_budget");
    let docs = random_docs(&mut r, 400, 300);
    let td = token_docs(&docs);
    for _ in 0..6 {
        let budget = if r.random_bool(0.5) {
            Budget::Tokens {
                max_tokens: r.random_range(300..2000),
                count_padding: r.random_bool(0.5),
            }
        } else {
            Budget::Packed {
                row_tokens: r.random_range(300..1000),
                rows: r.random_range(1..5),
            }
        };
        let p = packed(&td, budget, r.random(), r.random_range(1..200));
        let fixed = r.random_bool(0.3);
        let batcher = p.batcher(DType::I64).unwrap().fixed_shape(fixed);
        let loader = Loader::builder(p.clone())
            .workers(2)
            .build(batcher)
            .unwrap();
        let mut batches = 0;
        for b in &loader {
            let b = b.unwrap();
            batches += 1;
            let lens: Vec<usize> = b.pieces.iter().map(|p| p.len).collect();
            let real: usize = lens.iter().sum();
            assert_eq!(real, b.real_tokens);
            match budget {
                Budget::Tokens {
                    max_tokens,
                    count_padding,
                } => {
                    assert!(real <= max_tokens, "{budget:?}: {real}");
                    if count_padding {
                        let longest = lens.iter().max().unwrap();
                        assert!(longest * lens.len() <= max_tokens, "{budget:?}: {lens:?}");
                    }
                }
                Budget::Packed { row_tokens, rows } => {
                    assert!(real <= row_tokens * rows, "{budget:?}: {real}");
                    assert!(lens.iter().all(|&l| l <= row_tokens));
                }
                other => panic!("a budget this test does not know: {other:?}"),
            }
            let total = b.input_ids.shape()[1];
            if fixed {
                assert_eq!(total, p.plan().max_tokens());
                assert_eq!(b.cu_seqlens_host.len(), p.plan().max_pieces() + 1);
            } else {
                assert_eq!(total, real);
            }
        }
        assert_eq!(batches, loader.len());
    }
}

/// Worlds of 1 to 8 ranks: every rank gets the same number of batches, exactly what the
/// loader says, in every epoch; with `drop_last` off the ranks together see every document of
/// epoch 0.
#[test]
fn every_rank_gets_the_same_number_of_batches() {
    let _s = serial();
    let mut r = rng("every_rank_gets_the_same_number_of_batches");
    let docs = random_docs(&mut r, 200, 400);
    let td = token_docs(&docs);
    let p = packed(
        &td,
        Budget::Tokens {
            max_tokens: 800,
            count_padding: false,
        },
        r.random(),
        32,
    );
    // Epoch 0's plan sets the count; a later epoch's plan may make a few batches more (dropped,
    // their documents wait for the next epoch) or fewer (repeated), so every document is seen
    // in epoch 0 and the counts hold in every epoch.
    for (world, epoch) in (1..=8).flat_map(|w| [(w, 0), (w, r.random_range(1..4))]) {
        for drop_last in [false, true] {
            let mut counts = Vec::new();
            let mut seen = vec![false; docs.len()];
            for rank in 0..world {
                let batcher = p.batcher(DType::I32).unwrap();
                let loader = Loader::builder(p.clone())
                    .shard(rank, world)
                    .drop_last(drop_last)
                    .workers(1)
                    .build(batcher)
                    .unwrap();
                let got: Vec<PackedBatch> = loader
                    .run_epoch(epoch)
                    .collect::<pinnable::Result<_>>()
                    .unwrap();
                assert_eq!(got.len(), loader.len());
                for b in &got {
                    b.pieces.iter().for_each(|p| seen[p.sample] = true);
                }
                counts.push(got.len());
            }
            assert!(
                counts.iter().all(|&c| c == counts[0]),
                "world {world}: {counts:?}"
            );
            let want = if drop_last {
                p.len() / world
            } else {
                p.len().div_ceil(world)
            };
            assert_eq!(counts[0], want);
            if !drop_last && epoch == 0 {
                assert!(
                    seen.iter().all(|&s| s),
                    "world {world}: a document was never seen"
                );
            }
        }
    }
}

/// One, four and eight workers deliver the same batches in the same order.
#[test]
fn order_does_not_depend_on_the_worker_count() {
    let _s = serial();
    let mut r = rng("order_does_not_depend_on_the_worker_count");
    let docs = random_docs(&mut r, 300, 600);
    let td = token_docs(&docs);
    let p = packed(
        &td,
        Budget::Packed {
            row_tokens: 600,
            rows: 2,
        },
        r.random(),
        50,
    );
    let run = |workers: usize| -> Vec<Values> {
        let batcher = p.batcher(DType::I64).unwrap();
        let loader = Loader::builder(p.clone())
            .workers(workers)
            .build(batcher)
            .unwrap();
        loader.set_epoch(2);
        loader.iter().map(|b| values(&b.unwrap())).collect()
    };
    let one = run(1);
    assert_eq!(one.len(), p.len());
    assert_eq!(run(4), one);
    assert_eq!(run(8), one);
}

/// A run stopped after a random number of batches and resumed from its position (with another
/// worker count) delivers what the uninterrupted run delivers next; a position saved under
/// another plan is refused.
#[test]
fn resume_at_a_random_batch_equals_the_uninterrupted_run() {
    let _s = serial();
    let mut r = rng("resume_at_a_random_batch_equals_the_uninterrupted_run");
    let docs = random_docs(&mut r, 250, 400);
    let td = token_docs(&docs);
    let seed = r.random();
    let budget = Budget::Packed {
        row_tokens: 400,
        rows: 2,
    };
    let p = packed(&td, budget, seed, 40);
    let (rank, world) = (r.random_range(0..3), 3);
    let loader_of = |p: &PackedDocs, workers: usize, at: Option<Position>| {
        let batcher = p.batcher(DType::I64).unwrap();
        let mut b = Loader::builder(p.clone())
            .shard(rank, world)
            .workers(workers);
        if let Some(at) = at {
            b = b.resume(at);
        }
        b.build(batcher)
    };
    let epoch = r.random_range(0..4);
    let all: Vec<Values> = loader_of(&p, 2, None)
        .unwrap()
        .run_epoch(epoch)
        .map(|b| values(&b.unwrap()))
        .collect();
    let k = r.random_range(1..all.len());
    let first = loader_of(&p, 3, None).unwrap();
    first.set_epoch(epoch);
    let mut e = first.iter();
    for _ in 0..k {
        e.next().unwrap().unwrap();
    }
    let at = first.position();
    drop(e);
    let bytes = at.to_bytes();
    let resumed = loader_of(&p, 1, Some(Position::from_bytes(&bytes).unwrap())).unwrap();
    let rest: Vec<Values> = resumed.iter().map(|b| values(&b.unwrap())).collect();
    assert_eq!(rest, all[k..]);

    let other = packed(&td, budget, seed.wrapping_add(1), 40);
    let err = loader_of(&other, 1, Some(at)).unwrap_err();
    assert!(matches!(err, Error::Resume { .. }), "{err}");
    assert!(err.to_string().contains("packing plan"), "{err}");
}

/// A document longer than a batch's longest piece is an error naming it; with splitting asked,
/// its pieces (each its own sequence) cover it exactly once.
#[test]
fn over_budget_document_is_an_error_naming_it_or_is_split() {
    let _s = serial();
    let mut r = rng("over_budget_document_is_an_error_naming_it_or_is_split");
    let mut docs = random_docs(&mut r, 50, 100);
    let long = r.random_range(0..docs.len());
    docs[long] = (0..r.random_range(300..1000)).map(|i| i as u16).collect();
    let td = token_docs(&docs);
    let budget = Budget::Packed {
        row_tokens: 128,
        rows: 2,
    };
    let err = BudgetPlan::options(budget)
        .build(td.lengths().clone())
        .unwrap_err();
    assert!(
        matches!(err, Error::Sample { index, .. } if index == long),
        "{err}"
    );
    assert!(
        err.to_string().contains(&format!("sample {long} has")),
        "{err}"
    );
    assert!(err.to_string().contains("split_long"), "{err}");

    let plan = BudgetPlan::options(budget)
        .split_long(true)
        .shuffle(r.random())
        .build(td.lengths().clone())
        .unwrap();
    let p = PackedDocs::new(td, plan).unwrap();
    let batcher = p.batcher(DType::I64).unwrap();
    let mut pieces: Vec<Piece> = Vec::new();
    for slot in 0..p.len() {
        let b = batcher
            .batch_at(0, slot, &mut Collator::new(PinnedPool::global()))
            .unwrap();
        assert_eq!(values(&b), flattening_reference(&docs, &b.pieces));
        pieces.extend(b.pieces.iter().filter(|p| p.sample == long));
    }
    pieces.sort_by_key(|p| p.start);
    pieces.dedup(); // a short epoch repeats its first batches
    assert!(pieces.len() >= 3);
    let mut at = 0;
    for q in &pieces {
        assert_eq!(q.start, at);
        assert!(q.len <= 128);
        at += q.len;
    }
    assert_eq!(at, docs[long].len());
}

/// Shards split at a separator: the documents are what splitting the tokens by hand gives,
/// for each way of keeping the separator, across shard ends.
#[test]
fn shards_split_at_the_separator() {
    let _s = serial();
    let mut r = rng("shards_split_at_the_separator");
    let dir = TempDir::new("packing-split");
    let sep = 7u32;
    let shards: Vec<Vec<u32>> = (0..3)
        .map(|_| {
            (0..r.random_range(1..400))
                .map(|_| {
                    if r.random_bool(0.05) {
                        sep
                    } else {
                        r.random_range(0..300)
                    }
                })
                .collect()
        })
        .collect();
    let paths: Vec<PathBuf> = shards
        .iter()
        .enumerate()
        .map(|(i, t)| write(dir.path(), &format!("{i}.bin"), &token_bytes(t, DType::U16)))
        .collect();
    for keep in [Separator::Drop, Separator::End, Separator::Start] {
        let mut want: Vec<Vec<u32>> = Vec::new();
        for t in &shards {
            let mut cur = Vec::new();
            for &x in t {
                match (x == sep, keep) {
                    (false, _) => cur.push(x),
                    (true, Separator::Drop) => want.push(std::mem::take(&mut cur)),
                    (true, Separator::End) => {
                        cur.push(x);
                        want.push(std::mem::take(&mut cur));
                    }
                    (true, Separator::Start) => {
                        want.push(std::mem::take(&mut cur));
                        cur.push(x);
                    }
                    (true, other) => panic!("a separator rule this test does not know: {other:?}"),
                }
            }
            want.push(cur);
        }
        want.retain(|d| !d.is_empty());
        let docs = TokenDocs::split(TokenShards::open(&paths).unwrap(), sep, keep).unwrap();
        assert_eq!(docs.len(), want.len(), "{keep:?}");
        for (i, w) in want.iter().enumerate() {
            let got: Vec<u32> = docs
                .get(i)
                .unwrap()
                .to_vec::<u16>()
                .unwrap()
                .into_iter()
                .map(u32::from)
                .collect();
            assert_eq!(&got, w, "{keep:?} document {i}");
            assert_eq!(docs.lengths()[i] as usize, w.len());
        }
        if matches!(keep, Separator::End) {
            // The shorthands: documents ending at the separator, packed from their own lengths.
            let documents = TokenShards::open(&paths).unwrap().documents(sep).unwrap();
            assert_eq!(documents.lengths(), docs.lengths());
            let budget = Budget::Packed {
                row_tokens: 512,
                rows: r.random_range(1..4),
            };
            let seed = r.random();
            let packed = PackedDocs::pack(documents, budget, seed).unwrap();
            let plan = BudgetPlan::options(budget)
                .shuffle(seed)
                .build(docs.lengths().clone())
                .unwrap();
            assert_eq!(packed.plan().digest(), plan.digest());
            assert_eq!(packed.plan().batches(1), plan.batches(1));
        }
    }
}

/// On a GPU: 200 random packed batches (u16 and u32 documents, i64 and i32, fixed shape or
/// not) moved to the device equal the host path's.
#[test]
fn device_batches_equal_the_host_path() {
    let Some(device) = cuda_or_skip("device_batches_equal_the_host_path") else {
        return;
    };
    let _s = serial();
    let mut r = rng("device_batches_equal_the_host_path");
    let mut done = 0;
    while done < 200 {
        let wide = r.random_bool(0.3);
        let (n, max) = (r.random_range(20..200), r.random_range(10..2000));
        let docs = random_docs(&mut r, n, max);
        let td = if wide {
            let tensors: Vec<Tensor> = docs
                .iter()
                .map(|d| {
                    Tensor::from_vec1(d.iter().map(|&t| u32::from(t) * 3).collect::<Vec<u32>>())
                })
                .collect();
            TokenDocs::from_dataset(tensors).unwrap()
        } else {
            token_docs(&docs)
        };
        let budget = Budget::Packed {
            row_tokens: r.random_range(2000..9000),
            rows: r.random_range(1..9),
        };
        let plan = BudgetPlan::options(budget)
            .split_long(true)
            .shuffle(r.random())
            .build(td.lengths().clone())
            .unwrap();
        let p = PackedDocs::new(td, plan).unwrap();
        let dtype = if wide || r.random_bool(0.5) {
            DType::I64
        } else {
            DType::I32
        };
        let fixed = r.random_bool(0.3);
        let host = p.batcher(dtype).unwrap().fixed_shape(fixed);
        let on_gpu = p
            .batcher(dtype)
            .unwrap()
            .fixed_shape(fixed)
            .device_built(false);
        let epoch = r.random_range(0..3);
        for slot in 0..p.len().min(200 - done) {
            let pool = PinnedPool::global();
            let a = host
                .batch_at(epoch, slot, &mut Collator::new(pool))
                .unwrap();
            let b = on_gpu
                .batch_at(epoch, slot, &mut Collator::new(pool).with_device(&device))
                .unwrap();
            assert!(b.input_ids.is_pending());
            let b = b.to_device(&device, r.random_bool(0.5)).unwrap();
            assert_eq!(b.input_ids.dtype(), dtype);
            assert_eq!(values(&a), values(&b), "slot {slot}");
            done += 1;
        }
    }
}

/// Documents that are not 1-D u16/u32 token tensors are errors naming them and saying what to
/// do; a plan made from other lengths is refused.
#[test]
fn bad_documents_are_errors_naming_them() {
    let _s = serial();
    let mut r = rng("bad_documents_are_errors_naming_them");
    let docs = random_docs(&mut r, 20, 50);
    let bad = r.random_range(1..docs.len());
    let mut tensors: Vec<Tensor> = docs.iter().map(|d| Tensor::from_vec1(d.clone())).collect();
    tensors[bad] = Tensor::from_vec(vec![1u16; 6], &[2, 3]).unwrap();
    let err = TokenDocs::from_dataset(tensors.clone()).unwrap_err();
    assert!(
        matches!(err, Error::Sample { index, .. } if index == bad),
        "{err}"
    );
    assert!(err.to_string().contains("1-D"), "{err}");
    tensors[bad] = Tensor::from_vec1(vec![1i64, 2, 3]);
    let err = TokenDocs::from_dataset(tensors).unwrap_err();
    assert!(
        matches!(err, Error::Sample { index, .. } if index == bad),
        "{err}"
    );
    assert!(err.to_string().contains("convert them"), "{err}");

    let td = token_docs(&docs);
    let other: Vec<u32> = td.lengths().iter().map(|&l| l + 1).collect();
    let plan = BudgetPlan::options(Budget::Tokens {
        max_tokens: 100,
        count_padding: false,
    })
    .build(other)
    .unwrap();
    let err = PackedDocs::new(td, plan).unwrap_err();
    assert!(err.to_string().contains("TokenDocs::lengths"), "{err}");
}
