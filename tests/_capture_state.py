"""The capture tests' autouse fixture: each test leaves capture state and graph memory as found."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cuda.bindings import driver as cu

from cuda_memkit._core import _capture, _driver
from cuda_memkit._core._context import primary_pushed


@pytest.fixture(autouse=True)
def trim_graph_memory() -> Iterator[None]:
    """Each test leaves the device as it found it, so that nothing cascades into later tests.

    No capture flag left up (:data:`_capture.active`: every later allocation would
    ask the driver, and deferred frees would wait forever); what waits for the end
    of a capture freed; then the graph memory freed goes back to the system (the
    driver keeps it mapped, in 32 MiB chunks, until ``cuDeviceGraphMemTrim``)
    before the leak check reads the device's free memory.
    """
    before = _capture.active
    yield
    leaked = _capture.active - before
    if leaked > 0:
        _capture._change(-leaked)
    _capture.retry_deferred()
    with primary_pushed(0):
        _driver.call("cuCtxSynchronize")  # the frees queued on streams are done
    _driver.call("cuDeviceGraphMemTrim", cu.CUdevice(0))
    assert leaked <= 0, f"the test left {leaked} capture(s) counted in _capture.active"
