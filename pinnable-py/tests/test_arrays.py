"""Arrays: rows of in-memory arrays, in order, shuffled, cut, from NumPy and torch."""

import gc
import math
import os

import numpy as np
import pytest

import pinnable
from _support import loader, permutation, row_index, rows_xy, sizes


def check_in_order(batches, x, y, b, seed, what="batch"):
    n = len(x)
    assert len(batches) == math.ceil(n / b), f"seed={seed}"
    for i, batch in enumerate(batches):
        lo, hi = i * b, min(n, (i + 1) * b)
        assert set(batch) == {"x", "y"}, f"seed={seed}: keys {sorted(batch)}"
        bx, by = batch["x"], batch["y"]
        assert isinstance(bx, np.ndarray) and isinstance(by, np.ndarray)
        assert bx.dtype == np.float32 and bx.shape == (hi - lo, 3, 4), f"seed={seed} {what} {i}"
        assert by.dtype == np.int64 and by.shape == (hi - lo,), f"seed={seed} {what} {i}"
        np.testing.assert_array_equal(bx, x[lo:hi], err_msg=f"seed={seed} {what} {i}: x")
        np.testing.assert_array_equal(by, y[lo:hi], err_msg=f"seed={seed} {what} {i}: y")


def epoch_rows(batches, index):
    """The row of every sample of an epoch, in delivery order."""
    return [index[int(v)] for batch in batches for v in batch["y"]]


def test_batches_are_the_rows_in_order_and_stay_valid(rng, seed):
    n, b = sizes(rng)
    x, y = rows_xy(rng, n)
    src = pinnable.Arrays({"x": x, "y": y})
    assert len(src) == n
    ld = loader(src, batch_size=b)
    assert len(ld) == math.ceil(n / b)
    assert ld.epoch == 0
    first = list(ld)  # held, not copied: the loader must not reuse their memory
    assert ld.epoch == 1, "the epoch the next iteration runs"
    second = list(ld)
    check_in_order(second, x, y, b, seed, "epoch 1 batch")
    check_in_order(first, x, y, b, seed, "epoch 0 batch (held through epoch 1)")


def test_drop_last(rng, seed):
    n, b = sizes(rng)
    x, y = rows_xy(rng, n)
    ld = loader(pinnable.Arrays({"x": x, "y": y}), batch_size=b, drop_last=True)
    assert len(ld) == n // b, f"seed={seed}"
    batches = list(ld)
    assert len(batches) == n // b
    for i, batch in enumerate(batches):
        np.testing.assert_array_equal(batch["x"], x[i * b : (i + 1) * b], err_msg=f"seed={seed}")
        np.testing.assert_array_equal(batch["y"], y[i * b : (i + 1) * b], err_msg=f"seed={seed}")


def test_shuffle_permutes_every_epoch_and_follows_seed_and_epoch(rng, seed):
    # n >= 500: a shuffled epoch equal to another order by chance is a 1-in-500! event.
    n = int(rng.integers(500, 1500))
    b = int(rng.integers(7, 64))
    x, y = rows_xy(rng, n)
    index = row_index(y)
    s1, s2 = (int(v) for v in rng.choice(2**62, size=2, replace=False))

    def make(s):
        return loader(pinnable.Arrays({"x": x, "y": y}), batch_size=b, shuffle=True, seed=s)

    a = make(s1)
    e0_batches = list(a)
    e0 = epoch_rows(e0_batches, index)
    for batch in e0_batches:  # every row's values travel together
        rows = [index[int(v)] for v in batch["y"]]
        np.testing.assert_array_equal(batch["x"], x[rows], err_msg=f"seed={seed}")
    assert sorted(e0) == list(range(n)), f"seed={seed}: epoch 0 is not a permutation of the rows"
    assert e0 != list(range(n)), f"seed={seed}: shuffle=True delivered the rows in order"
    e1 = epoch_rows(list(a), index)  # the next iteration runs epoch 1
    assert sorted(e1) == list(range(n)), f"seed={seed}"
    assert e1 != e0, f"seed={seed}: epoch 1 repeats epoch 0's order"

    same = make(s1)
    assert epoch_rows(list(same), index) == e0, f"seed={seed}: same seed, another order"
    same.set_epoch(1)
    assert same.epoch == 1
    assert epoch_rows(list(same), index) == e1, f"seed={seed}: set_epoch(1) != the 2nd epoch"
    same.set_epoch(0)
    assert epoch_rows(list(same), index) == e0, f"seed={seed}: set_epoch(0) != the 1st epoch"

    other = make(s2)
    assert epoch_rows(list(other), index) != e0, f"seed={seed}: seeds {s1} and {s2} agree"


