//! Host staging: the copy threads gather pageable (or otherwise unreachable) sources into the
//! move's pinned staging block; as pieces land, they are sent to the device in runs of at least
//! [`chunk`] bytes, so the device copies start while staging goes on.

use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;

use super::dma::check_cu;
use crate::batch::PART_ALIGN;
use crate::copy::{self, HostCopy, Piece};
use crate::cuda::CudaDevice;
use crate::error::{Error, Result};
use crate::transfer::fault::Faults;

/// Staged bytes are sent to the device in copies of at least this many bytes (the last one
/// excepted): a sixteenth of the batch's staged bytes, between 1 and 4 MiB, or
/// `PINNABLE_STAGE_CHUNK` bytes. Small enough that the first copy starts soon after staging does
/// and that little is left to send once staging ends (the last chunk waits for the last piece);
/// large enough that the copy engine's own cost per copy stays small.
fn chunk(staged_bytes: usize) -> usize {
    static CHUNK: OnceLock<Option<usize>> = OnceLock::new();
    let forced = *CHUNK.get_or_init(|| {
        std::env::var("PINNABLE_STAGE_CHUNK")
            .ok()
            .and_then(|v| v.parse().ok())
    });
    forced.unwrap_or((staged_bytes / 16).clamp(1 << 20, 4 << 20))
}

/// A run of staged bytes to send to the device in one copy.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Run {
    src: *const u8,
    dst: u64,
    bytes: usize,
    /// Whether the bytes between this run and a neighbour may be sent with them (both in the
    /// batch's arena, where the staging block and the device mirror each other, padding
    /// included).
    mergeable: bool,
    /// The staged copy the run starts in.
    copy: usize,
}

impl Run {
    /// Extends `self` over `next` when `next` follows it in both host and device memory: right
    /// after it within one staged copy, or with at most the arena's alignment padding between
    /// them when both lie in the arena. Copies outside the arena go to allocations of their
    /// own, which may happen to lie side by side on the device: one device copy must not
    /// cross from one into the next (the driver refuses it).
    fn absorb(&mut self, next: &Run) -> bool {
        let end = self.src as usize + self.bytes;
        let gap = (next.src as usize).wrapping_sub(end);
        let same_shift = (next.src as usize).wrapping_sub(self.src as usize) as u64
            == next.dst.wrapping_sub(self.dst);
        let adjacent = (gap == 0 && next.copy == self.copy)
            || (self.mergeable && next.mergeable && gap < PART_ALIGN);
        if same_shift && adjacent {
            self.bytes = next.src as usize + next.bytes - self.src as usize;
            true
        } else {
            false
        }
    }
}

/// Which staged pieces have landed and which are sent: turns landed pieces into runs, each
/// sent once the landed, unsent pieces around it make at least a chunk. Pieces land in about
/// the order they are handed out, but a copy thread the system pauses must not hold back the
/// pieces after its own: a block of landed pieces goes as soon as it is a chunk, wherever it
/// lies; what is left goes when the last piece lands.
struct Frontier<'a> {
    pieces: &'a [Piece],
    staged: &'a [HostCopy],
    staged_dst: &'a [Option<(u64, bool)>],
    chunk: usize,
    /// The bytes each piece sends.
    piece_bytes: Vec<usize>,
    state: Mutex<State>,
}

struct State {
    done: Vec<bool>,
    sent: Vec<bool>,
    landed: usize,
}

