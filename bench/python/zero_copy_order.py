"""Zero copy and stream order of the Python package's batches on cuda:0.

(a) Zero copy.
    - output="dlpack": 1,000 batches of an Arrays loader (x float32 [32, 64], y int64 [32]) and
      200 of a TokenWindows loader (x, y int64 [16, 256]); for every tensor,
      `torch.from_dlpack(t).data_ptr() == t.data_ptr`, on t's device, of t's shape and dtype;
      every 100th batch's values equal the NumPy data (the token rows: windows of the file).
    - output="torch": 1,000 batches; `torch.cuda.memory_allocated()` does not change across
      `next()` (torch allocated nothing: no copy was made), no tensor lies in a segment of
      torch's caching allocator (the memory is the loader's), and the tensors of the last 4
      batches, held alive together, occupy disjoint address ranges (live buffers, not reused
      under a live tensor); every 100th batch's values equal the NumPy data.
(b) Stream order. Arrays of integer-valued float32 x [64, 1024] and int64 labels [64, 8] (sums
    exact in any order). 200 steps in each of four runs: the consumer on the default stream or
    on a user `torch.cuda.Stream()` (the batch fetched inside `with torch.cuda.stream(s)`), with
    either
      copy delay:     a spin kernel (`torch.cuda._sleep`) on the loader's copy stream
                      (`torch.cuda.ExternalStream(loader.stream)`), 50 ms right after the iterator
                      is made and 2 ms every 10 steps, so later batches' copies queue behind it;
      consumer delay: a 0.5 ms spin on the consumer stream before each step's kernels, so the
                      consumer lags and the loader must not reuse a batch's memory before the
                      kernels queued on it ran.
    No host synchronisation in the loop: each step sums the batch's rows into slot k of a
    preallocated device buffer, the batch is dropped, and only the end synchronises. Every sum
    must equal the NumPy reference. `queued_before_ready` counts the steps whose batch came out
    of `next()` while the consumer stream still had work pending (a CUDA event recorded right
    after `next()` had not completed): in the copy-delay runs, steps whose kernels were queued
    before their batch's copy had run, so the order was the GPU's to keep, not the host's.
    `host_loop_ms` beside `delay_enqueued_ms`: how far the host could run ahead of the delays
    (next() blocks once the loader's bounded buffers are all in flight).

    python3 zero_copy_order.py            # GPU run (~10 s on an H200)
    python3 zero_copy_order.py --cpu-smoke
"""
import collections
import contextlib
import time

import numpy as np
import torch

from common import WindowIndex, run, start, token_file


def as_numpy(t):
    return t.detach().cpu().numpy()


def check_dlpack_tensor(P, t, dev, want_shape, want_dtype):
    """Problems with one dlpack-output tensor: its type, device, shape, dtype, zero copy."""
    if not isinstance(t, P.Tensor):
        return [f"type {type(t).__name__}"], None
    problems = []
    tt = torch.from_dlpack(t)
    if tt.data_ptr() != t.data_ptr:
        problems.append(f"torch data_ptr {tt.data_ptr():#x} != t.data_ptr {t.data_ptr:#x}")
    if t.device != dev or str(tt.device) != dev:
        problems.append(f"device {t.device} / torch {tt.device}, not {dev}")
    if tuple(t.shape) != want_shape or tuple(tt.shape) != want_shape:
        problems.append(f"shape {t.shape} / torch {tuple(tt.shape)}, not {want_shape}")
    if t.dtype != want_dtype or str(tt.dtype) != f"torch.{want_dtype}":
        problems.append(f"dtype {t.dtype} / {tt.dtype}, not {want_dtype}")
    if dev.startswith("cuda") and tt.is_pinned():
        problems.append("a cuda tensor says it is pinned")
    return problems, tt


def part_a_dlpack_arrays(P, check, dev, n_batches):
    B, D = 32, 64
    x = check.rng.integers(0, 1 << 20, size=(n_batches * B, D)).astype(np.float32)
    y = np.arange(n_batches * B, dtype=np.int64) * 7 + 3
    loader = P.Loader(P.Arrays({"x": x, "y": y}), batch_size=B, device=dev, output="dlpack")
    check.value("a_dlpack_arrays_len", len(loader))
    tensors, bad, value_bad, k = 0, [], 0, -1
    for k, b in enumerate(loader):
        for name, want in (("x", (B, D)), ("y", (B,))):
            problems, tt = check_dlpack_tensor(P, b[name], dev, want, "float32" if name == "x" else "int64")
            tensors += 1
            if problems:
                bad.append(f"batch {k} {name}: {'; '.join(problems)}")
            if k % 100 == 0 and tt is not None:
                ref = (x if name == "x" else y)[k * B:(k + 1) * B]
                value_bad += int(not np.array_equal(as_numpy(tt), ref))
    batches = k + 1
    check.value("a_dlpack_arrays_batches", batches)
    check.value("a_dlpack_arrays_tensors", tensors)
    for line in bad[:5]:
        check.value("a_dlpack_problem", line)
    check.check("a_dlpack_arrays_batches", batches == n_batches, f"{batches}", f"== {n_batches}")
    check.check("a_dlpack_arrays_zero_copy", not bad, f"{tensors - len(bad)}/{tensors} tensors",
                "all: torch.from_dlpack(t).data_ptr() == t.data_ptr, device, shape, dtype")
    check.check("a_dlpack_arrays_values", value_bad == 0, f"{value_bad} of {2 * ((batches + 99) // 100)} "
                "sampled tensors differ from the NumPy data", "0")
    loader.close()


