//! Turning a list of samples into a batch: the [`Batcher`] trait (implemented for closures) and
//! [`Stack`], the batcher for samples that are a tensor or a tensor and a label.

use super::collate::Collator;
use crate::dtype::Element;
use crate::error::Result;
use crate::tensor::Tensor;

/// Makes one batch from its samples, in batch order, writing its tensors through the
/// [`Collator`] into one pinned block — like burn's `Batcher`, with the pinned block in place
/// of burn's device.
///
/// Called on the loader's worker threads, several batches at once, hence `Send + Sync`.
/// Implemented for every closure `Fn(Vec<S>, &mut Collator) -> Result<B>`.
///
/// # Errors
///
/// Whatever the collator's building blocks return (a sample of the wrong shape, named by its
/// index); the batcher's own errors. The loader delivers the error in place of the batch.
///
/// # Examples
///
/// ```
/// use pinnable::loader::{Batcher, Collator};
/// use pinnable::{PinnedPool, PoolConfig, Tensor, ToDevice};
///
/// struct Sample { image: Tensor, label: i64 }
///
/// #[derive(ToDevice)]
/// struct Batch { images: Tensor, labels: Tensor }
///
/// struct ImageBatcher;
///
/// impl Batcher<Sample> for ImageBatcher {
///     type Batch = Batch;
///
///     fn batch(&self, samples: Vec<Sample>, c: &mut Collator) -> pinnable::Result<Batch> {
///         let images = c.stack("images", samples.iter().map(|s| &s.image))?;
///         let labels = c.stack_scalars("labels", samples.iter().map(|s| s.label))?;
///         let mut out = c.finish()?;
///         Ok(Batch { images: out.take(images)?, labels: out.take(labels)? })
///     }
/// }
///
/// let pool = PinnedPool::new(PoolConfig::default());
/// let samples = (0..4)
///     .map(|i| Ok(Sample { image: Tensor::from_vec(vec![i as f32; 12], &[3, 2, 2])?, label: i }))
///     .collect::<pinnable::Result<Vec<_>>>()?;
/// let batch = ImageBatcher.batch(samples, &mut Collator::new(&pool))?;
/// assert_eq!(batch.images.shape(), &[4, 3, 2, 2]);
/// assert!(batch.images.shares_block_with(&batch.labels)); // one block: one copy to a device
/// # Ok::<(), pinnable::Error>(())
/// ```
pub trait Batcher<S>: Send + Sync {
    /// The batch made.
    type Batch: Send;

    /// Makes the batch of `samples`, through `c`.
    ///
    /// # Errors
    ///
    /// See the [trait docs](Batcher).
    fn batch(&self, samples: Vec<S>, c: &mut Collator) -> Result<Self::Batch>;
}

impl<S, B, F> Batcher<S> for F
where
    F: Fn(Vec<S>, &mut Collator) -> Result<B> + Send + Sync,
    B: Send,
{
    type Batch = B;

    fn batch(&self, samples: Vec<S>, c: &mut Collator) -> Result<B> {
        self(samples, c)
    }
}

/// The batcher for the simplest samples: tensors are stacked into a `[B, ...]` tensor, and
/// `(tensor, label)` pairs into the stacked tensors and a `[B]` tensor of labels.
///
/// # Examples
///
/// ```
/// use pinnable::loader::{Batcher, Collator, Stack};
/// use pinnable::{PinnedPool, PoolConfig, Tensor};
///
/// let pool = PinnedPool::new(PoolConfig::default());
/// let samples = vec![(Tensor::from_vec1(vec![1u8, 2]), 7i64), (Tensor::from_vec1(vec![3u8, 4]), 8)];
/// let (x, y) = Stack.batch(samples, &mut Collator::new(&pool))?;
/// assert_eq!(x.to_vec::<u8>()?, vec![1, 2, 3, 4]);
/// assert_eq!(y.to_vec::<i64>()?, vec![7, 8]);
/// # Ok::<(), pinnable::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Stack;

impl Batcher<Tensor> for Stack {
    type Batch = Tensor;

    fn batch(&self, samples: Vec<Tensor>, c: &mut Collator) -> Result<Tensor> {
        let x = c.stack("samples", &samples)?;
        c.finish()?.take(x)
    }
}

impl<T: Element> Batcher<(Tensor, T)> for Stack {
    type Batch = (Tensor, Tensor);

    fn batch(&self, samples: Vec<(Tensor, T)>, c: &mut Collator) -> Result<(Tensor, Tensor)> {
        let x = c.stack("samples.0", samples.iter().map(|s| &s.0))?;
        let y = c.stack_scalars("samples.1", samples.iter().map(|s| s.1))?;
        let mut out = c.finish()?;
        Ok((out.take(x)?, out.take(y)?))
    }
}
