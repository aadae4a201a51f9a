//! A bounded property test for parsers of untrusted bytes: every file format the crate reads
//! (`.npy` headers today) is fed seeds and mutations of them, and must answer each with an
//! error or a value its check accepts, without panicking or hanging.
//!
//! ```text
//! Fuzz::new("npy_header")
//!     .seeds(valid_files)            // a small corpus of good inputs
//!     .tokens(&[b"'descr'", b"("])   // fragments the format is made of, spliced in
//!     .run(|bytes| { /* parse; Err(why) for a wrong value */ Ok(()) });
//! ```
//!
//! Inputs are mutations of the seeds (bit flips, boundary values, truncations, insertions,
//! deletions, splices of two seeds, format tokens) and plain random bytes, from a seeded
//! generator: a failure prints the seed and the input, and `PINNABLE_TEST_SEED=<seed>` replays
//! the run. A run stops after its case count or its time, whichever comes first, so it fits in the
//! normal test run. Each case runs on a worker thread; a case that takes longer than the stall
//! limit fails the test as a hang, naming its input.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::loader::SplitMix64;

/// Bytes that sit on parsing boundaries: zero, signs, extremes, and ASCII that formats use.
const INTERESTING: &[u8] = b"\x00\x01\x7f\x80\xff09 \n\t'\"(){}[],:LTF-.<>|";

/// A property test over one parser; see the [module docs](self).
pub(crate) struct Fuzz {
    name: String,
    seeds: Vec<Vec<u8>>,
    tokens: Vec<Vec<u8>>,
    cases: usize,
    time: Duration,
    stall: Duration,
}

impl Fuzz {
    /// A run named `name` (in failure messages), with the default budget: 100 000 cases or 3
    /// seconds (60 cases under Miri), and 20 seconds for one case.
    pub(crate) fn new(name: &str) -> Fuzz {
        Fuzz {
            name: name.to_owned(),
            seeds: Vec::new(),
            tokens: Vec::new(),
            cases: if cfg!(miri) { 60 } else { 100_000 },
            time: Duration::from_secs(3),
            stall: Duration::from_secs(20),
        }
    }

    /// Good inputs to start mutations from.
    pub(crate) fn seeds(mut self, seeds: impl IntoIterator<Item = Vec<u8>>) -> Fuzz {
        self.seeds.extend(seeds);
        self
    }

    /// Fragments of the format (keywords, delimiters) to splice into inputs.
    pub(crate) fn tokens(mut self, tokens: &[&[u8]]) -> Fuzz {
        self.tokens.extend(tokens.iter().map(|t| t.to_vec()));
        self
    }

    /// At most `cases` inputs.
    #[allow(dead_code)]
    pub(crate) fn cases(mut self, cases: usize) -> Fuzz {
        self.cases = cases;
        self
    }

