//! Gzip-compressed shards (`.tar.gz`, told by their first two bytes, `1f 8b`, whatever their
//! name): decompressed as a stream by flate2 (its pure-Rust miniz_oxide backend), never held
//! whole. Their members are copies, decompressed; never views of a mapping.
//!
//! A compressed shard cannot be read at an offset without decompressing everything before it,
//! so it is read in order: the index pass decompresses it once, reading its headers; each
//! epoch the loader runs, the samples of the compressed shards in the epoch's run are
//! decompressed in stream order by the worker that first needs one of them (one worker a
//! shard at a time), and the samples passed on the way are held until their workers take
//! them: the shuffle buffer's worth and the batches in flight, as for remote shards, and for
//! a resumed epoch at most 1024 samples before its position. Offsets in errors count
//! decompressed bytes. A sample read outside the epoch's run decompresses from where the
//! shard's decoder stands, or from the start when the sample lies before it. Compressed bytes
//! are read a chunk at a time (1 MiB from a file, [`Storage::chunk_size`](crate::storage::Storage::chunk_size) from
//! a store), each read when decompression needs it.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::io::{self, BufRead, Read};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use flate2::bufread::MultiGzDecoder;

use super::ByteSource;
use super::sample::Held;

/// The first two bytes of a gzip stream.
const MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The compressed bytes read from a shard at a time (each a positioned read, or a ranged
/// request for a remote shard).
pub(crate) const LOCAL_CHUNK: usize = 1 << 20;

/// The decompressed bytes decoded at a time while skipping to an offset.
const SKIP: usize = 64 << 10;

/// `u64::MAX`: the decompressed length is not known yet.
const UNKNOWN: u64 = u64::MAX;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `bytes` start as a gzip stream.
pub(crate) fn is_gzip(bytes: &dyn ByteSource) -> bool {
    bytes.len() >= 2 && bytes.read_at(0, 2).is_ok_and(|b| *b == MAGIC)
}

/// The compression a shard's first bytes show, when it is one that is not read (bzip2, xz,
/// zstd): its name and the command that decompresses it.
pub(crate) fn unread_compression(bytes: &dyn ByteSource) -> Option<(&'static str, &'static str)> {
    let start = bytes.read_at(0, 6.min(bytes.len() as usize)).ok()?;
    if start.starts_with(b"BZh") {
        Some(("bzip2", "bunzip2"))
    } else if start.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        Some(("xz", "unxz"))
    } else if start.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Some(("zstd", "unzstd"))
    } else {
        None
    }
}

/// A shard's compressed bytes, read in order a chunk at a time (or borrowed where the shard
/// is in memory).
struct Compressed {
    bytes: Arc<dyn ByteSource>,
    chunk: usize,
    /// The offset of the next byte not consumed.
    next: u64,
    buf: Vec<u8>,
    /// The bytes of `buf` consumed.
    pos: usize,
}

impl Read for Compressed {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let available = self.fill_buf()?;
        let n = available.len().min(out.len());
        out[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for Compressed {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        let len = self.bytes.len();
        if self.bytes.in_memory().is_some() {
            let whole = self.bytes.in_memory().unwrap_or(&[]);
            let from = usize::try_from(self.next).map_or(whole.len(), |n| n.min(whole.len()));
            return Ok(&whole[from..]);
        }
        if self.pos == self.buf.len() && self.next < len {
            let n = (len - self.next).min(self.chunk as u64) as usize;
            let read = self.bytes.read_at(self.next, n)?;
            if read.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("no compressed byte could be read at byte {}", self.next),
                ));
            }
            self.buf = read.into_owned();
            self.pos = 0;
        }
        Ok(&self.buf[self.pos..])
    }

    fn consume(&mut self, n: usize) {
        if self.bytes.in_memory().is_none() {
            self.pos = (self.pos + n).min(self.buf.len());
        }
        self.next += n as u64;
    }
}

/// A decoder standing at decompressed byte `pos`.
struct Cursor {
    decoder: MultiGzDecoder<Compressed>,
    pos: u64,
    scratch: Vec<u8>,
}

