"""Copy operands: what any memory object is, as an address and a size.

Shared by the transfer functions (:mod:`cuda_memkit._transfer._transfers`) and the
buffers' own copy methods (``to_numpy`` of :mod:`cuda_memkit._core._buffer`):

* :func:`operand` resolves any object a copy accepts (cuda_memkit buffers,
  numpy arrays and buffer-protocol objects, ``__cuda_array_interface__``
  objects, int addresses) to an :class:`Operand`, without driver calls;
* :func:`copy_size` checks two operands against each other and ``nbytes``;
* :func:`copy_sync` is the synchronous copy (``cuMemcpy``).

Pinned host memory is told from pageable memory by ``_host_registry``; the
operands of asynchronous copies in flight are held by ``_inflight``.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any, NamedTuple

from . import _driver
from ._checks import ADDRESS_END, MAX_U64, check_nbytes, check_u64
from ._constants import MEMHOSTREGISTER_READ_ONLY
from ._context import ensure_any_context, ensure_context, primary_pushed
from ._errors import CudaInvalidValueError
from ._host_registry import is_pinned_host, is_pinned_object, registered_flags, view_owner
from ._pointers import device_with_access
from ._resource import Resource

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "DRIVER",
    "HOST",
    "PINNED",
    "RAW",
    "Operand",
    "copy_size",
    "copy_sync",
    "operand",
    "refuse_pageable",
]

#: Operand kinds.
RAW = 0  # an int address: the caller vouches for it
DRIVER = 1  # memory the driver allocated or pinned (device, managed, pinned, pool, ...)
HOST = 2  # a numpy array or buffer: pageable unless found pinned
PINNED = 3  # a cuda_memkit object that is pinned host memory (HostBuffer, RegisteredHost)


# Operands are made on every copy: tuple.__new__ skips the Python-level __new__ that
# a NamedTuple call runs (the same tuple, in less than half the time).
_new = tuple.__new__


class Operand(NamedTuple):
    """One side of a copy, as :func:`operand` resolved it."""

    #: The address.
    ptr: int
    #: The size in bytes; ``None`` for a raw pointer.
    nbytes: int | None
    #: The numpy dtype; ``None`` where untyped.
    dtype: Any
    #: :data:`RAW`, :data:`DRIVER`, :data:`HOST` or :data:`PINNED`.
    kind: int
    #: The numpy array of a :data:`HOST` operand; ``None`` otherwise.
    host_array: Any


def _granted_device(*ptrs: int) -> int | None:
    """A device granted the pool or mapped memory one of ``ptrs`` is, the current one not.

    ``None``: no such operand (the copy failed for another reason).
    """
    current = ensure_context(None)
    for ptr in ptrs:
        device = device_with_access(ptr, current)  # None for other memory
        if device is not None and device != current:
            return device
    return None


def operand(obj: Any, dst: bool) -> Operand:
    """Resolve a copy operand (see the module docstring); ``dst``: it is written to."""
    if type(obj) is int:
        if obj < 0 or obj > MAX_U64:
            check_u64(obj, "a pointer")  # raises: never wrapped to 64 bits
        return _new(Operand, (obj, None, None, RAW, None))
    if isinstance(obj, Resource):
        return _resource_operand(obj, dst)
    return _foreign_operand(obj, dst)


def _role(dst: bool) -> str:
    return "destination" if dst else "source"


def _resource_operand(obj: Any, dst: bool) -> Operand:
    """A cuda_memkit object: ``ptr`` (ClosedError once closed) and ``nbytes``."""
    ptr = obj.ptr
    nbytes = obj.nbytes
    dt = getattr(obj, "dtype", None)
    if dt is not None:
        numpy_mod: Any = sys.modules.get("numpy")
        if numpy_mod is None or not isinstance(dt, numpy_mod.dtype):
            dt = None
    if is_pinned_object(obj):
        if dst and getattr(obj, "read_only", False):
            raise ValueError(
                "the destination is a READ_ONLY registration: the device may not write "
                "to it (register without HostRegisterFlags.READ_ONLY to copy into it)"
            )
        return _new(Operand, (ptr, nbytes, dt, PINNED, None))
    return _new(Operand, (ptr, nbytes, dt, DRIVER, None))


def _foreign_operand(obj: Any, dst: bool) -> Operand:
    role = _role(dst)
    if obj is None or isinstance(obj, bool):
        raise TypeError(f"the copy {role} cannot be {obj!r}")
    if isinstance(obj, int) or type(obj).__name__ == "CUdeviceptr":
        return operand(int(obj), dst)
    numpy_mod: Any = sys.modules.get("numpy")
    if numpy_mod is not None and isinstance(obj, numpy_mod.integer):
        return operand(int(obj), dst)
    ptr = getattr(obj, "ptr", None)
    nb = getattr(obj, "nbytes", None)
    if isinstance(ptr, int) and isinstance(nb, int) and not isinstance(ptr, bool):
        check_u64(ptr, "a buffer's ptr")
        dt = getattr(obj, "dtype", None)
        if numpy_mod is None or not isinstance(dt, numpy_mod.dtype):
            dt = None
        return _new(Operand, (ptr, nb, dt, DRIVER, None))
    cai = getattr(obj, "__cuda_array_interface__", None)
    if isinstance(cai, dict):
        return _from_cai(cai, dst)
    import numpy as np

    if isinstance(obj, np.ndarray):
        arr = obj
    elif hasattr(obj, "__array_interface__"):
        arr = np.asarray(obj)
    else:
        try:
            arr = np.asarray(memoryview(obj))
        except TypeError:
            raise TypeError(
                f"cannot copy {'to' if dst else 'from'} {type(obj).__name__}: expected a "
                "HostBuffer, DeviceBuffer, numpy array, cuda_memkit buffer (ptr and nbytes), "
                "an object with __cuda_array_interface__, or an int pointer"
            ) from None
    return _from_ndarray(arr, dst)


def _from_ndarray(arr: np.ndarray[Any, Any], dst: bool) -> Operand:
    role = _role(dst)
    if arr.dtype.hasobject:
        raise TypeError(f"the copy {role} holds Python objects; they cannot be copied")
    n = int(arr.nbytes)
    if n and not arr.flags.c_contiguous:
        raise ValueError(
            f"the copy {role} is not C-contiguous; use np.ascontiguousarray() "
            "(copies move contiguous bytes)"
        )
    ptr = int(arr.__array_interface__["data"][0])
    if dst:
        if not arr.flags.writeable:
            raise ValueError("the copy destination is a read-only array")
        flags = registered_flags(ptr, n)
        if flags is not None and flags & MEMHOSTREGISTER_READ_ONLY:
            raise ValueError(
                "the destination is registered READ_ONLY: the device may not write to it"
            )
    return _new(Operand, (ptr, n, arr.dtype, HOST, arr))


def _from_cai(cai: dict[str, Any], dst: bool) -> Operand:
    import numpy as np

    role = _role(dst)
    ptr, readonly = cai["data"]
    dt = np.dtype(cai["typestr"])
    if dt.hasobject:
        raise TypeError(f"the copy {role} holds Python objects")
    shape = tuple(int(d) for d in cai["shape"])
    n = math.prod(shape) * dt.itemsize
    strides = cai.get("strides")
    if strides is not None and n:
        step = dt.itemsize
        for dim, stride in zip(reversed(shape), reversed(tuple(strides)), strict=False):
            if dim != 1 and int(stride) != step:
                raise ValueError(f"the copy {role} is not C-contiguous (strides {strides})")
            step *= dim
    if dst and readonly:
        raise ValueError("the copy destination is read-only (__cuda_array_interface__)")
    ptr = check_u64(ptr or 0, "a __cuda_array_interface__ pointer")
    return _new(Operand, (ptr, n, dt, DRIVER, None))


def copy_size(d: Operand, s: Operand, nbytes: int | None) -> int:
    """The byte count of a copy from ``s`` to ``d``: ``nbytes``, or the operands' common size.

    Neither side may run past the last 64-bit address (an int address near
    2**64 would wrap around onto another allocation).
    """
    n = _common_size(d, s) if nbytes is None else _prefix_size(d, s, nbytes)
    for op, role in ((d, "destination"), (s, "source")):
        if op.ptr + n > ADDRESS_END:  # only an int address can get here
            raise ValueError(f"the copy {role} 0x{op.ptr:x} + {n} bytes passes 2**64 (it "
                             "would wrap around to another allocation)")
    return n


def _common_size(d: Operand, s: Operand) -> int:
    dn, sn = d.nbytes, s.nbytes
    if dn is None and sn is None:
        raise ValueError("copying between two raw pointers needs nbytes=")
    if dn is not None and sn is not None:
        if dn != sn:
            raise ValueError(
                f"size mismatch: the destination has {dn} bytes, the source {sn}; "
                "pass nbytes= to copy a prefix"
            )
        if d.dtype is not None and s.dtype is not None and d.dtype != s.dtype:
            raise ValueError(
                f"dtype mismatch: the destination is {d.dtype}, the source {s.dtype}; "
                "pass nbytes= to copy raw bytes"
            )
        return dn
    return dn if dn is not None else sn  # type: ignore[return-value]


def _prefix_size(d: Operand, s: Operand, nbytes: int) -> int:
    n = check_nbytes(nbytes)
    if d.nbytes is not None and n > d.nbytes:
        raise ValueError(f"nbytes={n} is larger than the destination ({d.nbytes} bytes)")
    if s.nbytes is not None and n > s.nbytes:
        raise ValueError(f"nbytes={n} is larger than the source ({s.nbytes} bytes)")
    return n


def refuse_pageable(op: Operand, role: str) -> None:
    """``ValueError`` if ``op`` is pageable host memory (for stream-ordered copies)."""
    if op.kind == HOST and op.nbytes and not is_pinned_host(op.host_array):
        raise ValueError(
            f"the copy {role} is pageable host memory: an asynchronous copy from or to it "
            "is staged through a driver buffer and silently serialises with the host. "
            "Use a HostBuffer, page-lock it with register_host(), or pass "
            "allow_pageable=True"
        )


def copy_sync(d: Operand, s: Operand, n: int) -> None:
    """Copy ``n`` bytes from ``s`` to ``d``, complete when it returns (``cuMemcpy``)."""
    if not n:
        return
    ensure_any_context()
    try:
        _driver.call("cuMemcpy", d.ptr, s.ptr, n)
    except CudaInvalidValueError:
        device = _granted_device(d.ptr, s.ptr)
        if device is None:
            raise
        # Pool or mapped memory of a device the current one may not access: the driver
        # refuses the copy in this context, so a device that may makes it.
        with primary_pushed(device):
            _driver.call("cuMemcpy", d.ptr, s.ptr, n)
            _driver.call("cuStreamSynchronize", 0)
        return
    if d.kind != PINNED and (d.kind != HOST or view_owner(d.host_array) is not None):
        # cuMemcpy returns before a copy into device memory is done (device to
        # device, or staged from pageable memory; a numpy view of a managed
        # buffer counts: seen under compute-sanitizer): wait, so that
        # "synchronous" holds for work on any stream.
        _driver.call("cuStreamSynchronize", 0)
