//! `pinnable.Tensor` (a batch tensor any DLPack consumer takes without a copy) and DLPack
//! capsules both ways: out of our tensors for torch and NumPy, into tensors from theirs.

use std::ffi::{CStr, c_void};

use pinnable::interop::dlpack::DlpackTensor;
use pinnable::interop::dlpack::ffi::{
    DLManagedTensor, DLManagedTensorVersioned, KDL_CPU, KDL_CUDA,
};
use pinnable::{DType, Placement, Tensor};
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::errors::{IntoPy, error};

const VERSIONED: &CStr = c"dltensor_versioned";
const LEGACY: &CStr = c"dltensor";
const USED_VERSIONED: &CStr = c"used_dltensor_versioned";
const USED_LEGACY: &CStr = c"used_dltensor";

/// NumPy's name of a dtype.
pub(crate) fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::Bool => "bool",
        DType::U8 => "uint8",
        DType::U16 => "uint16",
        DType::U32 => "uint32",
        DType::U64 => "uint64",
        DType::I8 => "int8",
        DType::I16 => "int16",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::F32 => "float32",
        DType::F64 => "float64",
        _ => "unknown",
    }
}

/// The dtype a name gives (NumPy's and torch's names), for a setting called `setting`.
pub(crate) fn parse_dtype(name: &str, setting: &str, allowed: &[DType]) -> PyResult<DType> {
    let found = allowed
        .iter()
        .copied()
        .find(|d| dtype_name(*d) == name.trim_start_matches("torch."));
    found.ok_or_else(|| {
        let names: Vec<_> = allowed
            .iter()
            .map(|d| format!("{:?}", dtype_name(*d)))
            .collect();
        crate::errors::config_error(format!(
            "{setting}={name:?} is not a dtype this takes: use one of {}",
            names.join(", ")
        ))
    })
}

/// The device a tensor lives on, as torch names it.
pub(crate) fn device_name(t: &Tensor) -> String {
    match t.placement() {
        Placement::Cuda(n) => format!("cuda:{n}"),
        _ => "cpu".to_owned(),
    }
}

/// One tensor of a batch (`pinnable::Tensor`), pinned on the host or on a CUDA device, handed
/// to any DLPack consumer without a copy (`torch.from_dlpack`, `numpy.from_dlpack`, CuPy, JAX).
#[pyclass(name = "Tensor", module = "pinnable", frozen)]
pub(crate) struct PyTensor {
    pub(crate) tensor: Tensor,
}

#[pymethods]
impl PyTensor {
    /// The sizes of the dimensions.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.tensor.shape())
    }

    /// NumPy's name of the element type (`"float32"`, `"int64"`, ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        dtype_name(self.tensor.dtype())
    }

    /// `"cpu"` or `"cuda:N"`.
    #[getter]
    fn device(&self) -> String {
        device_name(&self.tensor)
    }

    /// The address of the first element: what the consumer's tensor's `data_ptr()` equals.
    #[getter]
    fn data_ptr(&self) -> usize {
        self.tensor.data_ptr()
    }

    /// Whether the elements are in page-locked host memory.
    #[getter]
    fn is_pinned(&self) -> bool {
        self.tensor.is_pinned()
    }

    /// The bytes the elements take.
    #[getter]
    fn nbytes(&self) -> usize {
        self.tensor.nbytes()
    }

    /// A DLPack capsule of the tensor, for a consumer working on `stream` (see the stub).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<isize>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "pinnable tensors are handed over without a copy; copy the consumer's tensor \
                 instead (e.g. torch.from_dlpack(t).clone())",
            ));
        }
        if let Some(d) = dl_device
            && d != self.__dlpack_device__()
        {
            return Err(PyBufferError::new_err(format!(
                "the tensor is on {} and is not moved by the DLPack hand-over; ask for device \
                 {:?}",
                self.device(),
                self.__dlpack_device__()
            )));
        }
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        capsule(py, &self.tensor, stream, versioned)
    }

    /// `(device type, device number)` as DLPack numbers them: `(1, 0)` host, `(2, n)` CUDA.
    fn __dlpack_device__(&self) -> (i32, i32) {
        match self.tensor.placement() {
            Placement::Cuda(n) => (KDL_CUDA, n as i32),
            _ => (KDL_CPU, 0),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "pinnable.Tensor(shape={:?}, dtype={}, device={}{})",
            self.tensor.shape(),
            self.dtype(),
            self.device(),
            if self.tensor.is_pinned() {
                ", pinned"
            } else {
                ""
            }
        )
    }

    fn __reduce__(&self) -> PyResult<()> {
        Err(PyTypeError::new_err(
            "a pinnable.Tensor is memory of the loader's and is not pickled; pickle \
             torch.from_dlpack(t) or numpy.from_dlpack(t) instead",
        ))
    }
}

/// Called by Python when a capsule is collected: a capsule nobody consumed (its name
/// unchanged) still owns its tensor, whose deleter runs here.
unsafe extern "C" fn drop_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: `capsule` is a live capsule (Python calls this on collection); a renamed
    // (consumed) capsule matches neither name, so only an unconsumed one is deleted, once.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr())
                .cast::<DLManagedTensorVersioned>();
            if let Some(delete) = p.as_ref().and_then(|m| m.deleter) {
                delete(p);
            }
        } else if ffi::PyCapsule_IsValid(capsule, LEGACY.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, LEGACY.as_ptr()).cast::<DLManagedTensor>();
            if let Some(delete) = p.as_ref().and_then(|m| m.deleter) {
                delete(p);
            }
        }
    }
}

