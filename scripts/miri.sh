#!/usr/bin/env bash
# Runs the host-side unit tests under Miri, over the heap test-double pool (no OS or driver
# call): the pinned allocator (size classes, free lists, pending fences, budget, stats), the
# loader (sampler, collation, the worker/transfer threads, shutdown, panics in user code on
# them, positions), the `.npy` and token-shard header parsers fed arbitrary bytes, a move's
# fencing on its error paths (with a fake fence), tensors (over borrowed host bytes too: whole,
# aligned elements, read once) and batches, and the property-test harness itself. SAFETY.md
# lists which test covers which hole.
#
#   scripts/miri.sh              # all of them
#   scripts/miri.sh FILTER...    # other unit-test filters, e.g. `loader::tests::collator`
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo +nightly miri --version >/dev/null 2>&1; then
    rustup component add miri --toolchain nightly
fi

# Threads, condvars and timeouts are used; isolation stays on (Miri's virtual clock).
export MIRIFLAGS="${MIRIFLAGS:-} -Zmiri-strict-provenance"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target-miri}"
if [ $# -eq 0 ]; then
    set -- alloc:: loader:: tensor:: batch:: fuzz:: formats::npy:: \
        transfer::issue transfer::fault::tests::only_the_armed
fi
exec cargo +nightly miri test -p pinnable --lib -- "$@"
