//! Token shards on the host: batches equal a reference built from the tokens written, in every
//! format, residency and dtype; malformed files are errors naming the file and the field;
//! windows never cross a shard's end; ranks get disjoint windows that cover the epoch.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use pinnable::formats::tokens::{
    Residency, ShardFormat, TokenBatch, TokenBatcher, TokenShards, TokenWindows,
};
use pinnable::loader::{Dataset, Loader};
use pinnable::{DType, Error, Tensor};
use pinnable_harness::rng;
use pinnable_harness::tokens::{
    FORMATS, Reference, TempDir, random_shards, random_tokens, shard_file, token_bytes, write,
};
use rand::Rng;

/// Pinned shards and batches come from page-locked memory, which `ulimit -l` bounds on a
/// machine without CUDA: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn open(
    paths: &[PathBuf],
    format: ShardFormat,
    residency: Residency,
) -> pinnable::Result<TokenShards> {
    let options = TokenShards::options().format(format).residency(residency);
    // SAFETY: the tests write their shards before opening them, and never while they are open.
    unsafe { options.open_mapped(paths) }
}

fn as_i64(t: &Tensor) -> Vec<i64> {
    match t.dtype() {
        DType::I64 => t.to_vec::<i64>().unwrap(),
        _ => t
            .to_vec::<i32>()
            .unwrap()
            .into_iter()
            .map(i64::from)
            .collect(),
    }
}

fn xy(batch: &TokenBatch) -> (Vec<i64>, Vec<i64>) {
    (
        as_i64(&batch.x.tensor().unwrap()),
        as_i64(&batch.y.tensor().unwrap()),
    )
}

#[test]
fn batches_equal_the_reference_in_every_format_residency_and_dtype() {
    let _s = serial();
    let mut r = rng("batches_equal_the_reference_in_every_format_residency_and_dtype");
    for (format, token_type) in FORMATS {
        for residency in [Residency::Pinned, Residency::Mapped, Residency::Auto] {
            let dir = TempDir::new("tokens-ref");
            let dtype = if r.random_bool(0.5) {
                DType::I64
            } else {
                DType::I32
            };
            let vocab = match (token_type, dtype) {
                (DType::U16, _) => 1 << 16,
                (_, DType::I32) => 1 << 31,
                _ => u32::MAX,
            };
            let context = r.random_range(1..40);
            let (paths, reference) =
                random_shards(&mut r, dir.path(), format, token_type, context, vocab);
            let auto = if r.random_bool(0.5) {
                format
            } else {
                ShardFormat::Auto
            };
            // Auto reads u32 raw tokens as u16: say the format for those.
            let auto = match (auto, format) {
                (ShardFormat::Auto, ShardFormat::Raw(DType::U32)) => format,
                _ => auto,
            };
            let shards = open(&paths, auto, residency).unwrap();
            assert_eq!(shards.dtype(), token_type);
            assert_eq!(
                shards.len(),
                reference.shards.iter().map(Vec::len).sum::<usize>()
            );
            for s in shards.shards() {
                assert_eq!(s.format(), format);
                let want = match residency {
                    Residency::Mapped => Residency::Mapped,
                    _ => Residency::Pinned,
                };
                assert_eq!(s.residency(), want, "{}", shards);
            }
            let windows = TokenWindows::new(shards, context).unwrap();
            assert_eq!(windows.len(), reference.windows().len());
            let batcher = windows.batcher(dtype).unwrap();
            let batch_size = r.random_range(1..9);
            let mut builder = Loader::builder(windows)
                .batch_size(batch_size)
                .workers(r.random_range(1..4));
            if r.random_bool(0.7) {
                builder = builder.shuffle(r.random());
            }
            let loader = builder.build(batcher).unwrap();
            for epoch in 0..2 {
                let order = loader.sampler().batches(epoch);
                let got: Vec<TokenBatch> = loader.run_epoch(epoch).map(Result::unwrap).collect();
                assert_eq!(got.len(), order.len());
                for (batch, indices) in got.iter().zip(&order) {
                    let x = batch.x.tensor().unwrap();
                    assert_eq!(x.dtype(), dtype);
                    assert_eq!(x.shape(), &[indices.len(), context]);
                    assert!(x.is_pinned() && x.shares_block_with(&batch.y.tensor().unwrap()));
                    assert_eq!(xy(batch), reference.batch(indices), "{format} {residency}");
                }
            }
        }
    }
}

