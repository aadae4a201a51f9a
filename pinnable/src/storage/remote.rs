//! Objects in S3 and S3-compatible stores (`s3://bucket/key`) and on web servers
//! (`http(s)://host/path`), read through `object_store` on a small tokio runtime that the
//! opened sources share (feature `remote`).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::http::HttpBuilder;
use object_store::path::Path as StorePath;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};
use url::Url;

use super::{ByteSource, Storage, storage_error};
use crate::error::{Error, Result};

mod io;
mod split;
mod stream;
use io::*;
pub(crate) use io::{Io, Object};
pub(crate) use stream::{Planned, Streamer, Streams};

/// An object found: its URL, its store and its path there.
pub(crate) type Located = (String, Arc<dyn ObjectStore>, StorePath);

/// The runtime and the stores (one per bucket or server) of the objects opened with one set
/// of settings.
pub(crate) struct Remote {
    pub(crate) io: Arc<Io>,
    storage: Storage,
    stores: Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
}

impl Remote {
    pub(crate) fn start(storage: &Storage) -> Result<Arc<Remote>> {
        Ok(Arc::new(Remote {
            io: Io::start(storage)?,
            storage: storage.clone(),
            stores: Mutex::new(HashMap::new()),
        }))
    }

    /// The objects `name` names (one, or for an `s3://` glob those it matches, sorted by key),
    /// without their sizes.
    pub(crate) fn locate(&self, name: &str) -> Result<Vec<Located>> {
        let (url, base) = parse(name)?;
        let store = self.store_for(&url, &base, name)?;
        if url.path().contains(['*', '?']) {
            return Ok(self
                .io
                .glob(&store, &url, &base, name)?
                .into_iter()
                .map(|(full, path)| (full, store.clone(), path))
                .collect());
        }
        let path = StorePath::from_url_path(url.path())
            .map_err(|e| url_error(name, format!("bad object path: {e}")))?;
        Ok(vec![(name.to_owned(), store, path)])
    }

    /// The objects located, with their sizes (`HEAD` requests made together).
    pub(crate) fn objects(&self, located: Vec<Located>) -> Result<Vec<Arc<Object>>> {
        if located.is_empty() {
            return Ok(Vec::new());
        }
        let sizes = self.io.sizes(&located)?;
        Ok(located
            .into_iter()
            .zip(sizes)
            .map(|((url, store, path), len)| {
                Arc::new(Object {
                    url,
                    store,
                    path,
                    len,
                })
            })
            .collect())
    }

    /// The object at `name` (no glob), read with ranged `GET`s.
    pub(crate) fn open(self: &Arc<Self>, name: &str) -> Result<Arc<dyn ByteSource>> {
        if name.contains(['*', '?']) {
            return Err(url_error(name, "a glob names many objects; name one"));
        }
        let object = self.objects(self.locate(name)?)?.remove(0);
        Ok(Arc::new(RemoteBytes {
            object,
            io: self.io.clone(),
        }))
    }

    /// The objects under the folder `name` (an `s3://` prefix), with their sizes, sorted by
    /// key.
    pub(crate) fn list(&self, name: &str) -> Result<Vec<(String, u64)>> {
        let (url, base) = parse(name)?;
        let store = self.store_for(&url, &base, name)?;
        self.io.list(&store, &url, &base, name)
    }

    fn store_for(&self, url: &Url, base: &str, name: &str) -> Result<Arc<dyn ObjectStore>> {
        let mut stores = lock(&self.stores);
        if let Some(s) = stores.get(base) {
            return Ok(s.clone());
        }
        let s = store(&self.storage, url, name)?;
        stores.insert(base.to_owned(), s.clone());
        Ok(s)
    }
}

fn store(settings: &Storage, url: &Url, name: &str) -> Result<Arc<dyn ObjectStore>> {
    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
            base: 2.0,
        },
        max_retries: settings.retries,
        retry_timeout: settings.timeout * (settings.retries as u32 + 1),
    };
    let client = ClientOptions::new()
        .with_timeout(settings.timeout)
        .with_connect_timeout(settings.timeout.min(Duration::from_secs(10)));
    let built = match url.scheme() {
        "s3" | "s3a" => {
            let mut b = AmazonS3Builder::from_env()
                .with_url(url.as_str())
                .with_retry(retry)
                .with_client_options(client);
            for (key, value) in &settings.options {
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

fn url_error(name: &str, problem: impl Into<String>) -> Error {
    storage_error(name, problem)
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
            format!("not a URL ({e}); a remote location is s3://bucket/key or http(s)://host/path"),
        )
    })?;
    let base = format!("{}://{}", url.scheme(), authority(&url));
    Ok((url, base))
}

/// Where a read of `len` bytes from `offset` of `o` ends, or an error naming the object when
/// it would run past the object's end.
fn range_end(o: &Object, offset: u64, len: usize) -> std::io::Result<u64> {
    offset
        .checked_add(len as u64)
        .filter(|&e| e <= o.len)
        .ok_or_else(|| io_error(o, format!("bytes {offset}+{len} are past its end")))
}

/// An object's bytes, read by ranged `GET`s.
pub(crate) struct RemoteBytes {
    pub(crate) object: Arc<Object>,
    pub(crate) io: Arc<Io>,
}

impl ByteSource for RemoteBytes {
    fn len(&self) -> u64 {
        self.object.len
    }

    /// One ranged `GET` of the bytes asked for (tar samples read through the loader come
    /// from the streams instead, held whole).
    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Cow<'_, [u8]>> {
        let o = &*self.object;
        let end = range_end(o, offset, len)?;
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

    /// Long reads in ranged `GET`s of [`Storage::chunk_size`] bytes, with
    /// [`Storage::read_ahead`] more in flight than the one being copied out.
    fn read_into(&self, offset: u64, dst: &mut [u8]) -> std::io::Result<()> {
        let o = &*self.object;
        let end = range_end(o, offset, dst.len())?;
        let chunk = self.io.chunk.max(1);
        let starts: Vec<u64> = (offset..end).step_by(chunk as usize).collect();
        let mut flight = std::collections::VecDeque::new();
        let mut next = 0;
        let mut at = 0;
        while at < starts.len() {
            while next < starts.len() && flight.len() <= self.io.read_ahead {
                let from = starts[next];
                flight.push_back(self.io.fetch(o, from..(from + chunk).min(end)));
                next += 1;
            }
            let slot = flight.pop_front().expect("a fetch in flight");
            let bytes = slot.wait(self.io.deadline()).map_err(|p| io_error(o, p))?;
            let from = (starts[at] - offset) as usize;
            dst.get_mut(from..from + bytes.len())
                .ok_or_else(|| io_error(o, "a read came back long".into()))?
                .copy_from_slice(&bytes);
            at += 1;
        }
        Ok(())
    }
}

/// An object's bytes for reads of small headers, one after another (a tar index pass):
/// through windows of [`Storage::index_window`] bytes, each kept until the next read falls
/// outside it.
pub(crate) struct Headers {
    pub(crate) object: Arc<Object>,
    pub(crate) io: Arc<Io>,
    pub(crate) window: Mutex<Option<(u64, Chunk)>>,
}

impl ByteSource for Headers {
    fn len(&self) -> u64 {
        self.object.len
    }

    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Cow<'_, [u8]>> {
        let o = &*self.object;
        let end = range_end(o, offset, len)?;
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
