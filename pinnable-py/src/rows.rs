//! Rows of named arrays: the dataset behind `Arrays`, `Npy` and `Dataset` (a Python object),
//! and the batcher that stacks each name's rows (`Collator::stack`), like `loader::Stack` for
//! one tensor.

use std::sync::Arc;

use pinnable::loader::{Batcher, Collator, Dataset, TensorRows};
use pinnable::{DType, Tensor};
use pyo3::prelude::*;
use pyo3::types::PyMapping;

use crate::errors::IntoPy;
use crate::tensor::from_python;

/// The names of a batch's fields, in order.
pub(crate) type Names = Arc<[String]>;

/// Equal-length columns, each the rows of one tensor (`TensorRows`); sample `i` is row `i`
/// of every column.
#[derive(Clone)]
pub(crate) struct Rows {
    pub(crate) names: Names,
    columns: Arc<[TensorRows]>,
    len: usize,
}

impl Rows {
    /// Columns of `tensors` (host tensors with the same first dimension).
    pub(crate) fn new(columns: Vec<(String, Tensor)>) -> PyResult<Rows> {
        let mut len = None;
        let mut names = Vec::new();
        let mut rows = Vec::new();
        for (name, t) in columns {
            if !t.placement().is_host() {
                return Err(crate::errors::config_error(format!(
                    "array {name:?} is on {}: pass host arrays (NumPy, or torch tensors on the \
                     CPU); the loader moves batches to the device",
                    crate::tensor::device_name(&t)
                )));
            }
            let n = t.shape().first().copied().ok_or_else(|| {
                crate::errors::config_error(format!(
                    "array {name:?} has no dimensions: its first dimension indexes the samples"
                ))
            })?;
            match len {
                Some(l) if l != n => {
                    return Err(crate::errors::config_error(format!(
                        "array {name:?} has {n} rows and {:?} has {l}: every array needs the same \
                         first dimension",
                        names[0]
                    )));
                }
                _ => len = Some(n),
            }
            names.push(name);
            rows.push(TensorRows::new(t).py_err()?);
        }
        if names.is_empty() {
            return Err(crate::errors::config_error(
                "no arrays given: pass a mapping of names to arrays",
            ));
        }
        Ok(Rows {
            names: names.into(),
            columns: rows.into(),
            len: len.unwrap_or(0),
        })
    }
}

impl Dataset for Rows {
    type Sample = Vec<Tensor>;

    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> pinnable::Result<Vec<Tensor>> {
        self.columns.iter().map(|c| c.get(index)).collect()
    }
}

/// Stacks each field of the samples into a `[batch, ...]` tensor, all in one pinned block.
#[derive(Clone)]
pub(crate) struct StackRows {
    pub(crate) names: Names,
}

impl Batcher<Vec<Tensor>> for StackRows {
    type Batch = Vec<Tensor>;

    fn batch(&self, samples: Vec<Vec<Tensor>>, c: &mut Collator) -> pinnable::Result<Vec<Tensor>> {
        let slots = self
            .names
            .iter()
            .enumerate()
            .map(|(k, name)| c.stack(name, samples.iter().map(|s| &s[k])))
            .collect::<pinnable::Result<Vec<_>>>()?;
        let mut out = c.finish()?;
        slots.into_iter().map(|s| out.take(s)).collect()
    }
}

/// A Python exception raised by user code the loader called, as a crate error.
#[derive(Debug)]
struct PythonError(String);

impl std::fmt::Display for PythonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PythonError {}

/// A dataset written in Python: `__len__`, and `__getitem__(i)` giving a mapping of names to
/// arrays. Each sample takes the GIL on the worker that loads it, and is copied out of the
/// arrays Python made before the GIL is let go.
pub(crate) struct PyRows {
    object: Py<PyAny>,
    pub(crate) names: Names,
    len: usize,
}

impl PyRows {
    /// Wraps `object`, reading its length and the names of its first sample.
    pub(crate) fn new(object: &Bound<'_, PyAny>) -> PyResult<PyRows> {
        let len = object.len()?;
        let names: Vec<String> = if len == 0 {
            Vec::new()
        } else {
            let first = object.get_item(0)?;
            let map = first.cast::<PyMapping>().map_err(|_| {
                crate::errors::config_error(format!(
                    "dataset[0] is a {}: __getitem__ must return a mapping of names to arrays \
                     (e.g. {{\"x\": array, \"y\": label}})",
                    first
                        .get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                ))
            })?;
            map.keys()?
                .iter()
                .map(|k| k.extract::<String>())
                .collect::<PyResult<_>>()?
        };
        Ok(PyRows {
            object: object.clone().unbind(),
            names: names.into(),
            len,
        })
    }

    fn fetch(&self, py: Python<'_>, index: usize) -> PyResult<Vec<Tensor>> {
        let item = self.object.bind(py).get_item(index)?;
        self.names
            .iter()
            .map(|name| {
                let value = item.get_item(name).map_err(|e| {
                    crate::errors::error(format!("dataset[{index}] has no field {name:?}: {e}"))
                })?;
                let t = from_python(&value)?;
                owned(&t).py_err()
            })
            .collect()
    }
}

impl Dataset for PyRows {
    type Sample = Vec<Tensor>;

    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> pinnable::Result<Vec<Tensor>> {
        Python::attach(|py| {
            self.fetch(py, index).map_err(|e| {
                let text = match e.get_type(py).name() {
                    Ok(kind) => format!("{kind}: {}", e.value(py)),
                    Err(_) => e.to_string(),
                };
                pinnable::Error::other(PythonError(text))
            })
        })
    }
}

/// A copy of `t` in memory of its own (not the Python array's).
fn owned(t: &Tensor) -> pinnable::Result<Tensor> {
    macro_rules! copy {
        ($($d:ident => $ty:ty),*) => {
            match t.dtype() {
                $(DType::$d => Tensor::from_vec(t.to_vec::<$ty>()?, t.shape()),)*
                other => Err(pinnable::Error::Shape(format!("{other:?} tensors cannot be copied here"))),
            }
        };
    }
    copy!(Bool => bool, U8 => u8, U16 => u16, U32 => u32, U64 => u64, I8 => i8, I16 => i16,
          I32 => i32, I64 => i64, F16 => half::f16, BF16 => half::bf16, F32 => f32, F64 => f64)
}
