//! The threads of one epoch: workers load and collate batches into pinned memory, one transfer
//! thread puts them back in order and moves them to the device, and the consumer takes them.
//!
//! ```text
//!  jobs (in order) ──► worker × N ──► reorder + transfer ──► bounded channel ──► consumer
//!        ▲ a permit per batch, taken before its job, given back when the consumer takes it
//!          (and, on a device, once its copy has finished)
//! ```
//!
//! **Bound.** `prefetch + workers` permits exist. A worker takes one before it takes the next
//! job, so at most that many batches hold pinned memory between collation and the consumer;
//! the consumer holds the one it took last. Permits are taken in job order, so the oldest
//! unfinished batch always holds one and the reorder buffer cannot starve it.
//!
//! **Tuning.** With the worker count or batches ahead left to the loader
//! (`loader/tune.rs`), a thread is started for every worker the tuning may run; those
//! numbered past the current count wait at the gate without taking a permit. After each batch
//! the consumer takes, the tuning may change the count and the permits; once the jobs are all
//! taken, the waiting workers leave, so the transfer thread still sees the epoch end.
//!
//! **Shutdown.** Stopping wakes every waiting worker and drops the consumer's end of the channel;
//! workers finish the sample they are loading, the transfer thread returns, and every thread is
//! joined before [`Pipeline::shutdown`] returns, with every batch in flight dropped (its block
//! back in the pool).
//!
//! **Out of order.** With `in_order` off the transfer thread hands each batch on as it
//! arrives, without the reorder buffer; permits still bound the batches in flight.
//!
//! **Timeouts.** With a sample timeout, each worker notes the sample it loads
//! ([`Watch`]); the consumer, while it waits, looks every tenth of the timeout and, for a sample
//! past it, ends the epoch with [`Error::Timeout`]. Shutdown then joins every thread but the
//! stuck worker, which goes to the loader's [`Abandoned`] list; the transfer thread checks
//! every 20 ms whether the epoch was stopped, since the stuck worker keeps its channel open.
//!
//! **Panics.** Every call into user code on these threads (a dataset's `get`, a stream's `next`,
//! the batcher, `to_device`, and the `Drop` of samples and batches) runs under a guard. A panic
//! while a batch is being made or moved, its samples' and host copy's `Drop` included, is that
//! batch's [`Error::Panicked`], delivered in its place. A panic in the `Drop` of a batch the
//! consumer never receives (the epoch ended first) is caught where it happens and let go: the
//! panic hook has reported it, and no thread is left behind or blocked.

mod gate;
mod transfer_thread;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::batcher::Batcher;
use super::collate::{Collator, EpochSeed};
use super::dataset::Dataset;
use super::guard::{Held, discard, drop_each, drop_quietly, guarded, panic_message};
use super::stats::Counters;
use super::straggler::{Abandoned, Watch};
use super::tune::{Tuner, Tuning};
use crate::alloc::PinnedPool;
use crate::cuda::Device;
use crate::error::{Error, Result};
use crate::transfer::ToDevice;
use gate::{Gate, Permit};
use transfer_thread::{Out, transfer};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The epoch's jobs, in batch order.
pub(crate) type Jobs<S> = Box<dyn Iterator<Item = Job<S>> + Send>;

/// One batch's work, handed out in batch order.
pub(crate) enum Job<S> {
    /// Load the samples at these dataset indices.
    Indices(Vec<usize>),
    /// Samples already read from a stream, with their positions in it.
    Read(Vec<(usize, Result<S>)>),
}

/// A worker's result, in whatever order workers finish.
struct Done<T> {
    batch: usize,
    result: Result<Held<T>>,
    samples: usize,
    permit: Permit,
}

/// What the consumer receives, in batch order (or as finished, out of order).
struct Ready<T> {
    batch: usize,
    result: Result<Held<T>>,
    samples: usize,
    _permit: Option<Permit>,
}

