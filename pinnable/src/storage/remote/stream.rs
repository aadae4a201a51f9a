//! Each epoch's run streamed in order: the run (this rank's samples in shard order, before the
//! shuffle buffer) cut into chunks of whole samples, each fetched once by one ranged `GET`
//! whose body is cut into samples as it arrives (slices of the received pieces, or copies; see
//! [`split`](super::split)); a sample's bytes are kept until a worker takes it, which is when
//! the shuffle buffer yields it.
//!
//! Every worker takes every sample through here, so a take shares nothing it need not: the
//! plan is fixed for the epoch (read behind an `RwLock`), each chunk's samples have a lock and
//! a condition variable of their own (a worker waits on its chunk alone, and a landing wakes
//! only that chunk's waiters), the demand and the bytes held are atomics, and the scheduler's
//! lock is taken only when a worker asks for a chunk not yet started, when a fetch lands, or
//! when the cap held the read-ahead back and a take brought the bytes held under it.

use std::collections::HashSet;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, Weak};
use std::time::Instant;

use super::io::{Io, Object, fetch_into, io_error, lock};
use super::split::{LEAST_CHARGE, Ledger, Part, Split};
use crate::tensor::HostBytes;

/// A sample's bytes, held from their arrival until a reader takes them.
pub(crate) type Held = Arc<dyn HostBytes>;

/// One sample of an epoch's run, as a streaming source is told it: where its bytes lie and
/// where the shuffle buffer yields it.
pub(crate) struct Planned {
    /// Its index in the dataset.
    pub(crate) index: usize,
    /// Its object (a shard).
    pub(crate) shard: usize,
    /// Its bytes in the object.
    pub(crate) span: Range<u64>,
    /// Its place in the epoch's output (after the shuffle buffer).
    pub(crate) out: usize,
}

/// A source that reads each epoch's run of a rank in stream order ahead of the workers and
/// keeps each sample's bytes until the sample is taken. The runs of several ranks (loaders
/// in one process over one source) stream at once, each rank's replacing only its own.
pub(crate) trait Streams: Send + Sync {
    /// The next epoch's run of rank `shard.0` of `shard.1`, in stream order (damaged entries
    /// left out), out of `total` samples.
    fn plan(&self, shard: (usize, usize), run: Vec<Planned>, total: usize);

    /// The bytes of sample `index`'s span in shard `shard`.
    fn take(&self, index: usize, shard: usize, span: Range<u64>) -> std::io::Result<Held>;
}

/// Samples whose place in the output is this far before the earliest one taken are neither
/// fetched nor kept: a resumed epoch skips them (the loader never asks for them), so it reads
/// again at most the chunks of this many samples before its position. A fresh epoch's
/// workers start their first batches together: a first batch taken this far after another
/// worker's first would have the other's chunks skipped, and their samples then come by
/// requests of their own (each byte still read once).
const LATE: usize = 1024;

/// What became of a chunk's fetch.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
enum Fetch {
    #[default]
    Idle,
    Running,
    Done,
    /// It failed (its samples are asked for one by one, which reports the error), or every
    /// sample in it lies before the first one taken.
    Gone,
}

/// A chunk: consecutive samples of the run that lie back to back in one shard.
struct Chunk {
    shard: usize,
    bytes: Range<u64>,
    /// Its samples' positions in the run.
    runs: Range<usize>,
    /// The latest place in the output among its samples.
    last_out: usize,
}

/// A chunk's samples as they arrive, behind a lock of their own: a worker waits on the chunk
/// its sample is in, and a landing wakes only that chunk's waiters.
#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
    arrived: Condvar,
}

#[derive(Default)]
struct SlotState {
    fetch: Fetch,
    /// Arrived samples not yet taken, by position in the chunk.
    held: Vec<Option<Arrived>>,
    /// Samples whose worker stopped waiting for the chunk and asked for them alone: not
    /// held when it lands.
    abandoned: HashSet<usize>,
}

