//! The index pass: every shard's headers read once at open, on several threads, and grouped
//! into samples; a damaged shard gives its samples before the damage, then the damage.

use std::sync::Arc;

use super::group::{self, Grouper, is_meta, split_key};
use super::gzip::{self, Gz};
use super::reader::{Members, members, stream_members};
use super::{ByteSource, Entry, Shard};
use crate::error::Error;

/// One shard's index: its entries, and its decoder when it is gzip-compressed.
pub(super) struct Indexed {
    pub(super) entries: Vec<Entry>,
    pub(super) gz: Option<Arc<Gz>>,
}

/// The index pass over every shard (its headers read through `readers[s]`), on up to
/// `threads` threads (shards are independent; a thread reads its shards' headers in file
/// order); each shard's index, in list order. A compressed shard is read `chunk` compressed
/// bytes at a time through its own bytes.
pub(super) fn index_shards(
    shards: &[Shard],
    readers: &[Arc<dyn ByteSource>],
    threads: usize,
    chunk: usize,
) -> Vec<Indexed> {
    let threads = threads.clamp(1, shards.len().max(1));
    let mut found: Vec<Indexed> = (0..shards.len())
        .map(|_| Indexed {
            entries: Vec::new(),
            gz: None,
        })
        .collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    (t..shards.len())
                        .step_by(threads)
                        .map(|s| (s, index_shard(&shards[s], &*readers[s], chunk)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for (t, handle) in handles.into_iter().enumerate() {
            match handle.join() {
                Ok(done) => {
                    for (s, indexed) in done {
                        found[s] = indexed;
                    }
                }
                // A panic in the reader is a bug; its shards become errors, not a crash.
                Err(_) => {
                    for s in (t..shards.len()).step_by(threads) {
                        found[s].entries = vec![Entry::Broken {
                            offset: 0,
                            problem: "the index pass panicked on this shard (a bug: please \
                                      report it with the shard)"
                                .into(),
                        }];
                    }
                }
            }
        }
    });
    found
}

/// The index pass over one shard: its samples, then the damage that ended it, if any.
fn index_shard(shard: &Shard, reader: &dyn ByteSource, chunk: usize) -> Indexed {
    let mut entries = Vec::new();
    if gzip::is_gzip(reader) {
        let gz = Arc::new(Gz::new(shard.bytes.clone(), chunk));
        group_members(stream_members(&gz, &shard.name), &mut entries);
        gz.release();
        if let Some(Entry::Broken { problem, .. }) = entries.last_mut() {
            problem.push_str(" (in a gzip-compressed shard: offsets count its decompressed bytes)");
        }
        return Indexed {
            entries,
            gz: Some(gz),
        };
    }
    group_members(members(reader, &shard.name), &mut entries);
    if let [Entry::Broken { offset: 0, problem }] = entries.as_mut_slice()
        && let Some((name, tool)) = gzip::unread_compression(reader)
    {
        *problem = format!(
            "a {name}-compressed shard: tar shards are read plain or gzip-compressed; \
             decompress it ({tool}) or compress it with gzip ({problem})"
        );
    }
    Indexed { entries, gz: None }
}

/// Groups the members of one shard into its entries. At damage, the sample being assembled
/// is delivered with the members read before it (webdataset yields it: Python's `tarfile`
/// ends the archive at a bad header), unless the damage is one of its own members cut
/// short; then the damage.
fn group_members(mut members: Members<'_>, entries: &mut Vec<Entry>) {
    let mut grouper = Grouper::default();
    while let Some(member) = members.next() {
        let member = match member {
            Ok(m) => m,
            Err(e) => {
                let (offset, problem) = match e {
                    Error::Tar {
                        offset, problem, ..
                    } => (offset, problem),
                    e => (0, e.to_string()),
                };
                if let Some(g) = grouper.finish() {
                    let own = members
                        .truncated_member()
                        .filter(|path| !is_meta(path))
                        .and_then(split_key)
                        .is_some_and(|(key, _)| key == g.key.as_slice());
                    if !own {
                        entries.push(Entry::Sample(g));
                    }
                }
                entries.push(Entry::Broken { offset, problem });
                return;
            }
        };
        match grouper.push(&member) {
            Ok(Some(done)) => entries.push(Entry::Sample(done)),
            Ok(None) => {}
            Err(d) => {
                entries.push(Entry::Broken {
                    offset: d.offset,
                    problem: format!(
                        "sample `{}` has a second `.{}` member; a sample holds one member per \
                         extension: rename one, or write them as separate samples",
                        group::show_key(&d.key),
                        d.ext
                    ),
                });
                return;
            }
        }
    }
    if let Some(last) = grouper.finish() {
        entries.push(Entry::Sample(last));
    }
}
