//! The loader tests' samples: an image, a variable-length token run, a mask and a label, and
//! the batcher that collates them into one pinned block.

use pinnable::loader::Collator;
use pinnable::{DType, Tensor};
use rand::Rng;

/// One sample: every kind of collation the loader offers is needed to batch it.
#[derive(Clone)]
pub struct Sample {
    /// f32 `[3, h, w]`, stacked.
    pub image: Tensor,
    /// i64 of a random length, padded.
    pub tokens: Tensor,
    /// bool `[w]`, stacked.
    pub mask: Tensor,
    /// The sample's index, stacked as a scalar.
    pub label: i64,
}

/// `n` random samples with `[3, h, w]` images and up to `max_tokens - 1` tokens; sample `i` is
/// labelled `i`.
pub fn random_samples(
    r: &mut impl Rng,
    n: usize,
    (h, w): (usize, usize),
    max_tokens: usize,
) -> Vec<Sample> {
    (0..n)
        .map(|i| {
            let len = r.random_range(0..max_tokens);
            Sample {
                image: crate::random_tensor(r, DType::F32, &[3, h, w]),
                tokens: crate::random_tensor(r, DType::I64, &[len]),
                mask: crate::random_tensor(r, DType::Bool, &[w]),
                label: i as i64,
            }
        })
        .collect()
}

/// Collates samples into images, padded tokens (with -1), their lengths, masks and labels.
///
/// # Errors
///
/// Whatever the collator returns.
pub fn collate(samples: Vec<Sample>, c: &mut Collator) -> pinnable::Result<Vec<Tensor>> {
    let images = c.stack("images", samples.iter().map(|s| &s.image))?;
    let (tokens, lengths) = c.pad("tokens", samples.iter().map(|s| &s.tokens), -1i64)?;
    let masks = c.stack("masks", samples.iter().map(|s| &s.mask))?;
    let labels = c.stack_scalars("labels", samples.iter().map(|s| s.label))?;
    let mut out = c.finish()?;
    [images, tokens, lengths, masks, labels]
        .into_iter()
        .map(|s| out.take(s))
        .collect()
}
