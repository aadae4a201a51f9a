#!/usr/bin/env bash
# Builds the tests, benches and examples as release binaries into one folder with a run.sh, so
# they can be copied to a CUDA machine and run there without a Rust toolchain. Every feature is
# on, so the integrations' GPU tests and examples are in the bundle too. `candle-cuda` compiles
# candle's kernels and links the CUDA libraries, so the build runs in the environment
# `scripts/cuda-build-env.sh` installs; on the CUDA machine, run.sh finds those libraries in the
# CUDA toolkit or in PyTorch's wheels.
#
# candle's kernels make every binary ~35 MB (1.2 GB in all); packed with
# `tar -cJf gpu-bundle.tar.xz gpu-bundle` it is ~31 MB.
#
#   scripts/gpu-bundle.sh [DIR]        # default DIR: gpu-bundle
#   DIR/run.sh [tests|examples|benches|all] (default: all)
#
# PINNABLE_BUNDLE_FEATURES="ndarray dlpack" builds those features instead of all of them: without
# `candle-cuda` each binary is a few MB (no candle kernels) and the build needs no CUDA toolchain
# (with it, the build sets that toolchain up as for every feature).
#
# PINNABLE_BUNDLE_TARGETS builds only the targets it names, in cargo's words, for example candle's
# bench, test and example alone (one link each of candle's kernels instead of one a binary):
#
#   PINNABLE_BUNDLE_FEATURES=candle-cuda \
#   PINNABLE_BUNDLE_TARGETS="--bench candle --test candle --example candle_batch" scripts/gpu-bundle.sh
#
#   DIR/run.sh PROGRAM [ARGS]            # one bundled program, with the environment run.sh sets
#
# --burn-cuda bundles burn-cuda/ instead: the burn tests, example and bench on burn's CUDA
# backend, in one test binary (it links LLVM: ≈ 190 MB, ≈ 40 MB packed, too large to travel
# with the rest), built in the environment scripts/burn-cuda-env.sh sets up:
#
#   scripts/gpu-bundle.sh --burn-cuda [DIR]      # default DIR: gpu-bundle-burn
#   DIR/run.sh tests                             # the tests and the example
#   DIR/run.sh tests/burn_cuda --ignored --nocapture bench
set -euo pipefail
cd "$(dirname "$0")/.."
burn_cuda=
if [ "${1:-}" = --burn-cuda ]; then
  burn_cuda=1
  shift
fi
out=${1:-gpu-bundle${burn_cuda:+-burn}}
rm -rf "$out"
mkdir -p "$out/tests" "$out/benches" "$out/examples"
json=$(mktemp)
trap 'rm -f "$json"' EXIT

if [ -n "$burn_cuda" ]; then
  eval "$(scripts/burn-cuda-env.sh)"
  CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target/burn-cuda} cargo test --manifest-path burn-cuda/Cargo.toml \
    --profile gpu-bundle --no-run --message-format=json-render-diagnostics >"$json"
elif [ -n "${PINNABLE_BUNDLE_FEATURES+set}" ]; then
  features=(--features "$PINNABLE_BUNDLE_FEATURES")
  case " $(echo "$PINNABLE_BUNDLE_FEATURES" | tr ',' ' ') " in
    *" candle-cuda "*) eval "$(scripts/cuda-build-env.sh)" ;;
  esac
else
  features=(--all-features)
  eval "$(scripts/cuda-build-env.sh)"
fi
if [ -n "$burn_cuda" ]; then
  :
elif [ -n "${PINNABLE_BUNDLE_TARGETS:-}" ]; then
  # Word splitting is wanted: the variable holds cargo's target options.
  # shellcheck disable=SC2086
  cargo build "${features[@]}" --profile gpu-bundle $PINNABLE_BUNDLE_TARGETS --message-format=json-render-diagnostics >"$json"
else
  cargo test --workspace "${features[@]}" --profile gpu-bundle --no-run --message-format=json-render-diagnostics >"$json"
  cargo bench --workspace "${features[@]}" --profile gpu-bundle --no-run --message-format=json-render-diagnostics >>"$json"
  cargo build "${features[@]}" --profile gpu-bundle --examples --message-format=json-render-diagnostics >>"$json"
fi

python3 - "$json" "$out" <<'PY'
import json, shutil, sys, os
src, out = sys.argv[1], sys.argv[2]
seen = set()
for line in open(src):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    t = m["target"]
    kind = t["kind"][0]
    name = t["name"]
    if name == "compiletest":  # trybuild needs cargo: stays on the build machine
        continue
    if m["profile"]["test"] and kind == "lib":
        dest, name = "tests", name + "-lib"
    elif kind == "test":
        dest = "tests"
    elif kind == "bench":
        dest = "benches"
    elif kind == "example":
        dest = "examples"
    else:
        continue
    if (dest, name) in seen:
        continue
    seen.add((dest, name))
    shutil.copy2(m["executable"], os.path.join(out, dest, name))
