"""Sharing pools and their allocations with other processes (POSIX file descriptors).

The driver calls behind :meth:`MemoryPool.export`, :meth:`MemoryPool.import_`,
:meth:`MemoryPool.import_pointer` and :meth:`PoolBuffer.export`, taking and
returning plain handles; the pool module wraps them in objects.

The protocol: the exporting process creates a pool with ``ipc=True`` and sends
``pool.export()`` (a file descriptor) to the other process, which imports the
pool; then each allocation's 64 bytes (``PoolBuffer.export()``), which the
other process maps with ``import_pointer``. The importer frees its mapping
before the exporter frees the allocation.
"""

from __future__ import annotations

import ctypes
from typing import Any

from cuda.bindings import driver as _cu

from .._core import _driver
from .._core._access import Access
from .._core._checks import check_int
from .._core._errors import CudaError
from .._core._location import Location

__all__ = [
    "EXPORT_DATA_SIZE",
    "check_fd",
    "check_pointer_data",
    "export_pointer",
    "export_pool",
    "forget",
    "import_pointer",
    "import_pool",
    "imported_device",
    "pointer_size",
    "was_exported",
]

#: Size of an exported pointer (``CUmemPoolPtrExportData``).
EXPORT_DATA_SIZE = 64
_POSIX_FD = _cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


#: Handles of the pools exported so far: the H100 refuses to export pointers of
#: a pool that was never exported (``CUDA_ERROR_INVALID_VALUE``).
_exported: set[int] = set()


def export_pool(cupool: Any) -> int:
    """``cuMemPoolExportToShareableHandle``: a new file descriptor for the pool."""
    fd = int(_driver.call("cuMemPoolExportToShareableHandle", cupool, _POSIX_FD, 0))
    _exported.add(int(cupool))
    return fd


def was_exported(handle: int) -> bool:
    """Whether the pool with this handle was exported (by :func:`export_pool`)."""
    return handle in _exported


def forget(handle: int) -> None:
    """The pool with this handle is gone (its handle may be reused)."""
    _exported.discard(handle)


def check_fd(fd: object) -> int:
    """A file descriptor argument: a non-negative int."""
    fd = check_int(fd, "fd", "an int file descriptor")
    if fd < 0:
        raise ValueError(f"invalid file descriptor {fd}")
    return fd


def import_pool(fd: int) -> Any:
    """``cuMemPoolImportFromShareableHandle``: the imported ``CUmemoryPool``."""
    return _driver.call("cuMemPoolImportFromShareableHandle", fd, _POSIX_FD, 0)


def check_pointer_data(data: object) -> bytes:
    """The 64 bytes of an exported pointer, checked."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be the bytes of PoolBuffer.export(), not "
                        f"{type(data).__name__}")
    raw = bytes(data)
    if len(raw) != EXPORT_DATA_SIZE:
        raise ValueError(f"exported pointer data is {EXPORT_DATA_SIZE} bytes, got {len(raw)}")
    return raw


def imported_device(cupool: Any, devices: int) -> int | None:
    """The device (as this process numbers them) whose memory an imported pool holds.

    Asked right after the import, before this process grants anyone access:
    the device that may read and write the pool's memory then is the one it
    lives on (``cuMemPoolGetAccess`` of each of the ``devices``). ``None`` when
    that is not exactly one device, or the driver answers no such query.
    """
    found = []
    for device in range(devices):
        loc = Location.device(device).to_cu()
        try:
            flags = int(_driver.call("cuMemPoolGetAccess", cupool, loc))
        except CudaError:  # a driver that answers no query on imported pools: unknown
            return None
        if flags == Access.READWRITE:
            found.append(device)
    return found[0] if len(found) == 1 else None


def import_pointer(cupool: Any, raw: bytes) -> Any:
    """``cuMemPoolImportPointer``: the ``CUdeviceptr`` of an exported allocation."""
    share = _cu.CUmemPoolPtrExportData()
    ctypes.memmove(share.getPtr(), raw, EXPORT_DATA_SIZE)
    return _driver.call("cuMemPoolImportPointer", cupool, share)


def pointer_size(dptr: Any) -> int:
    """Size of the allocation at ``dptr`` (``CU_POINTER_ATTRIBUTE_RANGE_SIZE``)."""
    return int(_driver.call("cuPointerGetAttribute",
                            _cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_RANGE_SIZE, dptr))


def export_pointer(dptr: Any) -> bytes:
    """``cuMemPoolExportPointer``: the 64 bytes another process imports."""
    data = _driver.call("cuMemPoolExportPointer", dptr)
    return ctypes.string_at(data.getPtr(), EXPORT_DATA_SIZE)