/// Everything an epoch's threads need.
pub(crate) struct Spec<S, T> {
    pub(crate) jobs: Jobs<S>,
    pub(crate) dataset: Option<Arc<dyn Dataset<Sample = S>>>,
    pub(crate) batcher: Arc<dyn Batcher<S, Batch = T>>,
    /// The loader's worker count and batches ahead, tuned while the epoch runs unless fixed.
    pub(crate) tuner: Arc<Mutex<Tuner>>,
    pub(crate) device: Device,
    pub(crate) pool: PinnedPool,
    pub(crate) seed: EpochSeed,
    /// Whether batches are delivered in batch order (else as they are finished).
    pub(crate) in_order: bool,
    /// The longest a sample's `get` may take.
    pub(crate) timeout: Option<Duration>,
    /// Where workers stuck past the timeout go when the epoch ends.
    pub(crate) abandoned: Abandoned,
}

/// What the workers share.
struct Work<S, T> {
    /// The next batch's number and the jobs.
    jobs: Mutex<(usize, Jobs<S>)>,
    dataset: Option<Arc<dyn Dataset<Sample = S>>>,
    batcher: Arc<dyn Batcher<S, Batch = T>>,
    pool: PinnedPool,
    /// The loader's device, which each batch's collator hands to the batcher.
    device: Device,
    seed: EpochSeed,
    gate: Arc<Gate>,
    counters: Arc<Counters>,
    watch: Option<Arc<Watch>>,
}

/// The running threads of one epoch, and the consumer's end.
pub(crate) struct Pipeline<T> {
    rx: Option<Receiver<Ready<T>>>,
    gate: Arc<Gate>,
    /// The threads, each with its worker number (`None` for the transfer thread).
    threads: Vec<(Option<usize>, JoinHandle<()>)>,
    counters: Arc<Counters>,
    /// An error to deliver before anything else (a thread that could not start).
    pending: Option<Error>,
    finished: bool,
    watch: Option<Arc<Watch>>,
    abandoned: Abandoned,
    /// The number of the batch delivered last.
    last: usize,
    /// Since when the consumer waits for the next batch, across waits that gave up at a
    /// deadline ([`next_before`](Self::next_before)).
    waiting: Option<Instant>,
    /// The pool the batches' blocks come from: polled once the threads are joined, so blocks
    /// whose copies have completed are cached rather than counted as pending.
    pool: PinnedPool,
    /// The tuning of the worker count and batches ahead, when either is left to it.
    tuning: Option<Tuning>,
}

