//! The remote stream's tests: samples from a store in memory, taken as the loader's workers take them.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use object_store::memory::InMemory;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::super::io::{Io, Object, lock};
use super::super::split::LEAST_CHARGE;
use super::{Held, Planned, Streamer, Streams};
use crate::formats::tar::shuffle_buffer;
use crate::loader::SplitMix64;
use crate::storage::Storage;
use object_store::chunked::ChunkedStore;
use object_store::throttle::{ThrottleConfig, ThrottledStore};

/// The longest sample the shards hold.
const MAX_SPAN: u64 = 20_000;

/// Two shards of random samples (each shard's samples in order, gaps between them) in a
/// store in memory: the runtime, the shards' objects, each sample's shard and span, and the
/// shards' bytes.
struct Shards {
    io: Arc<Io>,
    store: Arc<dyn ObjectStore>,
    objects: Vec<Arc<Object>>,
    samples: Vec<(usize, Range<u64>)>,
    bodies: Vec<Vec<u8>>,
}

impl Shards {
    fn new(rng: &mut SplitMix64) -> Shards {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let io = Io::start(&Storage::new()).unwrap();
        let (mut samples, mut objects, mut bodies) = (Vec::new(), Vec::new(), Vec::new());
        for shard in 0..2 {
            let mut body = Vec::new();
            for _ in 0..100 + rng.below(100) {
                let start = body.len() as u64;
                let len = 512 + rng.below(MAX_SPAN - 512);
                body.extend((0..len).map(|_| rng.next_u64() as u8));
                samples.push((shard, start..start + len));
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
        Shards {
            io,
            store,
            objects,
            samples,
            bodies,
        }
    }

    /// The shards' objects read through `store` (the same objects, arriving otherwise).
    fn through(&self, store: Arc<dyn ObjectStore>) -> Vec<Arc<Object>> {
        self.objects
            .iter()
            .map(|o| {
                Arc::new(Object {
                    url: o.url.clone(),
                    store: store.clone(),
                    path: o.path.clone(),
                    len: o.len,
                })
            })
            .collect()
    }

    /// The run in a shuffle buffer's order: the order of output, and the run planned.
    fn plan(&self, buffer: usize, rng: &mut SplitMix64) -> (Vec<usize>, Vec<Planned>) {
        let out = shuffle_buffer(0..self.samples.len(), buffer, rng);
        let mut place = vec![0; self.samples.len()];
        for (o, &q) in out.iter().enumerate() {
            place[q] = o;
        }
        let run = self
            .samples
            .iter()
            .enumerate()
            .map(|(q, (shard, span))| Planned {
                index: q,
                shard: *shard,
                span: span.clone(),
                out: place[q],
            })
            .collect();
        (out, run)
    }

    /// Takes sample `q` and checks its bytes.
    fn take(&self, streamer: &Streamer, q: usize, what: &str) -> Held {
        let (shard, span) = &self.samples[q];
        let got = streamer.take(q, *shard, span.clone()).unwrap();
        let want = &self.bodies[*shard][span.start as usize..span.end as usize];
        assert!(got.host_bytes() == want, "{what}: sample {q}");
        got
    }
}

/// Two shards of random samples in a store in memory, taken in a shuffle buffer's order
/// by one reader: each sample's bytes are its span's, and the bytes held never pass the
/// stated bound (the buffer's samples and a chunk's, plus the read-ahead under the cap,
/// which runs on as fetches land however slowly the reader takes; and the received pieces
/// samples keep slices of, which exist only under a cap and stay near it).
#[test]
fn held_bytes_stay_within_the_buffer_and_the_chunks_ahead() {
    let mut rng = SplitMix64::for_test("held_bytes_stay_within_the_buffer_and_the_chunks_ahead");
    let shards = Shards::new(&mut rng);
    let max_span = MAX_SPAN;
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
            Arc::new(ChunkedStore::new(shards.store.clone(), piece as usize));
        let least = [0, 1000, LEAST_CHARGE][rng.below(3) as usize];
        // The read-ahead fixed, or grown while the reader waits (bounded by the cap either way).
        let grow = rng.below(2) == 0;
        let mut streamer = Streamer::new(
            shards.io.clone(),
            shards.through(chunked),
            chunk,
            (ahead, grow),
            cap,
        );
        Arc::get_mut(&mut streamer.shared).unwrap().least = least;
        let (out, run) = shards.plan(buffer, &mut rng);
        streamer.plan((0, 1), run, shards.samples.len());
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
            let plan = s.shared.plans.read().unwrap()[0].1.clone();
            s.shared.held(&plan)
        };
        let (mut most, mut most_pieces) = (0, 0);
        for &q in &out {
            let _got = shards.take(&streamer, q, &format!("case {case}"));
            most = most.max(held(&streamer));
            most_pieces = most_pieces.max(streamer.shared.pieces.load(Ordering::Relaxed));
        }
        // Buffers are charged while the ledger is under the cap, so past it by at most
        // what the fetches running at once add: each at most its request's bytes (a chunk,
        // a span, the gaps), or the least charge.
        let plan = streamer.shared.plans.read().unwrap()[0].1.clone();
        let fetching = lock(&plan.sched).most_fetching.max(1) as u64;
        let pieces_bound = if cap == 0 {
            0
        } else {
            cap as u64 + fetching * (chunk as u64 + 2 * max_span).max(least)
        };
        let bound = bound + pieces_bound;
        assert!(
            most <= bound,
            "case {case}: {most} bytes held, over {bound} (buffer {buffer}, {chunk} B \
             chunks, {ahead} ahead (grown: {grow}), cap {cap}, pieces of {piece} B, least \
             charge {least})"
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

/// Workers taking their batches at once, as the loader's do (batch k by worker k mod n, each
/// in output order), get every sample's bytes, whatever the chunk, read-ahead, cap and the
/// pieces the bodies arrive in; nothing is held once all are taken.
#[test]
fn workers_taking_at_once_get_every_sample() {
    let mut rng = SplitMix64::for_test("workers_taking_at_once_get_every_sample");
    let shards = Shards::new(&mut rng);
    for case in 0..12 {
        let chunk = 1 + rng.below(4 * MAX_SPAN) as usize;
        let ahead = rng.below(4) as usize;
        let cap = [0, rng.below(3 * chunk as u64) as usize, 1 << 30][case % 3];
        let piece = 1 + rng.below(3 * MAX_SPAN) as usize;
        let chunked: Arc<dyn ObjectStore> =
            Arc::new(ChunkedStore::new(shards.store.clone(), piece));
        let streamer = Streamer::new(
            shards.io.clone(),
            shards.through(chunked),
            chunk,
            (ahead, rng.below(2) == 0),
            cap,
        );
        let (out, run) = shards.plan(1 + rng.below(60) as usize, &mut rng);
        streamer.plan((0, 1), run, shards.samples.len());
        let workers = 2 + rng.below(7) as usize;
        let batches: Vec<&[usize]> = out.chunks(1 + rng.below(16) as usize).collect();
        std::thread::scope(|s| {
            for w in 0..workers {
                let (shards, streamer, batches) = (&shards, &streamer, &batches);
                s.spawn(move || {
                    for batch in batches.iter().skip(w).step_by(workers) {
                        for &q in *batch {
                            shards.take(streamer, q, &format!("case {case}, worker {w}"));
                        }
                    }
                });
            }
        });
        let plan = streamer.shared.plans.read().unwrap()[0].1.clone();
        assert_eq!(streamer.shared.held(&plan), 0, "case {case}");
    }
}

/// An epoch left while workers wait for chunks still being fetched (each request slowed to
/// 40 ms): the next plan sends them to requests of their own at once, not at their deadline
/// (minutes away), and their bytes are right; the next epoch's samples then come whole.
#[test]
fn a_new_plan_frees_workers_waiting_on_the_last_one() {
    let mut rng = SplitMix64::for_test("a_new_plan_frees_workers_waiting_on_the_last_one");
    let shards = Shards::new(&mut rng);
    let slow: Arc<dyn ObjectStore> = Arc::new(ThrottledStore::new(
        shards.store.clone(),
        ThrottleConfig {
            wait_get_per_call: Duration::from_millis(40),
            ..ThrottleConfig::default()
        },
    ));
    let streamer = Streamer::new(
        shards.io.clone(),
        shards.through(slow),
        4 * MAX_SPAN as usize,
        (2, false),
        1 << 30,
    );
    let n = shards.samples.len();
    let (out, run) = shards.plan(8, &mut rng);
    streamer.plan((0, 1), run, n);
    let t = Instant::now();
    std::thread::scope(|s| {
        for w in 0..4 {
            let (shards, streamer, out) = (&shards, &streamer, &out);
            s.spawn(move || {
                shards.take(streamer, out[w * 50], &format!("worker {w}"));
            });
        }
        std::thread::sleep(Duration::from_millis(10));
        let (_, run) = shards.plan(8, &mut rng);
        streamer.plan((0, 1), run, n);
    });
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "the waiting workers took {took:?}"
    );
    let (out, run) = shards.plan(8, &mut rng);
    streamer.plan((0, 1), run, n);
    for &q in &out {
        shards.take(&streamer, q, "the next epoch");
    }
}

/// A reader that waits for chunks still on their way doubles the read-ahead, up to the chunks
/// the cap holds, and more fetches then run at once; a fixed read-ahead stays where it is.
#[test]
fn the_read_ahead_grows_while_readers_wait_up_to_the_cap() {
    let mut rng = SplitMix64::for_test("the_read_ahead_grows_while_readers_wait_up_to_the_cap");
    let shards = Shards::new(&mut rng);
    for grow in [true, false] {
        let slow: Arc<dyn ObjectStore> = Arc::new(ThrottledStore::new(
            shards.store.clone(),
            ThrottleConfig {
                wait_get_per_call: Duration::from_millis(5),
                ..ThrottleConfig::default()
            },
        ));
        let chunk = 2 * MAX_SPAN as usize;
        let most = 6 + rng.below(10) as usize;
        let streamer = Streamer::new(
            shards.io.clone(),
            shards.through(slow),
            chunk,
            (1, grow),
            most * chunk,
        );
        let n = shards.samples.len();
        let (out, run) = shards.plan(8, &mut rng);
        streamer.plan((0, 1), run, n);
        for &q in &out {
            shards.take(&streamer, q, "a waiting reader");
        }
        let ahead = streamer.shared.read_ahead.load(Ordering::Relaxed);
        let plan = streamer.shared.plans.read().unwrap()[0].1.clone();
        let fetching = lock(&plan.sched).most_fetching;
        if grow {
            assert!(
                ahead > 1 && ahead <= most,
                "grew to {ahead}, the cap holds {most}"
            );
            assert!(fetching > 1, "at most {fetching} fetches at once");
        } else {
            // Fetches can still outnumber it: a chunk a worker waits on is fetched whatever
            // the read-ahead.
            assert_eq!(ahead, 1, "a fixed read-ahead");
        }
    }
}

/// What a remote shard serves is hostile too: bytes unlike the ones indexed, shorter than the
/// spans planned over them (a shard replaced after the index pass), arriving in pieces of any
/// size. Over arbitrary bytes, a plan of arbitrary spans (some past the end, some empty, some
/// overlapping) taken in a shuffled order, with any chunk, read-ahead and cap: every take is
/// the span's bytes when it lies inside the object (an empty span anywhere: no bytes) and an
/// error when it does not; never a panic or a hang, and nothing is held once all are taken.
#[test]
fn arbitrary_bytes_and_spans_give_the_bytes_or_an_error() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    // No retries: a span past the end fails at once instead of after backoffs.
    let io = Io::start(&Storage::new().retries(0)).unwrap();
    let path = StorePath::from("fuzz.tar");
    crate::fuzz::Fuzz::new("remote_stream")
        .seeds([vec![0u8; 1024], (0..=255u8).cycle().take(5000).collect()])
        .run(move |bytes| {
            let len = bytes.len() as u64;
            let mut rng = SplitMix64::new(
                bytes
                    .iter()
                    .fold(len, |h, &b| h.wrapping_mul(0x100_0000_01b3) ^ u64::from(b)),
            );
            let (s, p, b) = (store.clone(), path.clone(), bytes.to_vec());
            io.run(async move { s.put(&p, PutPayload::from(b)).await.map(|_| ()) })
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
            let piece = 1 + rng.below(len + 64) as usize;
            let chunked: Arc<dyn ObjectStore> = Arc::new(ChunkedStore::new(store.clone(), piece));
            let object = Arc::new(Object {
                url: "memory:///fuzz.tar".into(),
                store: chunked,
                path: path.clone(),
                len,
            });
            let n = 1 + rng.below(24) as usize;
            let spans: Vec<Range<u64>> = (0..n)
                .map(|_| {
                    let start = rng.below(len + 32);
                    start..start + rng.below(len.min(4096) + 32)
                })
                .collect();
            let out = shuffle_buffer(0..n, 1 + rng.below(8) as usize, &mut rng);
            let mut place = vec![0; n];
            for (o, &q) in out.iter().enumerate() {
                place[q] = o;
            }
            let run = spans
                .iter()
                .enumerate()
                .map(|(q, span)| Planned {
                    index: q,
                    shard: 0,
                    span: span.clone(),
                    out: place[q],
                })
                .collect();
            let streamer = Streamer::new(
                io.clone(),
                vec![object],
                1 + rng.below(2 * len + 64) as usize,
                (rng.below(4) as usize, rng.below(2) == 0),
                [0, rng.below(4 * len + 64) as usize, 1 << 30][rng.below(3) as usize],
            );
            streamer.plan((0, 1), run, n);
            for &q in &out {
                let span = spans[q].clone();
                // An empty span asks for nothing, wherever it starts.
                let inside = span.end <= len || span.is_empty();
                match streamer.take(q, 0, span.clone()) {
                    Ok(got) if inside => {
                        let want = bytes.get(span.start as usize..span.end as usize);
                        let want = want.unwrap_or_default();
                        if got.host_bytes() != want {
                            return Err(format!("sample {q} ({span:?}): other bytes"));
                        }
                    }
                    Ok(got) => {
                        return Err(format!(
                            "sample {q} ({span:?}) past the {len} bytes came back with {}",
                            got.host_bytes().len()
                        ));
                    }
                    Err(e) if inside => {
                        return Err(format!("sample {q} ({span:?}) inside {len} bytes: {e}"));
                    }
                    Err(_) => {}
                }
            }
            let plan = streamer.shared.plans.read().unwrap()[0].1.clone();
            match streamer.shared.held(&plan) {
                0 => Ok(()),
                held => Err(format!("{held} bytes held once every sample was taken")),
            }
        });
}
