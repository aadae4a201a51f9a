"""What speed.py and the Rust twin (benches/python_twins.rs) share: the run's settings, written
once into a manifest (`<data>/twins.cfg`, `key value` lines) that both read, so both sides build
the same loaders from the same files; preparing those files; timing a stream; and the rows.

Rows are printed as `name value unit` lines (every other line starts with `#` or `skipped:`),
and written to $OUT/speed.txt as they come when OUT is set.
"""
import io
import math
import os
import random
import shutil
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
REPO = os.path.dirname(BENCH)
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)  # the twins: nanogpt_get_batch, packing_twin, torch_images

MANIFEST = "twins.cfg"
# ImageNet's mean and deviation in 0..1, as torchvision's Normalize and pinnable's ImageCodec take
# them (the Rust side's Transform::normalize: IMAGENET_MEAN / IMAGENET_STD).
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def settings(smoke):
    """Every knob of the run. The GPU run: the sizes the goals name; `smoke`: tiny, on the host."""
    s = dict(
        device="cuda:0", decode="device", seed=7, repeats=5, window_max=1000,
        # token windows, nanoGPT's train.bin of u16 (2 GiB: ~1000 batches an epoch)
        tokens=1 << 30, tokens_batch=256, tokens_context=4096, tokens_workers=4,
        tokens_prefetch=4, tokens_warmup=8,
        # packed documents, as bench/packing_twin.py writes them (~490 batches an epoch)
        docs_tokens=256 << 20, docs_eot=50256, docs_row_tokens=8192, docs_rows=64,
        docs_workers=8, docs_prefetch=4, docs_warmup=8,
        # JPEGs: `jpegs` distinct files (torch_images.py's generator), listed `images_entries`
        # times in all (hard links) so an epoch is long enough for a steady window (256 batches)
        jpegs=1024, images_entries=16384, images_batch=64, images_workers=4,
        images_prefetch=4, images_warmup=12, images_dtype="float32",
        tar_shards=16, tar_shuffle_buffer=1024,
        # Python's overhead: next() of a batch already waiting
        overhead_prefetch=8, overhead_take=4, overhead_rounds=40, overhead_settle_ms=50,
    )
    if smoke:
        s.update(
            device="cpu", decode="host", repeats=2, window_max=100,
            tokens=1 << 21, tokens_batch=8, tokens_context=256, tokens_workers=2,
            tokens_prefetch=2, tokens_warmup=2,
            docs_tokens=2 << 20, docs_rows=1, docs_workers=2, docs_prefetch=2, docs_warmup=2,
            jpegs=32, images_entries=256, images_batch=8, images_workers=2, images_prefetch=2,
            images_warmup=2, tar_shards=4, tar_shuffle_buffer=64,
            overhead_rounds=10, overhead_settle_ms=20,
        )
    return s


def tail(s, job):
    """Batches left out at an epoch's end (its workers stop there: not a steady batch)."""
    return s[f"{job}_prefetch"] + 2


def names(s):
    """The rows' names, from the sizes (the Rust twin makes the same)."""
    tok = f"{s['tokens_batch']}x{s['tokens_context']}"
    docs = f"{s['docs_rows']}x{s['docs_row_tokens']}"
    img = f"{s['decode']}_{'f32' if s['images_dtype'] == 'float32' else 'u8'}"
    return dict(tokens=f"tokens_{tok}", packed=f"packed_{docs}", folder=f"folder_{img}",
                tar=f"tar_{img}", next_tokens=f"next_tokens_{tok}", next_packed=f"next_packed_{docs}")


# --- the files ---------------------------------------------------------------------------------

def _one_jpeg(job):
    """One of torch_images.py's files, as its `generate` writes it (in a process pool)."""
    import torch_images as ti

    root, i = job
    d = os.path.join(root, f"class{i % 8:02}")
    os.makedirs(d, exist_ok=True)
    ti.picture(i).save(os.path.join(d, f"{i:04}.jpg"), quality=90)