impl<'a> Frontier<'a> {
    fn new(
        pieces: &'a [Piece],
        staged: &'a [HostCopy],
        staged_dst: &'a [Option<(u64, bool)>],
        chunk: usize,
    ) -> Frontier<'a> {
        let piece_bytes = pieces
            .iter()
            .map(|p| {
                p.writes(staged)
                    .filter(|(c, _)| staged_dst[*c].is_some())
                    .map(|(_, range)| range.len())
                    .sum()
            })
            .collect();
        Frontier {
            pieces,
            staged,
            staged_dst,
            chunk,
            piece_bytes,
            state: Mutex::new(State {
                done: vec![false; pieces.len()],
                sent: vec![false; pieces.len()],
                landed: 0,
            }),
        }
    }

    /// Notes that piece `i` landed; returns the runs now ready to send. The work under the lock
    /// is a few steps per piece (a piece of rows is one range however many rows it holds); the
    /// caller sends the runs after the lock is released.
    fn land(&self, i: usize) -> Vec<Run> {
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let f = &mut *guard;
        f.done[i] = true;
        f.landed += 1;
        let n = self.pieces.len();
        let send: Vec<usize> = if f.landed == n {
            // The last piece: everything not yet sent.
            (0..n).filter(|&k| !f.sent[k]).collect()
        } else {
            let (mut lo, mut hi) = (i, i);
            while lo > 0 && f.done[lo - 1] && !f.sent[lo - 1] {
                lo -= 1;
            }
            while hi + 1 < n && f.done[hi + 1] && !f.sent[hi + 1] {
                hi += 1;
            }
            let bytes: usize = self.piece_bytes[lo..=hi].iter().sum();
            if bytes < self.chunk {
                return Vec::new();
            }
            (lo..=hi).collect()
        };
        for &k in &send {
            f.sent[k] = true;
        }
        drop(guard);
        self.runs(&send)
    }

    /// The runs that send `pieces` (in staging order), neighbours merged.
    fn runs(&self, pieces: &[usize]) -> Vec<Run> {
        let mut ready = Vec::new();
        let mut pending: Option<Run> = None;
        for &k in pieces {
            for (c, range) in self.pieces[k].writes(self.staged) {
                // Bytes that stay in staging (the SMs convert them from there) are not sent.
                let Some((dst, mergeable)) = self.staged_dst[c] else {
                    continue;
                };
                let piece = Run {
                    // SAFETY: within the copy's staging destination.
                    src: unsafe { self.staged[c].dst.add(range.start) },
                    dst: dst + range.start as u64,
                    bytes: range.len(),
                    mergeable,
                    copy: c,
                };
                let merged = pending.as_mut().is_some_and(|run| run.absorb(&piece));
                if !merged && let Some(run) = pending.replace(piece) {
                    ready.push(run);
                }
            }
        }
        ready.extend(pending);
        ready
    }
}

