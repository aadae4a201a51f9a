//! Stragglers: a sample whose `get` runs past the loader's timeout
//! ([`LoaderBuilder::sample_timeout`](super::LoaderBuilder::sample_timeout)).
//!
//! Each worker notes, in a slot of its own, the sample it is loading and since when; the
//! consumer, while it waits for a batch, looks at the slots every tenth of the timeout. A
//! sample past the timeout ends the epoch with [`Error::Timeout`](crate::Error::Timeout).
//!
//! A thread cannot be killed, so the worker stuck in the call is **abandoned**: the epoch's
//! other threads are joined as usual, and the stuck one's handle is kept by the loader
//! ([`Abandoned`]). The worker holds no pinned block while it loads (blocks are taken when a
//! batch is collated, after all its samples are loaded), only the samples of its batch it
//! loaded before; when the call returns, the worker sees the epoch stopped, drops them and
//! ends. The next epoch starts a full set of workers. A loader joins the abandoned threads
//! that have ended whenever it is asked ([`Loader::stuck_workers`](super::Loader::stuck_workers))
//! and when it is dropped; one still inside its call then is left to end on its own, which it
//! does as soon as the call returns.

use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What each worker is loading, and since when.
pub(crate) struct Watch {
    timeout: Duration,
    slots: Vec<Mutex<Option<(usize, Instant)>>>,
}

/// A sample past the timeout: the worker, the sample, how long it has waited.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Overdue {
    pub(crate) worker: usize,
    pub(crate) index: usize,
    pub(crate) waited: Duration,
}

impl Watch {
    pub(crate) fn new(timeout: Duration, workers: usize) -> Watch {
        Watch {
            timeout,
            slots: (0..workers).map(|_| Mutex::new(None)).collect(),
        }
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How often the consumer looks: a tenth of the timeout, within 1 ms and 100 ms.
    pub(crate) fn tick(&self) -> Duration {
        (self.timeout / 10).clamp(Duration::from_millis(1), Duration::from_millis(100))
    }

    /// Worker `worker` starts loading sample `index`.
    pub(crate) fn begin(&self, worker: usize, index: usize) {
        if let Some(slot) = self.slots.get(worker) {
            *lock(slot) = Some((index, Instant::now()));
        }
    }

    /// Worker `worker` is done with its sample.
    pub(crate) fn end(&self, worker: usize) {
        if let Some(slot) = self.slots.get(worker) {
            *lock(slot) = None;
        }
    }

    /// Whether worker `worker` is loading a sample past the timeout.
    pub(crate) fn is_overdue(&self, worker: usize) -> bool {
        self.slots.get(worker).is_some_and(|slot| {
            lock(slot).is_some_and(|(_, since)| since.elapsed() >= self.timeout)
        })
    }

    /// The sample that has waited longest, if it is past the timeout.
    pub(crate) fn overdue(&self) -> Option<Overdue> {
        let now = Instant::now();
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(worker, slot)| {
                lock(slot).map(|(index, since)| Overdue {
                    worker,
                    index,
                    waited: now.saturating_duration_since(since),
                })
            })
            .filter(|o| o.waited >= self.timeout)
            .max_by_key(|o| o.waited)
    }
}

/// The threads of ended epochs that were still inside a call when their epoch ended.
#[derive(Clone, Default)]
pub(crate) struct Abandoned(Arc<Mutex<Vec<JoinHandle<()>>>>);

impl Abandoned {
    pub(crate) fn keep(&self, handle: JoinHandle<()>) {
        lock(&self.0).push(handle);
    }

    /// Joins those that have ended; returns how many still run.
    pub(crate) fn reap(&self) -> usize {
        let mut held = lock(&self.0);
        let (done, running): (Vec<_>, Vec<_>) = held.drain(..).partition(|h| h.is_finished());
        *held = running;
        for h in done {
            // An abandoned worker's panics were caught in it; a join error has nobody to go to.
            let _ = h.join();
        }
        held.len()
    }
}
