"""The Python package's speed, against the PyTorch twins and against the same loaders driven from
Rust (benches/python_twins.rs), in one run.

    python3 speed.py --prepare --data DIR     # write the files and DIR/twins.cfg, then stop
    python3 speed.py --data DIR [--rust rust.txt]
    python3 speed.py --cpu-smoke              # tiny, on the host, host JPEG decode, no GPU twins

bench/python/run_speed.sh runs all three steps with the Rust bench between them. Measured, with
the settings of DIR/twins.cfg (speed_common.settings):

- token windows B x T from nanoGPT's train.bin (pinnable.TokenWindows, int64 x and y on the
  device), against nanoGPT's get_batch (bench/nanogpt_get_batch.py) on the same file;
- packed documents (pinnable.PackedDocs, Budget.packed(8192, 64), seq_idx) from the file
  bench/packing_twin.py writes, against DataCollatorWithFlattening + pin_memory().to('cuda');
- a JPEG folder and tar shards of the same JPEGs decoded on the GPU (ImageCodec(decode_on=
  "device"), Resize(256) + CenterCrop(224), f32 normalised with ImageNet's mean and deviation),
  against torch_images.py's DataLoader (decode_jpeg, 8 and 14 workers: the best) and
  torchvision's batched GPU decode alone (its best row);
- Python's overhead a batch: next() of a batch already waiting (the prefetch queue filled during
  a sleep, then fewer batches taken than it holds), output="torch" (DLPack included), and
  output="dlpack" with torch.from_dlpack of each tensor, in µs.

Streams are steady-state: the window's batches over its time, after a warm-up, with the time
spent inside next() over the window, per-batch step p50/p90, and the process's CPU time over the
window as cores (the loader's workers are threads of this process). Each step touches every
tensor of the batch on the GPU (a sum, on torch's current stream); the only syncs are at the
window's ends. Rows are `name value unit` lines, also written to $OUT/speed.txt (or --out).
"""
import argparse
import itertools
import os
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import speed_common as sc  # noqa: E402


def guard(rows, name, fn, *args):
    """Runs one part; a missing twin (ImportError, no CUDA) is a `skipped:` line, any other
    failure a `# FAILED` line with its traceback on stderr: the other parts still run."""
    try:
        fn(*args)
    except ImportError as e:
        rows.note(f"skipped: {name}: {e}")
    except Exception as e:  # noqa: BLE001 (a bench reports and goes on)
        traceback.print_exc()
        rows.note(f"# FAILED {name}: {type(e).__name__}: {e}")


