//! A language model's input side, interrupted and resumed: token shards written as the Python
//! tools write them (llm.c's `.bin`, nanoGPT's raw `train.bin`, a `.npy`), opened as one stream
//! of tokens, cut into windows of `context + 1` tokens, shuffled, batched into `x` and `y`
//! (i64) and streamed to the GPU when there is one. Each step reads its batch (back from the
//! device) and reduces it on the host. The run stops midway, saves the loader's position as a
//! checkpoint would, and a new loader — with another worker count — resumes from it; the
//! batches of the stopped and the resumed runs together must be those of an uninterrupted run.
//!
//!     cargo run --release --example train_tokens
//!     cargo run --release --example train_tokens -- --context 2048 --batch-size 16 --workers 4
//!
//! Options: `--context N`, `--batch-size N`, `--workers N`, `--tokens N` (per shard),
//! `--epochs N`, `--mapped` (map every shard instead of reading them into pinned memory),
//! `--cpu` (stay on the host even with a GPU).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use pinnable::formats::tokens::{Residency, TokenBatch, TokenShards, TokenWindows};
use pinnable::loader::{Loader, LoaderBuilder, Position};
use pinnable::{DType, Device, Error, ToDevice};

struct Options {
    context: usize,
    batch_size: usize,
    workers: usize,
    tokens: usize,
    epochs: u64,
    mapped: bool,
    cpu: bool,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        context: 1024,
        batch_size: 12,
        workers: std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(8),
        tokens: 300_000,
        epochs: 2,
        mapped: false,
        cpu: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut number = |name: &str| -> Result<usize, String> {
            args.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match a.as_str() {
            "--context" => o.context = number("--context")?,
            "--batch-size" => o.batch_size = number("--batch-size")?,
            "--workers" => o.workers = number("--workers")?.max(1),
            "--tokens" => o.tokens = number("--tokens")?,
            "--epochs" => o.epochs = number("--epochs")? as u64,
            "--mapped" => o.mapped = true,
            "--cpu" => o.cpu = true,
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(o)
}

/// A tokenizer's output stand-in: token `i` of shard `s`, below GPT-2's vocabulary.
fn token(s: usize, i: usize) -> u16 {
    ((i.wrapping_mul(2_654_435_761) ^ (s * 7919)) % 50257) as u16
}

/// Writes shard `s` of `n` tokens in one of the three formats, as Python would.
fn write_shard(dir: &Path, s: usize, n: usize) -> std::io::Result<PathBuf> {
    let data: Vec<u8> = (0..n).flat_map(|i| token(s, i).to_le_bytes()).collect();
    let (name, head) = match s % 3 {
        // llm.c's dev/data/data_common.py write_datafile: 256 i32, magic, version, count.
        0 => {
            let mut header = [0i32; 256];
            (header[0], header[1], header[2]) = (20240520, 1, n as i32);
            let head: Vec<u8> = header.iter().flat_map(|v| v.to_le_bytes()).collect();
            (format!("fineweb_train_{s:06}.bin"), head)
        }
        // nanoGPT's prepare.py: np.array(ids, dtype=np.uint16).tofile('train.bin').
        1 => (format!("train_{s}.bin"), Vec::new()),
        // np.save('shard.npy', np.array(ids, dtype=np.uint16)).
        _ => {
            let mut h = format!("{{'descr': '<u2', 'fortran_order': False, 'shape': ({n},), }}");
            while (10 + h.len() + 1) % 64 != 0 {
                h.push(' ');
            }
            h.push('\n');
            let mut head = b"\x93NUMPY\x01\x00".to_vec();
            head.extend((h.len() as u16).to_le_bytes());
            head.extend(h.as_bytes());
            (format!("shard_{s}.npy"), head)
        }
    };
    let path = dir.join(name);
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path)?);
    f.write_all(&head)?;
    f.write_all(&data)?;
    f.flush()?;
    Ok(path)
}

