//! Shared helpers for pinnable's tests, examples and benches: fresh random data (its seed
//! printed, and rerun with `PINNABLE_TEST_SEED`), the sweep that measures a test's quality bars
//! over many seeds, and the GPU-or-skip gate. Not published.

pub mod bench;
pub mod hostile;
pub mod http;
#[cfg(feature = "image")]
pub mod images;
pub mod kernels;
pub mod npy;
pub mod peak;
pub mod s3;
pub mod samples;
pub mod tar;
pub mod tokens;

use std::fmt::Display;
use std::time::{SystemTime, UNIX_EPOCH};

use pinnable::loader::SplitMix64;
use pinnable::{DType, Device, Tensor};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The run's seed: `PINNABLE_TEST_SEED` (or its older name `PINNABLE_SEED`) when set, to rerun
/// a failure, else the clock. Not printed: see [`seed`].
pub fn run_seed() -> u64 {
    ["PINNABLE_TEST_SEED", "PINNABLE_SEED"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        })
}

/// The seed of `test`'s random inputs ([`run_seed`]), printed with the line that reruns it
/// (the test harness shows it when the test fails).
pub fn seed(test: &str) -> u64 {
    let seed = run_seed();
    println!("{test}: seed {seed} (rerun: PINNABLE_TEST_SEED={seed})");
    seed
}

/// A fast RNG for `test`'s random inputs, from [`seed`] (printed, and rerun with
/// `PINNABLE_TEST_SEED`).
pub fn rng(test: &str) -> SmallRng {
    SmallRng::seed_from_u64(seed(test))
}

/// A test's quality bars (a tolerance, a dB floor, a count): each value the test measures is
/// held to its bar, failing at once in a test run, or recorded in a sweep ([`sweep`]) to
/// measure the bar's distribution over many seeds.
#[derive(Default)]
pub struct Bars {
    /// `Some` in a sweep: the values, not checked.
    record: Option<Vec<Measured>>,
}

/// One measured value of a sweep.
struct Measured {
    bar: &'static str,
    value: f64,
    limit: f64,
    at_most: bool,
    case: String,
}

impl Bars {
    /// Bars that fail the test when crossed.
    pub fn checked() -> Bars {
        Bars::default()
    }

    /// Whether these bars are a sweep's (which records values, checks nothing, and wants
    /// little printed).
    pub fn in_sweep(&self) -> bool {
        self.record.is_some()
    }

    /// `value` must be at most `limit`; `case` names what was measured.
    ///
    /// # Panics
    ///
    /// Outside a sweep, when `value` is over `limit`.
    pub fn at_most(&mut self, bar: &'static str, value: f64, limit: f64, case: impl Display) {
        self.hold(bar, value, limit, true, case);
    }

    /// `value` must be at least `limit`; `case` names what was measured.
    ///
    /// # Panics
    ///
    /// Outside a sweep, when `value` is under `limit`.
    pub fn at_least(&mut self, bar: &'static str, value: f64, limit: f64, case: impl Display) {
        self.hold(bar, value, limit, false, case);
    }

    fn hold(
        &mut self,
        bar: &'static str,
        value: f64,
        limit: f64,
        at_most: bool,
        case: impl Display,
    ) {
        match &mut self.record {
            Some(v) => v.push(Measured {
                bar,
                value,
                limit,
                at_most,
                case: case.to_string(),
            }),
            None => {
                let (ok, op) = if at_most {
                    (value <= limit, "at most")
                } else {
                    (value >= limit, "at least")
                };
                assert!(ok, "{bar}: {value:.4}, not {op} {limit} ({case})");
            }
        }
    }
}

