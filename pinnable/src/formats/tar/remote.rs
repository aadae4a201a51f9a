//! Shards in object storage and on web servers (feature `remote`): S3 and S3-compatible
//! stores (`s3://bucket/key`) and plain HTTP(S) (`https://host/path`), read through
//! `object_store` on a small tokio runtime that the source owns; see [`Remote`].

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::http::HttpBuilder;
use object_store::path::Path as StorePath;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};
use url::Url;

use super::{Shard, ShardBytes, TarShards, list};
use crate::error::{Error, Result};

mod io;
mod split;
mod stream;
use io::*;
use stream::Streamer;

/// Opens tar shards in object storage or on web servers (S3 and S3-compatible stores, plain
/// HTTP(S)) through object_store, on a small tokio runtime that the opened source owns and
/// joins when its last clone is dropped: settings for the reads, then [`open`](Remote::open).
///
/// - **Open**: brace ranges expand as for local paths; globs only for `s3://`, whose keys can
///   be listed. Credentials come from the `AWS_*` variables or [`option`](Remote::option). A
///   missing (404) or refused (401/403) shard is an [`Error::Tar`] naming its URL, before any
///   sample is read.
/// - **Index pass**: member headers only, through ranged `GET`s of
///   [`index_window`](Remote::index_window) bytes; whole shards are never downloaded first.
/// - **Reads**: each epoch streams this rank's run once, in chunks of whole samples about
///   [`chunk_size`](Remote::chunk_size) long (one ranged `GET` each), with
///   [`read_ahead`](Remote::read_ahead) chunks in flight ahead of the workers; every byte is
///   read once an epoch, whatever the shuffle buffer or worker count. A sample read outside
///   the loader's epoch is one `GET` of its own bytes.
/// - **Memory**: samples are held from their chunk's arrival until a worker takes them; the
///   read-ahead pauses while they (and the received buffers they keep slices of) reach
///   [`cache_bytes`](Remote::cache_bytes).
/// - **Speed**: receiving costs CPU ([`threads`](Remote::threads)); when the host is shared,
///   let the loader make about as many batches ahead as it has workers
///   ([`LoaderBuilder::prefetch`](crate::loader::LoaderBuilder::prefetch)), since a worker put
///   off the CPU holds up every batch after its own.
/// - **Gzip-compressed shards** (told by their first bytes) cannot be read by range: the
///   index pass reads each whole, and each epoch reads it again, decompressing as it goes, in
///   ranged `GET`s of [`chunk_size`](Remote::chunk_size) one at a time (not read ahead).
/// - **Retries**: object_store's, and ours around them: a request or body that fails or stalls
///   past [`timeout`](Remote::timeout) is asked for again from the first byte not received, up
///   to [`retries`](Remote::retries) times. Permanent errors (404, 403, a shard changed while
///   read) are not retried.
///
/// The guide's [`tar`](crate::guide::tar) chapter tells what each setting costs and how to
/// choose it.
///
/// # Examples
///
/// ```no_run
/// use pinnable::formats::tar::Remote;
///
/// // An S3-compatible store at its own endpoint; credentials from the usual AWS_* variables.
/// let shards = Remote::new()
///     .option("aws_endpoint", "http://127.0.0.1:9000")
///     .option("aws_allow_http", "true")
///     .read_ahead(4)
///     .open(["s3://datasets/train-{000..015}.tar"])?;
/// println!("{} samples in {} shards", shards.len(), shards.shard_names().count());
///
/// // A web server; brace ranges expand as for local paths.
/// let shards = Remote::new().open(["https://example.com/data/x-{0..3}.tar"])?;
/// # Ok::<(), pinnable::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Remote {
    chunk: usize,
    read_ahead: usize,
    cache: usize,
    index_window: usize,
    retries: usize,
    timeout: Duration,
    threads: usize,
    options: Vec<(String, String)>,
}

impl Default for Remote {
    fn default() -> Remote {
        Remote::new()
    }
}

impl Remote {
    /// The defaults: 4 MiB chunks, 2 read ahead, a 256 MiB cache, 4 KiB index windows, 5
    /// retries, a 30 s timeout per request, 2 runtime threads.
    pub fn new() -> Remote {
        Remote {
            chunk: 4 << 20,
            read_ahead: 2,
            cache: 256 << 20,
            index_window: 4 << 10,
            retries: 5,
            timeout: Duration::from_secs(30),
            threads: 2,
            options: Vec::new(),
        }
    }

    /// The bytes one ranged `GET` asks for while streaming (at least 64 KiB): chunks end at a
    /// sample's end, so a chunk holds at least one sample.
    pub fn chunk_size(mut self, bytes: usize) -> Remote {
        self.chunk = bytes.max(64 << 10);
        self
    }