#[test]
fn several_formats_make_one_stream_and_a_window_never_crosses_a_shard() {
    let _s = serial();
    let mut r = rng("several_formats_make_one_stream_and_a_window_never_crosses_a_shard");
    let dir = TempDir::new("tokens-mixed");
    let context = r.random_range(2..20);
    let shards: Vec<Vec<u32>> = (0..4)
        .map(|_| {
            let n = r.random_range(context + 1..context * 6);
            random_tokens(&mut r, n, 1 << 16)
        })
        .collect();
    // Raw, llm.c and .npy files of u16 tokens, told apart by their contents.
    let kinds = [
        ShardFormat::Raw(DType::U16),
        ShardFormat::LlmC,
        ShardFormat::Npy,
        ShardFormat::LlmC,
    ];
    let paths: Vec<PathBuf> = shards
        .iter()
        .zip(kinds)
        .enumerate()
        .map(|(i, (t, f))| write(dir.path(), &format!("{i}"), &shard_file(f, DType::U16, t)))
        .collect();
    let windows = TokenWindows::new(TokenShards::open(&paths).unwrap(), context).unwrap();
    let found: Vec<ShardFormat> = windows
        .shards()
        .shards()
        .iter()
        .map(|s| s.format())
        .collect();
    assert_eq!(found, kinds);
    let reference = Reference { shards, context };
    for (i, (shard, start)) in reference.windows().into_iter().enumerate() {
        let w = windows.get(i).unwrap();
        assert_eq!((w.shard, w.start), (shard, start));
        assert!(w.start + context < reference.shards[w.shard].len());
    }
    assert!(windows.get(windows.len()).is_err());
    // Sequential windows: x covers each shard's tokens once, in order, but its short tail.
    let loader = Loader::builder(windows.clone())
        .batch_size(3)
        .workers(2)
        .build(windows.batcher(DType::I64).unwrap())
        .unwrap();
    let xs: Vec<i64> = loader.iter().flat_map(|b| xy(&b.unwrap()).0).collect();
    let mut want = Vec::new();
    for t in &reference.shards {
        let covered = (t.len() - 1) / context * context;
        want.extend(t[..covered].iter().map(|&v| i64::from(v)));
    }
    assert_eq!(xs, want);
}

/// The field an error names, after checking it names the file.
fn field(e: Error, path: &std::path::Path) -> String {
    match e {
        Error::TokenShard {
            path: ref p,
            ref field,
            ..
        } => {
            assert_eq!(*p, path.display().to_string(), "{e}");
            assert!(e.to_string().contains(p.as_str()), "{e}");
            field.clone()
        }
        other => panic!("not a shard error: {other}"),
    }
}

