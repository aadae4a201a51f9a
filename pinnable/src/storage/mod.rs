//! Bytes by path or URL, for every format: local files read with positioned reads (mapped
//! only through an `unsafe` opt-in), and, with the `remote` feature, objects in S3 and
//! S3-compatible stores (`s3://bucket/key`) and on web servers (`http(s)://host/path`).
//!
//! A format reads its bytes through a [`ByteSource`] and never knows where they lie. The
//! formats' openers take a path or a URL as one parameter, and the settings of the reads in one
//! [`Storage`] (`open_with(&storage, …)`): endpoint and credentials, the remote runtime's
//! threads, chunk size, read-ahead, the memory cap, retries, timeouts.
//!
//! - **Local files** ([`Storage::open`]): positioned reads (`pread`), each a copy, safe
//!   whatever happens to the file meanwhile. [`Storage::open_mapped`] maps the file instead
//!   (zero-copy: [`ByteSource::in_memory`] is the whole file), under the contract in its
//!   `# Safety`.
//! - **Remote objects** (feature `remote`): read through object_store on a small tokio runtime
//!   that the opened sources share and join when the last of them is dropped; a read is one
//!   ranged `GET` (or several, [`read_ahead`](Storage::read_ahead) in flight, for a long
//!   read), asked for again from the first byte not received when it fails or stalls past
//!   [`timeout`](Storage::timeout), up to [`retries`](Storage::retries) times. S3 settings
//!   come from the `AWS_*` variables, over which [`option`](Storage::option) sets
//!   object_store's keys. Without the feature, a URL is an error naming the feature.
//!
//! # Examples
//!
//! ```
//! use pinnable::storage::Storage;
//!
//! let path = std::env::temp_dir().join(format!("pinnable-storage-doc-{}", std::process::id()));
//! std::fs::write(&path, b"hello, storage")?;
//! let bytes = Storage::new().open(path.to_str().unwrap())?;
//! assert_eq!(bytes.len(), 14);
//! assert_eq!(&*bytes.read_at(7, 7)?, b"storage");
//! std::fs::remove_file(&path)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod local;
#[cfg(feature = "remote")]
pub(crate) mod remote;

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub(crate) use local::Mapping;

use crate::error::{Error, Result};

/// The bytes of one file or object, read by offset: a local file (positioned reads or a
/// mapping), an object in a store, or anything else a format should read.
///
/// Implement it to give a format bytes from somewhere else (see the crate docs' "Adding a
/// format"); a reader asks only for ranges inside `0..len()`, and treats a short answer as a
/// truncated file.
pub trait ByteSource: Send + Sync {
    /// The size in bytes.
    fn len(&self) -> u64;

    /// Whether there is no byte.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `len` bytes from `offset` (borrowed where the bytes are already in memory).
    ///
    /// # Errors
    ///
    /// The I/O error reading them.
    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Cow<'_, [u8]>>;

    /// Fills `dst` with the bytes from `offset` (by default through [`read_at`](Self::read_at);
    /// a source that can write straight into `dst` does so).
    ///
    /// # Errors
    ///
    /// The I/O error reading them.
    fn read_into(&self, offset: u64, dst: &mut [u8]) -> std::io::Result<()> {
        let got = self.read_at(offset, dst.len())?;
        if got.len() != dst.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{} of {} bytes from byte {offset}", got.len(), dst.len()),
            ));
        }
        dst.copy_from_slice(&got);
        Ok(())
    }

    /// All the bytes, when they are in memory (mapped): a format then views them, no copy.
    fn in_memory(&self) -> Option<&[u8]> {
        None
    }
}

impl ByteSource for [u8] {
    fn len(&self) -> u64 {
        <[u8]>::len(self) as u64
    }

    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Cow<'_, [u8]>> {
        usize::try_from(offset)
            .ok()
            .and_then(|o| self.get(o..o.checked_add(len)?))
            .map(Cow::Borrowed)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))
    }

    fn in_memory(&self) -> Option<&[u8]> {
        Some(self)
    }
}

impl ByteSource for Vec<u8> {
    fn len(&self) -> u64 {
        self.as_slice().len() as u64
    }

    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Cow<'_, [u8]>> {
        self.as_slice().read_at(offset, len)
    }

    fn in_memory(&self) -> Option<&[u8]> {
        Some(self)
    }
}

/// Whether `location` is a URL (`scheme://…`) rather than a local path.
pub fn is_url(location: &str) -> bool {
    location.split_once("://").is_some_and(|(scheme, _)| {
        !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '+')
    })
}

/// The chunks a stream fetches ahead at first when [`Storage::read_ahead`] is not set.
#[cfg_attr(not(feature = "remote"), allow(dead_code))]
pub(crate) const AHEAD_START: usize = 4;

