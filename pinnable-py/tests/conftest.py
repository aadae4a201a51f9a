"""Fixtures of the pinnable test suite.

Every test that draws data takes the ``rng`` fixture (or ``seed``): a NumPy ``default_rng``
seeded fresh each run from ``os.urandom``, or from ``PINNABLE_TEST_SEED`` when it is set. A
failing test prints its seed and the command line that reruns it with that seed.

CI runs the suite with NumPy and pytest alone: torch tests call ``pytest.importorskip("torch")``,
GPU tests skip with ``skipped: no CUDA device: ...`` (shown by ``-rs``).
"""

import os
import sys

import numpy as np
import pytest

# The helpers module (_support.py) beside this file, whatever pytest's import mode.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SEED_ENV = "PINNABLE_TEST_SEED"


def draw_seed() -> int:
    """``PINNABLE_TEST_SEED`` when set, else 63 fresh random bits."""
    value = os.environ.get(SEED_ENV)
    if value:
        return int(value, 0)
    return int.from_bytes(os.urandom(8), "little") >> 1


def _with_skips(chars: str) -> str:
    if any(c in chars for c in "saAN"):
        return chars
    return chars + "s"


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    # Skip reasons on their own lines even when pytest.ini (addopts = -rs) is not the one read.
    chars = getattr(config.option, "reportchars", None)
    if isinstance(chars, str):
        config.option.reportchars = _with_skips(chars)
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if reporter is not None and isinstance(getattr(reporter, "reportchars", None), str):
        reporter.reportchars = _with_skips(reporter.reportchars)


@pytest.fixture
def seed(request) -> int:
    """This test's seed; printed with the rerun line when the test fails."""
    s = draw_seed()
    request.node._pinnable_seed = s
    return s


@pytest.fixture
def rng(seed) -> np.random.Generator:
    """A generator seeded with this test's seed."""
    return np.random.default_rng(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    s = getattr(item, "_pinnable_seed", None)
    if s is not None and report.failed:
        report.sections.append(
            (
                "pinnable test seed",
                f"seed {s}; rerun with: {SEED_ENV}={s} python -m pytest '{item.nodeid}'",
            )
        )
