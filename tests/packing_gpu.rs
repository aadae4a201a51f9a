//! Packed batches built on the GPU (`PackedBatcher::on_device`): equal to the host path field
//! by field, on random documents and plans, directly and through the loader; nothing left
//! reserved in the pinned pool. Each test skips with `skipped: <reason>` without a GPU and
//! fails under `PINNABLE_REQUIRE_GPU=1`.

use pinnable::formats::tokens::{PackedBatch, PackedDocs, TokenDocs};
use pinnable::loader::{Budget, BudgetPlan, Collator, Dataset, Loader};
use pinnable::{DType, Device, PinnedPool, PoolConfig, Tensor, ToDevice};
use pinnable_harness::{assert_drained, cuda_or_skip, rng};
use rand::Rng;
use rand::rngs::SmallRng;

/// Every field of a batch on the host, integers widened to i64.
#[derive(Debug, PartialEq)]
struct Fields {
    dtype: DType,
    shapes: Vec<Vec<usize>>,
    input_ids: Vec<i64>,
    labels: Vec<i64>,
    position_ids: Vec<i64>,
    cu_seqlens: Vec<i32>,
    cu_seqlens_host: Vec<i32>,
    max_seqlen: usize,
    seq_idx: Option<Vec<i32>>,
    padding_mask: Option<Vec<u8>>,
    real_tokens: usize,
}

