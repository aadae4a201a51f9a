"""PyTorch's DataLoader on JPEG files, the twin of benches/images.rs, in the same session.

Generates the files both read (needs only PIL and numpy):

    python3 torch_images.py --generate DIR            # 2048 synthetic 500x375 JPEGs, quality 90

DIR/classNN/NNNN.jpg: 8 classes of 256. Each picture is a smooth random colour field, a dozen
flat shapes and Gaussian noise (sigma 5.9), which PIL encodes at about 45.7 KiB, like a photo
of that size. The same seed gives the same files on every machine.

Runs the twin (needs torch and torchvision, and a GPU):

    python3 torch_images.py --dir DIR --out torch_images.txt

First torchvision's batched GPU decode (`decode_jpeg(list, device='cuda')`, nvJPEG): decode
alone at batch 64/128/256 on 1-2 threads, then with a GPU resize + crop + normalise (the twin of
the Rust bench's device-decode mode; `--gpu-decode-only` stops there). Then the DataLoader:
Resize(256) + CenterCrop(224) + normalised f32 (ImageNet's mean and deviation), batches of 64,
DataLoader(pin_memory=True) with 0, 4, 8 and 14 workers, each batch moved non_blocking,
summed on the GPU and the stream synchronised; images decoded by torchvision.io.decode_jpeg
(antialiased tensor resize) and by PIL. Figures are steady-state: images in a window of
batches after a warm-up, over the window's time. Also, on one core, per image: PIL's decode,
decode_jpeg's, the file read, PIL's resize + crop, ToTensor + Normalize. Writes `name value`
lines to --out (benches/images.rs reads them), and PIL's crop of the first file as raw
[3, 224, 224] bytes beside it (torch_images_pil_crop.u8), which the Rust bench compares
with its own.
"""
import argparse
import glob
import io
import os
import time

import numpy as np
from PIL import Image, ImageDraw

BATCH = 64
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def picture(i, sigma=5.9):
    rng = np.random.default_rng(i)
    field = Image.fromarray(rng.integers(0, 256, (3, 4, 3), dtype=np.uint8))
    img = field.resize((500, 375), Image.BICUBIC)
    d = ImageDraw.Draw(img)
    for _ in range(12):
        x0, y0 = rng.integers(0, 500), rng.integers(0, 375)
        w, h = rng.integers(20, 200), rng.integers(20, 150)
        c = tuple(int(v) for v in rng.integers(0, 256, 3))
        (d.ellipse if rng.random() < 0.5 else d.rectangle)([x0, y0, x0 + w, y0 + h], fill=c)
    a = np.asarray(img, dtype=np.float32) + rng.normal(0, sigma, (375, 500, 3))
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))


def files_in(root):
    return sorted(glob.glob(os.path.join(root, "class*", "*.jpg")))


def generate(root, count):
    have = files_in(root)
    if len(have) == count:
        print(f"{count} JPEGs already in {root}")
        return have
    for i in range(count):
        d = os.path.join(root, f"class{i % 8:02}")
        os.makedirs(d, exist_ok=True)
        picture(i).save(os.path.join(d, f"{i:04}.jpg"), quality=90)
    have = files_in(root)
    kib = np.mean([os.path.getsize(p) for p in have]) / 1024
    print(f"wrote {len(have)} JPEGs of 500x375 (quality 90, {kib:.1f} KiB mean) to {root}")
    return have


def per_image_ms(items, f, passes=3):
    best = []
    for _ in range(passes):
        t = time.perf_counter()
        for x in items:
            f(x)
        best.append((time.perf_counter() - t) / len(items) * 1e3)
    return sorted(best)[len(best) // 2]


def one_core(files, lines):
    import torch
    import torchvision.transforms as T
    from torchvision.io import decode_jpeg, ImageReadMode

    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sample = files[:256]
        data = [open(p, "rb").read() for p in sample]
        tensors = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in data]
        figures = {
            # Decode only: these files are RGB already (convert("RGB") would add a copy).
            "pil_decode_ms": per_image_ms(data, lambda b: Image.open(io.BytesIO(b)).load()),
            "decode_jpeg_ms": per_image_ms(tensors, lambda t: decode_jpeg(t, mode=ImageReadMode.RGB)),
            "read_ms": per_image_ms(sample, lambda p: open(p, "rb").read()),
        }
        images = [Image.open(io.BytesIO(b)).convert("RGB") for b in data]
        crop = T.Compose([T.Resize(256), T.CenterCrop(224)])
        figures["pil_resize_crop_ms"] = per_image_ms(images, crop)
        crops = [crop(im) for im in images]
        norm = T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])
        figures["pil_to_tensor_normalize_ms"] = per_image_ms(crops, norm)
    finally:
        os.sched_setaffinity(0, cpus)
        torch.set_num_threads(threads)
    for k, v in figures.items():
        print(f"one core: {k} {v:.3f}")
        lines.append(f"{k} {v}")
    return crops[0]


