//! `Loader` (`pinnable::loader::Loader`) and `BatchIterator` (its `Epoch`): the settings
//! PyTorch users pass, the device and ranks resolved as torch would, batches handed over as
//! tensors over the loader's memory, positions as `state_dict`s, the GIL let go around every
//! wait, and a guard against use from a forked child.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::Poll;
use std::time::Duration;

use pinnable::loader::{Batcher, Dataset, EpochStats, Loader, Position};
use pinnable::{Device, PinnedPool, Placement, Tensor, ToDevice};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyMapping};

use crate::errors::{IntoPy, config_error, error, pick, to_py};
use crate::sources::{PySource, Spec, seconds};

mod erased;
mod output;
mod settings;

pub(crate) use erased::{AnyEpoch, AnyLoader, Named, Options, Value, erase};
use output::{Output, to_python, torch_hooks};
pub(crate) use settings::parse_device;
use settings::parse_ranks;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An error when this is not process `made_in`, the one that made the loader: a forked child,
/// whose copy has none of the loader's threads or CUDA state.
fn same_process(made_in: u32) -> PyResult<()> {
    if std::process::id() == made_in {
        return Ok(());
    }
    Err(error(format!(
        "this pinnable loader was made in process {made_in} and this is process {}, a forked \
         child: its threads and CUDA state did not come with the fork. Make the loader in the \
         process that iterates it (with multiprocessing, the 'spawn' start method), and do not \
         wrap it in a DataLoader with num_workers > 0: it has workers of its own",
        std::process::id()
    )))
}

/// The epoch a `BatchIterator` drives (taken out when it is stopped).
type Slot = Mutex<Option<Box<dyn AnyEpoch>>>;

/// The iterator's own handle on its epoch.
type Shared = Arc<Slot>;

/// Every epoch started in this process, so that the interpreter's exit stops them before it
/// tears down what their threads may call (a Python `Dataset`).
static LIVE: Mutex<Vec<Weak<Slot>>> = Mutex::new(Vec::new());

/// How long a wait for a batch lasts before the GIL is taken back to check for a signal
/// (Ctrl-C), then let go again.
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// Stops `epochs`, joining their threads, with the GIL let go: the lock of an epoch whose
/// `next()` runs on another thread is taken once that call ends, and its threads may need the
/// GIL meanwhile.
fn stop(py: Python<'_>, epochs: Vec<Weak<Slot>>) {
    py.detach(move || {
        for shared in epochs.iter().filter_map(Weak::upgrade) {
            let epoch = lock(&shared).take();
            drop(epoch);
        }
    });
}

/// Stops every epoch still running (registered with `atexit` by the package).
#[pyfunction]
pub(crate) fn _shutdown(py: Python<'_>) {
    let epochs = std::mem::take(&mut *lock(&LIVE));
    stop(py, epochs);
}

/// The loader (`pinnable::loader::Loader`); see the type stub for the settings.
#[pyclass(name = "Loader", module = "pinnable", frozen)]
pub(crate) struct PyLoader {
    spec: Arc<dyn Spec>,
    options: Options,
    output: Output,
    inner: Mutex<Option<Arc<dyn AnyLoader>>>,
    /// The epochs its iterators run, stopped by `close()` and `load_state_dict()`.
    epochs: Mutex<Vec<Weak<Slot>>>,
    pid: u32,
}

impl PyLoader {
    fn loader(&self) -> PyResult<Arc<dyn AnyLoader>> {
        same_process(self.pid)?;
        lock(&self.inner)
            .clone()
            .ok_or_else(|| error("the loader is closed; make a new one to read again"))
    }

    /// Stops the epochs of its iterators, joining their threads, with the GIL let go.
    fn stop_epochs(&self, py: Python<'_>) {
        let epochs = std::mem::take(&mut *lock(&self.epochs));
        stop(py, epochs);
    }
}

