//! Random-access sources of samples: the [`Dataset`] trait, its impls for slices, vectors and
//! shared arrays, [`FnDataset`] for closures, and [`TensorRows`] for the rows of one big tensor.
//!
//! A sample may *borrow* from its dataset: a [`Tensor`] view into an array the dataset holds
//! (in memory, or memory-mapped as [`NpyArray`](super::NpyArray) does) costs no copy; its bytes
//! are copied once, by collation, straight into the batch's pinned block.

use std::sync::Arc;

use super::plan::{Plan, PlanRequest};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// A source of samples by index, like PyTorch's map-style `Dataset`.
///
/// `get` is called from several worker threads at once, hence `Send + Sync`. Each call should
/// be independent: the loader asks for indices in any interleaving across threads (each batch's
/// samples in order on one thread), and retries nothing.
///
/// # Examples
///
/// ```
/// use pinnable::loader::Dataset;
///
/// let data = vec![10u32, 20, 30];
/// assert_eq!(data.len(), 3);
/// assert_eq!(Dataset::get(&data, 1)?, 20);
/// assert!(Dataset::get(&data, 3).is_err());
/// # Ok::<(), pinnable::Error>(())
/// ```
///
/// Your own dataset, one file a sample: `?` turns a [`std::io::Error`] into
/// [`Error::Io`](crate::Error::Io), and [`Error::other`](crate::Error::other) carries any other
/// failure of yours. The loader reports either as the sample's [`Error::Sample`].
///
/// ```
/// use std::path::PathBuf;
/// use pinnable::loader::Dataset;
///
/// struct Texts {
///     paths: Vec<PathBuf>,
/// }
///
/// impl Dataset for Texts {
///     type Sample = Vec<u8>;
///
///     fn len(&self) -> usize {
///         self.paths.len()
///     }
///
///     fn get(&self, index: usize) -> pinnable::Result<Vec<u8>> {
///         let bytes = std::fs::read(&self.paths[index])?;
///         if bytes.is_empty() {
///             return Err(pinnable::Error::other(format!("sample {index} is empty")));
///         }
///         Ok(bytes)
///     }
/// }
///
/// let dir = std::env::temp_dir().join(format!("pinnable-texts-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// std::fs::write(dir.join("a.txt"), "a sample")?;
/// let texts = Texts {
///     paths: vec![dir.join("a.txt"), dir.join("missing.txt")],
/// };
/// assert_eq!(texts.get(0)?, b"a sample");
/// let err = texts.get(1).unwrap_err();
/// assert!(matches!(&err, pinnable::Error::Io { source, .. }
///     if source.kind() == std::io::ErrorKind::NotFound));
/// std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), pinnable::Error>(())
/// ```
pub trait Dataset: Send + Sync {
    /// What one index yields: a tensor, a struct of tensors and numbers, ...
    type Sample: Send;

    /// How many samples there are; indices run over `0..len()`.
    fn len(&self) -> usize;

    /// Sample `index`.
    ///
    /// # Errors
    ///
    /// Whatever loading the sample can fail with; [`Error::IndexOutOfRange`] past the end.
    /// The loader wraps it in [`Error::Sample`] with the index.
    fn get(&self, index: usize) -> Result<Self::Sample>;

    /// Whether there is no sample.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The epoch's plan, when the source plans its epochs itself (archives read in sequence,
    /// packed documents, batches under a token budget, mixtures): the indices of rank
    /// `request.rank`'s part in delivery order, the batches where the source cuts them, and
    /// the fingerprint positions carry (see [`Plan`]). `None`, the default, lets the
    /// [`Sampler`](super::Sampler) shuffle, deal and cut.
    ///
    /// A pure function of the request and the source's settings: the loader calls it to count
    /// an epoch's batches and to check a position, not only to run an epoch, so it must start
    /// nothing (reads ahead belong in [`prefetch`](Self::prefetch)) and must not depend on
    /// timing or worker threads, for resuming to be exact. Every rank's plan of an epoch
    /// should hold the same number of batches, which keeps collective operations in step.
    fn plan(&self, request: &PlanRequest) -> Option<Plan> {
        let _ = request;
        None
    }

    /// Called by the loader when an epoch of a planned source starts running, with the plan
    /// it runs (before any `get`): a source that reads ahead (a remote archive streaming this
    /// rank's part) starts here. The default does nothing.
    fn prefetch(&self, request: &PlanRequest, plan: &Plan) {
        let _ = (request, plan);
    }
}

fn out_of_range(index: usize, len: usize) -> Error {
    Error::IndexOutOfRange { index, len }
}

