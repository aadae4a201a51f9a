//! A decoding thread's state (its stream, nvJPEG's handles, its scratch memory), held by one
//! thread at a time and kept from epoch to epoch.
//!
//! A loader's workers are threads of one epoch. Creating nvJPEG's handles and destroying them
//! when those threads end cost more than an epoch of a small dataset takes (hundreds of
//! milliseconds a thread on an H200, where a batch takes two), so a thread that ends parks its
//! state here and the next epoch's threads take it back. [`Device::empty_cache`] frees the
//! parked states of its device.
//!
//! [`Device::empty_cache`]: crate::Device::empty_cache

use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard, Once};

use cudarc::driver::{CudaEvent, CudaStream, sys};

use super::backend::Backend;
use super::memory::Scratch;
use super::plan::Jobs;
use crate::cuda::{CudaDevice, on_empty_cache};
use crate::error::{Error, Result};
use crate::formats::image::decode::Decoder;

/// A decoding thread's state for one device: its stream and nvJPEG handles, and buffers reused
/// from batch to batch.
pub(super) struct Worker {
    pub(super) ordinal: usize,
    pub(super) stream: Arc<CudaStream>,
    /// Recorded on `stream` to wait for it on the host without spinning a core.
    pub(super) idle: CudaEvent,
    pub(super) hardware: Option<Backend>,
    /// Batches in a row the engines failed; at [`ENGINE_STRIKES`](super::notice::ENGINE_STRIKES)
    /// this state stops asking them (a container can expose the engines' API and not the
    /// engines).
    pub(super) engine_failures: u32,
    pub(super) cuda: Option<Backend>,
    pub(super) host: Decoder,
    pub(super) jobs: Jobs,
    /// The decoded pictures, the filtered rows and the kernels' tables, on `stream`.
    pub(super) decoded: Scratch,
    pub(super) mid: Scratch,
    pub(super) params: Scratch,
}

impl Worker {
    fn new(dev: &Arc<CudaDevice>) -> Result<Worker> {
        let stream = dev.thread_stream()?;
        let idle = dev
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))
            .map_err(|e| Error::driver("cuEventCreate", e))?;
        Ok(Worker {
            ordinal: dev.ordinal,
            stream,
            idle,
            hardware: None,
            engine_failures: 0,
            cuda: None,
            host: Decoder::new(),
            jobs: Jobs::default(),
            decoded: Scratch::default(),
            mid: Scratch::default(),
            params: Scratch::default(),
        })
    }
}

/// States no thread holds.
static PARKED: Mutex<Vec<Worker>> = Mutex::new(Vec::new());

fn parked() -> MutexGuard<'static, Vec<Worker>> {
    PARKED.lock().unwrap_or_else(|e| e.into_inner())
}

/// The state this thread holds; parked when the thread ends.
struct Held(Option<Worker>);

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(w) = self.0.take() {
            parked().push(w);
        }
    }
}

thread_local! {
    static HELD: RefCell<Held> = const { RefCell::new(Held(None)) };
}

/// How many states of device `ordinal` are parked.
#[cfg(test)]
pub(super) fn parked_for(ordinal: usize) -> usize {
    parked().iter().filter(|w| w.ordinal == ordinal).count()
}

/// Frees the parked states of device `ordinal` (their work is done: the caller waited for the
/// device).
fn free_parked(ordinal: usize) {
    let freed: Vec<Worker> = {
        let mut p = parked();
        let (freed, kept) = std::mem::take(&mut *p)
            .into_iter()
            .partition(|w| w.ordinal == ordinal);
        *p = kept;
        freed
    };
    drop(freed);
}

/// Runs `f` with this thread's state for `dev`: the one it holds, else a parked one, else a
/// new one.
pub(super) fn with_worker<R>(
    dev: &Arc<CudaDevice>,
    f: impl FnOnce(&mut Worker) -> Result<R>,
) -> Result<R> {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| on_empty_cache(free_parked));
    HELD.with(|held| {
        let mut held = held.borrow_mut();
        if held.0.as_ref().is_none_or(|w| w.ordinal != dev.ordinal) {
            if let Some(other) = held.0.take() {
                parked().push(other);
            }
            let reused = {
                let mut p = parked();
                p.iter()
                    .position(|w| w.ordinal == dev.ordinal)
                    .map(|i| p.swap_remove(i))
            };
            held.0 = Some(match reused {
                Some(w) => w,
                None => Worker::new(dev)?,
            });
        }
        f(held.0.as_mut().expect("set just above"))
    })
}