    /// Feeds the inputs to `check`, which parses one and returns `Err(why)` when the parser
    /// accepted it with a wrong value (an error from the parser is a right answer).
    ///
    /// # Panics
    ///
    /// When `check` fails or panics on an input, or takes longer than the stall limit: the
    /// message names the run's seed and the input.
    pub(crate) fn run(self, check: impl Fn(&[u8]) -> Result<(), String> + Send + 'static) {
        let seed = crate::test_seed::seed(&self.name);
        let current = Arc::new(Mutex::new(Vec::new()));
        let done = Arc::new(AtomicU64::new(0));
        let (tx, rx) = std::sync::mpsc::channel::<Result<usize, String>>();
        let (name, cases, time, stall) = (self.name.clone(), self.cases, self.time, self.stall);
        let (cur, progress, worker_name) = (current.clone(), done.clone(), name.clone());
        let worker = std::thread::spawn(move || {
            let name = worker_name;
            let mut rng = SplitMix64::new(seed);
            let start = Instant::now();
            let mut n = 0;
            while n < cases && (n < 100 || start.elapsed() < time) {
                let input = self.input(&mut rng);
                *cur.lock().unwrap_or_else(|e| e.into_inner()) = input.clone();
                let outcome = catch_unwind(AssertUnwindSafe(|| check(&input)));
                let failure = match outcome {
                    Ok(Ok(())) => None,
                    Ok(Err(why)) => Some(format!("a wrong value: {why}")),
                    Err(p) => Some(format!("a panic: {}", panic_text(&*p))),
                };
                if let Some(f) = failure {
                    let _ = tx.send(Err(format!(
                        "{name}: case {n} (PINNABLE_TEST_SEED={seed}) got {f}; input {}",
                        show(&input)
                    )));
                    return;
                }
                n += 1;
                progress.store(n as u64, Ordering::Relaxed);
            }
            let _ = tx.send(Ok(n));
        });
        let mut last = (0, Instant::now());
        loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(Ok(n)) => {
                    worker.join().expect("the fuzz worker returned");
                    println!("{name}: {n} cases");
                    return;
                }
                Ok(Err(failure)) => panic!("{failure}"),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("{name}: the fuzz worker died (PINNABLE_TEST_SEED={seed})")
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    let n = done.load(Ordering::Relaxed);
                    if n != last.0 {
                        last = (n, Instant::now());
                    } else if last.1.elapsed() > stall {
                        let input = current.lock().unwrap_or_else(|e| e.into_inner()).clone();
                        panic!(
                            "{name}: case {n} (PINNABLE_TEST_SEED={seed}) hangs; input {}",
                            show(&input)
                        );
                    }
                }
            }
        }
    }

    /// One input: random bytes now and then, otherwise a seed with one to four mutations.
    fn input(&self, rng: &mut SplitMix64) -> Vec<u8> {
        if self.seeds.is_empty() || rng.below(10) == 0 {
            let len = rng.below(256) as usize;
            return (0..len).map(|_| rng.next_u64() as u8).collect();
        }
        let mut v = self.seeds[rng.below(self.seeds.len() as u64) as usize].clone();
        for _ in 0..1 + rng.below(4) {
            self.mutate(&mut v, rng);
        }
        v
    }

    fn mutate(&self, v: &mut Vec<u8>, rng: &mut SplitMix64) {
        let at = |rng: &mut SplitMix64, len: usize| rng.below(len as u64 + 1) as usize;
        match rng.below(9) {
            0 if !v.is_empty() => {
                let i = at(rng, v.len() - 1);
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = at(rng, v.len() - 1);
                v[i] = INTERESTING[rng.below(INTERESTING.len() as u64) as usize];
            }
            2 => v.truncate(at(rng, v.len())),
            3 => {
                let i = at(rng, v.len());
                let n = 1 + rng.below(16) as usize;
                let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                v.splice(i..i, bytes);
            }
            4 => {
                let i = at(rng, v.len());
                let j = (i + 1 + rng.below(32) as usize).min(v.len());
                v.drain(i..j);
            }
            5 if !self.tokens.is_empty() => {
                let t = &self.tokens[rng.below(self.tokens.len() as u64) as usize];
                let i = at(rng, v.len());
                v.splice(i..i, t.iter().copied());
            }
            6 if !self.seeds.is_empty() => {
                let other = &self.seeds[rng.below(self.seeds.len() as u64) as usize];
                let (i, j) = (at(rng, v.len()), at(rng, other.len()));
                v.truncate(i);
                v.extend_from_slice(&other[j..]);
            }
            7 if v.len() >= 2 => {
                // An extreme little-endian integer of 1, 2, 4 or 8 bytes (lengths, counts).
                let width = 1usize << rng.below(4);
                let value: u64 = [0, 1, u64::MAX, 1 << 31, 1 << 16, 1 << 40][rng.below(6) as usize];
                let i = at(rng, v.len().saturating_sub(width));
                for (k, b) in value.to_le_bytes().iter().take(width).enumerate() {
                    if let Some(x) = v.get_mut(i + k) {
                        *x = *b;
                    }
                }
            }
            _ => {
                let i = at(rng, v.len());
                let j = (i + 1 + rng.below(16) as usize).min(v.len());
                let copy = v[i..j].to_vec();
                v.splice(j..j, copy);
            }
        }
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-string payload".into())
}

/// An input for a failure message: its length and bytes, escaped.
fn show(input: &[u8]) -> String {
    format!("({} bytes) b\"{}\"", input.len(), input.escape_ascii())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parser_that_panics_on_some_input_is_caught_and_named() {
        let caught = std::panic::catch_unwind(|| {
            Fuzz::new("fuzz_self_test")
                .seeds([b"ab".to_vec()])
                .run(|bytes| {
                    assert!(bytes.len() <= 2, "more than two bytes break it");
                    Ok(())
                });
        });
        let message = panic_text(&*caught.expect_err("the panic is reported"));
        assert!(
            message.contains("a panic: more than two bytes break it"),
            "{message}"
        );
        assert!(message.contains("PINNABLE_TEST_SEED="), "{message}");
    }

    #[test]
    #[cfg_attr(miri, ignore = "leaves a sleeping thread behind")]
    fn a_parser_that_hangs_fails_the_run_instead_of_hanging_it() {
        let caught = std::panic::catch_unwind(|| {
            let mut fuzz = Fuzz::new("fuzz_self_test").seeds([b"ab".to_vec()]);
            fuzz.stall = Duration::from_millis(500);
            fuzz.run(|bytes| {
                if bytes.len() > 2 {
                    // Stands for a parser stuck in a loop, without burning a core.
                    std::thread::sleep(Duration::from_secs(3600));
                }
                Ok(())
            });
        });
        let message = panic_text(&*caught.expect_err("the hang is reported"));
        assert!(message.contains("hangs; input"), "{message}");
    }

    #[test]
    fn a_wrong_value_fails_the_run() {
        let caught = std::panic::catch_unwind(|| {
            Fuzz::new("fuzz_self_test").run(|bytes| {
                if bytes.len() > 3 {
                    Err("too long".into())
                } else {
                    Ok(())
                }
            });
        });
        let message = panic_text(&*caught.expect_err("the wrong value is reported"));
        assert!(message.contains("a wrong value: too long"), "{message}");
    }
}
