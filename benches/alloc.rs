//! The pinned allocator's costs: (a) an allocation served from the cache vs. a miss on each
//! backend, for 4 KiB to 256 MiB; (b) bytes reserved per byte requested over a realistic mix
//! of batch tensors, for our size classes vs. PyTorch's power-of-two rounding.
//!
//! `cargo bench --bench alloc`; prints a markdown table and, with `PINNABLE_BENCH_OUT=dir`,
//! also writes it to `dir/alloc.md`. GPU columns print `skipped: <reason>` without a device.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use pinnable::{BackendChoice, PinnedPool, PoolConfig};
use rand::Rng;

const SIZES: [(usize, &str); 4] = [
    (4 << 10, "4 KiB"),
    (1 << 20, "1 MiB"),
    (16 << 20, "16 MiB"),
    (256 << 20, "256 MiB"),
];

/// The median of repeats of one allocation or free (single calls, not a stream of batches).
fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn show(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} µs", ns as f64 / 1e3)
    } else {
        format!("{:.1} ms", ns as f64 / 1e6)
    }
}

/// Median time of a cache hit (alloc) and of giving the block back (drop).
fn hit(bytes: usize) -> String {
    let pool = PinnedPool::new(PoolConfig::default());
    match pool.alloc(bytes) {
        Ok(b) => drop(b),
        Err(e) => return format!("error: {e}"),
    }
    let n = if bytes <= 1 << 20 { 20_000 } else { 2_000 };
    let (mut allocs, mut frees) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let t = Instant::now();
        let b = pool.alloc(bytes).expect("cached");
        let t2 = Instant::now();
        drop(b);
        frees.push(t2.elapsed());
        allocs.push(t2 - t);
    }
    let s = pool.stats();
    assert_eq!(s.misses, 1, "every timed allocation was a hit");
    format!("{} / {}", show(median(allocs)), show(median(frees)))
}

/// Median time of an allocation that misses the cache (the backend's cost, incl. for
/// `cuMemHostRegister` the mmap and the parallel pre-fault), and of the backend free.
fn miss(bytes: usize, backend: BackendChoice) -> String {
    let gpu = !matches!(backend, BackendChoice::Mlock);
    if gpu && !pinnable::Device::is_available() {
        return "skipped".into();
    }
    let pool = PinnedPool::new(PoolConfig::default().backend(backend));
    let reps = match bytes {
        b if b <= 1 << 20 => 20,
        b if b <= 16 << 20 => 8,
        _ => 3,
    };
    let mut allocs = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        match pool.alloc(bytes) {
            Ok(b) => {
                allocs.push(t.elapsed());
                drop(b);
            }
            Err(e) => return format!("error: {e}"),
        }
        pool.trim();
    }
    let s = pool.stats();
    assert_eq!(s.misses, reps, "every timed allocation was a miss");
    let free = s.backend_free_time / s.backend_frees.max(1) as u32;
    format!("{} / {}", show(median(allocs)), show(free))
}

fn cost_table(out: &mut String) {
    let _ = pinnable::PinnedPool::raise_memlock_limit();
    writeln!(out, "### Allocation cost (median; alloc / free)\n").unwrap();
    writeln!(
        out,
        "| size | cache hit | `cuMemHostAlloc` miss | `cuMemHostRegister` miss (mmap + parallel pre-fault) | `mlock` miss |"
    )
    .unwrap();
    writeln!(out, "| --- | --- | --- | --- | --- |").unwrap();
    for (bytes, name) in SIZES {
        writeln!(
            out,
            "| {name} | {} | {} | {} | {} |",
            hit(bytes),
            miss(bytes, BackendChoice::CudaHostAlloc),
            miss(bytes, BackendChoice::CudaHostRegister),
            miss(bytes, BackendChoice::Mlock),
        )
        .unwrap();
        print!(
            "{}",
            out.lines()
                .last()
                .map(|l| format!("{l}\n"))
                .unwrap_or_default()
        );
    }
    if let Some(reason) = pinnable::Device::unavailable_reason() {
        writeln!(out, "\nskipped: GPU columns: {reason}").unwrap();
    }
    writeln!(
        out,
        "\nCache hit on a pool with the default backend ({}).",
        if pinnable::Device::is_available() {
            "CUDA"
        } else {
            "mlock: no CUDA here"
        }
    )
    .unwrap();
}

/// PyTorch's rounding: whole pages, then the next power of two.
fn power_of_two(bytes: usize) -> usize {
    pinnable::PinnedPool::rounded_size(1).max(bytes.next_power_of_two())
}

fn waste_table(out: &mut String) {
    let mut rng = pinnable_harness::rng("alloc_bench_mix");
    // (name, requested, ours, power of two)
    let mut rows: Vec<(&str, u128, u128, u128)> = vec![
        ("images B×3×224×224 f32", 0, 0, 0),
        ("labels B i64", 0, 0, 0),
        ("tokens B×L i64 (L 16..=2048)", 0, 0, 0),
        ("per-sample tokens L i64", 0, 0, 0),
    ];
    let batches = 5_000;
    for _ in 0..batches {
        let b = rng.random_range(1..=256usize);
        let l = rng.random_range(16..=2048usize);
        let mut add = |row: usize, bytes: usize| {
            let r = &mut rows[row];
            r.1 += bytes as u128;
            r.2 += pinnable::PinnedPool::rounded_size(bytes) as u128;
            r.3 += power_of_two(bytes) as u128;
        };
        add(0, b * 3 * 224 * 224 * 4);
        add(1, b * 8);
        add(2, b * l * 8);
        for _ in 0..b.min(8) {
            add(3, rng.random_range(1..=4096usize) * 8);
        }
    }
    let total = rows
        .iter()
        .fold((0, 0, 0), |a, r| (a.0 + r.1, a.1 + r.2, a.2 + r.3));
    writeln!(
        out,
        "\n### Reserved / requested bytes over {batches} random batches (B uniform in 1..=256)\n"
    )
    .unwrap();
    writeln!(
        out,
        "| tensors | our size classes | power-of-two rounding |"
    )
    .unwrap();
    writeln!(out, "| --- | --- | --- |").unwrap();
    let ratio = |x: u128, req: u128| format!("{:.3}", x as f64 / req as f64);
    for (name, req, ours, p2) in rows
        .iter()
        .copied()
        .chain([("all", total.0, total.1, total.2)])
    {
        writeln!(
            out,
            "| {name} | {} | {} |",
            ratio(ours, req),
            ratio(p2, req)
        )
        .unwrap();
    }
}

fn main() {
    let start = Instant::now();
    let mut out = String::from("## Pinned allocator\n\n");
    cost_table(&mut out);
    waste_table(&mut out);
    writeln!(out, "\n(bench took {:.1} s)", start.elapsed().as_secs_f64()).unwrap();
    println!("\n{out}");
    if let Some(dir) = std::env::var_os("PINNABLE_BENCH_OUT") {
        let path = std::path::Path::new(&dir).join("alloc.md");
        std::fs::create_dir_all(&dir).expect("create PINNABLE_BENCH_OUT");
        std::fs::write(&path, &out).expect("write alloc.md");
        println!("wrote {}", path.display());
    }
}
