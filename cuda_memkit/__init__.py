"""cuda_memkit: safe, pleasant CUDA memory management from Python.

A thin layer over NVIDIA's ``cuda.bindings``: every driver status becomes a
value or a typed exception, and every allocation an object with a clear owner.
Importing the package makes no driver call and imports neither numpy nor the
feature modules: each loads on first use of one of its names.
"""

from __future__ import annotations

import os as _os
from typing import TYPE_CHECKING, Any

from ._core import _errors
from ._core._driver import backend_name, use_backend
from ._core._errors import *  # noqa: F403 - the exception tree, named once in its __all__

if TYPE_CHECKING:  # the type checker and the docs see every name statically
    from ._core._access import Access
    from ._core._buffer import Buffer, MemoryKind
    from ._core._capture import Graph, watch_captures
    from ._core._device import Device, device_count
    from ._core._location import Location, LocationType
    from ._core._peer import PeerAccessSettings, configure_peer_access, peer_access_settings
    from ._core._stream import Stream
    from ._device_memory._device_buffer import DeviceBuffer
    from ._host._pinned import HostAllocFlags, HostBuffer
    from ._host._registered import HostRegisterFlags, RegisteredHost, register_host
    from ._host._ring_core import WorkerError
    from ._host._ring_worker import RingHandle, RingWriter, WriterSlot
    from ._host._shared_ring import RingSlot, SharedHostRing
    from ._loading._loader import Loader
    from ._managed_memory._access_plan import AccessChunk, AccessPlan, AccessRun
    from ._managed_memory._managed import AttachFlags, ManagedBuffer
    from ._managed_memory._managed_ranges import MemAdvice, RangeInfo
    from ._managed_memory._policy import ManagedMemoryHints, MigrationPolicy
    from ._managed_memory._prefetch_plan import PlanEntry, PlannedCall, PrefetchPlan
    from ._managed_memory._residency import Residency, ResidencyRun, managed_residency
    from ._observability._observe import Allocation, Frame, MemoryEvent
    from ._observability._stats import (
        MEMORY_KINDS,
        KindStats,
        MemoryStats,
        Usage,
        memory_stats,
        reset_peak_stats,
    )
    from ._observability._track_report import KindSummary, SiteSummary, Timeline, TrackSummary
    from ._observability._tracking import Tracker, track
    from ._pools._pool import MemoryPool, PoolBuffer, PoolStats
    from ._transfer._copy_batch import CopyBatch, copy_batch
    from ._transfer._staging import (
        StagingSettings,
        configure_staging,
        release_staging,
        staging_settings,
    )
    from ._transfer._transfers import copy, copy_async
    from ._virtual._growable import GrowableBuffer
    from ._virtual._vmm import AddressRange, Mapping, PhysicalMemory
    from ._virtual._vmm_base import HandleType, granularity

# Feature modules load on first use of one of their names (PEP 562), so that
# ``import cuda_memkit`` stays cheap: each module -> the public names it gives.
_LAZY_MODULES: dict[str, tuple[str, ...]] = {
    "_core._buffer": ("Buffer", "MemoryKind"),
    "_core._device": ("Device", "device_count"),
    "_core._location": ("Location", "LocationType"),
    "_core._stream": ("Stream",),
    "_core._peer": ("PeerAccessSettings", "configure_peer_access", "peer_access_settings"),
    "_device_memory._device_buffer": ("DeviceBuffer",),
    "_transfer._transfers": ("copy", "copy_async"),
    "_transfer._copy_batch": ("CopyBatch", "copy_batch"),
    "_transfer._staging": (
        "StagingSettings", "configure_staging", "release_staging", "staging_settings",
    ),
    "_host._pinned": ("HostAllocFlags", "HostBuffer"),
    "_host._registered": ("HostRegisterFlags", "RegisteredHost", "register_host"),
    "_host._shared_ring": ("RingSlot", "SharedHostRing"),
    "_host._ring_core": ("WorkerError",),
    "_host._ring_worker": ("RingHandle", "RingWriter", "WriterSlot"),
    "_loading._loader": ("Loader",),
    "_managed_memory._managed": ("AttachFlags", "ManagedBuffer"),
    "_managed_memory._managed_ranges": ("MemAdvice", "RangeInfo"),
    "_managed_memory._policy": ("ManagedMemoryHints", "MigrationPolicy"),
    "_managed_memory._prefetch_plan": ("PlanEntry", "PlannedCall", "PrefetchPlan"),
    "_managed_memory._access_plan": ("AccessChunk", "AccessPlan", "AccessRun"),
    "_core._access": ("Access",),
    "_virtual._vmm_base": ("HandleType", "granularity"),
    "_virtual._vmm": ("AddressRange", "Mapping", "PhysicalMemory"),
    "_virtual._growable": ("GrowableBuffer",),
    "_pools._pool": ("MemoryPool", "PoolBuffer", "PoolStats"),
    "_observability._stats": ("MEMORY_KINDS", "KindStats", "MemoryStats", "Usage", "memory_stats",
               "reset_peak_stats"),
    "_observability._tracking": ("Tracker", "track"),
    "_observability._observe": ("Allocation", "Frame", "MemoryEvent"),
    "_observability._track_report": ("KindSummary", "SiteSummary", "Timeline", "TrackSummary"),
    "_managed_memory._residency": ("Residency", "ResidencyRun", "managed_residency"),
    "_core._capture": ("Graph", "watch_captures"),
}
# Modules that plug into a feature module and must load with it: the pinned
# block cache serves HostBuffer.pooled() and pinned pools, and depends on both.
# The transfers plug copy() into every buffer's copy_from/copy_to (_core._buffer.copier).
# A Loader allocates from pools (the pinned cache plugs into them) and copies.
_COMPANIONS: dict[str, tuple[str, ...]] = {
    "_host._pinned": ("_host._pinned_pool", "_transfer._transfers"),
    "_pools._pool": ("_host._pinned_pool", "_transfer._transfers"),
    "_device_memory._device_buffer": ("_transfer._transfers",),
    "_host._registered": ("_transfer._transfers",),
    "_host._shared_ring": ("_transfer._transfers",),
    "_loading._loader": ("_host._pinned_pool", "_transfer._transfers"),
    "_managed_memory._managed": ("_transfer._transfers",),
    "_virtual._vmm": ("_transfer._transfers",),
    "_virtual._growable": ("_transfer._transfers",),
}
_LAZY: dict[str, str] = {name: mod for mod, names in _LAZY_MODULES.items() for name in names}

