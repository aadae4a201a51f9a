"""URLs are read as paths are: token shards and .npy files from a local HTTP server that
answers byte ranges, as object stores and web servers do."""

import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

import pinnable
from _support import write_tokens


class RangeHandler(BaseHTTPRequestHandler):
    """GET and HEAD of the files in `self.server.root`, with `Range: bytes=a-b` (206)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _file(self):
        path = self.server.root / self.path.lstrip("/")
        return path.read_bytes() if path.is_file() else None

    def _answer(self, body):
        data = self._file()
        if data is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start, end, status = 0, len(data), 200
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if m:
            start = int(m.group(1))
            end = min(int(m.group(2)) + 1 if m.group(2) else len(data), len(data))
            status = 206
        self.send_response(status)
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if body:
            self.wfile.write(data[start:end])
        self.server.requests += 1

    def do_GET(self):
        self._answer(True)

    def do_HEAD(self):
        self._answer(False)


@pytest.fixture
def server(tmp_path):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), RangeHandler)
    srv.root = tmp_path
    srv.requests = 0
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    thread.join()
    srv.server_close()


def batches(source, **settings):
    with pinnable.Loader(source, output="numpy", device="cpu", **settings) as ld:
        return [{k: np.array(v) for k, v in b.items()} for b in ld]


def test_token_windows_from_a_url_equal_the_same_file_by_path(rng, seed, tmp_path, server):
    srv, url = server
    context = int(rng.integers(16, 65))
    write_tokens(tmp_path / "train.bin", rng, int(rng.integers(3000, 9000)))
    settings = dict(batch_size=int(rng.integers(2, 9)), shuffle=True, seed=int(rng.integers(0, 2**63)))
    local = batches(pinnable.TokenWindows(tmp_path / "train.bin", context), **settings)
    remote = batches(pinnable.TokenWindows(f"{url}/train.bin", context), **settings)
    assert srv.requests > 0, "the URL was not read over HTTP"
    assert len(remote) == len(local) > 0, f"seed={seed}"
    for i, (a, b) in enumerate(zip(local, remote)):
        for key in ("x", "y"):
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"seed={seed} batch {i} {key}")


def test_npy_from_a_url(rng, seed, tmp_path, server):
    srv, url = server
    n = int(rng.integers(10, 200))
    x = rng.standard_normal((n, 3), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    got = batches(pinnable.Npy({"x": f"{url}/x.npy"}), batch_size=n)
    np.testing.assert_array_equal(got[0]["x"], x, err_msg=f"seed={seed}")


def test_a_missing_url_names_it(server):
    _, url = server
    with pytest.raises(pinnable.Error) as info:
        pinnable.TokenWindows(f"{url}/absent.bin", 16)
    assert "absent.bin" in str(info.value), str(info.value)