    /// How many chunks are fetched at once ahead of those the workers asked for (each landing
    /// starts the next, while [`cache_bytes`](Self::cache_bytes) allows).
    pub fn read_ahead(mut self, chunks: usize) -> Remote {
        self.read_ahead = chunks;
        self
    }

    /// The bytes of streamed samples held for the workers above which the read-ahead pauses
    /// (the chunks workers wait on are fetched still), and the bound on the received buffers
    /// samples keep slices of instead of copies (0: every sample copied into its own buffer).
    /// The shuffle buffer holds its samples' bytes: a cap under them only slows the stream to
    /// the workers' pace.
    pub fn cache_bytes(mut self, bytes: usize) -> Remote {
        self.cache = bytes;
        self
    }

    /// The bytes each header read of the index pass asks for (at least 1 KiB).
    pub fn index_window(mut self, bytes: usize) -> Remote {
        self.index_window = bytes.max(1 << 10);
        self
    }

    /// How many times a failed or stalled request is made again, on top of object_store's
    /// own retries.
    pub fn retries(mut self, retries: usize) -> Remote {
        self.retries = retries;
        self
    }

    /// The longest wait for a response or for the next bytes of a body (at least 10 ms).
    pub fn timeout(mut self, timeout: Duration) -> Remote {
        self.timeout = timeout.max(Duration::from_millis(10));
        self
    }

    /// The runtime's threads (at least 1). They receive the bodies, and receiving costs CPU
    /// (the kernel's copy out of the socket, mostly): two serve a link of a few GB/s; a faster
    /// one wants more, with a longer [`read_ahead`](Self::read_ahead) to keep them busy.
    pub fn threads(mut self, threads: usize) -> Remote {
        self.threads = threads.max(1);
        self
    }

    /// An object_store configuration key for S3 (`aws_endpoint`, `aws_region`,
    /// `aws_access_key_id`, `aws_allow_http`, `aws_skip_signature`, ...), over the `AWS_*`
    /// environment variables read by default.
    pub fn option(mut self, key: impl Into<String>, value: impl Into<String>) -> Remote {
        self.options.push((key.into(), value.into()));
        self
    }

    /// Opens the shards `patterns` name (URLs: `s3://bucket/key`, `http://` and `https://`;
    /// brace ranges; globs for `s3://`) and runs the index pass.
    ///
    /// # Errors
    ///
    /// [`Error::Tar`] naming the URL: not a URL or an unsupported scheme, a glob that matches
    /// nothing or cannot be listed, a shard that is missing (404), refused (401, 403) or
    /// cannot be reached after the retries; an unknown [`option`](Self::option) key.
    pub fn open<S: AsRef<str>>(&self, patterns: impl IntoIterator<Item = S>) -> Result<TarShards> {
        let io = Io::start(self)?;
        let mut stores: HashMap<String, Arc<dyn ObjectStore>> = HashMap::new();
        let mut located: Vec<(String, Arc<dyn ObjectStore>, StorePath)> = Vec::new();
        for pattern in patterns {
            for name in list::expand_braces(pattern.as_ref())? {
                let (url, base) = parse(&name)?;
                let store = match stores.get(&base) {
                    Some(s) => s.clone(),
                    None => {
                        let s = self.store(&url, &name)?;
                        stores.insert(base.clone(), s.clone());
                        s
                    }
                };
                let path = StorePath::from_url_path(url.path())
                    .map_err(|e| url_error(&name, format!("bad object path: {e}")))?;
                if url.path().contains(['*', '?']) {
                    for (full, path) in io.glob(&store, &url, &base, &name)? {
                        located.push((full, store.clone(), path));
                    }
                } else {
                    located.push((name, store, path));
                }
            }
        }
        if located.is_empty() {
            return Err(url_error(
                "(no shard)",
                "the shard list is empty; name a shard",
            ));
        }
        let sizes = io.sizes(&located)?;
        let mut shards = Vec::with_capacity(located.len());
        let mut objects = Vec::with_capacity(located.len());
        let mut index_readers: Vec<Arc<dyn ShardBytes>> = Vec::with_capacity(located.len());
        for ((name, store, path), len) in located.into_iter().zip(sizes) {
            let object = Arc::new(Object {
                url: name.clone(),
                store,
                path,
                len,
            });
            index_readers.push(Arc::new(Headers {
                object: object.clone(),
                io: io.clone(),
                window: Mutex::new(None),
            }));
            shards.push(Shard {
                name,
                bytes: Arc::new(RemoteShard {
                    object: object.clone(),
                    io: io.clone(),
                }),
            });
            objects.push(object);
        }
        // Index reads wait on the network, not the CPU: more threads than cores.
        let threads = shards.len().clamp(1, 32);
        let streams = Streamer::new(io, objects, self.chunk, self.read_ahead, self.cache);
        Ok(
            TarShards::build(shards, Some(index_readers), threads, self.chunk)?
                .with_streams(Arc::new(streams)),
        )
    }

