//! Local shard files: read with positioned reads (safe whatever happens to the file) or
//! mapped (zero-copy, under `TarShards::open_mapped`'s contract).

use std::borrow::Cow;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use super::ShardBytes;
use crate::error::{Error, Result};
use crate::formats::npy::Mapping;
use crate::tensor::HostBytes;

/// A local shard file read with positioned reads (`pread`): each read copies its bytes, so
/// nothing is lost if another process rewrites or truncates the file (a short read is an
/// error naming the shard and offset, as for a truncated shard).
struct FileShard {
    file: File,
    len: u64,
}

impl ShardBytes for FileShard {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Cow<'_, [u8]>> {
        let mut buf = Vec::new();
        buf.try_reserve_exact(len)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::OutOfMemory, e))?;
        buf.resize(len, 0);
        self.file.read_exact_at(&mut buf, offset)?;
        Ok(Cow::Owned(buf))
    }
}

/// A local shard file, mapped read-only ([`TarShards::open_mapped`]).
struct MappedShard(Mapping);

impl ShardBytes for MappedShard {
    fn len(&self) -> u64 {
        self.0.host_bytes().len() as u64
    }

    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Cow<'_, [u8]>> {
        self.0.host_bytes().read_at(offset, len)
    }

    fn in_memory(&self) -> Option<&[u8]> {
        Some(self.0.host_bytes())
    }
}

pub(super) fn open_file(path: &Path, mapped: bool) -> Result<(String, Arc<dyn ShardBytes>)> {
    let name = path.display().to_string();
    let cannot = |problem: String| Error::Tar {
        shard: name.clone(),
        offset: 0,
        problem: format!("cannot open it: {problem}"),
    };
    let bytes: Arc<dyn ShardBytes> = if mapped {
        Arc::new(MappedShard(Mapping::open(path).map_err(cannot)?))
    } else {
        let file = File::open(path).map_err(|e| cannot(e.to_string()))?;
        let len = file.metadata().map_err(|e| cannot(e.to_string()))?.len();
        if len == 0 {
            return Err(cannot("the file is empty".into()));
        }
        Arc::new(FileShard { file, len })
    };
    Ok((name, bytes))
}
