//! Shards in object storage and on web servers (feature `remote`): S3 and S3-compatible
//! stores (`s3://bucket/key`) and plain HTTP(S) (`https://host/path`), read through
//! `object_store` on a small tokio runtime that the source owns; see [`Remote`].

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::http::HttpBuilder;
use object_store::path::Path as StorePath;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, RetryConfig,
};
use url::Url;

use super::{Shard, ShardBytes, TarShards, list};
use crate::error::{Error, Result};

/// Opens tar shards in object storage or on web servers (S3 and S3-compatible stores, plain
/// HTTP(S)) through object_store, on a small tokio runtime (two threads by default) that the
/// opened source owns and joins when its last clone is dropped: settings for the reads, then
/// [`open`](Remote::open).
///
/// - **Open**: brace ranges expand as for local paths; globs (`*`, `?` within one path
///   component) only for `s3://`, whose keys can be listed (a web server gives no listing).
///   Every shard's size comes from one `HEAD`; a missing shard (404) or a refused one
///   (401/403) is an [`Error::Tar`] naming its URL, before any sample is read.
/// - **Index pass**: member headers only, each through a ranged `GET` of a small window
///   ([`Remote::index_window`], 4 KiB): the headers of a sample's small members (`.cls`,
///   `.json`) and of the next sample's first member share one window, so the pass costs about
///   one request and 4 KiB per sample whose members are larger than the window (about 12% of
///   shards of 33 KiB JPEGs), and reads shards of small members through once.
/// - **Reads**: ranged `GET`s of [`Remote::chunk_size`] chunks (4 MiB), kept in a cache of
///   [`Remote::cache_bytes`] shared by the source. Each shard read in an epoch is a stream:
///   its first read (with the chunks before it, near the shard's start), and every read
///   within the read-ahead of the furthest chunk asked for (with the chunks between), fetches
///   the chunks it lacks and the [`Remote::read_ahead`] chunks after it (2), so the
///   workers reading a shard have a bounded number of chunks in flight ahead of them while
///   they decode. A read further behind whose chunk has left the cache (a sample the shuffle
///   buffer held longer than the cache holds its span) is one ranged `GET` of its own bytes.
///   Whole shards are never downloaded first; each epoch's plan restarts the streams.
/// - **Retries**: object_store's retries (backoff, 5xx, dropped bodies), and ours around them:
///   a request or body that fails or stalls past [`Remote::timeout`] is asked for again from
///   the first byte not yet received, up to [`Remote::retries`] times. Permanent errors (404,
///   403, a shard changed while read) are not retried.
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

    /// The bytes one ranged `GET` asks for while streaming (at least 64 KiB).
    pub fn chunk_size(mut self, bytes: usize) -> Remote {
        self.chunk = bytes.max(64 << 10);
        self
    }

    /// How many chunks after the one being read are fetched ahead of it.
    pub fn read_ahead(mut self, chunks: usize) -> Remote {
        self.read_ahead = chunks;
        self
    }

    /// The most bytes of chunks held for the whole source (at least a chunk per read and its
    /// read-ahead; chunks being fetched are not dropped to keep it). A shuffle buffer reads
    /// samples up to about its size behind the stream: a cache that holds that span keeps
    /// them streamed.
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

    /// The runtime's threads (at least 1): they only wait on the network.
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
        let mut index_readers: Vec<Arc<dyn ShardBytes>> = Vec::with_capacity(located.len());
        for (id, ((name, store, path), len)) in located.into_iter().zip(sizes).enumerate() {
            let object = Arc::new(Object {
                id,
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
                    object,
                    io: io.clone(),
                }),
            });
        }
        // Index reads wait on the network, not the CPU: more threads than cores.
        let threads = shards.len().clamp(1, 32);
        // Each epoch's plan starts the shards' streams anew: its first read of a shard is the
        // start of a stream, not a sample left behind by the last epoch's.
        let restart = io.clone();
        let on_plan = Box::new(move || lock(&restart.cache).fronts.clear());
        TarShards::build(shards, Some(index_readers), threads, Some(on_plan))
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