/// A capsule of `tensor` for a consumer on `stream` (the `__dlpack__` stream integer; `None`
/// or 0 mean the legacy default stream for a CUDA tensor), versioned or legacy.
pub(crate) fn capsule<'py>(
    py: Python<'py>,
    tensor: &Tensor,
    stream: Option<isize>,
    versioned: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let dl = match tensor.placement() {
        Placement::Cuda(_) => {
            let raw = match stream {
                None | Some(0) => 1,
                Some(-1) => {
                    return Err(PyBufferError::new_err(
                        "stream=-1 (no synchronisation) would let the consumer read the batch \
                         before its copy lands; pass the consumer's stream",
                    ));
                }
                Some(s) if s < 0 => {
                    return Err(PyBufferError::new_err(format!(
                        "stream={s} is no CUDA stream: pass the consumer's stream, 1 (the legacy \
                         default stream) or 2 (the per-thread default stream)"
                    )));
                }
                Some(s) => s,
            };
            // SAFETY: `raw` is 1 or 2 (the default streams) or the stream the consumer named
            // for this device in `__dlpack__`. The consumer keeps it alive until it frees the
            // tensor (the deleter records its work): torch's streams live as long as the
            // process; a consumer that destroys its stream first breaks this, as the type
            // stub says.
            unsafe { tensor.to_dlpack_on_raw(raw as usize as _) }.py_err()?
        }
        _ => tensor.to_dlpack().py_err()?,
    };
    wrap(py, dl, versioned)
}

/// A capsule that owns `dl`, versioned or legacy.
pub(crate) fn wrap<'py>(
    py: Python<'py>,
    dl: DlpackTensor,
    versioned: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let (ptr, name) = if versioned {
        (
            dl.into_raw_versioned().py_err()?.cast::<c_void>(),
            VERSIONED,
        )
    } else {
        (dl.into_raw_legacy().py_err()?.cast::<c_void>(), LEGACY)
    };
    // SAFETY: `ptr` is a managed tensor we own; the capsule takes it, and `drop_capsule` calls
    // its deleter unless a consumer renamed the capsule (then the consumer calls it).
    let capsule = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(drop_capsule)) };
    if capsule.is_null() {
        // SAFETY: the capsule was not made, so the tensor is still ours to delete, once.
        unsafe { drop_unwrapped(ptr, versioned) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference PyCapsule_New returned.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) })
}

/// Deletes a managed tensor that never reached a capsule.
unsafe fn drop_unwrapped(ptr: *mut c_void, versioned: bool) {
    // SAFETY: `ptr` is a managed tensor of the given form that nobody else owns (caller).
    unsafe {
        if versioned {
            let _ = DlpackTensor::from_raw_versioned(ptr.cast());
        } else {
            let _ = DlpackTensor::from_raw_legacy(ptr.cast());
        }
    }
}

/// A tensor over the memory of a Python array (anything with `__dlpack__`: NumPy, torch, CuPy;
/// other array-likes through `numpy.asarray`), without a copy. Python ints and floats become
/// 0-dimensional `int64`/`float64` tensors.
pub(crate) fn from_python(obj: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let py = obj.py();
    if let Ok(v) = obj.cast::<pyo3::types::PyBool>() {
        return Tensor::from_vec(vec![v.is_true()], &[]).py_err();
    }
    if let Ok(v) = obj.cast::<pyo3::types::PyInt>() {
        return Tensor::from_vec(vec![v.extract::<i64>()?], &[]).py_err();
    }
    if let Ok(v) = obj.cast::<pyo3::types::PyFloat>() {
        return Tensor::from_vec(vec![v.value()], &[]).py_err();
    }
    let array = if obj.hasattr("__dlpack__")? {
        obj.clone()
    } else {
        py.import("numpy")
            .map_err(|_| {
                PyTypeError::new_err(format!(
                    "{} has no __dlpack__; pass a NumPy array or a torch tensor",
                    obj.get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                ))
            })?
            .call_method1("asarray", (obj,))?
    };
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item("max_version", (1, 0))?;
    let capsule = match array.call_method("__dlpack__", (), Some(&kwargs)) {
        Ok(c) => c,
        Err(e) if e.is_instance_of::<PyTypeError>(py) => array.call_method0("__dlpack__")?,
        Err(e) => return Err(e),
    };
    let cap = capsule.as_ptr();
    // SAFETY: `cap` is a live object; each branch checks the capsule's name before taking its
    // pointer, and renames it so that its own destructor no longer deletes the tensor, which
    // the DlpackTensor then owns (and deletes once).
    let dl = unsafe {
        if ffi::PyCapsule_IsValid(cap, VERSIONED.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(cap, VERSIONED.as_ptr());
            if ffi::PyCapsule_SetName(cap, USED_VERSIONED.as_ptr()) != 0 {
                return Err(PyErr::fetch(py));
            }
            DlpackTensor::from_raw_versioned(p.cast())
        } else if ffi::PyCapsule_IsValid(cap, LEGACY.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(cap, LEGACY.as_ptr());
            if ffi::PyCapsule_SetName(cap, USED_LEGACY.as_ptr()) != 0 {
                return Err(PyErr::fetch(py));
            }
            DlpackTensor::from_raw_legacy(p.cast())
        } else {
            return Err(error(
                "__dlpack__ returned something other than an unused DLPack capsule",
            ));
        }
    }
    .py_err()?;
    Tensor::from_dlpack(dl).py_err()
}