def test_shuffle_order_is_the_crates_documented_permutation(rng, seed):
    # pinnable::loader::permutation(len, seed, epoch), reimplemented in _support: the order is
    # documented to be the same everywhere and in every version.
    n = int(rng.integers(50, 400))
    b = int(rng.integers(3, 20))
    s = int(rng.integers(0, 2**63))
    epoch = int(rng.integers(0, 1000))
    x, y = rows_xy(rng, n)
    ld = loader(pinnable.Arrays({"x": x, "y": y}), batch_size=b, shuffle=True, seed=s)
    ld.set_epoch(epoch)
    got = epoch_rows(list(ld), row_index(y))
    assert got == permutation(n, s, epoch), f"seed={seed}: shuffle seed {s}, epoch {epoch}"


def test_torch_cpu_tensors_as_input(rng, seed):
    torch = pytest.importorskip("torch")
    n, b = sizes(rng)
    x, y = rows_xy(rng, n)
    src = pinnable.Arrays({"x": torch.from_numpy(x.copy()), "y": torch.from_numpy(y.copy())})
    check_in_order(list(loader(src, batch_size=b)), x, y, b, seed)


def test_strided_arrays_as_input(rng, seed):
    n, b = sizes(rng)
    wide = rng.standard_normal((n, 3, 8), dtype=np.float32)
    x = wide[:, :, ::2]  # every other column: not contiguous
    ids = rng.permutation(3 * n).astype(np.int64)
    y = ids[::3]  # a stride of 24 bytes
    assert not x.flags.c_contiguous and not y.flags.c_contiguous
    check_in_order(list(loader(pinnable.Arrays({"x": x, "y": y}), batch_size=b)), x, y, b, seed)
    t = rng.standard_normal((4, 3, n), dtype=np.float32).transpose(2, 1, 0)  # [n, 3, 4]
    check_in_order(list(loader(pinnable.Arrays({"x": t, "y": y}), batch_size=b)), t, y, b, seed)


def test_arrays_are_kept_alive_by_the_source(rng, seed):
    n, b = sizes(rng)
    x, y = rows_xy(rng, n)
    xs, ys = x.copy(), y.copy()
    src = pinnable.Arrays({"x": xs, "y": ys})
    del xs, ys
    gc.collect()
    filler = [np.full((n, 3, 4), -1.0, np.float32) for _ in range(4)]  # reuse freed memory
    check_in_order(list(loader(src, batch_size=b)), x, y, b, seed)
    del filler


def test_out_of_order_delivery_still_delivers_every_row_once(rng, seed):
    n, b = sizes(rng)
    x, y = rows_xy(rng, n)
    index = row_index(y)
    ld = loader(pinnable.Arrays({"x": x, "y": y}), batch_size=b, in_order=False, workers=2)
    batches = list(ld)
    assert len(batches) == len(ld)
    rows = epoch_rows(batches, index)
    assert sorted(rows) == list(range(n)), f"seed={seed}"
    for batch in batches:  # each batch is still one of the epoch's batches, whole
        r = [index[int(v)] for v in batch["y"]]
        assert r == list(range(r[0], r[0] + len(r))) and r[0] % b == 0, f"seed={seed}: {r}"
        np.testing.assert_array_equal(batch["x"], x[r], err_msg=f"seed={seed}")


def test_default_device_and_workers(rng, seed):
    n, b = sizes(rng)
    x, y = rows_xy(rng, n)
    ld = pinnable.Loader(pinnable.Arrays({"x": x, "y": y}), batch_size=b, output="numpy",
                         device="cpu" if pinnable.cuda_available() else None)
    assert ld.device == "cpu"
    assert ld.workers >= 1
    if "RANK" not in os.environ and "WORLD_SIZE" not in os.environ:
        assert (ld.rank, ld.world_size) == (0, 1)
    check_in_order(list(ld), x, y, b, seed)


def test_torch_device_argument(rng, seed):
    torch = pytest.importorskip("torch")
    n, b = sizes(rng)
    x, y = rows_xy(rng, n)
    ld = loader(pinnable.Arrays({"x": x, "y": y}), batch_size=b, device=torch.device("cpu"))
    assert ld.device == "cpu"
    check_in_order(list(ld), x, y, b, seed)
