"""What the operating system says of this host: its NUMA nodes.

A leaf below every layer: it imports nothing of the package, so the library's
checks and the simulator's driver read the same answer from one place.
"""

from __future__ import annotations

import functools
import os


@functools.lru_cache(maxsize=1)
def host_numa_nodes() -> frozenset[int]:
    """The host NUMA node ids of this machine (``{0}`` where the OS does not say)."""
    try:
        names = os.listdir("/sys/devices/system/node")
    except OSError:
        return frozenset({0})
    nodes = {int(n[4:]) for n in names if n.startswith("node") and n[4:].isdigit()}
    return frozenset(nodes or {0})