/// How to read bytes by path or URL: one set of settings that every format's opener takes
/// (`open_with(&storage, …)`). The settings other than [`option`](Self::option) only matter
/// for URLs (feature `remote`).
///
/// The guide's [`tar`](crate::guide::tar) chapter tells what each setting costs and how to
/// choose it.
///
/// # Examples
///
/// ```no_run
/// use pinnable::formats::tar::TarShards;
/// use pinnable::storage::Storage;
///
/// // An S3-compatible store at its own endpoint; credentials from the usual AWS_* variables.
/// let storage = Storage::new()
///     .option("aws_endpoint", "http://127.0.0.1:9000")
///     .option("aws_allow_http", "true")
///     .read_ahead(4);
/// let shards = TarShards::open_with(&storage, ["s3://datasets/train-{000..015}.tar"])?;
/// println!("{} samples in {} shards", shards.len(), shards.shard_names().count());
///
/// // A web server, with the default settings; brace ranges expand as for local paths.
/// let shards = TarShards::open(["https://example.com/data/x-{0..3}.tar"])?;
/// # Ok::<(), pinnable::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Storage {
    pub(crate) chunk: usize,
    /// Chunks fetched ahead, set by hand (`None`: grown while the workers wait).
    pub(crate) read_ahead: Option<usize>,
    pub(crate) cache: usize,
    pub(crate) index_window: usize,
    pub(crate) retries: usize,
    pub(crate) timeout: Duration,
    /// The runtime's threads, set by hand (`None`: sized to the host).
    pub(crate) threads: Option<usize>,
    pub(crate) options: Vec<(String, String)>,
}

impl Default for Storage {
    fn default() -> Storage {
        Storage::new()
    }
}

impl Storage {
    /// The defaults: 4 MiB chunks, the read-ahead grown while the workers wait (from 4
    /// chunks), a 256 MiB cache, 4 KiB index windows, 5 retries, a 30 s timeout
    /// per request, runtime threads sized to the host ([`threads`](Self::threads)).
    pub fn new() -> Storage {
        Storage {
            chunk: 4 << 20,
            read_ahead: None,
            cache: 256 << 20,
            index_window: 4 << 10,
            retries: 5,
            timeout: Duration::from_secs(30),
            threads: None,
            options: Vec::new(),
        }
    }

    /// The read-ahead a stream starts with, and whether it may grow.
    #[cfg_attr(not(feature = "remote"), allow(dead_code))]
    pub(crate) fn ahead(&self) -> (usize, bool) {
        match self.read_ahead {
            Some(n) => (n, false),
            None => (AHEAD_START, true),
        }
    }

    /// The runtime's threads: as set, else half the cores this process may use, 2 to 8.
    #[cfg_attr(not(feature = "remote"), allow(dead_code))]
    pub(crate) fn runtime_threads(&self) -> usize {
        self.threads
            .unwrap_or_else(|| (crate::numa::cores() / 2).clamp(2, 8))
    }

    /// The bytes one ranged `GET` asks for while streaming (at least 64 KiB). Tar shards cut
    /// their chunks at a sample's end, so a chunk holds at least one sample.
    pub fn chunk_size(mut self, bytes: usize) -> Storage {
        self.chunk = bytes.max(64 << 10);
        self
    }

    /// How many chunks are fetched at once ahead of those a reader asked for (each landing
    /// starts the next, while [`cache_bytes`](Self::cache_bytes) allows), fixed. By default a
    /// stream starts with 4 and doubles it each time a worker has to wait for a
    /// chunk still on its way, up to as many chunks as the cache holds: the cache bounds the
    /// memory either way.
    pub fn read_ahead(mut self, chunks: usize) -> Storage {
        self.read_ahead = Some(chunks);
        self
    }

    /// The bytes of streamed samples held for the workers above which the read-ahead pauses
    /// (the chunks workers wait on are fetched still), and the bound on the received buffers
    /// samples keep slices of instead of copies (0: every sample copied into its own buffer).
    /// A tar shuffle buffer holds its samples' bytes: a cap under them only slows the stream
    /// to the workers' pace.
    pub fn cache_bytes(mut self, bytes: usize) -> Storage {
        self.cache = bytes;
        self
    }

    /// The bytes each header read of a tar index pass asks for (at least 1 KiB).
    pub fn index_window(mut self, bytes: usize) -> Storage {
        self.index_window = bytes.max(1 << 10);
        self
    }

    /// How many times a failed or stalled request is made again, on top of object_store's
    /// own retries.
    pub fn retries(mut self, retries: usize) -> Storage {
        self.retries = retries;
        self
    }

    /// The longest wait for a response or for the next bytes of a body (at least 10 ms).
    pub fn timeout(mut self, timeout: Duration) -> Storage {
        self.timeout = timeout.max(Duration::from_millis(10));
        self
    }

    /// The runtime's threads (at least 1). They receive the bodies, and receiving costs CPU
    /// (the kernel's copy out of the socket, mostly): two serve a link of a few GB/s; a faster
    /// one wants more, with a longer [`read_ahead`](Self::read_ahead) to keep them busy. By
    /// default half the cores this process may use, 2 to 8: threads with nothing to receive
    /// wait, idle.
    pub fn threads(mut self, threads: usize) -> Storage {
        self.threads = Some(threads.max(1));
        self
    }