#[pymethods]
impl PyLoader {
    #[new]
    #[pyo3(signature = (source, *, batch_size=None, shuffle=false, seed=0, drop_last=false, workers=None, prefetch=None, cores=None, device=None, rank=None, world_size=None, in_order=true, sample_timeout=None, output="torch"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        source: PyRef<'_, PySource>,
        batch_size: Option<usize>,
        shuffle: bool,
        seed: u64,
        drop_last: bool,
        workers: Option<usize>,
        prefetch: Option<usize>,
        cores: Option<usize>,
        device: Option<&Bound<'_, PyAny>>,
        rank: Option<usize>,
        world_size: Option<usize>,
        in_order: bool,
        sample_timeout: Option<f64>,
        output: &str,
    ) -> PyResult<Self> {
        let output = pick(
            "output",
            output,
            &[
                ("torch", Output::Torch),
                ("numpy", Output::Numpy),
                ("dlpack", Output::Dlpack),
            ],
        )?;
        if output == Output::Torch {
            torch_hooks(py)?;
        }
        let device = parse_device(py, device)?;
        let (rank, world) = parse_ranks(py, rank, world_size)?;
        let options = Options {
            batch_size,
            seed: shuffle.then_some(seed),
            drop_last,
            workers,
            prefetch,
            cores,
            device,
            rank,
            world,
            in_order,
            sample_timeout: sample_timeout
                .map(|t| seconds(t, "sample_timeout"))
                .transpose()?,
        };
        let spec = source.spec.clone();
        let inner = spec.loader(&options, None)?;
        Ok(PyLoader {
            spec,
            options,
            output,
            inner: Mutex::new(Some(Arc::from(inner))),
            epochs: Mutex::new(Vec::new()),
            pid: std::process::id(),
        })
    }

    fn __iter__(slf: &Bound<'_, Self>) -> PyResult<BatchIterator> {
        let this = slf.get();
        let loader = this.loader()?;
        let epoch = slf.py().detach(|| loader.iter());
        let remaining = epoch.remaining().unwrap_or(0);
        let shared: Shared = Arc::new(Mutex::new(Some(epoch)));
        for list in [&this.epochs, &LIVE] {
            let mut list = lock(list);
            list.retain(|w| w.strong_count() > 0);
            list.push(Arc::downgrade(&shared));
        }
        Ok(BatchIterator {
            epoch: shared,
            remaining: AtomicUsize::new(remaining),
            output: this.output,
            pid: this.pid,
            calls_python: this.spec.calls_python(),
            _loader: slf.clone().unbind(),
        })
    }

    /// Batches of this rank in an epoch.
    fn __len__(&self) -> PyResult<usize> {
        Ok(self.loader()?.len())
    }

    /// The epoch the next iteration runs (`Loader::set_epoch`), as with `DistributedSampler`.
    fn set_epoch(&self, epoch: u64) -> PyResult<()> {
        self.loader()?.set_epoch(epoch);
        Ok(())
    }

    /// The epoch the next iteration runs.
    #[getter]
    fn epoch(&self) -> PyResult<u64> {
        Ok(self.loader()?.next_epoch())
    }

    /// Where batches are delivered: `"cuda:N"`, or `"cpu"` (pinned host memory).
    #[getter]
    fn device(&self) -> String {
        match self.options.device.ordinal() {
            Some(n) => format!("cuda:{n}"),
            None => "cpu".into(),
        }
    }

    /// The raw `cudaStream_t` the loader copies batches on (`None` on the host).
    #[getter]
    fn stream(&self) -> Option<usize> {
        self.options
            .device
            .copy_stream()
            .map(|s| s.cu_stream() as usize)
    }

    /// This loader's rank.
    #[getter]
    fn rank(&self) -> usize {
        self.options.rank
    }

    /// The ranks the source is split across.
    #[getter]
    fn world_size(&self) -> usize {
        self.options.world
    }

    /// The worker threads an epoch runs.
    #[getter]
    fn workers(&self) -> PyResult<usize> {
        Ok(self.loader()?.workers())
    }

    /// Where the loader stands (`pinnable::loader::Position`): after the last batch delivered.
    /// Plain bytes and ints (torchdata's `Stateful`).
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let p = self.loader()?.position();
        let d = PyDict::new(py);
        d.set_item("position", PyBytes::new(py, &p.to_bytes()))?;
        d.set_item("epoch", p.epoch())?;
        d.set_item("batch", p.batch())?;
        Ok(d)
    }

    /// Goes on from a saved position; iterators still running are stopped. A position saved
    /// with other settings raises `ConfigError` naming the setting.
    fn load_state_dict(&self, py: Python<'_>, state_dict: &Bound<'_, PyAny>) -> PyResult<()> {
        same_process(self.pid)?;
        let map = state_dict.cast::<PyMapping>().map_err(|_| {
            PyTypeError::new_err("load_state_dict takes the dict state_dict() returned")
        })?;
        let bytes: Vec<u8> = map
            .get_item("position")
            .map_err(|_| {
                PyValueError::new_err(
                    "the state has no \"position\": pass what Loader.state_dict() returned",
                )
            })?
            .extract()?;
        let position = Position::from_bytes(&bytes).py_err()?;
        let fresh = self.spec.loader(&self.options, Some(position))?;
        self.stop_epochs(py);
        let old = lock(&self.inner).replace(Arc::from(fresh));
        py.detach(move || drop(old));
        Ok(())
    }

    /// The last epoch's figures (`pinnable::loader::EpochStats`), and `report`, their table.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(s) = self.loader()?.stats() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("batches", s.batches)?;
        d.set_item("samples", s.samples)?;
        d.set_item("bytes", s.bytes)?;
        d.set_item("elapsed_s", s.elapsed.as_secs_f64())?;
        d.set_item("waited_s", s.waited.as_secs_f64())?;
        d.set_item("load_s", s.load.as_secs_f64())?;
        d.set_item("collate_s", s.collate.as_secs_f64())?;
        d.set_item("transfer_s", s.transfer.as_secs_f64())?;
        d.set_item("workers", s.workers)?;
        d.set_item("prefetch", s.prefetch)?;
        let tuning = PyList::empty(py);
        for t in &s.tuning {
            let entry = PyDict::new(py);
            entry.set_item("at_s", t.at.as_secs_f64())?;
            entry.set_item("workers", t.workers)?;
            entry.set_item("prefetch", t.prefetch)?;
            entry.set_item("reason", &t.reason)?;
            tuning.append(entry)?;
        }
        d.set_item("tuning", tuning)?;
        d.set_item("batches_per_second", s.batches_per_second())?;
        d.set_item("gigabytes_per_second", s.gigabytes_per_second())?;
        d.set_item("wait_share", s.wait_share())?;
        d.set_item("pinned_peak_bytes", s.pinned_peak_bytes)?;
        d.set_item("pinned_bound_bytes", s.pinned_bound_bytes)?;
        d.set_item("batch_bytes", s.batch_bytes)?;
        d.set_item("report", s.to_string())?;
        Ok(Some(d))
    }

    /// Bytes held: `device_used`/`device_reserved` in the device pool batches come from,
    /// `pinned_in_use`/`pinned_held` in the pinned pool, and `pinned_bound`.
    fn memory<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let loader = self.loader()?;
        let (used, reserved) = self.options.device.pool_memory().py_err()?;
        let pool = loader.pool().stats();
        let d = PyDict::new(py);
        d.set_item("device_used", used)?;
        d.set_item("device_reserved", reserved)?;
        d.set_item("pinned_in_use", pool.in_use_bytes)?;
        d.set_item("pinned_held", pool.reserved_bytes)?;
        d.set_item(
            "pinned_bound",
            loader.stats().map_or(0, |s| s.pinned_bound_bytes),
        )?;
        Ok(d)
    }

    /// Stops every epoch of its iterators, joins their threads, frees what the loader holds.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        same_process(self.pid)?;
        self.stop_epochs(py);
        let old = lock(&self.inner).take();
        py.detach(move || drop(old));
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.close(py)
    }

    fn __reduce__(&self) -> PyResult<()> {
        Err(PyTypeError::new_err(
            "a pinnable.Loader is not pickled: it runs threads and holds pinned and device \
             memory of this process. Make it in the process that iterates it, and do not wrap \
             it in a DataLoader with num_workers > 0 (it has workers of its own); save its \
             position with state_dict()",
        ))
    }

    fn __repr__(&self) -> String {
        format!(
            "pinnable.Loader(device={}, rank={} of {}, batch_size={})",
            self.device(),
            self.options.rank,
            self.options.world,
            self.options
                .batch_size
                .map_or("the source's".into(), |b| b.to_string())
        )
    }
}

