//! The pool's counters: lock-free while the pool runs, read together as a [`PoolStats`].

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

/// The live counters of a pool. Each is its own atomic; a snapshot is not one instant, but
/// each figure is exact once the pool is quiet.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) in_use: AtomicUsize,
    pub(crate) requested: AtomicUsize,
    pub(crate) peak_in_use: AtomicUsize,
    pub(crate) cached: AtomicUsize,
    pub(crate) pending: AtomicUsize,
    pub(crate) pending_blocks: AtomicUsize,
    pub(crate) reserved: AtomicUsize,
    pub(crate) allocations: AtomicU64,
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    pub(crate) budget_waits: AtomicU64,
    pub(crate) backend_allocs: AtomicU64,
    pub(crate) backend_frees: AtomicU64,
    pub(crate) alloc_ns_total: AtomicU64,
    pub(crate) alloc_ns_max: AtomicU64,
    pub(crate) free_ns_total: AtomicU64,
    pub(crate) free_ns_max: AtomicU64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Counters {
    /// A block of `capacity` bytes for a request of `requested` bytes was handed out.
    pub(crate) fn hand_out(&self, capacity: usize, requested: usize) {
        let now = self.in_use.fetch_add(capacity, Relaxed) + capacity;
        self.peak_in_use.fetch_max(now, Relaxed);
        self.requested.fetch_add(requested, Relaxed);
        self.allocations.fetch_add(1, Relaxed);
    }

    /// A handed-out block came back.
    pub(crate) fn take_back(&self, capacity: usize, requested: usize) {
        self.in_use.fetch_sub(capacity, Relaxed);
        self.requested.fetch_sub(requested, Relaxed);
    }

    pub(crate) fn backend_alloc(&self, took: Duration) {
        self.backend_allocs.fetch_add(1, Relaxed);
        self.alloc_ns_total.fetch_add(nanos(took), Relaxed);
        self.alloc_ns_max.fetch_max(nanos(took), Relaxed);
    }

    pub(crate) fn backend_free(&self, took: Duration) {
        self.backend_frees.fetch_add(1, Relaxed);
        self.free_ns_total.fetch_add(nanos(took), Relaxed);
        self.free_ns_max.fetch_max(nanos(took), Relaxed);
    }

    pub(crate) fn snapshot(&self, budget: Option<usize>, cap: Option<usize>) -> PoolStats {
        PoolStats {
            in_use_bytes: self.in_use.load(Relaxed),
            requested_bytes: self.requested.load(Relaxed),
            peak_in_use_bytes: self.peak_in_use.load(Relaxed),
            cached_bytes: self.cached.load(Relaxed),
            pending_bytes: self.pending.load(Relaxed),
            pending_blocks: self.pending_blocks.load(Relaxed),
            reserved_bytes: self.reserved.load(Relaxed),
            max_bytes: budget,
            max_cached_bytes: cap,
            allocations: self.allocations.load(Relaxed),
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            budget_waits: self.budget_waits.load(Relaxed),
            backend_allocs: self.backend_allocs.load(Relaxed),
            backend_frees: self.backend_frees.load(Relaxed),
            backend_alloc_time: Duration::from_nanos(self.alloc_ns_total.load(Relaxed)),
            backend_alloc_time_max: Duration::from_nanos(self.alloc_ns_max.load(Relaxed)),
            backend_free_time: Duration::from_nanos(self.free_ns_total.load(Relaxed)),
            backend_free_time_max: Duration::from_nanos(self.free_ns_max.load(Relaxed)),
        }
    }
}

/// Counters of a [`PinnedPool`](super::PinnedPool), like PyTorch's
/// `torch.cuda.host_memory_stats()`. `Display` prints a short table.
///
/// Every byte the pool holds from its backends is in exactly one of three states:
/// `reserved_bytes == in_use_bytes + pending_bytes + cached_bytes`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Bytes in blocks handed out now (their capacities).
    pub in_use_bytes: usize,
    /// Bytes requested by the blocks handed out now (at most `in_use_bytes`).
    pub requested_bytes: usize,
    /// The most `in_use_bytes` has been.
    pub peak_in_use_bytes: usize,
    /// Bytes in idle blocks ready for reuse.
    pub cached_bytes: usize,
    /// Bytes in dropped blocks that copies still read or write; they become cached when the
    /// copies complete.
    pub pending_bytes: usize,
    /// How many dropped blocks wait for their copies.
    pub pending_blocks: usize,
    /// Bytes held from the backends: in use + pending + cached. Counted against `max_bytes`.
    pub reserved_bytes: usize,
    /// The pool's byte budget, if any.
    pub max_bytes: Option<usize>,
    /// The pool's cap on cached bytes, if any.
    pub max_cached_bytes: Option<usize>,
    /// Blocks handed out in total.
    pub allocations: u64,
    /// Allocations served from the cache.
    pub hits: u64,
    /// Allocations that went to a backend.
    pub misses: u64,
    /// Allocations that had to wait for the budget.
    pub budget_waits: u64,
    /// Backend (driver or OS) allocations made.
    pub backend_allocs: u64,
    /// Backend (driver or OS) frees made.
    pub backend_frees: u64,
    /// Time spent in backend allocations.
    pub backend_alloc_time: Duration,
    /// The longest backend allocation.
    pub backend_alloc_time_max: Duration,
    /// Time spent in backend frees.
    pub backend_free_time: Duration,
    /// The longest backend free.
    pub backend_free_time_max: Duration,
}

