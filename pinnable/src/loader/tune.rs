//! The worker count and the batches ahead, tuned while an epoch runs.
//!
//! The consumer's thread measures windows of the epoch (at least [`WINDOW`] and
//! [`WINDOW_BATCHES`] batches) from the counters the pipeline keeps anyway: the batches taken,
//! the consumer's wait, and the workers' busy time. From each window the [`Tuner`] decides:
//!
//! - **Climb.** While the consumer waits for data (more than [`STARVED`] of the window) and the
//!   workers are busy, add workers — half as many again, at least one — up to the limit, and
//!   try the new count for a window after one window to settle.
//! - **Keep or go back.** A step after which the consumer waits no more, or half as long, is
//!   kept, as is one that raised the rate by at least [`GAIN`] and by a third of what its
//!   added workers would add ideally ([`SHARE_OF_IDEAL`]); the climb goes on while the
//!   consumer still waits. One that did not is halved and tried again against the same rate,
//!   and a step of one worker that did not is undone: the count before it is where the tuner
//!   settles, since more workers only cost cores there (or slow a shared resource down, past
//!   its knee).
//! - **Settled.** Nothing changes while the load holds. A load that changes starts a new
//!   climb once [`REOPEN_OF`] of the last [`REOPEN_LAST`] windows show it: where the consumer
//!   was fed at the settled count, it waits again (and the count has been held for its
//!   patience, first [`REOPEN_LAST`] windows); where more workers did not help, the rate falls
//!   below [`REOPEN_DROP`] of the one it settled at (at once: that is no noise). A single
//!   slow sample (a straggler) makes one window wait, which reopens nothing. Where a step did
//!   not help and the consumer still waits on busy workers, one worker more is tried again
//!   once the patience has passed (a step judged while a remote stream was still ramping up,
//!   or on a noisy window, is not final). A reopened climb or a retry that ends where it
//!   began doubles the patience, so neither noise nor retries make the count go back and
//!   forth.
//!
//! Batches ahead follow the workers (a loader delivering in order wants about as many batches
//! ahead as workers: each one may finish while an older one is still being made), at least 2.
//! Either knob set by hand is never changed. No decision changes which samples make up a batch
//! or the order batches are delivered in: workers only take the next job in batch order.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::stats::Counters;

/// The worker count the first epoch starts from (fewer when fewer cores are allowed): low
/// enough that a shared resource's knee is found from below, high enough that a loader that
/// needs many workers reaches them in a few steps.
pub(crate) const START_WORKERS: usize = 4;
/// The shortest window a decision is made from.
pub(crate) const WINDOW: Duration = Duration::from_millis(100);
/// The fewest batches in a window.
pub(crate) const WINDOW_BATCHES: u64 = 16;
/// The share of a window the consumer may wait before the loader counts as too slow. Low: a
/// worker more than needed costs little (it waits for a free batch slot, idle), a consumer
/// that waits costs the training step.
const STARVED: f64 = 0.02;
/// The share of their time the workers must be busy for more of them to help.
const BUSY: f64 = 0.5;
/// The rate a step must add to be kept, at least.
const GAIN: f64 = 1.05;
/// The share of a step's ideal gain (its added workers over those before it) it must add to be
/// kept: a step that adds half the workers must add a sixth of the rate.
const SHARE_OF_IDEAL: f64 = 1.0 / 3.0;
/// The windows a settled tuner looks back on for a changed load.
const REOPEN_LAST: u32 = 8;
/// How many of them must show it.
const REOPEN_OF: u32 = 6;
/// After a step was undone: the share of the settled rate below which it climbs again.
const REOPEN_DROP: f64 = 0.75;

/// What one window of the epoch measured.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Window {
    /// The window's wall time.
    pub(crate) elapsed: Duration,
    /// Batches the consumer took in it.
    pub(crate) batches: u64,
    /// Time the consumer waited for data in it.
    pub(crate) waited: Duration,
    /// Time the workers spent loading and collating in it, summed over them.
    pub(crate) busy: Duration,
}

