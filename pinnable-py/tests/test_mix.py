"""Mix: sources read in set proportions, per sample or in exact counts per batch."""

import numpy as np

import pinnable
from _support import binomial_bound, loader


def source(rng, n, sid):
    x = rng.standard_normal((n, 4), dtype=np.float32)
    src = np.full(n, sid, dtype=np.int64)
    return x, pinnable.Arrays({"x": x, "src": src})


def rows_of(batch, tables):
    """The source of every row of `batch`, checked against that source's rows."""
    out = []
    for row, sid in zip(batch["x"], batch["src"]):
        sid = int(sid)
        assert sid in tables, f"source id {sid}"
        assert row.tobytes() in tables[sid], f"a row not of source {sid}"
        out.append(sid)
    return out


def test_weighted_mix_shares(rng, seed):
    na, nb = int(rng.integers(800, 1200)), int(rng.integers(1800, 2200))
    xa, a = source(rng, na, 0)
    xb, b = source(rng, nb, 1)
    mix = pinnable.Mix([(a, 3.0), (b, 1.0)])
    # all_exhausted: b, a quarter of the draws, sets the length (a by size alone: ~1/3).
    assert len(mix) == max(-(-na * 4 // 3), nb * 4) == nb * 4, f"seed={seed}: {len(mix)} samples"
    tables = {0: {r.tobytes() for r in xa}, 1: {r.tobytes() for r in xb}}
    ld = loader(mix, batch_size=500, shuffle=True, seed=int(rng.integers(0, 2**63)))
    sids = [s for batch in ld for s in rows_of(batch, tables)]
    assert len(sids) == len(mix)
    from_a = sids.count(0)
    bound = binomial_bound(len(sids), 0.75)  # 6 sigma: ~1e-9 to fail by chance
    assert abs(from_a - 0.75 * len(sids)) <= bound, (
        f"seed={seed}: {from_a} of {len(sids)} from the source of weight 3 (want 3/4 +- {bound:.0f})"
    )


def test_per_batch_counts_are_exact(rng, seed):
    na, nb = int(rng.integers(200, 400)), int(rng.integers(30, 60))
    xa, a = source(rng, na, 0)
    xb, b = source(rng, nb, 1)
    mix = pinnable.Mix([(a, 3), (b, 1)], per_batch=True)
    tables = {0: {r.tobytes() for r in xa}, 1: {r.tobytes() for r in xb}}
    ld = loader(mix, batch_size=4, shuffle=True, seed=int(rng.integers(0, 2**63)))
    # all_exhausted: the source needing most batches to be read through sets the count.
    batches = max(-(-na // 3), nb)
    assert len(ld) == batches, f"seed={seed}"
    count = 0
    seen_a = set()
    for batch in ld:
        sids = rows_of(batch, tables)
        assert sorted(sids) == [0, 0, 0, 1], f"seed={seed}: batch {count} holds sources {sids}"
        seen_a.update(r.tobytes() for r, s in zip(batch["x"], sids) if s == 0)
        count += 1
    assert count == batches
    assert seen_a == tables[0], f"seed={seed}: source a not read through"
