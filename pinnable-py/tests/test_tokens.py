"""TokenWindows (nanoGPT .bin shards) and PackedDocs (documents packed under a budget)."""

import math
from collections import Counter

import numpy as np
import pytest

import pinnable
from _support import EOT, find_window, loader, window_index, write_docs, write_tokens

IGNORE = -100


# --- TokenWindows ---------------------------------------------------------------------------


def check_windows(batches, shards, context, dtype, seed):
    """Every row of every batch: a window of `context` tokens of one shard, starting at a
    multiple of `context` (window j is tokens j*T .. j*T+T+1), y the same shifted by one.
    Returns the (shard, start) of every row, in order."""
    indexes = [window_index(t, context) for t in shards]
    found = []
    for i, batch in enumerate(batches):
        assert set(batch) == {"x", "y"}, sorted(batch)
        x, y = batch["x"], batch["y"]
        assert x.dtype == np.dtype(dtype) and y.dtype == np.dtype(dtype), (x.dtype, y.dtype)
        assert x.ndim == 2 and x.shape[1] == context and y.shape == x.shape, (x.shape, y.shape)
        np.testing.assert_array_equal(y[:, :-1], x[:, 1:], err_msg=f"seed={seed} batch {i}")
        for r in range(x.shape[0]):
            hits = [(s, find_window(ix, x[r])) for s, ix in enumerate(indexes)]
            hits = [(s, o) for s, o in hits if o is not None]
            assert len(hits) == 1, f"seed={seed} batch {i} row {r}: not a window of a shard"
            s, start = hits[0]
            assert start % context == 0, f"seed={seed}: a window starts at token {start}"
            assert start + context < len(shards[s]), f"seed={seed}: no token after the window"
            assert y[r, -1] == shards[s][start + context], f"seed={seed} batch {i} row {r}: y[-1]"
            found.append((s, start))
    return found


def test_token_windows_in_order(rng, seed, tmp_path):
    context = int(rng.integers(16, 65))
    n = int(rng.integers(2000, 6000))
    b = int(rng.integers(2, 17))
    path = tmp_path / "train.bin"
    tokens = write_tokens(path, rng, n)
    src = pinnable.TokenWindows(str(path), context)
    assert src.context == context
    windows = (n - 1) // context
    assert len(src) == windows, f"seed={seed}"
    ld = loader(src, batch_size=b)
    assert len(ld) == math.ceil(windows / b)
    batches = list(ld)
    assert len(batches) == len(ld)
    found = check_windows(batches, [tokens], context, "int64", seed)
    assert found == [(0, j * context) for j in range(windows)], f"seed={seed}"


