//! An S3-compatible server for the remote tests: moto's, started as `python3 -m moto.server`
//! on an unused port, when it is installed.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// An S3-compatible server (moto's), stopped on drop.
pub struct Moto {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Moto {
    /// Creates the bucket `bucket` and puts each `(key, bytes)` in it.
    ///
    /// # Panics
    ///
    /// If a request fails or is refused.
    pub fn put(&mut self, bucket: &str, objects: &[(String, Vec<u8>)]) {
        let status = self
            .request("PUT", &format!("/{bucket}"), &[])
            .expect("create the bucket");
        assert!(
            status == 200 || status == 409,
            "creating the bucket: {status}"
        );
        for (key, bytes) in objects {
            let status = self
                .request("PUT", &format!("/{bucket}/{key}"), bytes)
                .expect("put an object");
            assert_eq!(status, 200, "putting {key}");
        }
    }

    /// Storage settings for this server: its endpoint, plain HTTP, test credentials.
    pub fn storage(&self) -> pinnable::storage::Storage {
        pinnable::storage::Storage::new()
            .option("aws_endpoint", format!("http://127.0.0.1:{}", self.port))
            .option("aws_allow_http", "true")
            .option("aws_access_key_id", "test")
            .option("aws_secret_access_key", "test")
            .option("aws_region", "us-east-1")
    }

    /// As [`start`](Self::start); when the server cannot start, prints `skipped: <reason>`
    /// for `test` and gives `None`.
    pub fn start_or_skip(test: &str) -> Option<Moto> {
        match Moto::start() {
            Ok(m) => Some(m),
            Err(reason) => {
                println!("skipped: {test}: no S3-compatible server: {reason}");
                None
            }
        }
    }

    /// Starts `python3 -m moto.server` on an unused port and waits (20 s at most) until it
    /// answers; the reason when it cannot.
    pub fn start() -> std::result::Result<Moto, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let child = Command::new("python3")
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run python3: {e}"))?;
        let mut moto = Moto { child, port };
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            if let Ok(Some(status)) = moto.child.try_wait() {
                return Err(format!(
                    "python3 -m moto.server exited ({status}); install it with \
                     `pip install 'moto[server]'`"
                ));
            }
            if moto.request("GET", "/", &[]).is_ok() {
                return Ok(moto);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err("moto's server did not answer within 20 s".into())
    }

    /// One unsigned request (moto does not check signatures); its status.
    pub fn request(&mut self, method: &str, path: &str, body: &[u8]) -> std::io::Result<u16> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n",
            self.port,
            body.len()
        )?;
        s.write_all(body)?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer)?;
        let text = String::from_utf8_lossy(&answer);
        text.split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("no status in {text:?}")))
    }
}
