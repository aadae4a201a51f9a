"""Python conventions: context manager, close, pickling, fork, len of an epoch, stats, memory,
and the GIL released while a batch is waited for."""

import os
import pickle
import select
import signal
import threading
import time
import warnings

import numpy as np
import pytest

import pinnable
from _support import loader, rows_xy, sizes


def make(rng, **kw):
    n, b = sizes(rng)
    x, y = rows_xy(rng, n)
    return loader(pinnable.Arrays({"x": x, "y": y}), batch_size=b, **kw), x, y, b


def test_context_manager_closes(rng, seed):
    ld, x, y, b = make(rng)
    expected = len(ld)
    with ld as entered:
        assert entered is ld
        batches = list(entered)
    assert len(batches) == expected
    np.testing.assert_array_equal(batches[0]["x"], x[:b], err_msg=f"seed={seed}")
    with pytest.raises(pinnable.Error) as info:
        next(iter(ld))
    assert "close" in str(info.value).lower(), str(info.value)
    ld.close()  # closing twice is harmless


def test_a_loader_used_without_a_name(rng, seed):
    # `for batch in Loader(...)` and `next(iter(Loader(...)))`: the iterator keeps its loader.
    n, b = sizes(rng)
    x, y = rows_xy(rng, n)
    first = next(iter(loader(pinnable.Arrays({"x": x, "y": y}), batch_size=b)))
    np.testing.assert_array_equal(first["x"], x[:b], err_msg=f"seed={seed}")
    count = 0
    for i, batch in enumerate(loader(pinnable.Arrays({"x": x, "y": y}), batch_size=b)):
        np.testing.assert_array_equal(batch["y"], y[i * b : (i + 1) * b], err_msg=f"seed={seed}")
        count += 1
    assert count == -(-n // b), f"seed={seed}: {count} batches from a loader held by nothing else"


def test_close_stops_a_running_epoch(rng, seed):
    ld, x, y, b = make(rng)
    it = iter(ld)
    first = next(it)
    ld.close()
    with pytest.raises((StopIteration, pinnable.Error)):
        next(it)
    np.testing.assert_array_equal(first["x"], x[:b], err_msg=f"seed={seed}: a held batch")


def test_pickling_is_refused_with_advice(rng):
    ld, *_ = make(rng)
    with pytest.raises(TypeError) as info:
        pickle.dumps(ld)
    text = str(info.value)
    assert "pickl" in text.lower() and any(
        w in text for w in ("DataLoader", "worker", "process")
    ), f"the message should say not to pickle it / not to use it in DataLoader workers: {text!r}"


def test_a_forked_child_gets_a_clear_error(rng, seed):
    ld, x, y, b = make(rng)
    list(ld)  # the loader has run: its threads exist in the parent
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:  # the child: report, then leave without running pytest's exit handlers
        try:
            os.close(read_end)
            try:
                next(iter(ld))
                report = "no error"
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                report = f"{isinstance(e, pinnable.Error)}|{type(e).__name__}|{e}"
            os.write(write_end, report.encode("utf-8", "replace"))
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], 30.0)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            pytest.fail("the forked child hung in next(iter(loader)) (killed after 30 s)")
        chunks = []
        while chunk := os.read(read_end, 65536):
            chunks.append(chunk)
        report = b"".join(chunks).decode()
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    is_error, kind, message = (report.split("|", 2) + ["", ""])[:3]
    assert is_error == "True", f"the child got {report!r}, not a pinnable.Error"
    assert "fork" in message.lower(), f"the child's error does not mention fork: {message!r}"
    # The parent goes on.
    batches = list(ld)
    assert len(batches) == len(ld)
    np.testing.assert_array_equal(batches[0]["y"], y[:b], err_msg=f"seed={seed}")


def test_len_of_an_epoch_counts_down(rng):
    ld, *_ = make(rng)
    it = iter(ld)
    assert len(it) == len(ld)
    for left in range(len(ld) - 1, -1, -1):
        next(it)
        assert len(it) == left
    with pytest.raises(StopIteration):
        next(it)
    assert len(it) == 0


