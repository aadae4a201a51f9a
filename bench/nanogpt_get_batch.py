"""nanoGPT's get_batch on the token bench's file, in the same session as benches/tokens.rs.

nanoGPT (train.py) reads a batch like this: np.memmap of train.bin (u16), random starts, one
slice per row converted to int64, torch.stack, then pin_memory() and .to('cuda',
non_blocking=True). This script runs that code on `$PINNABLE_BENCH_DATA/pinnable-train.bin`
(the system's temporary directory by default; written here when absent or of another size:
PINNABLE_BENCH_TOKENS random u16 tokens below GPT-2's vocabulary, the file the Rust bench then
reuses), synchronises after each batch, and writes `nanogpt_get_batch_<B>x<T> <seconds>` lines
(medians) to --out; benches/tokens.rs reads them and prints ratios.

    python3 nanogpt_get_batch.py --out bench-out/nanogpt.txt
"""
import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import torch

SIZES = [(12, 1024), (64, 2048), (256, 4096)]


def token_file(path, n):
    """`path` holding `n` random u16 tokens, as nanoGPT's prepare.py writes train.bin."""
    if os.path.exists(path) and os.path.getsize(path) == 2 * n:
        return path
    rng = np.random.default_rng(1337)
    with open(path, "wb") as f:
        for start in range(0, n, 1 << 24):
            rng.integers(0, 50257, size=min(1 << 24, n - start), dtype=np.uint16).tofile(f)
    return path


def get_batch(path, batch_size, block_size, device):
    # nanoGPT train.py, get_batch('train'): a fresh memmap per batch, to avoid a memory leak.
    data = np.memmap(path, dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy((data[i:i + block_size]).astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + block_size]).astype(np.int64)) for i in ix])
    x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--file", default=os.path.join(os.environ.get("PINNABLE_BENCH_DATA", tempfile.gettempdir()),
                                                   "pinnable-train.bin"))
    ap.add_argument("--tokens", type=int, default=int(os.environ.get("PINNABLE_BENCH_TOKENS", 256 << 20)))
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    path = token_file(args.file, args.tokens)
    dev = torch.device("cuda:0")
    torch.cuda.init()
    lines = [f"# torch {torch.__version__}, numpy {np.__version__}, {torch.cuda.get_device_name(0)}, "
             f"{args.tokens} tokens in {path}"]
    for b, t in SIZES:
        times = []
        for i in range(args.warmup + args.iters):
            t0 = time.perf_counter()
            x, y = get_batch(path, b, t, dev)
            torch.cuda.synchronize()
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
        assert x.shape == (b, t) and y.dtype == torch.int64
        s = statistics.median(times)
        print(f"nanoGPT get_batch {b}x{t}: {s * 1e3:.3f} ms per batch "
              f"({2 * b * t * 8 / s / 1e9:.2f} GB/s of x, y)")
        lines.append(f"nanogpt_get_batch_{b}x{t} {s}")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
