//! Host copies into pinned memory, spread over a small pool of worker threads.
//!
//! One thread copies about 12 GB/s into pinned memory; a dozen reach well over 100 GB/s on a
//! large host. Small batches stay on the calling thread, where waking workers would cost more
//! than it saves. `PINNABLE_COPY_THREADS` overrides the thread count (the caller included).

use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::tensor::HostSrc;

mod rows;
#[cfg(test)]
mod tests;

pub(crate) use rows::RowCopies;

/// Below this many bytes in total, copies run on the calling thread.
const PARALLEL_MIN_BYTES: usize = 1 << 20;
/// A copy thread is woken only for about this many bytes or more.
const WAKE_MIN_BYTES: usize = 1 << 20;
/// The smallest piece a copy is cut into for the workers.
const MIN_PIECE: usize = 256 << 10;
/// The largest piece: small enough that device copies of finished pieces start early.
const MAX_PIECE: usize = 2 << 20;

/// One copy of host bytes into (pinned) memory at `dst`.
pub(crate) struct HostCopy {
    pub(crate) src: Src,
    pub(crate) dst: *mut u8,
}

// SAFETY: the source and destination are kept alive by the caller until `run` returns, and each
// destination range is written by exactly one piece.
unsafe impl Send for HostCopy {}
// SAFETY: as for Send.
unsafe impl Sync for HostCopy {}

/// Where a copy's bytes come from, written contiguously to its destination.
pub(crate) enum Src {
    /// A view, contiguous or strided.
    View(HostSrc),
    /// Equal rows at listed starts: the pieces of a gather.
    RowCopies(RowCopies),
}

impl From<HostSrc> for Src {
    fn from(src: HostSrc) -> Src {
        Src::View(src)
    }
}

impl Src {
    /// Total bytes copied.
    pub(crate) fn bytes(&self) -> usize {
        match self {
            Src::View(v) => v.bytes(),
            Src::RowCopies(r) => r.bytes(),
        }
    }

    /// # Safety
    ///
    /// As [`run`], for this copy.
    unsafe fn gather(&self, dst: *mut u8) {
        match self {
            // SAFETY: forwarded from the caller.
            Src::View(v) => unsafe { v.gather_streaming(dst) },
            // SAFETY: forwarded from the caller.
            Src::RowCopies(r) => unsafe { r.gather(0..r.starts.len(), dst) },
        }
    }
}

/// A share of the work for one thread: several small copies whole, a part of one large copy,
/// or some rows of one copy of rows. Pieces are listed in the order of the copies, and by
/// offset within each copy.
pub(crate) struct Piece {
    /// The copies this piece runs whole, or the one copy it runs a part of.
    pub(crate) copies: Range<usize>,
    pub(crate) part: Part,
}

/// How much of its copies a [`Piece`] runs.
pub(crate) enum Part {
    /// Every copy whole.
    Whole,
    /// A part of one copy: its source and its destination bytes within the copy's `dst`.
    Bytes(HostSrc, Range<usize>),
    /// RowCopies of one copy of [`RowCopies`], whole.
    RowCopies(Range<usize>),
}

impl Piece {
    /// The destination bytes this piece writes, in order: each copy's index and byte range
    /// within that copy's `dst` (empty copies left out).
    pub(crate) fn writes<'a>(
        &'a self,
        copies: &'a [HostCopy],
    ) -> impl Iterator<Item = (usize, Range<usize>)> + 'a {
        let first = self.copies.start;
        let part = match &self.part {
            Part::Whole => None,
            Part::Bytes(_, dst) => Some((first, dst.clone())),
            Part::RowCopies(rows) => {
                let len = match &copies[first].src {
                    Src::RowCopies(r) => r.len,
                    Src::View(_) => unreachable!("rows are planned from copies of rows"),
                };
                Some((first, rows.start * len..rows.end * len))
            }
        };
        let whole = matches!(self.part, Part::Whole);
        let whole = self
            .copies
            .clone()
            .filter(move |_| whole)
            .map(|i| (i, 0..copies[i].src.bytes()));
        part.into_iter().chain(whole).filter(|(_, r)| !r.is_empty())
    }

    /// The bytes this piece copies.
    fn bytes(&self, copies: &[HostCopy]) -> usize {
        self.writes(copies).map(|(_, r)| r.len()).sum()
    }

    /// Runs the piece.
    ///
    /// # Safety
    ///
    /// As [`run`], for the copies this piece covers.
    unsafe fn gather(&self, copies: &[HostCopy]) {
        let first = &copies[self.copies.start];
        match &self.part {
            // SAFETY: forwarded from the caller; the part lies within the copy's destination.
            Part::Bytes(src, dst) => unsafe { src.gather_streaming(first.dst.add(dst.start)) },
            Part::RowCopies(rows) => {
                let Src::RowCopies(r) = &first.src else {
                    unreachable!("rows are planned from copies of rows")
                };
                // SAFETY: forwarded from the caller; the rows land within the destination.
                unsafe { r.gather(rows.clone(), first.dst.add(rows.start * r.len)) }
            }
            Part::Whole => {
                for c in &copies[self.copies.clone()] {
                    // SAFETY: forwarded from the caller.
                    unsafe { c.src.gather(c.dst) };
                }
            }
        }
    }
}

