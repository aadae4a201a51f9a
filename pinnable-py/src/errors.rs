//! The crate's errors as Python exceptions: `pinnable.Error` (a `RuntimeError`) carrying the
//! Rust message, and `pinnable.ConfigError` (also a `ValueError`) for settings refused and
//! positions that do not match.

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

static ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static CONFIG_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn make_type<'py>(
    py: Python<'py>,
    name: &str,
    doc: &str,
    bases: Bound<'py, PyTuple>,
) -> PyResult<Bound<'py, PyType>> {
    let namespace = PyDict::new(py);
    namespace.set_item("__doc__", doc)?;
    namespace.set_item("__module__", "pinnable")?;
    let made = py
        .get_type::<PyType>()
        .call1((name, bases, namespace))?
        .cast_into::<PyType>()?;
    Ok(made)
}

/// Makes the two exception types and adds them to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let error = make_type(
        py,
        "Error",
        "An error of the Rust crate (`pinnable::Error`): its message, with the field path, file \
         and byte offset where the crate names them.",
        PyTuple::new(py, [py.get_type::<PyRuntimeError>()])?,
    )?;
    let config = make_type(
        py,
        "ConfigError",
        "A setting refused (`Error::Config`), or a saved position that does not match the \
         loader (`Error::Resume`), naming the setting.",
        PyTuple::new(py, [error.clone(), py.get_type::<PyValueError>()])?,
    )?;
    m.add("Error", &error)?;
    m.add("ConfigError", &config)?;
    let _ = ERROR.set(py, error.unbind());
    let _ = CONFIG_ERROR.set(py, config.unbind());
    Ok(())
}

fn raise(kind: &PyOnceLock<Py<PyType>>, message: String) -> PyErr {
    Python::attach(|py| match kind.get(py) {
        Some(t) => PyErr::from_type(t.bind(py).clone(), message),
        None => PyRuntimeError::new_err(message),
    })
}

/// `pinnable.Error` with `message`.
pub(crate) fn error(message: impl Into<String>) -> PyErr {
    raise(&ERROR, message.into())
}

/// `pinnable.ConfigError` with `message`.
pub(crate) fn config_error(message: impl Into<String>) -> PyErr {
    raise(&CONFIG_ERROR, message.into())
}

/// The Python exception of a crate error: its `Display` with the chain of sources.
pub(crate) fn to_py(e: pinnable::Error) -> PyErr {
    let config = matches!(
        e,
        pinnable::Error::Config { .. } | pinnable::Error::Resume { .. }
    );
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        let text = s.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = s.source();
    }
    if config {
        config_error(message)
    } else {
        error(message)
    }
}

/// Converts a crate result.
pub(crate) trait IntoPy<T> {
    /// The value, or the error as a Python exception.
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for pinnable::Result<T> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

/// The choice `value` names among `choices` for the setting `setting`, or a `ConfigError`
/// listing them.
pub(crate) fn pick<T: Copy>(setting: &str, value: &str, choices: &[(&str, T)]) -> PyResult<T> {
    if let Some((_, v)) = choices.iter().find(|(name, _)| *name == value) {
        return Ok(*v);
    }
    let names: Vec<String> = choices.iter().map(|(n, _)| format!("{n:?}")).collect();
    Err(config_error(format!(
        "{setting}={value:?}: use one of {}",
        names.join(", ")
    )))
}
