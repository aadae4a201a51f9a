#!/usr/bin/env bash
# The LLVM that burn's CUDA backend links, from the Python package registry, for the harness's
# `burn-cuda` feature on a machine that cannot reach GitHub.
#
# burn-cuda depends on cubecl-cuda, which depends on cubecl-llvm (no feature turns it off).
# cubecl-llvm's build asks `tracel-llvm-bundler` for an LLVM: the bundler downloads a release
# archive from GitHub into $XDG_DATA_HOME/tracel/tracel-llvm-<version>, unless that folder
# already holds its marker file `.tracel-llvm-installed`; either way it then asks the folder's
# `bin/llvm-config --link-static` for the flags and libraries. The wheels `mlc-llvm-static`
# and `mlc-llvm-static-extra-targets` (the NVPTX target) ship the same LLVM release's static
# libraries, headers and an `llvm-config`, so this installs them into DIR (once; later calls
# reuse it), makes their folder the bundler's folder under DIR, and marks it installed.
#
#   eval "$(scripts/burn-cuda-env.sh [DIR])"      # DIR defaults to target/burn-llvm
#   cargo build --features burn-cuda ...
#
# It prints one export, XDG_DATA_HOME, which only the bundler reads during the build. The
# wheels' `llvm-config` is a Python script: `python3` must be on PATH when cargo builds.
#
# The pins: the bundler release that Cargo.lock resolves, and the wheels that carry its LLVM.
# When `cargo update` moves the bundler, this stops with a message saying what to change.
set -euo pipefail
cd "$(dirname "$0")/.."
bundler_pin=23.1.0-4
wheels_pin=23.1.1.post0

locked=$(awk '/^name = "tracel-llvm-bundler"$/ { getline; gsub(/version = |"/, ""); print; exit }' burn-cuda/Cargo.lock)
if [ -z "$locked" ]; then
  echo "burn-cuda-env.sh: Cargo.lock resolves no tracel-llvm-bundler; run 'cargo generate-lockfile' or check that burn-cuda is still a dependency" >&2
  exit 1
fi
if [ "$locked" != "$bundler_pin" ]; then
  cat >&2 <<EOF
burn-cuda-env.sh: Cargo.lock now resolves tracel-llvm-bundler $locked, and this script pins
$bundler_pin (LLVM ${bundler_pin%-*}, from the wheels mlc-llvm-static==$wheels_pin). Pick the
mlc-llvm-static release of the same LLVM major.minor as $locked ('pip index versions
mlc-llvm-static'), set bundler_pin and wheels_pin here, and run the burn GPU tests again.
EOF
  exit 1
fi

dir=$(mkdir -p "${1:-target/burn-llvm}" && cd "${1:-target/burn-llvm}" && pwd)
py=$dir/venv/bin/python3
ok=$dir/ok-$wheels_pin
if [ ! -e "$ok" ]; then
  python3 -m venv "$dir/venv" >&2
  "$dir/venv/bin/pip" install --quiet --disable-pip-version-check >&2 \
    "mlc-llvm-static==$wheels_pin" "mlc-llvm-static-extra-targets==$wheels_pin"
  touch "$ok"
fi
sdk=$("$py" -c 'import mlc_llvm_static, os; print(os.path.join(mlc_llvm_static.__path__[0], "static"))')
if ! "$sdk/bin/llvm-config" --targets-built | grep -qw NVPTX; then
  echo "burn-cuda-env.sh: the LLVM in $sdk has no NVPTX target; reinstall with 'rm -rf $dir' and run again" >&2
  exit 1
fi
data=$dir/data
mkdir -p "$data/tracel"
ln -sfn "$sdk" "$data/tracel/tracel-llvm-$bundler_pin"
# Created once: the bundler's build reruns when the marker changes, and everything above it with.
[ -e "$sdk/.tracel-llvm-installed" ] || touch "$sdk/.tracel-llvm-installed"
echo "export XDG_DATA_HOME=\"$data\""