/// Measures `test`'s bars over many seeds. With `PINNABLE_TEST_SWEEP=N`, runs `check` with N
/// generators seeded as [`rng`] seeds them (the seeds drawn from `PINNABLE_TEST_SEED` or the
/// clock), on every core, and prints for each bar the distribution of its values: the worst,
/// the 0.1 % and 1 % quantiles on the failing side, the median and the best, how many crossed
/// the bar, and the seed and case of the worst (rerun with `PINNABLE_TEST_SEED`). Without it,
/// prints how to ask for one.
pub fn sweep(test: &str, check: impl Fn(&mut SmallRng, &mut Bars) + Sync) {
    let Some(n) = std::env::var("PINNABLE_TEST_SWEEP")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
    else {
        println!("{test}: set PINNABLE_TEST_SWEEP=N to measure its bars over N seeds");
        return;
    };
    let first = run_seed();
    let seeds: Vec<u64> = {
        let mut g = SplitMix64::new(first);
        (0..n).map(|_| g.next_u64()).collect()
    };
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let got: Vec<(u64, Measured)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut v = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&seed) = seeds.get(i) else { break v };
                        let mut bars = Bars {
                            record: Some(Vec::new()),
                        };
                        let run = std::panic::AssertUnwindSafe(|| {
                            check(&mut SmallRng::seed_from_u64(seed), &mut bars)
                        });
                        if let Err(p) = std::panic::catch_unwind(run) {
                            println!("{test}: PINNABLE_TEST_SEED={seed} panicked");
                            std::panic::resume_unwind(p);
                        }
                        v.extend(bars.record.into_iter().flatten().map(|m| (seed, m)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a sweep worker panicked"))
            .collect()
    });
    let mut names: Vec<&str> = got.iter().map(|(_, m)| m.bar).collect();
    names.dedup();
    names.sort_unstable();
    names.dedup();
    println!("{test}: {n} seeds (the first drawn from PINNABLE_TEST_SEED={first})");
    for name in names {
        // Worst first.
        let mut v: Vec<&(u64, Measured)> = got.iter().filter(|(_, m)| m.bar == name).collect();
        let at_most = v[0].1.at_most;
        v.sort_by(|a, b| {
            let o = a.1.value.total_cmp(&b.1.value);
            if at_most { o.reverse() } else { o }
        });
        let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize].1.value;
        let crossed = v
            .iter()
            .filter(|(_, m)| {
                if at_most {
                    m.value > m.limit
                } else {
                    m.value < m.limit
                }
            })
            .count();
        let (seed, worst) = v[0];
        println!(
            "  {name} ({} {}): {} values: worst {:.4}, 0.1% {:.4}, 1% {:.4}, median {:.4}, \
             best {:.4}; {crossed} crossed; worst at PINNABLE_TEST_SEED={seed} ({})",
            if at_most { "at most" } else { "at least" },
            worst.limit,
            v.len(),
            worst.value,
            q(0.001),
            q(0.01),
            q(0.5),
            v[v.len() - 1].1.value,
            worst.case
        );
    }
}

/// Whether `PINNABLE_REQUIRE_GPU=1` asks for skips to fail.
pub fn gpu_required() -> bool {
    std::env::var("PINNABLE_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// CUDA device 0, or `None` after printing `skipped: <test>: <reason>` on its own line.
///
/// # Panics
///
/// When there is no device and `PINNABLE_REQUIRE_GPU=1`: on a GPU machine a skip is a failure.
pub fn cuda_or_skip(test: &str) -> Option<Device> {
    match Device::cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            assert!(!gpu_required(), "{test}: PINNABLE_REQUIRE_GPU=1 but {e}");
            skip_line(format_args!("skipped: {test}: {e}"));
            None
        }
    }
}

/// A file or folder the tests read, named by its path from the repository's root
/// (`"tests/data/tar"`, `"pinnable/tests/data/small420"`): under `PINNABLE_FIXTURES` when it is
/// set (the GPU bundle's `run.sh` sets it to the fixtures it carries), else in the checkout the
/// tests were built from.
pub fn fixture(path: &str) -> std::path::PathBuf {
    let root = std::env::var_os("PINNABLE_FIXTURES").map_or_else(
        || env!("CARGO_MANIFEST_DIR").into(),
        std::path::PathBuf::from,
    );
    root.join(path)
}

