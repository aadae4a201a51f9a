"""pinnable from Python: token windows from a nanoGPT-style shard, a step of a tiny model.

Writes `train_0.bin` (uint16 tokens) beside the working directory, reads windows of 256 tokens
in shuffled batches of 8 onto `cuda:LOCAL_RANK` (or pinned host memory without a GPU), trains a
bigram model for one epoch when PyTorch is installed (NumPy batches otherwise), stops halfway,
and resumes from the saved position in a new loader: the second half is the same batches.

    python pinnable-py/examples/quickstart.py
"""
import os

import numpy as np

import pinnable

try:
    import torch
except ImportError:
    torch = None

VOCAB, CONTEXT, BATCH = 512, 256, 8


def main():
    path = "train_0.bin"
    rng = np.random.default_rng(0)
    rng.integers(0, VOCAB, size=200_000, dtype=np.uint16).tofile(path)
    source = pinnable.TokenWindows(path, CONTEXT)
    output = "torch" if torch is not None else "numpy"
    device = None if torch is not None else "cpu"  # None: cuda:LOCAL_RANK when there is a GPU
    settings = dict(batch_size=BATCH, shuffle=True, seed=42, drop_last=True, output=output, device=device)
    with pinnable.Loader(source, **settings) as loader:
        print(f"{len(loader)} batches an epoch on {loader.device}, {loader.workers} workers")
        model = opt = None
        if torch is not None:
            model = torch.nn.Embedding(VOCAB, VOCAB).to(loader.device)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
        half = len(loader) // 2
        firsts, saved = [], None
        for step, batch in enumerate(loader):
            x, y = batch["x"], batch["y"]               # int64 [8, 256]; y is x one token later
            if model is not None:
                loss = torch.nn.functional.cross_entropy(model(x).view(-1, VOCAB), y.view(-1))
                opt.zero_grad()
                loss.backward()
                opt.step()
                if step % 20 == 0:
                    print(f"step {step}: loss {loss.item():.3f}")
            firsts.append(np.asarray(x.cpu() if torch is not None else x)[:, 0].copy())
            if step + 1 == half:
                saved = loader.state_dict()             # with the checkpoint
        print(loader.stats()["report"])
    # A new run, resumed where the first one saved: the same batches from `half` on.
    with pinnable.Loader(source, **settings) as resumed:
        resumed.load_state_dict(saved)
        again = [np.asarray(b["x"].cpu() if torch is not None else b["x"])[:, 0] for b in resumed]
    assert len(again) == len(firsts) - half
    assert all((a == b).all() for a, b in zip(again, firsts[half:]))
    print(f"resumed at batch {half}: the {len(again)} batches after it are the same")
    os.remove(path)


if __name__ == "__main__":
    main()
