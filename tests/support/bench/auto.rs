//! The benches' auto rows: beside the rows at worker counts set by hand, one whose worker count
//! and batches ahead the loader tunes, run on the same workload in the same process so that it
//! reads against the best hand-tuned row.
//!
//! `PINNABLE_BENCH_WORKERS` lists the rows' worker counts, `auto` (or `0`) among them for the
//! auto row (`4,8,auto`); a bench's default list ends with it. An auto row's loader first runs
//! [`SETTLE`] of untimed epochs ([`settle`]), as a training run's first seconds would, and is
//! then timed as the other rows are; [`Tuning`] says where the tuning left the knobs and how
//! long it took to get there.

use std::fmt;
use std::time::{Duration, Instant};

use pinnable::ToDevice;
use pinnable::loader::{Batcher, EpochStats, Loader, LoaderBuilder, Source};

/// The worker count of an auto row: the loader tunes its workers and batches ahead.
pub const AUTO: usize = 0;

/// How long an auto row's loader runs untimed before its timed epoch, for its tuning to settle.
pub const SETTLE: Duration = Duration::from_secs(3);

/// One item of a worker list: a number, or `auto` (any case) for [`AUTO`], as is `0`; `None`
/// when it is neither.
///
/// ```
/// use pinnable_harness::bench::{AUTO, parse_worker};
///
/// assert_eq!(parse_worker(" 8"), Some(8));
/// assert_eq!(parse_worker("auto"), Some(AUTO));
/// assert_eq!(parse_worker("0"), Some(AUTO));
/// assert_eq!(parse_worker("8:0.06"), None);
/// ```
pub fn parse_worker(item: &str) -> Option<usize> {
    let item = item.trim();
    if item.eq_ignore_ascii_case("auto") {
        Some(AUTO)
    } else {
        item.parse().ok()
    }
}

/// A comma-separated list of worker counts (`4,8,auto`), each item read by [`parse_worker`];
/// items that are neither a number nor `auto` are left out.
///
/// ```
/// use pinnable_harness::bench::{AUTO, parse_workers};
///
/// assert_eq!(parse_workers("4, 8,auto"), vec![4, 8, AUTO]);
/// assert_eq!(parse_workers("2,x,0"), vec![2, AUTO]);
/// ```
pub fn parse_workers(list: &str) -> Vec<usize> {
    list.split(',').filter_map(parse_worker).collect()
}

/// The worker counts of a bench's rows: `PINNABLE_BENCH_WORKERS` when set ([`parse_workers`]),
/// else `defaults` followed by [`AUTO`].
pub fn worker_counts(defaults: impl IntoIterator<Item = usize>) -> Vec<usize> {
    match std::env::var("PINNABLE_BENCH_WORKERS") {
        Ok(list) => parse_workers(&list),
        Err(_) => defaults
            .into_iter()
            .filter(|&w| w != AUTO)
            .chain([AUTO])
            .collect(),
    }
}

/// A row's worker count in a table's workers column: `8`, or `auto`.
pub fn workers_cell(workers: usize) -> String {
    if workers == AUTO {
        "auto".into()
    } else {
        workers.to_string()
    }
}

/// A row's worker count in its label: `8 workers`, or `auto`.
pub fn workers_label(workers: usize) -> String {
    if workers == AUTO {
        "auto".into()
    } else {
        format!("{workers} workers")
    }
}

/// A row's worker count (and batches ahead) on a [`LoaderBuilder`]: set by hand, or for
/// [`AUTO`] left unset, for the loader to tune.
pub trait WorkersOrAuto: Sized {
    /// `workers` workers, fixed; for [`AUTO`], the count left to the tuning.
    #[must_use]
    fn workers_or_auto(self, workers: usize) -> Self;

    /// `workers` workers and `prefetch` batches ahead, both fixed; for [`AUTO`] workers, both
    /// left to the tuning.
    #[must_use]
    fn workers_prefetch_or_auto(self, workers: usize, prefetch: usize) -> Self;
}

impl<S> WorkersOrAuto for LoaderBuilder<S> {
    fn workers_or_auto(self, workers: usize) -> Self {
        if workers == AUTO {
            self
        } else {
            self.workers(workers)
        }
    }

    fn workers_prefetch_or_auto(self, workers: usize, prefetch: usize) -> Self {
        if workers == AUTO {
            self
        } else {
            self.workers(workers).prefetch(prefetch)
        }
    }
}