    fn store(&self, url: &Url, name: &str) -> Result<Arc<dyn ObjectStore>> {
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(50),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
            },
            max_retries: self.retries,
            retry_timeout: self.timeout * (self.retries as u32 + 1),
        };
        let client = ClientOptions::new()
            .with_timeout(self.timeout)
            .with_connect_timeout(self.timeout.min(Duration::from_secs(10)));
        let built = match url.scheme() {
            "s3" | "s3a" => {
                let mut b = AmazonS3Builder::from_env()
                    .with_url(url.as_str())
                    .with_retry(retry)
                    .with_client_options(client);
                for (key, value) in &self.options {
                    let key: AmazonS3ConfigKey = key.parse().map_err(|_| {
                        url_error(
                            name,
                            format!(
                                "`{key}` is not an S3 option; use object_store's keys such as \
                                 aws_endpoint, aws_region, aws_allow_http"
                            ),
                        )
                    })?;
                    b = b.with_config(key, value);
                }
                b.build().map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
            }
            "http" | "https" => {
                let base = format!("{}://{}", url.scheme(), authority(url));
                HttpBuilder::new()
                    .with_url(base)
                    .with_retry(retry)
                    .with_client_options(client.with_allow_http(url.scheme() == "http"))
                    .build()
                    .map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
            }
            other => {
                return Err(url_error(
                    name,
                    format!(
                        "`{other}://` is not supported: use s3://, http:// or https:// (Google \
                         Cloud Storage and Azure through their S3-compatible endpoints with the \
                         aws_endpoint option)"
                    ),
                ));
            }
        };
        built.map_err(|e| url_error(name, format!("cannot set up its store: {e}")))
    }
}

fn url_error(name: &str, problem: impl Into<String>) -> Error {
    Error::Tar {
        shard: name.to_owned(),
        offset: 0,
        problem: problem.into(),
    }
}

fn authority(url: &Url) -> String {
    match (url.host_str(), url.port()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_owned(),
        _ => String::new(),
    }
}

/// The URL and the store it belongs to (`scheme://authority`).
fn parse(name: &str) -> Result<(Url, String)> {
    let url = Url::parse(name).map_err(|e| {
        url_error(
            name,
            format!("not a URL ({e}); a remote shard is s3://bucket/key or http(s)://host/path"),
        )
    })?;
    let base = format!("{}://{}", url.scheme(), authority(&url));
    Ok((url, base))
}

/// A remote shard's bytes read directly (the index pass and samples come by other ways).
struct RemoteShard {
    object: Arc<Object>,
    io: Arc<Io>,
}

impl ShardBytes for RemoteShard {
    fn len(&self) -> u64 {
        self.object.len
    }

    /// One ranged `GET` of the bytes asked for: samples read through the loader come from
    /// the streams instead, held whole.
    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Cow<'_, [u8]>> {
        let o = &*self.object;
        let end = offset
            .checked_add(len as u64)
            .filter(|&e| e <= o.len)
            .ok_or_else(|| io_error(o, format!("bytes {offset}+{len} are past its end")))?;
        if len == 0 {
            return Ok(Cow::Borrowed(&[]));
        }
        let bytes = self
            .io
            .fetch(o, offset..end)
            .wait(self.io.deadline())
            .map_err(|p| io_error(o, p))?;
        Ok(Cow::Owned(Arc::unwrap_or_clone(bytes)))
    }
}

/// A remote shard's bytes for the index pass: headers through small windows, each kept until
/// the next header falls outside it.
struct Headers {
    object: Arc<Object>,
    io: Arc<Io>,
    window: Mutex<Option<(u64, Chunk)>>,
}

impl ShardBytes for Headers {
    fn len(&self) -> u64 {
        self.object.len
    }

    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Cow<'_, [u8]>> {
        let o = &*self.object;
        let end = offset
            .checked_add(len as u64)
            .filter(|&e| e <= o.len)
            .ok_or_else(|| io_error(o, format!("bytes {offset}+{len} are past its end")))?;
        let mut window = lock(&self.window);
        if let Some((start, bytes)) = &*window
            && offset >= *start
            && end <= start + bytes.len() as u64
        {
            let from = (offset - start) as usize;
            return Ok(Cow::Owned(bytes[from..from + len].to_vec()));
        }
        let to = end.max(offset + self.io.index_window).min(o.len);
        let bytes = self
            .io
            .fetch(o, offset..to)
            .wait(self.io.deadline())
            .map_err(|p| io_error(o, p))?;
        let out = bytes.get(..len).map(<[u8]>::to_vec);
        *window = Some((offset, bytes));
        out.map(Cow::Owned)
            .ok_or_else(|| io_error(o, "a header read came back short".into()))
    }
}
