//! Fine-tuning's input side: documents of very different lengths, packed for varlen attention.
//! A token shard of long-tailed documents, each ended by GPT-2's `<|endoftext|>` (50256) as
//! nanoGPT's `prepare.py` writes them, is split into documents (one pass, lengths kept in
//! memory), packed by best fit into rows of `--row` tokens, `--rows` rows a batch, and streamed
//! to the GPU when there is one, as one rank of `--world`. Each step checks what a varlen
//! attention kernel relies on — `cu_seqlens` from 0 to the batch's tokens, positions restarting
//! in every document, no label across a boundary — and the run prints the real-token fraction
//! and the batches every rank gets (the same number on each).
//!
//!     cargo run --release --example packed_docs
//!     cargo run --release --example packed_docs -- --row 4096 --rows 16 --world 4 --fixed
//!
//! Options: `--row N`, `--rows N`, `--docs N`, `--world N`, `--workers N`, `--fixed` (every
//! batch padded to the same shapes), `--cpu` (stay on the host even with a GPU).

use std::io::Write;

use pinnable::formats::tokens::{IGNORE_INDEX, PackedDocs, Separator, TokenDocs, TokenShards};
use pinnable::loader::{Budget, BudgetPlan, Loader, SplitMix64};
use pinnable::{DType, Device, ToDevice};

const EOT: u16 = 50256;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(default)
}

fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

fn main() -> pinnable::Result<()> {
    let (row, rows, n_docs) = (arg("--row", 2048), arg("--rows", 8), arg("--docs", 5000));
    let (world, workers) = (arg("--world", 2).max(1), arg("--workers", 4).max(1));
    let device = if flag("--cpu") {
        Device::cpu()
    } else {
        Device::cuda(0).unwrap_or_else(|_| Device::cpu())
    };

    // A shard of documents with Pareto lengths (most short, a few up to a row), as u16 tokens.
    let mut r = SplitMix64::new(29);
    let mut bytes = Vec::new();
    for _ in 0..n_docs {
        let u = (r.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let len = ((40.0 / (1.0 - u).powf(1.0 / 1.2)) as usize).clamp(2, row);
        for _ in 0..len - 1 {
            bytes.extend_from_slice(&((r.next_u64() % 50256) as u16).to_le_bytes());
        }
        bytes.extend_from_slice(&EOT.to_le_bytes());
    }
    let path = std::env::temp_dir().join(format!("packed-docs-{}.bin", std::process::id()));
    std::fs::File::create(&path)?.write_all(&bytes)?;

    let docs = TokenDocs::split(TokenShards::open([&path])?, EOT.into(), Separator::End)?;
    let plan = BudgetPlan::options(Budget::Packed {
        row_tokens: row,
        rows,
    })
    .sort_window(1024)
    .shuffle(7)
    .build(docs.lengths().clone())?;
    let real: usize = plan.batches(0).iter().flatten().map(|p| p.len).sum();
    println!(
        "{} documents, {} tokens: {} batches of {rows}×{row} an epoch, {:.2}% real tokens",
        docs.len(),
        docs.tokens(),
        plan.len(),
        100.0 * real as f64 / (plan.len() * plan.max_tokens()) as f64
    );
    let packed = PackedDocs::new(docs, plan)?;

    let mut per_rank = Vec::new();
    for rank in 0..world {
        let batcher = packed.batcher(DType::I64)?.fixed_shape(flag("--fixed"));
        let loader = Loader::builder(packed.clone())
            .shard(rank, world)
            .workers(workers)
            .device(device.clone())
            .build(batcher)?;
        let mut steps = 0;
        for batch in &loader {
            let b = batch?;
            let cu = &b.cu_seqlens_host;
            assert_eq!(cu[0], 0);
            assert_eq!(*cu.last().unwrap() as usize, b.real_tokens);
            let positions = b.position_ids.to_cpu(false)?.to_vec::<i64>()?;
            let labels = b.labels.to_cpu(false)?.to_vec::<i64>()?;
            for w in cu.windows(2).filter(|w| w[1] > w[0]) {
                let (start, end) = (w[0] as usize, w[1] as usize);
                assert_eq!(positions[start], 0);
                assert_eq!(positions[end - 1] as usize, end - 1 - start);
                assert_eq!(labels[start], IGNORE_INDEX);
                assert!(end - start <= b.max_seqlen);
            }
            steps += 1;
        }
        println!("rank {rank} of {world}: {steps} batches on {device:?}");
        per_rank.push(steps);
    }
    assert!(per_rank.iter().all(|&s| s == per_rank[0]));
    std::fs::remove_file(&path)?;
    Ok(())
}
