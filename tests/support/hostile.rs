//! Hostile input for parsers: random bytes and valid files mutated the ways files break (bits
//! flipped, bytes overwritten, cut short, spliced, lengths set to extremes), for property tests
//! that every parser returns a value or an error — never a panic, never a hang.

use std::time::{Duration, Instant};

use rand::Rng;

/// One mutation of `seed` (or, a tenth of the time, random bytes of a random length).
pub fn mutate(r: &mut impl Rng, seed: &[u8]) -> Vec<u8> {
    if seed.is_empty() || r.random_ratio(1, 10) {
        let n = r.random_range(0..512);
        return (0..n).map(|_| r.random()).collect();
    }
    let mut b = seed.to_vec();
    for _ in 0..r.random_range(1..=4) {
        let len = b.len().max(1);
        match r.random_range(0..6) {
            // Flip a bit.
            0 if !b.is_empty() => {
                let i = r.random_range(0..b.len());
                b[i] ^= 1 << r.random_range(0..8);
            }
            // Overwrite a run with random bytes.
            1 if !b.is_empty() => {
                let i = r.random_range(0..b.len());
                let n = r.random_range(1..=16).min(b.len() - i);
                for v in &mut b[i..i + n] {
                    *v = r.random();
                }
            }
            // Cut short.
            2 => b.truncate(r.random_range(0..len)),
            // Splice a piece of itself elsewhere.
            3 if b.len() > 2 => {
                let i = r.random_range(0..b.len());
                let n = r.random_range(1..=64).min(b.len() - i);
                let piece = b[i..i + n].to_vec();
                let at = r.random_range(0..b.len());
                b.splice(at..at, piece);
            }
            // A two-byte field set to an extreme (lengths, sizes, counts).
            4 if b.len() > 2 => {
                let i = r.random_range(0..b.len() - 1);
                let v: u16 = [0, 1, 0x7FFF, 0xFFFF][r.random_range(0..4)];
                b[i..i + 2].copy_from_slice(&v.to_be_bytes());
            }
            // Drop a run.
            _ if b.len() > 2 => {
                let i = r.random_range(0..b.len());
                let n = r.random_range(1..=32).min(b.len() - i);
                b.drain(i..i + n);
            }
            _ => {}
        }
    }
    b
}

/// Feeds `cases` mutations of the `seeds` to `parse`, which must return (`Ok` or `Err`, either
/// is fine) within `limit` each; returns how many gave `Ok`.
///
/// # Panics
///
/// If `parse` panics (the panic propagates) or takes longer than `limit` on some input; the
/// message holds that input's length and its first bytes.
pub fn check<T, E>(
    r: &mut impl Rng,
    seeds: &[Vec<u8>],
    cases: usize,
    limit: Duration,
    mut parse: impl FnMut(&[u8]) -> Result<T, E>,
) -> usize {
    let mut ok = 0;
    for case in 0..cases {
        let seed = &seeds[case % seeds.len()];
        let input = mutate(r, seed);
        let start = Instant::now();
        ok += usize::from(parse(&input).is_ok());
        let took = start.elapsed();
        assert!(
            took <= limit,
            "case {case}: {took:?} (over {limit:?}) on {} bytes starting {:02x?}",
            input.len(),
            &input[..input.len().min(16)]
        );
    }
    ok
}
