//! Per-epoch figures: where the time went (the consumer waiting for data, loading, collating,
//! moving) and how much pinned memory the loader held against its bound.

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use super::tune::Decision;
use crate::alloc::PinnedPool;

/// The live counters of one epoch, shared by its threads.
#[derive(Debug)]
pub(crate) struct Counters {
    started: Instant,
    finished_ns: AtomicU64,
    pub(crate) batches: AtomicU64,
    samples: AtomicU64,
    bytes: AtomicU64,
    wait_ns: AtomicU64,
    load_ns: AtomicU64,
    collate_ns: AtomicU64,
    write_ns: AtomicU64,
    transfer_ns: AtomicU64,
    largest_block: AtomicUsize,
    held_peak: AtomicUsize,
    /// The worker count and batches ahead now (tuned while the epoch runs, unless fixed).
    workers: AtomicUsize,
    prefetch: AtomicUsize,
    /// The most batches in flight the tuner may allow: the bound's batches, less the
    /// consumer's.
    slots: usize,
    /// The tuner's changes in this epoch, with their reasons.
    decisions: Mutex<Vec<Decision>>,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Counters {
    /// Counters for an epoch that starts with `workers` workers and `prefetch` batches ahead,
    /// and holds at most `slots` batches in flight whatever they are tuned to.
    pub(crate) fn new(workers: usize, prefetch: usize, slots: usize) -> Self {
        Counters {
            started: Instant::now(),
            finished_ns: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            samples: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
            load_ns: AtomicU64::new(0),
            collate_ns: AtomicU64::new(0),
            write_ns: AtomicU64::new(0),
            transfer_ns: AtomicU64::new(0),
            largest_block: AtomicUsize::new(0),
            held_peak: AtomicUsize::new(0),
            workers: AtomicUsize::new(workers),
            prefetch: AtomicUsize::new(prefetch),
            slots,
            decisions: Mutex::new(Vec::new()),
        }
    }

    /// The batches taken, the consumer's wait and the workers' busy time (loading and
    /// collating) so far.
    pub(crate) fn progress(&self) -> (u64, Duration, Duration) {
        (
            self.batches.load(Relaxed),
            Duration::from_nanos(self.wait_ns.load(Relaxed)),
            Duration::from_nanos(self.load_ns.load(Relaxed) + self.collate_ns.load(Relaxed)),
        )
    }

    /// The time since the epoch started.
    pub(crate) fn age(&self) -> Duration {
        self.started.elapsed()
    }

    /// The tuner changed the worker count and batches ahead to `workers` and `prefetch`.
    pub(crate) fn decided(&self, decision: Decision, workers: usize, prefetch: usize) {
        self.workers.store(workers, Relaxed);
        self.prefetch.store(prefetch, Relaxed);
        self.decisions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(decision);
    }

    /// A batch's block of `len` bytes (`capacity` with its size class) was just taken from
    /// `pool`.
    pub(crate) fn note_block(&self, len: usize, capacity: usize, pool: &PinnedPool) {
        self.largest_block.fetch_max(capacity, Relaxed);
        self.bytes.fetch_add(len as u64, Relaxed);
        // In use + pending only grows when a block is allocated, so sampling it right after
        // each allocation catches its peak. Pending blocks whose copies have completed are
        // free memory the pool has not noticed yet: let it notice first (waiting for a poll
        // another worker is running, whose done blocks would still count as pending).
        let s = pool.stats();
        self.held_peak
            .fetch_max(s.in_use_bytes + s.pending_bytes, Relaxed);
    }

    pub(crate) fn add_load(&self, d: Duration) {
        self.load_ns.fetch_add(nanos(d), Relaxed);
    }

    pub(crate) fn add_collate(&self, d: Duration) {
        self.collate_ns.fetch_add(nanos(d), Relaxed);
    }

    /// Time samples spent writing themselves in place ([`Collator::write_rows`]), part of
    /// the collate time.
    ///
    /// [`Collator::write_rows`]: super::Collator::write_rows
    pub(crate) fn add_write(&self, d: Duration) {
        self.write_ns.fetch_add(nanos(d), Relaxed);
    }

    pub(crate) fn add_transfer(&self, d: Duration) {
        self.transfer_ns.fetch_add(nanos(d), Relaxed);
    }

    /// The consumer took a batch of `samples` samples after waiting `waited` for it.
    pub(crate) fn took(&self, samples: usize, waited: Duration) {
        self.wait_ns.fetch_add(nanos(waited), Relaxed);
        self.batches.fetch_add(1, Relaxed);
        self.samples.fetch_add(samples as u64, Relaxed);
    }

    /// The consumer has seen the epoch's end (or its error).
    pub(crate) fn finish(&self) {
        let _ = self.finished_ns.compare_exchange(
            0,
            nanos(self.started.elapsed()).max(1),
            Relaxed,
            Relaxed,
        );
    }

    pub(crate) fn snapshot(&self) -> EpochStats {
        let elapsed = match self.finished_ns.load(Relaxed) {
            0 => self.started.elapsed(),
            ns => Duration::from_nanos(ns),
        };
        let largest = self.largest_block.load(Relaxed);
        EpochStats {
            batches: self.batches.load(Relaxed),
            samples: self.samples.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            elapsed,
            waited: Duration::from_nanos(self.wait_ns.load(Relaxed)),
            load: Duration::from_nanos(self.load_ns.load(Relaxed)),
            collate: Duration::from_nanos(self.collate_ns.load(Relaxed)),
            written: Duration::from_nanos(self.write_ns.load(Relaxed)),
            transfer: Duration::from_nanos(self.transfer_ns.load(Relaxed)),
            workers: self.workers.load(Relaxed),
            prefetch: self.prefetch.load(Relaxed),
            tuning: self
                .decisions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            pinned_peak_bytes: self.held_peak.load(Relaxed),
            pinned_bound_bytes: (self.slots + 1) * largest,
            batch_bytes: largest,
        }
    }
}

/// What one epoch of a loader did, so a user can tell whether the input pipeline keeps up.
/// `Display` prints a short table.
///
/// Times summed over worker threads (`load`, `collate`) can exceed the wall time; `waited` is
/// the consumer's own: time spent in `next()` with no batch ready, i.e. the time the training
/// step was starved of data.
///
/// The rates are over the whole epoch from its start, the pipeline's fill (its first blocks
/// and batches) included. For the steady state, read `waited` at the start and end of a window
/// of batches after a warm-up: the window's time over its batches is the throughput, and the
/// difference in `waited` the consumer's wait over it. `bytes` counts what the workers collated
/// into pinned blocks: a batch of [`Gather`](crate::Gather)s, stacked by the copy engine on the
/// device, collates nothing and adds none.
///
/// # Examples
///
/// ```
/// use pinnable::loader::{Loader, Stack};
/// use pinnable::Tensor;
///
/// let data: Vec<Tensor> = (0..12).map(|i| Tensor::from_vec1(vec![i as u8; 1024])).collect();
/// let loader = Loader::builder(data).batch_size(4).workers(2).build(Stack)?;
/// for batch in &loader {
///     batch?;
/// }
/// let stats = loader.stats().unwrap();
/// assert_eq!((stats.batches, stats.samples), (3, 12));
/// assert!(stats.pinned_peak_bytes <= stats.pinned_bound_bytes);
/// println!("{stats}"); // batches/s, GB/s collated / waited / load / collate / transfer / pinned held
/// # Ok::<(), pinnable::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct EpochStats {
    /// Batches the consumer took.
    pub batches: u64,
    /// Samples in them.
    pub samples: u64,
    /// Pinned bytes collated (the batches' blocks, without size-class rounding), in batches
    /// the consumer took or not.
    pub bytes: u64,
    /// Wall time from the epoch's start to its end (or until now, while it runs).
    pub elapsed: Duration,
    /// Time the consumer waited for data.
    pub waited: Duration,
    /// Time in the dataset's `get`, summed over the workers.
    pub load: Duration,
    /// Time collating (planning, writing the pinned block), summed over the workers.
    pub collate: Duration,
    /// The part of `collate` that samples spent writing themselves into the pinned block
    /// ([`Collator::write_rows`](super::Collator::write_rows): decoding an image straight into
    /// its row, say), summed over the workers.
    pub written: Duration,
    /// Time issuing moves to the device (`to_device`, non-blocking) on the transfer thread.
    pub transfer: Duration,
    /// Workers making batches at the end of the epoch (or now, while it runs): the count set
    /// by hand, or where the tuning left it.
    pub workers: usize,
    /// Batches made ahead at the end of the epoch (or now), likewise.
    pub prefetch: usize,
    /// The changes the tuning made to `workers` and `prefetch` during the epoch, with their
    /// reasons (none when both are set by hand, or nothing needed changing).
    pub tuning: Vec<Decision>,
    /// The most pinned memory the loader's pool held in use or pending (blocks whose copies
    /// still run), sampled at each allocation. Counts the pool's other users too, if it has
    /// any.
    pub pinned_peak_bytes: usize,
    /// The stated bound: (prefetch + workers + 1) × the largest batch block, at the most
    /// workers and batches ahead the tuning may set ([`Loader::bound`](super::Loader::bound)).
    pub pinned_bound_bytes: usize,
    /// The largest batch block (its size-class capacity).
    pub batch_bytes: usize,
}

