"""Which host memory is page-locked: the registry of ``register_host`` ranges and pinned classes.

Copies tell pinned from pageable host memory here, without asking the driver
when they can: the ranges ``register_host`` page-locked (with their flags and
owners), the cuda_memkit classes whose objects are pinned host memory, and
the owner a numpy view or export of cuda_memkit memory belongs to.
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any

from . import _driver
from ._constants import MEMHOST_DEVICEMAP
from ._context import ensure_any_context, ensure_context
from ._interop import DeviceArrayView
from ._pointers import memory_type
from ._resource import ArrayHolder, Resource

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "export_owner",
    "forget_registration",
    "is_pinned_host",
    "is_pinned_object",
    "mapped_device_ptr",
    "mark_pinned_class",
    "note_registration",
    "page_sharing_registration",
    "registered_flags",
    "registration_owner",
    "view_owner",
]


#: Live registrations made by ``register_host``: base address -> (end, flags, owner), the
#: owner a weak reference to the ``RegisteredHost`` (a copy of the array holds it).
_registered: dict[int, tuple[int, int, weakref.ref[Any] | None]] = {}
_reg_lock = threading.Lock()

#: cuda_memkit classes whose objects are pinned host memory (registered by their modules).
_pinned_classes: tuple[type, ...] = ()


def note_registration(ptr: int, nbytes: int, flags: int, owner: Resource | None = None) -> None:
    """Record a live ``cuMemHostRegister`` range (``owner``: the object that unregisters it)."""
    with _reg_lock:
        _registered[ptr] = (ptr + nbytes, flags, None if owner is None else weakref.ref(owner))


def forget_registration(ptr: int) -> None:
    """The range registered at ``ptr`` was unregistered."""
    with _reg_lock:
        _registered.pop(ptr, None)


def registered_flags(ptr: int, nbytes: int) -> int | None:
    """Flags of the live registered range holding ``[ptr, ptr+nbytes)``, or None."""
    if not _registered:
        return None
    end = ptr + nbytes
    for start, (stop, flags, _owner) in list(_registered.items()):
        if start <= ptr and end <= stop:
            return flags
    return None


def registration_owner(ptr: int, nbytes: int) -> Resource | None:
    """The ``RegisteredHost`` whose live registration holds ``[ptr, ptr+nbytes)``, or None."""
    end = ptr + nbytes
    for start, (stop, _flags, ref) in list(_registered.items()):
        if start <= ptr and end <= stop:
            owner = None if ref is None else ref()
            return owner if isinstance(owner, Resource) else None
    return None


def page_sharing_registration(ptr: int, nbytes: int, page: int) -> tuple[int, int, int] | None:
    """A live registration on a page that ``[ptr, ptr+nbytes)`` also touches, or None.

    Returns its ``(start, end, flags)``. The driver registers whole pages, so small
    arrays sharing a page share its mapping.
    """
    if not _registered:
        return None
    first = ptr - ptr % page
    last = ptr + nbytes - 1
    last += page - last % page
    for start, (stop, flags, _owner) in list(_registered.items()):
        if start < last and first < stop:
            return start, stop, flags
    return None


def mark_pinned_class(cls: type) -> None:
    """Declare that objects of ``cls`` (and subclasses) are pinned host memory."""
    global _pinned_classes
    if cls not in _pinned_classes:
        _pinned_classes = (*_pinned_classes, cls)


def is_pinned_object(obj: object) -> bool:
    """Whether ``obj`` is a cuda_memkit object that is pinned host memory."""
    return isinstance(obj, _pinned_classes)


def mapped_device_ptr(flags: int, ptr: int, nbytes: int, what: str, how: str) -> int:
    """The device address of mapped (``DEVICEMAP``) pinned memory at ``ptr``.

    ``DEVICEMAP`` is the same bit (0x2) in ``HostAllocFlags`` and
    ``HostRegisterFlags``; an empty range maps to 0 without a driver call.

    Raises
    ------
    ValueError
        If ``flags`` lacks ``DEVICEMAP`` (``how`` says how to get it).
    """
    if not flags & MEMHOST_DEVICEMAP:
        raise ValueError(
            f"{what} is not mapped into the device address space; {how} to get a device pointer"
        )
    if nbytes == 0:
        return 0
    ensure_context()
    return int(_driver.call("cuMemHostGetDevicePointer", ptr, 0))


def view_owner(arr: np.ndarray[Any, Any]) -> Resource | None:
    """The cuda_memkit object a numpy array is a view of (``host_array``), or None."""
    import numpy as np

    base: Any = arr.base
    while isinstance(base, np.ndarray):
        base = base.base
    if type(base) is ArrayHolder and isinstance(base.owner, Resource):
        return base.owner
    return None


def export_owner(obj: Any) -> Resource | None:
    """The cuda_memkit object whose memory ``obj``, a view or an export of it, is (or None).

    An ``as_array()`` view's owner, the buffer a numpy array is a view of
    (through its bases), or the ``RegisteredHost`` whose registration holds a
    host array. DLPack consumers hold their buffer's export record, which
    defers its release by itself; a foreign ``__cuda_array_interface__``
    object names a bare address and no owner.
    """
    if type(obj) is DeviceArrayView:
        owner = obj.owner
        return owner if isinstance(owner, Resource) else None
    numpy_mod: Any = sys.modules.get("numpy")
    if numpy_mod is None:
        return None
    if isinstance(obj, numpy_mod.ndarray):
        arr = obj
    elif _registered and not hasattr(obj, "__cuda_array_interface__"):
        try:  # a registered bytearray, memoryview, ...
            arr = numpy_mod.asarray(memoryview(obj))
        except TypeError:
            return None
    else:
        return None
    owner = view_owner(arr)
    if owner is None and _registered and arr.nbytes:
        owner = registration_owner(int(arr.__array_interface__["data"][0]), int(arr.nbytes))
    return owner


def is_pinned_host(arr: np.ndarray[Any, Any]) -> bool:
    """Whether the memory of numpy array ``arr`` is page-locked or driver-managed.

    True for views of a :class:`~cuda_memkit.HostBuffer` (or any cuda_memkit
    host-accessible buffer), arrays registered with ``register_host``, and
    memory the driver knows (pinned or registered by another library,
    managed memory).
    """
    if view_owner(arr) is not None:
        return True
    if not arr.nbytes:
        return True
    ptr = int(arr.__array_interface__["data"][0])
    if registered_flags(ptr, int(arr.nbytes)) is not None:
        return True
    ensure_any_context()
    return memory_type(ptr) is not None
