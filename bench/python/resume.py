"""Exact resume of a shuffled token-window loader on cuda:0, across processes.

Random u16 tokens (8M, context 256: 32,767 windows, 2,048 batches of 16 an epoch). With
`Loader(TokenWindows(path, 256), batch_size=16, shuffle=True, seed=S, device="cuda:0")`:

1. uninterrupted: 1,000 batches, a SHA-256 digest of each (x and y, copied to the host); every
   row is checked to be a window of the file with y one token later, and no window comes twice;
2. interrupted: a new loader, 500 batches (their digests equal the first 500 above), then
   `state_dict()`, saved with `torch.save`, and the loader closed;
3. resumed: a NEW PROCESS (this script with --child) makes a new loader with the same settings,
   `load_state_dict(torch.load(file, weights_only=True))`, and writes the digests of its next
   500 batches; they must equal batches 500-999 of the uninterrupted run;
4. another setting: a loader with batch_size 32 given the saved state must raise
   `pinnable.ConfigError` (at `load_state_dict` or at the next iteration) whose message names
   the setting ("batch size" or "batch_size"); the message is printed.

    python3 resume.py            # GPU run (~15 s on an H200)
    python3 resume.py --cpu-smoke
"""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import torch

from common import WindowIndex, run, say, start, token_file

CONTEXT = 256
BATCH = 16


