"""Memory over 10,000 batches: torch's allocator untouched, the loader's own pools flat.

A small loader on cuda:0: Arrays of x float32 [160,000, 64] and labels int64 [160,000],
batch_size 64, shuffled (2,500 batches an epoch, so the 10,000 batches cross 3 epoch starts and
the samples fall mid-epoch), output "torch", each batch dropped at once.

- `torch.cuda.memory_reserved()` and `memory_allocated()` before the loader is made equal
  their values after 10,000 batches (the batches are the loader's memory; torch allocates
  nothing for them), and after `close()`.
- `loader.memory()` sampled after batch 1, then every 1,000 batches: the series of
  `device_reserved`, `device_used`, `pinned_held`, `pinned_bound` is printed. Flat: no sample
  after the one at batch 1,000 exceeds it by more than the tolerance, for `device_reserved` and
  for `device_used`. Tolerance: one batch's device bytes rounded up to 2 MiB (CUDA's allocation
  granularity): a pool may hold one block more once, when a free's event has not completed at
  the moment a new batch needs a block, but a leak of even one block per 1,000 batches would
  grow by 9 blocks over the 9 later samples, well past it.
- `pinned_held <= pinned_bound` at every sample.

    python3 memory.py            # GPU run (~10 s on an H200)
    python3 memory.py --cpu-smoke
"""
import numpy as np
import torch

from common import run, start

MIB = 1 << 20


def main(check, args):
    P, dev = start(check, args)
    cuda = dev.startswith("cuda")
    smoke = args.cpu_smoke
    total, every = (1000, 100) if smoke else (10_000, 1000)
    rows, width, batch = (16_000, 64, 64) if smoke else (160_000, 64, 64)
    x = check.rng.standard_normal((rows, width), dtype=np.float32)
    labels = check.rng.integers(0, 1000, size=rows, dtype=np.int64)

    if cuda:
        torch.cuda.synchronize()
        reserved0, allocated0 = torch.cuda.memory_reserved(0), torch.cuda.memory_allocated(0)
        check.value("torch_reserved_before", reserved0)
        check.value("torch_allocated_before", allocated0)

    loader = P.Loader(P.Arrays({"x": x, "labels": labels}), batch_size=batch, shuffle=True,
                      seed=check.seed % 1000, device=dev, output="torch")
    check.value("batches_per_epoch", len(loader))
    samples = []  # (batches delivered, memory())
    n, batch_bytes, epochs = 0, None, 0
    while n < total:
        epochs += 1
        for b in loader:
            n += 1
            if batch_bytes is None:
                batch_bytes = sum(t.numel() * t.element_size() for t in b.values())
            del b
            if n == 1 or n % every == 0:
                samples.append((n, dict(loader.memory())))
            if n == total:
                break
    check.value("batches", n)
    check.value("epochs_started", epochs)
    check.value("batch_device_bytes", batch_bytes)
    keys = ["device_reserved", "device_used", "pinned_held", "pinned_bound"]
    check.value("sample_at_batches", [s[0] for s in samples])
    for k in keys:
        check.value(f"series_{k}", [s[1].get(k, -1) for s in samples])
    missing = [k for k in keys if k not in samples[0][1]]
    check.check("memory_keys", not missing, f"missing {missing}" if missing else "all four keys", "all four")

    if cuda:
        torch.cuda.synchronize()
        reserved1, allocated1 = torch.cuda.memory_reserved(0), torch.cuda.memory_allocated(0)
        check.value("torch_reserved_after", reserved1)
        check.value("torch_allocated_after", allocated1)
        check.check("torch_reserved_unchanged", reserved1 == reserved0,
                    f"{reserved0} -> {reserved1} bytes", "unchanged")
        check.check("torch_allocated_unchanged", allocated1 == allocated0,
                    f"{allocated0} -> {allocated1} bytes", "unchanged")
    else:
        check.skip("torch.cuda.memory_reserved before/after", "cpu smoke: no CUDA allocator")

    tolerance = -(-batch_bytes // (2 * MIB)) * 2 * MIB
    check.value("tolerance_bytes", tolerance)
    base = next(s for s in samples if s[0] == every)
    later = [s for s in samples if s[0] > every]
    for k in ("device_reserved", "device_used"):
        growth = max(s[1].get(k, 0) for s in later) - base[1].get(k, 0)
        check.value(f"{k}_growth_after_{every}", growth)
        check.check(f"{k}_flat", growth <= tolerance,
                    f"max growth {growth} bytes after batch {every} ({base[1].get(k, 0)} at batch {every})",
                    f"<= {tolerance}")
    if cuda:
        check.check("device_reserved_nonzero", base[1].get("device_reserved", 0) > 0,
                    f"{base[1].get('device_reserved', 0)} bytes", "> 0 (the batches live in the loader's pool)")
    over = [(n_, m["pinned_held"], m["pinned_bound"]) for n_, m in samples
            if m.get("pinned_held", 0) > m.get("pinned_bound", 0)]
    check.check("pinned_held_within_bound", not over,
                f"{len(over)} of {len(samples)} samples over" + (f" (first: {over[0]})" if over else ""), "0")

    loader.close()
    try:
        after_close = loader.memory()
        for k in keys:
            check.value(f"after_close_{k}", after_close.get(k, -1))
    except Exception as e:  # noqa: BLE001 - informational only
        check.value("after_close_memory", f"raised {type(e).__name__}: {e}")
    if cuda:
        torch.cuda.synchronize()
        check.value("torch_reserved_after_close", torch.cuda.memory_reserved(0))
        check.check("torch_reserved_unchanged_after_close", torch.cuda.memory_reserved(0) == reserved0,
                    f"{reserved0} -> {torch.cuda.memory_reserved(0)} bytes", "unchanged")


if __name__ == "__main__":
    run("memory", __doc__, main)
