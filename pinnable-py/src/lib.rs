//! The native module of pinnable's Python package, `pinnable._pinnable`: a thin binding of the
//! Rust crate. Each Python class wraps one Rust item (its docstring names it); the code here
//! converts arguments, batches and errors, and holds no loading logic of its own.
//!
//! - `loader`: `Loader` and its epochs (`BatchIterator`), the fork guard, positions.
//! - `sources`: the sources a loader reads, one class each.
//! - `rows`: rows of named arrays (in memory, `.npy`, a Python dataset) and their batcher.
//! - `tensor`: `Tensor` and DLPack capsules both ways.
//! - `errors`: the crate's errors as Python exceptions.

mod errors;
mod loader;
mod rows;
mod sources;
mod tensor;

use pyo3::prelude::*;

/// Whether a CUDA device can be used (`pinnable::Device::is_available`).
#[pyfunction]
fn cuda_available() -> bool {
    pinnable::Device::is_available()
}

/// The CUDA devices there are (`pinnable::Device::count`); 0 without a driver.
#[pyfunction]
fn device_count() -> usize {
    pinnable::Device::count()
}

#[pymodule]
fn _pinnable(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    m.add_function(wrap_pyfunction!(cuda_available, m)?)?;
    m.add_function(wrap_pyfunction!(device_count, m)?)?;
    m.add_class::<tensor::PyTensor>()?;
    sources::register(m)?;
    m.add_class::<loader::PyLoader>()?;
    m.add_class::<loader::BatchIterator>()?;
    m.add_function(wrap_pyfunction!(loader::_shutdown, m)?)?;
    Ok(())
}