impl EpochStats {
    /// Batches per second of wall time.
    pub fn batches_per_second(&self) -> f64 {
        self.batches as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Pinned bytes collated per second of wall time, in GB/s (10^9 bytes).
    pub fn gigabytes_per_second(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e9
    }

    /// The share of the epoch the consumer spent waiting for data, 0 to 1.
    pub fn wait_share(&self) -> f64 {
        self.waited.as_secs_f64() / self.elapsed.as_secs_f64().max(1e-9)
    }
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

impl fmt::Display for EpochStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        writeln!(
            f,
            "batches      {} ({} samples) in {:.1} ms: {:.1} batches/s, {:.2} GB/s collated",
            self.batches,
            self.samples,
            ms(self.elapsed),
            self.batches_per_second(),
            self.gigabytes_per_second()
        )?;
        writeln!(
            f,
            "waited       {:.1} ms ({:.1}% of the epoch: the consumer starved of data)",
            ms(self.waited),
            100.0 * self.wait_share()
        )?;
        let written = if self.written.is_zero() {
            String::new()
        } else {
            format!(", of which {:.1} ms written in place", ms(self.written))
        };
        writeln!(
            f,
            "load         {:.1} ms, collate {:.1} ms{written} (summed over the workers)",
            ms(self.load),
            ms(self.collate),
        )?;
        writeln!(f, "transfer     {:.1} ms", ms(self.transfer))?;
        writeln!(
            f,
            "workers      {}, {} batches ahead{}",
            self.workers,
            self.prefetch,
            if self.tuning.is_empty() {
                String::new()
            } else {
                format!(" (tuned {} times:)", self.tuning.len())
            }
        )?;
        for d in &self.tuning {
            writeln!(f, "  {d}")?;
        }
        write!(
            f,
            "pinned held  peak {:.1} MiB of a bound of {:.1} MiB (batch block {:.2} MiB)",
            mib(self.pinned_peak_bytes),
            mib(self.pinned_bound_bytes),
            mib(self.batch_bytes)
        )
    }
}