PY
cp bench/torch_baseline.py bench/torch_loader.py bench/nanogpt_get_batch.py bench/torch_images.py "$out/" 2>/dev/null || true
cp bench/kernels/batch.cu "$out/kernels.cu"
# The files the tests read at run time, under their paths from the repository's root; run.sh
# points PINNABLE_FIXTURES at them.
for d in tests/data pinnable/tests/data; do
  mkdir -p "$out/fixtures/$d"
  cp -r "$d/." "$out/fixtures/$d/"
done
cp examples/launch_ranks.sh "$out/"

cat >"$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs the bundled binaries on a CUDA machine. A GPU test that cannot find a device fails here.
# Bench outputs go to $PINNABLE_BENCH_OUT (default: ./bench-out).
#
#   ./run.sh [tests|examples|benches|all]   # default: all
#   ./run.sh PROGRAM [ARGS]                  # one program, e.g. ./run.sh benches/candle
set -u
cd "$(dirname "$0")"
export PINNABLE_REQUIRE_GPU=1
# The tests' fixtures travel with the bundle: a test that cannot find one fails here.
export PINNABLE_FIXTURES=${PINNABLE_FIXTURES:-$PWD/fixtures}
# candle's CUDA backend links cuBLAS, cuRAND and NVRTC (CUDA 13): from PyTorch's wheels when
# there is no toolkit.
if command -v python3 >/dev/null; then
  libs=$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))' 2>/dev/null) &&
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# nvJPEG from this Python environment's wheels (torchvision's copy where there is no toolkit):
# searched only when asked.
if command -v python3 >/dev/null && [ -z "${PINNABLE_NVJPEG_FROM_PYTHON:-}" ]; then
  prefix=$(python3 -c 'import sys; print(sys.prefix)' 2>/dev/null) &&
    export PINNABLE_NVJPEG_FROM_PYTHON="$prefix"
fi
export PINNABLE_BENCH_OUT=${PINNABLE_BENCH_OUT:-$PWD/bench-out}
mkdir -p "$PINNABLE_BENCH_OUT"
# The test and bench kernels (a stand-in consumer and compute step), compiled here to PTX when a
# CUDA compiler is present.
if [ -z "${PINNABLE_KERNELS_PTX:-}" ] && command -v nvcc >/dev/null; then
  nvcc -ptx kernels.cu -o /tmp/pinnable-kernels.ptx && export PINNABLE_KERNELS_PTX=/tmp/pinnable-kernels.ptx
fi
what=${1:-all}
case "$what" in
  tests | examples | benches | all) ;;
  *)
    if [ -f "$what" ] && [ -x "$what" ]; then
      exec "$@"
    fi
    echo "run.sh: '$what' is neither a bundled program nor one of tests, examples, benches, all" >&2
    exit 2
    ;;
esac
fail=0
run() { echo "=== $*"; "$@" || { echo "FAILED: $*"; fail=1; }; }
if [ "$what" = all ] || [ "$what" = tests ]; then
  log=$(mktemp)
  for t in tests/*; do run "$t" --test-threads=1; done 2>&1 | tee "$log"
  grep -q '^FAILED: ' "$log" && fail=1
  # Every skip again, one a line, and the totals of every test binary.
  skips=$(grep -c '^skipped: ' "$log")
  echo "=== run.sh tests: $skips skipped"
  grep '^skipped: ' "$log" | sed 's/^/    /'
  awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed/) p += $(i-1);
         if ($(i) ~ /^failed/) f += $(i-1); if ($(i) ~ /^ignored/) g += $(i-1) } }
       END { printf "tests: %d passed, %d failed, %d ignored\n", p, f, g }' "$log"
  rm -f "$log"
fi
if [ "$what" = all ] || [ "$what" = examples ]; then
  for e in examples/*; do run "$e"; done
  # One process a GPU again, started by the script a user would start them with.
  if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
    gpus=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
  else
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  fi
  [ "${gpus:-0}" -ge 1 ] || gpus=1
  run ./launch_ranks.sh "$gpus" examples/multi_gpu
fi
if [ "$what" = all ] || [ "$what" = benches ]; then
  if [ -f torch_baseline.py ] && command -v python3 >/dev/null; then
    run python3 torch_baseline.py --out "$PINNABLE_BENCH_OUT/torch.txt"
  fi
  if [ -f torch_loader.py ] && command -v python3 >/dev/null; then
    run python3 torch_loader.py --out "$PINNABLE_BENCH_OUT/torch_loader.txt"
  fi
  if [ -f nanogpt_get_batch.py ] && command -v python3 >/dev/null; then
    run python3 nanogpt_get_batch.py --out "$PINNABLE_BENCH_OUT/nanogpt.txt"
  fi
  # The JPEGs benches/images reads, written by PIL, and PyTorch's figures on them.
  if [ -f torch_images.py ] && command -v python3 >/dev/null; then
    run python3 torch_images.py --generate "$PINNABLE_BENCH_OUT/jpegs"
    run python3 torch_images.py --dir "$PINNABLE_BENCH_OUT/jpegs" --out "$PINNABLE_BENCH_OUT/torch_images.txt"
  fi
  for b in benches/*; do run "$b"; done
fi
echo "=== run.sh: $([ $fail = 0 ] && echo 'all passed' || echo 'FAILURES above')"
exit $fail
RUN
chmod +x "$out/run.sh"
du -sh "$out"
ls -l "$out"/*/
