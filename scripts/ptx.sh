#!/usr/bin/env bash
# Builds the crate's kernels (`pinnable/kernels/*.cu`) to the PTX the crate embeds
# (`pinnable/kernels/*.ptx`), with NVRTC 12.0 for `compute_50`: PTX ISA 8.0, which every CUDA 12
# and later driver loads, on every GPU those drivers support. NVRTC comes from the environment
# `scripts/cuda-build-env.sh` installs.
#
#   scripts/ptx.sh            # regenerate the PTX
#   scripts/ptx.sh --check    # fail if the committed PTX is not what its source builds to (CI)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PINNABLE_NVRTC12:-}" ]; then
  eval "$(scripts/cuda-build-env.sh)"
fi
check=0
[ "${1:-}" = --check ] && check=1
status=0
for cu in pinnable/kernels/*.cu; do
  ptx=${cu%.cu}.ptx
  out=$(mktemp)
  python3 scripts/ptx.py "$PINNABLE_NVRTC12" "$cu" "$out" compute_50
  if [ $check = 1 ]; then
    if cmp -s "$out" "$ptx"; then
      echo "$ptx matches $cu"
    else
      echo "$ptx does not match $cu: run scripts/ptx.sh and commit the result" >&2
      diff <(head -40 "$ptx") <(head -40 "$out") >&2 || true
      status=1
    fi
    rm -f "$out"
  else
    mv "$out" "$ptx"
    chmod 644 "$ptx"
    echo "wrote $ptx ($(wc -l <"$ptx") lines)"
  fi
done
exit $status
