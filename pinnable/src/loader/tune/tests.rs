//! The tuner against simulated stage rates: a consumer that takes batches at its own pace, and
//! workers that each make batches at theirs, up to a shared ceiling (a disk, a network link)
//! beyond which more workers add nothing, or cost. Each case draws its rates fresh (the seed is
//! printed) and runs the tuner window by window, as the pipeline does.

use std::time::Duration;

use super::{Tuner, WINDOW, WINDOW_BATCHES, Window};
use crate::loader::SplitMix64;

/// A simulated epoch: the stages' rates in batches per second.
#[derive(Clone, Copy, Debug)]
struct Stages {
    /// What one worker makes alone.
    per_worker: f64,
    /// What the consumer takes when never starved.
    consumer: f64,
    /// What all workers together can make at most (a shared resource), if bounded.
    ceiling: f64,
    /// Workers past which each one more costs this share of the rate (contention), if any.
    knee: Option<(usize, f64)>,
}

impl Stages {
    /// Workers that share a resource: together they make at most `knee` workers' worth, and
    /// each one past the knee costs `cost` of the rate; the consumer never binds.
    fn contended(per_worker: f64, knee: usize, cost: f64) -> Stages {
        Stages {
            per_worker,
            consumer: per_worker * 100.0,
            ceiling: per_worker * knee as f64,
            knee: Some((knee, cost)),
        }
    }

    /// The best rate any count from 1 to `max` delivers at.
    fn best(&self, max: usize) -> f64 {
        (1..=max).map(|w| self.rate(w)).fold(0.0f64, f64::max)
    }

    /// The rate `workers` workers deliver at.
    fn rate(&self, workers: usize) -> f64 {
        let mut made = (workers as f64 * self.per_worker).min(self.ceiling);
        if let Some((knee, cost)) = self.knee
            && workers > knee
        {
            made *= (1.0 - cost).powi((workers - knee) as i32);
        }
        made.min(self.consumer)
    }

    /// One window at `workers`, its rate off by up to `noise` either way.
    fn window(&self, workers: usize, noise: f64, r: &mut SplitMix64) -> Window {
        let jitter = 1.0 + noise * (2.0 * unit(r) - 1.0);
        let rate = (self.rate(workers) * jitter).min(self.consumer);
        // A window lasts WINDOW and WINDOW_BATCHES batches at least, as in the pipeline.
        let elapsed = WINDOW.max(Duration::from_secs_f64(WINDOW_BATCHES as f64 / rate));
        let secs = elapsed.as_secs_f64();
        let batches = (rate * secs).round().max(1.0) as u64;
        // The consumer waits for whatever its own pace leaves.
        let waited = secs * (1.0 - rate / self.consumer).max(0.0);
        // Each batch costs a worker 1/per_worker seconds (more past a shared ceiling: they
        // wait on it, busy).
        let busy = (batches as f64 / self.per_worker).min(workers as f64 * secs);
        let busy = if rate < self.consumer * 0.99 && workers as f64 * self.per_worker > rate {
            workers as f64 * secs
        } else {
            busy
        };
        Window {
            elapsed,
            batches,
            waited: Duration::from_secs_f64(waited),
            busy: Duration::from_secs_f64(busy),
        }
    }
}