/// Gathers the staged sources into pinned memory on the copy threads and sends each landed
/// run to the device (each copy to its `staged_dst`, or nowhere for `None`).
pub(in crate::transfer) fn stage_and_send(
    dev: &Arc<CudaDevice>,
    staged: &[HostCopy],
    staged_dst: &[Option<(u64, bool)>],
) -> Result<()> {
    let stream = &dev.copy_stream;
    let pieces = copy::plan(staged);
    let chunk = chunk(staged.iter().map(|c| c.src.bytes()).sum());
    let frontier = Frontier::new(&pieces, staged, staged_dst, chunk);
    // The copy threads enqueue for the thread that started the move.
    let faults = Faults::current();
    let on_piece = |i: usize| -> Result<()> {
        let runs = frontier.land(i);
        if runs.is_empty() {
            return Ok(());
        }
        dev.ctx
            .bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        for run in runs {
            faults.enqueue("cuMemcpyHtoDAsync")?;
            // SAFETY: the run's staging bytes were written by finished pieces (and are guarded
            // by the ready event from here on); its device range lies in a live allocation.
            let r = unsafe {
                sys::cuMemcpyHtoDAsync_v2(run.dst, run.src.cast(), run.bytes, stream.cu_stream())
            };
            check_cu(r, "cuMemcpyHtoDAsync")?;
        }
        Ok(())
    };
    // SAFETY: sources are held by the move; each destination is a staging block written by
    // nothing else.
    unsafe { copy::run_pieces(staged, &pieces, copy::Share::ThreeQuarters, Some(&on_piece)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::copy::{RowCopies, Src};
    use crate::loader::SplitMix64;
    use crate::pieces::StartTable;
    use crate::tensor::HostSrc;

    const KIB: usize = 1 << 10;

    fn rng(test: &str) -> SplitMix64 {
        SplitMix64::for_test(test)
    }

    /// Lands every piece in a random order; returns each landing's runs, checking that no run
    /// covers a piece that has not landed yet.
    fn land_all(f: &Frontier<'_>, r: &mut SplitMix64) -> Vec<Vec<Run>> {
        let n = f.pieces.len();
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, (r.next_u64() % (i as u64 + 1)) as usize);
        }
        let mut landed = vec![false; n];
        let mut runs = Vec::new();
        for i in order {
            landed[i] = true;
            let sent = f.land(i);
            for run in &sent {
                // Every staged byte of the run was written by a landed piece.
                let (lo, hi) = (run.src as usize, run.src as usize + run.bytes);
                for (p, piece) in f.pieces.iter().enumerate() {
                    for (c, range) in piece.writes(f.staged) {
                        let at = f.staged[c].dst as usize;
                        let (a, b) = (at + range.start, at + range.end);
                        if a < hi && lo < b {
                            assert!(landed[p], "run {lo:#x}..{hi:#x} sent before piece {p}");
                        }
                    }
                }
            }
            runs.push(sent);
        }
        runs
    }

    /// Every staged byte of `runs` once, at its place on the device.
    fn assert_covers(runs: &[Run], stage: *const u8, dst: u64, bytes: usize) {
        let mut spans: Vec<(usize, usize)> = runs
            .iter()
            .map(|r| {
                assert_eq!(
                    r.dst - dst,
                    (r.src as usize - stage as usize) as u64,
                    "{r:?}"
                );
                (r.src as usize - stage as usize, r.bytes)
            })
            .collect();
        spans.sort_unstable();
        let mut at = 0;
        for (from, len) in spans {
            assert_eq!(from, at, "every staged byte sent once");
            at += len;
        }
        assert_eq!(at, bytes, "every staged byte sent once");
    }

    #[test]
    fn landed_rows_are_sent_in_runs_of_at_least_a_chunk_whatever_the_order() {
        let mut r = rng("frontier rows");
        let (rows, len) = (2048, KIB);
        let src = vec![0u8; 4 << 20];
        let mut stage = vec![0u8; rows * len];
        let starts: Vec<usize> = (0..rows).map(|_| (r.next_u64() % 4096) as usize).collect();
        for (mergeable, in_order) in [(true, false), (false, false), (true, true)] {
            let staged = [HostCopy {
                src: Src::RowCopies(RowCopies {
                    base: src.as_ptr(),
                    stride: KIB,
                    len,
                    starts: Arc::new(StartTable::new(&starts)),
                }),
                dst: stage.as_mut_ptr(),
            }];
            let dst = 1 << 40;
            let staged_dst = [Some((dst, mergeable))];
            // Pieces of 32 rows, as on a host of many copy threads.
            let pieces: Vec<Piece> = (0..rows / 32)
                .map(|k| Piece {
                    copies: 0..1,
                    part: copy::Part::RowCopies(k * 32..(k + 1) * 32),
                })
                .collect();
            let chunk = 200 * KIB;
            let f = Frontier::new(&pieces, &staged, &staged_dst, chunk);
            let landings: Vec<Vec<Run>> = if in_order {
                (0..pieces.len()).map(|i| f.land(i)).collect()
            } else {
                land_all(&f, &mut r)
            };
            // Only what the last landing flushes may be shorter than a chunk.
            let (last, before) = landings.split_last().expect("pieces");
            assert!(before.iter().flatten().all(|run| run.bytes >= chunk));
            let runs: Vec<Run> = before.iter().flatten().chain(last).cloned().collect();
            assert_covers(&runs, stage.as_ptr(), dst, rows * len);
            if in_order {
                // In order, a chunk goes as soon as it is complete: 2 MiB in runs of 224 KiB
                // (whole pieces of 32 KiB past the 200 KiB chunk), and what is left.
                assert!(
                    runs[..runs.len() - 1]
                        .iter()
                        .all(|run| run.bytes == 224 * KIB)
                );
                assert_eq!(runs.len(), (rows * len).div_ceil(224 * KIB));
            }
        }
    }

    #[test]
    fn a_paused_piece_holds_back_only_its_own_block() {
        let src = vec![0u8; 64 * KIB];
        let mut stage = vec![0u8; 64 * KIB];
        let starts: Vec<usize> = (0..64).collect();
        let staged = [HostCopy {
            src: Src::RowCopies(RowCopies {
                base: src.as_ptr(),
                stride: KIB,
                len: KIB,
                starts: Arc::new(StartTable::new(&starts)),
            }),
            dst: stage.as_mut_ptr(),
        }];
        let staged_dst = [Some((1 << 40, true))];
        let pieces: Vec<Piece> = (0..16)
            .map(|k| Piece {
                copies: 0..1,
                part: copy::Part::RowCopies(k * 4..(k + 1) * 4),
            })
            .collect();
        // Chunks of two pieces; piece 1 lands last.
        let f = Frontier::new(&pieces, &staged, &staged_dst, 8 * KIB);
        assert!(f.land(0).is_empty());
        assert!(f.land(2).is_empty());
        let sent = f.land(3);
        assert_eq!(sent.len(), 1);
        assert_eq!(
            (
                sent[0].src as usize - stage.as_ptr() as usize,
                sent[0].bytes
            ),
            (8 * KIB, 8 * KIB)
        );
        let mut runs = sent;
        for i in 4..16 {
            runs.extend(f.land(i));
        }
        runs.extend(f.land(1));
        assert_covers(&runs, stage.as_ptr(), 1 << 40, 64 * KIB);
    }

    #[test]
    fn runs_merge_only_within_a_copy_or_the_arena_and_skip_bytes_kept_in_staging() {
        let mut r = rng("frontier copies");
        let src = vec![7u8; 64 * KIB];
        let mut stage = vec![0u8; 64 * KIB];
        let base = stage.as_mut_ptr();
        let view = |at: usize, len: usize| HostSrc::new(src[at..].as_ptr(), 1, &[len], &[1]);
        // Copies at staging offsets 0, 1 KiB + padding, 3 KiB, 4 KiB, 6 KiB, 8 KiB.
        let layout = [
            (0, KIB, Some(true)),
            (KIB + 64, KIB, Some(true)),
            (3 * KIB, KIB, Some(false)),
            (4 * KIB, KIB, Some(false)),
            (6 * KIB, KIB, None),
            (8 * KIB, KIB, Some(true)),
        ];
        let staged: Vec<HostCopy> = layout
            .iter()
            .map(|&(at, len, _)| HostCopy {
                src: Src::View(view(at, len)),
                dst: base.wrapping_add(at),
            })
            .collect();
        let dst = 1 << 40;
        let staged_dst: Vec<_> = layout
            .iter()
            .map(|&(at, _, d)| d.map(|m| (dst + at as u64, m)))
            .collect();
        let pieces: Vec<Piece> = (0..staged.len())
            .map(|i| Piece {
                copies: i..i + 1,
                part: copy::Part::Whole,
            })
            .collect();
        let f = Frontier::new(&pieces, &staged, &staged_dst, 1 << 20);
        let runs: Vec<Run> = land_all(&f, &mut r).into_iter().flatten().collect();
        let got: Vec<(usize, u64, usize)> = runs
            .iter()
            .map(|run| (run.src as usize - base as usize, run.dst - dst, run.bytes))
            .collect();
        // The first two merge over their padding (both in the arena); the next two, outside
        // the arena, stay apart even right after each other (they may be allocations of their
        // own, side by side on the device); the copy kept in staging is not sent, and the last
        // stands alone.
        assert_eq!(
            got,
            [
                (0, 0, 2 * KIB + 64),
                (3 * KIB, 3 * KIB as u64, KIB),
                (4 * KIB, 4 * KIB as u64, KIB),
                (8 * KIB, 8 * KIB as u64, KIB)
            ]
        );
    }

    /// The staging half of the host route, timed on the host alone: 32 MiB batches of random
    /// rows of a 256 MiB array gathered by the copy threads into staging, with the frontier's
    /// bookkeeping (the device copies left out), against one copy of 32 MiB. Run with
    /// `cargo test --release -p pinnable --lib staging_speed -- --ignored --nocapture`.
    #[test]
    #[ignore = "a timing, for release builds"]
    fn staging_speed() {
        const SOURCE: usize = 256 << 20;
        const BATCH: usize = 32 << 20;
        let mut r = rng("staging speed");
        let src: Vec<u8> = (0..SOURCE).map(|i| (i % 251) as u8).collect();
        let mut stage = vec![1u8; BATCH];
        let median = |mut f: Box<dyn FnMut() + '_>| {
            f();
            let mut t: Vec<f64> = (0..9)
                .map(|_| {
                    let start = std::time::Instant::now();
                    f();
                    start.elapsed().as_secs_f64()
                })
                .collect();
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        };
        let one = median(Box::new(|| {
            // SAFETY: both buffers hold at least BATCH bytes and do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), stage.as_mut_ptr(), BATCH) }
        }));
        println!(
            "{} copy threads; one copy of 32 MiB on one thread: {:.3} ms ({:.1} GB/s)",
            copy::copy_threads(),
            one * 1e3,
            BATCH as f64 / one / 1e9
        );
        for row in [256, KIB, 4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, 1 << 20] {
            let n = SOURCE / row;
            let starts: Vec<usize> = (0..BATCH / row)
                .map(|_| (r.next_u64() % n as u64) as usize)
                .collect();
            let starts = Arc::new(StartTable::new(&starts));
            let t = median(Box::new(|| {
                let staged = [HostCopy {
                    src: Src::RowCopies(RowCopies {
                        base: src.as_ptr(),
                        stride: row,
                        len: row,
                        starts: starts.clone(),
                    }),
                    dst: stage.as_mut_ptr(),
                }];
                let staged_dst = [Some((1 << 40, true))];
                let pieces = copy::plan(&staged);
                let f = Frontier::new(&pieces, &staged, &staged_dst, chunk(BATCH));
                let on_piece = |i: usize| -> Result<()> {
                    drop(f.land(i));
                    Ok(())
                };
                let share = copy::Share::ThreeQuarters;
                // SAFETY: `src` and `stage` outlive the call; the rows lie within `src`.
                let staged = unsafe { copy::run_pieces(&staged, &pieces, share, Some(&on_piece)) };
                staged.expect("staged");
            }));
            println!(
                "{:>5} KiB rows: staged in {:.3} ms ({:.1} GB/s, {:.2}x one copy)",
                row as f64 / KIB as f64,
                t * 1e3,
                BATCH as f64 / t / 1e9,
                one / t
            );
        }
    }
}
