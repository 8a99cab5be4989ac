"""Test configuration: backend selection, markers and the leak check.

The suite runs on the backend named by ``CUDA_MEMKIT_BACKEND``; when it is not
set, the CPU simulator is used and the report header says so.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable, Iterator

import pytest

os.environ.setdefault("CUDA_MEMKIT_BACKEND", "sim")

import cuda_memkit as cm
from cuda_memkit._core import _driver

from ._leaks import (
    GPU_FRAMEWORK_TOLERANCE,
    GPU_MANAGED_TOLERANCE,
    GPU_TOLERANCE,
    Snapshot,
    snapshot,
)

BACKEND = _driver.backend_name()


def pytest_configure(config: pytest.Config) -> None:
    # The ledger half of the leak check is cuda_memkit's plugin: never run without it.
    if not config.getoption("memkit_leaks", False):
        raise pytest.UsageError("the suite's leak check needs cuda_memkit's plugin: "
                                "-p cuda_memkit.pytest_plugin --memkit-leaks (see addopts)")


def pytest_collection_finish(session: pytest.Session) -> None:
    # Every test's leak check runs gc.collect(), which walks every tracked object: with the
    # collected test items, the imported modules and their caches that was most of the
    # suite's CPU time. Nothing made so far is a test's garbage, so the collector may
    # skip it from now on (objects made by the tests are collected as before).
    gc.freeze()


def pytest_report_header(config: pytest.Config) -> str:
    label = "CPU simulator" if BACKEND == "sim" else "real CUDA driver"
    return f"cuda_memkit backend: {BACKEND} ({label})"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A test that needs two devices is a multi_gpu test, however it asks for them: a GPU
    # machine can then run the rest one process per device and these with every device.
    multi = pytest.mark.multi_gpu
    for item in items:
        if "two_devices" in getattr(item, "fixturenames", ()):
            item.add_marker(multi)
    if BACKEND == "sim":
        return
    skip = pytest.mark.skip(reason="simulator-only test (exercises simulator configuration)")
    for item in items:
        if "sim_only" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def backend() -> str:
    """Name of the active backend: "sim" or "cuda"."""
    return BACKEND


@pytest.fixture(scope="session")
def ndevices() -> int:
    return cm.device_count()


@pytest.fixture
def two_devices(ndevices: int) -> None:
    if ndevices < 2:
        pytest.skip("needs two devices")


@pytest.fixture
def stream() -> Iterator[cm.Stream]:
    s = cm.Stream()
    yield s
    s.synchronize()
    s.close()


@pytest.fixture(scope="module")
def default_pinned() -> cm.MemoryPool:
    """The process-wide pinned pool, its stream made and nothing cached.

    Modules that use pooled pinned memory request it (``usefixtures``) so that
    it exists before the leak check's first snapshot.
    """
    pool = cm.MemoryPool.default_pinned()
    cm.HostBuffer.pooled(1).close()
    pool.trim()
    return pool


@pytest.fixture
def flush_pinned(default_pinned: cm.MemoryPool) -> Iterator[None]:
    """After the test: collect, and give cached pinned blocks back (for the leak check)."""
    yield
    gc.collect()
    default_pinned.trim()


@pytest.fixture
def no_batch() -> Iterator[None]:
    """Simulator: the batch prefetch/discard functions are missing (a driver before CUDA 13.0)."""
    from cuda_memkit.sim import machine

    m = machine()
    m.batch_calls = False
    try:
        yield
    finally:
        m.batch_calls = True


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves driver resources behind (after gc.collect()).

    The ledger (what cuda_memkit's objects own) is checked by the plugin
    (``--memkit-leaks``), which names the allocation sites; this fixture
    checks the simulated machine's tables, or cuMemGetInfo on a GPU.
    """
    if "memkit_allow_leaks" in request.keywords:
        yield
        return
    tolerance = (GPU_FRAMEWORK_TOLERANCE if "framework_kernels" in request.keywords
                 else GPU_MANAGED_TOLERANCE if "uses_managed_memory" in request.keywords
                 else GPU_TOLERANCE)
    before: Snapshot = snapshot()
    yield
    operands = sys.modules.get("cuda_memkit._core._inflight")
    if operands is not None and operands.pending_operands:  # copies still running hold
        operands.wait_pending()  # their operands, and closed owners are released after them
    staging = sys.modules.get("cuda_memkit._transfer._staging")
    if staging is not None:  # the staging ring is a cache kept across copies: give it back
        staging.release_staging()
    gc.collect()
    cache = sys.modules.get("cuda_memkit._pools._cache")
    if cache is not None:  # the block caches keep freed blocks: give them back
        cache.empty_all()
    after = snapshot()
    problems = before.leaks(after, tolerance)
    # The real driver gives the device pages of freed managed memory back a
    # little after cuMemFree returns: let it settle before calling it a leak.
    if problems and BACKEND == "cuda":
        deadline = time.monotonic() + 2.0
        while problems and time.monotonic() < deadline:
            time.sleep(0.05)
            problems = before.leaks(snapshot(), tolerance)
    assert not problems, "leaked: " + "; ".join(problems)


@pytest.fixture
def copies_in_flight(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], None]]:
    """Asynchronous copies stay "running" (their events answer not ready) until the returned
    call: the simulator completes every copy at once, a GPU only sometimes."""
    from cuda_memkit._core import _inflight

    running = [True]
    done = _inflight._event_done
    monkeypatch.setattr(_inflight, "_event_done", lambda ev: not running[0] and done(ev))

    def finish() -> None:
        running[0] = False

    yield finish
    finish()
    _inflight.reap_pending()