/// One step: the batch read on the host (back from the device), checked (`y` is `x` shifted
/// by one) and reduced to a fingerprint of its tokens and their order.
fn step(batch: &TokenBatch) -> pinnable::Result<u64> {
    let host = batch.to_cpu(false)?;
    let (x, y) = (host.x.tensor()?, host.y.tensor()?);
    let context = x.shape()[1];
    let (x, y) = (x.as_slice::<i64>()?, y.as_slice::<i64>()?);
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for (row_x, row_y) in x.chunks(context).zip(y.chunks(context)) {
        assert_eq!(row_x[1..], row_y[..context - 1], "y is x shifted by one");
        for &t in row_x.iter().chain(&row_y[context - 1..]) {
            h = (h ^ t as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    Ok(h)
}

fn main() -> pinnable::Result<()> {
    let o = options().map_err(Error::other)?;
    let dir = std::env::temp_dir().join(format!("train-tokens-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let paths = (0..3)
        .map(|s| write_shard(&dir, s, o.tokens + s * 1000))
        .collect::<std::io::Result<Vec<_>>>()?;

    let started = Instant::now();
    let residency = if o.mapped {
        Residency::Mapped
    } else {
        Residency::Auto
    };
    // SAFETY: this program wrote the shards above and nothing writes them while they are open.
    let shards = unsafe {
        TokenShards::options()
            .residency(residency)
            .vocab(50257)
            .open_mapped(&paths)
    }?;
    let opened = started.elapsed();
    let windows = TokenWindows::new(shards, o.context)?;
    let device = match Device::cuda(0) {
        Ok(d) if !o.cpu => d,
        _ => Device::cpu(),
    };
    println!(
        "{}, opened in {:.1} ms",
        windows.shards(),
        opened.as_secs_f64() * 1e3
    );
    println!(
        "{} windows of {} tokens, batches of {} (x, y: i64 [{}, {}]), on {device}",
        windows.len(),
        o.context + 1,
        o.batch_size,
        o.batch_size,
        o.context
    );
    let batcher = windows.batcher(DType::I64)?;
    let builder = |workers: usize| -> LoaderBuilder<TokenWindows> {
        Loader::builder(windows.clone())
            .batch_size(o.batch_size)
            .shuffle(2024)
            .drop_last(true)
            .workers(workers)
            .device(device.clone())
    };

    // The uninterrupted run: every batch's fingerprint.
    let loader = builder(o.workers).build(batcher.clone())?;
    let mut whole = Vec::new();
    for _ in 0..o.epochs {
        for batch in &loader {
            whole.push(step(&batch?)?);
        }
        if let Some(stats) = loader.stats() {
            println!("uninterrupted, epoch {}:\n{stats}", loader.next_epoch() - 1);
        }
    }

    // The run that stops midway: at a batch in the middle of the last epoch.
    let stop = whole.len() - loader.len() / 2;
    let loader = builder(o.workers).build(batcher.clone())?;
    let mut got = Vec::new();
    'run: while loader.next_epoch() < o.epochs {
        for batch in &loader {
            got.push(step(&batch?)?);
            if got.len() == stop {
                break 'run; // the epoch's threads stop here, with batches made ahead dropped
            }
        }
    }
    let checkpoint = dir.join("position.bin");
    std::fs::write(&checkpoint, loader.position().to_bytes())
        .map_err(|e| Error::io(&checkpoint, e))?;
    println!("stopped after {stop} batches at {}", loader.position());
    drop(loader);

    // A new process would start here: the position from the checkpoint, another worker count.
    let saved = std::fs::read(&checkpoint).map_err(|e| Error::io(&checkpoint, e))?;
    let position = Position::from_bytes(&saved)?;
    let t = Instant::now();
    let resumed = builder(o.workers.div_ceil(2))
        .resume(position)
        .build(batcher)?;
    let mut first = true;
    while resumed.next_epoch() < o.epochs {
        for batch in &resumed {
            got.push(step(&batch?)?);
            if std::mem::take(&mut first) {
                println!(
                    "resumed with {} workers: first batch after {:.1} ms (the epoch's order \
                     computed, nothing replayed)",
                    o.workers.div_ceil(2),
                    t.elapsed().as_secs_f64() * 1e3
                );
            }
        }
    }
    if let Some(stats) = resumed.stats() {
        println!(
            "resumed, rest of epoch {}:\n{stats}",
            resumed.next_epoch() - 1
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    if got != whole {
        return Err(Error::other(format!(
            "the stopped and resumed runs delivered other batches than the uninterrupted one \
             ({} against {})",
            got.len(),
            whole.len()
        )));
    }
    println!(
        "the stopped and the resumed runs delivered the uninterrupted run's {} batches, in order",
        whole.len()
    );
    Ok(())
}