/// Called after a piece lands, with its index in the plan.
pub(crate) type OnPiece<'a> = &'a (dyn Fn(usize) -> Result<()> + Sync);

/// Cuts the copies into pieces: everything in one piece when the total is small enough for one
/// thread; otherwise pieces of about 256 KiB to 2 MiB, so every thread gets several and the
/// first pieces land early. Small copies are grouped, large ones split (copies of rows between
/// rows, rows longer than a piece within the row).
pub(crate) fn plan(copies: &[HostCopy]) -> Vec<Piece> {
    let total: usize = copies.iter().map(|c| c.src.bytes()).sum();
    plan_for(copies, total, Workers::get().threads + 1)
}

/// [`plan`] for `threads` copy threads.
fn plan_for(copies: &[HostCopy], total: usize, threads: usize) -> Vec<Piece> {
    let target = if total < PARALLEL_MIN_BYTES || threads == 1 {
        usize::MAX
    } else {
        (total / (threads * 4)).clamp(MIN_PIECE, MAX_PIECE)
    };
    let mut out = Vec::new();
    // The group of small copies being gathered into one piece: its first copy and its bytes.
    let mut group: Option<(usize, usize)> = None;
    for (i, c) in copies.iter().enumerate() {
        let bytes = c.src.bytes();
        if bytes <= target {
            match &mut group {
                Some((_, sum)) if *sum + bytes <= target => *sum += bytes,
                _ => {
                    if let Some((first, _)) = group.replace((i, bytes)) {
                        out.push(Piece {
                            copies: first..i,
                            part: Part::Whole,
                        });
                    }
                }
            }
            continue;
        }
        if let Some((first, _)) = group.take() {
            out.push(Piece {
                copies: first..i,
                part: Part::Whole,
            });
        }
        match &c.src {
            Src::View(src) => split(i, src, 0, target, &mut out),
            Src::RowCopies(rows) if rows.len <= target => {
                let per_piece = target / rows.len;
                let n = rows.starts.len();
                out.extend((0..n).step_by(per_piece).map(|a| Piece {
                    copies: i..i + 1,
                    part: Part::RowCopies(a..(a + per_piece).min(n)),
                }));
            }
            Src::RowCopies(rows) => {
                for k in 0..rows.starts.len() {
                    split(i, &rows.row(k), k * rows.len, target, &mut out);
                }
            }
        }
    }
    if let Some((first, _)) = group {
        out.push(Piece {
            copies: first..copies.len(),
            part: Part::Whole,
        });
    }
    out
}

/// Cuts `src`, which copy `i` writes from byte `at` of its destination on, into parts of about
/// `target` bytes.
fn split(i: usize, src: &HostSrc, at: usize, target: usize, out: &mut Vec<Piece>) {
    let (units, unit_bytes) = src.split_unit();
    let per_piece = (target / unit_bytes.max(1)).max(1);
    let mut start = 0;
    while start < units {
        let end = (start + per_piece).min(units);
        let (part, offset) = src.split(start..end);
        let len = part.bytes();
        out.push(Piece {
            copies: i..i + 1,
            part: Part::Bytes(part, at + offset..at + offset + len),
        });
        start = end;
    }
}

/// Runs every copy, in parallel when they are large enough.
///
/// # Safety
///
/// 1. Every source is live and unwritten, and every destination is valid for the source's
///    byte count and written by nothing else, until this returns.
pub(crate) unsafe fn run(copies: &[HostCopy]) -> Result<()> {
    let pieces = plan(copies);
    // SAFETY: forwarded from the caller.
    unsafe { run_pieces(copies, &pieces, Share::All, None) }
}

/// How many of the copy threads to use.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Share {
    /// All of them: host copies alone.
    All,
    /// Three quarters: the copies feed device copies that another thread must keep issuing.
    /// Measured on a 16-core host, 12 threads staged and sent a pageable batch faster than 16.
    ThreeQuarters,
}

