//! Batches for Python: torch tensors over the loader's memory, NumPy arrays or `pinnable.Tensor`s.

use super::*;
use crate::tensor::{PyTensor, wrap};

/// How batches reach Python.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Output {
    Torch,
    Numpy,
    Dlpack,
}

/// What converting a batch for torch needs, looked up once.
pub(super) struct TorchHooks {
    from_dlpack: Py<PyAny>,
    /// Whether `from_dlpack` takes versioned capsules (torch 2.9 and later); older ones are
    /// handed the legacy form.
    versioned: bool,
    /// `torch._C._cuda_getCurrentRawStream(index)`, or `None` where torch lacks it.
    raw_stream: Option<Py<PyAny>>,
    current_stream: Py<PyAny>,
}

static TORCH: PyOnceLock<TorchHooks> = PyOnceLock::new();

/// `numpy.from_dlpack`, looked up once.
static NUMPY_FROM_DLPACK: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

pub(super) fn torch_hooks(py: Python<'_>) -> PyResult<&'static TorchHooks> {
    TORCH.get_or_try_init(py, || {
        let torch = py.import("torch").map_err(|e| {
            error(format!(
                "output=\"torch\" needs PyTorch, which did not import ({e}); install it, or \
                 pass output=\"numpy\" or output=\"dlpack\""
            ))
        })?;
        let c = torch.getattr("_C")?;
        let from_dlpack = match c.getattr("_from_dlpack") {
            Ok(f) => f,
            Err(_) => torch.getattr("from_dlpack")?,
        };
        Ok(TorchHooks {
            from_dlpack: from_dlpack.unbind(),
            versioned: c.hasattr("_to_dlpack_versioned")?,
            raw_stream: c
                .getattr("_cuda_getCurrentRawStream")
                .ok()
                .map(Bound::unbind),
            current_stream: torch.getattr("cuda")?.getattr("current_stream")?.unbind(),
        })
    })
}

/// The stream torch works on for device `ordinal` now, as the `__dlpack__` integer.
fn torch_stream(py: Python<'_>, hooks: &TorchHooks, ordinal: usize) -> PyResult<isize> {
    let raw: isize = match &hooks.raw_stream {
        Some(f) => f.call1(py, (ordinal,))?.extract(py)?,
        None => hooks
            .current_stream
            .call1(py, (ordinal,))?
            .getattr(py, "cuda_stream")?
            .extract(py)?,
    };
    Ok(if raw == 0 { 1 } else { raw })
}

/// A batch as a dict for Python.
pub(super) fn to_python<'py>(
    py: Python<'py>,
    batch: Named,
    output: Output,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    if output == Output::Torch {
        return to_torch(py, batch, dict);
    }
    let numpy = match output {
        Output::Numpy => Some(
            NUMPY_FROM_DLPACK
                .import(py, "numpy", "from_dlpack")
                .map_err(|e| {
                    error(format!(
                        "output=\"numpy\" needs NumPy, which did not import ({e}); install it, \
                         or pass output=\"torch\" or output=\"dlpack\""
                    ))
                })?,
        ),
        _ => None,
    };
    for (name, value) in batch {
        let t = match value {
            Value::Int(v) => {
                dict.set_item(name, v)?;
                continue;
            }
            Value::Tensor(t) => t,
        };
        let object = match &numpy {
            Some(from_dlpack) => {
                if let Placement::Cuda(n) = t.placement() {
                    return Err(error(format!(
                        "output=\"numpy\" takes host batches, and this one is on cuda:{n}: pass \
                         device=\"cpu\", or output=\"torch\""
                    )));
                }
                from_dlpack.call1((PyTensor { tensor: t },))?
            }
            None => Bound::new(py, PyTensor { tensor: t })?.into_any(),
        };
        dict.set_item(name, object)?;
    }
    Ok(dict)
}

/// A batch as torch tensors over its memory, ordered on torch's current stream of the batch's
/// device: one wait for the batch's copy, not one a tensor.
fn to_torch<'py>(
    py: Python<'py>,
    batch: Named,
    dict: Bound<'py, PyDict>,
) -> PyResult<Bound<'py, PyDict>> {
    let hooks = torch_hooks(py)?;
    let mut names = Vec::with_capacity(batch.len());
    let mut tensors = Vec::with_capacity(batch.len());
    for (name, value) in batch {
        match value {
            Value::Int(v) => dict.set_item(name, v)?,
            Value::Tensor(t) => {
                names.push(name);
                tensors.push(t);
            }
        }
    }
    let device = tensors.iter().find_map(|t| match t.placement() {
        Placement::Cuda(n) => Some(n),
        _ => None,
    });
    if let Some(n) = device
        && let Some(t) = tensors.iter().find(|t| t.placement() != Placement::Cuda(n))
    {
        return Err(error(format!(
            "a batch with tensors on cuda:{n} and on {}: torch's stream is per device",
            crate::tensor::device_name(t)
        )));
    }
    let exported = match device {
        Some(n) => {
            let stream = torch_stream(py, hooks, n)?;
            // SAFETY: `stream` is torch's current stream of the batch's device (1 for the
            // legacy default one): torch's own streams (default, pooled) live as long as the
            // process; an `ExternalStream` must outlive the tensors made under it, as the type
            // stub says.
            unsafe { Tensor::to_dlpack_all_on_raw(&tensors, stream as usize as _) }.py_err()?
        }
        None => tensors
            .iter()
            .map(Tensor::to_dlpack)
            .collect::<pinnable::Result<Vec<_>>>()
            .py_err()?,
    };
    let from_dlpack = hooks.from_dlpack.bind(py);
    for (name, dl) in names.into_iter().zip(exported) {
        let capsule = wrap(py, dl, hooks.versioned)?;
        dict.set_item(name, from_dlpack.call1((capsule,))?)?;
    }
    Ok(dict)
}
