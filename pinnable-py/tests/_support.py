"""Helpers of the pinnable test suite: files written the way their producers write them (PNG,
WebDataset tars, nanoGPT token files), and the crate's documented shuffle, as independent
references."""

import io
import math
import string
import struct
import tarfile
import zlib

import numpy as np

import pinnable

M64 = (1 << 64) - 1


def loader(source, **kw):
    """A host loader delivering NumPy arrays, two workers (the machine's cores), unless told."""
    kw.setdefault("output", "numpy")
    kw.setdefault("device", "cpu")
    kw.setdefault("workers", 2)
    return pinnable.Loader(source, **kw)


def letters(rng, n: int) -> str:
    """A random name of `n` lower-case letters (no digit, so it cannot look like an index)."""
    return "".join(rng.choice(list(string.ascii_lowercase), size=n))


def sizes(rng, lo_batches: int = 4, hi_batches: int = 12, lo_b: int = 3, hi_b: int = 24):
    """(n, b): a batch size and a row count that is *not* a multiple of it (a short last batch)."""
    b = int(rng.integers(lo_b, hi_b + 1))
    n = b * int(rng.integers(lo_batches, hi_batches + 1)) + int(rng.integers(1, b))
    return n, b


def rows_xy(rng, n: int):
    """float32 [n, 3, 4] random values and int64 [n] ids, unique, random, spanning 2^40."""
    x = rng.standard_normal((n, 3, 4), dtype=np.float32)
    y = (rng.permutation(n).astype(np.int64) * 7919) - int(rng.integers(0, 2**40))
    return x, y


def row_index(y: np.ndarray):
    """A map from each id of `y` to its row."""
    index = {int(v): i for i, v in enumerate(y)}
    assert len(index) == len(y)
    return index


# --- the crate's shuffle (pinnable/src/loader/sampler.rs), value for value ------------------


class SplitMix64:
    def __init__(self, seed: int):
        self.state = seed & M64

    def next_u64(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & M64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        if n == 0:
            return 0
        threshold = ((1 << 64) - n) % n
        while True:
            m = self.next_u64() * n
            if (m & M64) >= threshold:
                return m >> 64

    @staticmethod
    def for_epoch(seed: int, epoch: int) -> "SplitMix64":
        a = SplitMix64(seed).next_u64()
        e = SplitMix64(epoch ^ 0x6A09E667F3BCC909).next_u64()
        return SplitMix64(a ^ e)


def permutation(n: int, seed: int, epoch: int) -> list:
    """`pinnable::loader::permutation(n, seed, epoch)`: Fisher–Yates driven by SplitMix64."""
    order = list(range(n))
    r = SplitMix64.for_epoch(seed, epoch)
    for i in range(n - 1, 0, -1):
        j = r.below(i + 1)
        order[i], order[j] = order[j], order[i]
    return order


# --- files --------------------------------------------------------------------------------


def png_rgb(pixels: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of `pixels` (uint8 [H, W, 3]), every row with filter 0 (none)."""
    assert pixels.dtype == np.uint8 and pixels.ndim == 3 and pixels.shape[2] == 3
    h, w, _ = pixels.shape
    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def png_decode_rgb(data: bytes) -> np.ndarray:
    """The pixels of a PNG written by `png_rgb` (filter 0 only): checks the encoder itself."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, idat, w, h = 8, b"", 0, 0
    while at < len(data):
        (n,) = struct.unpack(">I", data[at : at + 4])
        tag, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + n]
        crc = struct.unpack(">I", data[at + 8 + n : at + 12 + n])[0]
        assert crc == zlib.crc32(tag + body) & 0xFFFFFFFF
        if tag == b"IHDR":
            w, h = struct.unpack(">II", body[:8])
            assert body[8:] == b"\x08\x02\x00\x00\x00"
        elif tag == b"IDAT":
            idat += body
        at += 12 + n
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, 1 + 3 * w)
    assert (raw[:, 0] == 0).all()
    return raw[:, 1:].reshape(h, w, 3).copy()


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def write_tar(path, members) -> None:
    """A tar of `(name, bytes)` members, in order, as webdataset's writers make them."""
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))


def _header_shaped(tokens: np.ndarray) -> bool:
    """Whether raw u16 tokens start like a `.npy` or llm.c header (the crate refuses those as
    raw tokens; a 1-in-2^32 coincidence with random tokens, ruled out here)."""
    head = tokens[:512].astype("<u2").tobytes()
    magic = b"\x93NUMPY"
    if len(head) >= 6 and sum(a != b for a, b in zip(head[:6], magic)) <= 1:
        return True
    if len(head) >= 4 and struct.unpack("<i", head[:4])[0] in (20240520, 20240801):
        return True
    if len(head) >= 1024:
        count = struct.unpack("<i", head[8:12])[0]
        body = tokens.size * 2 - 1024
        if count >= 0 and (count * 2 == body or count * 4 == body):
            return True
        if not any(head[12:1024]):
            return True
    return False


def write_tokens(path, rng, n: int) -> np.ndarray:
    """`n` random u16 tokens as nanoGPT writes `train.bin` (raw little-endian, `tofile`)."""
    while True:
        tokens = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
        if not _header_shaped(tokens):
            break
    tokens.astype("<u2").tofile(path)
    return tokens


EOT = 50256


def write_docs(path, rng, n_docs: int, max_len: int = 300, vocab: int = 50000):
    """`n_docs` documents of 1..max_len tokens (tokens below `vocab`, each ended by EOT, as
    nanoGPT's `prepare.py` appends it), written one after another as raw u16."""
    while True:
        docs = []
        for _ in range(n_docs):
            length = int(rng.integers(1, max_len + 1))
            body = rng.integers(0, vocab, size=length - 1)
            docs.append(np.append(body, EOT).astype(np.uint16))
        tokens = np.concatenate(docs)
        if not _header_shaped(tokens):
            break
    tokens.astype("<u2").tofile(path)
    return docs


def window_index(tokens: np.ndarray, context: int):
    """Every window of `context` tokens of `tokens`, by content: {bytes: offset}. With random
    u16 tokens and context >= 16 a window is unique (a repeat is a 2^-256 coincidence)."""
    t = np.ascontiguousarray(tokens.astype(np.uint16))
    index = {}
    for o in range(len(t) - context + 1):
        index.setdefault(t[o : o + context].tobytes(), o)
    return index


def find_window(index, row: np.ndarray):
    """The offset of the window whose tokens are `row` (any integer dtype), or None."""
    row = np.asarray(row)
    if row.size and (row.min() < 0 or row.max() > 0xFFFF):
        return None
    return index.get(row.astype(np.uint16).tobytes())


def binomial_bound(n: int, p: float, sigmas: float = 6.0) -> float:
    """`sigmas` standard deviations of a Binomial(n, p) count."""
    return sigmas * math.sqrt(n * p * (1 - p))


def assert_plain(value, path="state"):
    """`value` is made of plain Python values only (what torch.distributed.checkpoint and
    pickle take without the package): dicts with str keys, lists, tuples, str, bytes, int,
    float, bool, None."""
    if isinstance(value, dict):
        for k, v in value.items():
            assert isinstance(k, str), f"{path}: key {k!r} is a {type(k).__name__}, not a str"
            assert_plain(v, f"{path}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            assert_plain(v, f"{path}[{i}]")
    else:
        assert value is None or type(value) in (str, bytes, int, float, bool), (
            f"{path} is a {type(value).__module__}.{type(value).__name__}, not a plain Python value"
        )