def part_a_dlpack_tokens(P, check, dev, n_batches):
    B, T = 16, 256
    path = token_file(f"{check.dir}/a_tokens.bin", (n_batches * B + 8) * T + 1, check.rng)
    index = WindowIndex(path, T)
    loader = P.Loader(P.TokenWindows(path, T), batch_size=B, shuffle=True, seed=check.seed % 1000,
                      device=dev, output="dlpack")
    tensors, bad, value_bad, sampled, k = 0, [], 0, 0, -1
    for k, b in enumerate(loader):
        if k == n_batches:
            break
        tts = {}
        for name in ("x", "y"):
            problems, tts[name] = check_dlpack_tensor(P, b[name], dev, (B, T), "int64")
            tensors += 1
            if problems:
                bad.append(f"batch {k} {name}: {'; '.join(problems)}")
        if k % 20 == 0 and tts["x"] is not None and tts["y"] is not None:
            sampled += 1
            value_bad += int((index.find(as_numpy(tts["x"]), as_numpy(tts["y"])) < 0).any())
    batches = min(k + 1, n_batches)
    check.value("a_dlpack_tokens_batches", batches)
    for line in bad[:5]:
        check.value("a_dlpack_problem", line)
    check.check("a_dlpack_tokens_zero_copy", not bad and batches == n_batches,
                f"{tensors - len(bad)}/{tensors} tensors of {batches} batches", "all")
    check.check("a_dlpack_tokens_values", value_bad == 0,
                f"{value_bad} of {sampled} sampled batches hold rows that are no window of the file", "0")
    loader.close()


def torch_segments():
    """(start, end) of every segment of torch's caching allocator on cuda:0."""
    return [(s["address"], s["address"] + s["total_size"]) for s in torch.cuda.memory_snapshot()
            if s.get("device", 0) == 0]


def part_a_torch(P, check, dev, n_batches):
    B, D = 32, 64
    x = check.rng.integers(0, 1 << 20, size=(n_batches * B, D)).astype(np.float32)
    y = np.arange(n_batches * B, dtype=np.int64) * 5 + 1
    cuda = dev.startswith("cuda")
    loader = P.Loader(P.Arrays({"x": x, "y": y}), batch_size=B, device=dev, output="torch")
    live = collections.deque(maxlen=4)
    alloc_changed, in_torch, overlaps, wrong, value_bad, batches = 0, 0, 0, [], 0, 0
    it = iter(loader)
    for k in range(n_batches):
        before = torch.cuda.memory_allocated(0) if cuda else 0
        b = next(it)
        after = torch.cuda.memory_allocated(0) if cuda else 0
        batches += 1
        alloc_changed += int(after != before)
        for name, shape, dtype in (("x", (B, D), torch.float32), ("y", (B,), torch.int64)):
            t = b[name]
            if not isinstance(t, torch.Tensor) or str(t.device) != dev or tuple(t.shape) != shape \
                    or t.dtype != dtype:
                wrong.append(f"batch {k} {name}: {type(t).__name__} {getattr(t, 'device', '?')} "
                             f"{tuple(getattr(t, 'shape', ()))} {getattr(t, 'dtype', '?')}")
        live.append(b)
        ranges = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
                        for bb in live for t in bb.values())
        overlaps += sum(1 for (s0, e0), (s1, _) in zip(ranges, ranges[1:]) if s1 < e0)
        if cuda and k % 50 == 0:
            segs = torch_segments()
            in_torch += sum(1 for (s, _) in ranges if any(a <= s < e for a, e in segs))
        if k % 100 == 0:
            value_bad += int(not np.array_equal(as_numpy(b["x"]), x[k * B:(k + 1) * B]))
            value_bad += int(not np.array_equal(as_numpy(b["y"]), y[k * B:(k + 1) * B]))
    live.clear()
    for line in wrong[:5]:
        check.value("a_torch_problem", line)
    check.value("a_torch_batches", batches)
    check.check("a_torch_tensors", not wrong, f"{2 * batches - len(wrong)}/{2 * batches} torch tensors "
                f"on {dev} of the right shape and dtype", "all")
    check.check("a_torch_disjoint_live_buffers", overlaps == 0,
                f"{overlaps} overlapping ranges among the last 4 batches' tensors", "0")
    if cuda:
        check.check("a_torch_no_torch_allocation", alloc_changed == 0,
                    f"memory_allocated changed across next() in {alloc_changed} of {batches} batches", "0")
        check.check("a_torch_not_torch_memory", in_torch == 0,
                    f"{in_torch} sampled tensors lie in torch's allocator segments", "0")
    else:
        check.skip("a_torch torch-allocator checks", "cpu smoke: no CUDA allocator")
    check.check("a_torch_values", value_bad == 0, f"{value_bad} sampled tensors differ from the NumPy data", "0")
    loader.close()