/// [`fixture`], or `None` after printing `skipped: <test>: <reason>` on its own line when it is
/// missing.
///
/// # Panics
///
/// When it is missing and `PINNABLE_REQUIRE_GPU=1`: where every check must run, a missing
/// fixture is a failure, not a skip.
pub fn fixture_or_skip(test: &str, path: &str) -> Option<std::path::PathBuf> {
    let p = fixture(path);
    if p.exists() {
        return Some(p);
    }
    let why = format!(
        "no fixture {} (set PINNABLE_FIXTURES to the folder holding the repository's {path})",
        p.display()
    );
    assert!(!gpu_required(), "{test}: PINNABLE_REQUIRE_GPU=1 but {why}");
    skip_line(format_args!("skipped: {test}: {why}"));
    None
}

/// Every CUDA device, `Device::count()` of them in ordinal order (at least one), or `None`
/// after printing `skipped: <test>: <reason>` without a GPU, as [`cuda_or_skip`].
///
/// # Panics
///
/// When there is no device and `PINNABLE_REQUIRE_GPU=1`, or when a device the driver counts
/// does not open.
pub fn cuda_devices_or_skip(test: &str) -> Option<Vec<Device>> {
    let first = cuda_or_skip(test)?;
    let count = Device::count();
    let rest = (1..count).map(|k| {
        Device::cuda(k).unwrap_or_else(|e| panic!("{test}: cuda:{k} of {count} devices: {e}"))
    });
    Some(std::iter::once(first).chain(rest).collect())
}

/// The targets of a test across devices: every CUDA device ([`cuda_devices_or_skip`]), or, on a
/// one-GPU machine, device 0 twice, after printing `partly skipped: <test>: …` on its own line.
/// Everything but the crossing between GPUs (their own links, peer copies) still runs there, and
/// the skip never fails, even under `PINNABLE_REQUIRE_GPU=1`. `None` after printing `skipped: …`
/// without a GPU. Always at least two targets.
///
/// # Panics
///
/// As [`cuda_devices_or_skip`].
pub fn cuda_targets_or_skip(test: &str) -> Option<Vec<Device>> {
    let mut devices = cuda_devices_or_skip(test)?;
    if devices.len() == 1 {
        skip_line(format_args!(
            "partly skipped: {test}: one CUDA device, so both targets are cuda:0 \
             (nothing crosses between two GPUs)"
        ));
        devices.push(devices[0].clone());
    }
    Some(devices)
}

/// Prints `line` (`skipped: <test>: <reason>`, or `partly skipped: …`) on stderr in one write:
/// not through `println!`, so the test harness's output capture cannot hide it, and in one
/// piece, so it is not interleaved with the harness's own output.
pub fn skip_line(line: impl Display) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// A tensor of `dtype` and `shape` filled with random values.
pub fn random_tensor(rng: &mut impl Rng, dtype: DType, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    macro_rules! fill {
        ($t:ty, $gen:expr) => {
            Tensor::from_vec((0..n).map(|_| $gen).collect::<Vec<$t>>(), shape)
        };
    }
    let r = rng;
    match dtype {
        DType::Bool => fill!(bool, r.random::<bool>()),
        DType::U8 => fill!(u8, r.random()),
        DType::U16 => fill!(u16, r.random()),
        DType::U32 => fill!(u32, r.random()),
        DType::U64 => fill!(u64, r.random()),
        DType::I8 => fill!(i8, r.random()),
        DType::I16 => fill!(i16, r.random()),
        DType::I32 => fill!(i32, r.random()),
        DType::I64 => fill!(i64, r.random()),
        DType::F16 => fill!(half::f16, half::f16::from_f32(r.random::<f32>())),
        DType::BF16 => fill!(half::bf16, half::bf16::from_f32(r.random::<f32>())),
        DType::F32 => fill!(f32, r.random::<f32>() * 2.0 - 1.0),
        DType::F64 => fill!(f64, r.random::<f64>() * 2.0 - 1.0),
        other => panic!("random_tensor: no generator for {other}"),
    }
    .expect("shape matches the element count")
}

/// A host tensor of `dtype` with a random shape (rank 0 to 3, sizes 1 to 5), pinned half the
/// time and, from rank 2, a transposed (strided) view half the time.
pub fn random_host_view(rng: &mut impl Rng, dtype: DType) -> Tensor {
    let shape: Vec<usize> = (0..rng.random_range(0..4))
        .map(|_| rng.random_range(1..6))
        .collect();
    let mut t = random_tensor(rng, dtype, &shape);
    if rng.random_bool(0.5) {
        t = pinnable::Pinnable::pin_memory(&t).expect("pin");
    }
    if shape.len() >= 2 && rng.random_bool(0.5) {
        t = t.transpose(0, shape.len() - 1).expect("in range");
    }
    t
}