fn ints(t: &Tensor) -> Vec<i64> {
    let t = t.to_cpu(false).unwrap();
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

fn fields(b: &PackedBatch, on: &Device) -> Fields {
    let ids = b.input_ids.tensor().unwrap();
    for t in [&ids, &b.labels, &b.position_ids, &b.cu_seqlens] {
        assert_eq!(t.device().ordinal(), on.ordinal(), "a field is not on {on}");
    }
    Fields {
        dtype: ids.dtype(),
        shapes: [&ids, &b.labels, &b.position_ids, &b.cu_seqlens]
            .iter()
            .map(|t| t.shape().to_vec())
            .chain(b.seq_idx.iter().map(|t| t.shape().to_vec()))
            .chain(b.padding_mask.iter().map(|t| t.shape().to_vec()))
            .collect(),
        input_ids: ints(&ids),
        labels: ints(&b.labels),
        position_ids: ints(&b.position_ids),
        cu_seqlens: b.cu_seqlens.to_cpu(false).unwrap().to_vec().unwrap(),
        cu_seqlens_host: b.cu_seqlens_host.to_vec(),
        max_seqlen: b.max_seqlen,
        seq_idx: b
            .seq_idx
            .as_ref()
            .map(|t| t.to_cpu(false).unwrap().to_vec().unwrap()),
        padding_mask: b
            .padding_mask
            .as_ref()
            .map(|t| t.to_cpu(false).unwrap().to_vec().unwrap()),
        real_tokens: b.real_tokens,
    }
}

/// Random long-tailed documents of u16 or (`wide`) u32 tokens, packed by a random plan.
fn random_packed(r: &mut SmallRng, wide: bool) -> PackedDocs {
    let n = r.random_range(20..200);
    let docs: Vec<Tensor> = (0..n)
        .map(|_| {
            let len = if r.random_bool(0.1) {
                r.random_range(1000..6000)
            } else {
                r.random_range(1..400)
            };
            if wide {
                let v: Vec<u32> = (0..len).map(|_| r.random_range(0..1u32 << 31)).collect();
                Tensor::from_vec1(v)
            } else {
                Tensor::from_vec1((0..len).map(|_| r.random::<u16>()).collect::<Vec<_>>())
            }
        })
        .collect();
    let docs = TokenDocs::from_dataset(docs).unwrap();
    let budget = Budget::Packed {
        row_tokens: r.random_range(2000..9000),
        rows: r.random_range(1..9),
    };
    let plan = BudgetPlan::options(budget)
        .split_long(true)
        .shuffle(r.random())
        .build(docs.lengths().clone())
        .unwrap();
    PackedDocs::new(docs, plan).unwrap()
}

/// At least 200 random packed batches built on the device (u16 and u32 tokens, i64 and i32,
/// each of the four modes of fixed shape or not, with and without `seq_idx`, random pad ids)
/// equal the host path's field by field, shapes and dtypes included, every tensor on the
/// device; then every pinned block the workers staged goes back to the pool.
#[test]
fn device_built_batches_equal_the_host_path() {
    let test = "device_built_batches_equal_the_host_path";
    let Some(device) = cuda_or_skip(test) else {
        return;
    };
    let mut r = rng(test);
    let pool = PinnedPool::new(PoolConfig::default());
    let mut done = 0;
    let (mut modes, mut datasets) = ([[0usize; 2]; 2], 0);
    while done < 200 || modes.iter().flatten().any(|&n| n == 0) {
        // i32 batches of u32 tokens need a vocabulary check, which datasets do not carry.
        let wide = r.random_bool(0.3);
        let p = random_packed(&mut r, wide);
        let dtype = if !wide && r.random_bool(0.5) {
            DType::I32
        } else {
            DType::I64
        };
        // Each mode in turn, so that every one is tested whatever the draws.
        let (fixed, seq) = (datasets % 2 == 1, datasets / 2 % 2 == 1);
        datasets += 1;
        let pad = if wide {
            r.random_range(0..1u32 << 31)
        } else {
            u32::from(r.random::<u16>())
        };
        let host = p.batcher(dtype).unwrap();
        let host = host.fixed_shape(fixed).seq_idx(seq).pad_id(pad).unwrap();
        // The same batcher: a batch for a CUDA device is built there.
        let on = host.clone();
        let epoch = r.random_range(0..3);
        // At most 50 slots of a dataset: four datasets at least, one in each mode.
        for slot in 0..p.len().min(50) {
            let a = host
                .batch_at(epoch, slot, &mut Collator::new(&pool))
                .unwrap();
            let mut c = Collator::new(&pool).with_device(&device);
            let b = on.batch_at(epoch, slot, &mut c).unwrap();
            assert!(!b.input_ids.is_pending(), "built, not waiting for a move");
            let (a, b) = (fields(&a, &Device::cpu()), fields(&b, &device));
            assert_eq!(b.dtype, dtype);
            assert_eq!(a, b, "slot {slot} of epoch {epoch}");
            done += 1;
            modes[usize::from(fixed)][usize::from(seq)] += 1;
        }
    }
    assert!(
        modes.iter().flatten().all(|&n| n > 0),
        "slots of each (fixed shape, seq_idx) mode: {modes:?}"
    );
    device.synchronize().unwrap();
    pool.empty_cache();
    assert_drained(&pool);
}

/// Through the loader (4 workers, each on its own stream), a device-built epoch equals the
/// host path's, batch for batch.
#[test]
fn device_built_batches_through_the_loader() {
    let test = "device_built_batches_through_the_loader";
    let Some(device) = cuda_or_skip(test) else {
        return;
    };
    let mut r = rng(test);
    let p = random_packed(&mut r, false);
    let host = p.batcher(DType::I64).unwrap();
    let host = host.fixed_shape(true);
    let on = host.clone();
    let run = |batcher, to: &Device| -> Vec<Fields> {
        let loader = Loader::builder(p.clone())
            .workers(4)
            .device(to.clone())
            .build(batcher)
            .unwrap();
        loader
            .iter()
            .map(|b| fields(&b.unwrap(), to))
            .collect::<Vec<_>>()
    };
    let want = run(host, &Device::cpu());
    let got = run(on, &device);
    assert_eq!(want.len(), p.len());
    assert_eq!(got, want);
}

/// On a GPU: a host-built batch's `input_ids` (compact tokens in the batch's pinned block,
/// widened by the gather on the way) arrive equal to the tokens whether moved alone or with the
/// rest of the batch, by every gather route.
///
/// A move whose first launch (the mirrors' copies, after the reservation) ran SM work skipped
/// a later launch of as many SM jobs, so the widened tokens were never written when they moved
/// with the batch; this test found it.
#[test]
fn staged_input_ids_arrive_whole_alone_with_the_batch_and_by_every_route() {
    use pinnable::GatherRoute;
    let Some(device) = cuda_or_skip("staged_input_ids_arrive_whole") else {
        return;
    };
    let mut r = rng("staged_input_ids_arrive_whole");
    let docs: Vec<Vec<u16>> = (0..60)
        .map(|_| {
            let n = r.random_range(1..700);
            (0..n).map(|_| r.random_range(1..50000)).collect()
        })
        .collect();
    let tensors: Vec<Tensor> = docs.iter().map(|d| Tensor::from_vec1(d.clone())).collect();
    let td = TokenDocs::from_dataset(tensors).unwrap();
    let plan = BudgetPlan::options(Budget::Packed {
        row_tokens: 4096,
        rows: 2,
    })
    .build(td.lengths().clone())
    .unwrap();
    let p = PackedDocs::new(td, plan).unwrap();
    let mut failures = Vec::new();
    for dtype in [DType::I64, DType::I32] {
        let on_gpu = p.batcher(dtype).unwrap().device_built(false);
        let pool = PinnedPool::global();
        let mut c = Collator::new(pool).with_device(&device);
        let b = on_gpu.batch_at(0, 0, &mut c).unwrap();
        let want = ints(&b.input_ids.tensor().unwrap());
        assert!(
            want.iter().any(|&t| t != 0),
            "the staged tokens are all zero"
        );
        for route in [
            GatherRoute::Auto,
            GatherRoute::Kernel,
            GatherRoute::Direct,
            GatherRoute::Host,
        ] {
            let ids = b.input_ids.clone().route(route);
            let alone = ints(&ids.to_device(&device, false).unwrap().tensor().unwrap());
            let mut whole = b.clone();
            whole.input_ids = ids;
            let moved = whole.to_device(&device, false).unwrap();
            let with_batch = ints(&moved.input_ids.tensor().unwrap());
            for (how, got) in [("alone", alone), ("with the batch", with_batch)] {
                let bad = got.iter().zip(&want).position(|(g, w)| g != w);
                println!(
                    "{dtype} {route:?} {how}: {}",
                    match bad {
                        None => "equal".to_string(),
                        Some(i) => format!("differs from element {i}: {} for {}", got[i], want[i]),
                    }
                );
                if bad.is_some() || got.len() != want.len() {
                    failures.push(format!("{dtype} {route:?} {how}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}