/// Runs the planned pieces, on the calling thread alone when there is one piece, calling
/// `on_piece` after each piece lands.
///
/// # Safety
///
/// As [`run`]; `pieces` came from [`plan`] over these `copies`.
pub(crate) unsafe fn run_pieces(
    copies: &[HostCopy],
    pieces: &[Piece],
    share: Share,
    on_piece: Option<OnPiece<'_>>,
) -> Result<()> {
    let workers = Workers::get();
    let threads = match share {
        Share::All => workers.threads,
        Share::ThreeQuarters => ((workers.threads + 1) * 3 / 4).max(1) - 1,
    };
    if pieces.len() <= 1 || threads == 0 {
        for (i, p) in pieces.iter().enumerate() {
            // SAFETY: forwarded from the caller.
            unsafe { p.gather(copies) };
            if let Some(f) = on_piece {
                f(i)?;
            }
        }
        return Ok(());
    }
    let job = Arc::new(Job {
        // SAFETY (for both erased lifetimes): `run_pieces` waits until every piece has finished
        // (`remaining == 0`) before returning, and no worker touches `pieces`, `copies` or
        // `on_piece` after finishing its last piece.
        pieces: pieces as *const [Piece],
        copies: copies as *const [HostCopy],
        // SAFETY: as above: the callback outlives every call the workers make to it.
        on_piece: on_piece
            .map(|f| unsafe { std::mem::transmute::<OnPiece<'_>, OnPiece<'static>>(f) }),
        next: AtomicUsize::new(0),
        remaining: Mutex::new(pieces.len()),
        done: Condvar::new(),
        error: Mutex::new(None),
    });
    // Waking a thread costs more than it saves unless it gets enough to copy.
    let total: usize = pieces.iter().map(|p| p.bytes(copies)).sum();
    let helpers = (pieces.len() - 1).min(threads).min(total / WAKE_MIN_BYTES);
    workers.start(&job, helpers);
    job.work();
    let mut remaining = job.remaining.lock().unwrap_or_else(|e| e.into_inner());
    while *remaining > 0 {
        remaining = job.done.wait(remaining).unwrap_or_else(|e| e.into_inner());
    }
    drop(remaining);
    match job.error.lock().unwrap_or_else(|e| e.into_inner()).take() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

struct Job {
    pieces: *const [Piece],
    copies: *const [HostCopy],
    on_piece: Option<OnPiece<'static>>,
    next: AtomicUsize,
    remaining: Mutex<usize>,
    done: Condvar,
    error: Mutex<Option<Error>>,
}

// SAFETY: `pieces` and `copies` point at Send + Sync values that outlive every use (see
// `run_pieces`).
unsafe impl Send for Job {}
// SAFETY: as for Send; shared state is atomics and mutexes.
unsafe impl Sync for Job {}

impl Job {
    /// Takes pieces until none are left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            // A worker that arrives after every piece was taken must not touch the slices: the
            // caller may already have returned and freed them. The length lives in the pointer.
            if i >= self.pieces.len() {
                return;
            }
            // SAFETY: piece `i` is not done yet, so `run_pieces` is still waiting and keeps
            // `pieces` and `copies` alive.
            let (pieces, copies) = unsafe { (&*self.pieces, &*self.copies) };
            let p = &pieces[i];
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                // SAFETY: `run`'s caller guarantees the sources and destinations; the piece's
                // destination bytes are written by this piece alone.
                unsafe { p.gather(copies) };
                match self.on_piece {
                    Some(f) => f(i),
                    None => Ok(()),
                }
            }));
            let err = match outcome {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(_) => Some(Error::Field {
                    path: "host copy".into(),
                    message: "a copy thread panicked; nothing was returned and the source is \
                              intact. This is a bug in pinnable: please report it with the \
                              batch's shapes and dtypes"
                        .into(),
                }),
            };
            if let Some(e) = err {
                self.error
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert(e);
            }
            let mut remaining = self.remaining.lock().unwrap_or_else(|e| e.into_inner());
            *remaining -= 1;
            if *remaining == 0 {
                self.done.notify_all();
            }
        }
    }
}

/// The worker threads, started on first use.
struct Workers {
    threads: usize,
    senders: Vec<Mutex<Sender<Arc<Job>>>>,
}

impl Workers {
    fn get() -> &'static Workers {
        static WORKERS: OnceLock<Workers> = OnceLock::new();
        WORKERS.get_or_init(|| {
            let threads = std::env::var("PINNABLE_COPY_THREADS")
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or_else(|| {
                    std::thread::available_parallelism()
                        .map_or(1, |n| n.get())
                        .min(16)
                })
                .max(1)
                - 1;
            let mut senders = Vec::with_capacity(threads);
            for i in 0..threads {
                let (tx, rx) = channel::<Arc<Job>>();
                let spawned = std::thread::Builder::new()
                    .name(format!("pinnable-copy-{i}"))
                    .spawn(move || {
                        while let Ok(job) = rx.recv() {
                            job.work();
                        }
                    });
                if spawned.is_ok() {
                    senders.push(Mutex::new(tx));
                }
            }
            Workers {
                threads: senders.len(),
                senders,
            }
        })
    }

    fn start(&self, job: &Arc<Job>, helpers: usize) {
        for s in self.senders.iter().take(helpers) {
            let _ = s
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .send(job.clone());
        }
    }
}

/// How many threads copies use (the caller included).
pub fn copy_threads() -> usize {
    Workers::get().threads + 1
}
