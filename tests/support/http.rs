//! A small HTTP/1.1 file server for the remote-shard tests and bench (std only): `GET` and
//! `HEAD` of the files in one folder, byte ranges (`Range: bytes=a-b`, answered `206`),
//! keep-alive, and faults set per file: a connection dropped midway once, a `404`, a `403`, a
//! `500` before the first good answer. It counts what it serves, so tests can tell how much
//! of a shard was read. Bodies go from the file to the socket by `sendfile`, one thread per
//! connection.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// What the server does wrong for one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The first `GET` of more than 1 KiB sends its headers and half its body, then closes the
    /// connection; later requests are answered whole.
    DropOnce,
    /// Every request is answered `404 Not Found`.
    NotFound,
    /// Every request is answered `403 Forbidden`.
    Forbidden,
    /// The first request is answered `500 Internal Server Error`, the next ones well.
    ErrorOnce,
}

/// One answered request: method, path, the range asked for, the status.
#[derive(Clone, Debug)]
pub struct Logged {
    /// `GET` or `HEAD`.
    pub method: String,
    /// The path asked for.
    pub path: String,
    /// The byte range asked for (`start..end`), if any.
    pub range: Option<(u64, u64)>,
    /// The status answered.
    pub status: u16,
}

#[derive(Default)]
struct State {
    faults: Mutex<HashMap<String, Fault>>,
    log: Mutex<Vec<Logged>>,
    served: AtomicU64,
    stop: AtomicBool,
}

/// A running server; stopped (and its accept thread joined) on drop.
pub struct Server {
    port: u16,
    state: Arc<State>,
    accept: Option<JoinHandle<()>>,
}

