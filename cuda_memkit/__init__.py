"""cuda_memkit: safe, pleasant CUDA memory management from Python.

A thin layer over NVIDIA's ``cuda.bindings``: every driver status becomes a
value or a typed exception, and every allocation an object with a clear owner.
Importing the package makes no driver call and does not import numpy.
"""

from __future__ import annotations

from ._device import Device, Location, LocationType, Stream, device_count
from ._driver import backend_name, use_backend
from ._errors import (
    ClosedError,
    CudaAlreadyMappedError,
    CudaDriverNotFoundError,
    CudaError,
    CudaHostMemoryAlreadyRegisteredError,
    CudaHostMemoryNotRegisteredError,
    CudaInvalidContextError,
    CudaInvalidDeviceError,
    CudaInvalidHandleError,
    CudaInvalidValueError,
    CudaNoDeviceError,
    CudaNotInitializedError,
    CudaNotMappedError,
    CudaNotPermittedError,
    CudaNotSupportedError,
    CudaOutOfMemoryError,
    MemkitWarning,
)

# -- managed exports (issue 4) --
from ._hints import ManagedMemoryHints, MigrationPolicy, PlanEntry, PlannedCall, PrefetchPlan
from ._managed import AttachFlags, ManagedBuffer, MemAdvice, RangeInfo

# -- pinned exports (issue 3) --
from ._memory import DeviceBuffer, copy, copy_async
from ._pinned import (
    HostAllocFlags,
    HostBuffer,
    HostRegisterFlags,
    RegisteredHost,
    register_host,
)

# -- pool exports (issue 6) --
from ._pool import MemoryPool, PoolBuffer, PoolStats

# -- vmm exports (issue 5) --
from ._vmm import (
    Access,
    AddressRange,
    GrowableBuffer,
    HandleType,
    Mapping,
    PhysicalMemory,
    granularity,
)

__version__ = "0.1.0"

__all__ = [
    "ClosedError",
    "CudaAlreadyMappedError",
    "CudaDriverNotFoundError",
    "CudaError",
    "CudaHostMemoryAlreadyRegisteredError",
    "CudaHostMemoryNotRegisteredError",
    "CudaInvalidContextError",
    "CudaInvalidDeviceError",
    "CudaInvalidHandleError",
    "CudaInvalidValueError",
    "CudaNoDeviceError",
    "CudaNotInitializedError",
    "CudaNotMappedError",
    "CudaNotPermittedError",
    "CudaNotSupportedError",
    "CudaOutOfMemoryError",
    "Device",
    "Location",
    "LocationType",
    "MemkitWarning",
    "Stream",
    "__version__",
    "backend_name",
    "device_count",
    "use_backend",
    # -- pinned names (issue 3) --
    "DeviceBuffer",
    "HostAllocFlags",
    "HostBuffer",
    "HostRegisterFlags",
    "RegisteredHost",
    "copy",
    "copy_async",
    "register_host",
    # -- managed names (issue 4) --
    "AttachFlags",
    "ManagedBuffer",
    "ManagedMemoryHints",
    "MemAdvice",
    "MigrationPolicy",
    "PlanEntry",
    "PlannedCall",
    "PrefetchPlan",
    "RangeInfo",
    # -- vmm names (issue 5) --
    "Access",
    "AddressRange",
    "GrowableBuffer",
    "HandleType",
    "Mapping",
    "PhysicalMemory",
    "granularity",
    # -- pool names (issue 6) --
    "MemoryPool",
    "PoolBuffer",
    "PoolStats",
]


def _publish() -> None:
    """Show public objects as ``cuda_memkit.X`` (docs, reprs, pickles stay stable)."""
    g = globals()
    for name in __all__:
        obj = g[name]
        if getattr(obj, "__module__", "").startswith("cuda_memkit._"):
            try:
                obj.__module__ = __name__
            except (AttributeError, TypeError):
                continue


_publish()