#[test]
fn malformed_files_are_errors_naming_the_file_and_the_field() {
    let _s = serial();
    let mut r = rng("malformed_files_are_errors_naming_the_file_and_the_field");
    let dir = TempDir::new("tokens-bad");
    let n = r.random_range(10..100);
    let tokens = random_tokens(&mut r, n, 50257);
    let good16 = shard_file(ShardFormat::LlmC, DType::U16, &tokens);
    let mut truncated = good16.clone();
    truncated.truncate(good16.len() - 2 * r.random_range(1..tokens.len()));
    let mut long = good16.clone();
    long.extend([0, 0]);
    let mut version = good16.clone();
    version[4] = 2;
    let mut magic = good16.clone();
    magic[0] ^= 0x40;
    let mut negative = good16.clone();
    negative[8..12].copy_from_slice(&(-5i32).to_le_bytes());
    let npy = shard_file(ShardFormat::Npy, DType::U32, &tokens);
    let mut npy_truncated = npy.clone();
    npy_truncated.truncate(npy.len() - 3);
    let npy_i64 = {
        let mut f = shard_file(ShardFormat::Npy, DType::U32, &tokens);
        let at = f.windows(3).position(|w| w == b"<u4").unwrap();
        f[at..at + 3].copy_from_slice(b"<i4");
        f
    };
    let mut odd = token_bytes(&tokens, DType::U16);
    odd.push(7);
    let cases: Vec<(ShardFormat, Vec<u8>, &str)> = vec![
        (ShardFormat::Auto, truncated, "header[2] (token count)"),
        (ShardFormat::LlmC, long, "header[2] (token count)"),
        (ShardFormat::Auto, negative, "header[2] (token count)"),
        (ShardFormat::Auto, version, "header[1] (version)"),
        (ShardFormat::LlmC, magic, "header[0] (magic)"),
        (
            ShardFormat::LlmC,
            good16[..r.random_range(0..1024)].to_vec(),
            "header",
        ),
        (ShardFormat::Auto, odd, "file size"),
        (
            ShardFormat::Raw(DType::U32),
            token_bytes(&tokens, DType::U16)[..6].to_vec(),
            "file size",
        ),
        (ShardFormat::Auto, npy_truncated, "shape"),
        (ShardFormat::Npy, npy_i64, "descr"),
    ];
    for (i, (format, bytes, want)) in cases.into_iter().enumerate() {
        let path = write(dir.path(), &format!("bad{i}.bin"), &bytes);
        for residency in [Residency::Pinned, Residency::Mapped] {
            let e = open(std::slice::from_ref(&path), format, residency).unwrap_err();
            assert_eq!(field(e, &path), want, "case {i}");
        }
    }
    // A missing file, mixed token types, and a vocabulary check.
    let missing = dir.path().join("missing.bin");
    assert_eq!(
        field(TokenShards::open([&missing]).unwrap_err(), &missing),
        "file"
    );
    let a = write(
        dir.path(),
        "a16",
        &shard_file(ShardFormat::LlmC, DType::U16, &tokens),
    );
    let b = write(
        dir.path(),
        "b32",
        &shard_file(ShardFormat::LlmC, DType::U32, &tokens),
    );
    assert_eq!(
        field(TokenShards::open([&a, &b]).unwrap_err(), &b),
        "token type"
    );
    let max = *tokens.iter().max().unwrap();
    let at = tokens.iter().position(|&t| t == max).unwrap();
    let e = TokenShards::options()
        .vocab(u64::from(max))
        .open([&a])
        .unwrap_err();
    assert_eq!(field(e, &a), format!("token {at}"));
    TokenShards::options()
        .vocab(u64::from(max) + 1)
        .open([&a])
        .unwrap();
    assert!(matches!(
        TokenShards::open(Vec::<PathBuf>::new()),
        Err(Error::Config {
            setting: "shards",
            ..
        })
    ));
}

#[test]
fn u32_tokens_that_do_not_fit_an_i32_batch_are_an_error_naming_the_token() {
    let _s = serial();
    let mut r = rng("u32_tokens_that_do_not_fit_an_i32_batch_are_an_error_naming_the_token");
    let dir = TempDir::new("tokens-i32");
    let context = r.random_range(2..10);
    let mut tokens = random_tokens(&mut r, context * 4 + 1, 1000);
    let at = r.random_range(0..tokens.len() - 1);
    tokens[at] = (1 << 31) + r.random_range(0..1000);
    let path = write(
        dir.path(),
        "big",
        &shard_file(ShardFormat::LlmC, DType::U32, &tokens),
    );
    let windows = TokenWindows::new(TokenShards::open([&path]).unwrap(), context).unwrap();
    let loader = Loader::builder(windows.clone())
        .batch_size(64)
        .workers(1)
        .build(windows.batcher(DType::I32).unwrap())
        .unwrap();
    let e = loader.iter().find_map(Result::err).expect("an error");
    assert_eq!(field(e, &path), format!("token {at}"));
    // i64 holds every u32.
    let loader = Loader::builder(windows.clone())
        .batch_size(64)
        .workers(1)
        .build(windows.batcher(DType::I64).unwrap())
        .unwrap();
    assert!(loader.iter().all(|b| b.is_ok()));
    assert!(windows.batcher(DType::F32).is_err());
}

