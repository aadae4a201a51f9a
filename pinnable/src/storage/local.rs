//! Local files: read with positioned reads (safe whatever happens to the file) or mapped
//! (zero-copy, under [`Storage::open_mapped`](super::Storage::open_mapped)'s contract).

use std::borrow::Cow;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use super::{ByteSource, storage_error};
use crate::error::Result;
use crate::tensor::HostBytes;

/// A local file read with positioned reads (`pread`): each read copies its bytes, so nothing
/// is lost if another process rewrites or truncates the file (a short read is an error naming
/// the offset, as for a truncated file).
struct FileBytes {
    file: File,
    len: u64,
}

impl ByteSource for FileBytes {
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

    fn read_into(&self, offset: u64, dst: &mut [u8]) -> std::io::Result<()> {
        self.file.read_exact_at(dst, offset)
    }
}

/// A local file, mapped read-only.
pub(super) struct MappedBytes(pub(super) Mapping);

impl ByteSource for MappedBytes {
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

/// The file at `path`, read with positioned reads.
pub(super) fn open_file(path: &Path) -> Result<Arc<dyn ByteSource>> {
    let name = path.display().to_string();
    let cannot = |problem: String| storage_error(&name, format!("cannot open it: {problem}"));
    let file = File::open(path).map_err(|e| cannot(e.to_string()))?;
    let len = file.metadata().map_err(|e| cannot(e.to_string()))?.len();
    Ok(Arc::new(FileBytes { file, len }))
}

/// A read-only, private memory mapping of a whole file.
pub(crate) struct Mapping(memmap2::Mmap);

impl Mapping {
    /// Maps the file `path` read-only; an error names the OS's reason.
    pub(crate) fn open(path: &Path) -> std::result::Result<Mapping, String> {
        let file = File::open(path).map_err(|e| e.to_string())?;
        let len = file.metadata().map_err(|e| e.to_string())?.len();
        if len == 0 {
            return Err("the file is empty".into());
        }
        usize::try_from(len).map_err(|_| "the file is larger than this machine's address space")?;
        // SAFETY: a private, read-only mapping (`MAP_PRIVATE`, `PROT_READ`): nothing in this
        // process writes it. Another process truncating the file while it is mapped would
        // fault a later read (SIGBUS); every caller reaches here through an `unsafe fn
        // open_mapped` whose `# Safety` puts that on its caller.
        let map = unsafe { memmap2::MmapOptions::new().map_copy_read_only(&file) }
            .map_err(|e| format!("cannot map it: {e}"))?;
        Ok(Mapping(map))
    }
}

impl HostBytes for Mapping {
    fn host_bytes(&self) -> &[u8] {
        &self.0
    }
}