def write_jpegs(root, count):
    """torch_images.py's `count` JPEGs in `root` (its generator, run on every core; its
    `generate` then checks them). Without PIL (the CPU smoke run only): the repository's JPEG
    fixtures, copied in the same layout."""
    try:
        import torch_images as ti
    except ImportError as e:
        seeds = os.path.join(REPO, "pinnable", "tests", "data", "seeds")
        print(f"# no PIL ({e}): the JPEGs are copies of the fixtures in {seeds}")
        picks = ["baseline-444.jpg", "baseline-420-large.jpg", "restart-422.jpg"]
        files = []
        for i in range(count):
            d = os.path.join(root, f"class{i % 8:02}")
            os.makedirs(d, exist_ok=True)
            files.append(os.path.join(d, f"{i:04}.jpg"))
            if not os.path.exists(files[-1]):
                shutil.copyfile(os.path.join(seeds, picks[i % len(picks)]), files[-1])
        return sorted(files)
    if len(ti.files_in(root)) != count:
        import multiprocessing as mp

        t = time.perf_counter()
        with mp.get_context("fork").Pool(min(16, os.cpu_count() or 1)) as pool:
            pool.map(_one_jpeg, [(root, i) for i in range(count)], chunksize=8)
        print(f"# {count} JPEGs written in {time.perf_counter() - t:.1f} s")
    return ti.generate(root, count)


def expand(files, root, entries):
    """A folder of `entries` files, `classNN/NNNN_RRR.jpg`, hard links to `files` in turn."""
    for k in range(entries):
        src = files[k % len(files)]
        d = os.path.join(root, os.path.basename(os.path.dirname(src)))
        dst = os.path.join(d, f"{os.path.splitext(os.path.basename(src))[0]}_{k // len(files):03}.jpg")
        if not os.path.exists(dst):
            os.makedirs(d, exist_ok=True)
            try:
                os.link(src, dst)
            except OSError:
                shutil.copyfile(src, dst)
    return root


