"""Peer access in tests: start from none, and put the settings back."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import cuda_memkit as cm


def disable_all() -> None:
    """Disable peer access between every two devices (what another test left enabled)."""
    n = cm.device_count()
    for a in range(n):
        for b in range(n):
            if a != b:
                cm.Device(a).disable_peer_access(b)


@contextmanager
def no_peer_access(auto: bool = True) -> Iterator[None]:
    """Inside: no peer access enabled, ``configure_peer_access(auto=auto)``; after: as before,
    with peer access disabled again (a test enables what it needs)."""
    before = cm.peer_access_settings()
    disable_all()
    cm.configure_peer_access(auto=auto)
    try:
        yield
    finally:
        cm.configure_peer_access(auto=before.auto)
        disable_all()
