#!/usr/bin/env python3
"""Lists every public path of the `pinnable` crate from rustdoc's JSON, and fails when one item
is reachable by more than one path (a module made public *and* its items re-exported elsewhere).

    scripts/public-api.py target/doc/pinnable.json               # print the paths, check
    scripts/public-api.py target/doc/pinnable.json --check FILE  # also compare with a list

The JSON comes from rustdoc's unstable JSON output (scripts/public-api.sh makes it):

    RUSTC_BOOTSTRAP=1 cargo rustdoc -p pinnable --lib --all-features -- \
        -Z unstable-options --output-format json

Items hidden from the docs (`#[doc(hidden)]`, the derive's `__private`) are not public API.
Re-exports of another crate's items (the derive macros) count as paths of ours.
"""
import json
import sys


def main():
    doc = json.load(open(sys.argv[1]))
    index = doc["index"]
    paths = {}  # item id -> [path, ...]
    kinds = {}  # "path kind" -> item id

    def hidden(item):
        return "doc(hidden)" in json.dumps(item.get("attrs") or []).replace(" ", "")

    def kind(item):
        return next(iter(item["inner"])) if isinstance(item["inner"], dict) else item["inner"]

    def visit_module(mod_id, prefix, seen):
        if mod_id in seen:
            return
        seen = seen | {mod_id}
        module = index[str(mod_id)]["inner"]["module"]
        for child in module["items"]:
            item = index.get(str(child))
            if item is None or item.get("visibility") != "public" or hidden(item):
                continue
            k = kind(item)
            if k == "use":
                use = item["inner"]["use"]
                target = use.get("id")
                if use.get("is_glob"):
                    if target is not None and str(target) in index:
                        visit_module(target, prefix, seen)
                    continue
                name = use["name"]
                path = f"{prefix}::{name}"
                titem = index.get(str(target)) if target is not None else None
                if titem is not None and hidden(titem):
                    continue
                key = str(target) if target is not None else path
                paths.setdefault(key, []).append(path)
                kinds[path + " " + (kind(titem) if titem is not None else "macro")] = key
                if titem is not None and kind(titem) == "module":
                    visit_module(target, path, seen)
            elif k == "module":
                path = f"{prefix}::{item['name']}"
                paths.setdefault(str(child), []).append(path)
                kinds[path + " module"] = str(child)
                visit_module(child, path, seen)
            elif k in ("impl",):
                continue
            else:
                path = f"{prefix}::{item['name']}"
                paths.setdefault(str(child), []).append(path)
                kinds[path + " " + k] = str(child)

    visit_module(doc["root"], "pinnable", frozenset())
    listed = sorted(kinds)
    dups = sorted((sorted(ps) for ps in paths.values() if len(ps) > 1))
    for p in listed:
        print(p)
    status = 0
    for ps in dups:
        print(f"one item, {len(ps)} paths: {', '.join(ps)}", file=sys.stderr)
        status = 1
    if "--check" in sys.argv:
        want = [l.strip() for l in open(sys.argv[sys.argv.index("--check") + 1]) if l.strip() and not l.startswith("#")]
        if want != listed:
            added = sorted(set(listed) - set(want))
            removed = sorted(set(want) - set(listed))
            print("the public API differs from the checked-in list:", file=sys.stderr)
            for p in added:
                print(f"  + {p}", file=sys.stderr)
            for p in removed:
                print(f"  - {p}", file=sys.stderr)
            status = 1
    sys.exit(status)


main()
