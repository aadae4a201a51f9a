"""Shared pieces of the Python package's GPU acceptance scripts (bench/python/*.py).

Every script prints `name value` result lines, one `check <name> ok|FAILED <measured> <goal>`
line per goal, and a final `PASS` or `FAIL <reason>` line; it exits non-zero on FAIL. Every
figure printed is measured in that run; timings are steady-state windows (a window's time over
its steps), with percentiles beside the median.

`--cpu-smoke` runs a tiny version on device "cpu" (parts that need CUDA print
`skipped: <part> (<reason>)`), so syntax and API use can be checked on a machine without a GPU.
`--seed` fixes the data's seed (default: a fresh one, printed).
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback

import numpy as np

VOCAB = 50257  # GPT-2's tokens: what nanoGPT's prepare.py writes as u16


def say(*parts):
    print(*parts, flush=True)


def fmt(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        return ",".join(fmt(x) for x in v)
    return str(v)


def arg_parser(doc):
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="a tiny run on device 'cpu' (GPU-only parts skipped with a printed line)")
    ap.add_argument("--seed", type=int, default=None, help="data seed (default: fresh, printed)")
    ap.add_argument("--dir", default=None,
                    help="where the data files go (default: a fresh temporary folder, removed after)")
    return ap


class Check:
    """Result lines, goal checks and the final PASS/FAIL line of one script."""

    def __init__(self, name, args):
        self.name, self.failures = name, []
        self.smoke = args.cpu_smoke
        self.seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
        self.rng = np.random.default_rng(self.seed)
        self._own_dir = args.dir is None
        self.dir = args.dir or tempfile.mkdtemp(prefix=f"pinnable-{name}-",
                                                dir=os.environ.get("PINNABLE_CHECK_DIR"))
        os.makedirs(self.dir, exist_ok=True)
        say(f"# {name}: {' '.join(sys.argv[1:]) or '(no arguments)'}")
        self.value("seed", self.seed)

    def value(self, name, v):
        say(f"{name} {fmt(v)}")

    def series(self, name, xs, unit=""):
        """Median with p10/p90, min and max beside it (never the median alone)."""
        p = percentiles(xs)
        say(f"{name}_p50{unit} {fmt(p[50])}")
        say(f"{name}_p10{unit} {fmt(p[10])}")
        say(f"{name}_p90{unit} {fmt(p[90])}")
        say(f"{name}_min{unit} {fmt(min(xs))}")
        say(f"{name}_max{unit} {fmt(max(xs))}")
        say(f"{name}_n {len(xs)}")
        return p[50]

    def check(self, name, ok, measured, goal=""):
        say(f"check {name} {'ok' if ok else 'FAILED'} {measured}{' goal ' + goal if goal else ''}")
        if not ok:
            self.failures.append(f"{name}: {measured}{' (goal ' + goal + ')' if goal else ''}")
        return ok

    def skip(self, part, why):
        say(f"skipped: {part} ({why})")

    def fail(self, reason):
        self.failures.append(reason)

    def finish(self):
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        if self.failures:
            say("FAIL " + "; ".join(self.failures))
            sys.exit(1)
        say("PASS")
        sys.exit(0)


def run(name, doc, main, add_args=None):
    """Parses the arguments, runs `main(check, args)`, and ends with PASS/FAIL; an exception is a
    FAIL naming it (traceback on stderr)."""
    ap = arg_parser(doc)
    if add_args:
        add_args(ap)
    args = ap.parse_args()
    check = Check(name, args)
    try:
        main(check, args)
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - any error is this script's FAIL
        traceback.print_exc()
        sys.stderr.flush()
        check.fail(f"exception {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    check.finish()


def import_pinnable():
    import pinnable

    if not hasattr(pinnable, "Loader"):
        raise ImportError(f"`pinnable` at {getattr(pinnable, '__path__', '?')} has no Loader: "
                          "a namespace package (run from outside the repository root?)")
    return pinnable


def device_of(args):
    """"cuda:0" on the GPU run; "cpu" for --cpu-smoke."""
    if args.cpu_smoke:
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device: run with --cpu-smoke on a machine without a GPU")
    torch.cuda.init()
    return "cuda:0"


def start(check, args):
    """The package and the device of this run, with the machine described in the output."""
    P = import_pinnable()
    dev = device_of(args)
    describe_machine(check)
    check.value("device", dev)
    return P, dev


def describe_machine(check):
    import torch

    import pinnable

    check.value("torch", torch.__version__)
    check.value("numpy", np.__version__)
    check.value("pinnable", getattr(pinnable, "__version__", "?"))
    check.value("python", sys.version.split()[0])
    if torch.cuda.is_available():
        check.value("gpu", torch.cuda.get_device_name(0).replace(" ", "_"))
    check.value("cores", len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                else os.cpu_count())


def percentiles(xs, ps=(10, 50, 90)):
    s = sorted(xs)
    out = {}
    for p in ps:
        # nearest-rank on the sorted values, interpolated
        k = (len(s) - 1) * p / 100
        lo, hi = int(k), min(int(k) + 1, len(s) - 1)
        out[p] = s[lo] + (s[hi] - s[lo]) * (k - lo)
    return out


def median(xs):
    return statistics.median(xs)


def token_file(path, n, rng):
    """`path` holding `n` random u16 tokens below GPT-2's vocabulary, raw (nanoGPT's
    train.bin), from `rng`."""
    with open(path, "wb") as f:
        for start in range(0, n, 1 << 24):
            rng.integers(0, VOCAB, size=min(1 << 24, n - start), dtype=np.uint16).tofile(f)
    return path


class WindowIndex:
    """The windows of a raw u16 token file as TokenWindows cuts them (window j: tokens
    j*context .. j*context + context + 1), to find which window a delivered row is."""

    def __init__(self, path, context):
        self.data = np.fromfile(path, dtype=np.uint16)
        self.context = context
        n = (len(self.data) - 1) // context
        self.windows = np.lib.stride_tricks.as_strided(
            self.data, shape=(n, context + 1), strides=(2 * context, 2), writeable=False)
        key = self._key(self.windows)
        self.order = np.argsort(key, kind="stable")
        self.sorted = key[self.order]

    def __len__(self):
        return len(self.windows)

    @staticmethod
    def _key(rows):
        r = rows[:, :4].astype(np.uint64)
        return (r[:, 0] << np.uint64(48)) | (r[:, 1] << np.uint64(32)) | (r[:, 2] << np.uint64(16)) | r[:, 3]

    def find(self, x, y):
        """Window index of each row of a batch (x, y as NumPy [B, context]), -1 where the row
        is no window of the file or y is not x one token later."""
        x, y = np.asarray(x), np.asarray(y)
        rows = np.concatenate([x, y[:, -1:]], axis=1)
        shifted = (y[:, :-1] == x[:, 1:]).all(axis=1)
        key = self._key(rows)
        pos = np.clip(np.searchsorted(self.sorted, key), 0, len(self.sorted) - 1)
        cand = self.order[pos]
        same = (self.sorted[pos] == key) & (self.windows[cand].astype(np.int64) == rows).all(axis=1)
        return np.where(same & shifted, cand, -1)


class Windows:
    """Steady-state timing: the work between two synchronised boundaries, `steps` steps long.
    `sync_share`: for each window, the share of it the closing synchronisation waited (near 0:
    the host was the bottleneck, the GPU idle at times; near 1: the host ran ahead)."""

    def __init__(self, sync):
        self.sync = sync
        self.times = []  # seconds per step of each window
        self.sync_share = []
        self._t = None
        self._n = 0

    def start(self):
        self.sync()
        self._t, self._n = time.perf_counter(), 0

    def step(self, window):
        """Counts a step; at every `window` steps, closes the window and opens the next."""
        self._n += 1
        if self._n == window:
            before = time.perf_counter()
            self.sync()
            now = time.perf_counter()
            self.times.append((now - self._t) / window)
            self.sync_share.append((now - before) / (now - self._t))
            self._t, self._n = now, 0
