"""Nothing was allocated or changed": a ledger of driver resources on either backend.

:func:`nothing_allocated` wraps a block that must fail without side effects:

* it records the driver calls made inside (through ``_driver.call`` and
  ``_driver.function``) and fails if any of them allocates, registers, maps,
  creates a handle, or issues hints/prefetches (:data:`FORBIDDEN`);
* it compares a :func:`ledger` from before and after: on the simulator the
  exact sizes of the allocation table, streams, events, every ``Machine.ext``
  table, the bytes charged to each device and to the host; on a GPU the free
  memory of every device (``cuMemGetInfo``, within :data:`GPU_SLACK`);
* where the library provides allocation statistics (``cuda_memkit.memory_stats()``,
  planned), it compares their *current* entries too.

The spy sees the block cache's pre-resolved pool allocation and free too; the
ledger catches anything else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver

from . import _leaks
from ._helpers import ISSUING, driver_spy

#: Driver calls that create something (memory, registrations, mappings, handles).
ALLOCATING = frozenset({
    "cuMemAlloc", "cuMemAllocManaged", "cuMemAllocHost", "cuMemHostAlloc",
    "cuMemHostRegister", "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemPoolCreate",
    "cuMemPoolImportFromShareableHandle", "cuMemPoolImportPointer", "cuMemCreate",
    "cuMemAddressReserve", "cuMemMap", "cuMemImportFromShareableHandle",
    "cuMemExportToShareableHandle", "cuMemPoolExportToShareableHandle",
    "cuStreamCreate", "cuStreamCreateWithPriority", "cuEventCreate", "cuCtxCreate",
    "cuModuleLoadData",
})
#: Calls a failing call must not make: the allocating ones and those that issue hints.
FORBIDDEN = ALLOCATING | ISSUING | {"cuMemSetAccess", "cuMemPoolSetAccess",
                                    "cuMemPoolSetAttribute", "cuStreamAttachMemAsync",
                                    "cuMemcpy", "cuMemcpyAsync", "cuMemsetD8",
                                    "cuMemsetD8Async", "cuMemcpyBatchAsync",
                                    "cuMemcpyHtoDAsync", "cuLaunchKernel",
                                    "cuCtxEnablePeerAccess", "cuCtxDisablePeerAccess"}
#: Free memory a GPU may report differently between two reads with nothing allocated.
GPU_SLACK = 2 << 20

_STAT_WORDS = ("current", "live", "active", "in_use", "allocated")
_NOT_CURRENT = ("peak", "high", "total", "count_all", "cumulative")


@dataclass
class Ledger:
    counts: dict[str, int] = field(default_factory=dict)
    free: dict[int, int] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)

    def differences(self, after: Ledger) -> list[str]:
        out = []
        for key in sorted(set(self.counts) | set(after.counts)):
            a, b = self.counts.get(key, 0), after.counts.get(key, 0)
            if a != b:
                out.append(f"{key}: {a} -> {b}")
        for dev, free in self.free.items():
            now = after.free.get(dev, free)
            # only a drop is memory taken: free memory also rises when the driver
            # gives a pool's unused memory back at a synchronization (H100 run)
            if free - now > GPU_SLACK:
                out.append(f"device {dev} free memory: {free} -> {now}")
        for key in sorted(set(self.stats) | set(after.stats)):
            if self.stats.get(key) != after.stats.get(key):
                out.append(f"memory_stats {key}: {self.stats.get(key)} -> {after.stats.get(key)}")
        return out


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif hasattr(value, "_asdict"):
        _flatten(prefix, value._asdict(), out)
    else:
        out[prefix] = value


def current_stats() -> dict[str, Any]:
    """The *current* entries of ``cuda_memkit.memory_stats()``, if the library has it."""
    fn = getattr(cm, "memory_stats", None)
    if fn is None or not callable(fn):
        return {}
    flat: dict[str, Any] = {}
    _flatten("", fn(), flat)
    return {k: v for k, v in flat.items()
            if any(w in k.lower() for w in _STAT_WORDS)
            and not any(w in k.lower() for w in _NOT_CURRENT)}


def ledger() -> Ledger:
    """What exists now: exact on the simulator, free memory per device on a GPU."""
    snap = _leaks.snapshot()
    out = Ledger(dict(snap.counts), dict(snap.free), current_stats())
    if _driver.backend_name() == "sim":
        from cuda_memkit.sim import machine

        out.counts["host bytes in use"] = machine().host_used
    return out


@contextlib.contextmanager
def record_api_names(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, bool]]]:
    """The driver calls made inside, as ``(name, succeeded)`` (all of them: :func:`driver_spy`)."""
    calls: list[tuple[str, bool]] = []
    with driver_spy(monkeypatch, lambda api, args, ok: calls.append((api, ok))):
        yield calls


@contextlib.contextmanager
def nothing_allocated(monkeypatch: pytest.MonkeyPatch, *, driver_may_refuse: bool = False,
                      undone: bool = False) -> Iterator[list[tuple[str, bool]]]:
    """Fail if the block makes a forbidden driver call or changes the ledger.

    With ``driver_may_refuse`` a forbidden call that *failed* (the driver
    refusing the request, which is then the expected error) is allowed. With
    ``undone`` forbidden calls are allowed altogether: a multi-step operation
    that failed part-way must have undone them, which the ledger checks.
    """
    before = ledger()
    with record_api_names(monkeypatch) as calls:
        yield calls
    after = ledger()
    bad = [n for n, ok in calls
           if n in FORBIDDEN and not undone and (ok or not driver_may_refuse)]
    assert not bad, f"forbidden driver calls on a failing path: {bad}"
    diff = before.differences(after)
    assert not diff, "the failing call changed: " + "; ".join(diff)