def test_token_windows_shuffled_int32_cover_every_window_once(rng, seed, tmp_path):
    context = int(rng.integers(16, 65))
    n = int(rng.integers(2000, 6000))
    b = int(rng.integers(2, 17))
    path = tmp_path / "train.bin"
    tokens = write_tokens(path, rng, n)
    src = pinnable.TokenWindows(path, context, dtype="int32")
    ld = loader(src, batch_size=b, shuffle=True, seed=int(rng.integers(0, 2**63)))
    batches = list(ld)
    assert len(batches) == len(ld) == math.ceil(len(src) / b)
    found = check_windows(batches, [tokens], context, "int32", seed)
    windows = [(0, j * context) for j in range((n - 1) // context)]
    assert sorted(found) == windows, f"seed={seed}: not every window exactly once"
    assert found != windows, f"seed={seed}: shuffle=True delivered the windows in order"


def test_token_windows_never_cross_a_shard_end(rng, seed, tmp_path):
    context = int(rng.integers(16, 40))
    shards, paths = [], []
    for k in range(3):
        p = tmp_path / f"train_{k}.bin"
        shards.append(write_tokens(p, rng, int(rng.integers(context + 1, 20 * context))))
        paths.append(str(p))
    src = pinnable.TokenWindows(paths, context)
    want = [(s, j * context) for s, t in enumerate(shards) for j in range((len(t) - 1) // context)]
    assert len(src) == len(want), f"seed={seed}"
    b = int(rng.integers(2, 9))
    found = check_windows(list(loader(src, batch_size=b)), shards, context, "int64", seed)
    assert found == want, f"seed={seed}"


# --- PackedDocs -----------------------------------------------------------------------------


def segments(batch, dtype="int64"):
    """Checks one packed batch's fields and returns its documents, in order."""
    keys = {"input_ids", "labels", "position_ids", "cu_seqlens", "max_seqlen", "real_tokens"}
    assert keys <= set(batch), sorted(batch)
    ids, labels, pos, cu = (batch[k] for k in ("input_ids", "labels", "position_ids", "cu_seqlens"))
    for name, a in (("input_ids", ids), ("labels", labels), ("position_ids", pos)):
        assert a.dtype == np.dtype(dtype), f"{name}: {a.dtype}"
        assert a.ndim == 2 and a.shape[0] == 1, f"{name}: {a.shape}"
    total = ids.shape[1]
    assert labels.shape == pos.shape == (1, total)
    assert cu.dtype == np.int32 and cu.ndim == 1 and len(cu) >= 2, (cu.dtype, cu.shape)
    assert isinstance(batch["real_tokens"], int) and isinstance(batch["max_seqlen"], int)
    assert cu[0] == 0 and (np.diff(cu) > 0).all(), cu
    assert cu[-1] == batch["real_tokens"] == total, (cu[-1], batch["real_tokens"], total)
    assert batch["max_seqlen"] == int(np.diff(cu).max())
    docs = []
    for a, e in zip(cu[:-1], cu[1:]):
        doc = ids[0, a:e]
        # Hugging Face's DataCollatorWithFlattening: labels[t] == input_ids[t], but -100 at
        # each document's first token (the model shifts; no target crosses a boundary).
        assert labels[0, a] == IGNORE, f"labels[{a}] = {labels[0, a]} at a document start"
        np.testing.assert_array_equal(labels[0, a + 1 : e], doc[1:])
        np.testing.assert_array_equal(pos[0, a:e], np.arange(e - a))
        docs.append(tuple(int(t) for t in doc))
    return docs


def check_all_docs_once(batches, written, seed, dtype="int64"):
    got = []
    per_batch = []
    for batch in batches:
        docs = segments(batch, dtype)
        for d in docs:
            # Documents cut after each eot, the eot kept as their last token (nanoGPT's layout);
            # no document is longer than a row here, so none is split into pieces.
            assert d[-1] == EOT and EOT not in d[:-1], f"seed={seed}: a segment is not a document"
        got.extend(docs)
        per_batch.append([len(d) for d in docs])
    want = Counter(tuple(int(t) for t in d) for d in written)
    assert Counter(got) == want, f"seed={seed}: documents missing, repeated or altered"
    return per_batch


def test_packed_docs_cover_every_document_once(rng, seed, tmp_path):
    path = tmp_path / "docs.bin"
    docs = write_docs(path, rng, int(rng.integers(150, 300)))  # lengths 1..300 <= a row
    s = int(rng.integers(0, 2**63))
    src = pinnable.PackedDocs(str(path), eot=EOT, budget=pinnable.Budget.packed(512, 2), seed=s)
    assert len(src) == len(docs), f"seed={seed}: documents"
    ld = loader(src)
    assert len(ld) == src.batches, f"seed={seed}"
    batches = list(ld)
    assert len(batches) == len(ld)
    lengths = check_all_docs_once(batches, docs, seed)
    for k, lens in enumerate(lengths):
        # Two rows of 512: the batch is row 0's documents, then row 1's.
        cuts = np.concatenate([[0], np.cumsum(lens)])
        assert any(c <= 512 and cuts[-1] - c <= 512 for c in cuts), (
            f"seed={seed}: batch {k} ({lens}) is not two rows of at most 512 tokens"
        )
    # The plan follows its seed: the same seed, the same batches.
    same = loader(pinnable.PackedDocs(path, eot=EOT, budget=pinnable.Budget.packed(512, 2), seed=s))
    again = [segments(bt) for bt in same]
    assert again == [segments(bt) for bt in batches], f"seed={seed}: same seed, other batches"


def test_packed_docs_token_budget_and_int32(rng, seed, tmp_path):
    path = tmp_path / "docs.bin"
    docs = write_docs(path, rng, int(rng.integers(100, 200)))
    budget = int(rng.integers(300, 900))
    src = pinnable.PackedDocs(
        [path], eot=EOT, budget=pinnable.Budget.tokens(budget), seed=int(rng.integers(0, 2**63))
    )
    lengths = check_all_docs_once(list(loader(src)), docs, seed)
    for lens in lengths:  # count_padding: the longest document times their number
        assert max(lens) * len(lens) <= budget, f"seed={seed}: {lens} over {budget}"

    src = pinnable.PackedDocs(
        path, eot=EOT, budget=pinnable.Budget.tokens(budget, count_padding=False), dtype="int32"
    )
    lengths = check_all_docs_once(list(loader(src)), docs, seed, dtype="int32")
    for lens in lengths:
        assert sum(lens) <= budget, f"seed={seed}: {lens} over {budget}"


def test_packed_docs_refuse_a_batch_size(rng, tmp_path):
    path = tmp_path / "docs.bin"
    write_docs(path, rng, 40)
    src = pinnable.PackedDocs(path, eot=EOT, budget=pinnable.Budget.packed(512, 2))
    with pytest.raises(pinnable.ConfigError) as info:
        ld = loader(src, batch_size=int(rng.integers(2, 9)))
        next(iter(ld))
    assert "batch_size" in str(info.value), str(info.value)


def test_packed_docs_fixed_shape_and_seq_idx(rng, seed, tmp_path):
    path = tmp_path / "docs.bin"
    docs = write_docs(path, rng, int(rng.integers(80, 160)))
    rows, row = 2, 512
    src = pinnable.PackedDocs(path, eot=EOT, budget=pinnable.Budget.packed(row, rows),
                              seed=int(rng.integers(0, 2**63)), fixed_shape=True, seq_idx=True)
    ld = loader(src)
    batches = list(ld)
    assert len(batches) == len(ld) == src.batches
    cu_len = None
    got = []
    for k, batch in enumerate(batches):
        ids, labels, pos = batch["input_ids"][0], batch["labels"][0], batch["position_ids"][0]
        cu, mask, seq = batch["cu_seqlens"], batch["padding_mask"], batch["seq_idx"]
        real = batch["real_tokens"]
        assert ids.shape == labels.shape == pos.shape == (rows * row,), f"seed={seed} batch {k}"
        assert mask.dtype == np.uint8 and mask.shape == (1, rows * row)
        assert seq.dtype == np.int32 and seq.shape == (1, rows * row)
        cu_len = cu_len or len(cu)
        assert len(cu) == cu_len, f"seed={seed}: cu_seqlens is {len(cu)} long in batch {k}, {cu_len} before"
        # Real tokens first, then padding: mask 0, labels -100, positions 0, seq_idx -1.
        np.testing.assert_array_equal(mask[0], (np.arange(rows * row) < real).astype(np.uint8))
        assert (labels[real:] == IGNORE).all() and (pos[real:] == 0).all()
        assert (seq[0, real:] == -1).all()
        # cu_seqlens padded by repeating its last value, the real tokens.
        ends = np.flatnonzero(np.diff(cu) > 0) + 1
        pieces = len(ends)
        assert cu[0] == 0 and (np.diff(cu) >= 0).all() and (cu[pieces:] == real).all(), cu[: pieces + 2]
        for j, (a, e) in enumerate(zip(cu[:pieces], cu[1 : pieces + 1])):
            assert labels[a] == IGNORE
            np.testing.assert_array_equal(labels[a + 1 : e], ids[a + 1 : e])
            np.testing.assert_array_equal(pos[a:e], np.arange(e - a))
            assert (seq[0, a:e] == j).all(), f"seed={seed}: seq_idx of document {j}"
            got.append(tuple(int(t) for t in ids[a:e]))
        assert batch["max_seqlen"] == int(np.diff(cu[: pieces + 1]).max())
    assert Counter(got) == Counter(tuple(int(t) for t in d) for d in docs), f"seed={seed}"
