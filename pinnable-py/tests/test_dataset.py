"""Dataset: a dataset written in Python (__len__, __getitem__)."""

import re

import numpy as np
import pytest

import pinnable
from _support import letters, loader, sizes


class Rows:
    def __init__(self, a, b, fail_at=None, message="", bad_at=None):
        self.a, self.b = a, b
        self.fail_at, self.message, self.bad_at = fail_at, message, bad_at

    def __len__(self):
        return len(self.a)

    def __getitem__(self, i):
        if i == self.fail_at:
            raise KeyError(self.message)
        a = self.a[i]
        if i == self.bad_at:
            a = np.concatenate([a, a[:1]])  # one more value than every other sample
        return {"feat_a": a, "label_b": np.array(self.b[i], dtype=np.int64)}


def data(rng, n):
    return rng.standard_normal((n, 5), dtype=np.float32), rng.integers(-(2**40), 2**40, size=n)


def test_python_dataset_batches(rng, seed):
    n, b = sizes(rng)
    a, lab = data(rng, n)
    src = pinnable.Dataset(Rows(a, lab))
    assert len(src) == n
    batches = list(loader(src, batch_size=b))
    assert len(batches) == -(-n // b)
    for i, batch in enumerate(batches):
        assert set(batch) == {"feat_a", "label_b"}
        assert batch["feat_a"].dtype == np.float32 and batch["label_b"].dtype == np.int64
        np.testing.assert_array_equal(batch["feat_a"], a[i * b : (i + 1) * b], err_msg=f"seed={seed}")
        np.testing.assert_array_equal(batch["label_b"], lab[i * b : (i + 1) * b], err_msg=f"seed={seed}")


def test_an_exception_in_getitem_reaches_the_user(rng, seed):
    n, b = sizes(rng)
    a, lab = data(rng, n)
    fail_at = int(rng.integers(1, n))  # Dataset(...) may read sample 0 to learn the fields
    message = f"kaboom {letters(rng, 12)}"
    ld = loader(pinnable.Dataset(Rows(a, lab, fail_at=fail_at, message=message)), batch_size=b)
    delivered = 0
    with pytest.raises((pinnable.Error, KeyError)) as info:
        for i, batch in enumerate(ld):
            np.testing.assert_array_equal(batch["feat_a"], a[i * b : (i + 1) * b])
            delivered += 1
    text = str(info.value)
    assert message in text, f"seed={seed}: the original message is lost: {text!r}"
    assert re.search(rf"\b{fail_at}\b", text), f"seed={seed}: index {fail_at} not named: {text!r}"
    assert delivered == fail_at // b, f"seed={seed}: the batches before the failing one"


def test_inconsistent_shapes_name_the_field(rng, seed):
    n, b = sizes(rng)
    a, lab = data(rng, n)
    bad_at = int(rng.integers(1, b))  # in the first batch, not its first sample
    ld = loader(pinnable.Dataset(Rows(a, lab, bad_at=bad_at)), batch_size=b)
    with pytest.raises((pinnable.Error, ValueError)) as info:
        list(ld)
    assert "feat_a" in str(info.value), f"seed={seed}: {info.value}"


def test_python_dataset_of_torch_tensors(rng, seed):
    torch = pytest.importorskip("torch")
    n, b = sizes(rng)
    a, lab = data(rng, n)

    class Torchy:
        def __len__(self):
            return n

        def __getitem__(self, i):
            return {"feat_a": torch.from_numpy(a[i].copy()), "label_b": torch.tensor(int(lab[i]))}

    for i, batch in enumerate(loader(pinnable.Dataset(Torchy()), batch_size=b)):
        np.testing.assert_array_equal(batch["feat_a"], a[i * b : (i + 1) * b], err_msg=f"seed={seed}")
        np.testing.assert_array_equal(batch["label_b"], lab[i * b : (i + 1) * b], err_msg=f"seed={seed}")
