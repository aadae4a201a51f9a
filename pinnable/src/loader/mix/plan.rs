//! A mix's plan: for each place of an epoch, the source it draws from and which of that
//! source's samples it takes.

use super::{Mix, Shares, Stop};
use crate::loader::dataset::Dataset;
use crate::loader::plan::PlanRequest;
use crate::loader::sampler::{SplitMix64, permutation};

impl<D: Dataset> Mix<D> {
    /// Which source each place of epoch `epoch` draws from, and where each source's reading
    /// starts (its draws before this epoch: non-zero only for [`Stop::Forever`]).
    fn draws(&self, epoch: u64, seed: u64) -> (Vec<u32>, Vec<u64>) {
        let k = self.sources.len();
        let mut before = vec![0u64; k];
        if let Stop::Forever { samples } = self.stop {
            match &self.shares {
                Shares::Counts(c) => {
                    let batches = (samples / c.iter().sum::<usize>()) as u64;
                    for (b, &c) in before.iter_mut().zip(c) {
                        *b = epoch.saturating_mul(batches).saturating_mul(c as u64);
                    }
                }
                Shares::Weights(w) => {
                    for (b, q) in before.iter_mut().zip(quotas(w, samples)) {
                        *b = epoch.saturating_mul(q as u64);
                    }
                }
            }
        }
        (self.epoch_draws(epoch, seed), before)
    }

    /// The source of each place of epoch `epoch`.
    fn epoch_draws(&self, epoch: u64, seed: u64) -> Vec<u32> {
        let mut rng = SplitMix64::for_epoch(seed ^ 0x4D49_5844_5241_5753, epoch);
        let mut out = Vec::with_capacity(self.len);
        match &self.shares {
            Shares::Counts(counts) => {
                let mut block: Vec<u32> = counts
                    .iter()
                    .enumerate()
                    .flat_map(|(s, &c)| std::iter::repeat_n(s as u32, c))
                    .collect();
                while out.len() < self.len {
                    for i in (1..block.len()).rev() {
                        let j = rng.below(i as u64 + 1) as usize;
                        block.swap(i, j);
                    }
                    out.extend_from_slice(&block);
                }
            }
            Shares::Weights(w) if matches!(self.stop, Stop::Forever { .. }) => {
                // Each source's share, exactly, in a random order: where each source stands
                // at any epoch is then known without replaying the epochs before.
                out.extend(
                    quotas(w, self.len)
                        .into_iter()
                        .enumerate()
                        .flat_map(|(s, q)| std::iter::repeat_n(s as u32, q)),
                );
                for i in (1..out.len()).rev() {
                    let j = rng.below(i as u64 + 1) as usize;
                    out.swap(i, j);
                }
            }
            Shares::Weights(w) if self.stop == Stop::EachOnce => {
                let mut left: Vec<usize> = self.lens().collect();
                let mut sum: f64 = w.iter().sum();
                while out.len() < self.len {
                    let mut u = unit(rng.next_u64()) * sum;
                    let mut pick = None;
                    for (s, (&l, &w)) in left.iter().zip(w).enumerate() {
                        if l == 0 {
                            continue;
                        }
                        pick = Some(s);
                        if u < w {
                            break;
                        }
                        u -= w;
                    }
                    let s = pick.expect("a source with samples left while the epoch goes on");
                    left[s] -= 1;
                    if left[s] == 0 {
                        sum -= w[s];
                    }
                    out.push(s as u32);
                }
            }
            Shares::Weights(w) => {
                // Cumulative thresholds on 53-bit uniforms: a fixed, exact comparison.
                let sum: f64 = w.iter().sum();
                let mut acc = 0.0;
                let mut cuts: Vec<f64> = w
                    .iter()
                    .map(|w| {
                        acc += w / sum;
                        acc
                    })
                    .collect();
                *cuts.last_mut().expect("a source") = f64::INFINITY;
                while out.len() < self.len {
                    let u = unit(rng.next_u64());
                    let s = cuts.partition_point(|&c| c <= u);
                    out.push(s as u32);
                }
            }
        }
        out
    }