def test_stats_and_memory(rng, seed):
    ld, x, y, b = make(rng, workers=1)
    assert ld.workers == 1 and ld.device == "cpu"
    batches = list(ld)
    stats = ld.stats()
    assert isinstance(stats, dict)
    documented = ("batches", "samples", "bytes", "elapsed_s", "waited_s", "load_s", "collate_s",
                  "transfer_s", "workers", "prefetch", "tuning", "batches_per_second",
                  "gigabytes_per_second", "wait_share", "pinned_peak_bytes", "pinned_bound_bytes",
                  "batch_bytes", "report")
    assert set(documented) <= set(stats), f"missing: {set(documented) - set(stats)}"
    assert stats["batches"] == len(batches) == len(ld), f"seed={seed}: {stats}"
    assert stats["samples"] == len(x), f"seed={seed}: {stats}"
    assert stats["bytes"] >= x.nbytes + y.nbytes, f"seed={seed}: {stats}"
    assert stats["workers"] == 1 and stats["tuning"] == [], f"workers set by hand: {stats}"
    assert isinstance(stats["report"], str) and stats["report"]
    mem = ld.memory()  # `batches` still holds the epoch's blocks
    for key in ("device_used", "device_reserved", "pinned_in_use", "pinned_held", "pinned_bound"):
        assert key in mem and isinstance(mem[key], int), f"{key}: {mem}"
    assert mem["device_used"] == 0 and mem["device_reserved"] == 0, mem
    assert mem["pinned_in_use"] > 0 and mem["pinned_held"] >= mem["pinned_in_use"], mem
    assert mem["pinned_bound"] > 0, mem
    np.testing.assert_array_equal(batches[-1]["y"], y[(len(batches) - 1) * b :], err_msg=f"seed={seed}")


def test_workers_left_unset_are_tuned_within_cores_and_the_stats_say_why(rng, seed):
    # Each sample takes 2 ms (the GIL let go while it sleeps), the consumer none: the tuning adds
    # workers from the 4 it starts with, never past `cores`, and says why.
    class Slow:
        def __len__(self):
            return 4 * 300

        def __getitem__(self, i):
            time.sleep(0.002)
            return {"x": np.full(3, i, dtype=np.int64)}

    cores = int(rng.integers(6, 13))
    ld = pinnable.Loader(pinnable.Dataset(Slow()), batch_size=4, cores=cores, output="numpy",
                         device="cpu")
    assert ld.workers == 4, f"seed={seed}: the first epoch starts from 4"
    got = np.concatenate([b["x"] for b in ld])
    np.testing.assert_array_equal(got, np.repeat(np.arange(4 * 300), 3).reshape(-1, 3),
                                  err_msg=f"seed={seed}: the samples, in order")
    stats = ld.stats()
    assert 4 < stats["workers"] <= cores, f"seed={seed}: {stats['report']}"
    assert stats["tuning"], f"seed={seed}: {stats['report']}"
    first = stats["tuning"][0]
    assert set(first) == {"at_s", "workers", "prefetch", "reason"}, first
    assert first["workers"][0] == 4 and first["workers"][1] > 4, first
    assert "waited" in first["reason"], first
    assert ld.workers == stats["workers"], "the next epoch starts where this one settled"


def test_the_gil_is_released_while_a_batch_is_waited_for(rng, seed):
    # Batches of 16 MiB, one worker: next() waits for the copy. A second thread counts in a
    # tight loop; during the calls that took over 1 ms it must have counted (it can only run
    # while next() does not hold the GIL).
    row = 64 * 1024  # 256 KiB of float32 a row
    n, b = 256, 64
    x = rng.standard_normal((n, row), dtype=np.float32)
    ld = loader(pinnable.Arrays({"x": x}), batch_size=b, workers=1, prefetch=1)
    counter = [0]
    stop = threading.Event()
    started = threading.Event()

    def count():
        started.set()
        while not stop.is_set():
            counter[0] += 1

    t = threading.Thread(target=count, daemon=True)
    t.start()
    started.wait()
    slow_calls, progress, batches = 0, 0, []
    try:
        it = iter(ld)
        while True:
            before = counter[0]
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            took = time.perf_counter() - t0
            after = counter[0]
            if took > 1e-3:
                slow_calls += 1
                progress += after - before
            batches.append(batch)
    finally:
        stop.set()
        t.join()
    assert slow_calls > 0, "no next() call waited over 1 ms: the test measured nothing"
    assert progress > 0, f"the GIL was held through {slow_calls} slow next() calls"
    assert len(batches) == n // b
    for i, batch in enumerate(batches):
        np.testing.assert_array_equal(batch["x"], x[i * b : (i + 1) * b], err_msg=f"seed={seed}")
