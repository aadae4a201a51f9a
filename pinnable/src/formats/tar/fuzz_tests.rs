//! Tar shards are hostile input: the reader and the index pass are fed arbitrary bytes (real
//! ustar, pax and GNU archives, mutated, plain and gzip-compressed) and must answer each with
//! members inside the input or an [`Error::Tar`] naming the shard; never a panic, a hang, or
//! metadata held past its bound.

use std::sync::Arc;

use super::reader::{MAX_META, members};
use super::{ByteSource, Entry, TarShards};
use crate::error::Error;
use crate::fuzz::Fuzz;

const SEEDS: [&[u8]; 4] = [
    include_bytes!("../../../../tests/data/tar/awkward_gnu.tar"),
    include_bytes!("../../../../tests/data/tar/pax.tar"),
    include_bytes!("../../../../tests/data/tar/ustar.tar"),
    include_bytes!("../../../../tests/data/tar/duplicate.tar"),
];

#[test]
fn reader_answers_arbitrary_bytes_with_members_inside_them_or_errors() {
    Fuzz::new("tar_reader")
        .seeds(SEEDS.iter().map(|s| s.to_vec()))
        .tokens(&[
            b"ustar\0",
            b"ustar  \0",
            b"././@LongLink",
            b"path=",
            b"size=",
            b"0000644\0",
        ])
        .run(|bytes| {
            let len = bytes.len() as u64;
            let mut last = None;
            let owned = bytes.to_vec();
            for m in members(&owned, "fuzz.tar") {
                match m {
                    Ok(m) => {
                        if m.data.checked_add(m.size).is_none_or(|e| e > len) {
                            return Err(format!("member {m:?} outside {len} bytes"));
                        }
                        if last.is_some_and(|l| m.header <= l) {
                            return Err(format!("member {m:?} does not move forward"));
                        }
                        if m.path.len() as u64 > MAX_META.max(512) {
                            return Err(format!("a path of {} bytes", m.path.len()));
                        }
                        last = Some(m.header);
                    }
                    Err(Error::Tar { shard, offset, .. }) => {
                        if shard != "fuzz.tar" || offset > len {
                            return Err(format!("error names {shard} at {offset}"));
                        }
                    }
                    Err(e) => return Err(format!("not a tar error: {e}")),
                }
            }
            // The index pass over the same bytes: its entries lie inside them.
            let shard: Arc<dyn ByteSource> = Arc::new(bytes.to_vec());
            let Ok(shards) = TarShards::from_shards([("fuzz.tar".to_owned(), shard)]) else {
                return Err("one shard is a valid list".into());
            };
            for entry in &shards.index.entries {
                if let Entry::Sample(g) = entry
                    && g.fields.iter().any(|f| f.offset + f.size > len)
                {
                    return Err(format!("a field of {:?} outside the shard", g.key));
                }
            }
            Ok(())
        });
}

/// `bytes` gzip-compressed at `level`.
fn gzipped(bytes: &[u8], level: u32) -> Vec<u8> {
    use std::io::Write;
    let mut out = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
    out.write_all(bytes).expect("compress in memory");
    out.finish().expect("compress in memory")
}

#[test]
fn gzip_shards_answer_arbitrary_bytes_with_samples_inside_them_or_errors() {
    // Stored (level 0) seeds keep mutations of the tar inside a valid stream; compressed ones
    // put them in the deflate data and the gzip header and trailer.
    let seeds = SEEDS
        .iter()
        .flat_map(|s| [gzipped(s, 0), gzipped(s, 6)])
        .chain([gzipped(
            &[gzipped(SEEDS[1], 1), gzipped(SEEDS[2], 9)].concat(),
            0,
        )]);
    Fuzz::new("tar_gzip")
        .seeds(seeds)
        .tokens(&[
            b"\x1f\x8b\x08\x00",
            b"\x1f\x8b\x08\x08",
            b"ustar\0",
            b"path=",
            b"\x00\x00\xff\xff",
        ])
        .run(|bytes| {
            let shard: Arc<dyn ByteSource> = Arc::new(bytes.to_vec());
            let Ok(shards) = TarShards::from_shards([("fuzz.tar.gz".to_owned(), shard)]) else {
                return Err("one shard is a valid list".into());
            };
            let decompressed = shards.index.shards[0].bytes.len();
            for (i, entry) in shards.index.entries.iter().enumerate() {
                match entry {
                    Entry::Broken { problem, .. } if problem.contains("panicked") => {
                        return Err(problem.clone());
                    }
                    Entry::Broken { .. } => {}
                    Entry::Sample(g) => {
                        if g.fields.iter().any(|f| f.offset + f.size > decompressed) {
                            return Err(format!("a field of {:?} outside the shard", g.key));
                        }
                        let sample = crate::loader::Dataset::get(&shards, i)
                            .map_err(|e| format!("sample {i} indexed but not read: {e}"))?;
                        for f in sample.fields() {
                            let got = sample.bytes(&f.ext).map_err(|e| e.to_string())?;
                            if got.len() as u64 != f.size {
                                return Err(format!("{} bytes of {}", got.len(), f.size));
                            }
                        }
                    }
                }
            }
            Ok(())
        });
}
