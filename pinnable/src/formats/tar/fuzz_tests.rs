//! Tar shards are hostile input: the reader and the index pass are fed arbitrary bytes (real
//! ustar, pax and GNU archives, mutated) and must answer each with members inside the input or
//! an [`Error::Tar`] naming the shard; never a panic, a hang, or metadata held past its bound.

use std::sync::Arc;

use super::{Entry, ShardBytes, TarShards, members, reader::MAX_META};
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
            let shard: Arc<dyn ShardBytes> = Arc::new(bytes.to_vec());
            let Ok(shards) = TarShards::from_shards([("fuzz.tar".to_owned(), shard)]) else {
                return Err("one shard is a valid list".into());
            };
            for entry in &shards.index.entries {
                if let Entry::Sample(g) = entry
                    && g.fields.iter().any(|f| f.offset + f.size > len)
                {
                    return Err(format!("a field of {} outside the shard", g.key));
                }
            }
            Ok(())
        });
}
