"""Npy: rows of .npy files."""

import math

import numpy as np
import pytest

import pinnable
from _support import letters, loader, sizes


def test_npy_batches_are_the_files_rows(rng, seed, tmp_path):
    n, b = sizes(rng)
    arrays = {
        "x": rng.standard_normal((n, 3), dtype=np.float32),
        "y": rng.integers(-(2**40), 2**40, size=n, dtype=np.int64),
        "z": rng.integers(0, 256, size=(n, 5, 2), dtype=np.uint8),
    }
    files = {}
    for i, (key, a) in enumerate(arrays.items()):
        path = tmp_path / f"{key}.npy"
        np.save(path, a)
        files[key] = str(path) if i % 2 == 0 else path  # str and PathLike both taken
    src = pinnable.Npy(files)
    assert len(src) == n
    ld = loader(src, batch_size=b)
    assert len(ld) == math.ceil(n / b)
    batches = list(ld)
    assert len(batches) == len(ld)
    for i, batch in enumerate(batches):
        assert set(batch) == set(arrays)
        for key, a in arrays.items():
            got = batch[key]
            assert got.dtype == a.dtype, f"{key}: {got.dtype}"
            np.testing.assert_array_equal(
                got, a[i * b : (i + 1) * b], err_msg=f"seed={seed} batch {i} {key}"
            )


def test_npy_missing_file_names_it(rng, tmp_path):
    n = 10
    np.save(tmp_path / "x.npy", rng.standard_normal((n, 2)).astype(np.float32))
    missing = tmp_path / f"missing_{letters(rng, 10)}.npy"
    with pytest.raises(pinnable.Error) as info:
        ld = loader(pinnable.Npy({"x": tmp_path / "x.npy", "y": missing}), batch_size=2)
        next(iter(ld))
    assert missing.name in str(info.value), str(info.value)