def digest(b):
    h = hashlib.sha256()
    for name in ("x", "y"):
        t = b[name]
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode() + str(t.dtype).encode())
        h.update(t.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def make_loader(P, path, dev, seed, batch_size=BATCH):
    return P.Loader(P.TokenWindows(path, CONTEXT), batch_size=batch_size, shuffle=True, seed=seed,
                    device=dev)


def take(loader, n, keep=None, state=None):
    """Digests of the next `n` batches of one iteration (and the batches' host rows in `keep`;
    with `state` a list, the loader's state_dict() is appended to it while the iteration is
    still open, as a training loop saves a checkpoint)."""
    out = []
    it = iter(loader)
    for _ in range(n):
        b = next(it)
        out.append(digest(b))
        if keep is not None:
            keep.append((b["x"].cpu().numpy(), b["y"].cpu().numpy()))
    if state is not None:
        state.append(loader.state_dict())
    if hasattr(it, "close"):
        it.close()
    return out


def child(args):
    """The resumed process: new loader, saved state, the next `args.child_batches` digests."""
    import pinnable as P

    dev = "cpu" if args.cpu_smoke else "cuda:0"
    state = torch.load(args.state, weights_only=True)
    loader = make_loader(P, args.path, dev, args.loader_seed)
    loader.load_state_dict(state)
    say(f"child_pid {os.getpid()}")
    say(f"child_epoch {loader.epoch}")
    digests = take(loader, args.child_batches)
    loader.close()
    with open(args.out, "w") as f:
        json.dump(digests, f)
    say(f"child_batches {len(digests)}")


def main(check, args):
    P, dev = start(check, args)
    total, cut = (100, 50) if args.cpu_smoke else (1000, 500)
    tokens = (1 << 19 if args.cpu_smoke else 1 << 23)
    path = token_file(os.path.join(check.dir, "resume_tokens.bin"), tokens, check.rng)
    loader_seed = int(check.rng.integers(0, 1 << 31))
    check.value("tokens", tokens)
    check.value("loader_seed", loader_seed)

    # 1. uninterrupted
    loader = make_loader(P, path, dev, loader_seed)
    check.value("batches_per_epoch", len(loader))
    rows = []
    full = take(loader, total, keep=rows)
    loader.close()
    index = WindowIndex(path, CONTEXT)
    found = np.concatenate([index.find(x, y) for x, y in rows])
    not_windows = int((found < 0).sum())
    repeats = len(found) - len(np.unique(found[found >= 0])) - not_windows
    check.check("uninterrupted_rows_are_windows", not_windows == 0,
                f"{not_windows} of {len(found)} rows are no window of the file", "0")
    check.check("uninterrupted_no_window_twice", repeats == 0,
                f"{repeats} windows repeated within the epoch", "0")
    in_file_order = bool(np.array_equal(found, np.sort(found)))
    check.check("uninterrupted_shuffled", not in_file_order,
                "windows in file order" if in_file_order else "windows in a shuffled order", "shuffled")
    check.value("distinct_digests", len(set(full)))

    # 2. interrupted
    loader = make_loader(P, path, dev, loader_seed)
    saved = []
    first = take(loader, cut, state=saved)
    state = saved[0]
    loader.close()
    say(f"state_dict_keys {','.join(sorted(state)) if isinstance(state, dict) else type(state).__name__}")
    for k in sorted(state) if isinstance(state, dict) else []:
        say(f"state_dict_{k} {type(state[k]).__name__} {str(state[k])[:120]!r}")
    check.check("interrupted_first_batches_equal", first == full[:cut],
                f"{sum(a == b for a, b in zip(first, full))}/{cut} digests equal", f"{cut}/{cut}")
    state_file = os.path.join(check.dir, "loader_state.pt")
    torch.save(state, state_file)
    try:
        torch.load(state_file, weights_only=True)
        check.value("state_dict_weights_only_load", "ok")
    except Exception as e:  # noqa: BLE001 - a finding, reported, then the child fails on it too
        check.check("state_dict_weights_only_load", False, f"{type(e).__name__}: {e}".splitlines()[0],
                    "torch.load(weights_only=True) reads the state_dict")

    # 3. resumed in a new process
    out = os.path.join(check.dir, "resumed_digests.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--state", state_file, "--path", path,
           "--loader-seed", str(loader_seed), "--child-batches", str(total - cut), "--out", out,
           "--seed", str(check.seed), "--dir", check.dir]
    if args.cpu_smoke:
        cmd.append("--cpu-smoke")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    for line in proc.stdout.splitlines():
        if line.startswith("child_") or line.startswith("FAIL"):
            say(line)
    if proc.returncode != 0 or not os.path.exists(out):
        say(proc.stderr[-3000:])
        check.check("resumed_process", False, f"child exited {proc.returncode}", "0")
        return
    with open(out) as f:
        resumed = json.load(f)
    equal = sum(a == b for a, b in zip(resumed, full[cut:]))
    first_diff = next((i for i, (a, b) in enumerate(zip(resumed, full[cut:])) if a != b), None)
    check.check("resumed_batches_equal", resumed == full[cut:],
                f"{equal}/{total - cut} digests of batches {cut}-{total - 1} equal"
                + (f" (first difference: batch {cut + first_diff})" if first_diff is not None else ""),
                f"{total - cut}/{total - cut}")

    # 4. another setting
    other = make_loader(P, path, dev, loader_seed, batch_size=2 * BATCH)
    where, err = "load_state_dict", None
    try:
        other.load_state_dict(torch.load(state_file, weights_only=True))
        where = "next()"
        next(iter(other))
    except Exception as e:  # noqa: BLE001 - the type is the check
        err = e
    other.close()
    if err is None:
        check.check("changed_batch_size_refused", False, "no error", "pinnable.ConfigError naming the setting")
        return
    msg = str(err)
    say(f"changed_batch_size_error_type {type(err).__module__}.{type(err).__name__}")
    say(f"changed_batch_size_raised_at {where}")
    say(f"changed_batch_size_message {msg!r}")
    check.check("changed_batch_size_refused", isinstance(err, P.ConfigError),
                f"{type(err).__name__} at {where}", "pinnable.ConfigError")
    check.check("changed_batch_size_named", "batch size" in msg or "batch_size" in msg,
                "the message names the setting" if ("batch size" in msg or "batch_size" in msg)
                else "the message does not say 'batch size'", "names 'batch size'")


def add_args(ap):
    ap.add_argument("--child", action="store_true", help=argparse_hidden())
    ap.add_argument("--state")
    ap.add_argument("--path")
    ap.add_argument("--loader-seed", type=int)
    ap.add_argument("--child-batches", type=int)
    ap.add_argument("--out")


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    if "--child" in sys.argv:
        # The resumed process: no PASS/FAIL of its own (the parent judges); an error exits 1.
        import argparse

        ap = argparse.ArgumentParser()
        ap.add_argument("--cpu-smoke", action="store_true")
        ap.add_argument("--seed", type=int)
        ap.add_argument("--dir")
        add_args(ap)
        child(ap.parse_args())
    else:
        run("resume", __doc__, main, add_args)
