"""A small GPT trained through the loader: the same losses as batches fed by hand, and the
step time of data already on the GPU.

Model: a compact GPT-2 (4 layers, 4 heads, 256 wide, vocabulary 50,304, context 256, tied
embeddings, no dropout, plain causal attention), AdamW (fused), bf16 autocast on cuda:0; batch
32 x 256. Data: ~50M random u16 tokens written by this script (seed printed), read with
`pinnable.Loader(pinnable.TokenWindows(path, 256), batch_size=32, shuffle=True, seed=S,
device="cuda:0")`.

(a) Identical losses. A recording pass of that loader copies 300 batches to the host with
    `.cpu()` (every row is checked to be a window of the file, y one token later, none twice).
    Then, with torch.use_deterministic_algorithms(True), CUBLAS_WORKSPACE_CONFIG=:4096:8 and
    the same initial weights, two runs of 300 steps: one fed by a new loader of the same
    settings, one fed by the recorded host tensors moved with `.to("cuda:0")`. Each step's loss
    is kept on the GPU (no per-step synchronisation); the two 300-loss curves must be
    bit-identical.
(b) Step time. Deterministic mode off. Three rounds (order L P, P L, L P) of 300 steps fed by a
    fresh loader (L) and by the 300 recorded batches preloaded as device tensors (P). The first
    20 steps of each run are skipped; the rest is timed in windows of 20 steps, synchronised at
    window boundaries only (window time / 20 = one step). The medians' ratio L / P is the check
    (goal <= 1.02), with p10/p90 beside. `window_sync_share`: the share of a window its closing
    synchronisation waited (near 0: the step is bound by the host's kernel launches, so any
    host time the loader takes adds to the step; near 1: the GPU is the bottleneck);
    `next_ms_per_step`: the host time of each timed step's next().

    python3 train_gpt.py            # GPU run (~60 s on an H200)
    python3 train_gpt.py --cpu-smoke
"""
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts: cuBLAS determinism

import math  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from common import (WindowIndex, Windows, percentiles, run, start,  # noqa: E402
                    token_file)

GOAL = 1.02


class Config:
    def __init__(self, smoke):
        self.vocab = 50304
        if smoke:
            self.layers, self.heads, self.dim, self.context, self.batch = 2, 2, 64, 64, 4
            self.steps, self.skip, self.window, self.tokens = 12, 2, 2, 1 << 20
            self.rounds = (("loader", "preloaded"),)
        else:
            self.layers, self.heads, self.dim, self.context, self.batch = 4, 4, 256, 256, 32
            self.steps, self.skip, self.window, self.tokens = 300, 20, 20, 50_000_000
            self.rounds = (("loader", "preloaded"), ("preloaded", "loader"), ("loader", "preloaded"))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads = c.heads
        self.ln1, self.ln2 = nn.LayerNorm(c.dim), nn.LayerNorm(c.dim)
        self.qkv, self.proj = nn.Linear(c.dim, 3 * c.dim), nn.Linear(c.dim, c.dim)
        self.fc, self.out = nn.Linear(c.dim, 4 * c.dim), nn.Linear(4 * c.dim, c.dim)
        self.register_buffer("causal", torch.ones(c.context, c.context, dtype=torch.bool).tril(),
                             persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, h, C // h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // h))
        att = att.masked_fill(~self.causal[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att.to(v.dtype) @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(c.vocab, c.dim), nn.Embedding(c.context, c.dim)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.dim)
        self.head = nn.Linear(c.dim, c.vocab, bias=False)
        self.head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * c.layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))


def new_model(c, dev, init):
    model = GPT(c).to(dev)
    model.load_state_dict(init)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=dev.startswith("cuda"))
    return model, opt


def train(c, dev, model, opt, batches, timer=None):
    """`c.steps` steps on the (x, y) pairs of `batches`; the losses as a device tensor. With a
    timer, steps from `c.skip` on are timed in windows of `c.window`, and the host time of each
    timed step's next() is appended to `timer.next_s`."""
    cuda = dev.startswith("cuda")
    losses = torch.zeros(c.steps, dtype=torch.float32, device=dev)
    it = iter(batches)
    for k in range(c.steps):
        if timer is not None and k == c.skip:
            timer.start()
        t0 = time.perf_counter()
        x, y = next(it)
        if timer is not None and k >= c.skip:
            timer.next_s.append(time.perf_counter() - t0)
        with torch.autocast("cuda" if cuda else "cpu", dtype=torch.bfloat16, enabled=cuda):
            loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses[k] = loss.detach()
        if timer is not None and k >= c.skip:
            timer.step(c.window)
    return losses


def loader_batches(P, path, c, dev, seed):
    """The (x, y) of a new loader of the run's settings, closed when the generator is."""
    with P.Loader(P.TokenWindows(path, c.context), batch_size=c.batch, shuffle=True, seed=seed,
                  device=dev) as loader:
        for b in loader:
            yield b["x"], b["y"]


