//! Tar shards at URLs (feature `remote`): located and sized through the storage layer, the
//! index pass through small header windows, each epoch's run streamed ahead of the workers.

use std::sync::{Arc, Mutex};

use super::{ByteSource, Shard, TarShards, as_tar, list};
use crate::error::{Error, Result};
use crate::storage::Storage;
use crate::storage::remote::{Headers, Remote, RemoteBytes, Streamer};

/// Opens the shards the URLs `patterns` name (brace ranges; globs for `s3://`) and runs the
/// index pass.
pub(super) fn open<S: AsRef<str>>(
    storage: &Storage,
    patterns: impl IntoIterator<Item = S>,
) -> Result<TarShards> {
    let remote = Remote::start(storage).map_err(as_tar)?;
    let mut located = Vec::new();
    for pattern in patterns {
        for name in list::expand_braces(pattern.as_ref())? {
            located.extend(remote.locate(&name).map_err(as_tar)?);
        }
    }
    if located.is_empty() {
        return Err(Error::Tar {
            shard: "(no shard)".into(),
            offset: 0,
            problem: "the shard list is empty; name a shard".into(),
        });
    }
    let objects = remote.objects(located).map_err(as_tar)?;
    let io = remote.io.clone();
    let mut shards = Vec::with_capacity(objects.len());
    let mut index_readers: Vec<Arc<dyn ByteSource>> = Vec::with_capacity(objects.len());
    for object in &objects {
        index_readers.push(Arc::new(Headers {
            object: object.clone(),
            io: io.clone(),
            window: Mutex::new(None),
        }));
        shards.push(Shard {
            name: object.url.clone(),
            bytes: Arc::new(RemoteBytes {
                object: object.clone(),
                io: io.clone(),
            }),
        });
    }
    // Index reads wait on the network, not the CPU: more threads than cores.
    let threads = shards.len().clamp(1, 32);
    let streams = Streamer::new(io, objects, storage.chunk, storage.ahead(), storage.cache);
    Ok(
        TarShards::build(shards, Some(index_readers), threads, storage.chunk)?
            .with_streams(Arc::new(streams)),
    )
}