impl Slot {
    /// Sets the chunk's fetch and wakes its waiters.
    fn set(&self, fetch: Fetch) {
        lock(&self.state).fetch = fetch;
        self.arrived.notify_all();
    }
}

/// A sample arrived and not yet taken.
struct Arrived {
    /// Its bytes: a buffer of its own, or a slice of a received buffer (whose charge in the
    /// ledger lasts as long as the slice, wherever it goes).
    bytes: Held,
    /// The bytes of its own buffer.
    own: u64,
}

/// One epoch's run: fixed when planned, but for what the workers and the fetches change,
/// each behind its own lock or in an atomic, so that workers taking samples of different
/// chunks never wait on each other.
struct Plan {
    /// Sample index → its position in `run` (`usize::MAX`: not in this rank's run).
    at: Vec<usize>,
    run: Vec<Planned>,
    /// Run position → its chunk.
    chunk_of: Vec<usize>,
    chunks: Vec<Chunk>,
    slots: Vec<Slot>,
    /// The earliest place in the output taken so far.
    least: AtomicUsize,
    /// Chunks before it hold a sample a worker asked for.
    demand: AtomicUsize,
    /// The bytes of the samples held in buffers of their own (the buffers others keep slices
    /// of are in the ledger).
    held_bytes: AtomicU64,
    /// While the read-ahead is stopped by the cap: the held bytes (own and in the ledger)
    /// under which it could go on (0 while it is not stopped by the cap).
    resume_below: AtomicU64,
    /// A later plan replaced it: its fetches are dropped when they land, and its waiting
    /// workers ask for their samples themselves.
    retired: AtomicBool,
    sched: Mutex<Sched>,
}

/// Which chunks have been started.
#[derive(Default)]
struct Sched {
    /// Chunks before it have been started (or passed over).
    next: usize,
    /// Chunks being fetched, and their bytes.
    fetching: usize,
    fetching_bytes: u64,
    /// The most fetches running at once.
    #[cfg(test)]
    most_fetching: usize,
}

impl Plan {
    fn floor(&self) -> usize {
        self.least.load(Ordering::Relaxed).saturating_sub(LATE)
    }

    /// The chunk's samples, cut from its body, held for the workers (those not before the
    /// floor nor abandoned); `None`: its fetch failed.
    fn arrive(&self, chunk: usize, parts: Option<Vec<Part>>) {
        let slot = &self.slots[chunk];
        let Some(parts) = parts else {
            slot.set(Fetch::Gone);
            return;
        };
        let floor = self.floor();
        let runs = self.chunks[chunk].runs.clone();
        let mut state = lock(&slot.state);
        let mut held = Vec::with_capacity(runs.len());
        let mut own = 0;
        for (q, part) in runs.zip(parts) {
            let keep = self.run[q].out >= floor && !state.abandoned.remove(&q);
            held.push(keep.then(|| {
                let (bytes, o) = part.into_held();
                own += o;
                Arrived { bytes, own: o }
            }));
        }
        self.held_bytes.fetch_add(own, Ordering::Relaxed);
        state.held = held;
        state.fetch = Fetch::Done;
        drop(state);
        slot.arrived.notify_all();
    }
}

/// What the workers and the fetches share.
struct Shared {
    io: Arc<Io>,
    objects: Vec<Arc<Object>>,
    /// The received buffers that samples keep slices of.
    pieces: Ledger,
    /// The least charge of a received buffer (see [`LEAST_CHARGE`]).
    least: u64,
    /// The epoch being streamed by each rank (`(rank, world)`) reading through this source.
    plans: RwLock<Vec<RankPlan>>,
    chunk: u64,
    /// Chunks fetched ahead: doubled, when `grow`, each time a worker waits for a chunk still
    /// on its way, up to the chunks the cap holds.
    read_ahead: AtomicUsize,
    grow: bool,
    /// Read-ahead stops while the samples held (in buffers of their own and in the received
    /// buffers slices keep) and the bytes being fetched reach it (the pieces kept of a chunk
    /// still arriving count twice meanwhile: the read-ahead pauses early, never late);
    /// samples keep slices of the pieces they arrive in only while the ledger is under it.
    cap: u64,
}

