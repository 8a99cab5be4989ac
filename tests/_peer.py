"""Peer access in tests: start from none, and put the settings back."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import cuda_memkit as cm
from cuda_memkit._core import _driver


def disable_all() -> None:
    """Disable peer access between every two devices (what another test left enabled)."""
    n = cm.device_count()
    for a in range(n):
        for b in range(n):
            if a != b:
                cm.Device(a).disable_peer_access(b)


@contextmanager
def no_peer_access(auto: bool = True) -> Iterator[None]:
    """No peer access and ``configure_peer_access(auto=auto)`` inside.

    After: the settings as before, peer access disabled again (a test enables
    what it needs), and the thread's current context as before (buffers made
    on device 1 leave device 1's context current; the next test expects its own).
    """
    before = cm.peer_access_settings()
    ctx = _driver.call("cuCtxGetCurrent")
    disable_all()
    cm.configure_peer_access(auto=auto)
    try:
        yield
    finally:
        cm.configure_peer_access(auto=before.auto)
        disable_all()
        _driver.call("cuCtxSetCurrent", ctx)
