//! Each epoch's run streamed in order: the run (this rank's samples in shard order, before the
//! shuffle buffer) cut into chunks of whole samples, each fetched once by one ranged `GET`
//! whose body is cut into samples as it arrives (slices of the received pieces, or copies; see
//! [`split`](super::split)); a sample's bytes are kept until a worker takes it, which is when
//! the shuffle buffer yields it.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Instant;

use super::super::streams::{Held, Planned, Streams};
use super::io::{Io, Object, fetch_into, io_error, lock};
use super::split::{LEAST_CHARGE, Ledger, Part, Split};

/// Samples whose place in the output is this far before the earliest one taken are neither
/// fetched nor kept: a resumed epoch skips them (the loader never asks for them), so it reads
/// again at most the chunks of this many samples before its position. A fresh epoch's
/// workers start their first batches together: a first batch taken this far after another
/// worker's first would have the other's chunks skipped, and their samples then come by
/// requests of their own (each byte still read once).
const LATE: usize = 1024;

/// What became of a chunk's fetch.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fetch {
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
    fetch: Fetch,
}

/// The epoch being streamed.
#[derive(Default)]
struct Run {
    /// Bumped by each plan: fetches of an earlier plan are dropped when they land.
    generation: u64,
    /// Sample index → its position in `run` (`usize::MAX`: not in this rank's run).
    at: Vec<usize>,
    run: Vec<Planned>,
    /// Run position → its chunk.
    chunk_of: Vec<usize>,
    chunks: Vec<Chunk>,
    /// Chunks before it have been started (or passed over).
    next: usize,
    /// Chunks before it hold a sample a worker asked for.
    demand: usize,
    /// Chunks being fetched, and their bytes.
    fetching: usize,
    fetching_bytes: u64,
    /// Arrived samples not yet taken, by run position.
    held: HashMap<usize, Arrived>,
    /// The bytes of those held in buffers of their own (the buffers others keep slices of are
    /// in the ledger).
    held_bytes: u64,
    /// Samples whose worker stopped waiting for their chunk and asked for them alone: not held
    /// when the chunk lands.
    abandoned: HashSet<usize>,
    /// The most fetches running at once.
    #[cfg(test)]
    most_fetching: usize,
    /// The earliest place in the output taken so far.
    least: usize,
}

/// A sample arrived and not yet taken.
struct Arrived {
    /// Its bytes: a buffer of its own, or a slice of a received buffer (whose charge in the
    /// ledger lasts as long as the slice, wherever it goes).
    bytes: Held,
    /// The bytes of its own buffer.
    own: u64,
}

impl Run {
    fn floor(&self) -> usize {
        self.least.saturating_sub(LATE)
    }

