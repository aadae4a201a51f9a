//! Packed batches for varlen attention built on the GPU (`PackedBatcher::on_device`): the
//! loader's workers stage only the documents' u16 tokens and `cu_seqlens` in pinned memory
//! (2 bytes a token cross the link), and the crate's packing kernel writes `input_ids`,
//! `labels`, `position_ids` and `seq_idx` on the device. The host-built epoch is checked
//! against the definition (each document's tokens in order, positions restarting at 0, the
//! first label of every document -100); the device-built epoch must equal it field for field.
//! Without a GPU the device part prints `skipped:`.
//!
//!     cargo run --example packed_on_device
//!
//! With `PINNABLE_REQUIRE_GPU=1` a missing GPU is a failure.

use pinnable::formats::tokens::{IGNORE_INDEX, PackedBatch, PackedBatcher, PackedDocs, TokenDocs};
use pinnable::loader::{Budget, BudgetPlan, Loader};
use pinnable::{DType, Device, Tensor, ToDevice};
use rand::Rng;

/// A batch's fields on the host, as i64: input_ids, labels, position_ids, cu_seqlens, seq_idx.
fn fields(b: &PackedBatch) -> pinnable::Result<Vec<Vec<i64>>> {
    let ids = b.input_ids.tensor()?;
    let seq_idx = b.seq_idx.as_ref().expect("seq_idx is on by default");
    let mut out = Vec::new();
    for t in [&ids, &b.labels, &b.position_ids] {
        out.push(t.to_cpu(false)?.to_vec::<i64>()?);
    }
    for t in [&b.cu_seqlens, seq_idx] {
        out.push(
            t.to_cpu(false)?
                .to_vec::<i32>()?
                .into_iter()
                .map(i64::from)
                .collect(),
        );
    }
    Ok(out)
}

/// One epoch of `batcher`'s batches, delivered to `device`, as fields on the host.
fn epoch(
    packed: &PackedDocs,
    batcher: PackedBatcher,
    device: &Device,
) -> pinnable::Result<Vec<Vec<Vec<i64>>>> {
    let loader = Loader::builder(packed.clone())
        .workers(2)
        .device(device.clone())
        .build(batcher)?;
    loader
        .iter()
        .map(|b| {
            let b = b?;
            assert_eq!(b.labels.device(), *device);
            fields(&b)
        })
        .collect()
}

fn main() -> pinnable::Result<()> {
    let mut r = pinnable_harness::rng("packed_on_device");
    // Long-tailed documents: most short, one in ten up to 2000 tokens.
    let docs: Vec<Vec<u16>> = (0..r.random_range(300..400))
        .map(|_| {
            let len = if r.random_bool(0.1) {
                r.random_range(500..2000)
            } else {
                r.random_range(1..200)
            };
            (0..len).map(|_| r.random_range(0..50257u16)).collect()
        })
        .collect();
    let td = TokenDocs::from_dataset(
        docs.iter()
            .map(|d| Tensor::from_vec1(d.clone()))
            .collect::<Vec<_>>(),
    )?;
    let plan = BudgetPlan::options(Budget::Packed {
        row_tokens: 2048,
        rows: 4,
    })
    .shuffle(r.random())
    .build(td.lengths().clone())?;
    let packed = PackedDocs::new(td, plan)?;
    let host = packed.batcher(DType::I64)?;

    // Built on the host, checked against the definition.
    let loader = Loader::builder(packed.clone())
        .workers(2)
        .build(host.clone())?;
    let mut want = Vec::new();
    for b in &loader {
        let b = b?;
        let f = fields(&b)?;
        let (mut ids, mut labels, mut positions) = (Vec::new(), Vec::new(), Vec::new());
        for p in b.pieces.iter() {
            let tokens = &docs[p.sample][p.start..p.start + p.len];
            ids.extend(tokens.iter().map(|&t| i64::from(t)));
            labels.push(IGNORE_INDEX);
            labels.extend(tokens[1..].iter().map(|&t| i64::from(t)));
            positions.extend(0..p.len as i64);
        }
        assert_eq!([&f[0], &f[1], &f[2]], [&ids, &labels, &positions]);
        want.push(f);
    }
    let tokens: usize = want.iter().map(|f| f[0].len()).sum();
    println!(
        "{} documents packed into {} batches of at most 4×2048 tokens ({tokens} tokens), \
         built on the host: equal to the definition",
        docs.len(),
        want.len()
    );

    // Built on the GPU: the same epoch, field for field.
    let Some(device) = pinnable_harness::cuda_or_skip("packed_on_device: batches built on the GPU")
    else {
        return Ok(());
    };
    let got = epoch(&packed, host.clone().device_built(true), &device)?;
    assert_eq!(got, want);
    println!(
        "built on {device}: the same {} batches, field for field; {:.2} MB crossed the link \
         (u16 tokens) where the host-built batches move {:.2} MB (u16 tokens, i64 labels and \
         positions, i32 seq_idx)",
        got.len(),
        (2 * tokens) as f64 / 1e6,
        (22 * tokens) as f64 / 1e6
    );
    Ok(())
}