/// The raw bytes of a tensor's elements in row-major order, for bit-exact comparison of any dtype.
pub fn bytes_of(t: &Tensor) -> Vec<u8> {
    macro_rules! as_bytes {
        ($t:ty) => {{
            let v = t.to_vec::<$t>().expect("host tensor of this dtype");
            // SAFETY: every element type here is plain data with no padding.
            unsafe {
                std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(&v[..]))
            }
            .to_vec()
        }};
    }
    match t.dtype() {
        DType::Bool => as_bytes!(bool),
        DType::U8 => as_bytes!(u8),
        DType::U16 => as_bytes!(u16),
        DType::U32 => as_bytes!(u32),
        DType::U64 => as_bytes!(u64),
        DType::I8 => as_bytes!(i8),
        DType::I16 => as_bytes!(i16),
        DType::I32 => as_bytes!(i32),
        DType::I64 => as_bytes!(i64),
        DType::F16 => as_bytes!(half::f16),
        DType::BF16 => as_bytes!(half::bf16),
        DType::F32 => as_bytes!(f32),
        DType::F64 => as_bytes!(f64),
        other => panic!("bytes_of: no reader for {other}"),
    }
}

unsafe extern "C" fn sleep_ms(arg: *mut std::ffi::c_void) {
    std::thread::sleep(std::time::Duration::from_millis(arg as u64));
}

/// Holds `stream` for `ms` milliseconds: work enqueued after this call starts only then. Used
/// to keep a copy in flight long enough to race it.
///
/// # Panics
///
/// If the driver refuses the host function (a test failure, not a library path).
pub fn hold_stream(stream: &cudarc::driver::CudaStream, ms: u64) {
    stream.context().bind_to_thread().expect("bind context");
    // SAFETY: the host function only sleeps (it calls no CUDA API), and its argument is a number
    // smuggled in the pointer, not dereferenced.
    unsafe {
        cudarc::driver::result::stream::launch_host_function(
            stream.cu_stream(),
            sleep_ms,
            ms as usize as *mut std::ffi::c_void,
        )
    }
    .expect("cuLaunchHostFunc");
}

/// A random batch for round trips: random dtypes and shapes, some zero-size, some strided
/// views, some pinned beforehand.
pub fn random_batch(rng: &mut impl Rng, max_tensors: usize) -> Vec<Tensor> {
    use rand::seq::IndexedRandom;
    (0..rng.random_range(1..=max_tensors))
        .map(|_| {
            let dtype = *DType::ALL.choose(rng).expect("dtypes");
            let rank = rng.random_range(0..4);
            let shape: Vec<usize> = (0..rank)
                .map(|_| {
                    if rng.random_ratio(1, 12) {
                        0
                    } else {
                        rng.random_range(1..40)
                    }
                })
                .collect();
            let mut t = random_tensor(rng, dtype, &shape);
            if rank >= 2 && rng.random_bool(0.3) {
                t = t.transpose(0, rank - 1).expect("in range");
            }
            if rank >= 1 && t.shape()[0] > 1 && rng.random_bool(0.3) {
                let size = t.shape()[0];
                let start = rng.random_range(0..size);
                t = t.narrow(0, start, size - start).expect("in range");
            }
            if rng.random_bool(0.4) {
                t = pinnable::Pinnable::pin_memory(&t).expect("pin");
            }
            t
        })
        .collect()
}

/// Asserts that `pool` holds no memory and that every backend allocation was freed (call after
/// `empty_cache()`).
///
/// # Panics
///
/// When memory is still reserved or a block leaked.
pub fn assert_drained(pool: &pinnable::PinnedPool) {
    let s = pool.stats();
    assert_eq!(
        (s.reserved_bytes, s.backend_allocs),
        (0, s.backend_frees),
        "{s}"
    );
}
