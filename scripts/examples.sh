#!/usr/bin/env bash
# Runs the examples once each, as CI does, and fails if one fails. Each example checks what it
# prints; without a GPU its GPU part prints `skipped: <reason>` (with PINNABLE_REQUIRE_GPU=1 a
# missing GPU fails it).
#
#   scripts/examples.sh                   # the examples that need no cargo feature
#   scripts/examples.sh --all-features    # the examples that need a feature, with every feature
#   scripts/examples.sh --features image  # the examples that need a feature, with those on
#   scripts/examples.sh --all-features --example candle_batch   # the ones named, with those on
#
# The binaries come from `cargo build --examples` with the same options, which after the
# `cargo test` of those options builds nothing: run right after it, this costs only the runs.
# Two run smaller than by default, for debug builds on two cores: multi_gpu times 2 batches a
# device (a throughput figure, not a check), and image_folder decodes 6 JPEGs (500×375, four
# epochs), not 192 (4 min in a debug build).
set -euo pipefail
cd "$(dirname "$0")/.."

gated=$([ $# -gt 0 ] && echo 1 || echo 0)
json=$(mktemp)
trap 'rm -f "$json"' EXIT
# Every example, unless the arguments name some.
every=--examples
case " $* " in *" --example "*) every= ;; esac
cargo build --workspace $every "$@" --message-format=json-render-diagnostics >"$json"
# The examples built, and whether each needs a feature: `name path` per line.
list=$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
gated = {t["name"] for p in json.load(sys.stdin)["packages"] for t in p["targets"]
         if "example" in t["kind"] and t.get("required-features")}
built = {}
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["kind"] == ["example"] \
            and m.get("executable") and (m["target"]["name"] in gated) == (sys.argv[2] == "1"):
        built[m["target"]["name"]] = m["executable"]
for name in sorted(built):
    print(name, built[name])
' "$json" "$gated")

failed=()
while read -r name exe; do
    [ -n "$name" ] || continue
    echo "=== example $name"
    started=$(date +%s%N)
    args=()
    case $name in
        image_folder) args=(--classes 2 --per-class 3 --batch-size 4) ;;
    esac
    if PINNABLE_MULTI_GPU_BATCHES=${PINNABLE_MULTI_GPU_BATCHES:-2} "$exe" "${args[@]}" </dev/null; then
        ms=$((($(date +%s%N) - started) / 1000000))
        echo "=== example $name: passed in $((ms / 1000)).$(printf %03d $((ms % 1000))) s"
    else
        echo "=== example $name: FAILED"
        failed+=("$name")
    fi
done <<<"$list"
if [ ${#failed[@]} -gt 0 ]; then
    echo "examples failed: ${failed[*]}" >&2
    exit 1
fi