/// Element `index`, cloned. A `Tensor` clones cheaply: it shares its storage.
impl<T: Clone + Send + Sync> Dataset for [T] {
    type Sample = T;

    fn len(&self) -> usize {
        <[T]>::len(self)
    }

    fn get(&self, index: usize) -> Result<T> {
        <[T]>::get(self, index)
            .cloned()
            .ok_or_else(|| out_of_range(index, <[T]>::len(self)))
    }
}

/// Element `index`, cloned.
impl<T: Clone + Send + Sync> Dataset for Vec<T> {
    type Sample = T;

    fn len(&self) -> usize {
        self.as_slice().len()
    }

    fn get(&self, index: usize) -> Result<T> {
        Dataset::get(self.as_slice(), index)
    }
}

/// The shared dataset's samples (`Arc<[T]>`, `Arc<MyDataset>`).
impl<D: Dataset + ?Sized> Dataset for Arc<D> {
    type Sample = D::Sample;

    fn len(&self) -> usize {
        (**self).len()
    }

    fn get(&self, index: usize) -> Result<D::Sample> {
        (**self).get(index)
    }

    fn plan(&self, request: &PlanRequest) -> Option<Plan> {
        (**self).plan(request)
    }

    fn prefetch(&self, request: &PlanRequest, plan: &Plan) {
        (**self).prefetch(request, plan)
    }
}

/// The borrowed dataset's samples (`&'static [T]`, a leaked or static table).
impl<D: Dataset + ?Sized> Dataset for &D {
    type Sample = D::Sample;

    fn len(&self) -> usize {
        (**self).len()
    }

    fn get(&self, index: usize) -> Result<D::Sample> {
        (**self).get(index)
    }

    fn plan(&self, request: &PlanRequest) -> Option<Plan> {
        (**self).plan(request)
    }

    fn prefetch(&self, request: &PlanRequest, plan: &Plan) {
        (**self).prefetch(request, plan)
    }
}

/// A dataset whose samples a closure makes: decode a record, generate data, read a file.
///
/// # Examples
///
/// ```
/// use pinnable::loader::{Dataset, FnDataset};
/// use pinnable::Tensor;
///
/// let squares = FnDataset::new(100, |i| Tensor::from_vec(vec![(i * i) as f32], &[1]));
/// assert_eq!(squares.len(), 100);
/// assert_eq!(squares.get(7)?.to_vec::<f32>()?, vec![49.0]);
/// # Ok::<(), pinnable::Error>(())
/// ```
pub struct FnDataset<F> {
    len: usize,
    f: F,
}

impl<F> FnDataset<F> {
    /// `len` samples, sample `i` being `f(i)`.
    pub fn new<S>(len: usize, f: F) -> Self
    where
        F: Fn(usize) -> Result<S> + Send + Sync,
        S: Send,
    {
        FnDataset { len, f }
    }
}

impl<F, S> Dataset for FnDataset<F>
where
    F: Fn(usize) -> Result<S> + Send + Sync,
    S: Send,
{
    type Sample = S;

    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> Result<S> {
        if index >= self.len {
            return Err(out_of_range(index, self.len));
        }
        (self.f)(index)
    }
}

impl<F> std::fmt::Debug for FnDataset<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FnDataset(len {})", self.len)
    }
}

/// The rows of one tensor (its indices along the first dimension) as samples, each a view
/// that shares the tensor's memory: a whole dataset held in one array, in memory or mapped.
///
/// # Examples
///
/// ```
/// use pinnable::loader::{Dataset, TensorRows};
/// use pinnable::Tensor;
///
/// let images = Tensor::from_vec(vec![0.5f32; 10 * 3 * 4 * 4], &[10, 3, 4, 4])?;
/// let rows = TensorRows::new(images.clone())?;
/// let sample = rows.get(9)?;
/// assert_eq!(sample.shape(), &[3, 4, 4]);
/// assert!(sample.shares_storage_with(&images)); // no copy
/// # Ok::<(), pinnable::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct TensorRows {
    tensor: Tensor,
}

impl TensorRows {
    /// The rows of `tensor`.
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] for a rank-0 tensor, which has no rows.
    pub fn new(tensor: Tensor) -> Result<Self> {
        if tensor.rank() == 0 {
            return Err(Error::Shape("a rank-0 tensor has no rows".into()));
        }
        Ok(TensorRows { tensor })
    }

    /// The whole tensor.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }
}

impl Dataset for TensorRows {
    type Sample = Tensor;

    fn len(&self) -> usize {
        self.tensor.shape()[0]
    }

    fn get(&self, index: usize) -> Result<Tensor> {
        if index >= self.len() {
            return Err(out_of_range(index, self.len()));
        }
        self.tensor.select(0, index)
    }
}
