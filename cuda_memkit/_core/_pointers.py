"""What the driver says about an address: its memory type, its device, who may access it.

One ``cuPointerGetAttribute`` (or pool/mapping access query) each, answered
without raising for addresses the driver does not know.
"""

from __future__ import annotations

from cuda.bindings.driver import CUpointer_attribute

from . import _driver
from ._device import device_count
from ._errors import CudaError

__all__ = [
    "MEMORYTYPE_DEVICE",
    "MEMORYTYPE_HOST",
    "access_flags",
    "device_with_access",
    "memory_type",
    "owning_device",
]

# CUpointer_attribute / CUmemorytype values (stable ABI numbers from cuda.h).
_ATTR_MEMORY_TYPE = 2
MEMORYTYPE_HOST = 1
MEMORYTYPE_DEVICE = 2
_MEMORY_TYPE_ATTR = CUpointer_attribute(_ATTR_MEMORY_TYPE)


def memory_type(ptr: int) -> int | None:
    """Return the ``CUmemorytype`` of address ``ptr`` (``None``: unknown to the driver).

    ``None`` means ordinary pageable host memory. One ``cuPointerGetAttribute``
    call, checked without raising.
    """
    res = _driver.function("cuPointerGetAttribute")(_MEMORY_TYPE_ATTR, ptr)
    if res[0]:
        return None
    return int(res[1])


_CONTEXT_ATTR = CUpointer_attribute.CU_POINTER_ATTRIBUTE_CONTEXT
_POOL_ATTR = CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE


def owning_device(ptr: int) -> int | None:
    """The device whose context allocated memory at ``ptr`` (``cuMemAlloc``, not managed).

    Callers rule managed memory out first (its context is set too). ``None``
    for memory no context owns (pool allocations and mapped virtual memory:
    see :func:`access_flags`) and addresses the driver does not know. Not
    ``CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL``, which reads 0 for every pointer
    through cuda-bindings 13.3/13.4 (docs/decisions.md).
    """
    res = _driver.function("cuPointerGetAttribute")(_CONTEXT_ATTR, ptr)
    if res[0] or not int(res[1] or 0):
        return None
    _driver.call("cuCtxPushCurrent", res[1])
    try:
        return int(_driver.call("cuCtxGetDevice"))
    finally:
        _driver.call("cuCtxPopCurrent")


def device_with_access(ptr: int, preferred: int) -> int | None:
    """A device that may read and write pool or mapped memory at ``ptr``, ``preferred`` first.

    ``None`` when none may, or the address is neither (see :func:`access_flags`).
    """
    try:
        for device in (preferred, *range(device_count())):
            if access_flags(ptr, device) == 3:
                return int(device)
    except CudaError:
        return None
    return None


def access_flags(ptr: int, device: int) -> int:
    """How device ``device`` may access pool or mapped memory at ``ptr``: 0, 1 (read) or 3.

    The pool's access for that device (``cuMemPoolGetAccess``), or the
    mapping's (``cuMemGetAccess``).

    Raises
    ------
    CudaError
        If the address is neither.
    """
    from cuda.bindings import driver as cu

    loc = cu.CUmemLocation()
    loc.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    loc.id = device
    res = _driver.function("cuPointerGetAttribute")(_POOL_ATTR, ptr)
    if not res[0] and int(res[1] or 0):
        return int(_driver.call("cuMemPoolGetAccess", res[1], loc))
    return int(_driver.call("cuMemGetAccess", loc, ptr))
