"""Virtual memory management: the shared vocabulary of ``_vmm`` and ``_growable``.

The :class:`HandleType` enum, the argument checks of the VMM calls (sizes that
must be multiples of the granularity, handle types), :func:`granularity`, the
``CUmemAllocationProp`` builder and the one-call release functions. The access
vocabulary (:class:`Access`, access targets and descriptors) is shared with
pools and lives in ``_core._access``.
"""

from __future__ import annotations

import enum
import threading

from cuda.bindings import driver as _cu

from .._core import _driver
from .._core._access import TargetLike
from .._core._checks import check_bool
from .._core._context import ensure_context
from .._core._device import device_count
from .._core._location import Location, LocationType, to_location

__all__ = ["HandleType", "granularity"]

_PINNED = _cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
_GRAN_MIN = _cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
_GRAN_REC = _cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED

#: One lock for every VMM bookkeeping change (finalizers may run on any thread).
LOCK = threading.RLock()


class HandleType(enum.IntEnum):
    """Shareable handle type of physical memory (``CUmemAllocationHandleType``).

    ``POSIX_FD`` is what :meth:`PhysicalMemory.export` produces on Linux.
    """

    NONE = 0
    POSIX_FD = 1
    FABRIC = 8


# -- argument checks ------------------------------------------------------------


def check_multiple(name: str, value: int, gran: int) -> None:
    if value % gran:
        raise ValueError(
            f"{name} ({value} bytes) is not a multiple of the allocation granularity "
            f"({gran} bytes); round it up with granularity()"
        )


def check_handle_type(value: object) -> HandleType:
    if value is None:
        return HandleType.NONE
    if isinstance(value, HandleType):
        return value
    if isinstance(value, str):
        try:
            return HandleType[value.upper()]
        except KeyError:
            raise ValueError(f"unknown handle type {value!r}") from None
    if isinstance(value, bool):
        raise TypeError("handle_type cannot be a bool")
    if isinstance(value, (int, _cu.CUmemAllocationHandleType)):
        try:
            return HandleType(int(value))
        except ValueError:
            raise ValueError(f"unsupported handle type {value!r}") from None
    raise TypeError(f"handle_type must be a HandleType, not {type(value).__name__}")


def alloc_prop(loc: Location, handle_type: HandleType) -> _cu.CUmemAllocationProp:
    p = _cu.CUmemAllocationProp()
    p.type = _PINNED
    p.location = loc.to_cu()
    p.requestedHandleTypes = _cu.CUmemAllocationHandleType(int(handle_type))
    return p


def need_ctx() -> None:
    """Give the calling thread a current context (device 0's primary) if it has none."""
    if not int(_driver.check("cuCtxGetCurrent", _driver.function("cuCtxGetCurrent")())):
        ensure_context(None)


# -- granularity -------------------------------------------------------------------

_gran_cache: dict[tuple[str, int, int, bool, int], int] = {}


def granularity(
    device: TargetLike = 0, *, recommended: bool = False, handle_type: object = None
) -> int:
    """Return the allocation granularity for physical memory at ``device``.

    Sizes and offsets of :class:`PhysicalMemory`, :class:`AddressRange` and
    mappings must be multiples of the minimum granularity; the recommended one
    may perform better. Values are cached (they never change).

    Parameters
    ----------
    device : int, Device or Location, default 0
        Where the memory would live: a device, or a host location
        (``Location.host()``, ``Location.host_numa(n)``).
    recommended : bool, default False
        Return the recommended instead of the minimum granularity.
    handle_type : HandleType, optional
        The shareable handle type the memory would be created with.

    Returns
    -------
    int
        Bytes (2 MiB on an H100).

    Raises
    ------
    TypeError, ValueError
        For bad arguments, including a device that does not exist (the driver
        itself answers for any device).
    """
    check_bool(recommended, "recommended")
    loc = to_location(device)
    ht = check_handle_type(handle_type)
    key = (_driver.backend_name(), int(loc.type), loc.id, recommended, int(ht))
    g = _gran_cache.get(key)
    if g is None:
        if loc.type is LocationType.DEVICE and loc.id >= device_count():
            raise ValueError(f"there is no device {loc.id} ({device_count()} devices)")
        need_ctx()
        g = int(_driver.call("cuMemGetAllocationGranularity", alloc_prop(loc, ht),
                             _GRAN_REC if recommended else _GRAN_MIN))
        _gran_cache[key] = g
    return g


# -- one-call release functions ------------------------------------------------------


def release_handle(handle: int) -> None:
    _driver.call("cuMemRelease", handle)


def free_range(ptr: int, size: int) -> None:
    _driver.call("cuMemAddressFree", ptr, size)


def unmap_raw(ptr: int, size: int) -> None:
    _driver.call("cuMemUnmap", ptr, size)