class Files:
    """`length` samples cycling over `files`, decoded by `decoder`."""

    def __init__(self, files, length, decoder):
        import torch
        import torchvision.transforms as T
        import torchvision.transforms.v2 as V2

        self.files, self.length, self.decoder = files, length, decoder
        if decoder == "pil":
            self.transform = T.Compose(
                [T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)]
            )
        else:
            self.transform = V2.Compose([
                V2.Resize(256, antialias=True),
                V2.CenterCrop(224),
                V2.ToDtype(torch.float32, scale=True),
                V2.Normalize(MEAN, STD),
            ])

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        from torchvision.io import ImageReadMode, decode_jpeg, read_file

        path = self.files[i % len(self.files)]
        if self.decoder == "pil":
            with Image.open(path) as im:
                x = self.transform(im.convert("RGB"))
        else:
            x = self.transform(decode_jpeg(read_file(path), mode=ImageReadMode.RGB))
        return x, i % 1000


def images_per_second(files, decoder, workers, batches, dev):
    import torch
    from torch.utils.data import DataLoader

    warmup = max(8, 2 * workers + 4)
    ds = Files(files, (warmup + batches) * BATCH, decoder)
    kw = dict(batch_size=BATCH, num_workers=workers, pin_memory=True, shuffle=False)
    if workers:
        kw.update(prefetch_factor=2, persistent_workers=False)
    it = iter(DataLoader(ds, **kw))

    def step(x, y):
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        x.sum()
        torch.cuda.current_stream().synchronize()

    for _ in range(warmup):
        step(*next(it))
    t0 = time.perf_counter()
    n = 0
    for x, y in it:
        step(x, y)
        n += 1
    return n * BATCH / (time.perf_counter() - t0)


