//! A chunk's body, arriving in pieces, cut into its samples: a sample that lies inside one
//! piece keeps a slice of it (no copy) while the pieces so kept stay under a bound; a sample
//! cut across pieces, or any sample past the bound, is copied into a buffer of its own.
//!
//! A piece is a slice of the HTTP client's read buffer, and a slice keeps that whole buffer
//! alive; consecutive pieces of one buffer lie back to back. So the pieces are charged by
//! buffer: the pieces that touch share one charge, the bytes they span but at least
//! [`LEAST_CHARGE`], held until the last slice of them is dropped (by the worker's sample,
//! a batch or a tensor made over its bytes).

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use super::stream::Held;
use crate::tensor::HostBytes;

/// The bytes of the received buffers that samples keep slices of, shared by a stream's
/// fetches.
pub(crate) type Ledger = Arc<AtomicU64>;

/// The least a buffer's slices are charged: hyper's read buffer grows to 8 KiB + 400 KiB,
/// and a piece read into it may be much shorter.
pub(crate) const LEAST_CHARGE: u64 = 8192 + 4096 * 100;

/// One received buffer some samples keep slices of: its charge stays in the ledger until the
/// last of those slices is dropped.
pub(crate) struct Charge {
    charged: AtomicU64,
    ledger: Ledger,
}

impl Charge {
    fn charge(&self, bytes: u64) {
        self.charged.fetch_add(bytes, Ordering::Relaxed);
        self.ledger.fetch_add(bytes, Ordering::Relaxed);
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.ledger
            .fetch_sub(*self.charged.get_mut(), Ordering::Relaxed);
    }
}

/// A slice of a received buffer, as a sample's bytes; the buffer's charge with it.
struct Slice {
    bytes: Bytes,
    _charge: Arc<Charge>,
}

impl HostBytes for Slice {
    fn host_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// A sample's bytes as they arrived.
pub(crate) enum Part {
    Waiting,
    /// A slice of the one piece that holds them all, and that piece's buffer's charge.
    Slice(Bytes, Arc<Charge>),
    Own(Vec<u8>),
}

impl Part {
    #[cfg(test)]
    fn bytes(&self) -> &[u8] {
        match self {
            Part::Waiting => &[],
            Part::Slice(b, _) => b,
            Part::Own(v) => v,
        }
    }

    /// The bytes for the worker that takes the sample, and the bytes of its own buffer (a
    /// slice's charge stays with the slice).
    pub(crate) fn into_held(self) -> (Held, u64) {
        match self {
            Part::Waiting => (Arc::new(Vec::new()), 0),
            Part::Slice(bytes, charge) => (
                Arc::new(Slice {
                    bytes,
                    _charge: charge,
                }),
                0,
            ),
            Part::Own(v) => {
                let len = v.len() as u64;
                (Arc::new(v), len)
            }
        }
    }
}

/// The received pieces lying back to back (one buffer) that slices were kept of.
struct Buffer {
    /// The address of its first byte and one past its last.
    start: usize,
    end: usize,
    charge: Arc<Charge>,
}

/// Cuts a chunk's body, arriving in pieces, into its samples' parts (the bytes between
/// samples, if any, are passed over).
pub(crate) struct Split {
    /// The object offset of the next byte to arrive.
    at: u64,
    spans: Vec<Range<u64>>,
    parts: Vec<Part>,
    /// The span being filled.
    next: usize,
    ledger: Ledger,
    /// Samples keep slices of a piece only while the ledger is under this.
    keep_under: u64,
    /// The least charge of a buffer.
    least: u64,
    /// The buffer the last piece lay in, once a slice of it is kept.
    buffer: Option<Buffer>,
}

impl Split {
    /// A chunk from object offset `start`, cut at `spans`; slices kept while `ledger` is under
    /// `keep_under` bytes when their piece arrives, each buffer charged at least `least`.
    pub(crate) fn new(
        start: u64,
        spans: Vec<Range<u64>>,
        ledger: &Ledger,
        keep_under: u64,
        least: u64,
    ) -> Split {
        let parts = spans.iter().map(|_| Part::Waiting).collect();
        Split {
            at: start,
            spans,
            parts,
            next: 0,
            ledger: ledger.clone(),
            keep_under,
            least,
            buffer: None,
        }
    }