/// One object: where it is and how long.
struct Object {
    id: usize,
    url: String,
    store: Arc<dyn ObjectStore>,
    path: StorePath,
    len: u64,
}

/// What a fetch leaves: the bytes, or why there are none.
type Fetched = std::result::Result<Chunk, String>;

/// A fetched range's bytes (shared by the cache and the readers).
type Chunk = Arc<Vec<u8>>;

/// A fetch's result, waited for by reader threads.
struct Slot {
    state: Mutex<Option<Fetched>>,
    done: Condvar,
}

impl Slot {
    fn new() -> Arc<Slot> {
        Arc::new(Slot {
            state: Mutex::new(None),
            done: Condvar::new(),
        })
    }

    fn fill(&self, result: Fetched) {
        let mut state = lock(&self.state);
        if state.is_none() {
            *state = Some(result);
        }
        self.done.notify_all();
    }

    /// The result, or an error once `deadline` passes (a fetch never hangs a worker).
    fn wait(&self, deadline: Instant) -> Fetched {
        let mut state = lock(&self.state);
        loop {
            if let Some(result) = &*state {
                return result.clone();
            }
            let now = Instant::now();
            if now >= deadline {
                return Err("no answer in time (after every retry); check the network".into());
            }
            state = match self.done.wait_timeout(state, deadline - now) {
                Ok((s, _)) => s,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}

/// Fills its slot with an error if the fetch ends without a result (its task cancelled at
/// shutdown): waiters never wait for a fetch that will not come.
struct Filler(Arc<Slot>);

impl Drop for Filler {
    fn drop(&mut self) {
        self.0
            .fill(Err("the read was cancelled: the source is closing".into()));
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The runtime and the chunk cache of one opened source.
struct Io {
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
    cache: Mutex<Cache>,
    chunk: u64,
    read_ahead: u64,
    index_window: u64,
    retries: usize,
    timeout: Duration,
}

#[derive(Default)]
struct Cache {
    /// (shard, chunk) → its fetch and when it was last used.
    chunks: HashMap<(usize, u64), (Arc<Slot>, u64)>,
    /// The furthest chunk each shard's stream has asked for.
    fronts: HashMap<usize, u64>,
    tick: u64,
    capacity: usize,
}

impl Cache {
    /// Drops the least recently used fetched chunks while over capacity.
    fn trim(&mut self) {
        while self.chunks.len() > self.capacity {
            let oldest = self
                .chunks
                .iter()
                .filter(|(_, (slot, _))| lock(&slot.state).is_some())
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| *k);
            match oldest {
                Some(k) => {
                    self.chunks.remove(&k);
                }
                None => return,
            }
        }
    }
}

impl Io {
    fn start(settings: &Remote) -> Result<Arc<Io>> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(settings.threads)
            .thread_name("pinnable-remote")
            .enable_all()
            .build()
            .map_err(|e| url_error("(remote)", format!("cannot start its runtime: {e}")))?;
        let chunk = settings.chunk as u64;
        let ahead = settings.read_ahead as u64;
        Ok(Arc::new(Io {
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
            cache: Mutex::new(Cache {
                capacity: (settings.cache / settings.chunk).max(settings.read_ahead + 2),
                ..Cache::default()
            }),
            chunk,
            read_ahead: ahead,
            index_window: settings.index_window as u64,
            retries: settings.retries,
            timeout: settings.timeout,
        }))
    }

    /// How long a reader waits for a fetch at most: every attempt timing out, and backoffs.
    fn deadline(&self) -> Instant {
        let attempts = self.retries as u32 + 1;
        Instant::now() + self.timeout * attempts * 2 + Duration::from_secs(10)
    }

    /// Starts fetching `range` of `object` into a new slot.
    fn fetch(&self, object: &Object, range: Range<u64>) -> Arc<Slot> {
        let slot = Slot::new();
        let filler = Filler(slot.clone());
        let store = object.store.clone();
        let path = object.path.clone();
        let (retries, timeout) = (self.retries, self.timeout);
        self.handle.spawn(async move {
            let result = fetch(&*store, &path, range, retries, timeout).await;
            filler.0.fill(result);
        });
        slot
    }

    /// Runs `future` on the runtime and waits for it from this (non-runtime) thread.
    fn run<T: Send + 'static>(
        &self,
        future: impl Future<Output = T> + Send + 'static,
    ) -> std::result::Result<T, String> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.handle.spawn(async move {
            let _ = tx.send(future.await);
        });
        let wait = self.deadline() - Instant::now();
        rx.recv_timeout(wait)
            .map_err(|_| "no answer in time (after every retry); check the network".into())
    }

    /// Every shard's size, by `HEAD` requests made together.
    fn sizes(&self, located: &[(String, Arc<dyn ObjectStore>, StorePath)]) -> Result<Vec<u64>> {
        let asks: Vec<_> = located
            .iter()
            .map(|(_, store, path)| {
                let (store, path) = (store.clone(), path.clone());
                let timeout = self.timeout * (self.retries as u32 + 1);
                self.handle.spawn(async move {
                    match tokio::time::timeout(timeout, store.head(&path)).await {
                        Ok(Ok(meta)) => Ok(meta.size),
                        Ok(Err(e)) => Err(describe(&e)),
                        Err(_) => Err("no answer in time; check the network".into()),
                    }
                })
            })
            .collect();
        let all = self.run(async move {
            let mut out = Vec::with_capacity(asks.len());
            for ask in asks {
                out.push(match ask.await {
                    Ok(r) => r,
                    Err(e) => Err(format!("the request failed: {e}")),
                });
            }
            out
        });
        let all = all.map_err(|p| url_error(&located[0].0, p))?;
        all.into_iter()
            .zip(located)
            .map(|(r, (name, _, _))| r.map_err(|p| url_error(name, format!("cannot open it: {p}"))))
            .collect()
    }

    /// The objects a glob in `url`'s path names, sorted by key (`*` and `?` match within one
    /// path component).
    fn glob(
        &self,
        store: &Arc<dyn ObjectStore>,
        url: &Url,
        base: &str,
        name: &str,
    ) -> Result<Vec<(String, StorePath)>> {
        if !url.scheme().starts_with("s3") {
            return Err(url_error(
                name,
                "a glob needs a listing, which a web server does not give: name the shards with \
                 a brace range such as x-{0..3}.tar",
            ));
        }
        let key = url.path().trim_start_matches('/');
        let key = percent_decode(key);
        let wild = key.find(['*', '?']).unwrap_or(key.len());
        let prefix = &key[..key[..wild].rfind('/').map_or(0, |i| i + 1)];
        let prefix = (!prefix.is_empty()).then(|| StorePath::from(prefix.trim_end_matches('/')));
        let store = store.clone();
        let listed = self
            .run(async move {
                let mut found = Vec::new();
                let mut list = store.list(prefix.as_ref());
                while let Some(meta) = list.next().await {
                    found.push(meta.map_err(|e| describe(&e))?.location);
                }
                Ok::<_, String>(found)
            })
            .and_then(|r| r)
            .map_err(|p| url_error(name, format!("cannot list the bucket: {p}")))?;
        let parts: Vec<Vec<char>> = key.split('/').map(|c| c.chars().collect()).collect();
        let mut found: Vec<(String, StorePath)> = listed
            .into_iter()
            .filter(|p| {
                let names: Vec<&str> = p.as_ref().split('/').collect();
                names.len() == parts.len()
                    && parts
                        .iter()
                        .zip(&names)
                        .all(|(g, n)| list::glob_match(g, &n.chars().collect::<Vec<_>>()))
            })
            .map(|p| (format!("{base}/{p}"), p))
            .collect();
        found.sort_by(|a, b| a.1.as_ref().cmp(b.1.as_ref()));
        if found.is_empty() {
            return Err(url_error(name, "the glob matches no object"));
        }
        Ok(found)
    }
}

impl Drop for Io {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            // Joined here, unless dropped inside another runtime, where blocking is not
            // allowed: its threads then end on their own once their fetches are cancelled.
            if tokio::runtime::Handle::try_current().is_ok() {
                runtime.shutdown_background();
            } else {
                runtime.shutdown_timeout(Duration::from_secs(5));
            }
        }
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(v) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What an object_store error means for the user.
fn describe(e: &object_store::Error) -> String {
    match e {
        object_store::Error::NotFound { .. } => {
            "not found (HTTP 404): check the URL and that the shard was uploaded".into()
        }
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => {
            format!(
                "access refused (HTTP 401/403): check the credentials and the bucket's policy ({e})"
            )
        }
        object_store::Error::Precondition { .. } => {
            "the object changed while it was read: reopen the shards".into()
        }
        _ => e.to_string(),
    }
}

fn permanent(e: &object_store::Error) -> bool {
    matches!(
        e,
        object_store::Error::NotFound { .. }
            | object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. }
            | object_store::Error::Precondition { .. }
            | object_store::Error::NotSupported { .. }
    )
}

