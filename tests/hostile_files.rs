//! Hostile data files: every `.npy` array, token shard (raw, llm.c, `.npy`; automatic
//! detection) and tar shard below is opened, and each of its samples read, within 100 ms and
//! 64 MiB of memory above what the process held before it, or refused with an error naming
//! the file. The cases: headers declaring sizes far beyond the file (a 65535 × 65535 array, 2³¹
//! tokens, a tar member of 8 GiB or 2⁶² bytes), valid files cut short at random points, random
//! bytes, files of zeros and empty files. (Image files have their own test,
//! `tests/hostile_images.rs`.)
//!
//! The peak is the kernel's high-water mark of resident memory (`pinnable_harness::peak`). It
//! is process-wide, so this file holds one test and nothing else runs beside it.

use std::path::Path;
use std::time::Duration;

use pinnable::formats::npy::NpyArray;
use pinnable::formats::tar::TarShards;
use pinnable::formats::tokens::{ShardFormat, TokenShards};
use pinnable::loader::Dataset;
use pinnable::{DType, Result};
use pinnable_harness::tar::{Sample, shard};
use pinnable_harness::tokens::{random_tokens, shard_file};
use pinnable_harness::{peak, rng};
use rand::Rng;

const TIME: Duration = Duration::from_millis(100);
const MEMORY: u64 = 64 << 20;

/// A `.npy` file of `<f4` values of `shape` with `data` bytes after the header (what the
/// shape declares, or not).
fn npy(shape: &[usize], data: usize) -> Vec<u8> {
    pinnable_harness::npy::npy_file("<f4", shape, false, &vec![0x3f; data])
}