/// A rank's plan: `(rank, world)` and the epoch it streams.
type RankPlan = ((usize, usize), Arc<Plan>);

/// The streams of one opened source (see the [module docs](self)).
pub(crate) struct Streamer {
    shared: Arc<Shared>,
}

impl Streamer {
    pub(crate) fn new(
        io: Arc<Io>,
        objects: Vec<Arc<Object>>,
        chunk: usize,
        (read_ahead, grow): (usize, bool),
        cap: usize,
    ) -> Streamer {
        Streamer {
            shared: Arc::new(Shared {
                io,
                objects,
                pieces: Ledger::default(),
                least: LEAST_CHARGE,
                plans: RwLock::new(Vec::new()),
                chunk: chunk as u64,
                read_ahead: AtomicUsize::new(read_ahead),
                grow,
                cap: cap as u64,
            }),
        }
    }
}

impl Plan {
    /// The run cut into chunks of consecutive samples lying back to back in one shard, each
    /// under `chunk` bytes but for its last sample.
    fn new(planned: Vec<Planned>, total: usize, chunk: u64) -> Plan {
        let mut at = vec![usize::MAX; total];
        let mut chunks: Vec<Chunk> = Vec::new();
        let mut chunk_of = Vec::with_capacity(planned.len());
        for (q, p) in planned.iter().enumerate() {
            at[p.index] = q;
            let joins = chunks.last().is_some_and(|c| {
                let prev = &planned[c.runs.end - 1];
                c.shard == p.shard
                    && prev.index + 1 == p.index
                    && c.bytes.end <= p.span.start
                    && c.bytes.end - c.bytes.start < chunk
            });
            match chunks.last_mut() {
                Some(c) if joins => {
                    c.bytes.end = p.span.end;
                    c.runs.end = q + 1;
                    c.last_out = c.last_out.max(p.out);
                }
                _ => chunks.push(Chunk {
                    shard: p.shard,
                    bytes: p.span.clone(),
                    runs: q..q + 1,
                    last_out: p.out,
                }),
            }
            chunk_of.push(chunks.len() - 1);
        }
        Plan {
            at,
            run: planned,
            chunk_of,
            slots: chunks.iter().map(|_| Slot::default()).collect(),
            chunks,
            least: AtomicUsize::new(usize::MAX),
            demand: AtomicUsize::new(0),
            held_bytes: AtomicU64::new(0),
            resume_below: AtomicU64::new(0),
            retired: AtomicBool::new(false),
            sched: Mutex::new(Sched::default()),
        }
    }
}

impl Shared {
    /// The bytes held: samples in buffers of their own and the received buffers samples
    /// keep slices of.
    fn held(&self, plan: &Plan) -> u64 {
        plan.held_bytes.load(Ordering::Relaxed) + self.pieces.load(Ordering::Relaxed)
    }

