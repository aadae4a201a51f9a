//! The worker count and the batches ahead, tuned while an epoch runs.
//!
//! The consumer's thread measures windows of the epoch (at least [`WINDOW`] and
//! [`WINDOW_BATCHES`] batches) from the counters the pipeline keeps anyway: the batches taken,
//! the consumer's wait, and the workers' busy time. From each window the [`Tuner`] decides:
//!
//! - **Climb.** While the consumer waits for data (more than [`STARVED`] of the window) and the
//!   workers are busy, add workers — half as many again, at least one — up to the limit, and
//!   try the new count over two windows (their mean: one window's rate moves with where it
//!   was cut) after one window to settle.
//! - **Keep or go back.** A step after which the consumer waits no more, or half as long, is
//!   kept, as is one that raised the rate by at least [`GAIN`] and by a third of what its
//!   added workers would add ideally ([`SHARE_OF_IDEAL`]); the climb goes on while the
//!   consumer still waits. One that did not is halved and tried again against the same rate,
//!   and a step of one worker that did not is undone: the count before it is where the tuner
//!   settles, since more workers only cost cores there (or slow a shared resource down, past
//!   its knee).
//! - **Fewer.** The loader's first climb starts from a count no window chose. Where it keeps
//!   no step up (more workers did not help, the workers idle while the consumer waits, or the
//!   start is the limit, as it can be for the loaders of one process that share its cores),
//!   half as many are tried, and fewer again while each try raises the rate by [`FEWER_GAIN`]:
//!   workers that share an engine, a lock or memory bandwidth can be faster fewer (two workers
//!   fed one H200's JPEG engines up to 1.17× faster than four). A try that lost the
//!   removed workers' share of the rate (nothing was contended) is undone at once; one that
//!   lost less is halved, like a step up, then undone, and the count settles.
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
use std::time::Duration;

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
/// The rate fewer workers must add to be kept: less than a step up must, since fewer workers
/// at the same rate cost fewer cores.
const FEWER_GAIN: f64 = 1.03;
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
    /// the wait `base_wait`; the first window after the change is skipped (`settling`), and the
    /// trial is judged on the mean of the two after it (`first` holds the first one's rate and
    /// wait): one window's rate moves by up to a tenth with where it was cut.
    /// `down`: the trial is of fewer workers.
    Trial {
        from: usize,
        base: f64,
        base_wait: f64,
        settling: bool,
        first: Option<(f64, f64)>,
        down: bool,
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

impl Phase {
    /// A trial of the count just set against `from` workers, whose rate and wait were `base`
    /// and `base_wait`: a window to settle first, then two to judge.
    fn trial(from: usize, base: f64, base_wait: f64, down: bool) -> Phase {
        Phase::Trial {
            from,
            base,
            base_wait,
            settling: true,
            first: None,
            down,
        }
    }
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
    /// The loader's first judged window, until the second: the first step is taken on both.
    first_window: Option<(f64, f64)>,
    /// Whether the climb under way may end in a trial of fewer workers: only the loader's
    /// first climb, from the start (a count no window chose), before it keeps a step up. Later
    /// climbs begin at a count the windows chose; fewer tried there would find noise.
    may_descend: bool,
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
            first_window: None,
            may_descend: true,
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
            // The first step's base is the mean of two windows too.
            Phase::Climb => match self.first_window.take() {
                Some((r, w)) => self.climb(0.5 * (r + rate), 0.5 * (w + wait), busy, at, None),
                None => {
                    self.first_window = Some((rate, wait));
                    None
                }
            },
            Phase::Trial {
                from,
                base,
                base_wait,
                settling,
                first,
                down,
            } => {
                let (first_rate, first_wait) = match (settling, first) {
                    (false, Some(first)) => first,
                    // The settling window, then the first judged one, kept for the mean.
                    (settling, _) => {
                        self.phase = Phase::Trial {
                            from,
                            base,
                            base_wait,
                            settling: false,
                            first: (!settling).then_some((rate, wait)),
                            down,
                        };
                        return None;
                    }
                };
                let rate = 0.5 * (first_rate + rate);
                let wait = 0.5 * (first_wait + wait);
                let starved = wait > STARVED;
                let added = self.workers.saturating_sub(from) as f64 / from.max(1) as f64;
                // Fed now, or waiting half as long as before (the rate of a window of few
                // batches moves in steps), or the rate up by the step's share of its ideal (for
                // fewer workers, by FEWER_GAIN).
                let fed = !starved && rate > base;
                let halved = wait <= 0.5 * base_wait && rate >= base;
                let gain = if down {
                    FEWER_GAIN
                } else {
                    1.0 + (GAIN - 1.0).max(SHARE_OF_IDEAL * added)
                };
                let gained = rate >= base * gain;
                if fed || halved || gained {
                    let kept = format!(
                        "kept: {:.2}× the rate of {from} workers",
                        rate / base.max(1e-9)
                    );
                    if down {
                        // Fewer helped: fewer again while the consumer still waits.
                        return self.descend(rate, wait, at, kept);
                    }
                    self.phase = Phase::Climb;
                    self.may_descend = false;
                    // Still waiting: the next step at once, its reason saying this one held.
                    return self.climb(rate, wait, busy, at, Some(kept));
                }
                let tried = self.workers;
                let gave = format!(
                    "{tried} workers gave {:.2}× the rate of {from}",
                    rate / base.max(1e-9)
                );
                // Fewer workers that lost their share of the rate (no contention to relieve):
                // no half step, straight back.
                let proportional = down && rate <= base * (tried as f64 / from as f64) * GAIN;
                if tried.abs_diff(from) > 1 && !proportional {
                    // Too far, or the step past a knee: the half step, against the same rate.
                    let half = if down {
                        from - (from - tried) / 2
                    } else {
                        from + (tried - from) / 2
                    };
                    self.phase = Phase::trial(from, base, base_wait, down);
                    return Some(self.set(half, at, format!("{gave}: trying {half}")));
                }
                if !down && self.may_descend && from > 1 {
                    // More did not help from a count no window chose: fewer may contend less
                    // for what they share (an engine, a lock, memory bandwidth).
                    return Some(self.try_fewer(
                        from,
                        base,
                        base_wait,
                        at,
                        format!("undone: {gave}"),
                    ));
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
                    self.phase = Phase::trial(self.workers, smoothed, wait, false);
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
        self.may_descend = false;
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
        if wait <= STARVED {
            self.settled(rate, false, self.workers);
            return None;
        }
        let more = self.can_add() && busy >= BUSY;
        // The wait is not more workers' to fix where they are at the limit, or idle half the
        // time (the wait is elsewhere). From a count no window chose, fewer are tried then
        // (they may contend less for what they share); else the count holds, as after a step
        // that did not help.
        let fewer = !more && self.may_descend && !self.workers_fixed && self.workers > 1;
        if !more && !fewer {
            self.settled(rate, true, self.workers);
            return None;
        }
        let mut reason = format!(
            "the consumer waited {:.0}% of the window with the workers {:.0}% busy{}",
            100.0 * wait,
            100.0 * busy.min(1.0),
            if self.can_add() { "" } else { " at the limit" }
        );
        if let Some(why) = why {
            reason = format!("{why}; {reason}");
        }
        if fewer {
            return Some(self.try_fewer(self.workers, rate, wait, at, reason));
        }
        let to = (self.workers + (self.workers / 2).max(1)).min(self.max_workers);
        self.phase = Phase::trial(self.workers, rate, wait, false);
        Some(self.set(to, at, reason))
    }

    /// Tries fewer workers than `from` (half as many, at least one fewer), against `from`'s window
    /// (`base`, `base_wait`); `why` says what led here.
    fn try_fewer(
        &mut self,
        from: usize,
        base: f64,
        base_wait: f64,
        at: Duration,
        why: String,
    ) -> Decision {
        let to = from - (from / 2).max(1);
        self.may_descend = false;
        self.phase = Phase::trial(from, base, base_wait, true);
        self.set(to, at, format!("{why}: trying {to}, fewer contend less"))
    }

    /// After fewer workers helped: fewer again while the consumer still waits, else hold.
    fn descend(&mut self, rate: f64, wait: f64, at: Duration, kept: String) -> Option<Decision> {
        if wait <= STARVED || self.workers == 1 {
            self.settled(rate, wait > STARVED, self.workers);
            // Nothing changes, but the step that led here is kept: no decision to report.
            return None;
        }
        let from = self.workers;
        Some(self.try_fewer(from, rate, wait, at, kept))
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

mod tuning;
pub(crate) use tuning::Tuning;

#[cfg(test)]
mod loader_tests;
#[cfg(test)]
mod tests;