impl<T: ToDevice + Send + 'static> Pipeline<T> {
    /// Starts the epoch's threads.
    pub(crate) fn start<S: Send + 'static>(spec: Spec<S, T>) -> Pipeline<T> {
        // Where the last epoch settled; with tuning, a thread for every worker the tuner may
        // start, those past the count waiting.
        let (workers, prefetch, threads, most, auto) = {
            let t = lock(&spec.tuner);
            let (max_w, max_p) = t.limits();
            let threads = if t.fixed().0 { t.workers() } else { max_w };
            (
                t.workers(),
                t.prefetch(),
                threads,
                max_w + max_p,
                t.is_auto(),
            )
        };
        let gate = Arc::new(Gate::new(prefetch + workers, workers));
        let counters = Arc::new(Counters::new(workers, prefetch, most));
        let watch = spec.timeout.map(|t| Arc::new(Watch::new(t, threads)));
        let tuning = auto.then(|| Tuning::new(spec.tuner.clone(), &counters));
        let work = Arc::new(Work {
            jobs: Mutex::new((0, spec.jobs)),
            dataset: spec.dataset,
            batcher: spec.batcher,
            pool: spec.pool.clone(),
            device: spec.device.clone(),
            seed: spec.seed,
            gate: gate.clone(),
            counters: counters.clone(),
            watch: watch.clone(),
        });
        let (done_tx, done_rx) = mpsc::channel::<Done<T>>();
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Ready<T>>(most);
        let mut pipeline = Pipeline {
            rx: Some(ready_rx),
            gate: gate.clone(),
            threads: Vec::with_capacity(threads + 1),
            counters: counters.clone(),
            pending: None,
            finished: false,
            watch,
            abandoned: spec.abandoned,
            last: 0,
            waiting: None,
            pool: spec.pool.clone(),
            tuning,
        };
        // On a host with several memory nodes, every thread runs on the device's node.
        let cpus = crate::numa::device_affinity(&spec.device).map(|a| a.cpus);
        let on_node = move |cpus: &Option<Vec<usize>>| {
            if let Some(cpus) = cpus {
                // Best effort: an unbound thread still works, only farther from the device.
                let _ = crate::numa::bind_current_thread(cpus);
            }
        };
        let (device, transfer_gate, node) = (spec.device, gate.clone(), cpus.clone());
        let in_order = spec.in_order;
        let spawned = std::thread::Builder::new()
            .name("loader-transfer".into())
            .spawn(move || {
                on_node(&node);
                let out = Out {
                    tx: ready_tx,
                    device,
                    gate: transfer_gate,
                    counters,
                };
                transfer(done_rx, out, in_order)
            });
        let mut result = spawned.map(|h| pipeline.threads.push((None, h)));
        for i in 0..threads {
            if result.is_err() {
                break;
            }
            let (work, tx, node) = (work.clone(), done_tx.clone(), cpus.clone());
            result = std::thread::Builder::new()
                .name(format!("loader-w{i}"))
                .spawn(move || {
                    on_node(&node);
                    worker(&work, &tx, i);
                    // The last worker out drops the dataset, the batcher and the stream: user
                    // code whose `Drop` must not take the thread down with a panic.
                    drop_quietly(work);
                })
                .map(|h| pipeline.threads.push((Some(i), h)));
        }
        // Only the workers hold the sending end from here: once they are gone, the transfer
        // thread sees the channel close and returns (also when a worker failed to start).
        drop(done_tx);
        if let Err(e) = result {
            pipeline.pending = Some(Error::Config {
                setting: "workers",
                problem: format!("cannot start a loader thread ({e}); use fewer workers"),
            });
            pipeline.shutdown();
        }
        pipeline
    }
}

impl<T> Pipeline<T> {
    /// The next batch in order, `None` at the end of the epoch. After an error the epoch is
    /// over: its threads are stopped and joined, and `next` returns `None`.
    pub(crate) fn next(&mut self) -> Option<Result<T>> {
        match self.next_before(None) {
            Poll::Ready(item) => item,
            Poll::Pending => unreachable!("a wait without a deadline ends with an item"),
        }
    }

    /// As [`next`](Self::next), waiting until `deadline` at most (`None`: as long as it
    /// takes); `Poll::Pending`, having taken nothing, when it passes first. An instant already
    /// past only takes what is there.
    pub(crate) fn next_before(&mut self, deadline: Option<Instant>) -> Poll<Option<Result<T>>> {
        if let Some(e) = self.pending.take() {
            self.finished = true;
            return Poll::Ready(Some(Err(e)));
        }
        if self.finished {
            return Poll::Ready(None);
        }
        let start = *self.waiting.get_or_insert_with(Instant::now);
        let Some(received) = self.receive(deadline) else {
            self.waiting = None;
            return Poll::Ready(None);
        };
        let Some(received) = received else {
            return Poll::Pending;
        };
        self.waiting = None;
        Poll::Ready(self.deliver(received, start))
    }

    /// What a message from the transfer thread, waited for since `start`, makes of the epoch.
    fn deliver(
        &mut self,
        received: std::result::Result<Ready<T>, ()>,
        start: Instant,
    ) -> Option<Result<T>> {
        match received {
            Ok(Ready {
                batch: number,
                result: Ok(batch),
                samples,
                _permit,
            }) => {
                self.last = number;
                self.counters.took(samples, start.elapsed());
                if let Some(tuning) = &mut self.tuning
                    && let Some((workers, prefetch)) = tuning.tick(&self.counters)
                {
                    self.gate.resize(prefetch + workers, workers);
                }
                Some(Ok(batch.into_inner()))
            }
            Ok(Ready { result: Err(e), .. }) => {
                self.shutdown();
                Some(Err(e))
            }
            Err(()) => {
                let died = self.shutdown();
                self.pending.take().or(died).map(Err)
            }
        }
    }