def write_shards(folder, root, shards):
    """The folder's files as webdataset shards (`key.jpg` + `key.cls`, the label the sorted class
    index, as ImageFolder labels them), in a shuffled order; returns their brace pattern."""
    pattern = os.path.join(root, f"train-{{000000..{shards - 1:06}}}.tar")
    classes = sorted(os.listdir(folder))
    samples = [(c, f, k) for k, c in enumerate(classes) for f in sorted(os.listdir(os.path.join(folder, c)))]
    done = os.path.join(root, f".done-{len(samples)}")
    if os.path.exists(done):
        return pattern
    os.makedirs(root, exist_ok=True)
    random.Random(0).shuffle(samples)
    per = -(-len(samples) // shards)
    cache = {}
    for s in range(shards):
        with tarfile.open(os.path.join(root, f"train-{s:06}.tar"), "w", format=tarfile.USTAR_FORMAT) as tf:
            for c, f, label in samples[s * per:(s + 1) * per]:
                path = os.path.join(folder, c, f)
                ino = os.stat(path).st_ino
                if ino not in cache:
                    with open(path, "rb") as fh:
                        cache[ino] = fh.read()
                key = f"{c}/{os.path.splitext(f)[0]}"
                for ext, data in (("jpg", cache[ino]), ("cls", str(label).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size, info.mode, info.mtime = len(data), 0o644, 0
                    tf.addfile(info, io.BytesIO(data))
    open(done, "w").close()
    return pattern


def prepare(data, smoke):
    """Writes (or finds) every file of the run under `data`, and the manifest; returns it."""
    s = settings(smoke)
    os.makedirs(data, exist_ok=True)
    t = time.perf_counter()
    s["jpegs_dir"] = os.path.join(data, f"jpegs-{s['jpegs']}")
    jpegs = write_jpegs(s["jpegs_dir"], s["jpegs"])  # before torch: the pool forks
    s["images_dir"] = expand(jpegs, os.path.join(data, f"folder-{s['images_entries']}"), s["images_entries"])
    s["tar_pattern"] = write_shards(s["images_dir"], os.path.join(data, f"shards-{s['images_entries']}"),
                                    s["tar_shards"])
    import nanogpt_get_batch as ng
    import packing_twin as pt

    s["tokens_file"] = ng.token_file(os.path.join(data, f"train-{s['tokens']}.bin"), s["tokens"])
    s["docs_file"] = pt.docs_file(os.path.join(data, f"docs-{s['docs_tokens']}.bin"), s["docs_tokens"])
    with open(os.path.join(data, MANIFEST), "w") as f:
        f.write("# written by bench/python/speed_common.py; read by speed.py and benches/python_twins.rs\n")
        f.writelines(f"{k} {v}\n" for k, v in sorted(s.items()))
    print(f"# data ready in {data} in {time.perf_counter() - t:.1f} s")
    return s


def load(data):
    """The manifest of `data` as a dict (numbers as ints)."""
    s = {}
    with open(os.path.join(data, MANIFEST)) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                k, v = line.rstrip("\n").split(" ", 1)
                s[k] = int(v) if v.lstrip("-").isdigit() else v
    return s


# --- timing ------------------------------------------------------------------------------------

def percentile(sorted_values, p):
    """Nearest rank, as the Rust harness's `percentile`."""
    n = len(sorted_values)
    return sorted_values[min(max(math.ceil(p * n), 1), n) - 1]


def stream(it, warmup, batches, touch, sync):
    """Steady state of a stream, as the Rust harness's `Window` measures it: `warmup` batches
    (each taken with next() and touched), a sync ending the last of them, then a window of
    `batches` more, a sync ending the last. Returns the window's figures: batches/s, the share of
    the window spent inside next(), per-batch step p50/p90 (s: from the end of one step to the
    end of the next), and the process's CPU time over the window in cores (every thread of the
    process, the loader's workers included)."""
    assert warmup >= 1 and batches >= 1, "a window opens at the end of a warm-up step"
    steps, waited, t0, c0, last = [], 0.0, 0.0, 0.0, 0.0
    for i in range(1, warmup + batches + 1):
        a = time.perf_counter()
        b = next(it)
        now = time.perf_counter()
        if i > warmup:
            waited += now - a
        touch(b)
        del b
        if i in (warmup, warmup + batches):
            sync()  # the window's ends
        now = time.perf_counter()
        if i == warmup:
            t0, c0 = now, time.process_time()
        elif i > warmup:
            steps.append(now - last)
        last = now
    wall = last - t0
    cpu = time.process_time() - c0
    steps.sort()
    return dict(rate=batches / wall, wait=waited / wall, p50=percentile(steps, 0.5),
                p90=percentile(steps, 0.9), cores=cpu / wall, batches=batches)


def machine_busy():
    """Busy CPU seconds of the whole machine so far (/proc/stat): for the torch DataLoader,
    whose worker processes' time the parent's clock does not see."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


# --- rows --------------------------------------------------------------------------------------

class Rows:
    """Printed `name value unit` lines, kept, and written to `out` as they come."""

    def __init__(self, out):
        self.out, self.lines, self.values = out, [], {}
        if out:
            os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)

    def _add(self, line):
        print(line, flush=True)
        self.lines.append(line)
        if self.out:
            with open(self.out, "w") as f:
                f.write("\n".join(self.lines) + "\n")

    def row(self, name, value, unit):
        self.values[name] = (value, unit)
        self._add(f"{name} {value:.6g} {unit}")

    def note(self, text):
        for line in text.splitlines() or [""]:
            self._add(line if line.startswith(("#", "|", "skipped:")) else f"# {line}")

    def windows(self, name, runs, per_batch, unit, workers):
        """A stream's row: the median repeat's rate (batches/s × `per_batch`), its range, and
        beside it the consumer's wait, the step percentiles, the cores and the workers."""
        runs = sorted(runs, key=lambda r: r["rate"])
        m = runs[len(runs) // 2]
        self.row(name, m["rate"] * per_batch, unit)
        self.row(f"{name}.min", runs[0]["rate"] * per_batch, unit)
        self.row(f"{name}.max", runs[-1]["rate"] * per_batch, unit)
        if m.get("wait") is not None:
            self.row(f"{name}.wait", 100 * m["wait"], "%")
        self.row(f"{name}.p50", 1e3 * m["p50"], "ms")
        self.row(f"{name}.p90", 1e3 * m["p90"], "ms")
        self.row(f"{name}.cores", m["cores"], "cores")
        self.row(f"{name}.workers", workers, "workers")

    def latencies(self, name, seconds):
        """Per-batch times in µs: p50 as the row, p90, p99 and the mean beside it."""
        v = sorted(seconds)
        self.row(name, 1e6 * percentile(v, 0.5), "us")
        self.row(f"{name}.p90", 1e6 * percentile(v, 0.9), "us")
        self.row(f"{name}.p99", 1e6 * percentile(v, 0.99), "us")
        self.row(f"{name}.mean", 1e6 * sum(v) / len(v), "us")


def read_rows(path):
    """`name -> (value, unit)` of a file of rows (other lines ignored)."""
    out = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and not line.startswith(("#", "|")):
                try:
                    out[parts[0]] = (float(parts[1]), parts[2])
                except ValueError:
                    pass
    return out


def speed_ratio(a, b, unit):
    """How fast `a` is relative to `b` (above 1: `a` faster): rates divide, times invert."""
    if unit.endswith("/s"):
        return a / b if b else float("nan")
    return b / a if a else float("nan")