    /// A worker waits for a chunk still on its way: twice the chunks ahead from now on (when
    /// they grow), up to as many as the cap holds, which bounds the bytes either way.
    fn grow_read_ahead(&self) {
        if !self.grow {
            return;
        }
        let most = (self.cap / self.chunk.max(1)).max(1) as usize;
        let _ = self
            .read_ahead
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < most).then(|| (n * 2).clamp(1, most))
            });
    }

    /// Starts the chunks workers wait on, then more in stream order while fewer than the
    /// read-ahead are being fetched and the bytes held and being fetched are under the cap.
    /// Called when a worker asks for a chunk not started, when a fetch lands, and when a
    /// worker takes a sample while the cap holds the read-ahead back and the bytes held fell
    /// under it: the fetches keep running while the workers take what has arrived. `landed`:
    /// the chunk whose fetch just ended, no longer counted as being fetched.
    fn start(self: &Arc<Self>, plan: &Arc<Plan>, landed: Option<usize>) {
        let mut sched = lock(&plan.sched);
        if let Some(c) = landed {
            let bytes = &plan.chunks[c].bytes;
            sched.fetching -= 1;
            sched.fetching_bytes -= bytes.end - bytes.start;
        }
        let floor = plan.floor();
        plan.resume_below.store(0, Ordering::Relaxed);
        while sched.next < plan.chunks.len() {
            let c = sched.next;
            let waited_on = c < plan.demand.load(Ordering::Relaxed);
            let held = self.held(plan);
            let room = sched.fetching < self.read_ahead.load(Ordering::Relaxed);
            let ahead = room && held + sched.fetching_bytes < self.cap;
            if !waited_on && !ahead {
                if room {
                    let below = self.cap.saturating_sub(sched.fetching_bytes);
                    plan.resume_below.store(below, Ordering::Relaxed);
                }
                break;
            }
            sched.next += 1;
            let chunk = &plan.chunks[c];
            if chunk.last_out < floor {
                plan.slots[c].set(Fetch::Gone);
                continue;
            }
            plan.slots[c].set(Fetch::Running);
            let range = chunk.bytes.clone();
            sched.fetching += 1;
            sched.fetching_bytes += range.end - range.start;
            #[cfg(test)]
            {
                sched.most_fetching = sched.most_fetching.max(sched.fetching);
            }
            let spans: Vec<Range<u64>> = plan.run[chunk.runs.clone()]
                .iter()
                .map(|p| p.span.clone())
                .collect();
            let object = self.objects[chunk.shard].clone();
            let (retries, timeout) = (self.io.retries, self.io.timeout);
            let (shared, weak) = (Arc::downgrade(self), Arc::downgrade(plan));
            let mut split = Split::new(range.start, spans, &self.pieces, self.cap, self.least);
            self.io.handle.spawn(async move {
                let fetched =
                    fetch_into(&*object.store, &object.path, range, retries, timeout, |b| {
                        split.put(b)
                    })
                    .await;
                land(&shared, &weak, c, fetched.ok().map(|()| split.into_parts()));
            });
        }
    }
}

/// A chunk's fetch ends: its samples are held for the workers (unless a later plan began), and
/// the next fetches start.
fn land(shared: &Weak<Shared>, plan: &Weak<Plan>, chunk: usize, parts: Option<Vec<Part>>) {
    let (Some(shared), Some(plan)) = (shared.upgrade(), plan.upgrade()) else {
        return;
    };
    if plan.retired.load(Ordering::Acquire) {
        return;
    }
    plan.arrive(chunk, parts);
    shared.start(&plan, Some(chunk));
}

impl Streamer {
    /// The plans holding sample `index` at `span`, with its position in each run.
    fn holding(&self, index: usize, span: &Range<u64>) -> Vec<(Arc<Plan>, usize)> {
        let plans = self.shared.plans.read().unwrap_or_else(|p| p.into_inner());
        plans
            .iter()
            .filter_map(|(_, plan)| {
                let q = plan.at.get(index).copied()?;
                (q != usize::MAX && plan.run[q].span == *span).then(|| (plan.clone(), q))
            })
            .collect()
    }