    /// An object_store configuration key for S3 (`aws_endpoint`, `aws_region`,
    /// `aws_access_key_id`, `aws_allow_http`, `aws_skip_signature`, ...), over the `AWS_*`
    /// environment variables read by default.
    pub fn option(mut self, key: impl Into<String>, value: impl Into<String>) -> Storage {
        self.options.push((key.into(), value.into()));
        self
    }

    /// The bytes at `location`: a local file, read with positioned reads (each read a copy),
    /// or (feature `remote`) an object at an `s3://`, `http://` or `https://` URL, read with
    /// ranged `GET`s on a runtime of its own.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] naming `location`: a file that cannot be opened; a URL
    /// without the `remote` feature, with an unsupported scheme, or whose object is missing
    /// (404), refused (401, 403) or cannot be reached after the retries.
    pub fn open(&self, location: &str) -> Result<Arc<dyn ByteSource>> {
        Session::new(self).open(location)
    }

    /// Maps the local file at `path` read-only: its bytes are in memory
    /// ([`ByteSource::in_memory`]), and formats view them without a copy.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] naming the file: it cannot be opened or mapped, or is empty.
    ///
    /// # Safety
    ///
    /// 1. Nothing (this process or another) writes to or truncates the file while the source,
    ///    or anything viewing its bytes (a tensor, a batch), lives. The mapping is not a
    ///    snapshot: a write would change bytes read as unchanging, a truncation make reading
    ///    them fault. Files written once and then only read satisfy this.
    pub unsafe fn open_mapped(path: impl AsRef<Path>) -> Result<Arc<dyn ByteSource>> {
        let path = path.as_ref();
        let mapping =
            Mapping::open(path).map_err(|p| storage_error(&path.display().to_string(), p))?;
        Ok(Arc::new(local::MappedBytes(mapping)))
    }
}

/// Whether `name` matches the glob `pattern` (`*` any run, `?` one character).
pub(crate) fn glob_match(pattern: &[char], name: &[char]) -> bool {
    let (mut p, mut n) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while n < name.len() {
        if p < pattern.len() && (pattern[p] == '?' || pattern[p] == name[n]) {
            p += 1;
            n += 1;
        } else if p < pattern.len() && pattern[p] == '*' {
            star = Some(p);
            mark = n;
            p += 1;
        } else if let Some(s) = star {
            p = s + 1;
            mark += 1;
            n = mark;
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

pub(crate) fn storage_error(name: &str, problem: impl Into<String>) -> Error {
    Error::Storage {
        name: name.to_owned(),
        problem: problem.into(),
    }
}

/// The error a URL gets without the `remote` feature.
#[cfg(not(feature = "remote"))]
fn no_remote(location: &str) -> Error {
    storage_error(
        location,
        "a URL: build pinnable with its `remote` feature to read from object stores and web \
         servers",
    )
}

/// Opens many files and objects with one set of settings: the objects share one runtime,
/// started at the first URL, and one store per bucket or server.
pub(crate) struct Session {
    storage: Storage,
    #[cfg(feature = "remote")]
    remote: std::sync::OnceLock<Arc<remote::Remote>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("storage", &self.storage)
            .finish_non_exhaustive()
    }
}

impl Session {
    pub(crate) fn new(storage: &Storage) -> Session {
        Session {
            storage: storage.clone(),
            #[cfg(feature = "remote")]
            remote: std::sync::OnceLock::new(),
        }
    }

    /// The remote reader, started at the first call.
    #[cfg(feature = "remote")]
    pub(crate) fn remote(&self) -> Result<&Arc<remote::Remote>> {
        if let Some(r) = self.remote.get() {
            return Ok(r);
        }
        let started = remote::Remote::start(&self.storage)?;
        Ok(self.remote.get_or_init(|| started))
    }

    /// The bytes at `location` (a path or a URL), read as [`Storage::open`] reads them.
    pub(crate) fn open(&self, location: &str) -> Result<Arc<dyn ByteSource>> {
        if is_url(location) {
            #[cfg(feature = "remote")]
            return self.remote()?.open(location);
            #[cfg(not(feature = "remote"))]
            return Err(no_remote(location));
        }
        local::open_file(Path::new(location))
    }

    /// The whole file or object at `location`, in memory.
    pub(crate) fn read_all(&self, location: &str) -> Result<Vec<u8>> {
        if !is_url(location) {
            return std::fs::read(location)
                .map_err(|e| storage_error(location, format!("cannot read it: {e}")));
        }
        let source = self.open(location)?;
        let len = usize::try_from(source.len())
            .map_err(|_| storage_error(location, "larger than this machine's address space"))?;
        let mut out = vec![0; len];
        source
            .read_into(0, &mut out)
            .map_err(|e| storage_error(location, e.to_string()))?;
        Ok(out)
    }

    /// The objects under the `s3://` prefix `location` (a folder), with their sizes, sorted by
    /// key.
    #[cfg_attr(not(feature = "image"), allow(dead_code))]
    pub(crate) fn list(&self, location: &str) -> Result<Vec<(String, u64)>> {
        #[cfg(feature = "remote")]
        return self.remote()?.list(location);
        #[cfg(not(feature = "remote"))]
        Err(no_remote(location))
    }
}
