"""Resume: state_dict / load_state_dict go on from the next batch, exactly."""

import pickle

import numpy as np
import pytest

import pinnable
from _support import assert_plain, loader, rows_xy, sizes


def snapshot(batch):
    return {k: np.array(v, copy=True) for k, v in batch.items()}


def assert_same_batches(got, want, seed, what):
    assert len(got) == len(want), f"seed={seed} {what}: {len(got)} batches, want {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert set(g) == set(w)
        for k in w:
            np.testing.assert_array_equal(g[k], w[k], err_msg=f"seed={seed} {what}: batch {i} {k}")


def test_resume_goes_on_from_the_next_batch(rng, seed):
    n, b = sizes(rng, lo_batches=6, hi_batches=20)
    x, y = rows_xy(rng, n)
    s = int(rng.integers(0, 2**63))

    def make(batch_size=b):
        return loader(pinnable.Arrays({"x": x, "y": y}), batch_size=batch_size, shuffle=True, seed=s)

    full = make()
    k = int(rng.integers(1, len(full)))
    it = iter(full)
    run = [snapshot(next(it)) for _ in range(k)]
    state = full.state_dict()
    run += [snapshot(bt) for bt in it]
    assert len(run) == len(full)
    next_epoch = [snapshot(bt) for bt in full]

    assert isinstance(state, dict)
    assert_plain(state)
    state = pickle.loads(pickle.dumps(state))  # as a checkpoint stores it

    resumed = make()
    resumed.load_state_dict(state)
    assert_same_batches([snapshot(bt) for bt in resumed], run[k:], seed, f"resumed after {k}")
    assert_same_batches([snapshot(bt) for bt in resumed], next_epoch, seed, "the epoch after")


def test_state_dict_refused_by_another_batch_size(rng, seed):
    n, b = sizes(rng)
    x, y = rows_xy(rng, n)
    src = pinnable.Arrays({"x": x, "y": y})
    a = loader(src, batch_size=b, shuffle=True, seed=1)
    it = iter(a)
    next(it)
    state = a.state_dict()
    other = loader(src, batch_size=b + 1, shuffle=True, seed=1)
    with pytest.raises(pinnable.ConfigError) as info:
        other.load_state_dict(state)
        next(iter(other))
    # The crate's words: the setting, and both values.
    message = str(info.value)
    assert f"batch size {b}" in message and f"has {b + 1}" in message, f"seed={seed}: {message}"