impl Window {
    fn rate(&self) -> f64 {
        self.batches as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn wait_share(&self) -> f64 {
        (self.waited.as_secs_f64() / self.elapsed.as_secs_f64().max(1e-9)).min(1.0)
    }

    fn busy_share(&self, workers: usize) -> f64 {
        self.busy.as_secs_f64() / (self.elapsed.as_secs_f64().max(1e-9) * workers.max(1) as f64)
    }
}

/// One change the tuner made to a loader's worker count or batches ahead, and why.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Decision {
    /// When, from the epoch's start.
    pub at: Duration,
    /// Worker count before and after.
    pub workers: (usize, usize),
    /// Batches ahead before and after.
    pub prefetch: (usize, usize),
    /// Why, in words.
    pub reason: String,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:.2} s: workers {} → {}, ahead {} → {}: {}",
            self.at.as_secs_f64(),
            self.workers.0,
            self.workers.1,
            self.prefetch.0,
            self.prefetch.1,
            self.reason
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// Adding workers while the consumer waits.
    Climb,
    /// Trying the current count against `from` workers, whose window had the rate `base` and
    /// the wait `base_wait`; the first window after the change is skipped (`settling`).
    Trial {
        from: usize,
        base: f64,
        base_wait: f64,
        settling: bool,
    },
    /// Holding; `rate` is the settled rate (smoothed over the windows since), `anchor` the rate
    /// it settled at (a load that changes moves away from it), `undone` whether the consumer
    /// still waits there (more workers did not help, or none may be added), `recent` which of
    /// the last windows (one bit each, the newest lowest) showed a changed load, `since` the
    /// windows held.
    Settled {
        rate: f64,
        anchor: f64,
        undone: bool,
        recent: u8,
        since: u32,
    },
}

/// The knobs of one loader and the state of their tuning.
#[derive(Clone, Debug)]
pub(crate) struct Tuner {
    workers: usize,
    max_workers: usize,
    workers_fixed: bool,
    prefetch: usize,
    max_prefetch: usize,
    prefetch_fixed: bool,
    phase: Phase,
    /// The windows a settled count is held before a changed load may reopen the climb:
    /// doubled each time a reopened climb ends where it began (noise, not a new load), back to
    /// [`REOPEN_LAST`] when one finds another count.
    patience: u32,
    /// The count a reopened climb began from, until it settles.
    reopened: Option<usize>,
    /// The part of a window the last epoch ended in, counted on in the next: epochs shorter
    /// than a window are tuned too.
    carried: Option<Window>,
    /// For tests: a random change after every batch instead of the tuning.
    #[cfg(test)]
    chaos: Option<crate::loader::SplitMix64>,
}

impl Tuner {
    /// `workers` and `prefetch` are `Some` when set by hand; `max_workers` bounds the worker
    /// count (the cores the loader may use), and batches ahead are bounded by as many. Starts
    /// at `start` workers (clamped to the bounds) unless they are fixed.
    pub(crate) fn new(
        workers: Option<usize>,
        prefetch: Option<usize>,
        max_workers: usize,
        start: usize,
    ) -> Tuner {
        let max_workers = workers.unwrap_or(max_workers).max(1);
        let w = workers.unwrap_or(start).clamp(1, max_workers);
        let max_prefetch = prefetch.unwrap_or(max_workers.max(2));
        let mut t = Tuner {
            workers: w,
            max_workers,
            workers_fixed: workers.is_some(),
            prefetch: prefetch.unwrap_or(2),
            max_prefetch,
            prefetch_fixed: prefetch.is_some(),
            phase: Phase::Climb,
            patience: REOPEN_LAST,
            reopened: None,
            carried: None,
            #[cfg(test)]
            chaos: None,
        };
        t.prefetch = t.prefetch_for(w);
        t
    }

    /// Whether either knob is left to the tuner.
    pub(crate) fn is_auto(&self) -> bool {
        !(self.workers_fixed && self.prefetch_fixed)
    }

    /// The worker count now.
    pub(crate) fn workers(&self) -> usize {
        self.workers
    }

