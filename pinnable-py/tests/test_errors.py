"""Bad arguments: refused with an exception whose message names the setting and what to do."""

import os
import subprocess
import sys

import numpy as np
import pytest

import pinnable
from _support import loader, rows_xy, write_tokens


@pytest.fixture
def arrays(rng):
    x, y = rows_xy(rng, 40)
    return pinnable.Arrays({"x": x, "y": y})


def raises_on_build_or_first_batch(kinds, build):
    with pytest.raises(kinds) as info:
        ld = build()
        next(iter(ld))
    return str(info.value)


def test_exception_types():
    assert issubclass(pinnable.Error, RuntimeError)
    assert issubclass(pinnable.ConfigError, pinnable.Error)
    assert issubclass(pinnable.ConfigError, ValueError)


def test_batch_size_zero(arrays):
    text = raises_on_build_or_first_batch(pinnable.ConfigError, lambda: loader(arrays, batch_size=0))
    assert "batch_size" in text and "at least 1" in text, text


def test_unknown_output(arrays):
    text = raises_on_build_or_first_batch(ValueError, lambda: loader(arrays, batch_size=4, output="bogus"))
    assert "bogus" in text and "numpy" in text and "torch" in text and "dlpack" in text, (
        f"the message should name the value and the outputs there are: {text!r}"
    )


def test_a_device_that_is_not_there(arrays):
    text = raises_on_build_or_first_batch(
        pinnable.Error, lambda: loader(arrays, batch_size=4, device="cuda:99", output="dlpack")
    )
    assert "99" in text or "cuda" in text.lower(), text


def test_unknown_device_string(arrays):
    text = raises_on_build_or_first_batch(
        (pinnable.Error, ValueError), lambda: loader(arrays, batch_size=4, device="tpu:0")
    )
    assert "tpu" in text, text


def test_unknown_dtype(rng, tmp_path):
    path = tmp_path / "t.bin"
    write_tokens(path, rng, 1000)
    with pytest.raises(ValueError) as info:
        pinnable.TokenWindows(path, 16, dtype="float16")
    text = str(info.value)
    assert "float16" in text and "int64" in text and "int32" in text, text
    with pytest.raises(ValueError) as info:
        pinnable.ImageCodec(crop=8, dtype="int7")
    assert "int7" in str(info.value) and "uint8" in str(info.value), str(info.value)


def test_context_longer_than_the_file(rng, tmp_path):
    path = tmp_path / "t.bin"
    n = int(rng.integers(20, 200))
    write_tokens(path, rng, n)
    with pytest.raises(pinnable.ConfigError) as info:
        src = pinnable.TokenWindows(path, n + int(rng.integers(0, 100)))
        next(iter(loader(src, batch_size=2)))
    text = str(info.value)
    assert "context" in text and str(n) in text, text


def test_arrays_of_different_lengths(rng):
    with pytest.raises((pinnable.Error, ValueError)) as info:
        pinnable.Arrays({"alpha_key": np.zeros((10, 2), np.float32), "beta_key": np.zeros(11, np.int64)})
    text = str(info.value)
    assert "alpha_key" in text or "beta_key" in text, text


def test_import_without_a_gpu_and_cuda_device_refused(arrays, tmp_path):
    # `import pinnable` needs no GPU: a fresh interpreter imports it and asks.
    out = subprocess.run(
        [sys.executable, "-c", "import pinnable; print(pinnable.cuda_available(), pinnable.device_count())"],
        capture_output=True, text=True, timeout=60,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""), cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "0"], out.stdout
    if pinnable.cuda_available():
        pytest.skip("skipped: a CUDA device is here; the no-GPU refusal is not testable")
    with pytest.raises(pinnable.Error) as info:
        ld = loader(arrays, batch_size=4, device="cuda", output="dlpack")
        next(iter(ld))
    text = str(info.value)
    assert "cuda" in text.lower() or "CUDA" in text, text
    assert "cpu" in text.lower(), f"the message should say to use the host (device='cpu'): {text!r}"


def test_mix_of_different_kinds_is_refused(arrays, rng, tmp_path):
    path = tmp_path / "t.bin"
    write_tokens(path, rng, 1000)
    with pytest.raises(pinnable.ConfigError) as info:
        pinnable.Mix([(arrays, 1.0), (pinnable.TokenWindows(path, 16), 1.0)])
    assert "Mix" in str(info.value) or "mix" in str(info.value), str(info.value)


def test_bad_mix_weights(arrays):
    for weights in ((1.0, 0.0), (1.0, -2.0), (1.0, float("nan"))):
        with pytest.raises(pinnable.ConfigError) as info:
            pinnable.Mix([(arrays, weights[0]), (arrays, weights[1])])
        assert "weight" in str(info.value), str(info.value)