#: The version of cuda_memkit: the one place it is written (the package metadata reads it).
__version__ = "0.1.0"

__all__ = [
    "MEMORY_KINDS",
    "Access",
    "AddressRange",
    "Allocation",
    "AttachFlags",
    "Buffer",
    "CopyBatch",
    "Device",
    "DeviceBuffer",
    "Frame",
    "GrowableBuffer",
    "HandleType",
    "HostAllocFlags",
    "HostBuffer",
    "HostRegisterFlags",
    "KindStats",
    "KindSummary",
    "Loader",
    "Location",
    "LocationType",
    "ManagedBuffer",
    "ManagedMemoryHints",
    "Mapping",
    "MemAdvice",
    "MemoryEvent",
    "MemoryKind",
    "MemoryPool",
    "MemoryStats",
    "MigrationPolicy",
    "PeerAccessSettings",
    "PhysicalMemory",
    "PlanEntry",
    "PlannedCall",
    "PoolBuffer",
    "PoolStats",
    "PrefetchPlan",
    "RangeInfo",
    "RegisteredHost",
    "RingHandle",
    "RingSlot",
    "RingWriter",
    "SharedHostRing",
    "SiteSummary",
    "StagingSettings",
    "Stream",
    "Timeline",
    "TrackSummary",
    "Tracker",
    "Usage",
    "WorkerError",
    "WriterSlot",
    "__version__",
    "backend_name",
    "configure_peer_access",
    "configure_staging",
    "copy",
    "copy_async",
    "copy_batch",
    "device_count",
    "granularity",
    "memory_stats",
    "peer_access_settings",
    "register_host",
    "release_staging",
    "reset_peak_stats",
    "staging_settings",
    "track",
    "use_backend",
]
__all__ += _errors.__all__
__all__ += ["Residency", "ResidencyRun", "managed_residency"]
__all__ += ["Graph", "watch_captures"]
__all__ += ["AccessChunk", "AccessPlan", "AccessRun"]


def _publish(names: tuple[str, ...] | list[str]) -> None:
    """Show public objects as ``cuda_memkit.X`` (docs, reprs, pickles stay stable)."""
    g = globals()
    for name in names:
        obj = g[name]
        if getattr(obj, "__module__", "").startswith("cuda_memkit._"):
            try:
                obj.__module__ = __name__
            except (AttributeError, TypeError):
                continue


def __getattr__(name: str) -> Any:
    """Load the feature module that defines ``name`` on first use (PEP 562)."""
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'cuda_memkit' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(f"{__name__}.{mod}")
    for companion in _COMPANIONS.get(mod, ()):
        importlib.import_module(f"{__name__}.{companion}")
    names = _LAZY_MODULES[mod]
    g = globals()
    for n in names:
        g[n] = getattr(module, n)
    _publish(names)
    return g[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


_publish([n for n in __all__ if n in globals()])

# CUDA_MEMKIT_LEAK_REPORT=1: record allocation stacks from now on and print
# what still owns memory at interpreter exit (cuda_memkit._observability._leak_report).
if _os.environ.get("CUDA_MEMKIT_LEAK_REPORT", "") not in ("", "0"):
    from ._observability._leak_report import install as _install_leak_report

    _install_leak_report()