    /// Pass `pass` over source `s`: its indices in the order read.
    fn pass(&self, s: usize, epoch: u64, pass: u64, seed: Option<u64>) -> Vec<usize> {
        let d = &self.sources[s];
        // Forever: passes go on across epochs, so they are keyed by the pass alone.
        let key = match self.stop {
            Stop::Forever { .. } => pass,
            _ => SplitMix64::for_epoch(epoch, pass).next_u64() >> 1,
        };
        let request = PlanRequest::new(key);
        let request = match seed {
            Some(seed) => request.shuffle(seed),
            None => request,
        };
        let planned = d
            .plan(&request)
            .map(|p| p.indices().to_vec())
            .filter(|p| !p.is_empty() && p.iter().all(|&i| i < d.len()));
        match (planned, seed) {
            (Some(p), _) => p,
            (None, None) => (0..d.len()).collect(),
            (None, Some(seed)) => {
                let seed = SplitMix64::for_epoch(seed, s as u64).next_u64();
                permutation(d.len(), seed, key)
            }
        }
    }

    /// The whole epoch's plan (every rank's), as indices into the sources laid end to end.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::loader::{Mix, Stop};
    ///
    /// let mix = Mix::per_batch(vec![(vec![0u8; 4], 1), (vec![0u8; 2], 1)])?.stop(Stop::FirstExhausted)?;
    /// let plan = mix.order(0, Some(9));
    /// assert_eq!(plan.len(), 4); // 2 batches of one sample each
    /// assert_eq!(plan.iter().filter(|&&i| i >= 4).count(), 2); // one from the second source each
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn order(&self, epoch: u64, seed: Option<u64>) -> Vec<usize> {
        let (draws, before) = self.draws(epoch, seed.unwrap_or(0));
        // Each source's reading: its pass, the place in it, and the pass's order (made when
        // the source is first drawn), as indices into the sources laid end to end.
        struct Reading {
            pass: u64,
            at: usize,
            order: Vec<usize>,
        }
        let mut reading: Vec<Option<Reading>> = Vec::new();
        reading.resize_with(self.sources.len(), || None);
        let mut out = Vec::with_capacity(draws.len());
        for s in draws {
            let s = s as usize;
            let r = match &mut reading[s] {
                Some(r) if r.at < r.order.len() => r,
                slot => {
                    let len = self.sources[s].len() as u64;
                    let (pass, at) = match slot {
                        Some(r) => (r.pass + 1, 0),
                        None => (before[s] / len, (before[s] % len) as usize),
                    };
                    let offset = self.offsets[s];
                    let mut order = self.pass(s, epoch, pass, seed);
                    order.iter_mut().for_each(|i| *i += offset);
                    // A source's own plan may be shorter than the source: start it over.
                    let at = if at < order.len() { at } else { 0 };
                    slot.insert(Reading { pass, at, order })
                }
            };
            out.push(r.order[r.at]);
            r.at += 1;
        }
        out
    }
}

/// The samples of each source in `n` under weights `w`: each share rounded down, the rest
/// given one each to the largest remainders (the lower source first on a tie).
fn quotas(w: &[f64], n: usize) -> Vec<usize> {
    let sum: f64 = w.iter().sum();
    let exact: Vec<f64> = w.iter().map(|w| n as f64 * w / sum).collect();
    let mut q: Vec<usize> = exact.iter().map(|e| e.floor() as usize).collect();
    let mut rest: Vec<usize> = (0..w.len()).collect();
    rest.sort_by(|&a, &b| {
        let (fa, fb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    let short = n.saturating_sub(q.iter().sum());
    for &s in rest.iter().cycle().take(short) {
        q[s] += 1;
    }
    q
}

/// A 53-bit uniform number in `[0, 1)`.
fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}
