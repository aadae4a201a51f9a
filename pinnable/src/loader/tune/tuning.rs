//! The consumer's side of the tuning: windows cut from a running epoch's counters.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Tuner, WINDOW, WINDOW_BATCHES, Window};
use crate::loader::stats::Counters;

/// The consumer's side of the tuning in a running epoch: it cuts the epoch into windows and
/// hands each to the loader's [`Tuner`].
pub(crate) struct Tuning {
    tuner: Arc<Mutex<Tuner>>,
    /// When the current window began, and the counters then: batches, wait and busy time.
    mark: (Instant, u64, Duration, Duration),
    /// Whether the loader's first window is still to come: it holds the pipeline's first fill
    /// (the consumer waits for the first batches whatever the count), so it is not judged.
    filling: bool,
    /// What the last epoch measured of the current window.
    carried: Window,
}

impl Tuning {
    pub(crate) fn new(tuner: Arc<Mutex<Tuner>>, counters: &Counters) -> Tuning {
        let carried = tuner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .carried
            .take();
        Tuning {
            tuner,
            mark: Self::now(counters),
            filling: carried.is_none(),
            carried: carried.unwrap_or_default(),
        }
    }

    /// The current window so far (what the last epoch carried over and this one's part), and
    /// the counters now.
    fn so_far(&self, counters: &Counters) -> (Window, (Instant, u64, Duration, Duration)) {
        let now = Self::now(counters);
        let c = &self.carried;
        let window = Window {
            elapsed: c.elapsed + (now.0 - self.mark.0),
            batches: c.batches + (now.1 - self.mark.1),
            waited: c.waited + now.2.saturating_sub(self.mark.2),
            busy: c.busy + now.3.saturating_sub(self.mark.3),
        };
        (window, now)
    }

    /// The epoch ends: the window it was in goes on in the next epoch.
    pub(crate) fn end(self, counters: &Counters) {
        let (window, _) = self.so_far(counters);
        let mut tuner = self.tuner.lock().unwrap_or_else(|e| e.into_inner());
        // After the loader's first epoch, the next window is judged with its fill in it:
        // epochs too short for a window are mostly fill.
        tuner.carried = Some(if self.filling {
            Window::default()
        } else {
            window
        });
    }

    fn now(counters: &Counters) -> (Instant, u64, Duration, Duration) {
        let (batches, waited, busy) = counters.progress();
        (Instant::now(), batches, waited, busy)
    }

    /// After each batch the consumer takes: once a window is complete, the tuner's decision on
    /// it, if any — the new worker count and batches ahead — noted in `counters`.
    pub(crate) fn tick(&mut self, counters: &Counters) -> Option<(usize, usize)> {
        #[cfg(test)]
        {
            let mut tuner = self.tuner.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(d) = tuner.chaos_step(counters.age()) {
                let knobs = (tuner.workers(), tuner.prefetch());
                drop(tuner);
                counters.decided(d, knobs.0, knobs.1);
                return Some(knobs);
            }
        }
        let (window, now) = self.so_far(counters);
        if window.elapsed < WINDOW || window.batches < WINDOW_BATCHES {
            return None;
        }
        self.mark = now;
        self.carried = Window::default();
        if std::mem::take(&mut self.filling) {
            return None;
        }
        let mut tuner = self.tuner.lock().unwrap_or_else(|e| e.into_inner());
        let decision = tuner.observe(&window, counters.age())?;
        let knobs = (tuner.workers(), tuner.prefetch());
        drop(tuner);
        counters.decided(decision, knobs.0, knobs.1);
        Some(knobs)
    }
}
