"""GPU tests: batches on cuda:0, zero copy to torch, consumption on another stream. Each skips
with "skipped: no CUDA device: ..." where there is none."""

import numpy as np
import pytest

import pinnable
from _support import EOT, loader, rows_xy, sizes, write_docs, write_tokens


@pytest.fixture
def torch():
    if not pinnable.cuda_available():
        pytest.skip("skipped: no CUDA device: pinnable.cuda_available() is False")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("skipped: no CUDA device: torch.cuda.is_available() is False")
    return torch


def test_cuda_torch_output(torch, rng, seed):
    n, b = sizes(rng)
    x, y = rows_xy(rng, n)
    ld = loader(pinnable.Arrays({"x": x, "y": y}), batch_size=b, device="cuda:0", output="torch")
    assert ld.device == "cuda:0"
    batches = list(ld)
    assert len(batches) == len(ld)
    for i, batch in enumerate(batches):
        for key, ref, dtype in (("x", x, torch.float32), ("y", y, torch.int64)):
            t = batch[key]
            assert isinstance(t, torch.Tensor)
            assert t.device == torch.device("cuda:0") and t.dtype == dtype
            np.testing.assert_array_equal(
                t.cpu().numpy(), ref[i * b : (i + 1) * b], err_msg=f"seed={seed} batch {i} {key}"
            )


def test_cuda_dlpack_is_zero_copy(torch, rng, seed):
    n, b = sizes(rng)
    x, y = rows_xy(rng, n)
    ld = loader(pinnable.Arrays({"x": x, "y": y}), batch_size=b, device="cuda:0", output="dlpack")
    for i, batch in enumerate(ld):
        for key, ref in (("x", x), ("y", y)):
            t = batch[key]
            assert isinstance(t, pinnable.Tensor) and t.device == "cuda:0"
            assert t.__dlpack_device__() == (2, 0)  # kDLCUDA, device 0
            tt = torch.from_dlpack(t)
            assert tt.data_ptr() == t.data_ptr, f"{key}: torch got a copy"
            assert tt.device == torch.device("cuda:0") and tuple(tt.shape) == t.shape
            np.testing.assert_array_equal(
                tt.cpu().numpy(), ref[i * b : (i + 1) * b], err_msg=f"seed={seed} batch {i} {key}"
            )


def check_row_sums_on_a_side_stream(torch, ld, x, output, seed):
    """Every batch's row sums, queued on a new stream as each batch arrives (no host
    synchronisation), equal NumPy's sums of the rows."""
    s = torch.cuda.Stream()
    sums = []
    with torch.cuda.stream(s):
        for batch in ld:
            t = batch["x"] if output == "torch" else torch.from_dlpack(batch["x"])
            sums.append(t.double().sum(dim=1))
    s.synchronize()
    got = torch.cat(sums).cpu().numpy()
    np.testing.assert_allclose(got, x.astype(np.float64).sum(axis=1), rtol=1e-9, atol=1e-6,
                               err_msg=f"seed={seed}")


@pytest.mark.parametrize("output", ["torch", "dlpack"])
def test_consumed_on_a_side_stream(torch, rng, seed, output):
    # Batches of 16 MiB: work queued on stream s right after a batch arrives reads it only
    # if s was made to wait for the copy that fills it.
    n, b, row = 256, 32, 128 * 1024
    x = rng.standard_normal((n, row), dtype=np.float32)
    ld = loader(pinnable.Arrays({"x": x}), batch_size=b, device="cuda:0", output=output)
    check_row_sums_on_a_side_stream(torch, ld, x, output, seed)


def test_cuda_token_windows_equal_the_host_batches(torch, rng, seed, tmp_path):
    context = int(rng.integers(16, 65))
    path = tmp_path / "train.bin"
    write_tokens(path, rng, int(rng.integers(3000, 8000)))
    s = int(rng.integers(0, 2**63))
    b = int(rng.integers(2, 17))
    host = list(loader(pinnable.TokenWindows(path, context), batch_size=b, shuffle=True, seed=s))
    gpu = list(loader(pinnable.TokenWindows(path, context), batch_size=b, shuffle=True, seed=s,
                      device="cuda:0", output="torch"))
    assert len(host) == len(gpu)
    for i, (h, g) in enumerate(zip(host, gpu)):
        for key in ("x", "y"):
            assert g[key].device == torch.device("cuda:0") and g[key].dtype == torch.int64
            np.testing.assert_array_equal(g[key].cpu().numpy(), h[key], err_msg=f"seed={seed} {i} {key}")


def test_cuda_packed_docs_equal_the_host_batches(torch, rng, seed, tmp_path):
    path = tmp_path / "docs.bin"
    write_docs(path, rng, int(rng.integers(100, 200)))
    s = int(rng.integers(0, 2**63))

    def src():
        return pinnable.PackedDocs(path, eot=EOT, budget=pinnable.Budget.packed(512, 2), seed=s)

    host = list(loader(src()))
    gpu = list(loader(src(), device="cuda:0", output="torch"))
    assert len(host) == len(gpu)
    for i, (h, g) in enumerate(zip(host, gpu)):
        assert set(h) == set(g)
        for key, value in h.items():
            if isinstance(value, np.ndarray):
                assert g[key].device == torch.device("cuda:0"), key
                np.testing.assert_array_equal(g[key].cpu().numpy(), value, err_msg=f"seed={seed} {i} {key}")
            else:
                assert g[key] == value, f"seed={seed} batch {i} {key}"


@pytest.mark.parametrize("output", ["torch", "dlpack"])
def test_copies_delayed_on_the_loaders_stream_are_waited_for(torch, rng, seed, output):
    # The loader's copy stream is held up by ~0.1 s of GPU sleep before the epoch's copies are
    # queued; with room for the whole epoch in flight (prefetch) the host loop ends before the
    # copies do, so work on a side stream reads right values only if it waits on the GPU.
    n, b, row = 128, 16, 64 * 1024
    x = rng.standard_normal((n, row), dtype=np.float32)
    ld = loader(pinnable.Arrays({"x": x}), batch_size=b, device="cuda:0", output=output,
                workers=2, prefetch=16)
    assert isinstance(ld.stream, int), ld.stream
    list(ld)  # warm: the epoch under test allocates nothing
    copies = torch.cuda.ExternalStream(ld.stream, device="cuda:0")
    torch.cuda.synchronize()
    with torch.cuda.stream(copies):
        torch.cuda._sleep(200_000_000)
    check_row_sums_on_a_side_stream(torch, ld, x, output, seed)


def test_cuda_image_folder_host_decode(torch, rng, seed, tmp_path):
    from _support import png_rgb

    size = int(rng.integers(8, 33))
    root = tmp_path / "train"
    want = []
    for label, name in enumerate(("a", "b")):
        (root / name).mkdir(parents=True)
        for k in range(3):
            p = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
            (root / name / f"{k}.png").write_bytes(png_rgb(p))
            want.append((p.transpose(2, 0, 1), label))
    codec = pinnable.ImageCodec(crop=size, resize=None, decode_on="host")
    ld = loader(pinnable.ImageFolder(root, codec), batch_size=len(want), device="cuda:0",
                output="torch")
    batch = next(iter(ld))
    assert batch["images"].device == torch.device("cuda:0")
    np.testing.assert_array_equal(batch["images"].cpu().numpy(), np.stack([w[0] for w in want]),
                                  err_msg=f"seed={seed}")
    np.testing.assert_array_equal(batch["labels"].cpu().numpy(), [w[1] for w in want])