/// A gzip-compressed shard, read as its decompressed bytes. Reads go forward through one
/// decoder; a read before where it stands starts it again from the first byte.
pub(crate) struct Gz {
    raw: Arc<dyn ByteSource>,
    chunk: usize,
    cursor: Mutex<Option<Cursor>>,
    /// The decompressed length once decompression has reached the end; [`UNKNOWN`] before.
    len: AtomicU64,
    /// The furthest decompressed byte reached (where a corrupt stream ends what can be read).
    furthest: AtomicU64,
    /// How many times decompression started from the first byte.
    #[cfg(test)]
    pub(crate) starts: std::sync::atomic::AtomicUsize,
}

impl Gz {
    /// The shard whose compressed bytes are `raw`, read `chunk` bytes at a time.
    pub(crate) fn new(raw: Arc<dyn ByteSource>, chunk: usize) -> Gz {
        Gz {
            raw,
            chunk: chunk.max(1 << 10),
            cursor: Mutex::new(None),
            len: AtomicU64::new(UNKNOWN),
            furthest: AtomicU64::new(0),
            #[cfg(test)]
            starts: Default::default(),
        }
    }

    /// The decompressed length, once decompression has reached the end.
    pub(crate) fn known_len(&self) -> Option<u64> {
        Some(self.len.load(Ordering::Acquire)).filter(|&l| l != UNKNOWN)
    }

    /// Drops the shard's decoder and its buffers (the next read starts again from the first
    /// byte).
    pub(crate) fn release(&self) {
        *lock(&self.cursor) = None;
    }

    /// Up to `len` decompressed bytes from `offset`: fewer where the stream ends first.
    ///
    /// # Errors
    ///
    /// A compressed byte that cannot be read, a stream that is not valid gzip or deflate.
    fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        self.read_through(&mut lock(&self.cursor), offset, len)
    }

    /// As [`read`](Self::read), through the decoder in `slot` (an epoch's own, or the
    /// shard's).
    fn read_through(
        &self,
        slot: &mut Option<Cursor>,
        offset: u64,
        len: usize,
    ) -> io::Result<Vec<u8>> {
        let read = self.read_with(slot, offset, len);
        if let Some(c) = slot.as_ref() {
            self.furthest.fetch_max(c.pos, Ordering::Relaxed);
        }
        if read.is_err() {
            // A decoder that failed is not used again.
            *slot = None;
        }
        read
    }

    fn read_with(&self, slot: &mut Option<Cursor>, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        if slot.as_ref().is_none_or(|c| c.pos > offset) {
            #[cfg(test)]
            self.starts.fetch_add(1, Ordering::Relaxed);
            *slot = Some(Cursor {
                decoder: MultiGzDecoder::new(Compressed {
                    bytes: self.raw.clone(),
                    chunk: self.chunk,
                    next: 0,
                    buf: Vec::new(),
                    pos: 0,
                }),
                pos: 0,
                scratch: vec![0; SKIP],
            });
        }
        let Some(c) = slot.as_mut() else {
            return Ok(Vec::new());
        };
        while c.pos < offset {
            let want = (offset - c.pos).min(SKIP as u64) as usize;
            let n = read_some(&mut c.decoder, &mut c.scratch[..want])?;
            if n == 0 {
                self.len.store(c.pos, Ordering::Release);
                return Ok(Vec::new());
            }
            c.pos += n as u64;
        }
        let mut out = Vec::new();
        out.try_reserve_exact(len)
            .map_err(|e| io::Error::new(io::ErrorKind::OutOfMemory, e))?;
        out.resize(len, 0);
        let mut filled = 0;
        while filled < len {
            let n = read_some(&mut c.decoder, &mut out[filled..])?;
            if n == 0 {
                self.len.store(c.pos, Ordering::Release);
                break;
            }
            filled += n;
            c.pos += n as u64;
        }
        out.truncate(filled);
        Ok(out)
    }

    /// The bytes of `span`, whole, through the decoder in `slot`.
    fn span(&self, slot: &mut Option<Cursor>, span: &Range<u64>) -> io::Result<Held> {
        let len = usize::try_from(span.end - span.start)
            .map_err(|_| io::Error::new(io::ErrorKind::OutOfMemory, "a sample too long"))?;
        let bytes = self.read_through(slot, span.start, len)?;
        if bytes.len() != len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "it decompresses to {} bytes, short of the sample's end: the shard changed \
                     since it was opened",
                    span.start + bytes.len() as u64
                ),
            ));
        }
        Ok(Arc::new(bytes))
    }
}

