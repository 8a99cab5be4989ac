"""Copy operands: what any memory object is, as an address and a size.

Shared by the transfer functions (:mod:`cuda_memkit._transfer._transfers`) and the
buffers' own copy methods (``to_numpy`` of :mod:`cuda_memkit._core._buffer`):

* :func:`operand` resolves any object a copy accepts (cuda_memkit buffers,
  numpy arrays and buffer-protocol objects, ``__cuda_array_interface__``
  objects, int addresses) to an :data:`Operand`, without driver calls;
* :func:`copy_size` checks two operands against each other and ``nbytes``;
* :func:`copy_sync` is the synchronous copy (``cuMemcpy``);
* the registry of host ranges page-locked by ``register_host`` and the
  classes whose objects are pinned host memory, so pageable memory is told
  from pinned memory without asking the driver when possible;
* the operands of asynchronous copies in flight, kept alive until their
  stream has finished them (:func:`keep_alive`, :func:`reap_pending`):
  allocation paths reap them too, so memory of finished copies goes back
  sooner.
"""

from __future__ import annotations

import collections
import math
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any

from cuda.bindings.driver import CUpointer_attribute

from . import _driver
from ._checks import ADDRESS_END, MAX_U64, byte_count, u64
from ._constants import EVENT_DISABLE_TIMING, MEMHOST_DEVICEMAP, MEMHOSTREGISTER_READ_ONLY
from ._context import ensure_any_context, ensure_context, primary_pushed
from ._device import device_count, sync_hooks
from ._errors import CudaError, CudaInvalidValueError
from ._interop import DeviceArrayView
from ._resource import ArrayHolder, Resource, release_hooks

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "DRIVER",
    "HOST",
    "RAW",
    "Operand",
    "access_flags",
    "copy_size",
    "copy_sync",
    "device_with_access",
    "export_owner",
    "is_pinned_host",
    "is_pinned_object",
    "keep_alive",
    "mapped_device_ptr",
    "mark_pinned_class",
    "memory_type",
    "operand",
    "owning_device",
    "page_sharing_registration",
    "pending_count",
    "pending_operands",
    "reap_pending",
    "refuse_pageable",
    "registered_flags",
    "registration_owner",
    "release_after_copies",
    "releases_waiting",
    "wait_for_copies",
    "wait_pending",
]

# CUpointer_attribute / CUmemorytype values (stable ABI numbers from cuda.h).
_ATTR_MEMORY_TYPE = 2
MEMORYTYPE_HOST = 1
MEMORYTYPE_DEVICE = 2
MEMORYTYPE_UNIFIED = 4
_MEMORY_TYPE_ATTR = CUpointer_attribute(_ATTR_MEMORY_TYPE)

#: Operand kinds.
RAW = 0  # an int address: the caller vouches for it
DRIVER = 1  # memory the driver allocated or pinned (device, managed, pinned, pool, ...)
HOST = 2  # a numpy array or buffer: pageable unless found pinned
PINNED = 3  # a cuda_memkit object that is pinned host memory (HostBuffer, RegisteredHost)

Operand = tuple[int, "int | None", Any, int, Any]
"""``(ptr, nbytes, dtype, kind, host_array)``: ``nbytes`` ``None`` for raw
pointers, ``dtype`` ``None`` where untyped, ``host_array`` the numpy array of
a :data:`HOST` operand."""


# -- host memory the driver pins ---------------------------------------------------------

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


# -- operands -----------------------------------------------------------------------------


def operand(obj: Any, dst: bool) -> Operand:
    """Resolve a copy operand (see the module docstring); ``dst``: it is written to."""
    if type(obj) is int:
        if obj < 0 or obj > MAX_U64:
            u64(obj, "a pointer")  # raises: never wrapped to 64 bits
        return obj, None, None, RAW, None
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
        return ptr, nbytes, dt, PINNED, None
    return ptr, nbytes, dt, DRIVER, None


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
        u64(ptr, "a buffer's ptr")
        dt = getattr(obj, "dtype", None)
        if numpy_mod is None or not isinstance(dt, numpy_mod.dtype):
            dt = None
        return ptr, nb, dt, DRIVER, None
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
    return ptr, n, arr.dtype, HOST, arr


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
    return u64(ptr or 0, "a __cuda_array_interface__ pointer"), n, dt, DRIVER, None


def copy_size(d: Operand, s: Operand, nbytes: int | None) -> int:
    """The byte count of a copy from ``s`` to ``d``: ``nbytes``, or the operands' common size.

    Neither side may run past the last 64-bit address (an int address near
    2**64 would wrap around onto another allocation).
    """
    n = _common_size(d, s) if nbytes is None else _prefix_size(d, s, nbytes)
    for op, role in ((d, "destination"), (s, "source")):
        if op[0] + n > ADDRESS_END:  # only an int address can get here
            raise ValueError(f"the copy {role} 0x{op[0]:x} + {n} bytes passes 2**64 (it "
                             "would wrap around to another allocation)")
    return n


