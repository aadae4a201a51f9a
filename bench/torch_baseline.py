"""PyTorch baseline for pinnable's benchmarks, run on the same GPU in the same session.

Writes one `name seconds` line per figure (medians) to --out; benches/transfer.rs and
benches/batch.rs read it and print ratios. The batch mirrors the Rust bench: a dict of 64 x 1 MiB f32 tensors plus i64 labels;
also 1000 tensors of 4 KiB, pinned and pageable (benches/batch.rs).

    python3 torch_baseline.py --out torch.txt
"""
import argparse
import statistics
import time

import torch
from torch.utils.data._utils.pin_memory import pin_memory

MiB = 1 << 20


def median_seconds(fn, warmup=5, iters=30):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def event_seconds(fn, warmup=3, iters=20):
    """Median device time of fn() between two CUDA events on the current stream."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    torch.cuda.init()
    rows = {}

    batch = {f"x{i}": torch.randn(MiB // 4) for i in range(64)}
    batch["labels"] = torch.randint(0, 1000, (64,), dtype=torch.int64)

    rows["torch_pin_batch"] = median_seconds(lambda: pin_memory(batch))
    pinned = pin_memory(batch)

    def to_dev():
        out = {k: v.to(dev, non_blocking=True) for k, v in pinned.items()}
        torch.cuda.synchronize()
        return out

    rows["torch_to_device_pinned_batch"] = median_seconds(to_dev)

    def end_to_end():
        p = pin_memory(batch)
        out = {k: v.to(dev, non_blocking=True) for k, v in p.items()}
        torch.cuda.synchronize()
        return out

    rows["torch_end_to_end_batch"] = median_seconds(end_to_end)

    # 1000 tensors of 4 KiB: per-tensor costs.
    small = [torch.randn(1024) for _ in range(1000)]
    small_pinned = [t.pin_memory() for t in small]
    rows["torch_pin_1000x4k"] = median_seconds(lambda: pin_memory(small))

    def move_all(ts):
        out = [t.to(dev, non_blocking=True) for t in ts]
        torch.cuda.synchronize()
        return out

    rows["torch_1000x4k_pinned"] = median_seconds(lambda: move_all(small_pinned))
    rows["torch_1000x4k_pageable"] = median_seconds(lambda: move_all(small))

    big = torch.randn(64 * MiB)  # 256 MiB of f32
    big_pinned = big.pin_memory()
    dst = torch.empty_like(big, device=dev)
    rows["torch_h2d_256mib_pinned"] = event_seconds(lambda: dst.copy_(big_pinned, non_blocking=True))
    rows["torch_h2d_256mib_pageable"] = event_seconds(lambda: dst.copy_(big, non_blocking=True))
    host = torch.empty_like(big).pin_memory()
    rows["torch_d2h_256mib_pinned"] = event_seconds(lambda: host.copy_(dst, non_blocking=True))

    try:
        stats = torch.cuda.host_memory_stats()
        print("host_memory_stats:", {k: v for k, v in stats.items() if "bytes" in k})
        for key, name in [("reserved_bytes", "torch_pinned_reserved_bytes"),
                          ("allocated_bytes", "torch_pinned_allocated_bytes")]:
            found = [v for k, v in stats.items() if k.startswith(key) and k.endswith("current")]
            if found:
                rows[name] = float(found[0])
    except Exception as e:  # older versions have no host_memory_stats
        print("host_memory_stats unavailable:", e)

    with open(args.out, "w") as f:
        f.write(f"# torch {torch.__version__} on {torch.cuda.get_device_name(0)}\n")
        for k, v in rows.items():
            f.write(f"{k} {v!r}\n")
    for k, v in rows.items():
        print(f"{k:40s} {v:.6g}")


if __name__ == "__main__":
    main()
