//! The sources a `Loader` reads, one Python class each (all subclasses of `Source`), and the
//! settings they take (`Storage`, `Budget`, `ImageCodec`). Each holds the Rust source it wraps,
//! opened when it is made, and knows its batcher and the names of its batch's fields.

use std::sync::Arc;
use std::time::Duration;

use pinnable::formats::image::{DecodeOn, ImageBatcher, ImageCodec, ImageFolder, Transform};
use pinnable::formats::tar::{TarImageBatcher, TarNpyBatcher, TarShards};
use pinnable::formats::tokens::{PackedBatch, PackedDocs, TokenShards, TokenWindows};
use pinnable::loader::{Budget, BudgetPlan, Mix, Position, Stop};
use pinnable::storage::Storage;
use pinnable::{DType, Tensor};
use pyo3::prelude::*;
use pyo3::types::{PyMapping, PyString};

use crate::errors::{IntoPy, config_error, pick};
use crate::loader::{AnyLoader, Named, Options, Value, erase};
use crate::rows::{Names, PyRows, Rows, StackRows};
use crate::tensor::{from_python, parse_dtype};

mod arrays;
mod images;
mod mix;
mod tokens;

/// What a source is, for the loader: its length and how to build a loader over it.
pub(crate) trait Spec: Send + Sync {
    /// Samples (documents, samples in the shards).
    fn len(&self) -> usize;

    /// A loader over the source with `options`, resuming at `resume`.
    fn loader(&self, options: &Options, resume: Option<Position>) -> PyResult<Box<dyn AnyLoader>>;

    /// What a `Mix` can mix it with.
    fn mixable(&self) -> Mixable;

    /// Whether the loader's workers call Python code (and so take the GIL).
    fn calls_python(&self) -> bool {
        false
    }
}

/// The sources a `Mix` takes: those of one sample type and one batcher.
pub(crate) enum Mixable {
    Rows(Rows),
    Images(Arc<ImageFolder>, ImageCodec),
    No(&'static str),
}

/// What a `Loader` reads (`pinnable::loader::Source`): one of its subclasses.
#[pyclass(name = "Source", module = "pinnable", subclass, frozen)]
pub(crate) struct PySource {
    pub(crate) spec: Arc<dyn Spec>,
}

#[pymethods]
impl PySource {
    /// Samples (documents for packed documents, samples in the shards for tar).
    fn __len__(&self) -> usize {
        self.spec.len()
    }
}

fn source(spec: impl Spec + 'static) -> PyClassInitializer<PySource> {
    PyClassInitializer::from(PySource {
        spec: Arc::new(spec),
    })
}

/// One path, or a sequence of them (str or `os.PathLike`).
fn locations(obj: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    let one = |o: &Bound<'_, PyAny>| -> PyResult<String> {
        let os = o.py().import("os")?;
        os.call_method1("fspath", (o,))?.extract::<String>()
    };
    if obj.is_instance_of::<PyString>() || obj.hasattr("__fspath__")? {
        return Ok(vec![one(obj)?]);
    }
    obj.try_iter()?.map(|o| one(&o?)).collect()
}

/// Where URLs are read from and how (`pinnable::storage::Storage`).
#[pyclass(name = "Storage", module = "pinnable", frozen)]
#[derive(Clone)]
pub(crate) struct PyStorage {
    storage: Storage,
}

#[pymethods]
impl PyStorage {
    #[new]
    #[pyo3(signature = (*, options=None, chunk_size=None, read_ahead=None, cache_bytes=None, retries=None, timeout=None, threads=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        options: Option<std::collections::BTreeMap<String, String>>,
        chunk_size: Option<usize>,
        read_ahead: Option<usize>,
        cache_bytes: Option<usize>,
        retries: Option<usize>,
        timeout: Option<f64>,
        threads: Option<usize>,
    ) -> PyResult<Self> {
        let mut s = Storage::new();
        for (k, v) in options.unwrap_or_default() {
            s = s.option(k, v);
        }
        if let Some(n) = chunk_size {
            s = s.chunk_size(n);
        }
        if let Some(n) = read_ahead {
            s = s.read_ahead(n);
        }
        if let Some(n) = cache_bytes {
            s = s.cache_bytes(n);
        }
        if let Some(n) = retries {
            s = s.retries(n);
        }
        if let Some(t) = timeout {
            s = s.timeout(seconds(t, "timeout")?);
        }
        if let Some(n) = threads {
            s = s.threads(n);
        }
        Ok(PyStorage { storage: s })
    }
}

/// A duration from seconds, refusing what is not a finite positive number.
pub(crate) fn seconds(t: f64, setting: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(t)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| config_error(format!("{setting}={t} is not a positive number of seconds")))
}

fn storage(s: Option<PyRef<'_, PyStorage>>) -> Storage {
    s.map(|s| s.storage.clone()).unwrap_or_default()
}

/// Adds the source classes and their settings to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySource>()?;
    m.add_class::<PyStorage>()?;
    m.add_class::<arrays::PyArrays>()?;
    m.add_class::<arrays::PyNpy>()?;
    m.add_class::<tokens::PyTokenWindows>()?;
    m.add_class::<tokens::PyBudget>()?;
    m.add_class::<tokens::PyPackedDocs>()?;
    m.add_class::<images::PyImageCodec>()?;
    m.add_class::<images::PyImageFolder>()?;
    m.add_class::<images::PyTarShards>()?;
    m.add_class::<mix::PyMix>()?;
    m.add_class::<arrays::PyDataset>()?;
    Ok(())
}