    /// Sample `q` of `plan`'s run, waited for while its chunk is on its way; `None` when it
    /// is not there to take (taken before, its chunk failed, the plan retired, the wait ran
    /// past `deadline`).
    fn take_from(&self, plan: &Arc<Plan>, q: usize, deadline: Instant) -> Option<Held> {
        // Loads first: most takes change neither, and a store would make every worker's next
        // load miss.
        let out = plan.run[q].out;
        if plan.least.load(Ordering::Relaxed) > out {
            plan.least.fetch_min(out, Ordering::Relaxed);
        }
        let c = plan.chunk_of[q];
        if plan.demand.load(Ordering::Relaxed) <= c
            && plan.demand.fetch_max(c + 1, Ordering::Relaxed) <= c
        {
            self.shared.start(plan, None);
        }
        let slot = &plan.slots[c];
        let at = q - plan.chunks[c].runs.start;
        let mut state = lock(&slot.state);
        // A worker that has to wait: the read-ahead grows, once for this sample.
        let mut grown = false;
        loop {
            if let Some(arrived) = state.held.get_mut(at).and_then(Option::take) {
                drop(state);
                plan.held_bytes.fetch_sub(arrived.own, Ordering::Relaxed);
                if self.shared.held(plan) < plan.resume_below.load(Ordering::Relaxed) {
                    self.shared.start(plan, None);
                }
                return Some(arrived.bytes);
            }
            let now = Instant::now();
            // Idle: another worker asked for the chunk and is starting it.
            let waits = matches!(state.fetch, Fetch::Running | Fetch::Idle);
            if plan.retired.load(Ordering::Acquire) || !waits {
                return None;
            }
            if now >= deadline {
                state.abandoned.insert(q);
                return None;
            }
            if !grown {
                grown = true;
                self.shared.grow_read_ahead();
            }
            state = match slot.arrived.wait_timeout(state, deadline - now) {
                Ok((s, _)) => s,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}

/// Whether sample `q` of `plan` is gone from it: its chunk landed (or failed) and the
/// sample is no longer held (taken, or passed over).
fn gone(plan: &Plan, q: usize) -> bool {
    let c = plan.chunk_of[q];
    let state = lock(&plan.slots[c].state);
    let at = q - plan.chunks[c].runs.start;
    match state.fetch {
        Fetch::Gone => true,
        Fetch::Done => state.held.get(at).is_none_or(Option::is_none),
        Fetch::Idle | Fetch::Running => false,
    }
}

impl Streams for Streamer {
    /// Replaces rank `shard.0`'s plan (and the plans of another world size: a process runs
    /// one world), leaving the other ranks' streams running.
    fn plan(&self, shard: (usize, usize), planned: Vec<Planned>, total: usize) {
        let plan = Arc::new(Plan::new(planned, total, self.shared.chunk));
        let old: Vec<Arc<Plan>> = {
            let mut plans = self.shared.plans.write().unwrap_or_else(|p| p.into_inner());
            let (old, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut *plans)
                .into_iter()
                .partition(|(key, _)| *key == shard || key.1 != shard.1);
            *plans = kept;
            plans.push((shard, plan));
            old.into_iter().map(|(_, p)| p).collect()
        };
        // Workers of the earlier plan still waiting ask for their samples themselves.
        for old in old {
            old.retired.store(true, Ordering::Release);
            for slot in &old.slots {
                drop(lock(&slot.state));
                slot.arrived.notify_all();
            }
        }
    }

    /// From the plan of the rank whose run holds the sample (where two ranks' runs hold it,
    /// as when a short epoch repeats samples, the first that still holds it).
    fn take(&self, index: usize, shard: usize, span: Range<u64>) -> std::io::Result<Held> {
        let object = &self.shared.objects[shard];
        let deadline = self.shared.io.deadline();
        let holding = self.holding(index, &span);
        let last = holding.len().saturating_sub(1);
        for (k, (plan, q)) in holding.iter().enumerate() {
            if k < last && gone(plan, *q) {
                continue;
            }
            if let Some(bytes) = self.take_from(plan, *q, deadline) {
                return Ok(bytes);
            }
        }
        // Not in the stream (another plan, taken before, or its chunk failed): its own request.
        self.shared
            .io
            .fetch(object, span)
            .wait(self.shared.io.deadline())
            .map(|bytes| bytes as Held)
            .map_err(|p| io_error(object, p))
    }
}

#[cfg(test)]
mod tests;
