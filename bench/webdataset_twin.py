"""Python webdataset on the tar shards of benches/tar.rs, the twin of that bench, same session.

    python3 webdataset_twin.py --shards "OUT/tar-shards/train-{000000..000015}.tar" \
        --out webdataset_twin.txt

Needs webdataset, torch, torchvision and PIL. Two pipelines over the same 16 shards,
each through DataLoader(pin_memory=True) with batches of 64:

- fields only: each sample's `.jpg` bytes summed (every byte read) and its `.cls` parsed, as
  the Rust bench's fields-only batcher does, against `cat` of the shards;
- images: PIL decode, Resize(256) + CenterCrop(224), u8 tensors [3, 224, 224], the labels;
  each batch moved to the GPU non_blocking when there is one (and the stream synchronised).

Shards are split over workers by webdataset's `split_by_worker`, a shuffle buffer of 1000 as
the webdataset docs show; the epoch is one pass over the shards. Figures are samples/s over
a whole epoch after a warm-up epoch, for 4, 8 and 14 workers. Writes `name value` lines.
"""
import argparse
import io
import subprocess
import time

import braceexpand
import numpy as np
import torch
import webdataset as wds
from PIL import Image
from torchvision import transforms

BATCH = 64


def fields_only(sample):
    jpg = np.frombuffer(sample["jpg"], dtype=np.uint8)
    return int(jpg.sum(dtype=np.uint64)), int(sample["cls"])


TRANSFORM = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224)])


def decoded(sample):
    image = Image.open(io.BytesIO(sample["jpg"])).convert("RGB")
    pixels = np.asarray(TRANSFORM(image)).transpose(2, 0, 1).copy()
    return torch.from_numpy(pixels), int(sample["cls"])


def loader(urls, workers, map_fn):
    pipeline = (
        wds.WebDataset(urls, shardshuffle=True, nodesplitter=None)
        .shuffle(1000)
        .map(map_fn)
        .batched(BATCH, partial=True)
    )
    return wds.WebLoader(pipeline, batch_size=None, num_workers=workers, pin_memory=True)


def samples_per_second(urls, workers, map_fn, dev):
    dl = loader(urls, workers, map_fn)

    def epoch():
        n = 0
        for x, y in dl:
            if dev is not None and isinstance(x, torch.Tensor):
                x = x.to(dev, non_blocking=True)
                y = torch.as_tensor(y).to(dev, non_blocking=True)
            n += len(y)
        if dev is not None:
            torch.cuda.synchronize()
        return n

    epoch()  # warm-up: workers started, page cache filled
    t = time.perf_counter()
    n = epoch()
    return n / (time.perf_counter() - t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", required=True, help="brace pattern of the shards")
    ap.add_argument("--out", required=True)
    ap.add_argument("--workers", default="4,8,14")
    args = ap.parse_args()
    urls = list(braceexpand.braceexpand(args.shards))
    dev = torch.device("cuda") if torch.cuda.is_available() else None
    lines = []

    count = sum(1 for _ in wds.WebDataset(urls, shardshuffle=False))
    t = time.perf_counter()
    subprocess.run(["cat", *urls], stdout=subprocess.DEVNULL, check=True)
    cat = time.perf_counter() - t
    lines.append(f"samples {count}")
    lines.append(f"cat_samples_per_s {count / cat:.1f}")
    for w in [int(w) for w in args.workers.split(",")]:
        f = samples_per_second(urls, w, fields_only, None)
        i = samples_per_second(urls, w, decoded, dev)
        lines.append(f"fields_only_{w}_workers {f:.1f}")
        lines.append(f"images_{w}_workers {i:.1f}")
        print(lines[-2], lines[-1], flush=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