    /// The next message from the transfer thread, waiting until `deadline` at most (`None`
    /// inside when it passes first); with a sample timeout, an [`Error::Timeout`] for a sample
    /// past it while waiting (the epoch is then shut down). `None` when the epoch has no
    /// channel (it is over).
    fn receive(
        &mut self,
        deadline: Option<Instant>,
    ) -> Option<Option<std::result::Result<Ready<T>, ()>>> {
        let rx = self.rx.as_ref()?;
        let watch = self.watch.clone();
        loop {
            let now = Instant::now();
            let left = match deadline {
                Some(d) if d <= now => {
                    return Some(match rx.try_recv() {
                        Ok(ready) => Some(Ok(ready)),
                        Err(mpsc::TryRecvError::Empty) => None,
                        Err(mpsc::TryRecvError::Disconnected) => Some(Err(())),
                    });
                }
                Some(d) => Some(d - now),
                None => None,
            };
            let wait = match (left, &watch) {
                (None, None) => return Some(Some(rx.recv().map_err(|_| ()))),
                (Some(l), None) => l,
                (None, Some(w)) => w.tick(),
                (Some(l), Some(w)) => l.min(w.tick()),
            };
            match rx.recv_timeout(wait) {
                Ok(ready) => return Some(Some(Ok(ready))),
                Err(mpsc::RecvTimeoutError::Disconnected) => return Some(Some(Err(()))),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(w) = &watch
                        && let Some(o) = w.overdue()
                    {
                        let _ = self.shutdown();
                        // Delivered by `next` as the epoch's last item.
                        self.pending = Some(Error::Timeout {
                            index: o.index,
                            worker: o.worker,
                            waited: o.waited,
                            timeout: w.timeout(),
                        });
                        return Some(Some(Err(())));
                    }
                }
            }
        }
    }

    /// The number of the batch [`next`](Self::next) delivered last (its place in the epoch's
    /// order, counted from the epoch's first job).
    pub(crate) fn last_batch(&self) -> usize {
        self.last
    }

    /// The live counters.
    pub(crate) fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Stops every thread, drops every batch in flight and joins the threads. Returns an error
    /// if a thread died of a panic outside the code paths that report one.
    pub(crate) fn shutdown(&mut self) -> Option<Error> {
        self.finished = true;
        self.counters.finish();
        if let Some(tuning) = self.tuning.take() {
            tuning.end(&self.counters);
        }
        self.gate.stop();
        drop(self.rx.take());
        let mut died = None;
        for (worker, h) in self.threads.drain(..) {
            // A worker stuck in a call past the timeout cannot be joined now: the loader
            // keeps it, and joins it once the call has returned.
            let stuck = worker.zip(self.watch.as_ref());
            if stuck.is_some_and(|(w, watch)| watch.is_overdue(w)) && !h.is_finished() {
                self.abandoned.keep(h);
                continue;
            }
            if let Err(p) = h.join() {
                died.get_or_insert(Error::Panicked {
                    what: "a loader thread".into(),
                    message: panic_message(&*p),
                });
            }
        }
        // The batches in flight are dropped and the threads gone: blocks whose copies have
        // completed go back to the cache now rather than at the pool's next allocation.
        self.pool.reclaim();
        died
    }
}