/// `range` of the object, retried from the first byte not yet received when a request fails
/// or a body stops (drops or stalls past `timeout`).
async fn fetch(
    store: &dyn ObjectStore,
    path: &StorePath,
    range: Range<u64>,
    retries: usize,
    timeout: Duration,
) -> Fetched {
    let want = usize::try_from(range.end - range.start).map_err(|_| "too long".to_owned())?;
    let mut got = Vec::with_capacity(want);
    let mut attempt = 0;
    loop {
        let start = range.start + got.len() as u64;
        let options = GetOptions {
            range: Some(GetRange::Bounded(start..range.end)),
            ..GetOptions::default()
        };
        let failure = match tokio::time::timeout(timeout, store.get_opts(path, options)).await {
            Err(_) => format!("no response within {timeout:?}"),
            Ok(Err(e)) if permanent(&e) => return Err(describe(&e)),
            Ok(Err(e)) => describe(&e),
            Ok(Ok(result)) => {
                let mut body = result.into_stream();
                loop {
                    match tokio::time::timeout(timeout, body.next()).await {
                        Err(_) => break format!("the body stalled for {timeout:?}"),
                        Ok(None) if got.len() == want => return Ok(Arc::new(got)),
                        Ok(None) => {
                            break format!("the body ended after {} of {want} bytes", got.len());
                        }
                        Ok(Some(Err(e))) if permanent(&e) => return Err(describe(&e)),
                        Ok(Some(Err(e))) => break describe(&e),
                        Ok(Some(Ok(bytes))) => {
                            if got.len() + bytes.len() > want {
                                return Err(format!(
                                    "the server sent more than the {want} bytes asked for from \
                                     byte {}: does it honour Range requests?",
                                    range.start
                                ));
                            }
                            got.extend_from_slice(&bytes);
                        }
                    }
                }
            }
        };
        if attempt >= retries {
            return Err(format!(
                "bytes {}..{} failed after {} attempts: {failure}",
                range.start,
                range.end,
                attempt + 1
            ));
        }
        attempt += 1;
        let backoff = Duration::from_millis(50 << attempt.min(6)).min(Duration::from_secs(2));
        tokio::time::sleep(backoff).await;
    }
}

