"""Every kind of owning object, made the same way by the lifetime, context and exit tests.

``KINDS`` maps a name to a factory ``make(env) -> object``; dropping the object
(a list for the VMM trio) frees everything it owns, and :func:`close_all`
closes it explicitly. Sizes are small: these run on both backends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver

from . import _leaks

N = 1 << 20  # bytes per buffer


@dataclass
class Env:
    """What the factories share: a stream the buffers are ordered on."""

    stream: cm.Stream


def _vmm_trio(env: Env) -> list[Any]:
    g = cm.granularity(0)
    vr = cm.AddressRange.reserve(2 * g)
    pm = cm.PhysicalMemory.create(g)
    m = vr.map(pm, offset=g)
    m.set_access(0, cm.Access.READWRITE)
    return [m, pm, vr]


def _growable(env: Env) -> cm.GrowableBuffer:
    g = cm.granularity(0)
    buf = cm.GrowableBuffer(4 * g, chunk=g)
    buf.resize(2 * g)
    return buf


KINDS: dict[str, Callable[[Env], Any]] = {
    "HostBuffer": lambda env: cm.HostBuffer.empty(N),
    "HostBuffer.pooled": lambda env: cm.HostBuffer.pooled(N),
    "RegisteredHost": lambda env: cm.register_host(np.ones(N, np.uint8)),
    "DeviceBuffer": lambda env: cm.DeviceBuffer.empty(N),
    "ManagedBuffer": lambda env: cm.ManagedBuffer.empty(N),
    "PoolBuffer": lambda env: cm.MemoryPool.default(0).allocate(N, stream=env.stream),
    "PoolBuffer(legacy stream)": lambda env: cm.MemoryPool.default(0).allocate(N, stream=None),
    "MemoryPool": lambda env: cm.MemoryPool(0),
    "Stream": lambda env: cm.Stream(),
    "AddressRange": lambda env: cm.AddressRange.reserve(cm.granularity(0)),
    "PhysicalMemory": lambda env: cm.PhysicalMemory.create(cm.granularity(0)),
    "Mapping+PhysicalMemory+AddressRange": _vmm_trio,
    "GrowableBuffer": _growable,
}

#: Kinds whose memory is managed memory (the GPU leak check's allowance).
MANAGED = {"ManagedBuffer"}


def close_all(obj: Any) -> None:
    """Close ``obj`` (each element, in order, for a list)."""
    for o in obj if isinstance(obj, list) else [obj]:
        o.close()


def kind_params(names: list[str] | tuple[str, ...]) -> list[Any]:
    """``names`` for ``parametrize``, managed kinds marked ``uses_managed_memory``."""
    return [pytest.param(k, marks=pytest.mark.uses_managed_memory) if k in MANAGED else k
            for k in names]


def leaks_since(before: _leaks.Snapshot, settle: Callable[[], _leaks.Snapshot],
                managed: bool = False) -> list[str]:
    """What leaked since ``before`` (``settle()`` takes the new snapshot).

    Exact on the simulator. On a GPU with the suite's tolerances, waiting up to
    2 s for the driver to give back freed managed pages, as the leak check does.
    """
    tol = _leaks.GPU_MANAGED_TOLERANCE if managed else _leaks.GPU_TOLERANCE
    problems = before.leaks(settle(), tol)
    if problems and _driver.backend_name() == "cuda":
        deadline = time.monotonic() + 2.0
        while problems and time.monotonic() < deadline:
            time.sleep(0.05)
            problems = before.leaks(settle(), tol)
    return problems
