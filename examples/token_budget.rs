//! Batches under a token budget (`BudgetPlan`, `Budget::Tokens`), fairseq's `batch_by_size`:
//! documents of very different lengths are planned into batches of whole documents holding
//! at most 4096 tokens — counting the padding to each batch's longest document, as a padded
//! `[B, T]` batch holds them, or not — so short documents come many to a batch and long ones
//! few. The plan is made from the lengths alone, the same on every rank, and deals every rank
//! the same number of batches. The loader delivers each planned batch (its documents one after
//! another, with `cu_seqlens`) to the GPU when there is one, where it must equal the host's
//! (else the GPU part prints `skipped:`).
//!
//!     cargo run --example token_budget
//!
//! With `PINNABLE_REQUIRE_GPU=1` a missing GPU is a failure.

use pinnable::formats::tokens::{PackedDocs, TokenDocs};
use pinnable::loader::{Budget, BudgetPlan, Loader};
use pinnable::{DType, Device, Tensor, ToDevice};
use rand::Rng;

const MAX_TOKENS: usize = 4096;

/// Every batch of an epoch delivered to `device`, as (tokens, cu_seqlens) read back.
fn epoch(packed: &PackedDocs, device: &Device) -> pinnable::Result<Vec<(Vec<i64>, Vec<i32>)>> {
    let loader = Loader::builder(packed.clone())
        .workers(2)
        .device(device.clone())
        .build(packed.batcher(DType::I64)?)?;
    assert_eq!(loader.len(), packed.plan().len());
    let mut out = Vec::new();
    for b in &loader {
        let b = b?;
        let ids = b.input_ids.tensor()?;
        assert_eq!(ids.device(), *device);
        let cu = b.cu_seqlens.to_cpu(false)?.to_vec::<i32>()?;
        // Whole documents, within the budget counting the padding to the longest.
        let lens: Vec<usize> = cu.windows(2).map(|w| (w[1] - w[0]) as usize).collect();
        assert!(
            lens.iter().max().unwrap_or(&0) * lens.len() <= MAX_TOKENS,
            "{lens:?}"
        );
        assert!(b.pieces.iter().all(|p| p.start == 0));
        out.push((ids.to_cpu(false)?.to_vec::<i64>()?, cu));
    }
    Ok(out)
}

fn main() -> pinnable::Result<()> {
    let mut r = pinnable_harness::rng("token_budget");
    let docs: Vec<Tensor> = (0..r.random_range(500..800))
        .map(|_| {
            let len = if r.random_bool(0.05) {
                r.random_range(1000..4000)
            } else {
                r.random_range(8..300)
            };
            Tensor::from_vec1(
                (0..len)
                    .map(|_| r.random_range(0..50257u16))
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    let docs = TokenDocs::from_dataset(docs)?;
    let seed = r.random();
    let mut plans = Vec::new();
    for count_padding in [true, false] {
        let plan = BudgetPlan::options(Budget::Tokens {
            max_tokens: MAX_TOKENS,
            count_padding,
        })
        .sort_window(256) // sort 256 documents at a time by length: less padding
        .shuffle(seed)
        .build(docs.lengths().clone())?;
        let batches = plan.batches(0);
        let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
        let padded: usize = batches
            .iter()
            .map(|b| b.len() * b.iter().map(|p| p.len).max().unwrap_or(0))
            .sum();
        println!(
            "count_padding {count_padding:5}: {} batches of 1 to {} documents; padded to each \
             batch's longest, {:.1}% of the tokens would be real",
            plan.len(),
            sizes.iter().max().unwrap_or(&0),
            100.0 * docs.tokens() as f64 / padded as f64
        );
        // Epoch 0 holds every document once.
        let mut seen: Vec<usize> = batches.iter().flatten().map(|p| p.sample).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..docs.len()).collect::<Vec<_>>());
        // Four ranks, the same number of batches each, in every epoch.
        for e in 0..3 {
            let counts: Vec<usize> = (0..4)
                .map(|k| plan.rank_batches(e, k, 4, false).len())
                .collect();
            assert!(counts.iter().all(|&c| c == counts[0]), "{counts:?}");
        }
        plans.push(plan);
    }

    // The padded plan through the loader, on the host.
    let packed = PackedDocs::new(docs, plans.remove(0))?;
    let host = epoch(&packed, &Device::cpu())?;
    let tokens: usize = host.iter().map(|(ids, _)| ids.len()).sum();
    println!(
        "loaded on the host: {} batches, {tokens} tokens, every one within the budget",
        host.len()
    );

    let Some(device) = pinnable_harness::cuda_or_skip("token_budget: batches on the GPU") else {
        return Ok(());
    };
    assert_eq!(epoch(&packed, &device)?, host);
    println!("loaded on {device}: the same {} batches", host.len());
    Ok(())
}