def _common_size(d: Operand, s: Operand) -> int:
    dn, sn = d[1], s[1]
    if dn is None and sn is None:
        raise ValueError("copying between two raw pointers needs nbytes=")
    if dn is not None and sn is not None:
        if dn != sn:
            raise ValueError(
                f"size mismatch: the destination has {dn} bytes, the source {sn}; "
                "pass nbytes= to copy a prefix"
            )
        if d[2] is not None and s[2] is not None and d[2] != s[2]:
            raise ValueError(
                f"dtype mismatch: the destination is {d[2]}, the source {s[2]}; "
                "pass nbytes= to copy raw bytes"
            )
        return dn
    return dn if dn is not None else sn  # type: ignore[return-value]


def _prefix_size(d: Operand, s: Operand, nbytes: int) -> int:
    n = byte_count(nbytes)
    if d[1] is not None and n > d[1]:
        raise ValueError(f"nbytes={n} is larger than the destination ({d[1]} bytes)")
    if s[1] is not None and n > s[1]:
        raise ValueError(f"nbytes={n} is larger than the source ({s[1]} bytes)")
    return n


def refuse_pageable(op: Operand, role: str) -> None:
    """``ValueError`` if ``op`` is pageable host memory (for stream-ordered copies)."""
    if op[3] == HOST and op[1] and not is_pinned_host(op[4]):
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
        _driver.call("cuMemcpy", d[0], s[0], n)
    except CudaInvalidValueError:
        device = _granted_device(d[0], s[0])
        if device is None:
            raise
        # Pool or mapped memory of a device the current one may not access: the driver
        # refuses the copy in this context, so a device that may makes it.
        with primary_pushed(device):
            _driver.call("cuMemcpy", d[0], s[0], n)
            _driver.call("cuStreamSynchronize", 0)
        return
    if d[3] != PINNED and (d[3] != HOST or view_owner(d[4]) is not None):
        # cuMemcpy returns before a copy into device memory is done (device to
        # device, or staged from pageable memory; a numpy view of a managed
        # buffer counts: seen under compute-sanitizer): wait, so that
        # "synchronous" holds for work on any stream.
        _driver.call("cuStreamSynchronize", 0)


# -- keeping operands alive until the stream is done -------------------------------------

#: Operands of asynchronous copies still in flight, per stream handle: entries
#: ``[event, references]`` (lists: a close() under the copy adds its stand-in).
pending_operands: dict[int, collections.deque[list[Any]]] = {}
_pending_lock = threading.RLock()
#: id() of each object the entries hold -> those entries, so that close() finds its own
#: copies without scanning every copy in flight (the ids stay valid: the entries hold them).
_holders: dict[int, list[list[Any]]] = {}


def _event_done(ev: Any) -> bool:
    res = _driver.function("cuEventQuery")(ev)
    code = int(res[0])
    return code != 600  # CUDA_ERROR_NOT_READY; any other answer: nothing is pending


def _destroy_event(ev: Any) -> None:
    try:
        _driver.call("cuEventDestroy", ev)
    except CudaError:
        pass  # the context (or the simulated machine) is gone with it


#: Set while this thread changes the queues: a reap from a finalizer run meanwhile (a garbage
#: collection collecting a closed buffer's last export) is left to the change under way.
_changing = threading.local()


def reap_pending() -> None:
    """Drop the operands of asynchronous copies that have finished."""
    if not pending_operands or getattr(_changing, "on", False):
        return
    done: list[list[Any]] = []
    with _pending_lock:
        _changing.on = True
        try:
            for stream in list(pending_operands):
                q = pending_operands[stream]
                while q and _event_done(q[0][0]):
                    entry = q.popleft()
                    _unindex(entry)
                    done.append(entry)
                if not q:
                    del pending_operands[stream]
        finally:
            _changing.on = False
    for ev, _refs in done:
        _destroy_event(ev)
    # the references in `done` go here, outside the lock


def _unindex(entry: list[Any]) -> None:
    """Take a reaped entry out of :data:`_holders` (under the lock)."""
    for r in entry[1]:
        entries = _holders.get(id(r))
        if entries is not None:  # not there: a stand-in (never indexed)
            for k, e in enumerate(entries):
                if e is entry:
                    del entries[k]
                    break
            if not entries:
                del _holders[id(r)]


sync_hooks.append(reap_pending)


def wait_pending() -> None:
    """Wait until every asynchronous copy whose operands are held has finished, then reap.

    It waits on the copies' own events (never on their streams, which may be gone).
    """
    with _pending_lock:
        last = [q[-1][0] for q in pending_operands.values() if q]
    _wait_events(last)