fn io_error(object: &Object, problem: String) -> std::io::Error {
    std::io::Error::other(format!("{}: {problem}", object.url))
}

/// A remote shard's bytes for the workers: chunks streamed ahead through the cache.
struct RemoteShard {
    object: Arc<Object>,
    io: Arc<Io>,
}

impl ShardBytes for RemoteShard {
    fn len(&self) -> u64 {
        self.object.len
    }

    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Cow<'_, [u8]>> {
        let o = &*self.object;
        let end = offset
            .checked_add(len as u64)
            .filter(|&e| e <= o.len)
            .ok_or_else(|| io_error(o, format!("bytes {offset}+{len} are past its end")))?;
        if len == 0 {
            return Ok(Cow::Borrowed(&[]));
        }
        let io = &*self.io;
        let (first, last) = (offset / io.chunk, (end - 1) / io.chunk);
        let chunks = o.len.div_ceil(io.chunk);
        let needed = {
            let mut cache = lock(&io.cache);
            cache.tick += 1;
            let tick = cache.tick;
            let present = (first..=last).all(|c| cache.chunks.contains_key(&(o.id, c)));
            let front = cache.fronts.get(&o.id).copied();
            // A read streams (fetches what it lacks and the chunks ahead of it) when it is
            // the first of its shard this epoch or within the read-ahead of the shard's
            // front. A miss further behind the front is a sample the shuffle buffer held
            // after its chunk left the cache: its own bytes only, no chunk.
            let streams = front.is_none_or(|f| last + io.read_ahead > f);
            if !present && !streams {
                None
            } else {
                let ahead_to = if streams {
                    (last + io.read_ahead).min(chunks - 1)
                } else {
                    last
                };
                if streams {
                    let f = cache.fronts.entry(o.id).or_insert(ahead_to);
                    *f = (*f).max(ahead_to);
                }
                // A stream read past its front (a worker on a later batch, a shuffled sample
                // from the newest part of the buffer) also asks for the chunks between, and a
                // shard's first read near its start for the chunks before it: the reads of the
                // samples there will want them. Not across more than a few read-aheads (a
                // rank's run starting further on).
                let near = 4 * io.read_ahead.max(1);
                let from = match front {
                    Some(f) if streams && f < first && first - f <= near => f + 1,
                    None if first <= near => 0,
                    _ => first,
                };
                let mut slots = Vec::with_capacity((last - first + 1) as usize);
                for c in from..=ahead_to {
                    let slot = match cache.chunks.get_mut(&(o.id, c)) {
                        Some((slot, used)) => {
                            *used = tick;
                            slot.clone()
                        }
                        None => {
                            let range = c * io.chunk..((c + 1) * io.chunk).min(o.len);
                            let slot = io.fetch(o, range);
                            cache.chunks.insert((o.id, c), (slot.clone(), tick));
                            slot
                        }
                    };
                    if (first..=last).contains(&c) {
                        slots.push((c, slot));
                    }
                }
                cache.trim();
                Some(slots)
            }
        };
        let deadline = io.deadline();
        let Some(slots) = needed else {
            let bytes = io.fetch(o, offset..end).wait(deadline);
            return bytes
                .map(|b| Cow::Owned(b.to_vec()))
                .map_err(|p| io_error(o, p));
        };
        let mut out = Vec::with_capacity(len);
        for (c, slot) in slots {
            let bytes = match slot.wait(deadline) {
                Ok(b) => b,
                Err(p) => {
                    // Not kept: the next read of this chunk asks again.
                    lock(&io.cache).chunks.remove(&(o.id, c));
                    return Err(io_error(o, p));
                }
            };
            let base = c * io.chunk;
            let from = (offset.max(base) - base) as usize;
            let to = (end.min(base + bytes.len() as u64) - base) as usize;
            out.extend_from_slice(bytes.get(from..to).unwrap_or(&[]));
        }
        if out.len() != len {
            return Err(io_error(o, "a chunk came back short".into()));
        }
        Ok(Cow::Owned(out))
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
