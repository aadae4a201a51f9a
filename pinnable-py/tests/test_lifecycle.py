"""How loaders and their epochs end: Ctrl-C during a wait, close() with several iterators
alive, and the interpreter's exit with an epoch still running."""

import _thread
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import pinnable


class Slow:
    """A Python dataset whose samples take `delay` seconds each (the GIL let go meanwhile)."""

    def __init__(self, n, delay):
        self.n, self.delay = n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i > 0:
            time.sleep(self.delay)
        return {"x": np.full(3, i, dtype=np.int64)}


def test_ctrl_c_interrupts_a_wait_for_a_batch():
    ld = pinnable.Loader(pinnable.Dataset(Slow(64, 2.0)), batch_size=8, workers=1,
                         output="numpy", device="cpu")
    it = iter(ld)
    timer = threading.Timer(0.2, _thread.interrupt_main)
    start = time.perf_counter()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        next(it)
    waited = time.perf_counter() - start
    timer.join()
    # The first batch needs 7 samples of 2 s: only the interrupt ends the wait this early.
    assert waited < 1.5, f"next() returned after {waited:.2f} s"
    it.close()
    ld.close()


def test_close_stops_every_iterator_of_the_loader(rng, seed):
    n = int(rng.integers(40, 80))
    x = rng.integers(0, 1 << 30, size=(n, 2))
    ld = pinnable.Loader(pinnable.Arrays({"x": x}), batch_size=4, output="numpy", device="cpu")
    first, second = iter(ld), iter(ld)
    np.testing.assert_array_equal(next(first)["x"], x[:4], err_msg=f"seed={seed}")
    np.testing.assert_array_equal(next(second)["x"], x[:4], err_msg=f"seed={seed}")
    ld.close()
    assert list(first) == [] and list(second) == [], f"seed={seed}"
    assert len(first) == 0 and len(second) == 0
    with pytest.raises(pinnable.Error, match="closed"):
        iter(ld)


def test_load_state_dict_stops_running_iterators(rng, seed):
    n = int(rng.integers(40, 80))
    x = rng.integers(0, 1 << 30, size=(n, 2))
    ld = pinnable.Loader(pinnable.Arrays({"x": x}), batch_size=4, output="numpy", device="cpu")
    it = iter(ld)
    next(it)
    next(it)
    state = ld.state_dict()
    ld.load_state_dict(state)
    assert list(it) == [], f"seed={seed}"
    rest = [b["x"] for b in ld]
    np.testing.assert_array_equal(np.concatenate(rest), x[8:], err_msg=f"seed={seed}")


def test_the_interpreter_exits_with_an_epoch_of_a_python_dataset_running(tmp_path):
    # Workers wait in __getitem__ (the GIL let go) when the script ends without closing
    # anything: the exit stops the epoch first, and the process ends cleanly.
    script = tmp_path / "exit.py"
    script.write_text(textwrap.dedent("""
        import time
        import numpy as np
        import pinnable

        class Slow:
            def __len__(self):
                return 1000
            def __getitem__(self, i):
                time.sleep(0.05)
                return {"x": np.full(3, i)}

        loader = pinnable.Loader(pinnable.Dataset(Slow()), batch_size=4, workers=2,
                                 prefetch=4, output="numpy", device="cpu")
        it = iter(loader)
        next(it)
        print("left running", flush=True)
    """))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "left running" in done.stdout
    assert time.perf_counter() - start < 30