/// `tar` with the size field of its first header set to `size` (octal, or base-256 past
/// what 11 octal digits hold), its checksum redone.
fn tar_declaring(tar: &[u8], size: u64) -> Vec<u8> {
    let mut f = tar.to_vec();
    if size < 8 << 30 {
        f[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    } else {
        f[124] = 0x80;
        f[125..128].fill(0);
        f[128..136].copy_from_slice(&size.to_be_bytes());
    }
    f[148..156].copy_from_slice(b"        ");
    let sum: u32 = f[..512].iter().map(|&b| u32::from(b)).sum();
    f[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    f
}

/// What a parser made of a file: a short account of what it read, or the error.
type Outcome = std::result::Result<String, String>;

fn open_npy(path: &Path) -> Result<String> {
    // SAFETY: the file is this test's own, and nothing writes or truncates it while the array
    // (dropped before this function returns) views it.
    let array = unsafe { NpyArray::open_mapped(path)? };
    let t = array.tensor();
    let sum: f64 = t.to_vec::<f32>()?.iter().map(|&v| f64::from(v)).sum();
    Ok(format!("{:?} {sum}", t.shape()))
}

fn open_tokens(path: &Path) -> Result<String> {
    let shards = TokenShards::open([path])?;
    Ok(format!("{} tokens", shards.len()))
}

fn open_tar(path: &Path) -> Result<String> {
    let shards = TarShards::open([path.to_str().expect("a UTF-8 path")])?;
    let mut bytes = 0;
    for i in 0..shards.len() {
        let sample = shards.get(i)?;
        for field in sample.fields() {
            bytes += sample.bytes(&field.ext)?.len();
        }
    }
    Ok(format!("{} samples, {bytes} bytes", shards.len()))
}

#[test]
fn hostile_data_files_are_refused_or_read_in_bounded_time_and_memory() {
    if !peak::gauge_works() {
        println!("skipped: the peak resident memory cannot be reset here (/proc/self/clear_refs)");
        return;
    }
    let mut r = rng("hostile_data_files_are_refused_or_read_in_bounded_time_and_memory");
    type Open = fn(&Path) -> Result<String>;
    let mut cases: Vec<(String, Open, Vec<u8>)> = Vec::new();

    // Declared far beyond the file.
    cases.push(("npy-65535x65535".into(), open_npy, npy(&[65535, 65535], 16)));
    cases.push(("npy-2^40".into(), open_npy, npy(&[1 << 40], 16)));
    for (format, dtype) in [
        (ShardFormat::LlmC, DType::U16),
        (ShardFormat::LlmC, DType::U32),
        (ShardFormat::Npy, DType::U16),
    ] {
        let mut f = shard_file(format, dtype, &random_tokens(&mut r, 8, 50_000));
        let name = format!("tokens-{format}-{dtype}-2^31").replace([' ', '.'], "");
        if format == ShardFormat::LlmC {
            f[8..12].copy_from_slice(&i32::MAX.to_le_bytes());
        } else {
            f = pinnable_harness::npy::npy_file("<u2", &[i32::MAX as usize], false, &[1, 0, 2, 0]);
        }
        cases.push((name, open_tokens, f));
    }
    let samples: Vec<Sample> = (0..3)
        .map(|i| {
            let fields = vec![
                (
                    "bin".to_owned(),
                    (0..r.random_range(1..2000)).map(|_| r.random()).collect(),
                ),
                ("cls".to_owned(), i.to_string().into_bytes()),
            ];
            (format!("{i:06}"), fields)
        })
        .collect();
    let (tar, _) = shard(&samples);
    cases.push((
        "tar-member-8GiB".into(),
        open_tar,
        tar_declaring(&tar, (8 << 30) - 1),
    ));
    cases.push((
        "tar-member-2^62".into(),
        open_tar,
        tar_declaring(&tar, 1 << 62),
    ));

    // Valid files, whole and cut short at random points.
    let tokens = random_tokens(&mut r, 3000, 50_000);
    let whole: [(&str, Open, Vec<u8>); 5] = [
        ("npy", open_npy, npy(&[64, 16], 64 * 16 * 4)),
        (
            "tokens-raw",
            open_tokens,
            shard_file(ShardFormat::Raw(DType::U16), DType::U16, &tokens),
        ),
        (
            "tokens-llmc",
            open_tokens,
            shard_file(ShardFormat::LlmC, DType::U16, &tokens),
        ),
        (
            "tokens-npy",
            open_tokens,
            shard_file(ShardFormat::Npy, DType::U32, &tokens),
        ),
        ("tar", open_tar, tar.clone()),
    ];
    for (name, open, f) in &whole {
        cases.push((format!("{name}-whole"), *open, f.clone()));
        for _ in 0..6 {
            let cut = r.random_range(0..f.len());
            cases.push((format!("{name}-at-{cut}"), *open, f[..cut].to_vec()));
        }
    }

    // Random bytes, zeros, nothing: for every parser.
    let opens: [(&str, Open); 3] = [
        ("npy", open_npy),
        ("tokens", open_tokens),
        ("tar", open_tar),
    ];
    for (name, open) in opens {
        for k in 0..4 {
            let n = r.random_range(0..8192);
            let bytes = (0..n).map(|_| r.random()).collect();
            cases.push((format!("{name}-random-{k}"), open, bytes));
        }
        cases.push((format!("{name}-zeros"), open, vec![0; 4096]));
        cases.push((format!("{name}-empty"), open, Vec::new()));
    }

    let dir = std::env::temp_dir().join(format!(
        "pinnable-hostile-files-{}-{:x}",
        std::process::id(),
        r.random::<u64>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut over = Vec::new();
    let mut outcomes: Vec<(&str, bool)> = Vec::new();
    let (mut read, mut refused) = (0, 0);
    // Once unmeasured first: what a process does once (the CUDA driver's start when token
    // shards are pinned, the pool's first block) is not the file's cost.
    for (case, open, bytes) in &cases {
        let path = dir.join(case);
        std::fs::write(&path, bytes).unwrap();
        let _ = open(&path);
    }
    for (case, open, _) in &cases {
        let path = dir.join(case);
        let (outcome, took, peak): (Outcome, _, _) =
            peak::measure_best(TIME, || open(&path).map_err(|e| e.to_string()));
        let what = match &outcome {
            Ok(what) => {
                read += 1;
                format!("read: {what}")
            }
            Err(e) => {
                refused += 1;
                assert!(
                    e.contains(&*path.to_string_lossy()),
                    "{case}: the error does not name the file: {e}"
                );
                format!("refused: {}", e.chars().take(100).collect::<String>())
            }
        };
        println!(
            "{case:<28} {:>8.2} ms {:>7.1} MiB  {what}",
            took.as_secs_f64() * 1e3,
            peak as f64 / f64::from(1 << 20)
        );
        outcomes.push((case, outcome.is_ok()));
        if took > TIME || peak > MEMORY {
            over.push(format!(
                "{case} ({:.1} ms, {:.1} MiB)",
                took.as_secs_f64() * 1e3,
                peak as f64 / f64::from(1 << 20)
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        read >= 5,
        "the whole files are read ({read} read, {refused} refused)"
    );
    // What a header declares beyond its file is refused, never read as a shorter array.
    for (case, ok) in &outcomes {
        let declared = case.ends_with("2^31")
            || case.starts_with("npy-65535")
            || case.starts_with("npy-2^40")
            || case.starts_with("tar-member-");
        assert!(!(declared && *ok), "{case} was read");
    }
    assert!(
        over.is_empty(),
        "over {TIME:?} or {} MiB: {over:?}",
        MEMORY >> 20
    );
}