    /// The charge of `piece`'s buffer, raised to the bytes from its first kept piece to the
    /// end of `piece`: the last buffer's, which [`put`](Self::put) keeps only while `piece`
    /// lies in it, or a new one.
    fn charge_for(&mut self, piece: &Bytes) -> Arc<Charge> {
        let buffer = self.buffer.take().unwrap_or_else(|| Buffer {
            start: piece.as_ptr() as usize,
            end: piece.as_ptr() as usize + piece.len(),
            charge: Arc::new(Charge {
                charged: AtomicU64::new(0),
                ledger: self.ledger.clone(),
            }),
        });
        let due = ((buffer.end - buffer.start) as u64).max(self.least);
        let charged = buffer.charge.charged.load(Ordering::Relaxed);
        buffer.charge.charge(due.saturating_sub(charged));
        let charge = buffer.charge.clone();
        self.buffer = Some(buffer);
        charge
    }

    /// The samples' parts; the split's own hold on the last buffer's charge ends here, before
    /// the parts are handed on.
    pub(crate) fn into_parts(self) -> Vec<Part> {
        self.parts
    }

    pub(crate) fn put(&mut self, piece: Bytes) {
        // A piece that follows the buffer's last back to back is more of that buffer.
        let (from, to) = (
            piece.as_ptr() as usize,
            piece.as_ptr() as usize + piece.len(),
        );
        match &mut self.buffer {
            Some(b) if b.end == from => b.end = to,
            Some(b) if b.start <= from && to <= b.end => {}
            _ => self.buffer = None,
        }
        let keep = self.ledger.load(Ordering::Relaxed) < self.keep_under;
        let mut charge: Option<Arc<Charge>> = None;
        let mut off = 0;
        while off < piece.len() {
            let Some(span) = self.spans.get(self.next) else {
                return;
            };
            if self.at >= span.end {
                self.next += 1;
                continue;
            }
            let rest = (piece.len() - off) as u64;
            if self.at < span.start {
                let n = (span.start - self.at).min(rest);
                self.at += n;
                off += n as usize;
                continue;
            }
            let len = span.end - span.start;
            let n = (span.end - self.at).min(rest) as usize;
            if keep && self.at == span.start && n as u64 == len {
                let charge = match &charge {
                    Some(c) => c.clone(),
                    None => charge.insert(self.charge_for(&piece)).clone(),
                };
                self.parts[self.next] = Part::Slice(piece.slice(off..off + n), charge);
            } else {
                let part = &mut self.parts[self.next];
                if !matches!(part, Part::Own(_)) {
                    *part = Part::Own(Vec::with_capacity(len as usize));
                }
                if let Part::Own(v) = part {
                    v.extend_from_slice(&piece[off..off + n]);
                }
            }
            self.at += n as u64;
            off += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use bytes::Bytes;

    use super::{Part, Split};
    use crate::loader::SplitMix64;

    /// Spans with gaps between them, a body cut into pieces at random: each part is its
    /// span; with room in the ledger, exactly the spans inside one piece are slices of it (no
    /// copy), and the ledger holds each buffer once (pieces of one buffer, back to back: the
    /// bytes from the first kept piece on; pieces each their own buffer: each kept one), at
    /// least the least charge, until the last slice goes; with none, every part is a copy and
    /// the ledger stays empty.
    #[test]
    fn split_cuts_any_pieces_into_the_spans() {
        let mut rng = SplitMix64::for_test("split_cuts_any_pieces_into_the_spans");
        for case in 0..90 {
            let start = rng.below(10_000);
            let mut at = start;
            let mut spans = Vec::new();
            for _ in 0..1 + rng.below(12) {
                at += rng.below(3) * rng.below(700);
                let len = 1 + rng.below(3000);
                spans.push(at..at + len);
                at += len;
            }
            let body: Vec<u8> = (start..at).map(|_| rng.next_u64() as u8).collect();
            let whole = Bytes::from(body.clone());
            let ledger = Arc::new(AtomicU64::new(0));
            let keep = case % 3 != 0;
            let one_buffer = case % 2 == 0;
            let least = [0, 1000, 1 << 20][rng.below(3) as usize];
            let keep_under = if keep { u64::MAX } else { 0 };
            let mut split = Split::new(start, spans.clone(), &ledger, keep_under, least);
            let mut pieces: Vec<(u64, Bytes)> = Vec::new();
            let mut offset = start;
            while offset < at {
                let n = (1 + rng.below(4000)).min(at - offset);
                let from = (offset - start) as usize;
                let piece = if one_buffer {
                    whole.slice(from..from + n as usize)
                } else {
                    Bytes::copy_from_slice(&body[from..from + n as usize])
                };
                pieces.push((offset, piece.clone()));
                split.put(piece);
                offset += n;
            }
            let mut kept = std::collections::BTreeSet::new();
            for (span, part) in spans.iter().zip(&split.parts) {
                let (from, bytes) = ((span.start - start) as usize, part.bytes());
                assert_eq!(bytes.len() as u64, span.end - span.start, "span {span:?}");
                assert_eq!(bytes, &body[from..from + bytes.len()], "span {span:?}");
                let inside = pieces
                    .iter()
                    .position(|(o, p)| *o <= span.start && span.end <= *o + p.len() as u64);
                match (part, inside) {
                    (Part::Slice(b, _), Some(k)) if keep => {
                        let (o, p) = &pieces[k];
                        assert_eq!(b.as_ptr(), p[(span.start - o) as usize..].as_ptr());
                        kept.insert(k);
                    }
                    (Part::Own(_), None) => {}
                    (Part::Own(_), Some(_)) if !keep => {}
                    _ => panic!("span {span:?}: a slice where a copy was due, or the reverse"),
                }
            }
            let want = match (kept.first(), kept.last()) {
                (None, _) | (_, None) => 0,
                (Some(&k0), Some(&k1)) if one_buffer => {
                    let end = pieces[k1].0 + pieces[k1].1.len() as u64;
                    (end - pieces[k0].0).max(least)
                }
                _ => kept
                    .iter()
                    .map(|&k| (pieces[k].1.len() as u64).max(least))
                    .sum(),
            };
            assert_eq!(ledger.load(Ordering::Relaxed), want, "case {case}");
            // The charge stays while a slice lives, wherever it went, and only so long.
            let last = split.parts.pop();
            drop(split);
            if let Some(Part::Slice(..)) = &last {
                assert!(ledger.load(Ordering::Relaxed) > 0, "case {case}");
            }
            drop(last);
            assert_eq!(ledger.load(Ordering::Relaxed), 0, "case {case}");
        }
    }

    /// Hostile bodies: a server's bytes of any length, in any pieces, cut by spans read from
    /// the same bytes, never panic and never fill a sample past its span; a body that covers
    /// every span fills each exactly.
    #[test]
    fn fuzzed_bodies_split_within_their_spans() {
        let seeds: Vec<Vec<u8>> = (0u8..4)
            .map(|k| {
                (0..64 + 200 * usize::from(k))
                    .map(|i| (i * 7 + usize::from(k)) as u8)
                    .collect()
            })
            .collect();
        crate::fuzz::Fuzz::new("remote_split")
            .seeds(seeds)
            .run(|bytes| {
                let Some((head, body)) = bytes.split_first_chunk::<8>() else {
                    return Ok(());
                };
                let start = u64::from(head[0]);
                let mut at = start;
                let spans: Vec<std::ops::Range<u64>> = head[1..6]
                    .iter()
                    .map(|&b| {
                        let span = at + u64::from(b & 3)..at + u64::from(b & 3) + u64::from(b >> 2);
                        at = span.end;
                        span
                    })
                    .collect();
                let ledger = Arc::new(AtomicU64::new(0));
                let keep_under = u64::from(head[6] & 0x7f) * 64;
                let least = u64::from(head[6] >> 7) * 300;
                let mut split = Split::new(start, spans.clone(), &ledger, keep_under, least);
                let piece = 1 + usize::from(head[7]);
                for chunk in body.chunks(piece) {
                    split.put(Bytes::copy_from_slice(chunk));
                }
                let covered = start + body.len() as u64 >= at;
                for (span, part) in spans.iter().zip(&split.parts) {
                    let (len, part) = (span.end - span.start, part.bytes());
                    if part.len() as u64 > len || (covered && part.len() as u64 != len) {
                        return Err(format!("{} bytes for span {span:?}", part.len()));
                    }
                    let from = (span.start - start) as usize;
                    if *part != body[from.min(body.len())..][..part.len()] {
                        return Err(format!("span {span:?} holds other bytes"));
                    }
                }
                drop(split);
                match ledger.load(Ordering::Relaxed) {
                    0 => Ok(()),
                    n => Err(format!("{n} bytes left in the ledger")),
                }
            });
    }
}
