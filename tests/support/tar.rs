//! WebDataset shards for the tar tests, example and bench: ustar members written byte by byte,
//! and shards of random samples whose contents the tests know.

use std::path::{Path, PathBuf};

use pinnable::formats::tar::{TarSample, TarShards};
use pinnable::loader::Dataset;
use rand::Rng;

/// One member: a ustar header block (name, size, checksum), the data, zero padding.
pub fn member(out: &mut Vec<u8>, name: &str, data: &[u8]) {
    member_bytes(out, name.as_bytes(), data);
}

/// One member whose name is any bytes (UTF-8 or not), as [`member`] writes it.
pub fn member_bytes(out: &mut Vec<u8>, name: &[u8], data: &[u8]) {
    assert!(name.len() <= 100, "ustar names hold 100 bytes");
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name);
    h[100..108].copy_from_slice(b"0000644\0");
    h[108..116].copy_from_slice(b"0000000\0");
    h[116..124].copy_from_slice(b"0000000\0");
    h[124..136].copy_from_slice(format!("{:011o}\0", data.len()).as_bytes());
    h[136..148].copy_from_slice(b"00000000000\0");
    h[156] = b'0';
    h[257..265].copy_from_slice(b"ustar\x0000");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out.resize(out.len().next_multiple_of(512), 0);
}

/// A sample to write: its key and its fields (extension, bytes).
pub type Sample = (String, Vec<(String, Vec<u8>)>);

/// A shard of `samples`, ended by two zero blocks; returns its bytes and the offset of each
/// sample's first header.
pub fn shard(samples: &[Sample]) -> (Vec<u8>, Vec<u64>) {
    let mut out = Vec::new();
    let mut starts = Vec::new();
    for (key, fields) in samples {
        starts.push(out.len() as u64);
        for (ext, data) in fields {
            member(&mut out, &format!("{key}.{ext}"), data);
        }
    }
    out.resize(out.len() + 1024, 0);
    (out, starts)
}

/// A fresh folder under the temporary directory, for one test of this process.
pub fn folder(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pinnable-tar-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    dir
}

/// A random `.txt` of 1 to 300 letters and a `.cls`, keyed `s{shard}/{i:05}`.
pub fn random_sample(r: &mut impl Rng, shard: usize, i: usize) -> Sample {
    let n = r.random_range(1..300);
    let text: Vec<u8> = (0..n).map(|_| r.random_range(b'a'..=b'z')).collect();
    let class = r.random_range(0..1000i64);
    (
        format!("s{shard}/{i:05}"),
        vec![
            ("txt".into(), text),
            ("cls".into(), class.to_string().into_bytes()),
        ],
    )
}

/// Shards `train-{000..}.tar` in `dir` holding `counts[s]` random samples each; returns the
/// brace pattern naming them and every shard's samples.
pub fn random_shards(dir: &Path, r: &mut impl Rng, counts: &[usize]) -> (String, Vec<Vec<Sample>>) {
    let mut all = Vec::new();
    for (s, &n) in counts.iter().enumerate() {
        let samples: Vec<Sample> = (0..n).map(|i| random_sample(r, s, i)).collect();
        std::fs::write(dir.join(format!("train-{s:03}.tar")), shard(&samples).0)
            .expect("write a shard");
        all.push(samples);
    }
    let pattern = format!(
        "{}/train-{{000..{:03}}}.tar",
        dir.display(),
        counts.len() - 1
    );
    (pattern, all)
}

/// A key as the expected files show it: UTF-8 as it is, other bytes as `\xNN` (Python's
/// `backslashreplace`).
pub fn shown(key: &[u8]) -> String {
    let mut out = String::new();
    for chunk in key.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// `bytes` gzip-compressed (as `gzip` or Python's `tarfile` in mode `w:gz` write them) at
/// `level` (0 to 9).
pub fn gzip(bytes: &[u8], level: u32) -> Vec<u8> {
    use std::io::Write;
    let mut out = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
    out.write_all(bytes).expect("compress in memory");
    out.finish().expect("compress in memory")
}

/// A sample's key and fields, read.
pub fn read_sample(s: &TarSample) -> Sample {
    let fields = s
        .fields()
        .iter()
        .map(|f| (f.ext.clone(), s.bytes(&f.ext).unwrap().into_owned()))
        .collect();
    (s.key().unwrap().to_owned(), fields)
}

/// Every sample's key and fields, read in index order.
pub fn contents(shards: &TarShards) -> Vec<Sample> {
    (0..shards.len())
        .map(|i| read_sample(&shards.get(i).unwrap()))
        .collect()
}