    /// Batches ahead now.
    pub(crate) fn prefetch(&self) -> usize {
        self.prefetch
    }

    /// The most workers and batches ahead the tuner may set.
    pub(crate) fn limits(&self) -> (usize, usize) {
        (self.max_workers, self.max_prefetch)
    }

    /// Whether each knob was set by hand.
    pub(crate) fn fixed(&self) -> (bool, bool) {
        (self.workers_fixed, self.prefetch_fixed)
    }

    fn prefetch_for(&self, workers: usize) -> usize {
        if self.prefetch_fixed {
            self.prefetch
        } else {
            workers.clamp(2, self.max_prefetch.max(2))
        }
    }

    /// Learns from one window; a change to make, with its reason, when there is one.
    pub(crate) fn observe(&mut self, w: &Window, at: Duration) -> Option<Decision> {
        if !self.is_auto() || w.batches == 0 {
            return None;
        }
        let (rate, wait, busy) = (w.rate(), w.wait_share(), w.busy_share(self.workers));
        let starved = wait > STARVED;
        match self.phase {
            Phase::Climb => self.climb(rate, wait, busy, at, None),
            Phase::Trial {
                from,
                base,
                base_wait,
                settling,
            } => {
                if settling {
                    self.phase = Phase::Trial {
                        from,
                        base,
                        base_wait,
                        settling: false,
                    };
                    return None;
                }
                let added = self.workers.saturating_sub(from) as f64 / from.max(1) as f64;
                // Fed now, or waiting half as long as before (the rate of a window of few
                // batches moves in steps), or the rate up by the step's share of its ideal.
                let fed = !starved && rate > base;
                let halved = wait <= 0.5 * base_wait && rate >= base;
                let gained = rate >= base * (1.0 + (GAIN - 1.0).max(SHARE_OF_IDEAL * added));
                if fed || halved || gained {
                    let kept = format!(
                        "kept: {:.2}× the rate of {from} workers",
                        rate / base.max(1e-9)
                    );
                    self.phase = Phase::Climb;
                    // Still waiting: the next step at once, its reason saying this one held.
                    return self.climb(rate, wait, busy, at, Some(kept));
                }
                let tried = self.workers;
                let gave = format!(
                    "{tried} workers gave {:.2}× the rate of {from}",
                    rate / base.max(1e-9)
                );
                if tried > from + 1 {
                    // Too far, or the step past a knee: the half step, against the same rate.
                    let half = from + (tried - from) / 2;
                    self.phase = Phase::Trial {
                        from,
                        base,
                        base_wait,
                        settling: true,
                    };
                    return Some(self.set(half, at, format!("{gave}: trying {half}")));
                }
                self.settled(base, true, from);
                Some(self.set(from, at, format!("undone: {gave}; settled at {from}")))
            }
            Phase::Settled {
                rate: settled,
                anchor,
                undone,
                recent,
                since,
            } => {
                // Fed at the settled count: waiting again. Held where more workers did not
                // help: the rate falling well below what it settled at.
                let changed = starved && (!undone || rate < anchor * REOPEN_DROP);
                // The settled rate follows the windows', smoothed.
                let smoothed = 0.8 * settled + 0.2 * rate;
                let recent = (recent << 1) | u8::from(changed);
                let since = since.saturating_add(1);
                let reopen = recent.count_ones() >= REOPEN_OF;
                if self.can_add()
                    && since >= self.patience
                    && !reopen
                    && undone
                    && starved
                    && busy >= BUSY
                {
                    // Held where a step did not help, the consumer still waiting on busy
                    // workers: one worker more is tried again now and then (a step judged while
                    // the load was still changing, or on a noisy window, is not final), each
                    // time twice as late when it helps no more than before.
                    self.reopened = Some(self.workers);
                    self.phase = Phase::Trial {
                        from: self.workers,
                        base: smoothed,
                        base_wait: wait,
                        settling: true,
                    };
                    let why = format!(
                        "trying one more after {since} windows: the consumer still waits {:.0}% \
                         on workers {:.0}% busy",
                        100.0 * wait,
                        100.0 * busy.min(1.0)
                    );
                    return Some(self.set(self.workers + 1, at, why));
                }
                // A rate well below the settled one is no noise: it reopens at once; a fed
                // consumer waiting again reopens after the patience.
                if reopen && self.can_add() && (undone || since >= self.patience) {
                    let why = format!(
                        "the load changed: the consumer waited in {} of the last {REOPEN_LAST} \
                         windows, {:.0}% of this one, at {rate:.1} batches/s (settled at \
                         {settled:.1})",
                        recent.count_ones(),
                        100.0 * wait
                    );
                    self.phase = Phase::Climb;
                    self.reopened = Some(self.workers);
                    return self.climb(rate, wait, busy, at, Some(why));
                }
                self.phase = Phase::Settled {
                    rate: smoothed,
                    anchor,
                    undone,
                    recent,
                    since,
                };
                None
            }
        }
    }

