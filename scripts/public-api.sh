#!/usr/bin/env bash
# Checks that every public item of `pinnable` has exactly one path, and that the public API is
# the one listed in `pinnable/public-api.txt` (so a change to it shows in review). Reads
# rustdoc's JSON output, which needs the nightly toolchain.
#
#   scripts/public-api.sh            # check
#   scripts/public-api.sh --bless    # rewrite the list after an intended change
set -euo pipefail
cd "$(dirname "$0")/.."
# burn, candle and remote are left out: their dependency trees take minutes to check (object_store's
# over three on two cores), for four items.
features=image,ndarray,dlpack
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target-nightly}"
cargo +nightly rustdoc -q -p pinnable --lib --features "$features" -- \
    -Z unstable-options --output-format json -A warnings
json="$CARGO_TARGET_DIR/doc/pinnable.json"
list=pinnable/public-api.txt
if [ "${1:-}" = "--bless" ]; then
    {
        echo "# Every public path of pinnable (features: $features) and what it names."
        echo "# Checked by scripts/public-api.sh; rewrite with scripts/public-api.sh --bless."
        python3 scripts/public-api.py "$json"
    } >"$list"
    echo "wrote $list"
else
    python3 scripts/public-api.py "$json" --check "$list" >/dev/null
    echo "public API: $(grep -vc '^#' "$list") paths, one for each item, as listed in $list"
fi
