"""nvJPEG's batched decode alone, measured through its C API (ctypes), on the files the image
bench reads: which backend, output format, flags and thread layout decode fastest on this GPU.
The GPU decode path (`ImageCodec` in a loader delivering to a GPU) picks its settings from these figures.

    python3 nvjpeg_probe.py --dir DIR [--lib libnvjpeg.so.13] [--out probe.txt] [--only TEXT]

Each row decodes batches of the same files (read once into memory, pinned or pageable) into
device buffers torch allocates, on a stream of its own per thread; images/s over a window of
batches after a warm-up, the stream synchronised once a batch (as torchvision's decoder does)
or once at the end ("async"). Needs torch (for memory and streams) and a CUDA GPU.
"""
import argparse
import ctypes as C
import os
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_images import files_in  # noqa: E402

BACKENDS = {"default": 0, "hybrid": 1, "gpu_hybrid": 2, "hardware": 3, "gpu_hybrid_device": 4}
OUTPUTS = {"rgb": 3, "rgbi": 5, "yuv": 1}
INTERP = 1 << 5


class Image(C.Structure):
    _fields_ = [("channel", C.c_void_p * 4), ("pitch", C.c_size_t * 4)]


def load(path):
    lib = C.CDLL(path)
    vp, i, sz = C.c_void_p, C.c_int, C.c_size_t
    sig = {
        "nvjpegCreateEx": [i, vp, vp, C.c_uint, C.POINTER(vp)],
        "nvjpegJpegStateCreate": [vp, C.POINTER(vp)],
        "nvjpegDecodeBatchedInitialize": [vp, vp, i, i, i],
        "nvjpegDecodeBatched": [vp, vp, C.POINTER(vp), C.POINTER(sz), C.POINTER(Image), vp],
        "nvjpegGetImageInfo": [vp, vp, sz, C.POINTER(i), C.POINTER(i), C.POINTER(i * 4), C.POINTER(i * 4)],
        "nvjpegJpegStreamCreate": [vp, C.POINTER(vp)],
        "nvjpegJpegStreamParseHeader": [vp, vp, sz, vp],
        "nvjpegDecodeBatchedSupported": [vp, vp, C.POINTER(i)],
        "nvjpegGetProperty": [i, C.POINTER(i)],
    }
    for name, args in sig.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, C.c_int
    return lib


def check(what, status):
    if status != 0:
        raise RuntimeError(f"{what}: nvJPEG status {status}")


class Decoder:
    """One handle, state and stream: what one thread decodes with."""

    def __init__(self, lib, backend, flags, output):
        self.lib, self.output = lib, output
        self.handle, self.state = C.c_void_p(), C.c_void_p()
        check("nvjpegCreateEx", lib.nvjpegCreateEx(backend, None, None, flags, C.byref(self.handle)))
        check("nvjpegJpegStateCreate", lib.nvjpegJpegStateCreate(self.handle, C.byref(self.state)))
        self.stream = torch.cuda.Stream()
        self.n = 0

    def size(self, data):
        comps, css = C.c_int(), C.c_int()
        w, h = (C.c_int * 4)(), (C.c_int * 4)()
        check("nvjpegGetImageInfo", self.lib.nvjpegGetImageInfo(
            self.handle, data, len(data), C.byref(comps), C.byref(css), C.byref(w), C.byref(h)))
        return w[0], h[0]

    def prepare(self, blobs, pinned):
        """Inputs (pinned or pageable host memory) and output buffers for one batch."""
        self.keep = []
        ptrs, lens, imgs = (C.c_void_p * len(blobs))(), (C.c_size_t * len(blobs))(), (Image * len(blobs))()
        for k, b in enumerate(blobs):
            t = torch.frombuffer(bytearray(b), dtype=torch.uint8)
            if pinned:
                t = t.pin_memory()
            self.keep.append(t)
            ptrs[k], lens[k] = t.data_ptr(), len(b)
            w, h = self.size(b)
            if self.output == OUTPUTS["rgbi"]:
                o = torch.empty(h, w * 3, dtype=torch.uint8, device="cuda")
                imgs[k].channel[0], imgs[k].pitch[0] = o.data_ptr(), w * 3
            else:
                o = torch.empty(3, h, w, dtype=torch.uint8, device="cuda")
                for c in range(3):
                    imgs[k].channel[c], imgs[k].pitch[c] = o[c].data_ptr(), w
            self.keep.append(o)
        self.ptrs, self.lens, self.imgs, self.count = ptrs, lens, imgs, len(blobs)

    def decode(self, sync):
        if self.n != self.count:
            check("nvjpegDecodeBatchedInitialize", self.lib.nvjpegDecodeBatchedInitialize(
                self.handle, self.state, self.count, 1, self.output))
            self.n = self.count
        check("nvjpegDecodeBatched", self.lib.nvjpegDecodeBatched(
            self.handle, self.state, self.ptrs, self.lens, self.imgs,
            C.c_void_p(self.stream.cuda_stream)))
        if sync:
            self.stream.synchronize()


def rate(lib, blobs, backend, flags, output, batch, threads=1, pinned=True, sync=True, batches=24):
    decs = []
    for t in range(threads):
        d = Decoder(lib, backend, flags, output)
        start = (t * batch) % max(1, len(blobs) - batch)
        d.prepare(blobs[start:start + batch], pinned)
        decs.append(d)
    for d in decs:  # warm-up
        d.decode(True)
        d.decode(True)
    barrier = threading.Barrier(threads + 1)
    cpu0 = time.process_time()

    def work(d):
        barrier.wait()
        for _ in range(batches):
            d.decode(sync)
        d.stream.synchronize()

    ts = [threading.Thread(target=work, args=(d,)) for d in decs]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    cores = (time.process_time() - cpu0) / wall
    return threads * batches * batch / wall, cores


