"""Compiles a CUDA source file to PTX with NVRTC (through ctypes): scripts/ptx.sh runs it."""
import ctypes
import sys

lib, src_path, out_path, arch = sys.argv[1:5]
nvrtc = ctypes.CDLL(lib)
source = open(src_path, "rb").read()
name = src_path.rsplit("/", 1)[-1].encode()


def check(result, what):
    if result != 0:
        nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
        sys.exit(f"{what}: {nvrtc.nvrtcGetErrorString(result).decode()}")


prog = ctypes.c_void_p()
check(nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source, name, 0, None, None), "nvrtcCreateProgram")
options = [f"--gpu-architecture={arch}".encode(), b"--std=c++14", b"--device-as-default-execution-space"]
argv = (ctypes.c_char_p * len(options))(*options)
result = nvrtc.nvrtcCompileProgram(prog, len(options), argv)
size = ctypes.c_size_t()
nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
log = ctypes.create_string_buffer(size.value)
nvrtc.nvrtcGetProgramLog(prog, log)
if log.value.strip():
    print(log.value.decode(), file=sys.stderr)
check(result, "nvrtcCompileProgram")
nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
ptx = ctypes.create_string_buffer(size.value)
check(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
with open(out_path, "wb") as f:
    f.write(ptx.value)