    fn arrive(&mut self, chunk: usize, parts: Option<Vec<Part>>) {
        let floor = self.floor();
        let c = &mut self.chunks[chunk];
        self.fetching -= 1;
        self.fetching_bytes -= c.bytes.end - c.bytes.start;
        let Some(parts) = parts else {
            c.fetch = Fetch::Gone;
            return;
        };
        c.fetch = Fetch::Done;
        for (q, part) in c.runs.clone().zip(parts) {
            if self.run[q].out >= floor && !self.abandoned.remove(&q) {
                let (bytes, own) = part.into_held();
                self.held_bytes += own;
                self.held.insert(q, Arrived { bytes, own });
            }
        }
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
    run: Mutex<Run>,
    arrived: Condvar,
    chunk: u64,
    read_ahead: usize,
    /// Read-ahead stops while the samples held (in buffers of their own and in the received
    /// buffers slices keep) and the bytes being fetched reach it (the pieces kept of a chunk
    /// still arriving count twice meanwhile: the read-ahead pauses early, never late);
    /// samples keep slices of the pieces they arrive in only while the ledger is under it.
    cap: u64,
}

/// The streams of one opened source (see the [module docs](self)).
pub(super) struct Streamer {
    shared: Arc<Shared>,
}

impl Streamer {
    pub(super) fn new(
        io: Arc<Io>,
        objects: Vec<Arc<Object>>,
        chunk: usize,
        read_ahead: usize,
        cap: usize,
    ) -> Streamer {
        Streamer {
            shared: Arc::new(Shared {
                io,
                objects,
                pieces: Ledger::default(),
                least: LEAST_CHARGE,
                run: Mutex::new(Run::default()),
                arrived: Condvar::new(),
                chunk: chunk as u64,
                read_ahead,
                cap: cap as u64,
            }),
        }
    }
}

impl Shared {
    /// Starts the chunks workers wait on, then more in stream order while fewer than the
    /// read-ahead are being fetched and the bytes held and being fetched are under the cap.
    /// Called when a worker asks and when a fetch lands, so the fetches keep running while
    /// the workers take what has arrived.
    fn start(self: &Arc<Self>, run: &mut Run) {
        let floor = run.floor();
        while run.next < run.chunks.len() {
            let c = run.next;
            let waited_on = c < run.demand;
            let held = run.held_bytes + self.pieces.load(Ordering::Relaxed);
            let ahead = run.fetching < self.read_ahead && held + run.fetching_bytes < self.cap;
            if !waited_on && !ahead {
                break;
            }
            run.next += 1;
            let chunk = &mut run.chunks[c];
            if chunk.last_out < floor {
                chunk.fetch = Fetch::Gone;
                continue;
            }
            chunk.fetch = Fetch::Running;
            let range = chunk.bytes.clone();
            run.fetching += 1;
            run.fetching_bytes += range.end - range.start;
            let spans: Vec<Range<u64>> = run.run[chunk.runs.clone()]
                .iter()
                .map(|p| p.span.clone())
                .collect();
            let object = self.objects[chunk.shard].clone();
            let (retries, timeout) = (self.io.retries, self.io.timeout);
            let (shared, generation) = (Arc::downgrade(self), run.generation);
            #[cfg(test)]
            {
                run.most_fetching = run.most_fetching.max(run.fetching);
            }
            let mut split = Split::new(range.start, spans, &self.pieces, self.cap, self.least);
            self.io.handle.spawn(async move {
                let fetched =
                    fetch_into(&*object.store, &object.path, range, retries, timeout, |b| {
                        split.put(b)
                    })
                    .await;
                land(
                    &shared,
                    generation,
                    c,
                    fetched.ok().map(|()| split.into_parts()),
                );
            });
        }
    }
}

/// A chunk's fetch ends: its samples are held for the workers (unless a later plan began), and
/// the next fetches start.
fn land(shared: &Weak<Shared>, generation: u64, chunk: usize, parts: Option<Vec<Part>>) {
    let Some(shared) = shared.upgrade() else {
        return;
    };
    let mut run = lock(&shared.run);
    if run.generation == generation {
        run.arrive(chunk, parts);
        shared.start(&mut run);
    }
    drop(run);
    shared.arrived.notify_all();
}

impl Streams for Streamer {
    fn plan(&self, planned: Vec<Planned>, total: usize) {
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
                    && c.bytes.end - c.bytes.start < self.shared.chunk
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
                    fetch: Fetch::Idle,
                }),
            }
            chunk_of.push(chunks.len() - 1);
        }
        let mut run = lock(&self.shared.run);
        *run = Run {
            generation: run.generation + 1,
            at,
            run: planned,
            chunk_of,
            chunks,
            least: usize::MAX,
            ..Run::default()
        };
        drop(run);
        // Workers of an earlier plan still waiting ask for their samples themselves.
        self.shared.arrived.notify_all();
    }

    fn take(&self, index: usize, shard: usize, span: Range<u64>) -> std::io::Result<Held> {
        let object = &self.shared.objects[shard];
        let deadline = self.shared.io.deadline();
        let mut run = lock(&self.shared.run);
        let q = run
            .at
            .get(index)
            .copied()
            .filter(|&q| q != usize::MAX && run.run[q].span == span);
        if let Some(q) = q {
            let generation = run.generation;
            run.least = run.least.min(run.run[q].out);
            let c = run.chunk_of[q];
            run.demand = run.demand.max(c + 1);
            self.shared.start(&mut run);
            loop {
                if let Some(arrived) = run.held.remove(&q) {
                    run.held_bytes -= arrived.own;
                    self.shared.start(&mut run);
                    return Ok(arrived.bytes);
                }
                let now = Instant::now();
                if run.generation != generation || run.chunks[c].fetch != Fetch::Running {
                    break;
                }
                if now >= deadline {
                    run.abandoned.insert(q);
                    break;
                }
                run = match self.shared.arrived.wait_timeout(run, deadline - now) {
                    Ok((r, _)) => r,
                    Err(poisoned) => poisoned.into_inner().0,
                };
            }
        }
        drop(run);
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
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use object_store::memory::InMemory;
    use object_store::path::Path as StorePath;
    use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

    use super::super::super::shuffle_buffer;
    use super::super::super::streams::{Planned, Streams};
    use super::super::Remote;
    use super::super::io::{Io, Object, lock};
    use super::super::split::LEAST_CHARGE;
    use super::Streamer;
    use crate::loader::SplitMix64;
    use object_store::chunked::ChunkedStore;

    /// Two shards of random samples in a store in memory, taken in a shuffle buffer's order
    /// by one reader: each sample's bytes are its span's, and the bytes held never pass the
    /// stated bound (the buffer's samples and a chunk's, plus the read-ahead under the cap,
    /// which runs on as fetches land however slowly the reader takes; and the received pieces
    /// samples keep slices of, which exist only under a cap and stay near it).
    #[test]
    fn held_bytes_stay_within_the_buffer_and_the_chunks_ahead() {
        let mut rng =
            SplitMix64::for_test("held_bytes_stay_within_the_buffer_and_the_chunks_ahead");
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let io = Io::start(&Remote::new()).unwrap();
        let mut planned = Vec::new();
        let mut objects = Vec::new();
        let mut bodies = Vec::new();
        let max_span = 20_000u64;
        for shard in 0..2 {
            let mut body = Vec::new();
            for _ in 0..100 + rng.below(100) {
                let start = body.len() as u64;
                let len = 512 + rng.below(max_span - 512);
                body.extend((0..len).map(|_| rng.next_u64() as u8));
                planned.push((shard, start..start + len));
                // The gap a member's padding or the next header leaves.
                body.extend(std::iter::repeat_n(0u8, rng.below(3) as usize * 512));
            }
            let path = StorePath::from(format!("s{shard}.tar"));
            let (s, p, b) = (store.clone(), path.clone(), body.clone());
            io.run(async move { s.put(&p, PutPayload::from(b)).await.map(|_| ()) })
                .unwrap()
                .unwrap();
            objects.push(Arc::new(Object {
                url: format!("memory:///s{shard}.tar"),
                store: store.clone(),
                path,
                len: body.len() as u64,
            }));
            bodies.push(body);
        }
        for case in 0..8 {
            let buffer = 1 + rng.below(60) as usize;
            let chunk = 1 + rng.below(4 * max_span) as usize;
            let ahead = rng.below(4) as usize;
            let cap = if case % 2 == 0 {
                0
            } else {
                rng.below(3 * chunk as u64) as usize
            };
            // Bodies arrive in pieces of one buffer a request, as an HTTP client's reads do:
            // small ones (most samples cut across pieces) or at least a span (each request's
            // first sample inside its first piece).
            let piece = if case % 4 < 2 {
                1 + rng.below(4096)
            } else {
                max_span + rng.below(3 * max_span)
            };
            let chunked: Arc<dyn ObjectStore> =
                Arc::new(ChunkedStore::new(store.clone(), piece as usize));
            let objects: Vec<Arc<Object>> = objects
                .iter()
                .map(|o| {
                    Arc::new(Object {
                        url: o.url.clone(),
                        store: chunked.clone(),
                        path: o.path.clone(),
                        len: o.len,
                    })
                })
                .collect();
            let least = [0, 1000, LEAST_CHARGE][rng.below(3) as usize];
            let mut streamer = Streamer::new(io.clone(), objects, chunk, ahead, cap);
            Arc::get_mut(&mut streamer.shared).unwrap().least = least;
            let out = shuffle_buffer(0..planned.len(), buffer, &mut rng);
            let mut place = vec![0; planned.len()];
            for (o, &q) in out.iter().enumerate() {
                place[q] = o;
            }
            let run: Vec<Planned> = planned
                .iter()
                .enumerate()
                .map(|(q, (shard, span))| Planned {
                    index: q,
                    shard: *shard,
                    span: span.clone(),
                    out: place[q],
                })
                .collect();
            streamer.plan(run, planned.len());
            let bound = (buffer as u64 + 1) * max_span
                + chunk as u64
                + max_span
                + if cap == 0 {
                    0
                } else {
                    // Read-ahead starts while under the cap, each at most a chunk and a span.
                    cap as u64 + chunk as u64 + max_span
                };
            let held = |s: &Streamer| {
                let own = lock(&s.shared.run).held_bytes;
                own + s.shared.pieces.load(Ordering::Relaxed)
            };
            let (mut most, mut most_pieces) = (0, 0);
            for &q in &out {
                let (shard, span) = &planned[q];
                let got = streamer.take(q, *shard, span.clone()).unwrap();
                let want = &bodies[*shard][span.start as usize..span.end as usize];
                assert!(got.host_bytes() == want, "case {case}: sample {q}");
                most = most.max(held(&streamer));
                most_pieces = most_pieces.max(streamer.shared.pieces.load(Ordering::Relaxed));
            }
            // Buffers are charged while the ledger is under the cap, so past it by at most
            // what the fetches running at once add: each at most its request's bytes (a chunk,
            // a span, the gaps), or the least charge.
            let fetching = lock(&streamer.shared.run).most_fetching.max(1) as u64;
            let pieces_bound = if cap == 0 {
                0
            } else {
                cap as u64 + fetching * (chunk as u64 + 2 * max_span).max(least)
            };
            let bound = bound + pieces_bound;
            assert!(
                most <= bound,
                "case {case}: {most} bytes held, over {bound} (buffer {buffer}, {chunk} B \
                 chunks, {ahead} ahead, cap {cap}, pieces of {piece} B, least charge {least})"
            );
            assert_eq!(held(&streamer), 0, "case {case}");
            // With room under the cap, samples kept slices of the pieces they came in (each
            // request's first sample does when pieces hold a span); with none, no sample did.
            if cap == 0 {
                assert_eq!(most_pieces, 0, "case {case}");
            } else if piece >= max_span {
                assert!(
                    most_pieces > 0,
                    "case {case}: no slice kept under a cap of {cap}"
                );
            }
        }
    }
}