class Ours:
    """The package's loaders, as twins.cfg sets them (the Rust twin builds the same)."""

    def __init__(self, s, rows):
        import pinnable as pn
        import torch

        self.s, self.rows, self.pn, self.torch = s, rows, pn, torch
        self.names = sc.names(s)
        self.cuda = s["device"].startswith("cuda")

    # the sources and loaders
    def tokens(self, **kw):
        s, pn = self.s, self.pn
        src = pn.TokenWindows(s["tokens_file"], s["tokens_context"], dtype="int64")
        return pn.Loader(src, batch_size=s["tokens_batch"], shuffle=True, seed=s["seed"], drop_last=True,
                         workers=s["tokens_workers"], prefetch=kw.get("prefetch", s["tokens_prefetch"]),
                         device=s["device"], output=kw.get("output", "torch"))

    def packed(self, **kw):
        s, pn = self.s, self.pn
        src = pn.PackedDocs(s["docs_file"], eot=s["docs_eot"], budget=pn.Budget.packed(s["docs_row_tokens"], s["docs_rows"]),
                            seed=s["seed"], dtype="int64", seq_idx=True)
        return pn.Loader(src, workers=s["docs_workers"], prefetch=kw.get("prefetch", s["docs_prefetch"]),
                         device=s["device"], output=kw.get("output", "torch"))

    def codec(self):
        s = self.s
        return self.pn.ImageCodec(dtype=s["images_dtype"], mean=sc.MEAN, std=sc.STD, decode_on=s["decode"])

    def images(self, source):
        s = self.s
        return self.pn.Loader(source, batch_size=s["images_batch"], shuffle=True, seed=s["seed"],
                              workers=s["images_workers"], prefetch=s["images_prefetch"], device=s["device"])

    # the measurements
    def touch(self, b):
        if self.cuda:
            for v in b.values():
                if isinstance(v, self.torch.Tensor):
                    v.sum()

    def sync(self):
        """The consumer's stream (torch's current one) only, as the Rust twin syncs its own."""
        if self.cuda:
            self.torch.cuda.current_stream().synchronize()

    def stream(self, name, job, loader, per_batch, unit):
        """`repeats` epochs (epoch r for repeat r, as the Rust twin runs them), one window each."""
        s, runs = self.s, []
        for r in range(s["repeats"]):
            loader.set_epoch(r)
            it = iter(loader)
            batches = min(s["window_max"], len(it) - s[f"{job}_warmup"] - sc.tail(s, job))
            if batches < 1:
                raise ValueError(f"{name}: {len(it)} batches an epoch leave no window")
            runs.append(sc.stream(it, s[f"{job}_warmup"], batches, self.touch, self.sync))
            it.close()
        self.rows.windows(name, runs, per_batch, unit, loader.workers)
        loader.close()

    def run_tokens(self):
        self.stream(self.names["tokens"], "tokens", self.tokens(), 1, "batch/s")

    def run_packed(self):
        self.stream(self.names["packed"], "docs", self.packed(), 1, "batch/s")

    def run_folder(self):
        folder = self.pn.ImageFolder(self.s["images_dir"], self.codec())
        self.stream(self.names["folder"], "images", self.images(folder), self.s["images_batch"], "images/s")

    def run_tar(self):
        tar = self.pn.TarShards(self.s["tar_pattern"], codec=self.codec(), label="cls",
                                shuffle_buffer=self.s["tar_shuffle_buffer"])
        self.stream(self.names["tar"], "images", self.images(tar), self.s["images_batch"], "images/s")

    def overhead(self, name, make, output):
        """next() of a batch already waiting: the queue fills during a sleep, then `take` (fewer
        than the prefetch depth) batches are timed; with output="dlpack", torch.from_dlpack of
        every tensor is timed with it."""
        s, pn, torch = self.s, self.pn, self.torch
        loader = make(prefetch=s["overhead_prefetch"], output=output)
        it = iter(loader)
        for _ in range(2):
            next(it)
        take = s["overhead_take"]
        rounds = min(s["overhead_rounds"], (len(it) - take) // take)
        times = []
        for _ in range(rounds):
            time.sleep(s["overhead_settle_ms"] / 1e3)
            for _ in range(take):
                t = time.perf_counter()
                b = next(it)
                if output == "dlpack":
                    b = {k: torch.from_dlpack(v) if isinstance(v, pn.Tensor) else v for k, v in b.items()}
                times.append(time.perf_counter() - t)
                del b
        it.close()
        loader.close()
        self.rows.latencies(name, times)


def twin_nanogpt(rows, s, torch):
    import nanogpt_get_batch as ng

    b, t = s["tokens_batch"], s["tokens_context"]
    dev = torch.device("cuda:0")
    batches = (ng.get_batch(s["tokens_file"], b, t, dev) for _ in itertools.count())
    w = sc.stream(batches, 3, 30, lambda xy: (xy[0].sum(), xy[1].sum()), torch.cuda.synchronize)
    w["wait"] = None  # the batch is made inside next(): not a loader's wait
    rows.windows(f"twin_nanogpt_{b}x{t}", [w], 1, "batch/s", 0)


def twin_collator(rows, s, torch):
    import packing_twin as pt

    docs = pt.split(s["docs_file"])
    plan = pt.batches(docs, s["docs_rows"] * s["docs_row_tokens"])
    warm, n = 2, 16
    # Lists of ids, as a tokenized dataset gives them (converted before the window, as the twin does).
    lists = [[d.tolist() for d in b] for b in plan[:warm + n]]
    c = pt.collator()

    def batches():
        for b in itertools.cycle(lists):
            batch = c([{"input_ids": d} for d in b], return_tensors="pt")
            yield {k: v.pin_memory().to("cuda", non_blocking=True)
                   for k, v in batch.items() if isinstance(v, torch.Tensor)}

    touch = lambda b: [v.sum() for v in b.values()]  # noqa: E731
    w = sc.stream(batches(), warm, n, touch, torch.cuda.synchronize)
    w["wait"] = None
    rows.windows(f"twin_collator_{s['docs_rows']}x{s['docs_row_tokens']}", [w], 1, "batch/s", 0)


def twin_dataloader(rows, s, torch):
    import torch_images as ti

    files = ti.files_in(s["jpegs_dir"])
    best = 0.0
    for w in (8, 14):
        busy, t = sc.machine_busy(), time.perf_counter()
        ips = ti.images_per_second(files, "decode_jpeg", w, 60, torch.device("cuda:0"))
        cores = (sc.machine_busy() - busy) / (time.perf_counter() - t)
        rows.row(f"twin_dataloader_w{w}", ips, "images/s")
        rows.row(f"twin_dataloader_w{w}.cores_machine", cores, "cores")
        rows.row(f"twin_dataloader_w{w}.workers", w, "processes")
        best = max(best, ips)
    rows.row("twin_dataloader_best", best, "images/s")


def twin_gpu_decode(rows, s, torch):
    import torch_images as ti

    lines = []
    ti.gpu_decode(ti.files_in(s["jpegs_dir"]), 60, lines)
    v = dict((k, float(x)) for k, x in (line.split() for line in lines))
    decode = {k: x for k, x in v.items() if k.startswith("tv_gpu_decode_b") and not k.endswith("_cores")}
    best = max(decode, key=decode.get)
    rows.row("twin_tv_gpu_decode_best", v["tv_gpu_decode_best"], "images/s")
    rows.row("twin_tv_gpu_decode_best.cores", v[f"{best}_cores"], "cores")
    rows.note(f"# torchvision's best decode alone: {best}")
    rows.row("twin_tv_gpu_pipeline_best", v["tv_gpu_pipeline_best"], "images/s")


def goals(rows, s, rust):
    """The table of ratios, each with its goal and PASS/FAIL."""
    n, v = sc.names(s), rows.values
    tok, docs = n["tokens"].split("_", 1)[1], n["packed"].split("_", 1)[1]
    table = []  # (what, ours, against, ratio, goal text, pass)

    def vs(what, ours, theirs, goal):
        if ours in v and theirs in v:
            r = v[ours][0] / v[theirs][0]
            table.append((what, ours, theirs, f"{r:.2f}x", f">= {goal}x", r >= goal))

    vs("token windows vs nanoGPT get_batch", n["tokens"], f"twin_nanogpt_{tok}", 100)
    vs("packed docs vs DataCollatorWithFlattening + to(cuda)", n["packed"], f"twin_collator_{docs}", 300)
    for job in ("folder", "tar"):
        vs(f"{job} vs best torch DataLoader (decode_jpeg, 8/14 workers)", n[job], "twin_dataloader_best", 2)
        vs(f"{job} vs torchvision batched GPU decode alone", n[job], "twin_tv_gpu_decode_best", 1.0)
    for key in ("next_tokens", "next_packed"):
        for out, row in (("torch", n[key]), ("dlpack + from_dlpack", n[key].replace("next_", "next_dlpack_", 1))):
            if row in v:
                table.append((f"next() of a waiting batch, output={out}, p50", row, "—", f"{v[row][0]:.1f} us",
                              "<= 20 us", v[row][0] <= 20))
    for key in ("tokens", "packed", "folder", "tar"):
        row = n[key]
        if rust and row in v and row in rust:
            r = sc.speed_ratio(v[row][0], rust[row][0], v[row][1])
            table.append((f"{key}: Python vs the same loader from Rust", row, f"rust {rust[row][0]:.6g} {rust[row][1]}",
                          f"{r:.3f}x", "0.90-1.10x", 0.90 <= r <= 1.10))
    rows.note("\n# goals")
    rows.note("| goal | row | against | ratio | goal | result |\n| --- | --- | --- | --- | --- | --- |")
    for what, ours, against, ratio, goal, ok in table:
        rows.note(f"| {what} | {ours} | {against} | {ratio} | {goal} | {'PASS' if ok else 'FAIL'} |")
    failed = sum(1 for t in table if not t[5])
    rows.note(f"# {len(table) - failed} of {len(table)} goals passed")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="the run's files and twins.cfg (default: a folder in $PINNABLE_BENCH_DATA or /tmp)")
    ap.add_argument("--prepare", action="store_true", help="write the files and twins.cfg, then stop")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the host, host decode, no GPU twins")
    ap.add_argument("--rust", help="the Rust twin's rows (benches/python_twins.rs output), for the Python/Rust goals")
    ap.add_argument("--out", default=os.path.join(os.environ["OUT"], "speed.txt") if os.environ.get("OUT") else None)
    a = ap.parse_args()
    data = a.data or os.path.join(os.environ.get("PINNABLE_BENCH_DATA", tempfile.gettempdir()),
                                  "pinnable-speed-smoke" if a.cpu_smoke else "pinnable-speed")
    if a.prepare:
        sc.prepare(data, a.cpu_smoke)
        return
    s = sc.load(data) if os.path.exists(os.path.join(data, sc.MANIFEST)) else sc.prepare(data, a.cpu_smoke)
    rows = sc.Rows(a.out)
    import pinnable
    import torch

    cuda = s["device"].startswith("cuda")
    gpu = torch.cuda.get_device_name(0) if cuda else "none (host run)"
    rows.note(f"# speed.py: pinnable {pinnable.__version__}, torch {torch.__version__}, Python {sys.version.split()[0]}, "
              f"GPU {gpu}, {len(os.sched_getaffinity(0))} cores; data {data}")
    rows.note("# settings: " + " ".join(f"{k}={v}" for k, v in sorted(s.items()) if not k.endswith(("_file", "_dir", "_pattern"))))
    t0 = time.perf_counter()
    ours = Ours(s, rows)
    n = ours.names
    guard(rows, n["tokens"], ours.run_tokens)
    guard(rows, n["packed"], ours.run_packed)
    guard(rows, n["folder"], ours.run_folder)
    guard(rows, n["tar"], ours.run_tar)
    for key, make in (("next_tokens", ours.tokens), ("next_packed", ours.packed)):
        guard(rows, n[key], ours.overhead, n[key], make, "torch")
        dl = n[key].replace("next_", "next_dlpack_", 1)
        guard(rows, dl, ours.overhead, dl, make, "dlpack")
    rows.note(f"# our loaders done in {time.perf_counter() - t0:.1f} s")
    twins = [("twin_nanogpt", twin_nanogpt), ("twin_collator", twin_collator),
             ("twin_dataloader", twin_dataloader), ("twin_tv_gpu_decode", twin_gpu_decode)]
    for name, fn in twins:
        if not (cuda and torch.cuda.is_available()):
            rows.note(f"skipped: {name}: the torch twins run on a CUDA device (this run: {s['device']})")
            continue
        t = time.perf_counter()
        guard(rows, name, fn, rows, s, torch)
        rows.note(f"# {name} done in {time.perf_counter() - t:.1f} s")
    goals(rows, s, sc.read_rows(a.rust) if a.rust else None)
    rows.note(f"# speed.py done in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
