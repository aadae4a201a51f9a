#!/usr/bin/env python3
"""Compares two builds' bench tables, row by row: `compare_runs.py BEFORE.md AFTER.md [...]`
takes pairs of the markdown tables `./run.sh benches/<name>` writes (rounds alternated by the
caller), matches rows by their section and the cells before the figure, and prints each row's
speed after / before (a time's inverse for `ms` figures), the geometric mean over the pairs
given, and the rows below 0.95×.

    compare_runs.py out-before-1/loader.md out-after-1/loader.md out-before-2/loader.md out-after-2/loader.md
"""
import math
import re
import sys

FIGURES = ("per batch", "ours", "samples/s", "images/s", "items/s")


def rows(path):
    """(key, speed) for every row of every table whose header names a figure."""
    out = {}
    section = ""
    header = None
    for line in open(path, encoding="utf-8"):
        line = line.rstrip("\n")
        if line.startswith("#"):
            section, header = line.lstrip("# "), None
            continue
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if header is None:
            header = cells
            continue
        if set(line) <= set("|- "):
            continue
        col = next((i for i, h in enumerate(header) if any(f in h for f in FIGURES)), None)
        if col is None or col >= len(cells):
            continue
        m = re.search(r"([0-9][0-9 ]*\.?[0-9]*)", cells[col].replace("**", ""))
        if not m:
            continue
        value = float(m.group(1).replace(" ", ""))
        if value <= 0:
            continue
        time = "ms" in cells[col] or "ms" in header[col]
        key = (section[:60], header[col], tuple(c.replace("**", "") for c in cells[:col]))
        out[key] = 1.0 / value if time else value
    return out


def main():
    paths = sys.argv[1:]
    pairs = [(rows(paths[i]), rows(paths[i + 1])) for i in range(0, len(paths) - 1, 2)]
    keys = [k for k in pairs[0][0] if all(k in b and k in a for b, a in pairs)]
    low = []
    for k in keys:
        ratios = [a[k] / b[k] for b, a in pairs]
        g = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        label = " / ".join(x for x in k[2] if x) or k[1]
        print(f"{g:6.3f}  ({', '.join(f'{r:.3f}' for r in ratios)})  {k[0][:40]} | {label}")
        if g < 0.95:
            low.append((g, k))
    print(f"{len(keys)} rows; below 0.95x: {len(low)}")


if __name__ == "__main__":
    main()