/// Each window of random tokens is told apart by its `x`.
fn window_of_x(reference: &Reference) -> HashMap<Vec<i64>, usize> {
    let map: HashMap<Vec<i64>, usize> = (0..reference.windows().len())
        .map(|i| (reference.xy(i).0, i))
        .collect();
    assert_eq!(map.len(), reference.windows().len(), "windows are distinct");
    map
}

#[test]
fn ranks_get_disjoint_windows_that_cover_the_epoch() {
    let _s = serial();
    let mut r = rng("ranks_get_disjoint_windows_that_cover_the_epoch");
    let dir = TempDir::new("tokens-ranks");
    let context = r.random_range(4..16);
    let (paths, reference) = random_shards(
        &mut r,
        dir.path(),
        ShardFormat::LlmC,
        DType::U16,
        context,
        1 << 16,
    );
    let shards = std::sync::Arc::new(TokenShards::open(&paths).unwrap());
    let lookup = window_of_x(&reference);
    let n = lookup.len();
    for world in 1..=5 {
        let batch_size = r.random_range(1..4);
        let seed = r.random();
        let epoch = r.random_range(0..5);
        let mut seen = vec![0usize; n];
        let mut lens = Vec::new();
        for rank in 0..world {
            let windows = TokenWindows::new(shards.clone(), context).unwrap();
            let batcher: TokenBatcher = windows.batcher(DType::I64).unwrap();
            let loader = Loader::builder(windows)
                .batch_size(batch_size)
                .shuffle(seed)
                .drop_last(true)
                .shard(rank, world)
                .workers(2)
                .build(batcher)
                .unwrap();
            let e = loader.run_epoch(epoch);
            lens.push(e.remaining().unwrap());
            for b in e {
                let x = xy(&b.unwrap()).0;
                for row in x.chunks(context) {
                    seen[lookup[row]] += 1;
                }
            }
        }
        assert!(
            lens.iter().all(|&l| l == lens[0]),
            "ranks take as many batches: {lens:?}"
        );
        assert!(
            seen.iter().all(|&c| c <= 1),
            "world {world}: a window went to two ranks"
        );
        let per_rank = n / world / batch_size * batch_size;
        assert_eq!(
            seen.iter().sum::<usize>(),
            per_rank * world,
            "world {world}"
        );
        if batch_size == 1 && n.is_multiple_of(world) {
            assert!(
                seen.iter().all(|&c| c == 1),
                "world {world}: every window, once"
            );
        }
    }
}

#[test]
fn auto_residency_pins_within_the_limit_and_maps_the_rest() {
    let _s = serial();
    let mut r = rng("auto_residency_pins_within_the_limit_and_maps_the_rest");
    let dir = TempDir::new("tokens-auto");
    let sizes = [1000usize, 3000, 500, 2000];
    let paths: Vec<PathBuf> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let t = random_tokens(&mut r, n, 1 << 16);
            write(
                dir.path(),
                &format!("{i}"),
                &shard_file(ShardFormat::LlmC, DType::U16, &t),
            )
        })
        .collect();
    // 2 bytes a token: a limit of 3200 bytes pins the first (2000) and the third (1000).
    let options = TokenShards::options().pin_limit(3200);
    // SAFETY: nothing writes the files while they are open.
    let shards = unsafe { options.open_mapped(&paths) }.unwrap();
    let got: Vec<Residency> = shards.shards().iter().map(|s| s.residency()).collect();
    use Residency::{Mapped, Pinned};
    assert_eq!(got, [Pinned, Mapped, Pinned, Mapped]);
    assert_eq!(shards.bytes(Pinned), 3000);
    assert_eq!(shards.bytes(Mapped), 10000);
    let pinned = shards.pinned().unwrap();
    assert_eq!(pinned.numel(), 1500);
    assert_eq!(shards.shards()[2].pinned_at(), Some(1000));
    assert_eq!(
        pinned
            .narrow(0, 1000, 500)
            .unwrap()
            .to_vec::<u16>()
            .unwrap(),
        shards.shards()[2].tokens().to_vec::<u16>().unwrap()
    );
    let text = shards.to_string();
    assert!(
        text.contains("2 pinned") && text.contains("2 mapped"),
        "{text}"
    );
}
