#!/usr/bin/env bash
# Checks that every public item of `pinnable` has exactly one path, and that the public API is
# the one listed in `pinnable/public-api.txt` (so a change to it shows in review), with every
# cargo feature on. Reads rustdoc's JSON output.
#
#   scripts/public-api.sh            # check
#   scripts/public-api.sh --bless    # rewrite the list after an intended change
#
# rustdoc's JSON output is unstable. The toolchain that builds everything else makes it, with
# RUSTC_BOOTSTRAP=1 for this one rustdoc call, so the check reuses the every-feature build's
# dependency metadata (CI runs it after `cargo doc --all-features`: seconds) instead of checking
# burn's, candle's and object_store's trees again under a nightly toolchain (over ten minutes
# on two cores). `candle-cuda` compiles candle's kernels: run in the environment
# `scripts/cuda-build-env.sh` sets up, as CI does, or set PINNABLE_API_FEATURES to a list.
set -euo pipefail
cd "$(dirname "$0")/.."
features=${PINNABLE_API_FEATURES:-all}
if [ "$features" = all ]; then
    flags=(--all-features)
else
    flags=(--features "$features")
fi
RUSTC_BOOTSTRAP=1 cargo rustdoc -q -p pinnable --lib "${flags[@]}" -- \
    -Z unstable-options --output-format json -A warnings
json="${CARGO_TARGET_DIR:-$PWD/target}/doc/pinnable.json"
list=pinnable/public-api.txt
if [ "${1:-}" = "--bless" ]; then
    {
        echo "# Every public path of pinnable (every feature) and what it names."
        echo "# Checked by scripts/public-api.sh; rewrite with scripts/public-api.sh --bless."
        python3 scripts/public-api.py "$json"
    } >"$list"
    echo "wrote $list"
else
    python3 scripts/public-api.py "$json" --check "$list" >/dev/null
    echo "public API: $(grep -vc '^#' "$list") paths, one for each item, as listed in $list"
fi
