"""ImageFolder and image tar shards, decoded on the host: pictures exactly crop x crop, so the
decoded batch must equal the pixels written."""

from collections import Counter

import numpy as np

import pinnable
from _support import letters, loader, png_decode_rgb, png_rgb, write_tar


def make_pictures(rng, count, size):
    pics = [rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8) for _ in range(count)]
    for p in pics:  # the encoder itself is right
        assert (png_decode_rgb(png_rgb(p)) == p).all()
    return pics


def codec(size):
    return pinnable.ImageCodec(crop=size, resize=None, decode_on="host")


def test_image_folder_decodes_pixels_exactly(rng, seed, tmp_path):
    size = int(rng.integers(8, 33))
    names = sorted({letters(rng, 6) for _ in range(int(rng.integers(2, 5)))})
    root = tmp_path / "train"
    want_images, want_labels = [], []
    for label, name in enumerate(names):
        (root / name).mkdir(parents=True)
        pics = make_pictures(rng, int(rng.integers(2, 6)), size)
        for k, p in enumerate(pics):  # zero-padded: sorted names are the written order
            (root / name / f"img_{k:03d}.png").write_bytes(png_rgb(p))
            want_images.append(p.transpose(2, 0, 1))  # CHW
            want_labels.append(label)
    (root / names[0] / "notes.txt").write_text("not an image")  # not listed
    src = pinnable.ImageFolder(str(root), codec(size))
    assert src.classes == names
    assert len(src) == len(want_images), f"seed={seed}"
    b = int(rng.integers(2, 6))
    batches = list(loader(src, batch_size=b))
    at = 0
    for i, batch in enumerate(batches):
        assert set(batch) == {"images", "labels"}, sorted(batch)
        images, labels = batch["images"], batch["labels"]
        assert images.dtype == np.uint8 and labels.dtype == np.int64
        k = images.shape[0]
        assert images.shape == (k, 3, size, size), images.shape
        np.testing.assert_array_equal(images, np.stack(want_images[at : at + k]),
                                      err_msg=f"seed={seed} batch {i}")
        np.testing.assert_array_equal(labels, want_labels[at : at + k], err_msg=f"seed={seed}")
        at += k
    assert at == len(want_images)


def content_counts(batches):
    """How often each (image bytes, label) pair arrived."""
    seen = Counter()
    for batch in batches:
        for img, lab in zip(batch["images"], batch["labels"]):
            seen[(np.ascontiguousarray(img).tobytes(), int(lab))] += 1
    return seen


def test_tar_shards_of_png_images(rng, seed, tmp_path):
    size = int(rng.integers(8, 25))
    pics = make_pictures(rng, int(rng.integers(10, 30)), size)
    labels = rng.integers(0, 1000, size=len(pics))
    members = []
    for k, (p, lab) in enumerate(zip(pics, labels)):
        members.append((f"{k:06d}.png", png_rgb(p)))
        members.append((f"{k:06d}.cls", str(int(lab)).encode()))
    path = tmp_path / "images-000000.tar"
    write_tar(path, members)
    src = pinnable.TarShards(str(path), codec=codec(size), image="png", label="cls")
    assert len(src) == len(pics)
    want = Counter((p.transpose(2, 0, 1).tobytes(), int(lab)) for p, lab in zip(pics, labels))
    b = int(rng.integers(2, 7))
    ld = loader(src, batch_size=b, shuffle=True, seed=int(rng.integers(0, 2**63)))
    batches = list(ld)
    assert len(batches) == len(ld)
    for batch in batches:
        assert batch["images"].dtype == np.uint8 and batch["images"].shape[1:] == (3, size, size)
        assert batch["labels"].dtype == np.int64
    assert content_counts(batches) == want, f"seed={seed}: not every image once with its label"
