#!/usr/bin/env bash
# A CUDA build environment for the `candle-cuda` feature on a machine without a CUDA toolkit.
#
# candle's CUDA backend compiles its kernels with nvcc and links the CUDA libraries when it is
# built. This installs what that needs from NVIDIA's Python wheels into DIR (once; later calls
# reuse it): nvcc and the headers, the link-time libraries, and a stand-in for the driver
# library (`libcuda.so`) whose entry points all report an error. The real driver is used at
# run time on a machine that has one; on a machine without one, programs start and see no GPU.
#
#   eval "$(scripts/cuda-build-env.sh [DIR])"       # DIR defaults to target/cuda-toolchain
#
# It also installs NVRTC 12.0, which `scripts/ptx.sh` builds the crate's own kernels with: PTX
# from CUDA 12.0 (ISA 8.0) loads on every CUDA 12 and 13 driver, where CUDA 13's nvcc emits PTX
# that 12.x drivers refuse.
#
# It prints the exports: PATH (nvcc), CUDA_ROOT and CUDA_HOME, CUDA_COMPUTE_CAP (no GPU here to
# detect it; 90 builds for Hopper), LD_LIBRARY_PATH (the libraries, for running tests here) and
# PINNABLE_NVRTC12 (NVRTC 12.0's library, for scripts/ptx.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mkdir -p "${1:-target/cuda-toolchain}" && cd "${1:-target/cuda-toolchain}" && pwd)
py=$dir/venv/bin/python3
if ! "$py" -c 'import nvidia' 2>/dev/null || [ ! -e "$dir/ok-2" ]; then
  python3 -m venv "$dir/venv" >&2
  "$dir/venv/bin/pip" install --quiet --disable-pip-version-check >&2 \
    "nvidia-cuda-nvcc==13.0.88" "nvidia-cuda-crt==13.0.88" "nvidia-nvvm==13.0.88" \
    "nvidia-cuda-runtime==13.0.96" "nvidia-cuda-cccl==13.0.85" "nvidia-cuda-nvrtc==13.0.88" \
    "nvidia-cublas==13.0.2.14" "nvidia-curand==10.4.0.35" "nvidia-cuda-nvrtc-cu12==12.0.76"
  touch "$dir/ok-2"
fi
root=$("$py" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')
lib=$root/lib
# The linker looks for unversioned names; the wheels ship versioned ones.
for l in cublas cublasLt cudart nvrtc; do ln -sf "lib$l.so.13" "$lib/lib$l.so"; done
ln -sf libcurand.so.10 "$lib/libcurand.so"
stubs=$lib/stubs
if [ ! -f "$stubs/libcuda.so.1" ]; then
  mkdir -p "$stubs"
  # Every `cu*` entry point cudarc declares, each returning CUDA_ERROR_UNKNOWN (999).
  decls=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19.*/src/driver/sys/mod.rs 2>/dev/null | tail -1)
  if [ -z "$decls" ]; then
    cargo fetch --quiet >&2
    decls=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19.*/src/driver/sys/mod.rs | tail -1)
  fi
  grep -ohE "fn cu[A-Za-z0-9_]+" "$decls" | sort -u |
    sed 's/^fn \(.*\)$/int \1(void) { return 999; }/' >"$stubs/stub.c"
  cc -shared -fPIC -Wl,-soname,libcuda.so.1 "$stubs/stub.c" -o "$stubs/libcuda.so.1"
  ln -sf libcuda.so.1 "$stubs/libcuda.so"
fi
echo "export PATH=\"$root/bin:\$PATH\" CUDA_ROOT=\"$root\" CUDA_HOME=\"$root\" CUDA_COMPUTE_CAP=\"\${CUDA_COMPUTE_CAP:-90}\""
nvrtc12=$("$py" -c 'import nvidia.cuda_nvrtc, os; print(os.path.join(nvidia.cuda_nvrtc.__path__[0], "lib", "libnvrtc.so.12"))')
echo "export PINNABLE_NVRTC12=\"$nvrtc12\""
echo "export LD_LIBRARY_PATH=\"$lib:$stubs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
