"""Hugging Face's DataCollatorWithFlattening: the reference for tests/packing.rs, and the timing
twin of benches/packing.rs.

(a) Reference. `--write-reference DIR` writes, for a small seeded set of documents, what
    `DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True,
    return_position_ids=True)` returns (`return_tensors="np"`) for batches of them, as .npy files:

        docs.npy            uint16, every document's tokens one after another
        lengths.npy         int64, each document's length
        batch_sizes.npy     int64, the documents in each batch
        batch_docs.npy      int64, the documents of every batch, batch after batch, in order
        batch<k>_<field>.npy  the collator's output for batch k: input_ids, labels,
                            position_ids (int64 [1, total]), seq_idx (int32 [1, total]),
                            cu_seq_lens_q (int32 [n + 1]), max_length_q (int64 [1])

    tests/packing.rs (batches_equal_hugging_faces_collator_output) packs the same documents in
    the same order and compares every value and dtype; it skips while the files are absent.

        python3 bench/packing_twin.py --write-reference tests/data/packing

(b) Timing. Long-tailed documents from `$PINNABLE_BENCH_DATA/pinnable-docs.bin` (the system's
    temporary directory by default): u16 tokens, each document ended by the separator 50256, as
    nanoGPT's prepare.py writes them. benches/packing.rs writes the file when absent and this
    script reuses it (or writes its own, which the bench then reuses), so both time the same
    documents. Consecutive documents fill batches of B x 8192 tokens (B = 8 and 64); each batch
    is the collator's call on the documents as lists of ids (what a tokenized dataset yields),
    then `.pin_memory().to('cuda', non_blocking=True)` of every tensor, then a synchronize.
    Writes `packing_collator_<B>x8192 <seconds>` lines (medians) to --out; the bench reads them.

        python3 bench/packing_twin.py --out bench-out/packing_twin.txt
"""
import argparse
import os
import statistics
import tempfile
import time

import numpy as np

SEPARATOR = 50256
ROW = 8192
SIZES = [8, 64]


def collator():
    from transformers import DataCollatorWithFlattening

    return DataCollatorWithFlattening(
        return_flash_attn_kwargs=True, return_seq_idx=True, return_position_ids=True
    )


def write_reference(out):
    """A small seeded set of documents and the collator's output for batches of them."""
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(29)
    n = 60
    # Long-tailed, with a few one-token documents (whose labels are only the separator).
    lengths = np.minimum(1 + (rng.pareto(1.2, size=n) * 20).astype(np.int64), 700)
    lengths[[3, 17]] = 1
    docs = [rng.integers(0, 50257, size=int(k), dtype=np.uint16) for k in lengths]
    order = rng.permutation(n)
    sizes = [1, 2, 3, 5, 8, 13, 28]
    assert sum(sizes) == n
    np.save(os.path.join(out, "docs.npy"), np.concatenate(docs).astype(np.uint16))
    np.save(os.path.join(out, "lengths.npy"), lengths.astype(np.int64))
    np.save(os.path.join(out, "batch_sizes.npy"), np.array(sizes, dtype=np.int64))
    np.save(os.path.join(out, "batch_docs.npy"), order.astype(np.int64))
    c = collator()
    first = 0
    for k, size in enumerate(sizes):
        members = order[first:first + size]
        first += size
        features = [{"input_ids": [int(t) for t in docs[d]]} for d in members]
        batch = c(features, return_tensors="np")
        for field in ["input_ids", "labels", "position_ids", "seq_idx", "cu_seq_lens_q"]:
            np.save(os.path.join(out, f"batch{k}_{field}.npy"), np.asarray(batch[field]))
        max_length = np.array([int(batch["max_length_q"])], dtype=np.int64)
        np.save(os.path.join(out, f"batch{k}_max_length_q.npy"), max_length)
    print(f"wrote {len(sizes)} batches of {n} documents to {out}")


def docs_file(path, tokens):
    """`path` of about `tokens` u16 tokens in long-tailed documents, each ended by SEPARATOR;
    kept when it exists (the Rust bench may have written it)."""
    if os.path.exists(path):
        return path
    rng = np.random.default_rng(1337)
    parts, n = [], 0
    while n < tokens:
        # Pareto lengths, shape 1.3, from 100 tokens, at most a row (as the bench draws them).
        u = rng.random(100_000)
        lengths = np.minimum(np.floor(100.0 / (1.0 - u) ** (1.0 / 1.3)), ROW).astype(np.int64)
        for k in lengths:
            doc = rng.integers(0, SEPARATOR, size=int(k), dtype=np.uint16)
            doc[-1] = SEPARATOR
            parts.append(doc)
            n += int(k)
            if n >= tokens:
                break
    np.concatenate(parts).tofile(path)
    return path


def split(path):
    data = np.fromfile(path, dtype=np.uint16)
    ends = np.flatnonzero(data == SEPARATOR) + 1
    starts = np.concatenate([[0], ends[:-1]])
    return [data[s:e] for s, e in zip(starts, ends)]


def batches(docs, budget):
    """Consecutive documents filling `budget` tokens (a longer one alone is skipped)."""
    out, cur, n = [], [], 0
    for d in docs:
        if len(d) > ROW:
            continue
        if n + len(d) > budget and cur:
            out.append(cur)
            cur, n = [], 0
        cur.append(d)
        n += len(d)
    if cur:
        out.append(cur)
    return out


def timing(out, tokens, warmup, measured):
    import torch

    path = os.path.join(os.environ.get("PINNABLE_BENCH_DATA", tempfile.gettempdir()), "pinnable-docs.bin")
    docs = split(docs_file(path, tokens))
    # Lists of ids, as a tokenized dataset gives them to the collator.
    docs = [d.tolist() for d in docs]
    c = collator()
    lines = []
    for rows in SIZES:
        plan = batches(docs, rows * ROW)
        real = sum(len(d) for b in plan for d in b) / (len(plan) * rows * ROW)
        times = []
        for i in range(warmup + measured):
            b = plan[i % len(plan)]
            t0 = time.perf_counter()
            batch = c([{"input_ids": d} for d in b], return_tensors="pt")
            moved = {
                k: v.pin_memory().to("cuda", non_blocking=True)
                for k, v in batch.items()
                if isinstance(v, torch.Tensor)
            }
            torch.cuda.synchronize()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
            del moved
        med = statistics.median(times)
        print(f"collator + pin_memory + to(cuda) {rows}x{ROW}: {med * 1e3:.2f} ms a batch "
              f"(real tokens {real:.1%} of the budget, {len(plan)} batches of documents)")
        lines.append(f"packing_collator_{rows}x{ROW} {med:.6f}")
    if out:
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        with open(out, "w") as f:
            f.write("# Hugging Face DataCollatorWithFlattening + pin_memory + to(cuda), median s/batch\n")
            f.write("\n".join(lines) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write-reference", metavar="DIR", help="write the test fixture into DIR and stop")
    p.add_argument("--out", help="where to write the timing lines")
    p.add_argument("--tokens", type=int, default=int(os.environ.get("PINNABLE_BENCH_TOKENS", 32 << 20)))
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batches", type=int, default=20)
    a = p.parse_args()
    if a.write_reference:
        write_reference(a.write_reference)
        return
    timing(a.out, a.tokens, a.warmup, a.batches)


if __name__ == "__main__":
    main()
