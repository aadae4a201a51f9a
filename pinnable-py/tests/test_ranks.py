"""Ranks: each rank's part of an epoch, as PyTorch's DistributedSampler deals it."""

from collections import Counter

import pytest

import pinnable
from _support import loader, row_index, rows_xy


def rank_rows(ld, index):
    return [index[int(v)] for batch in ld for v in batch["y"]]


def setup(rng):
    w = int(rng.integers(2, 6))
    n = w * int(rng.integers(20, 60)) + int(rng.integers(1, w))  # uneven across ranks
    b = int(rng.integers(2, 9))
    x, y = rows_xy(rng, n)
    return w, n, b, pinnable.Arrays({"x": x, "y": y}), row_index(y)


def test_ranks_cover_every_row_padded_from_the_start(rng, seed):
    w, n, b, src, index = setup(rng)
    per = -(-n // w)
    pad = per * w - n
    for shuffle in (False, True):
        s = int(rng.integers(0, 2**63))
        parts = []
        for r in range(w):
            ld = loader(src, batch_size=b, shuffle=shuffle, seed=s, rank=r, world_size=w)
            assert (ld.rank, ld.world_size) == (r, w)
            assert len(ld) == -(-per // b), f"seed={seed}"
            parts.append(rank_rows(ld, index))
            assert len(parts[-1]) == per, f"seed={seed}: rank {r} got {len(parts[-1])} samples"
        counts = Counter(i for p in parts for i in p)
        assert set(counts) == set(range(n)), f"seed={seed} shuffle={shuffle}: rows missing"
        # Without drop_last the epoch's order is padded to a multiple of w by repeating its
        # start: the first sample of ranks 0..pad-1 appears twice, every other once.
        twice = {i for i, c in counts.items() if c == 2}
        assert max(counts.values()) <= 2
        assert twice == {parts[r][0] for r in range(pad)}, f"seed={seed} shuffle={shuffle}"
        if not shuffle:  # rank r takes every w-th index from r
            order = list(range(n)) + list(range(pad))
            for r in range(w):
                assert parts[r] == order[r::w], f"seed={seed}: rank {r}"


def test_ranks_with_drop_last_are_disjoint(rng, seed):
    w, n, b, src, index = setup(rng)
    s = int(rng.integers(0, 2**63))
    parts = [
        rank_rows(loader(src, batch_size=b, shuffle=True, seed=s, rank=r, world_size=w, drop_last=True), index)
        for r in range(w)
    ]
    per = (n // w) // b * b  # each rank: n // w samples, its short last batch dropped
    assert all(len(p) == per for p in parts), f"seed={seed}: {[len(p) for p in parts]}"
    rows = [i for p in parts for i in p]
    assert len(set(rows)) == len(rows), f"seed={seed}: a row on two ranks"


def test_rank_from_environment(rng, seed, monkeypatch):
    w, n, b, src, index = setup(rng)
    r = int(rng.integers(0, w))
    monkeypatch.setenv("RANK", str(r))
    monkeypatch.setenv("WORLD_SIZE", str(w))
    monkeypatch.setenv("LOCAL_RANK", "0")
    s = int(rng.integers(0, 2**63))
    env = loader(src, batch_size=b, shuffle=True, seed=s)
    assert (env.rank, env.world_size) == (r, w), f"seed={seed}"
    explicit = loader(src, batch_size=b, shuffle=True, seed=s, rank=r, world_size=w)
    assert rank_rows(env, index) == rank_rows(explicit, index), f"seed={seed}"


def test_bad_ranks_are_refused(rng):
    w, n, b, src, index = setup(rng)
    for rank, world in ((w, w), (w + 3, w), (0, 0)):
        with pytest.raises(pinnable.ConfigError) as info:
            ld = loader(src, batch_size=b, rank=rank, world_size=world)
            next(iter(ld))
        assert str(world) in str(info.value) and "rank" in str(info.value), str(info.value)
