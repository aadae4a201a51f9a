#!/usr/bin/env python3
"""Fails when the top-level modules of pinnable/src depend on each other in a cycle.

A module depends on another when any of its files names `crate::<other>` (in a `use` or a
path), or `super::<other>` from its top file. Tests (`#[cfg(test)]` files named tests.rs or
*_tests.rs, and the fuzz harness) are left out: a test may reach anywhere. Prints the
dependency graph's cycles, each as `a -> b -> a`.

Also fails when a `Data::` variant (the storage enum private to `tensor`) is named in any `.rs`
file of pinnable/src outside `tensor/`, tests included: other modules read a tensor's memory
through `tensor::Source`/`Memory` and place results through `tensor::Arena`. (The compiler
already refuses the enum outside `tensor`; this catches it being made visible again.)

    scripts/module-cycles.py            # check
    scripts/module-cycles.py --graph    # also print every edge
"""
import os
import re
import sys

SRC = os.path.join(os.path.dirname(__file__), "..", "pinnable", "src")


def top_modules():
    mods = {}
    for name in sorted(os.listdir(SRC)):
        path = os.path.join(SRC, name)
        if name.endswith(".rs") and name not in ("lib.rs", "fuzz.rs"):
            mods[name[:-3]] = [path]
        elif os.path.isdir(path):
            files = []
            for root, _, fs in os.walk(path):
                files += [os.path.join(root, f) for f in fs if f.endswith(".rs")]
            mods[name] = files
    return mods


def is_test(path):
    base = os.path.basename(path)
    return base == "tests.rs" or base.endswith("_tests.rs") or "/tests/" in path


def strip_tests(text):
    """Drops `#[cfg(test)] mod ... { ... }` blocks and comments."""
    text = re.sub(r"//[^\n]*", "", text)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i : m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def storage_variants_outside_tensor():
    """`file:line: text` for each `Data::` named outside pinnable/src/tensor/."""
    tensor = os.path.join(os.path.normpath(SRC), "tensor") + os.sep
    hits = []
    for root, _, fs in os.walk(os.path.normpath(SRC)):
        for f in sorted(fs):
            path = os.path.join(root, f)
            if not f.endswith(".rs") or path.startswith(tensor):
                continue
            for n, line in enumerate(open(path), 1):
                if re.search(r"\bData::", line):
                    hits.append(f"{os.path.relpath(path)}:{n}: {line.strip()}")
    return hits


def main():
    mods = top_modules()
    edges = {m: set() for m in mods}
    for m, files in mods.items():
        for f in files:
            if is_test(f):
                continue
            text = strip_tests(open(f).read())
            for other in re.findall(r"crate::(\w+)", text):
                if other in mods and other != m:
                    edges[m].add(other)
            # `crate::{a, b::c}` groups
            for group in re.findall(r"crate::\{([^}]*)\}", text):
                for other in re.findall(r"(?:^|,)\s*(\w+)", group):
                    if other in mods and other != m:
                        edges[m].add(other)
    if "--graph" in sys.argv:
        for m in sorted(edges):
            print(f"{m} -> {', '.join(sorted(edges[m]))}")
    # Tarjan's strongly connected components.
    index, low, stack, on, sccs = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    for comp in sccs:
        pairs = [f"{a} -> {b}" for a in comp for b in sorted(edges[a]) if b in comp]
        print(f"modules in a cycle: {', '.join(comp)} ({'; '.join(pairs)})", file=sys.stderr)
    hits = storage_variants_outside_tensor()
    for h in hits:
        print(f"storage variant named outside tensor/: {h}", file=sys.stderr)
    if hits:
        print(
            "read a tensor's memory through `Tensor::source()` (`Memory`) and make result "
            "storages through `tensor::Arena` or `Storage::{host, pinned, device}` instead",
            file=sys.stderr,
        )
    if sccs or hits:
        sys.exit(1)
    print(f"no cycle between the {len(mods)} top-level modules of pinnable/src")
    print("no storage variant (`Data::`) named outside pinnable/src/tensor/")


main()