def sleep_cycles_per_ms():
    """Cycles of torch.cuda._sleep per millisecond, measured with CUDA events."""
    torch.cuda._sleep(1000)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    torch.cuda._sleep(20_000_000)
    e.record()
    e.synchronize()
    return 20_000_000 / s.elapsed_time(e)


def part_b(P, check, dev, steps, consumer, delay, cycles_per_ms):
    """One run of `steps` steps; True when every sum equals the reference."""
    tag = f"b_{consumer}_{delay}"
    B, D, L = 64, 1024, 8
    n = steps * B
    x = check.rng.integers(0, 1 << 12, size=(n, D)).astype(np.float32)  # row sums < 2^22: exact
    lab = check.rng.integers(0, 1 << 40, size=(n, L), dtype=np.int64)
    ref_x = x.astype(np.int64).sum(axis=1).reshape(steps, B)
    ref_l = lab.sum(axis=1).reshape(steps, B)
    cuda = dev.startswith("cuda")
    loader = P.Loader(P.Arrays({"x": x, "lab": lab}), batch_size=B, device=dev, output="torch")
    res_x = torch.zeros(steps, B, dtype=torch.float32, device=dev)
    res_l = torch.zeros(steps, B, dtype=torch.int64, device=dev)
    if cuda:
        torch.cuda.synchronize()  # the buffers' fills are done before another stream writes them
        s = torch.cuda.Stream() if consumer == "user" else torch.cuda.default_stream()
        ctx = torch.cuda.stream(s)
    else:
        ctx = contextlib.nullcontext()
    big, small = (50.0, 2.0) if delay == "copy" else (0.0, 0.5)
    delay_ms, queued = 0.0, 0
    with ctx:
        it = iter(loader)
        ext = None
        if cuda:
            raw = getattr(loader, "stream", "missing")
            if raw == "missing" or raw is None:
                check.fail(f"API gap: Loader.stream is {raw} on {dev} (needed to delay the copy stream)")
                return False
            ext = torch.cuda.ExternalStream(raw)
            if delay == "copy":  # before the first copies: every batch queues behind it
                with torch.cuda.stream(ext):
                    torch.cuda._sleep(int(big * cycles_per_ms))
                delay_ms += big
        t0 = time.perf_counter()
        for k in range(steps):
            if cuda and delay == "copy" and k % 10 == 0:
                with torch.cuda.stream(ext):
                    torch.cuda._sleep(int(small * cycles_per_ms))
                delay_ms += small
            b = next(it)
            if cuda:
                ev = torch.cuda.Event()
                ev.record()
                queued += int(not ev.query())
            if cuda and delay == "consumer":
                torch.cuda._sleep(int(small * cycles_per_ms))
                delay_ms += small
            res_x[k] = b["x"].sum(dim=1)
            res_l[k] = b["lab"].sum(dim=1)
            del b
        host_ms = (time.perf_counter() - t0) * 1e3
    if cuda:
        torch.cuda.synchronize()
    got_x = res_x.cpu().numpy().astype(np.int64)
    got_l = res_l.cpu().numpy()
    bad_steps = int((~((got_x == ref_x).all(axis=1) & (got_l == ref_l).all(axis=1))).sum())
    check.value(f"{tag}_host_loop_ms", host_ms)
    check.value(f"{tag}_delay_enqueued_ms", delay_ms)
    if cuda:
        check.value(f"{tag}_queued_before_ready", queued)
    first_bad = next((k for k in range(steps) if not (np.array_equal(got_x[k], ref_x[k])
                                                       and np.array_equal(got_l[k], ref_l[k]))), None)
    check.check(f"{tag}_order", bad_steps == 0,
                f"{bad_steps} of {steps} steps differ from the reference"
                + (f" (first: step {first_bad})" if first_bad is not None else ""), "0")
    if hasattr(it, "close"):
        it.close()
    loader.close()
    return bad_steps == 0


def main(check, args):
    P, dev = start(check, args)
    smoke = args.cpu_smoke
    part_a_dlpack_arrays(P, check, dev, 50 if smoke else 1000)
    part_a_dlpack_tokens(P, check, dev, 20 if smoke else 200)
    part_a_torch(P, check, dev, 50 if smoke else 1000)
    steps = 20 if smoke else 200
    if dev.startswith("cuda"):
        cycles = sleep_cycles_per_ms()
        check.value("sleep_cycles_per_ms", cycles)
        for consumer in ("default", "user"):
            for delay in ("copy", "consumer"):
                part_b(P, check, dev, steps, consumer, delay, cycles)
    else:
        check.skip("b stream delays (copy and consumer)", "cpu smoke: no CUDA streams; the order "
                   "loop runs once on the host")
        part_b(P, check, dev, steps, "host", "none", 0.0)


if __name__ == "__main__":
    run("zero_copy_order", __doc__, main)
