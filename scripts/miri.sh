#!/usr/bin/env bash
# Runs the pinned allocator's unit tests (size classes, free lists, pending fences, budget,
# stats) under Miri, over the heap test-double backend: no OS or driver call is made.
#
#   scripts/miri.sh            # the allocator's tests
#   scripts/miri.sh FILTER     # another unit-test filter
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo +nightly miri --version >/dev/null 2>&1; then
    rustup component add miri --toolchain nightly
fi

# Threads, condvars and timeouts are used; isolation stays on (Miri's virtual clock).
export MIRIFLAGS="${MIRIFLAGS:-} -Zmiri-strict-provenance"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target-miri}"
exec cargo +nightly miri test -p pinnable --lib "${1:-alloc::}"
