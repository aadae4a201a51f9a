//! The remote source's reads: objects, fetches on the runtime with retries, and the slots
//! readers wait on.

use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use object_store::path::Path as StorePath;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};
use url::Url;

use super::url_error;
use crate::error::Result;
use crate::storage::{Storage, glob_match};

/// One object: where it is and how long.
pub(crate) struct Object {
    pub(crate) url: String,
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) path: StorePath,
    pub(crate) len: u64,
}

/// What a fetch leaves: the bytes, or why there are none.
pub(crate) type Fetched = std::result::Result<Chunk, String>;

/// A fetched range's bytes (shared by the cache and the readers).
pub(crate) type Chunk = Arc<Vec<u8>>;

/// A fetch's result, waited for by reader threads.
pub(crate) struct Slot {
    pub(crate) state: Mutex<Option<Fetched>>,
    pub(crate) done: Condvar,
}

impl Slot {
    pub(crate) fn new() -> Arc<Slot> {
        Arc::new(Slot {
            state: Mutex::new(None),
            done: Condvar::new(),
        })
    }

    pub(crate) fn fill(&self, result: Fetched) {
        let mut state = lock(&self.state);
        if state.is_none() {
            *state = Some(result);
        }
        self.done.notify_all();
    }

    /// The result, or an error once `deadline` passes (a fetch never hangs a worker).
    pub(crate) fn wait(&self, deadline: Instant) -> Fetched {
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
pub(crate) struct Filler(pub(crate) Arc<Slot>);

impl Drop for Filler {
    fn drop(&mut self) {
        self.0
            .fill(Err("the read was cancelled: the source is closing".into()));
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The runtime of one opened source, and its settings for requests.
pub(crate) struct Io {
    pub(crate) runtime: Option<tokio::runtime::Runtime>,
    pub(crate) handle: tokio::runtime::Handle,
    pub(crate) index_window: u64,
    pub(crate) chunk: u64,
    pub(crate) read_ahead: usize,
    pub(crate) retries: usize,
    pub(crate) timeout: Duration,
}

impl Io {
    pub(crate) fn start(settings: &Storage) -> Result<Arc<Io>> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(settings.runtime_threads())
            .thread_name("pinnable-remote")
            .enable_all()
            .build()
            .map_err(|e| url_error("(remote)", format!("cannot start its runtime: {e}")))?;
        Ok(Arc::new(Io {
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
            index_window: settings.index_window as u64,
            chunk: settings.chunk as u64,
            read_ahead: settings.ahead().0,
            retries: settings.retries,
            timeout: settings.timeout,
        }))
    }

    /// How long a reader waits for a fetch at most: every attempt timing out, and backoffs.
    pub(crate) fn deadline(&self) -> Instant {
        let attempts = self.retries as u32 + 1;
        Instant::now() + self.timeout * attempts * 2 + Duration::from_secs(10)
    }

    /// Starts fetching `range` of `object` into a new slot.
    pub(crate) fn fetch(&self, object: &Object, range: Range<u64>) -> Arc<Slot> {
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
    pub(crate) fn run<T: Send + 'static>(
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
    pub(crate) fn sizes(
        &self,
        located: &[(String, Arc<dyn ObjectStore>, StorePath)],
    ) -> Result<Vec<u64>> {
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
    pub(crate) fn glob(
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
                        .all(|(g, n)| glob_match(g, &n.chars().collect::<Vec<_>>()))
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

impl Io {
    /// The objects under the folder `url` names (an `s3://` prefix; every depth), with their
    /// sizes, sorted by key.
    pub(crate) fn list(
        &self,
        store: &Arc<dyn ObjectStore>,
        url: &Url,
        base: &str,
        name: &str,
    ) -> Result<Vec<(String, u64)>> {
        if !url.scheme().starts_with("s3") {
            return Err(url_error(
                name,
                "a web server gives no listing: name its files one by one (for images, \
                 `ImageFolder::from_list_with` takes URLs with labels)",
            ));
        }
        let key = percent_decode(url.path().trim_start_matches('/'));
        let key = key.trim_end_matches('/');
        let prefix = (!key.is_empty()).then(|| StorePath::from(key));
        let store = store.clone();
        let mut found = self
            .run(async move {
                let mut found = Vec::new();
                let mut list = store.list(prefix.as_ref());
                while let Some(meta) = list.next().await {
                    let meta = meta.map_err(|e| describe(&e))?;
                    found.push((meta.location, meta.size));
                }
                Ok::<_, String>(found)
            })
            .and_then(|r| r)
            .map_err(|p| url_error(name, format!("cannot list the bucket: {p}")))?;
        found.sort_by(|a, b| a.0.as_ref().cmp(b.0.as_ref()));
        Ok(found
            .into_iter()
            .map(|(p, size)| (format!("{base}/{p}"), size))
            .collect())
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

pub(crate) fn percent_decode(s: &str) -> String {
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
pub(crate) fn describe(e: &object_store::Error) -> String {
    match e {
        object_store::Error::NotFound { .. } => {
            "not found (HTTP 404): check the URL and that the object was uploaded".into()
        }
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => {
            format!(
                "access refused (HTTP 401/403): check the credentials and the bucket's policy ({e})"
            )
        }
        object_store::Error::Precondition { .. } => {
            "the object changed while it was read: open it again".into()
        }
        _ => e.to_string(),
    }
}

pub(crate) fn permanent(e: &object_store::Error) -> bool {
    matches!(
        e,
        object_store::Error::NotFound { .. }
            | object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. }
            | object_store::Error::Precondition { .. }
            | object_store::Error::NotSupported { .. }
    )
}

/// `range` of the object in one buffer, retried as [`fetch_into`] retries.
pub(crate) async fn fetch(
    store: &dyn ObjectStore,
    path: &StorePath,
    range: Range<u64>,
    retries: usize,
    timeout: Duration,
) -> Fetched {
    let want = usize::try_from(range.end - range.start).map_err(|_| "too long".to_owned())?;
    let mut got = Vec::with_capacity(want);
    fetch_into(store, path, range, retries, timeout, |b| {
        got.extend_from_slice(&b)
    })
    .await?;
    Ok(Arc::new(got))
}

/// `range` of the object, each piece of the body handed to `sink` in order as it arrives
/// (every byte once); retried from the first byte not yet received when a request fails or a
/// body stops (drops or stalls past `timeout`). An empty range asks for nothing: stores refuse
/// a ranged `GET` of no bytes.
pub(crate) async fn fetch_into(
    store: &dyn ObjectStore,
    path: &StorePath,
    range: Range<u64>,
    retries: usize,
    timeout: Duration,
    mut sink: impl FnMut(bytes::Bytes) + Send,
) -> std::result::Result<(), String> {
    let want = range.end - range.start;
    if want == 0 {
        return Ok(());
    }
    let mut got = 0u64;
    let mut attempt = 0;
    loop {
        let start = range.start + got;
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
                        Ok(None) if got == want => return Ok(()),
                        Ok(None) => {
                            break format!("the body ended after {got} of {want} bytes");
                        }
                        Ok(Some(Err(e))) if permanent(&e) => return Err(describe(&e)),
                        Ok(Some(Err(e))) => break describe(&e),
                        Ok(Some(Ok(bytes))) => {
                            if got + bytes.len() as u64 > want {
                                return Err(format!(
                                    "the server sent more than the {want} bytes asked for from \
                                     byte {}: does it honour Range requests?",
                                    range.start
                                ));
                            }
                            got += bytes.len() as u64;
                            sink(bytes);
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

pub(crate) fn io_error(object: &Object, problem: String) -> std::io::Error {
    std::io::Error::other(format!("{}: {problem}", object.url))
}