impl<T> Drop for Pipeline<T> {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// A worker: take a permit, then the next job; load and collate it; hand it on.
fn worker<S: Send, T: Send>(work: &Work<S, T>, tx: &Sender<Done<T>>, id: usize) {
    loop {
        let Some(permit) = work.gate.acquire(id) else {
            return;
        };
        let next = {
            let mut jobs = lock(&work.jobs);
            let batch = jobs.0;
            let job = guarded(|| "the stream source".into(), || Ok(jobs.1.next()));
            match job {
                Ok(None) => None,
                Ok(Some(job)) => Some((batch, Ok(job))),
                Err(e) => Some((batch, Err(e))),
            }
            .inspect(|_| jobs.0 += 1)
        };
        let Some((batch, job)) = next else {
            // The epoch's jobs are all taken: the workers waiting for a permit leave too.
            work.gate.drain();
            return;
        };
        // Every user call in `run` has a guard of its own; this one catches whatever else
        // panics, so the batch this worker claimed is always delivered, if only as an error.
        let (result, samples) = match job {
            Ok(job) => {
                catch_unwind(AssertUnwindSafe(|| run(work, batch, job, id))).unwrap_or_else(|p| {
                    let message = panic_message(&*p);
                    discard(p);
                    let what = format!("making batch {batch}");
                    (Err(Error::Panicked { what, message }), 0)
                })
            }
            Err(e) => (Err(e), 0),
        };
        let done = Done {
            batch,
            result,
            samples,
            permit,
        };
        if tx.send(done).is_err() {
            return;
        }
    }
}

/// Loads and collates one batch; returns it with its sample count.
fn run<S: Send, T: Send>(
    work: &Work<S, T>,
    batch: usize,
    job: Job<S>,
    worker: usize,
) -> (Result<Held<T>>, usize) {
    let start = Instant::now();
    let loaded = load(work, batch, job, worker);
    work.counters.add_load(start.elapsed());
    let (indices, samples) = match loaded {
        Ok(v) => v,
        Err(e) => return (Err(e), 0),
    };
    let n = samples.len();
    let start = Instant::now();
    let mut c = Collator::for_batch(
        &work.pool,
        &work.device,
        indices,
        work.seed,
        work.counters.clone(),
    );
    let result = guarded(
        || format!("the batcher (batch {batch})"),
        || work.batcher.batch(samples, &mut c).map(Held::new),
    );
    work.counters.add_collate(start.elapsed());
    (result, n)
}

/// A batch's samples and their indices (dataset indices, or stream positions).
///
/// When a sample fails, the samples already loaded are dropped here, each under a guard: a
/// panic in a sample's `Drop` becomes batch `batch`'s error, naming the failure it interrupted.
fn load<S: Send, T: Send>(
    work: &Work<S, T>,
    batch: usize,
    job: Job<S>,
    worker: usize,
) -> Result<(Vec<usize>, Vec<S>)> {
    let failed = |index: usize, e: Error| Error::Sample {
        index,
        during: "loading",
        source: Box::new(e),
    };
    let drop_all = |e: &Error, samples: Vec<S>, rest: Vec<(usize, Result<S>)>| {
        let what = || format!("dropping the samples of batch {batch} after: {e}");
        drop_each(what, samples).and(drop_each(what, rest))
    };
    match job {
        Job::Indices(indices) => {
            let dataset = work.dataset.as_ref().ok_or_else(|| Error::Config {
                setting: "source",
                problem: "an indexed job without a dataset".into(),
            })?;
            let mut samples = Vec::with_capacity(indices.len());
            for &i in &indices {
                if work.gate.is_stopped() {
                    // The epoch is over and this batch is never delivered: skip the rest.
                    let e = Error::Config {
                        setting: "epoch",
                        problem: "stopped".into(),
                    };
                    drop_all(&e, samples, Vec::new())?;
                    return Err(e);
                }
                if let Some(watch) = &work.watch {
                    watch.begin(worker, i);
                }
                let got = guarded(|| "the dataset's `get`".into(), || dataset.get(i));
                if let Some(watch) = &work.watch {
                    watch.end(worker);
                }
                match got {
                    Ok(sample) => samples.push(sample),
                    Err(e) => {
                        let e = failed(i, e);
                        drop_all(&e, samples, Vec::new())?;
                        return Err(e);
                    }
                }
            }
            Ok((indices, samples))
        }
        Job::Read(items) => {
            let mut positions = Vec::with_capacity(items.len());
            let mut samples = Vec::with_capacity(items.len());
            let mut items = items.into_iter();
            while let Some((pos, item)) = items.next() {
                match item {
                    Ok(sample) => {
                        positions.push(pos);
                        samples.push(sample);
                    }
                    Err(e) => {
                        let e = failed(pos, e);
                        drop_all(&e, samples, items.collect())?;
                        return Err(e);
                    }
                }
            }
            Ok((positions, samples))
        }
    }
}
