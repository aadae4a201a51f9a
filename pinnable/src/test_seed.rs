//! Seeds for the unit tests' fresh random data, and the sweep that measures a quality bar.
//!
//! Every test that draws random inputs takes its seed from [`seed`]: `PINNABLE_TEST_SEED` when
//! set (to rerun a failure), else the clock. The seed is printed with the line that reruns it;
//! the test harness shows it when the test fails. A bar (a tolerance, a count) is set from
//! [`sweep`]'s distribution of the measured value over many seeds, not guessed.

/// The run's seed: `PINNABLE_TEST_SEED` (or its older name `PINNABLE_SEED`), else the clock
/// (fixed under Miri, which has no clock or environment to read). Not printed: see [`seed`].
pub(crate) fn run_seed() -> u64 {
    if cfg!(miri) {
        return 0x5EED;
    }
    ["PINNABLE_TEST_SEED", "PINNABLE_SEED"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        })
}

/// The seed of `test`'s random inputs ([`run_seed`]), printed with how to rerun it.
pub(crate) fn seed(test: &str) -> u64 {
    let seed = run_seed();
    println!("{test}: seed {seed} (rerun: PINNABLE_TEST_SEED={seed})");
    seed
}

/// With `PINNABLE_TEST_SWEEP=N`, runs `check` over N seeds on every core and prints the
/// distribution of the value it measures (both tails, the median, and the seeds and cases of
/// the extremes), to set a bar from; without it, prints how to ask for one. `check` returns
/// the value and the case that gave it (the worst image, say).
// Its callers so far are the image tests.
#[cfg_attr(not(feature = "image"), allow(dead_code))]
pub(crate) fn sweep(name: &str, check: impl Fn(u64) -> (f64, String) + Sync) {
    let Some(n) = std::env::var("PINNABLE_TEST_SWEEP")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
    else {
        println!("{name}: set PINNABLE_TEST_SWEEP=N to sweep N seeds");
        return;
    };
    let first = run_seed();
    // SplitMix64's steps, written out: the loader's generator would make this module and the
    // loader's tests depend on each other.
    let seeds: Vec<u64> = (1..=n as u64)
        .map(|k| {
            let mut z = first.wrapping_add(k.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        })
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut got: Vec<(f64, u64, String)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut v = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&seed) = seeds.get(i) else { break v };
                        let (value, case) = check(seed);
                        v.push((value, seed, case));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a sweep worker panicked"))
            .collect()
    });
    got.sort_by(|a, b| a.0.total_cmp(&b.0));
    println!("{}", summary(name, first, &got));
}

/// The sweep's report: the count, the quantiles, the extremes with their seeds and cases.
#[cfg_attr(not(feature = "image"), allow(dead_code))]
fn summary(name: &str, first: u64, got: &[(f64, u64, String)]) -> String {
    let q = |p: f64| got[((got.len() - 1) as f64 * p).round() as usize].0;
    let (lo, hi) = (&got[0], &got[got.len() - 1]);
    format!(
        "{name}: {} seeds (from PINNABLE_TEST_SEED={first}): min {:.4} p0.1 {:.4} p1 {:.4} \
         median {:.4} p99 {:.4} p99.9 {:.4} max {:.4}\n  min at seed {} ({})\n  max at seed \
         {} ({})",
        got.len(),
        lo.0,
        q(0.001),
        q(0.01),
        q(0.5),
        q(0.99),
        q(0.999),
        hi.0,
        lo.1,
        lo.2,
        hi.1,
        hi.2
    )
}