impl Drop for PyLoader {
    fn drop(&mut self) {
        // `get_mut`: no lock to wait for (a forked child may hold a copy of one taken).
        let inner = self.inner.get_mut().map_or(None, Option::take);
        let epochs = self
            .epochs
            .get_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        if std::process::id() != self.pid {
            // A forked child: the threads to join are not in this process.
            std::mem::forget((inner, epochs));
            return;
        }
        Python::attach(|py| {
            stop(py, epochs);
            py.detach(move || drop(inner));
        });
    }
}

/// One epoch's batches (`pinnable::loader::Epoch`).
#[pyclass(module = "pinnable", frozen)]
pub(crate) struct BatchIterator {
    epoch: Shared,
    /// The batches still to come, as of the last one taken (read without the epoch's lock).
    remaining: AtomicUsize,
    output: Output,
    pid: u32,
    /// Whether the workers call Python (a `Dataset`).
    calls_python: bool,
    /// The loader, kept alive while its epoch runs (`next(iter(Loader(...)))`).
    _loader: Py<PyLoader>,
}

impl BatchIterator {
    /// A batch already there, taken without letting go of the GIL (getting it back costs up
    /// to the interpreter's switch interval, 5 ms, while another thread runs Python). Not for
    /// a Python dataset, whose workers take the GIL, nor for the epoch's last batch, which
    /// joins the threads; not while another thread holds the epoch.
    fn ready(&self) -> Option<Option<pinnable::Result<Named>>> {
        if self.calls_python {
            return None;
        }
        let mut guard = self.epoch.try_lock().ok()?;
        let epoch = guard.as_mut()?;
        if epoch.remaining().is_some_and(|n| n <= 1) {
            return None;
        }
        match epoch.try_next() {
            Poll::Ready(item) => Some(item),
            Poll::Pending => None,
        }
    }