/// One read, passing over interruptions; gzip and deflate errors say they are.
fn read_some(decoder: &mut impl Read, out: &mut [u8]) -> io::Result<usize> {
    loop {
        match decoder.read(out) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData
                ) =>
            {
                return Err(io::Error::new(
                    e.kind(),
                    format!("the gzip stream is corrupt ({e}): copy the shard again"),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("the gzip stream ends early ({e}): it is truncated; copy it again"),
                ));
            }
            other => return other,
        }
    }
}

impl ByteSource for Gz {
    /// The decompressed length: known once decompression has reached the end, found by
    /// decompressing the rest of the shard otherwise (of a corrupt stream, the bytes that
    /// decompress before the damage).
    fn len(&self) -> u64 {
        if let Some(len) = self.known_len() {
            return len;
        }
        let _ = self.read(u64::MAX - 1, 0);
        self.known_len()
            .unwrap_or_else(|| self.furthest.load(Ordering::Relaxed))
    }

    fn read_at(&self, offset: u64, len: usize) -> io::Result<Cow<'_, [u8]>> {
        self.read(offset, len).map(Cow::Owned)
    }
}

/// A sample taken this many places after the epoch's first taken (its output position) may
/// still come: samples passed on the way are held unless they lie further before it. A
/// resumed epoch thus holds at most this many samples before its position.
const LATE: usize = 1024;

/// A shard's samples of a run not yet decompressed (index and span), in stream order, and
/// the decoder that reads them.
#[derive(Default)]
struct Waiting {
    samples: VecDeque<(usize, Range<u64>)>,
    decoder: Option<Cursor>,
}

/// One compressed shard's part of an epoch's run: its samples waiting, and those
/// decompressed but not yet taken.
#[derive(Default)]
struct Queue {
    order: Mutex<Waiting>,
    /// By sample: its latest output position, `None` while waiting in `order` or its bytes
    /// once decompressed, and how many takes of it the run still holds (a rank's run repeats
    /// samples from the start of the epoch's order to make every rank's count equal).
    held: Mutex<Taken>,
}

/// By sample: its latest output position, its bytes once decompressed, its takes left.
type Taken = HashMap<usize, (usize, Option<Held>, usize)>;

/// Sample `index`'s bytes for one take, from `held`: kept there while the run holds more
/// takes of it.
fn hand_out(held: &mut Taken, index: usize) -> Option<Held> {
    let entry = held.get_mut(&index)?;
    let bytes = entry.1.clone()?;
    if entry.2 > 1 {
        entry.2 -= 1;
    } else {
        held.remove(&index);
    }
    Some(bytes)
}

/// An epoch's run, shard by shard.
struct Plan {
    queues: HashMap<usize, Queue>,
    /// The least output position taken so far.
    least: AtomicUsize,
}

/// Streams each epoch's samples of the compressed shards in order to the workers (see the
/// [module docs](self)).
pub(crate) struct GzStreams {
    /// Shard by shard: its decoder, for a compressed shard.
    gz: Vec<Option<Arc<Gz>>>,
    /// The latest plan of each rank (`(rank, world)`): loaders built per device share the
    /// shards, each its own run and decoders.
    plans: RwLock<HashMap<(usize, usize), Arc<Plan>>>,
}

impl GzStreams {
    /// The streams of the compressed shards among `gz`, if any is.
    pub(crate) fn new(gz: Vec<Option<Arc<Gz>>>) -> Option<GzStreams> {
        gz.iter().any(Option::is_some).then(|| GzStreams {
            gz,
            plans: RwLock::default(),
        })
    }

    /// Shard `shard`'s decoder, when it is compressed.
    #[cfg(test)]
    pub(crate) fn decoder(&self, shard: usize) -> Option<&Gz> {
        self.gz.get(shard)?.as_deref()
    }