impl Server {
    /// Serves the files of `root` on an unused port of 127.0.0.1.
    pub fn start(root: &Path) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a local port");
        let port = listener.local_addr().expect("its address").port();
        let state = Arc::new(State::default());
        let root = root.to_path_buf();
        let shared = state.clone();
        let accept = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if shared.stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let (root, state) = (root.clone(), shared.clone());
                std::thread::spawn(move || serve(stream, &root, &state));
            }
        });
        Server {
            port,
            state,
            accept: Some(accept),
        }
    }

    /// `http://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Sets `fault` for the file `name` (its path under the root, without a leading `/`).
    pub fn fault(&self, name: &str, fault: Fault) {
        self.state
            .faults
            .lock()
            .unwrap()
            .insert(name.to_owned(), fault);
    }

    /// The body bytes served so far (counted as each body starts: a client holding bytes
    /// finds them counted).
    pub fn served(&self) -> u64 {
        self.state.served.load(Ordering::SeqCst)
    }

    /// The requests answered so far.
    pub fn log(&self) -> Vec<Logged> {
        self.state.log.lock().unwrap().clone()
    }

    /// Fetches the files `names` whole by plain `GET`s on `connections` keep-alive
    /// connections at once (file `i` on connection `i % connections`), reading each body into
    /// one reused buffer and discarding it: the rate any client of this server can reach.
    /// Returns the body bytes read.
    ///
    /// # Panics
    ///
    /// When a request fails or an answer is not `200` with a `Content-Length`.
    pub fn get_whole(&self, names: &[String], connections: usize) -> u64 {
        let connections = connections.clamp(1, names.len().max(1));
        std::thread::scope(|scope| {
            let threads: Vec<_> = (0..connections)
                .map(|c| {
                    scope.spawn(move || {
                        let stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
                        let _ = stream.set_nodelay(true);
                        let mut out = stream.try_clone().expect("clone the stream");
                        let mut reader = BufReader::with_capacity(256 << 10, stream);
                        let mut buf = vec![0u8; 256 << 10];
                        let mut read = 0;
                        for name in names.iter().skip(c).step_by(connections) {
                            let ask = format!("GET /{name} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
                            out.write_all(ask.as_bytes()).expect("send a request");
                            let mut len = None;
                            let mut line = String::new();
                            reader.read_line(&mut line).expect("status line");
                            assert!(line.contains(" 200 "), "{name}: {line}");
                            loop {
                                line.clear();
                                reader.read_line(&mut line).expect("a header");
                                let h = line.trim_end();
                                if h.is_empty() {
                                    break;
                                }
                                if let Some((k, v)) = h.split_once(':')
                                    && k.eq_ignore_ascii_case("content-length")
                                {
                                    len = v.trim().parse::<u64>().ok();
                                }
                            }
                            let mut left = len.expect("a Content-Length");
                            while left > 0 {
                                let n = (left as usize).min(buf.len());
                                let got = reader.read(&mut buf[..n]).expect("the body");
                                assert!(got > 0, "{name}: the body ended early");
                                left -= got as u64;
                                read += got as u64;
                            }
                        }
                        read
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).sum()
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn parse_range(value: &str, len: u64) -> Option<(u64, u64)> {
    let spec = value.trim().strip_prefix("bytes=")?;
    let (a, b) = spec.split_once('-')?;
    let start: u64 = a.trim().parse().ok()?;
    let end = match b.trim() {
        "" => len,
        b => b.parse::<u64>().ok()?.saturating_add(1).min(len),
    };
    Some((start, end))
}

fn head(stream: &mut TcpStream, status: &str, headers: &[String]) -> std::io::Result<()> {
    let mut out = format!("HTTP/1.1 {status}\r\n");
    for h in headers {
        out.push_str(h);
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    stream.write_all(out.as_bytes())
}

/// Answers the requests of one connection until it closes, stalls for 10 s or the server stops.
fn serve(stream: TcpStream, root: &Path, state: &State) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(10)));
    let _ = stream.set_nodelay(true);
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || state.stop.load(Ordering::SeqCst) {
            return;
        }
        let mut parts = line.split_whitespace();
        let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
            return;
        };
        let (method, target) = (method.to_owned(), target.to_owned());
        let mut range_header = None;
        let mut close = false;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                match k.trim().to_ascii_lowercase().as_str() {
                    "range" => range_header = Some(v.trim().to_owned()),
                    "connection" => close = v.trim().eq_ignore_ascii_case("close"),
                    _ => {}
                }
            }
        }
        match answer(
            &mut out,
            root,
            state,
            &method,
            &target,
            range_header.as_deref(),
        ) {
            Ok(true) if !close => {}
            _ => {
                let _ = out.shutdown(Shutdown::Both);
                return;
            }
        }
    }
}

/// Sends `len` bytes of `file` from `offset` to `out` by `sendfile` (the kernel moves the
/// page-cache pages); the bytes sent, fewer when the file ends first.
fn send_file(file: &std::fs::File, out: &TcpStream, offset: u64, len: u64) -> std::io::Result<u64> {
    use std::os::fd::AsRawFd;
    let mut at = offset as libc::off_t;
    let mut left = len;
    while left > 0 {
        let n = (left as usize).min(1 << 30);
        // SAFETY: both descriptors are open for the call; `at` is a valid in/out offset.
        let sent = unsafe { libc::sendfile(out.as_raw_fd(), file.as_raw_fd(), &mut at, n) };
        match sent {
            0 => break,
            n if n > 0 => left -= n as u64,
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(len - left)
}

/// Answers one request; `Ok(false)` when the connection is to be closed.
fn answer(
    out: &mut TcpStream,
    root: &Path,
    state: &State,
    method: &str,
    target: &str,
    range: Option<&str>,
) -> std::io::Result<bool> {
    let name = target
        .split('?')
        .next()
        .unwrap_or("")
        .trim_start_matches('/');
    let fault = state.faults.lock().unwrap().get(name).copied();
    let file: PathBuf = root.join(name);
    let meta = std::fs::metadata(&file).ok().filter(|m| m.is_file());
    let log = |status: u16, range: Option<(u64, u64)>| {
        state.log.lock().unwrap().push(Logged {
            method: method.to_owned(),
            path: name.to_owned(),
            range,
            status,
        });
    };
    let empty =
        |out: &mut TcpStream, status: &str| head(out, status, &["Content-Length: 0".into()]);
    match fault {
        Some(Fault::NotFound) => {
            log(404, None);
            empty(out, "404 Not Found")?;
            return Ok(true);
        }
        Some(Fault::Forbidden) => {
            log(403, None);
            empty(out, "403 Forbidden")?;
            return Ok(true);
        }
        Some(Fault::ErrorOnce) => {
            state.faults.lock().unwrap().remove(name);
            log(500, None);
            empty(out, "500 Internal Server Error")?;
            return Ok(true);
        }
        _ => {}
    }
    let Some(meta) = meta else {
        log(404, None);
        empty(out, "404 Not Found")?;
        return Ok(true);
    };
    if method != "GET" && method != "HEAD" {
        log(405, None);
        empty(out, "405 Method Not Allowed")?;
        return Ok(true);
    }
    let total = meta.len();
    let asked = range.and_then(|r| parse_range(r, total));
    let (start, end, status) = match asked {
        Some((s, e)) if s < e && s < total => (s, e, "206 Partial Content"),
        Some(_) => {
            log(416, asked);
            head(
                out,
                "416 Range Not Satisfiable",
                &[
                    format!("Content-Range: bytes */{total}"),
                    "Content-Length: 0".into(),
                ],
            )?;
            return Ok(true);
        }
        None => (0, total, "200 OK"),
    };
    let mut headers = vec![
        format!("Content-Length: {}", end - start),
        "Accept-Ranges: bytes".into(),
        "Content-Type: application/x-tar".into(),
    ];
    if asked.is_some() {
        headers.push(format!("Content-Range: bytes {start}-{}/{total}", end - 1));
    }
    log(if asked.is_some() { 206 } else { 200 }, asked);
    head(out, status, &headers)?;
    if method == "HEAD" {
        return Ok(true);
    }
    let mut stop_at = end;
    if fault == Some(Fault::DropOnce) && end - start > 1024 {
        state.faults.lock().unwrap().remove(name);
        stop_at = start + (end - start) / 2;
    }
    // File to socket by `sendfile`: no copy through this process, so the server is not what
    // limits a client's rate (`std::io::copy` from a `Take<File>` to a `TcpStream` sends
    // 8 KiB at a time through a buffer).
    // Counted before it is sent, so a client that has the bytes finds them counted.
    let want = stop_at - start;
    state.served.fetch_add(want, Ordering::SeqCst);
    let f = std::fs::File::open(&file)?;
    let sent = send_file(&f, out, start, want).inspect_err(|_| {
        state.served.fetch_sub(want, Ordering::SeqCst);
    })?;
    if sent != want {
        state.served.fetch_sub(want - sent, Ordering::SeqCst);
        return Ok(false);
    }
    Ok(stop_at == end)
}