def gpu_decode(files, batches, lines):
    """torchvision's batched GPU decode (`decode_jpeg(list, device='cuda')`, nvJPEG), the twin of
    the Rust bench's device-decode mode: decode alone at batch 64 / 128 / 256 on 1 and 2
    threads (each thread its own stream and batches), then decode + per-image antialiased
    resize of the shorter side to 256 + center crop 224 + normalise to f32 `[64, 3, 224, 224]`,
    all on the GPU. The files' bytes are read into memory first (the Rust side reads the files
    in its window: this favours torchvision). Steady state: images over a window after a
    warm-up; the process's CPU time over the window as cores busy."""
    import threading

    import torch
    import torch.nn.functional as F
    from torchvision.io import ImageReadMode, decode_jpeg

    data = [torch.frombuffer(bytearray(open(p, "rb").read()), dtype=torch.uint8) for p in files]
    mean = torch.tensor(MEAN, device="cuda").view(3, 1, 1)
    std = torch.tensor(STD, device="cuda").view(3, 1, 1)

    def pipeline(imgs):
        out = torch.empty((len(imgs), 3, 224, 224), device="cuda")
        for k, im in enumerate(imgs):
            h, w = im.shape[-2:]
            nh, nw = (256, int(256 * w / h)) if h <= w else (int(256 * h / w), 256)
            x = F.interpolate(im[None].float(), size=(nh, nw), mode="bilinear", antialias=True, align_corners=False)
            top, left = int(round((nh - 224) / 2)), int(round((nw - 224) / 2))
            x = x[0, :, top:top + 224, left:left + 224]
            out[k] = (x / 255.0 - mean) / std
        return out

    def run(batch, threads, resize):
        per = max(4, batches * BATCH // batch // threads)
        warm = 3
        # Timeouts: a thread that fails breaks the barriers instead of hanging the run.
        barrier = threading.Barrier(threads + 1, timeout=600)
        done = threading.Barrier(threads + 1, timeout=600)

        def work(t):
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                for j in range(warm + per):
                    if j == warm:
                        s.synchronize()
                        barrier.wait()
                    at = ((t * (warm + per) + j) * batch) % len(data)
                    chunk = [data[(at + i) % len(data)] for i in range(batch)]
                    imgs = decode_jpeg(chunk, mode=ImageReadMode.RGB, device="cuda")
                    if resize:
                        imgs = pipeline(imgs)
                    s.synchronize()
            done.wait()

        ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for th in ts:
            th.start()
        barrier.wait()
        t0, c0 = time.perf_counter(), time.process_time()
        done.wait()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        for th in ts:
            th.join()
        return per * batch * threads / wall, cpu / wall

    best = (0, "")
    for batch in (64, 128, 256):
        for threads in (1, 2):
            ips, cores = run(batch, threads, False)
            print(f"torchvision GPU decode, batch {batch}, {threads} thread(s): {ips:.0f} images/s, {cores:.2f} cores")
            lines.append(f"tv_gpu_decode_b{batch}_t{threads} {ips}")
            lines.append(f"tv_gpu_decode_b{batch}_t{threads}_cores {cores}")
            best = max(best, (ips, f"b{batch}_t{threads}"))
    lines.append(f"tv_gpu_decode_best {best[0]}")
    print(f"torchvision GPU decode, best: {best[0]:.0f} images/s ({best[1]})")
    best_p = 0
    for threads in (1, 2):
        ips, cores = run(BATCH, threads, True)
        print(f"torchvision GPU decode + resize + crop + normalise, batch {BATCH}, {threads} thread(s): {ips:.0f} images/s, {cores:.2f} cores")
        lines.append(f"tv_gpu_pipeline_t{threads} {ips}")
        lines.append(f"tv_gpu_pipeline_t{threads}_cores {cores}")
        best_p = max(best_p, ips)
    lines.append(f"tv_gpu_pipeline_best {best_p}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--generate", metavar="DIR", help="write the JPEGs into DIR and stop")
    ap.add_argument("--count", type=int, default=2048)
    ap.add_argument("--dir", help="the JPEGs' folder, for the twin")
    ap.add_argument("--out", help="where the twin writes its figures")
    ap.add_argument("--batches", type=int, default=int(os.environ.get("PINNABLE_BENCH_BATCHES", 60)))
    ap.add_argument("--workers", default="0,4,8,14")
    ap.add_argument("--gpu-decode-only", action="store_true",
                    help="only torchvision's batched GPU decode rows (no DataLoader runs)")
    args = ap.parse_args()
    if args.generate:
        generate(args.generate, args.count)
        return
    if not (args.dir and args.out):
        ap.error("give --generate DIR, or --dir DIR and --out FILE")
    import torch
    import torchvision

    files = files_in(args.dir) or generate(args.dir, args.count)
    dev = torch.device("cuda:0")
    torch.cuda.init()
    lines = [f"# torch {torch.__version__}, torchvision {torchvision.__version__}, "
             f"{torch.cuda.get_device_name(0)}, {len(files)} files, {os.cpu_count()} cores"]
    gpu_decode(files, args.batches, lines)
    if args.gpu_decode_only:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
        return
    crop = one_core(files, lines)
    with open(os.path.join(os.path.dirname(os.path.abspath(args.out)), "torch_images_pil_crop.u8"), "wb") as f:
        f.write(np.asarray(crop).transpose(2, 0, 1).tobytes())
    for decoder in ("decode_jpeg", "pil"):
        for w in (int(w) for w in args.workers.split(",")):
            # Fewer batches without workers: one process decodes at a few hundred images/s.
            batches = args.batches if w else max(10, args.batches // 4)
            s = images_per_second(files, decoder, w, batches, dev)
            print(f"torch DataLoader({decoder}, num_workers={w}): {s:.0f} images/s")
            lines.append(f"torch_images_{decoder}_w{w} {s}")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
