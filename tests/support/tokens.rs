//! Token shards for the tests and benches: files in every format, written as the Python tools
//! write them, and the reference windows computed from the tokens written.

use std::io::Write;
use std::path::{Path, PathBuf};

use pinnable::DType;
use pinnable::formats::tokens::ShardFormat;
use rand::Rng;

/// The formats a shard can be written in: raw, llm.c's, `.npy`, each with u16 and u32 tokens.
pub const FORMATS: [(ShardFormat, DType); 6] = [
    (ShardFormat::Raw(DType::U16), DType::U16),
    (ShardFormat::Raw(DType::U32), DType::U32),
    (ShardFormat::LlmC, DType::U16),
    (ShardFormat::LlmC, DType::U32),
    (ShardFormat::Npy, DType::U16),
    (ShardFormat::Npy, DType::U32),
];

/// A fresh directory under the system's temporary one, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A directory named after `name` and this process.
    ///
    /// # Panics
    ///
    /// If it cannot be created.
    pub fn new(name: &str) -> TempDir {
        static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let k = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("pinnable-{name}-{}-{k}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create a temporary directory");
        TempDir(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The bytes of `tokens` as little-endian `dtype` (u16 or u32).
///
/// # Panics
///
/// For a token that does not fit in `dtype`.
pub fn token_bytes(tokens: &[u32], dtype: DType) -> Vec<u8> {
    match dtype {
        DType::U16 => tokens
            .iter()
            .flat_map(|&t| u16::try_from(t).expect("a u16 token").to_le_bytes())
            .collect(),
        _ => tokens.iter().flat_map(|&t| t.to_le_bytes()).collect(),
    }
}

/// The file a Python tool writes for `tokens`: `tofile` (raw), llm.c's `write_datafile`
/// (magic 20240520 version 1 for u16, 20240801 version 7 for u32), or `np.save` of a 1-D array.
pub fn shard_file(format: ShardFormat, dtype: DType, tokens: &[u32]) -> Vec<u8> {
    let data = token_bytes(tokens, dtype);
    match format {
        ShardFormat::LlmC => {
            let (magic, version) = match dtype {
                DType::U16 => (20240520i32, 1i32),
                _ => (20240801, 7),
            };
            let mut header = [0i32; 256];
            header[0] = magic;
            header[1] = version;
            header[2] = i32::try_from(tokens.len()).expect("fewer than 2^31 tokens");
            let mut f: Vec<u8> = header.iter().flat_map(|v| v.to_le_bytes()).collect();
            f.extend(data);
            f
        }
        ShardFormat::Npy => {
            let descr = if dtype == DType::U16 { "<u2" } else { "<u4" };
            crate::npy::npy_file(descr, &[tokens.len()], false, &data)
        }
        _ => data,
    }
}

/// Writes `bytes` to `dir/name` and returns the path.
///
/// # Panics
///
/// If the file cannot be written.
pub fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).expect("create a shard");
    f.write_all(bytes).expect("write a shard");
    path
}

/// Random tokens below `vocab`.
pub fn random_tokens(r: &mut impl Rng, n: usize, vocab: u32) -> Vec<u32> {
    (0..n).map(|_| r.random_range(0..vocab)).collect()
}

/// 1 to 4 shards of random tokens (some too short for a window, some empty), at least one
/// holding a window of `context + 1`.
pub fn random_shards(
    r: &mut impl Rng,
    dir: &Path,
    format: ShardFormat,
    dtype: DType,
    context: usize,
    vocab: u32,
) -> (Vec<PathBuf>, Reference) {
    let n = r.random_range(1..=4);
    let mut shards: Vec<Vec<u32>> = (0..n)
        .map(|_| {
            let len = match r.random_range(0..6) {
                0 => 0,
                1 => r.random_range(0..=context + 1),
                _ => r.random_range(context + 1..context * 12 + 2),
            };
            random_tokens(r, len, vocab)
        })
        .collect();
    let k = r.random_range(0..n);
    if shards[k].len() <= context {
        shards[k] = random_tokens(r, context * 5 + 3, vocab);
    }
    let paths = shards
        .iter()
        .enumerate()
        .map(|(i, t)| write(dir, &format!("shard{i}.bin"), &shard_file(format, dtype, t)))
        .collect();
    (paths, Reference { shards, context })
}

/// Shards' tokens as written, and the windows of `context + 1` tokens a loader must cut.
#[derive(Clone, Debug)]
pub struct Reference {
    /// Each shard's tokens.
    pub shards: Vec<Vec<u32>>,
    /// The tokens of `x` per window.
    pub context: usize,
}

impl Reference {
    /// Every window, in order: (shard, first token).
    pub fn windows(&self) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (s, tokens) in self.shards.iter().enumerate() {
            let mut start = 0;
            while start + self.context < tokens.len() {
                out.push((s, start));
                start += self.context;
            }
        }
        out
    }

    /// Window `i`'s `x` and `y`, as i64.
    pub fn xy(&self, i: usize) -> (Vec<i64>, Vec<i64>) {
        let (s, start) = self.windows()[i];
        self.xy_at(s, start)
    }

    /// The window at `start` of shard `s`: its `x` and `y`, as i64.
    pub fn xy_at(&self, s: usize, start: usize) -> (Vec<i64>, Vec<i64>) {
        let t = &self.shards[s];
        let x = t[start..start + self.context].iter().map(|&v| i64::from(v));
        let y = t[start + 1..start + 1 + self.context]
            .iter()
            .map(|&v| i64::from(v));
        (x.collect(), y.collect())
    }

    /// The `x` and `y` of a batch of the windows `indices`, each flattened row after row.
    pub fn batch(&self, indices: &[usize]) -> (Vec<i64>, Vec<i64>) {
        let windows = self.windows();
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for &i in indices {
            let (s, start) = windows[i];
            let (a, b) = self.xy_at(s, start);
            x.extend(a);
            y.extend(b);
        }
        (x, y)
    }
}
