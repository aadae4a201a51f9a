//! The figure of a stream of batches: steady-state throughput over a window after the warm-up.
//!
//! A pipeline that cannot keep up has bimodal steps: most find a batch ready, a few wait long.
//! A median of steps drops the waits and reports a rate the pipeline never sustains. So every
//! stream figure the benches and examples print is the window's time divided by its batches,
//! with the consumer's wait over the same window; per-step percentiles are printed beside it,
//! never instead.

use std::fmt;
use std::time::{Duration, Instant};

use pinnable::loader::EpochStats;

/// Steady-state figures of a stream of batches: a window of `batches` consecutive steps after
/// the warm-up, each step ending when the consumer is done with its batch.
///
/// A step runs from the end of the previous step to the end of this one, so it holds the wait
/// for the batch and the consumer's own work, and the steps add up to the window.
#[derive(Clone, Debug, PartialEq)]
pub struct Throughput {
    /// Batches in the window.
    pub batches: usize,
    /// The window's wall time in seconds.
    pub window: f64,
    /// Seconds the consumer waited for data within the window, where a producer counts them
    /// (a loader's [`EpochStats::waited`]); `None` for a loop that makes its own batches.
    pub waited: Option<f64>,
    /// Bytes a batch carries.
    pub batch_bytes: usize,
    /// Step times in seconds: the 50th, 90th and 99th percentiles (nearest rank).
    pub steps: [f64; 3],
}

impl Throughput {
    /// Seconds a batch at the steady state: the window over its batches.
    pub fn per_batch(&self) -> f64 {
        self.window / self.batches as f64
    }

    /// Batch bytes per second at the steady state, in GB/s (10^9 bytes).
    pub fn gigabytes_per_second(&self) -> f64 {
        self.batch_bytes as f64 / self.per_batch() / 1e9
    }

    /// The consumer's wait as a share of the window, 0 to 1, where it was counted.
    pub fn wait_share(&self) -> Option<f64> {
        self.waited.map(|w| w / self.window)
    }

    /// The step percentiles, `p50 / p90 / p99 ms`.
    pub fn percentiles(&self) -> String {
        let [p50, p90, p99] = self.steps.map(|s| s * 1e3);
        format!("p50 {p50:.3} / p90 {p90:.3} / p99 {p99:.3} ms")
    }

    /// The consumer's wait over the window, `12.3%`, or `—` where it was not counted.
    pub fn wait(&self) -> String {
        self.wait_share()
            .map_or("—".into(), |w| format!("{:.1}%", 100.0 * w))
    }
}

impl fmt::Display for Throughput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:.3} ms a batch, {:.1} GB/s ({} batches in {:.1} ms",
            self.per_batch() * 1e3,
            self.gigabytes_per_second(),
            self.batches,
            self.window * 1e3
        )?;
        if self.waited.is_some() {
            write!(f, "; consumer waited {}", self.wait())?;
        }
        write!(f, "; steps {})", self.percentiles())
    }
}

/// Records the steps of a stream and gives its [`Throughput`] over the window after `warmup`
/// steps.
///
/// ```
/// use pinnable_harness::bench::Window;
///
/// let mut w = Window::new(2, 1 << 20);
/// for _ in 0..10 {
///     std::thread::sleep(std::time::Duration::from_millis(1)); // a step
///     w.step(None);
/// }
/// let t = w.finish();
/// assert_eq!(t.batches, 8);
/// assert!(t.per_batch() >= 1e-3);
/// println!("{t}");
/// ```
#[derive(Debug)]
pub struct Window {
    warmup: usize,
    batch_bytes: usize,
    seen: usize,
    /// The end of the last warm-up step, and the wait counted by then.
    start: Option<(Instant, Option<Duration>)>,
    last: Option<(Instant, Option<Duration>)>,
    steps: Vec<f64>,
}

impl Window {
    /// A window that opens at the end of the `warmup`-th step, of batches of `batch_bytes`
    /// bytes.
    ///
    /// # Panics
    ///
    /// If `warmup` is 0: the window opens at the end of a step, and the first step of a
    /// stream is never a steady one.
    pub fn new(warmup: usize, batch_bytes: usize) -> Window {
        assert!(
            warmup > 0,
            "a stream's window needs at least one warm-up step"
        );
        Window {
            warmup,
            batch_bytes,
            seen: 0,
            start: None,
            last: None,
            steps: Vec::new(),
        }
    }

    /// A step is done (the consumer is through with its batch). `waited` is the consumer's
    /// total wait so far where a producer counts it (a loader's [`EpochStats::waited`]).
    pub fn step(&mut self, waited: Option<Duration>) {
        self.step_at(Instant::now(), waited);
    }

    /// As [`step`](Self::step), with the loader's figures so far.
    pub fn step_with(&mut self, stats: &EpochStats) {
        self.step(Some(stats.waited));
    }

    fn step_at(&mut self, now: Instant, waited: Option<Duration>) {
        self.seen += 1;
        if let Some((last, _)) = self.start.and(self.last) {
            self.steps.push(now.duration_since(last).as_secs_f64());
        }
        if self.seen == self.warmup {
            self.start = Some((now, waited));
        }
        self.last = Some((now, waited));
    }