/// Bytes in binary units, e.g. `1.50 MiB`.
struct Bytes(usize);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut v = self.0 as f64;
        let mut u = 0;
        while v >= 1024.0 && u + 1 < UNITS.len() {
            v /= 1024.0;
            u += 1;
        }
        if u == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{v:.2} {}", UNITS[u])
        }
    }
}

fn limit(v: Option<usize>) -> String {
    v.map_or_else(|| "none".into(), |b| Bytes(b).to_string())
}

fn mean(total: Duration, n: u64) -> Duration {
    if n == 0 {
        Duration::ZERO
    } else {
        total / n as u32
    }
}

impl fmt::Display for PoolStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hit_rate = if self.allocations == 0 {
            0.0
        } else {
            100.0 * self.hits as f64 / self.allocations as f64
        };
        let n = u32::try_from(self.backend_allocs).unwrap_or(u32::MAX) as u64;
        let m = u32::try_from(self.backend_frees).unwrap_or(u32::MAX) as u64;
        let rows: [(&str, String); 10] = [
            (
                "in use",
                format!(
                    "{} (requested {}, peak {})",
                    Bytes(self.in_use_bytes),
                    Bytes(self.requested_bytes),
                    Bytes(self.peak_in_use_bytes)
                ),
            ),
            ("cached", Bytes(self.cached_bytes).to_string()),
            (
                "pending",
                format!(
                    "{} in {} blocks",
                    Bytes(self.pending_bytes),
                    self.pending_blocks
                ),
            ),
            ("reserved", Bytes(self.reserved_bytes).to_string()),
            (
                "limits",
                format!(
                    "budget {}, cache cap {}",
                    limit(self.max_bytes),
                    limit(self.max_cached_bytes)
                ),
            ),
            (
                "allocations",
                format!(
                    "{} ({} hits, {} misses, {hit_rate:.1}% hit rate)",
                    self.allocations, self.hits, self.misses
                ),
            ),
            ("budget waits", self.budget_waits.to_string()),
            (
                "backend allocs",
                format!(
                    "{} (total {:?}, mean {:?}, max {:?})",
                    self.backend_allocs,
                    self.backend_alloc_time,
                    mean(self.backend_alloc_time, n),
                    self.backend_alloc_time_max
                ),
            ),
            (
                "backend frees",
                format!(
                    "{} (total {:?}, mean {:?}, max {:?})",
                    self.backend_frees,
                    self.backend_free_time,
                    mean(self.backend_free_time, m),
                    self.backend_free_time_max
                ),
            ),
            (
                "unfreed",
                (self.backend_allocs.saturating_sub(self.backend_frees)).to_string() + " blocks",
            ),
        ];
        for (i, (k, v)) in rows.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{k:<15} {v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_print_in_binary_units() {
        assert_eq!(Bytes(512).to_string(), "512 B");
        assert_eq!(Bytes(1536).to_string(), "1.50 KiB");
        assert_eq!(Bytes(3 << 30).to_string(), "3.00 GiB");
    }

    #[test]
    fn display_is_a_table_with_every_figure() {
        let c = Counters::default();
        c.hand_out(8192, 5000);
        c.hits.fetch_add(1, Relaxed);
        c.backend_alloc(Duration::from_micros(10));
        let s = c.snapshot(Some(1 << 20), None).to_string();
        for want in [
            "in use          8.00 KiB (requested 4.88 KiB, peak 8.00 KiB)",
            "budget 1.00 MiB, cache cap none",
            "1 (1 hits, 0 misses, 100.0% hit rate)",
            "backend allocs  1 (total 10µs, mean 10µs, max 10µs)",
        ] {
            assert!(s.contains(want), "{want:?} not in\n{s}");
        }
        assert_eq!(s.lines().count(), 10);
    }
}
