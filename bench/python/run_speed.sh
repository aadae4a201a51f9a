#!/usr/bin/env bash
# The Python package's speed run: the files, the same loaders driven from Rust
# (benches/python_twins.rs), then speed.py (our loaders and the PyTorch twins), then every row
# side by side with the Python/Rust speed ratio.
#
#   bench/python/run_speed.sh RUST_BENCH [--cpu-smoke] [DATA_DIR]
#
# RUST_BENCH: the built bench binary (cargo bench --no-run --bench python_twins --features image,
# or the one carried to the GPU machine). DATA_DIR: where the files go (default: a folder under
# $PINNABLE_BENCH_DATA or /tmp; kept, so a second run skips writing them). PYTHON: the
# interpreter with torch, torchvision, transformers, pillow and pinnable (default python3).
# Outputs go to $OUT when set (else ./speed-out): rust.txt, speed.txt, joined.txt.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:?usage: run_speed.sh RUST_BENCH [--cpu-smoke] [DATA_DIR]}
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
shift
smoke=()
if [ "${1:-}" = --cpu-smoke ]; then
  smoke=(--cpu-smoke)
  shift
fi
py=${PYTHON:-python3}
data=${1:-${PINNABLE_BENCH_DATA:-/tmp}/pinnable-speed${smoke:+-smoke}}
out=${OUT:-$PWD/speed-out}
mkdir -p "$out"
# nvJPEG from this Python environment's wheels, for both sides (as the bundle's run.sh does), and
# the bench kernels when a CUDA compiler is here (else the Rust consumer touches by a device copy).
if [ -z "${PINNABLE_NVJPEG_FROM_PYTHON:-}" ]; then
  PINNABLE_NVJPEG_FROM_PYTHON=$("$py" -c 'import sys; print(sys.prefix)')
  export PINNABLE_NVJPEG_FROM_PYTHON
fi
if [ -z "${PINNABLE_KERNELS_PTX:-}" ] && command -v nvcc >/dev/null; then
  nvcc -ptx "$here/../kernels/batch.cu" -o /tmp/pinnable-kernels.ptx &&
    export PINNABLE_KERNELS_PTX=/tmp/pinnable-kernels.ptx
fi
start=$(date +%s)
echo "=== files ($data)"
"$py" "$here/speed.py" --prepare --data "$data" "${smoke[@]}"
echo "=== Rust: $bin"
# A failing Rust run still lets the Python side run (its rows then have no Rust column).
PINNABLE_TWINS_DATA=$data "$bin" | tee "$out/rust.txt" || echo "# FAILED: the Rust bench (exit ${PIPESTATUS[0]})" | tee -a "$out/rust.txt"
echo "=== Python: speed.py"
OUT=$out "$py" "$here/speed.py" --data "$data" --rust "$out/rust.txt" --out "$out/speed.txt" "${smoke[@]}"
echo "=== Python / Rust, per row (speed ratio: above 1, Python faster)"
"$py" - "$out/speed.txt" "$out/rust.txt" <<'PY' | tee "$out/joined.txt"
import sys
def rows(path):
    out = {}
    for line in open(path):
        p = line.split()
        if len(p) == 3 and not line.startswith(("#", "|")):
            try:
                out[p[0]] = (float(p[1]), p[2])
            except ValueError:
                pass
    return out
py, rs = rows(sys.argv[1]), rows(sys.argv[2])
print(f"{'row':<34} {'python':>12} {'rust':>12} {'unit':<9} {'py/rust':>8}")
for name, (a, unit) in py.items():
    if name not in rs or name.endswith((".min", ".max", ".workers")):
        continue
    b = rs[name][0]
    if unit.endswith("/s"):
        r = a / b if b else float("nan")
    elif unit in ("us", "ms"):
        r = b / a if a else float("nan")
    else:
        r = None
    ratio = f"{r:8.3f}" if r is not None else f"{'':>8}"
    main = r is not None and "." not in name and unit.endswith("/s")
    flag = "  outside 0.90-1.10" if main and not 0.9 <= r <= 1.1 else ""
    print(f"{name:<34} {a:>12.4g} {b:>12.4g} {unit:<9} {ratio}{flag}")
PY
echo "=== goals (from $out/speed.txt)"
grep -E '^(\| |# [0-9]+ of [0-9]+ goals)' "$out/speed.txt" || true
echo "=== done in $(( $(date +%s) - start )) s; outputs in $out"
