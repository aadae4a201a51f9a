//! A chunk's body, arriving in pieces, cut into its samples: a sample that lies inside one
//! piece keeps a slice of it (no copy) while the pieces so kept stay under a bound; a sample
//! cut across pieces, or any sample past the bound, is copied into a buffer of its own.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use super::super::streams::Held;
use crate::tensor::HostBytes;

/// The bytes of the received pieces that untaken samples keep, shared by a stream's fetches.
pub(super) type Ledger = Arc<AtomicU64>;

/// A received piece some samples keep slices of: its bytes count in the ledger until the
/// last of those samples is taken (or let go).
pub(super) struct Piece {
    len: u64,
    ledger: Ledger,
}

impl Piece {
    fn new(len: usize, ledger: &Ledger) -> Arc<Piece> {
        ledger.fetch_add(len as u64, Ordering::Relaxed);
        Arc::new(Piece {
            len: len as u64,
            ledger: ledger.clone(),
        })
    }
}

impl Drop for Piece {
    fn drop(&mut self) {
        self.ledger.fetch_sub(self.len, Ordering::Relaxed);
    }
}

/// A slice of a received piece, as a sample's bytes.
struct Slice(Bytes);

impl HostBytes for Slice {
    fn host_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// A sample's bytes as they arrived.
pub(super) enum Part {
    Waiting,
    /// A slice of the one piece that holds them all, and that piece's place in the ledger.
    Slice(Bytes, Arc<Piece>),
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

    /// The bytes for the worker that takes the sample; the piece's place in the ledger, which
    /// the stream gives up when the sample is taken; and the bytes held in a buffer of the
    /// sample's own.
    pub(super) fn into_held(self) -> (Held, Option<Arc<Piece>>, u64) {
        match self {
            Part::Waiting => (Arc::new(Vec::new()), None, 0),
            Part::Slice(b, piece) => (Arc::new(Slice(b)), Some(piece), 0),
            Part::Own(v) => {
                let len = v.len() as u64;
                (Arc::new(v), None, len)
            }
        }
    }
}

/// Cuts a chunk's body, arriving in pieces, into its samples' parts (the bytes between
/// samples, if any, are passed over).
pub(super) struct Split {
    /// The object offset of the next byte to arrive.
    at: u64,
    spans: Vec<Range<u64>>,
    pub(super) parts: Vec<Part>,
    /// The span being filled.
    next: usize,
    ledger: Ledger,
    /// Samples keep slices of a piece only while the ledger is under this.
    keep_under: u64,
}

impl Split {
    /// A chunk from object offset `start`, cut at `spans`; slices kept while `ledger` is under
    /// `keep_under` bytes when their piece arrives.
    pub(super) fn new(
        start: u64,
        spans: Vec<Range<u64>>,
        ledger: &Ledger,
        keep_under: u64,
    ) -> Split {
        let parts = spans.iter().map(|_| Part::Waiting).collect();
        Split {
            at: start,
            spans,
            parts,
            next: 0,
            ledger: ledger.clone(),
            keep_under,
        }
    }

    pub(super) fn put(&mut self, piece: Bytes) {
        let keep = self.ledger.load(Ordering::Relaxed) < self.keep_under;
        let mut place: Option<Arc<Piece>> = None;
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
            let part = &mut self.parts[self.next];
            if keep && self.at == span.start && n as u64 == len {
                let place = place.get_or_insert_with(|| Piece::new(piece.len(), &self.ledger));
                *part = Part::Slice(piece.slice(off..off + n), place.clone());
            } else {
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

    fn seeded(test: &str) -> SplitMix64 {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(7, |d| d.as_nanos() as u64);
        println!("{test}: seed {seed}");
        SplitMix64::for_epoch(seed, 0)
    }

    /// Spans with gaps between them, a body cut into pieces at random: each part is its
    /// span; with room in the ledger, exactly the spans inside one piece are slices of it (no
    /// copy) and the ledger holds those pieces once each until their last sample goes; with
    /// none, every part is a copy and the ledger stays empty.
    #[test]
    fn split_cuts_any_pieces_into_the_spans() {
        let mut rng = seeded("split_cuts_any_pieces_into_the_spans");
        for case in 0..60 {
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
            let ledger = Arc::new(AtomicU64::new(0));
            let keep = case % 3 != 0;
            let mut split = Split::new(
                start,
                spans.clone(),
                &ledger,
                if keep { u64::MAX } else { 0 },
            );
            let mut pieces: Vec<(u64, Bytes)> = Vec::new();
            let mut rest = &body[..];
            let mut offset = start;
            while !rest.is_empty() {
                let n = (1 + rng.below(4000) as usize).min(rest.len());
                let piece = Bytes::copy_from_slice(&rest[..n]);
                pieces.push((offset, piece.clone()));
                split.put(piece);
                rest = &rest[n..];
                offset += n as u64;
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
                        let p = &pieces[k].1;
                        assert_eq!(
                            b.as_ptr(),
                            p[(span.start - pieces[k].0) as usize..].as_ptr()
                        );
                        kept.insert(k);
                    }
                    (Part::Own(_), None) => {}
                    (Part::Own(_), Some(_)) if !keep => {}
                    _ => panic!("span {span:?}: a slice where a copy was due, or the reverse"),
                }
            }
            let want: u64 = kept.iter().map(|&k| pieces[k].1.len() as u64).sum();
            assert_eq!(ledger.load(Ordering::Relaxed), want, "case {case}");
            drop(split);
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
                let keep_under = u64::from(head[6]) * 64;
                let mut split = Split::new(start, spans.clone(), &ledger, keep_under);
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