fn unit(r: &mut SplitMix64) -> f64 {
    (r.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

fn between(r: &mut SplitMix64, lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * unit(r)
}

/// Runs `windows` windows; the worker counts after each, and every decision's worker change.
fn run(
    tuner: &mut Tuner,
    stages: impl Fn(usize) -> Stages,
    windows: usize,
    noise: f64,
    r: &mut SplitMix64,
) -> (Vec<usize>, Vec<(usize, usize, usize)>) {
    let mut counts = Vec::with_capacity(windows);
    let mut changes = Vec::new();
    for k in 0..windows {
        let w = stages(k).window(tuner.workers(), noise, r);
        if std::env::var("TUNE_TRACE").is_ok() {
            eprintln!("{k} w{} {:?} {:?}", tuner.workers(), w, tuner.phase);
        }
        if let Some(d) = tuner.observe(&w, WINDOW * k as u32) {
            assert!(!d.reason.is_empty());
            changes.push((k, d.workers.0, d.workers.1));
        }
        let (max_w, max_p) = tuner.limits();
        assert!(
            (1..=max_w).contains(&tuner.workers()),
            "window {k}: {} workers, limit {max_w}",
            tuner.workers()
        );
        assert!(tuner.prefetch() <= max_p.max(2), "window {k}");
        counts.push(tuner.workers());
    }
    (counts, changes)
}

/// The share of the windows from `from` on spent trying other counts: a climb's changes come
/// a window or two apart, and it lasts from its first change to its last and one more.
fn trying_share(changes: &[(usize, usize, usize)], from: usize, windows: usize) -> f64 {
    let mut trying = 0;
    let mut episode: Option<(usize, usize)> = None;
    for c in changes.iter().filter(|c| c.0 >= from) {
        episode = match episode {
            Some((first, last)) if c.0 <= last + 3 => Some((first, c.0)),
            Some((first, last)) => {
                trying += last - first + 2;
                Some((c.0, c.0))
            }
            None => Some((c.0, c.0)),
        };
    }
    if let Some((first, last)) = episode {
        trying += last - first + 2;
    }
    trying as f64 / (windows - from) as f64
}

/// Whether window `k` is held at a count: no change in it or the two before it (a probe of one
/// worker more, and its settling window, are not).
fn steady(k: usize, changes: &[(usize, usize, usize)]) -> bool {
    !changes.iter().any(|c| c.0 <= k && k <= c.0 + 2)
}

/// Checks that every window from `from` on that is held at a count (see [`steady`]) runs at
/// `floor` or more, `rate` giving each count's rate; `what` names the case.
fn held_at_least(
    rate: impl Fn(usize) -> f64,
    floor: f64,
    counts: &[usize],
    changes: &[(usize, usize, usize)],
    from: usize,
    what: &str,
) {
    for (k, &count) in counts.iter().enumerate().skip(from) {
        if steady(k, changes) {
            assert!(
                rate(count) >= floor,
                "{what}: window {k}: {count} workers at {:.1}/s, under {floor:.1}/s: {changes:?}",
                rate(count)
            );
        }
    }
}

/// Checks that the climb is over within the first seconds and that the count then holds:
/// after window `from`, at most `most` of the windows are spent trying other counts (a load at the
/// edge of a count may reopen the climb now and then, each time twice as late when it finds
/// nothing), and the count never goes back and forth.
fn holds(changes: &[(usize, usize, usize)], from: usize, windows: usize, most: f64, case: usize) {
    let share = trying_share(changes, from, windows);
    assert!(
        share <= most,
        "case {case}: {:.1}% of the windows after window {from} spent trying counts: {changes:?}",
        100.0 * share
    );
    // A change every 1.5 s at most, on average.
    let late = changes.iter().filter(|c| c.0 >= from).count();
    assert!(
        late <= 24.max((windows - from) / 15),
        "case {case}: {late} changes after window {from}: {changes:?}"
    );
}

#[test]
fn a_slow_worker_stage_gets_workers_until_the_consumer_is_fed() {
    let mut r = SplitMix64::for_test("a_slow_worker_stage_gets_workers_until_the_consumer_is_fed");
    for case in 0..50 {
        let per_worker = between(&mut r, 20.0, 200.0);
        let need = 2 + r.below(12) as usize; // workers that feed the consumer
        let max = need + 2 + r.below(8) as usize;
        let stages = Stages {
            per_worker,
            consumer: per_worker * (need as f64 - 0.5),
            ceiling: f64::INFINITY,
            knee: None,
        };
        let mut tuner = Tuner::new(None, None, max, 1);
        let (counts, changes) = run(&mut tuner, |_| stages, 400, 0.03, &mut r);
        // Within 4 s (40 windows) the consumer is fed, and stays fed.
        let what = format!("case {case}: {need} workers feed the consumer");
        held_at_least(
            |w| stages.rate(w),
            0.9 * stages.consumer,
            &counts,
            &changes,
            40,
            &what,
        );
        assert!(counts.iter().all(|&c| c <= max), "case {case}");
        holds(&changes, 40, counts.len(), 0.1, case);
    }
}

#[test]
fn a_shared_ceiling_stops_the_climb_where_more_workers_add_nothing() {
    let mut r =
        SplitMix64::for_test("a_shared_ceiling_stops_the_climb_where_more_workers_add_nothing");
    for case in 0..50 {
        let per_worker = between(&mut r, 50.0, 150.0);
        let knee = 2 + r.below(8) as usize;
        let cost = between(&mut r, 0.0, 0.1);
        let stages = Stages::contended(per_worker, knee, cost);
        let max = 32;
        let mut tuner = Tuner::new(None, None, max, 2);
        let (counts, changes) = run(&mut tuner, |_| stages, 400, 0.02, &mut r);
        let best = stages.best(max);
        // Within 4 s the count gives nearly the best rate, and is not far past the knee.
        let what = format!("case {case}: knee {knee}, cost {cost:.2}");
        held_at_least(|w| stages.rate(w), 0.9 * best, &counts, &changes, 40, &what);
        let count = *counts.last().unwrap();
        assert!(
            count <= 2 * knee,
            "case {case}: {count} workers past a knee at {knee}: {changes:?}"
        );
        holds(&changes, 40, counts.len(), 0.1, case);
    }
}

#[test]
fn a_start_past_a_contended_knee_comes_down_to_it() {
    // A shared resource (a decoder's engines, a lock) that every worker past the knee slows
    // down, and a start above the knee: more workers only lose, fewer gain.
    let mut r = SplitMix64::for_test("a_start_past_a_contended_knee_comes_down_to_it");
    for case in 0..50 {
        let per_worker = between(&mut r, 50.0, 150.0);
        let knee = 1 + r.below(3) as usize;
        let cost = between(&mut r, 0.08, 0.2);
        let stages = Stages::contended(per_worker, knee, cost);
        let start = knee + 2 + r.below(5) as usize;
        let max = 14;
        let mut tuner = Tuner::new(None, None, max, start);
        let (counts, changes) = run(&mut tuner, |_| stages, 400, 0.02, &mut r);
        let best = stages.best(max);
        let what = format!("case {case}: knee {knee}, cost {cost:.2}, start {start}");
        held_at_least(|w| stages.rate(w), 0.9 * best, &counts, &changes, 40, &what);
        let count = *counts.last().unwrap();
        assert!(
            count < start && count <= knee + 1,
            "case {case}: {count} workers, started at {start}, knee at {knee}: {changes:?}"
        );
        holds(&changes, 40, counts.len(), 0.1, case);
    }
}

#[test]
fn a_plateau_under_noise_is_not_left_for_fewer_workers() {
    // More workers add nothing past a ceiling, fewer lose their share: the try of fewer comes
    // back, whatever a noisy window says.
    let mut r = SplitMix64::for_test("a_plateau_under_noise_is_not_left_for_fewer_workers");
    for case in 0..50 {
        let per_worker = between(&mut r, 50.0, 150.0);
        let stages = Stages {
            per_worker,
            consumer: per_worker * 100.0,
            ceiling: per_worker * between(&mut r, 1.5, 4.0),
            knee: None,
        };
        let mut tuner = Tuner::new(None, None, 14, 4);
        let (counts, changes) = run(&mut tuner, |_| stages, 400, 0.1, &mut r);
        let best = stages.rate(14);
        let what = format!("case {case}: a plateau at {best:.1}/s");
        held_at_least(
            |w| stages.rate(w),
            0.85 * best,
            &counts,
            &changes,
            40,
            &what,
        );
        // (How often it tries one worker more on a plateau this noisy is
        // `noise_alone_never_makes_it_oscillate`'s to bound.)
    }
}

#[test]
fn a_loader_that_starts_at_its_limit_comes_back_to_it() {
    // Per-device loaders share the cores: one may start at its limit, bound by its workers.
    let mut r = SplitMix64::for_test("a_loader_that_starts_at_its_limit_comes_back_to_it");
    for case in 0..50 {
        let per_worker = between(&mut r, 20.0, 200.0);
        let stages = Stages {
            per_worker,
            consumer: per_worker * 100.0,
            ceiling: f64::INFINITY,
            knee: None,
        };
        let limit = 2 + r.below(4) as usize;
        let mut tuner = Tuner::new(None, None, limit, limit);
        let (counts, changes) = run(&mut tuner, |_| stages, 200, 0.03, &mut r);
        assert!(
            counts.iter().skip(20).all(|&c| c == limit),
            "case {case}: limit {limit}: {changes:?}"
        );
    }
}

#[test]
fn a_rate_that_changes_mid_epoch_is_followed_then_held() {
    let mut r = SplitMix64::for_test("a_rate_that_changes_mid_epoch_is_followed_then_held");
    for case in 0..30 {
        let per_worker = between(&mut r, 50.0, 150.0);
        let need = 2 + r.below(4) as usize;
        let slower = between(&mut r, 2.5, 4.0); // the samples become this much slower
        let at = 100 + r.below(100) as usize;
        let fast = Stages {
            per_worker,
            consumer: per_worker * (need as f64 - 0.5),
            ceiling: f64::INFINITY,
            knee: None,
        };
        let slow = Stages {
            per_worker: per_worker / slower,
            ..fast
        };
        let max = 32;
        let mut tuner = Tuner::new(None, None, max, 1);
        let (counts, changes) = run(
            &mut tuner,
            |k| if k < at { fast } else { slow },
            at + 400,
            0.03,
            &mut r,
        );
        // The count held before the change (not a probe's).
        let before = (0..at)
            .rev()
            .find(|&k| steady(k, &changes))
            .map_or(counts[at - 1], |k| counts[k]);
        let after = *counts.last().unwrap();
        assert!(
            after > before || slow.rate(before) >= 0.9 * slow.consumer,
            "case {case}: {before} workers before the change, {after} after: {changes:?}"
        );
        // Within 4 s of the change the slower samples have the workers that feed the consumer.
        let what = format!("case {case}: the consumer fed after the change at {at}");
        held_at_least(
            |w| slow.rate(w),
            0.9 * slow.consumer,
            &counts,
            &changes,
            at + 40,
            &what,
        );
        holds(&changes, at + 40, counts.len(), 0.1, case);
    }
}

#[test]
fn a_straggler_changes_nothing_once_settled() {
    let mut r = SplitMix64::for_test("a_straggler_changes_nothing_once_settled");
    for case in 0..30 {
        let per_worker = between(&mut r, 50.0, 150.0);
        let need = 2 + r.below(6) as usize;
        let stages = Stages {
            per_worker,
            consumer: per_worker * (need as f64 - 0.5),
            ceiling: f64::INFINITY,
            knee: None,
        };
        let mut tuner = Tuner::new(None, None, 32, 1);
        run(&mut tuner, |_| stages, 100, 0.02, &mut r);
        let settled_at = tuner.workers();
        // Now and then one window in which a single sample took most of it.
        for k in 0..400 {
            let mut w = stages.window(tuner.workers(), 0.02, &mut r);
            if k % 37 == 0 {
                w.waited = w.elapsed.mul_f64(0.9);
                w.batches = 1;
            }
            assert_eq!(
                tuner.observe(&w, WINDOW * k),
                None,
                "case {case}, window {k}"
            );
        }
        assert_eq!(tuner.workers(), settled_at, "case {case}");
    }
}

#[test]
fn noise_alone_never_makes_it_oscillate() {
    let mut r = SplitMix64::for_test("noise_alone_never_makes_it_oscillate");
    for case in 0..30 {
        let per_worker = between(&mut r, 50.0, 150.0);
        let need = 2 + r.below(10) as usize;
        let stages = Stages {
            per_worker,
            consumer: per_worker * (need as f64 - 0.5),
            ceiling: per_worker * between(&mut r, 2.0, 14.0),
            knee: Some((2 + r.below(10) as usize, 0.03)),
        };
        let mut tuner = Tuner::new(None, None, 24, 2);
        let (counts, changes) = run(&mut tuner, |_| stages, 2000, 0.08, &mut r);
        // Noisier than the others: a little more time trying counts.
        holds(&changes, 40, counts.len(), 0.15, case);
        let _ = counts;
    }
}

#[test]
fn fixed_knobs_are_never_changed_and_limits_hold() {
    let mut r = SplitMix64::for_test("fixed_knobs_are_never_changed_and_limits_hold");
    for case in 0..30 {
        let per_worker = between(&mut r, 20.0, 100.0);
        let stages = Stages {
            per_worker,
            consumer: per_worker * 50.0,
            ceiling: f64::INFINITY,
            knee: None,
        };
        let fixed = 1 + r.below(6) as usize;
        let max = 2 + r.below(10) as usize;

        // Workers by hand: nothing changes, however starved the consumer.
        let mut tuner = Tuner::new(Some(fixed), None, max, 1);
        let (counts, changes) = run(&mut tuner, |_| stages, 100, 0.02, &mut r);
        assert!(counts.iter().all(|&c| c == fixed), "case {case}");
        assert!(changes.is_empty(), "case {case}: {changes:?}");
        assert_eq!(
            tuner.prefetch(),
            fixed.max(2),
            "case {case}: ahead follows the workers"
        );

        // Batches ahead by hand: the workers climb to the limit (or one short of it: one
        // worker of many adds little), batches ahead stay.
        let ahead = r.below(5) as usize;
        let mut tuner = Tuner::new(None, Some(ahead), max, 1);
        let (counts, _) = run(&mut tuner, |_| stages, 100, 0.02, &mut r);
        let last = *counts.last().unwrap();
        assert!(
            last + 1 >= max,
            "case {case}: {last} workers, the limit {max}"
        );
        assert!(counts.iter().all(|&c| c <= max), "case {case}");
        assert_eq!(tuner.prefetch(), ahead, "case {case}");

        // Both by hand: no tuning at all.
        let mut tuner = Tuner::new(Some(fixed), Some(ahead), max, 1);
        assert!(!tuner.is_auto());
        let (_, changes) = run(&mut tuner, |_| stages, 20, 0.02, &mut r);
        assert!(changes.is_empty(), "case {case}");
    }
}