def _wait_events(events: list[Any]) -> None:
    """Wait on ``events`` (never on their streams, which may be gone), then reap."""
    for ev in events:
        _driver.function("cuEventSynchronize")(ev)  # a failed wait: the reap decides
    reap_pending()


class _ReleaseWhenCopied:
    """Releases a closed owner when the last asynchronous copy holding it is let go of.

    One object for all the copies in flight that hold the owner: it is dropped
    (and the owner released) when the last of their entries is reaped.
    """

    __slots__ = ("owner",)

    #: Stand-ins alive: releases waiting for copies (MemoryPool.close() waits only then).
    alive = 0

    def __init__(self, owner: Resource) -> None:
        self.owner = owner
        _ReleaseWhenCopied.alive += 1

    # (sys.is_finalizing bound as a default: module globals may be gone at interpreter exit)
    def __del__(self, _finalizing: Any = sys.is_finalizing,
                _lock: Any = _pending_lock) -> None:
        with _lock:  # made under it (release_after_copies): counted under it
            type(self).alive -= 1
        if not _finalizing():
            self.owner._release_deferred()


def releases_waiting() -> int:
    """How many closed owners wait for copies in flight before they are released."""
    return _ReleaseWhenCopied.alive


def release_after_copies(owner: Resource) -> bool:
    """Whether asynchronous copies in flight still use ``owner`` (then it waits for them).

    If they do, ``owner`` is released once the last of them has finished, not
    now, under the copy.
    """
    if id(owner) not in _holders:
        return False
    ensure_any_context()  # close() may run on a thread with none: the event queries need one
    reap_pending()
    with _pending_lock:
        was = getattr(_changing, "on", False)
        _changing.on = True  # a finalizer run meanwhile must not reap under this loop
        try:
            entries = _holders.get(id(owner))
            if not entries:
                return False
            stand_in = _ReleaseWhenCopied(owner)
            for entry in list(entries):
                entry[1] = (*entry[1], stand_in)
        finally:
            _changing.on = was
    return True


release_hooks.append(release_after_copies)


def wait_for_copies(owner: Resource) -> None:
    """Wait until the asynchronous copies in flight that use ``owner`` have finished.

    For changes that cannot wait for the copies' own end (a growable buffer
    unmapping its tail): the copies' events are waited on, never their streams.
    """
    if id(owner) not in _holders:
        return
    with _pending_lock:
        events = [entry[0] for entry in _holders.get(id(owner), ())]
    _wait_events(events)


def pending_count() -> int:
    """Number of asynchronous copies whose operands are still held."""
    return sum(len(q) for q in pending_operands.values())


def _with_owners(refs: tuple[Any, ...]) -> tuple[Any, ...]:
    """``refs`` plus the owners of the views and exports among them (:func:`export_owner`).

    A closed owner whose release already waits for copies lends its stand-in
    too (a registered array copied again after its ``close()``), so that the
    release waits for this copy as well. Called under the lock.
    """
    extra: tuple[Any, ...] = ()
    for r in refs:
        if type(r) is int or isinstance(r, Resource):
            continue
        owner = export_owner(r)
        if owner is None or any(owner is x for x in refs + extra):
            continue
        extra += (owner,)
        if owner.closed:
            for entry in _holders.get(id(owner), ()):
                extra += tuple(x for x in entry[1] if type(x) is _ReleaseWhenCopied
                               and x.owner is owner and all(x is not y for y in extra))
    return refs + extra if extra else refs


def keep_alive(stream: int, refs: tuple[Any, ...]) -> None:
    """Hold ``refs`` until the work queued on ``stream`` so far has finished.

    The owners of views and exports among them (an ``as_array()`` view, a numpy
    view, a registered array) are held and indexed too: their ``close()`` (or a
    shrink) waits for this work as it would had the owner itself been given.
    """
    try:
        ev = _driver.call("cuEventCreate", EVENT_DISABLE_TIMING)
    except CudaError:
        ev = None
    if ev is not None:
        try:
            _driver.call("cuEventRecord", ev, stream)
        except CudaError:
            _destroy_event(ev)
            ev = None
    if ev is None:
        # The event cannot go on this stream (e.g. another device's context is
        # current): wait for the copy rather than risk freeing memory under it.
        _driver.call("cuStreamSynchronize", stream)
        return
    if _event_done(ev):
        _destroy_event(ev)
        return
    with _pending_lock:
        entry = [ev, _with_owners(refs)]
        q = pending_operands.get(stream)
        if q is None:
            q = pending_operands[stream] = collections.deque()
        q.append(entry)
        for r in entry[1]:
            if type(r) is _ReleaseWhenCopied:
                continue  # a stand-in: never indexed
            entries = _holders.get(id(r))
            if entries is None:
                _holders[id(r)] = [entry]
            else:
                entries.append(entry)