    /// The samples decompressed and not yet taken.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        let plans = self.plans.read().unwrap_or_else(|p| p.into_inner());
        let held = |q: &Queue| lock(&q.held).values().filter(|h| h.1.is_some()).count();
        plans
            .values()
            .flat_map(|p| p.queues.values())
            .map(held)
            .sum()
    }

    /// Whether shard `shard` is compressed.
    pub(crate) fn has(&self, shard: usize) -> bool {
        self.gz.get(shard).is_some_and(Option::is_some)
    }

    /// Rank `rank` (of `world`)'s next epoch's run: `(index, shard, span, out)` of each sample
    /// in stream order (`out` its output position; those of plain shards are passed over).
    pub(crate) fn plan(
        &self,
        (rank, world): (usize, usize),
        run: impl Iterator<Item = (usize, usize, Range<u64>, usize)>,
    ) {
        let mut queues: HashMap<usize, Queue> = HashMap::new();
        for (index, shard, span, out) in run.filter(|r| self.has(r.1)) {
            let q = queues.entry(shard).or_default();
            let held = q.held.get_mut().unwrap_or_else(|p| p.into_inner());
            if let Some(again) = held.get_mut(&index) {
                // A repeat: decompressed once, handed out to each take.
                again.0 = again.0.max(out);
                again.2 += 1;
                continue;
            }
            held.insert(index, (out, None, 1));
            let order = q.order.get_mut().unwrap_or_else(|p| p.into_inner());
            order.samples.push_back((index, span));
        }
        // The decoder only goes forward: each shard's samples in the order they lie in it (a
        // repeat from the start of the epoch's order may come last in the run).
        for q in queues.values_mut() {
            let order = q.order.get_mut().unwrap_or_else(|p| p.into_inner());
            order
                .samples
                .make_contiguous()
                .sort_by_key(|(_, span)| span.start);
        }
        let plan = Plan {
            queues,
            least: AtomicUsize::new(usize::MAX),
        };
        let mut plans = self.plans.write().unwrap_or_else(|p| p.into_inner());
        plans.insert((rank, world), Arc::new(plan));
    }

    /// Sample `index`'s bytes (`span` of compressed shard `shard`): held if decompressed on
    /// the way to another, decompressed up to it if it is waiting in a rank's run, read on
    /// its own otherwise.
    pub(crate) fn take(&self, index: usize, shard: usize, span: Range<u64>) -> io::Result<Held> {
        let Some(Some(gz)) = self.gz.get(shard) else {
            return Err(io::Error::other("not a compressed shard"));
        };
        let planned = {
            let plans = self.plans.read().unwrap_or_else(|p| p.into_inner());
            plans.values().find_map(|plan| {
                let out = lock(&plan.queues.get(&shard)?.held).get(&index)?.0;
                Some((plan.clone(), out))
            })
        };
        if let Some((plan, out)) = planned
            && let Some(q) = plan.queues.get(&shard)
        {
            plan.least.fetch_min(out, Ordering::Relaxed);
            let mut waiting = lock(&q.order);
            let Waiting {
                samples: order,
                decoder: cursor,
            } = &mut *waiting;
            loop {
                {
                    let mut held = lock(&q.held);
                    match held.get(&index) {
                        Some((_, Some(_), _)) => {
                            return Ok(hand_out(&mut held, index).expect("held"));
                        }
                        Some((_, None, _)) => {}
                        None => break,
                    }
                }
                let Some((i, s)) = order.pop_front() else {
                    break;
                };
                let bytes = gz.span(cursor, &s);
                if order.is_empty() {
                    *cursor = None;
                }
                let floor = plan.least.load(Ordering::Relaxed).saturating_sub(LATE);
                let mut held = lock(&q.held);
                match bytes {
                    Ok(b) if i == index && s == span => {
                        if let Some(h) = held.get_mut(&i) {
                            h.1 = Some(b.clone());
                        }
                        return Ok(hand_out(&mut held, i).unwrap_or(b));
                    }
                    // Before the floor: a resumed epoch's, which no worker will take.
                    Ok(b) => match held.get_mut(&i) {
                        Some((o, h, _)) if *o >= floor => *h = Some(b),
                        _ => {
                            held.remove(&i);
                        }
                    },
                    Err(e) => {
                        held.remove(&i);
                        return Err(e);
                    }
                }
            }
        }
        gz.span(&mut lock(&gz.cursor), &span)
    }
}