    /// The figures over the window: from the end of the last warm-up step to the end of the
    /// last step.
    ///
    /// # Panics
    ///
    /// If no step ended after the warm-up (a bench too short to measure), or the wait was
    /// counted at some steps and not others.
    pub fn finish(self) -> Throughput {
        let (Some((t0, w0)), Some((t1, w1))) = (self.start, self.last) else {
            panic!("no step ended after a warm-up of {}", self.warmup);
        };
        assert!(
            !self.steps.is_empty(),
            "no step ended after a warm-up of {} ({} steps in all)",
            self.warmup,
            self.seen
        );
        let waited = match (w0, w1) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a).as_secs_f64()),
            (None, None) => None,
            _ => panic!("the consumer's wait was counted at some steps and not others"),
        };
        let mut sorted = self.steps;
        sorted.sort_by(f64::total_cmp);
        Throughput {
            batches: sorted.len(),
            window: t1.duration_since(t0).as_secs_f64(),
            waited,
            batch_bytes: self.batch_bytes,
            steps: [0.50, 0.90, 0.99].map(|p| percentile(&sorted, p)),
        }
    }
}

/// The nearest-rank `p` percentile of ascending `sorted` (not empty).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Runs `warmup + batches` steps of a loop that makes its own batches (`step` returns when its
/// batch is done) and gives the throughput over the last `batches`.
///
/// # Panics
///
/// If `warmup` or `batches` is 0.
pub fn stream(
    warmup: usize,
    batches: usize,
    batch_bytes: usize,
    mut step: impl FnMut(),
) -> Throughput {
    let mut w = Window::new(warmup, batch_bytes);
    for _ in 0..warmup + batches {
        step();
        w.step(None);
    }
    w.finish()
}

/// Drives a loader's epoch to its end, giving each batch to `consume`, and gives the
/// throughput over the batches after the first `warmup`, with the consumer's wait over them.
///
/// # Errors
///
/// The epoch's or `consume`'s first error.
///
/// # Panics
///
/// If `warmup` is 0 or the epoch has no batch after the warm-up.
pub fn epoch<T>(
    mut epoch: pinnable::loader::Epoch<T>,
    warmup: usize,
    batch_bytes: usize,
    mut consume: impl FnMut(T) -> pinnable::Result<()>,
) -> pinnable::Result<(Throughput, EpochStats)> {
    let mut w = Window::new(warmup, batch_bytes);
    while let Some(batch) = epoch.next() {
        consume(batch?)?;
        w.step_with(&epoch.stats());
    }
    Ok((w.finish(), epoch.stats()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: f64) -> Duration {
        Duration::from_secs_f64(v / 1e3)
    }

    /// Steps of `times` ms, each with `waits` ms of waiting, after the window's start at 0.
    fn window(warmup: usize, times: &[f64], waits: &[f64]) -> Throughput {
        let t0 = Instant::now();
        let mut w = Window::new(warmup, 1_000_000);
        let (mut now, mut waited) = (0.0, 0.0);
        for (t, q) in times.iter().zip(waits) {
            now += t;
            waited += q;
            w.step_at(t0 + ms(now), Some(ms(waited)));
        }
        w.finish()
    }

    #[test]
    fn bimodal_steps_give_their_mean_not_their_median() {
        // 2 warm-up steps, then 9 fast steps and one long wait: the median is a fast step,
        // the throughput counts the wait.
        let mut times = vec![50.0, 50.0];
        times.extend([1.0; 9]);
        times.push(11.0);
        let mut waits = vec![40.0, 40.0];
        waits.extend([0.0; 9]);
        waits.push(10.0);
        let t = window(2, &times, &waits);
        assert_eq!(t.batches, 10);
        assert!((t.window - 0.020).abs() < 1e-6, "{t}");
        assert!((t.per_batch() - 0.002).abs() < 1e-7, "{t}");
        assert!((t.steps[0] - 0.001).abs() < 1e-6, "{t}");
        assert!((t.steps[2] - 0.011).abs() < 1e-6, "{t}");
        assert!((t.wait_share().unwrap() - 0.5).abs() < 1e-6, "{t}");
        assert!((t.gigabytes_per_second() - 0.5).abs() < 1e-4, "{t}");
        let shown = t.to_string();
        assert!(
            shown.starts_with(
                "2.000 ms a batch, 0.5 GB/s (10 batches in 20.0 ms; consumer waited 50.0%"
            ),
            "{shown}"
        );
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(
            [0.5, 0.9, 0.99].map(|p| percentile(&v, p)),
            [100.0, 180.0, 198.0]
        );
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
    }

    #[test]
    fn a_stream_of_its_own_batches_counts_no_wait() {
        let t = stream(1, 3, 8, || std::thread::sleep(Duration::from_millis(2)));
        assert_eq!((t.batches, t.waited), (3, None));
        assert!(t.per_batch() >= 0.002, "{t}");
        assert!(!t.to_string().contains("waited"), "{t}");
    }

    #[test]
    #[should_panic(expected = "no step ended after a warm-up of 4")]
    fn a_window_with_no_step_after_the_warm_up_is_refused() {
        window(4, &[1.0; 4], &[0.0; 4]);
    }
}
