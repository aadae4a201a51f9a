"""PyTorch's DataLoader(pin_memory=True) on the loader bench's workload, in the same session.

Batches of 64 x 3x224x224 f32 images + i64 labels. The dataset's __getitem__ returns a view of
one large tensor (no clone), the way a memory-mapped dataset serves samples. Each batch is moved
with .to('cuda', non_blocking=True) and read by one kernel (a sum of the images), then the
stream is synchronised, as benches/loader.rs does. Epochs
are long (the dataset wraps around the array) so the timing starts after the prefetched backlog.

Writes `torch_loader_w<workers> <seconds per batch>` lines (medians of steady-state runs) to
--out; benches/loader.rs reads them and prints ratios.

    python3 torch_loader.py --out torch_loader.txt
"""
import argparse
import os
import statistics
import time

import torch
from torch.utils.data import DataLoader, Dataset

BATCH = 64
IMAGE = (3, 224, 224)


class Views(Dataset):
    """`length` samples cycling over `images`; each a view, never a copy."""

    def __init__(self, images, labels, length):
        self.images, self.labels, self.length = images, labels, length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        j = i % len(self.images)
        return self.images[j], self.labels[j]


def seconds_per_batch(images, labels, workers, warmup, measured, dev):
    ds = Views(images, labels, (warmup + measured) * BATCH)
    kw = dict(batch_size=BATCH, num_workers=workers, pin_memory=True, shuffle=False)
    if workers:
        kw.update(prefetch_factor=2, persistent_workers=False)
    it = iter(DataLoader(ds, **kw))
    for _ in range(warmup):
        x, y = next(it)
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        x.sum()
        torch.cuda.current_stream().synchronize()
    t0 = time.perf_counter()
    n = 0
    for x, y in it:
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        x.sum()
        torch.cuda.current_stream().synchronize()
        n += 1
    return (time.perf_counter() - t0) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--images", type=int, default=int(os.environ.get("PINNABLE_BENCH_IMAGES", 2048)))
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--workers", default="0,4,8")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    torch.cuda.init()
    images = torch.randn(args.images, *IMAGE)
    labels = torch.randint(0, 1000, (args.images,), dtype=torch.int64)
    lines = [f"# torch {torch.__version__}, {torch.cuda.get_device_name(0)}, "
             f"{args.images} images, {args.batches} batches after a warm-up"]
    for w in (int(w) for w in args.workers.split(",")):
        warmup = max(8, 4 * w)  # past the prefetched backlog (2 batches per worker)
        runs = [seconds_per_batch(images, labels, w, warmup, args.batches, dev)
                for _ in range(args.repeats)]
        s = statistics.median(runs)
        print(f"torch DataLoader(pin_memory=True, num_workers={w}): {s * 1e3:.2f} ms per batch")
        lines.append(f"torch_loader_w{w} {s}")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
