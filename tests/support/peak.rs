//! The peak resident memory of this process, for tests that bound what one call may take:
//! the kernel's high-water mark (`VmHWM`), reset by writing `5` to `/proc/self/clear_refs`.
//! It is process-wide: a test measuring it must be the only test of its binary.

use std::time::{Duration, Instant};

/// A `/proc/self/status` field in bytes.
pub fn status(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib << 10)
}

/// Resets the high-water mark to the current resident size; false where the kernel cannot.
pub fn reset() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Whether the high-water mark can be reset here: memory touched and freed before a reset no
/// longer counts after it.
pub fn gauge_works() -> bool {
    if !cfg!(target_os = "linux") || !reset() {
        return false;
    }
    let mut big = vec![0u8; 256 << 20];
    for page in big.chunks_mut(4096) {
        page[0] = 1;
    }
    std::hint::black_box(&big);
    drop(big);
    let before = status("VmHWM:").unwrap_or(0);
    reset();
    let after = status("VmHWM:").unwrap_or(u64::MAX);
    before >= after + (200 << 20)
}

/// Runs `f`, returning its value, its wall time and how far it raised the peak resident
/// memory above the resident size before it.
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, Duration, u64) {
    reset();
    let base = status("VmRSS:").expect("VmRSS");
    let start = Instant::now();
    let value = f();
    let took = start.elapsed();
    let peak = status("VmHWM:").expect("VmHWM").saturating_sub(base);
    (value, took, peak)
}

/// [`measure`], run again (twice at most) while its time is over `limit`, keeping the least
/// time: a busy machine only ever adds time, so a bound on work is checked on the best run,
/// while a cost really over the bound is over it every time.
pub fn measure_best<T>(limit: Duration, f: impl Fn() -> T) -> (T, Duration, u64) {
    let (value, mut took, peak) = measure(&f);
    for _ in 0..2 {
        if took <= limit {
            break;
        }
        took = took.min(measure(&f).1);
    }
    (value, took, peak)
}