/// Runs untimed epochs of `loader` (epochs 1, 2, …), each batch given to `consume`, until
/// [`SETTLE`] has passed (the epoch running then is cut short), so that an auto row's tuning
/// settles before its timed epoch, which starts where these left the knobs. Their figures, for
/// [`Tuning::new`].
///
/// # Errors
///
/// An epoch's or `consume`'s first error.
pub fn settle<S, B>(
    loader: &Loader<S, B>,
    mut consume: impl FnMut(B::Batch) -> pinnable::Result<()>,
) -> pinnable::Result<Vec<EpochStats>>
where
    S: Source,
    B: Batcher<S::Sample> + 'static,
    B::Batch: ToDevice + 'static,
{
    let start = Instant::now();
    let mut epochs = Vec::new();
    for k in 1.. {
        let mut epoch = loader.run_epoch(k);
        while start.elapsed() < SETTLE {
            match epoch.next() {
                Some(batch) => consume(batch?)?,
                None => break,
            }
        }
        epochs.push(epoch.stats());
        if start.elapsed() >= SETTLE {
            break;
        }
    }
    Ok(epochs)
}

/// What the loader's tuning did in an auto row: where it left the worker count and batches
/// ahead, and its decisions before and in the timed epoch (how many, and when the last came).
#[derive(Clone, Debug, PartialEq)]
pub struct Tuning {
    /// Workers at the end of the timed epoch (or of its window, where the epoch runs on).
    pub workers: usize,
    /// Batches ahead, likewise.
    pub prefetch: usize,
    /// The untimed epochs' wall time, in all.
    pub untimed: Duration,
    /// Decisions in the untimed epochs.
    pub settling: usize,
    /// When the last of them came, from the first untimed epoch's start.
    pub settled_at: Option<Duration>,
    /// Decisions in the timed epoch.
    pub timed: usize,
    /// When the last of them came, from the timed epoch's start.
    pub last_timed: Option<Duration>,
    /// Every decision, untimed and timed, each with its time from the first untimed epoch's
    /// start, as the loader's stats `Display` it.
    pub steps: Vec<String>,
}

impl Tuning {
    /// From the figures of the untimed epochs ([`settle`]) and of the timed epoch, taken at its
    /// end (or at the end of its window).
    pub fn new(settling: &[EpochStats], timed: &EpochStats) -> Tuning {
        // Each epoch's decisions, timed from the first untimed epoch's start.
        let step = |d: &pinnable::loader::Decision, epoch_start: Duration| {
            let mut d = d.clone();
            d.at += epoch_start;
            d.to_string()
        };
        let (mut untimed, mut settled_at, mut steps) = (Duration::ZERO, None, Vec::new());
        for e in settling {
            steps.extend(e.tuning.iter().map(|d| step(d, untimed)));
            if let Some(d) = e.tuning.last() {
                settled_at = Some(untimed + d.at);
            }
            untimed += e.elapsed;
        }
        steps.extend(timed.tuning.iter().map(|d| step(d, untimed)));
        Tuning {
            workers: timed.workers,
            prefetch: timed.prefetch,
            untimed,
            settling: settling.iter().map(|e| e.tuning.len()).sum(),
            settled_at,
            timed: timed.tuning.len(),
            last_timed: timed.tuning.last().map(|d| d.at),
            steps,
        }
    }
}

impl fmt::Display for Tuning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} workers, {} batches ahead; {} tuning decision(s) in {:.1} s untimed",
            self.workers,
            self.prefetch,
            self.settling,
            self.untimed.as_secs_f64()
        )?;
        if let Some(at) = self.settled_at {
            write!(f, ", the last at {:.2} s", at.as_secs_f64())?;
        }
        match self.last_timed {
            Some(at) => write!(
                f,
                "; {} in the timed epoch, the last {:.2} s into it",
                self.timed,
                at.as_secs_f64()
            ),
            None => write!(f, "; none in the timed epoch"),
        }
    }
}

/// A bench row that may be an auto row: the [`Tuning`] it reports when it is one.
pub trait AutoRow {
    /// What the tuning did, in an auto row; `None` in a row set by hand.
    fn tuning(&self) -> Option<&Tuning>;
}

/// Keeps an auto row's tuning for the note under its table ([`auto_notes`]), as `what`; a row
/// set by hand, or one that failed, adds nothing.
pub fn keep_tuning<R: AutoRow>(
    notes: &mut Vec<(String, Tuning)>,
    what: impl Into<String>,
    row: &pinnable::Result<R>,
) {
    if let Some(t) = row.as_ref().ok().and_then(AutoRow::tuning) {
        notes.push((what.into(), t.clone()));
    }
}

/// What an auto row is, for the note under its table.
pub fn auto_note() -> String {
    format!(
        "auto: the worker count and batches ahead left to the loader's tuning (within its \
         default cores), timed after {} s of untimed epochs of the same loader",
        SETTLE.as_secs()
    )
}

/// The note under a table with auto rows, after a blank line: [`auto_note`], then each row's
/// [`Tuning`] under its label; `None` when there is none.
pub fn auto_notes(rows: &[(String, Tuning)]) -> Option<String> {
    if rows.is_empty() {
        return None;
    }
    let mut s = format!("\n{}; where the tuning left them:\n", auto_note());
    for (row, tuning) in rows {
        s.push_str(&format!("\n- {row}: {tuning}"));
        for step in &tuning.steps {
            s.push_str(&format!("\n  - {step}"));
        }
    }
    Some(s)
}