    /// Holds at `workers` from here, with `rate` as the settled rate.
    fn settled(&mut self, rate: f64, undone: bool, workers: usize) {
        self.phase = Phase::Settled {
            rate,
            anchor: rate,
            undone,
            recent: 0,
            since: 0,
        };
        match self.reopened.take() {
            Some(began) if began == workers => self.patience = (self.patience * 2).min(256),
            Some(_) => self.patience = REOPEN_LAST,
            None => {}
        }
    }

    fn can_add(&self) -> bool {
        !self.workers_fixed && self.workers < self.max_workers
    }

    /// The climb's step from this window; `why` says what led here, when something did.
    fn climb(
        &mut self,
        rate: f64,
        wait: f64,
        busy: f64,
        at: Duration,
        why: Option<String>,
    ) -> Option<Decision> {
        let settle = |t: &mut Tuner, undone: bool| t.settled(rate, undone, t.workers);
        if wait <= STARVED {
            settle(self, false);
            return None;
        }
        if !self.can_add() || busy < BUSY {
            // The wait is not the workers' to fix (they are at the limit, or idle half the
            // time: the wait is elsewhere); hold here, as after a step that did not help.
            settle(self, true);
            return None;
        }
        let to = (self.workers + (self.workers / 2).max(1)).min(self.max_workers);
        self.phase = Phase::Trial {
            from: self.workers,
            base: rate,
            base_wait: wait,
            settling: true,
        };
        let mut reason = format!(
            "the consumer waited {:.0}% of the window with the workers {:.0}% busy",
            100.0 * wait,
            100.0 * busy.min(1.0)
        );
        if let Some(why) = why {
            reason = format!("{why}; {reason}");
        }
        Some(self.set(to, at, reason))
    }

    /// For tests: random decisions after every batch, from `seed`, when one is given.
    #[cfg(test)]
    pub(crate) fn with_chaos(mut self, seed: Option<u64>) -> Tuner {
        self.chaos = seed.map(crate::loader::SplitMix64::new);
        self
    }

    /// For tests: a random worker count and batches ahead within the limits, for the knobs not
    /// set by hand.
    #[cfg(test)]
    fn chaos_step(&mut self, at: Duration) -> Option<Decision> {
        let r = self.chaos.as_mut()?;
        let workers = 1 + r.below(self.max_workers as u64) as usize;
        let prefetch = r.below(self.max_prefetch as u64 + 1) as usize;
        let before = (self.workers, self.prefetch);
        if !self.workers_fixed {
            self.workers = workers;
        }
        if !self.prefetch_fixed {
            self.prefetch = prefetch;
        }
        Some(Decision {
            at,
            workers: (before.0, self.workers),
            prefetch: (before.1, self.prefetch),
            reason: "chaos".into(),
        })
    }

    fn set(&mut self, workers: usize, at: Duration, reason: String) -> Decision {
        let before = (self.workers, self.prefetch);
        self.workers = workers;
        self.prefetch = self.prefetch_for(workers);
        Decision {
            at,
            workers: (before.0, self.workers),
            prefetch: (before.1, self.prefetch),
            reason,
        }
    }
}

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

#[cfg(test)]
mod loader_tests;
#[cfg(test)]
mod tests;
