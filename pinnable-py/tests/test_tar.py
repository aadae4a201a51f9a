"""TarShards of .npy members: every sample once an epoch, with its label."""

from collections import Counter

import numpy as np

import pinnable
from _support import loader, npy_bytes, write_tar


def test_tar_shards_of_npy_samples(rng, seed, tmp_path):
    want = Counter()
    shape = (int(rng.integers(1, 5)), int(rng.integers(1, 5)))
    for s in range(3):
        members = []
        for k in range(int(rng.integers(5, 16))):
            key = f"s{s}_{k:04d}"
            a = rng.standard_normal(shape).astype(np.float32)
            label = int(rng.integers(0, 10**6))
            members += [(f"{key}.npy", npy_bytes(a)), (f"{key}.cls", str(label).encode("ascii"))]
            want[(a.tobytes(), label)] += 1
        write_tar(tmp_path / f"shard-{s:03d}.tar", members)
    total = sum(want.values())
    src = pinnable.TarShards(str(tmp_path / "shard-{000..002}.tar"), npy="npy", label="cls")
    assert len(src) == total, f"seed={seed}"
    b = int(rng.integers(2, 8))
    ld = loader(src, batch_size=b, shuffle=True, seed=int(rng.integers(0, 2**63)))
    for epoch in range(2):
        seen = Counter()
        batches = list(ld)
        assert len(batches) == len(ld), f"seed={seed} epoch {epoch}"
        for batch in batches:
            assert set(batch) == {"npy", "cls"}, sorted(batch)
            x, y = batch["npy"], batch["cls"]
            assert x.dtype == np.float32 and x.shape[1:] == shape and y.dtype == np.int64
            for row, label in zip(x, y):
                seen[(np.ascontiguousarray(row).tobytes(), int(label))] += 1
        assert seen == want, f"seed={seed} epoch {epoch}: not every sample once with its label"
