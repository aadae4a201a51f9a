//! Rows of named arrays: `Arrays` (in memory), `Npy` (files) and `Dataset` (a Python object).

use super::*;

/// Columns from Python arrays, in the mapping's order.
fn columns(
    mapping: &Bound<'_, PyAny>,
    mut value: impl FnMut(&str, &Bound<'_, PyAny>) -> PyResult<Tensor>,
) -> PyResult<Vec<(String, Tensor)>> {
    let mapping = mapping.cast::<PyMapping>().map_err(|_| {
        config_error("pass a mapping of names to arrays, e.g. {\"x\": x, \"y\": y}")
    })?;
    let mut out = Vec::new();
    for item in mapping.items()?.iter() {
        let (k, v): (String, Bound<'_, PyAny>) = item.extract()?;
        let t = value(&k, &v)?;
        out.push((k, t));
    }
    Ok(out)
}

/// A loader stacking each of `names` over `rows` (a dataset of one tensor a name).
pub(super) fn rows_loader<D>(
    rows: D,
    names: &Names,
    options: &Options,
    resume: Option<Position>,
) -> PyResult<Box<dyn AnyLoader>>
where
    D: pinnable::loader::Dataset<Sample = Vec<Tensor>> + 'static,
{
    let batcher = StackRows {
        names: names.clone(),
    };
    let names = names.clone();
    erase(rows, batcher, options, resume, move |b| {
        Ok(named_rows(&names, b))
    })
}

/// Names each tensor of a batch of rows.
fn named_rows(names: &[String], tensors: Vec<Tensor>) -> Named {
    names
        .iter()
        .cloned()
        .zip(tensors.into_iter().map(Value::Tensor))
        .collect()
}

struct RowsSpec(Rows);

impl Spec for RowsSpec {
    fn len(&self) -> usize {
        pinnable::loader::Dataset::len(&self.0)
    }

    fn loader(&self, options: &Options, resume: Option<Position>) -> PyResult<Box<dyn AnyLoader>> {
        rows_loader(self.0.clone(), &self.0.names, options, resume)
    }

    fn mixable(&self) -> Mixable {
        Mixable::Rows(self.0.clone())
    }
}

/// Rows of in-memory arrays (`pinnable::loader::TensorRows`, one per key), shared without a copy.
#[pyclass(name = "Arrays", module = "pinnable", extends = PySource, frozen)]
pub(crate) struct PyArrays;

#[pymethods]
impl PyArrays {
    #[new]
    fn new(arrays: &Bound<'_, PyAny>) -> PyResult<PyClassInitializer<Self>> {
        let cols = columns(arrays, |_, v| from_python(v))?;
        Ok(source(RowsSpec(Rows::new(cols)?)).add_subclass(PyArrays))
    }
}

/// Rows of `.npy` files (`pinnable::formats::npy::NpyArray`, one per key), paths or URLs.
#[pyclass(name = "Npy", module = "pinnable", extends = PySource, frozen)]
pub(crate) struct PyNpy;

#[pymethods]
impl PyNpy {
    #[new]
    #[pyo3(signature = (files, *, storage=None))]
    fn new(
        py: Python<'_>,
        files: &Bound<'_, PyAny>,
        storage: Option<PyRef<'_, PyStorage>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let s = self::storage(storage);
        let cols = columns(files, |_, v| {
            let path = locations(v)?;
            let [path] = &path[..] else {
                return Err(config_error("each name takes one .npy file"));
            };
            let array = py
                .detach(|| pinnable::formats::npy::NpyArray::open_with(&s, path))
                .py_err()?;
            Ok(array.tensor().clone())
        })?;
        Ok(source(RowsSpec(Rows::new(cols)?)).add_subclass(PyNpy))
    }
}

struct PythonSpec(Arc<PyRows>);

impl Spec for PythonSpec {
    fn len(&self) -> usize {
        pinnable::loader::Dataset::len(&*self.0)
    }

    fn loader(&self, options: &Options, resume: Option<Position>) -> PyResult<Box<dyn AnyLoader>> {
        rows_loader(self.0.clone(), &self.0.names, options, resume)
    }

    fn mixable(&self) -> Mixable {
        Mixable::No("Dataset")
    }

    fn calls_python(&self) -> bool {
        true
    }
}

/// A dataset written in Python (`pinnable::loader::Dataset` implemented by the object).
#[pyclass(name = "Dataset", module = "pinnable", extends = PySource, frozen)]
pub(crate) struct PyDataset;

#[pymethods]
impl PyDataset {
    #[new]
    fn new(dataset: &Bound<'_, PyAny>) -> PyResult<PyClassInitializer<Self>> {
        let rows = PyRows::new(dataset)?;
        Ok(source(PythonSpec(Arc::new(rows))).add_subclass(PyDataset))
    }
}
