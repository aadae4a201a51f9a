"""Zero copy of outputs: pinnable.Tensor through DLPack to NumPy and torch, and torch output."""

import ctypes

import numpy as np
import pytest

import pinnable
from _support import loader, rows_xy, sizes

KDL_CPU = 1


def capsule_name(capsule) -> bytes:
    get = ctypes.pythonapi.PyCapsule_GetName
    get.restype = ctypes.c_char_p
    get.argtypes = [ctypes.py_object]
    return get(capsule)


def test_dlpack_output_is_shared_with_numpy(rng, seed):
    n, b = sizes(rng)
    x, y = rows_xy(rng, n)
    ld = loader(pinnable.Arrays({"x": x, "y": y}), batch_size=b, output="dlpack")
    held = []
    count = 0
    for i, batch in enumerate(ld):
        lo, hi = i * b, min(n, (i + 1) * b)
        assert set(batch) == {"x", "y"}
        for key, ref, dtype in (("x", x, "float32"), ("y", y, "int64")):
            t = batch[key]
            assert isinstance(t, pinnable.Tensor), f"{key} is a {type(t).__name__}"
            assert t.shape == ref[lo:hi].shape and isinstance(t.shape, tuple)
            assert t.dtype == dtype
            assert t.device == "cpu"
            assert t.__dlpack_device__() == (KDL_CPU, 0)
            assert isinstance(t.data_ptr, int) and t.data_ptr != 0
            a = np.from_dlpack(t)
            assert a.__array_interface__["data"][0] == t.data_ptr, f"{key}: NumPy got a copy"
            assert a.shape == t.shape and a.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(a, ref[lo:hi], err_msg=f"seed={seed} batch {i} {key}")
            held.append((a, lo, hi, key))
        count += 1
    assert count == len(ld)
    # The arrays keep the batches' memory: another epoch does not overwrite them.
    list(ld)
    for a, lo, hi, key in held:
        ref = x if key == "x" else y
        np.testing.assert_array_equal(a, ref[lo:hi], err_msg=f"seed={seed}: {key} rows {lo}..")


def test_dlpack_capsules_and_refusals(rng, seed):
    n, b = sizes(rng)
    x, y = rows_xy(rng, n)
    ld = loader(pinnable.Arrays({"x": x, "y": y}), batch_size=b, output="dlpack")
    batch = next(iter(ld))
    t = batch["x"]
    assert capsule_name(t.__dlpack__()) == b"dltensor"
    assert capsule_name(t.__dlpack__(max_version=(1, 0))) == b"dltensor_versioned"
    assert capsule_name(t.__dlpack__(max_version=(0, 8))) == b"dltensor"
    assert capsule_name(t.__dlpack__(dl_device=(KDL_CPU, 0), copy=False)) == b"dltensor"
    with pytest.raises(BufferError):
        t.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(2, 0))  # kDLCUDA: another device
    np.testing.assert_array_equal(np.from_dlpack(t), x[:b], err_msg=f"seed={seed}")


def test_dlpack_output_is_shared_with_torch(rng, seed):
    torch = pytest.importorskip("torch")
    n, b = sizes(rng)
    x, y = rows_xy(rng, n)
    ld = loader(pinnable.Arrays({"x": x, "y": y}), batch_size=b, output="dlpack")
    for i, batch in enumerate(ld):
        lo, hi = i * b, min(n, (i + 1) * b)
        for key, ref, dtype in (("x", x, torch.float32), ("y", y, torch.int64)):
            t = batch[key]
            tt = torch.from_dlpack(t)
            assert tt.data_ptr() == t.data_ptr, f"{key}: torch got a copy"
            assert tt.device == torch.device("cpu") and tt.dtype == dtype
            assert tuple(tt.shape) == t.shape
            np.testing.assert_array_equal(tt.numpy(), ref[lo:hi], err_msg=f"seed={seed} {i} {key}")


def test_torch_output(rng, seed):
    torch = pytest.importorskip("torch")
    n, b = sizes(rng)
    x, y = rows_xy(rng, n)
    ld = loader(pinnable.Arrays({"x": x, "y": y}), batch_size=b, output="torch")
    batches = list(ld)
    assert len(batches) == len(ld)
    for i, batch in enumerate(batches):
        lo, hi = i * b, min(n, (i + 1) * b)
        for key, ref, dtype in (("x", x, torch.float32), ("y", y, torch.int64)):
            t = batch[key]
            assert isinstance(t, torch.Tensor), f"{key} is a {type(t).__name__}"
            assert t.device == torch.device("cpu") and t.dtype == dtype
            np.testing.assert_array_equal(t.numpy(), ref[lo:hi], err_msg=f"seed={seed} {i} {key}")