def main(check, args):
    P, dev = start(check, args)
    cuda = dev.startswith("cuda")
    c = Config(args.cpu_smoke)
    for k in ("layers", "heads", "dim", "vocab", "context", "batch", "steps", "skip", "window", "tokens"):
        check.value(k, getattr(c, k))
    check.value("precision", "bf16-autocast" if cuda else "fp32")
    path = token_file(os.path.join(check.dir, "train_tokens.bin"), c.tokens, check.rng)
    loader_seed = int(check.rng.integers(0, 1 << 31))
    check.value("loader_seed", loader_seed)

    # Recording pass: 300 batches copied to the host, checked against the file.
    host = []
    gen = loader_batches(P, path, c, dev, loader_seed)
    for _ in range(c.steps):
        x, y = next(gen)
        host.append((x.cpu(), y.cpu()))
    gen.close()
    index = WindowIndex(path, c.context)
    found = np.concatenate([index.find(x.numpy(), y.numpy()) for x, y in host])
    bad = int((found < 0).sum())
    twice = len(found) - bad - len(np.unique(found[found >= 0]))
    check.check("recorded_rows_are_windows", bad == 0, f"{bad} of {len(found)} rows are no window of the file", "0")
    check.check("recorded_no_window_twice", twice == 0, f"{twice} repeated", "0")
    check.check("recorded_shape_dtype", all(tuple(x.shape) == (c.batch, c.context) and x.dtype == torch.int64
                                            and y.dtype == torch.int64 for x, y in host),
                f"x {tuple(host[0][0].shape)} {host[0][0].dtype}", f"({c.batch}, {c.context}) int64")

    torch.manual_seed(check.seed)
    init = {k: v.clone() for k, v in GPT(c).to(dev).state_dict().items()}
    check.value("parameters", sum(v.numel() for k, v in init.items() if k != "head.weight"))

    # (a) identical losses, deterministic.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, opt = new_model(c, dev, init)
        gen = loader_batches(P, path, c, dev, loader_seed)
        losses_loader = train(c, dev, model, opt, gen)
        gen.close()
        model, opt = new_model(c, dev, init)
        losses_hand = train(c, dev, model, opt, ((x.to(dev), y.to(dev)) for x, y in host))
    for w in {str(w.message).splitlines()[0] for w in caught if "determinis" in str(w.message)}:
        check.value("determinism_warning", repr(w))
    a, b = losses_loader.cpu(), losses_hand.cpu()
    check.value("loss_loader_first", float(a[0]))
    check.value("loss_loader_last", float(a[-1]))
    check.value("loss_hand_first", float(b[0]))
    check.value("loss_hand_last", float(b[-1]))
    same = int((a.view(torch.int32) == b.view(torch.int32)).sum())
    first_diff = next((k for k in range(c.steps) if a[k].view(torch.int32) != b[k].view(torch.int32)), None)
    check.check("losses_bit_identical", same == c.steps,
                f"{same}/{c.steps} steps' losses bit-identical"
                + (f" (first difference: step {first_diff}: {float(a[first_diff])!r} vs {float(b[first_diff])!r})"
                   if first_diff is not None else ""), f"{c.steps}/{c.steps}")
    check.check("losses_finite", bool(torch.isfinite(a).all()), "all finite" if torch.isfinite(a).all() else "NaN/inf",
                "finite")
    torch.use_deterministic_algorithms(False)
    del model, opt

    # (b) step time: loader-fed vs preloaded on the device.
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    resident = [(x.to(dev), y.to(dev)) for x, y in host]
    model, opt = new_model(c, dev, init)
    timers = {"loader": Windows(sync), "preloaded": Windows(sync)}
    for t in timers.values():
        t.next_s = []
    for r, order in enumerate(c.rounds):
        for mode in order:
            if mode == "loader":
                gen = loader_batches(P, path, c, dev, loader_seed + 1 + r)
                train(c, dev, model, opt, gen, timers[mode])
                gen.close()
            else:
                train(c, dev, model, opt, resident, timers[mode])
    meds = {}
    for mode, t in timers.items():
        ms = [s * 1e3 for s in t.times]
        meds[mode] = check.series(f"step_ms_{mode}", ms)
        check.value(f"steps_per_s_{mode}_p50", 1e3 / meds[mode])
        check.value(f"window_sync_share_{mode}_p50", percentiles(t.sync_share)[50])
        p = percentiles([v * 1e3 for v in t.next_s])
        check.value(f"next_ms_per_step_{mode}_p50", p[50])
        check.value(f"next_ms_per_step_{mode}_p90", p[90])
    ratio = meds["loader"] / meds["preloaded"]
    check.value("step_time_ratio_loader_over_preloaded", ratio)
    pl, pp = percentiles([s for s in timers["loader"].times]), percentiles([s for s in timers["preloaded"].times])
    check.value("step_time_ratio_p10", pl[10] / pp[10])
    check.value("step_time_ratio_p90", pl[90] / pp[90])
    if cuda:
        check.check("step_time_ratio", ratio <= GOAL, f"{ratio:.4f} (medians {meds['loader']:.3f} ms / "
                    f"{meds['preloaded']:.3f} ms)", f"<= {GOAL}")
    else:
        check.skip("goal step_time_ratio <= 1.02", "cpu smoke: printed, not judged")


if __name__ == "__main__":
    run("train_gpt", __doc__, main)