def mixed(lib, blobs, a, b, batches=24):
    """Two decoders on two threads at once, each its own (backend, flags, output, batch)."""
    decs, at = [], 0
    for backend, flags, output, n in (a, b):
        d = Decoder(lib, backend, flags, output)
        d.prepare(blobs[at:at + n], True)
        at += n
        decs.append(d)
    for d in decs:
        d.decode(True)
    barrier = threading.Barrier(3)
    cpu0 = time.process_time()

    def work(d):
        barrier.wait()
        for _ in range(batches):
            d.decode(True)

    ts = [threading.Thread(target=work, args=(d,)) for d in decs]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    return batches * (a[3] + b[3]) / wall, (time.process_time() - cpu0) / wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--lib", default="libnvjpeg.so.13")
    ap.add_argument("--out")
    ap.add_argument("--only", help="measure only the rows whose name contains this")
    args = ap.parse_args()
    lib = load(args.lib)
    ver = [C.c_int() for _ in range(3)]
    for k in range(3):
        lib.nvjpegGetProperty(k, C.byref(ver[k]))
    blobs = [open(p, "rb").read() for p in files_in(args.dir)][:1024]
    lines = [f"nvJPEG {'.'.join(str(v.value) for v in ver)} ({args.lib}), {torch.cuda.get_device_name()}",
             f"{len(blobs)} files, {sum(map(len, blobs)) / len(blobs) / 1024:.1f} KiB mean", ""]
    print("\n".join(lines), flush=True)

    def row(name, f):
        if args.only and args.only not in name:
            return
        try:
            r = f()
            s = f"{name}: {r[0]:.0f} images/s, {r[1]:.2f} cores"
        except Exception as e:  # a backend or setting this GPU or library refuses
            s = f"{name}: failed: {e}"
        print(s, flush=True)
        lines.append(s)

    hw, dflt, ghd = BACKENDS["hardware"], BACKENDS["default"], BACKENDS["gpu_hybrid_device"]
    rgb, rgbi = OUTPUTS["rgb"], OUTPUTS["rgbi"]
    for label, backend, flags, out in [
        ("hardware rgb flags0", hw, 0, rgb),
        ("hardware rgbi flags0", hw, 0, rgbi),
        ("hardware rgbi interp", hw, INTERP, rgbi),
        ("hardware rgb interp", hw, INTERP, rgb),
        ("default rgbi flags0", dflt, 0, rgbi),
        ("default rgb flags0", dflt, 0, rgb),
        ("gpu_hybrid_device rgbi flags0", ghd, 0, rgbi),
        ("gpu_hybrid_device rgbi interp", ghd, INTERP, rgbi),
    ]:
        row(f"{label} b64 t1", lambda: rate(lib, blobs, backend, flags, out, 64))
    for out, name in [(rgb, "rgb"), (rgbi, "rgbi")]:
        for flags, fname in [(0, "flags0"), (INTERP, "interp")]:
            row(f"hardware {name} {fname} b64 t1 pageable",
                lambda: rate(lib, blobs, hw, flags, out, 64, pinned=False))
            row(f"hardware {name} {fname} b64 t1 async",
                lambda: rate(lib, blobs, hw, flags, out, 64, sync=False))
            for b, t in [(128, 1), (256, 1), (64, 2), (128, 2), (64, 4)]:
                row(f"hardware {name} {fname} b{b} t{t}",
                    lambda: rate(lib, blobs, hw, flags, out, b, threads=t))
    for backend, bname in [(ghd, "gpu_hybrid_device"), (dflt, "default")]:
        for b, t in [(128, 1), (64, 2), (128, 2)]:
            row(f"{bname} rgbi flags0 b{b} t{t}", lambda: rate(lib, blobs, backend, 0, rgbi, b, threads=t))
    for n_hw in (32, 48, 64, 80):
        for backend, bname in [(ghd, "gpu_hybrid_device"), (dflt, "default"), (hw, "hardware")]:
            row(f"mixed: hardware {n_hw} + {bname} {128 - n_hw} (rgbi flags0, 2 threads)",
                lambda: mixed(lib, blobs, (hw, 0, rgbi, n_hw), (backend, 0, rgbi, 128 - n_hw)))
    if args.only:
        if args.out:
            with open(args.out, "w") as f:
                f.write("\n".join(lines) + "\n")
        return
    # Host cost per image of the header probes the decode path makes.
    d = Decoder(lib, hw, 0, rgbi)
    js = C.c_void_p()
    lib.nvjpegJpegStreamCreate(d.handle, C.byref(js))
    t0 = time.perf_counter()
    for b in blobs:
        d.size(b)
    info = (time.perf_counter() - t0) / len(blobs) * 1e3
    t0 = time.perf_counter()
    unsup = C.c_int()
    for b in blobs:
        lib.nvjpegJpegStreamParseHeader(d.handle, b, len(b), js)
        lib.nvjpegDecodeBatchedSupported(d.handle, js, C.byref(unsup))
    parse = (time.perf_counter() - t0) / len(blobs) * 1e3
    s = f"per image on the host: nvjpegGetImageInfo {info:.4f} ms, ParseHeader + BatchedSupported {parse:.4f} ms"
    print(s)
    lines.append(s)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