    /// The next item, waiting with the GIL let go, taking it back every [`SIGNAL_CHECK`] to
    /// raise `KeyboardInterrupt` and other signals' exceptions.
    fn wait(&self, py: Python<'_>) -> PyResult<Option<pinnable::Result<Named>>> {
        loop {
            let shared = self.epoch.clone();
            let next = py.detach(move || match lock(&shared).as_mut() {
                Some(e) => e.next_within(SIGNAL_CHECK),
                None => Poll::Ready(None),
            });
            match next {
                Poll::Ready(item) => return Ok(item),
                Poll::Pending => py.check_signals()?,
            }
        }
    }
}

#[pymethods]
impl BatchIterator {
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// The next batch: taken at once when it is already there, else waited for with the GIL
    /// let go.
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        same_process(self.pid)?;
        let next = match self.ready() {
            Some(item) => item,
            None => self.wait(py)?,
        };
        match next {
            Some(Ok(batch)) => {
                self.remaining.store(
                    self.remaining.load(Ordering::Relaxed).saturating_sub(1),
                    Ordering::Relaxed,
                );
                to_python(py, batch, self.output).map(Some)
            }
            Some(Err(e)) => {
                self.remaining.store(0, Ordering::Relaxed);
                Err(to_py(e))
            }
            None => {
                self.remaining.store(0, Ordering::Relaxed);
                self.close(py)?;
                Ok(None)
            }
        }
    }

    /// Batches still to come.
    fn __len__(&self) -> usize {
        self.remaining.load(Ordering::Relaxed)
    }

    /// Stops the epoch and joins its threads.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        same_process(self.pid)?;
        self.remaining.store(0, Ordering::Relaxed);
        stop(py, vec![Arc::downgrade(&self.epoch)]);
        Ok(())
    }
}

impl Drop for BatchIterator {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            // A forked child: no lock to take, no thread to join. The epoch is leaked (one
            // more owner) so that dropping this iterator's share does not drop it.
            std::mem::forget(self.epoch.clone());
            return;
        }
        let shared = self.epoch.clone();
        Python::attach(|py| stop(py, vec![Arc::downgrade(&shared)]));
    }
}
