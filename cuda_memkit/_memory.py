"""Device memory and copies between any two kinds of memory.

* :class:`DeviceBuffer`: a plain ``cuMemAlloc`` allocation with the interop
  protocols (``__cuda_array_interface__``, DLPack, :meth:`as_array`).
* :func:`copy` / :func:`copy_async`: one copy function for host, pinned,
  registered, device and managed memory, through unified addressing
  (``cuMemcpy`` / ``cuMemcpyAsync``). Operands are resolved to pointers by
  type, without driver calls, so the hot path adds a few microseconds to a
  transfer.
* Asynchronous copies keep their Python operands alive until the stream has
  finished them (an event per copy, polled at the next copy or allocation).
"""

from __future__ import annotations

import collections
import math
import operator
import sys
import threading
from typing import TYPE_CHECKING, Any

from cuda.bindings.driver import CUpointer_attribute

from . import _driver
from ._device import StreamLike, _check_ordinal, ensure_context, stream_handle
from ._errors import CudaError
from ._interop import DL_CUDA, DeviceMemoryMixin
from ._pinned import (
    HostBuffer,
    HostRegisterFlags,
    RegisteredHost,
    _LiveHostBuffer,
    registered_flags,
)
from ._resource import Resource, State, _ArrayHolder, make_finalizer, pending_operands

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["DeviceBuffer", "copy", "copy_async"]

MAX_NBYTES = sys.maxsize

# CUpointer_attribute / CUmemorytype values (stable ABI numbers from cuda.h).
_ATTR_MEMORY_TYPE = 2
MEMORYTYPE_HOST = 1
MEMORYTYPE_DEVICE = 2
MEMORYTYPE_UNIFIED = 4
_EVENT_DISABLE_TIMING = 0x2
_MEMORY_TYPE_ATTR = CUpointer_attribute(_ATTR_MEMORY_TYPE)

# Operand kinds.
_RAW = 0  # an int address: the caller vouches for it
_DRIVER = 1  # memory the driver allocated or pinned (device, managed, pinned, pool, ...)
_HOST = 2  # a numpy array or buffer: pageable unless found pinned


def _check_nbytes(nbytes: object, what: str = "nbytes") -> int:
    if isinstance(nbytes, bool):
        raise TypeError(f"{what} must be an int, not bool")
    try:
        n = operator.index(nbytes)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(nbytes).__name__}") from None
    if n < 0:
        raise ValueError(f"{what} must be >= 0, got {n}")
    if n > MAX_NBYTES:
        raise ValueError(f"{what}={n} is larger than any possible allocation")
    return n


def _need_context() -> None:
    """Make sure the calling thread has a current context (device 0's if none)."""
    if not int(_driver.call("cuCtxGetCurrent")):
        ensure_context(0)


# -- pointer classification --------------------------------------------------------------


def memory_type(ptr: int) -> int | None:
    """Return the ``CUmemorytype`` of address ``ptr`` (``None``: unknown to the driver).

    ``None`` means ordinary pageable host memory. One ``cuPointerGetAttribute``
    call, checked without raising.
    """
    res = _driver.function("cuPointerGetAttribute")(_MEMORY_TYPE_ATTR, ptr)
    if res[0]:
        return None
    return int(res[1])


def _is_driver_host_array(arr: np.ndarray[Any, Any]) -> bool:
    """Whether a numpy array is a view of memory cuda_memkit allocated (pinned, managed)."""
    import numpy as np

    base: Any = arr.base
    while isinstance(base, np.ndarray):
        base = base.base
    return type(base) is _ArrayHolder and isinstance(base.owner, Resource)


def is_pinned_host(arr: np.ndarray[Any, Any]) -> bool:
    """Whether the memory of numpy array ``arr`` is page-locked or driver-managed.

    True for views of a :class:`HostBuffer` (or any cuda_memkit host-accessible
    buffer), arrays registered with :func:`register_host`, and memory the
    driver knows (pinned or registered by another library, managed memory).
    """
    if _is_driver_host_array(arr):
        return True
    if not arr.nbytes:
        return True
    ptr = int(arr.__array_interface__["data"][0])
    if registered_flags(ptr, int(arr.nbytes)) is not None:
        return True
    _need_context()
    return memory_type(ptr) is not None


# -- operands ---------------------------------------------------------------------------

_Operand = tuple[int, "int | None", Any, int, Any]  # ptr, nbytes, dtype, kind, array


def _operand(obj: Any, dst: bool) -> _Operand:
    """Resolve a copy operand to ``(ptr, nbytes, dtype, kind, host_array)``."""
    t = type(obj)
    if t is DeviceBuffer:
        return obj.ptr, obj._nbytes, None, _DRIVER, None
    if t is _LiveHostBuffer or t is HostBuffer:
        return obj.ptr, obj._nbytes, obj._dtype, _DRIVER, None
    if t is int:
        if obj < 0:
            raise ValueError(f"a pointer cannot be negative: {obj}")
        return obj, None, None, _RAW, None
    return _operand_slow(obj, dst)


def _role(dst: bool) -> str:
    return "destination" if dst else "source"


def _operand_slow(obj: Any, dst: bool) -> _Operand:
    role = _role(dst)
    if obj is None or isinstance(obj, bool):
        raise TypeError(f"the copy {role} cannot be {obj!r}")
    if isinstance(obj, int) or type(obj).__name__ == "CUdeviceptr":
        return _operand(int(obj), dst)
    numpy_mod: Any = sys.modules.get("numpy")
    if numpy_mod is not None and isinstance(obj, numpy_mod.integer):
        return _operand(int(obj), dst)
    if isinstance(obj, HostBuffer):  # subclasses, e.g. pooled pinned buffers
        return obj.ptr, obj._nbytes, obj._dtype, _DRIVER, None
    if isinstance(obj, RegisteredHost):
        if dst and obj.read_only:
            raise ValueError(
                "the destination is a READ_ONLY registration: the device may not write "
                "to it (register without HostRegisterFlags.READ_ONLY to copy into it)"
            )
        arr = obj.array
        return obj.ptr, obj.nbytes, arr.dtype, _DRIVER, None
    ptr = getattr(obj, "ptr", None)
    nb = getattr(obj, "nbytes", None)
    if isinstance(ptr, int) and isinstance(nb, int) and not isinstance(ptr, bool):
        dt = getattr(obj, "dtype", None)
        if numpy_mod is None or not isinstance(dt, numpy_mod.dtype):
            dt = None
        return ptr, nb, dt, _DRIVER, None
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


def _from_ndarray(arr: np.ndarray[Any, Any], dst: bool) -> _Operand:
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
        if flags is not None and flags & HostRegisterFlags.READ_ONLY:
            raise ValueError(
                "the destination is registered READ_ONLY: the device may not write to it"
            )
    return ptr, n, arr.dtype, _HOST, arr


def _from_cai(cai: dict[str, Any], dst: bool) -> _Operand:
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
    return int(ptr or 0), n, dt, _DRIVER, None


def _size(d: _Operand, s: _Operand, nbytes: int | None) -> int:
    dn, sn = d[1], s[1]
    if nbytes is None:
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
    n = _check_nbytes(nbytes)
    if dn is not None and n > dn:
        raise ValueError(f"nbytes={n} is larger than the destination ({dn} bytes)")
    if sn is not None and n > sn:
        raise ValueError(f"nbytes={n} is larger than the source ({sn} bytes)")
    return n


def _refuse_pageable(op: _Operand, role: str) -> None:
    if op[3] == _HOST and op[1] and not is_pinned_host(op[4]):
        raise ValueError(
            f"the copy {role} is pageable host memory: an asynchronous copy from or to it "
            "is staged through a driver buffer and silently serialises with the host. "
            "Use a HostBuffer, page-lock it with register_host(), or pass "
            "allow_pageable=True"
        )


# -- keeping operands alive until the stream is done -------------------------------------

_pending = pending_operands
_pending_lock = threading.RLock()


def _event_done(ev: Any) -> bool:
    res = _driver.function("cuEventQuery")(ev)
    code = int(res[0])
    return code != 600  # CUDA_ERROR_NOT_READY; any other answer: nothing is pending


def _destroy_event(ev: Any) -> None:
    try:
        _driver.call("cuEventDestroy", ev)
    except CudaError:
        pass  # the context (or the simulated machine) is gone with it


def reap_pending() -> None:
    """Drop the operands of asynchronous copies that have finished."""
    if not _pending:
        return
    done: list[tuple[Any, tuple[Any, ...]]] = []
    with _pending_lock:
        for stream in list(_pending):
            q = _pending[stream]
            while q and _event_done(q[0][0]):
                done.append(q.popleft())
            if not q:
                del _pending[stream]
    for ev, _refs in done:
        _destroy_event(ev)
    # the references in `done` go here, outside the lock


def pending_count() -> int:
    """Number of asynchronous copies whose operands are still held."""
    return sum(len(q) for q in _pending.values())


def _keep_alive(stream: int, refs: tuple[Any, ...]) -> None:
    try:
        ev = _driver.call("cuEventCreate", _EVENT_DISABLE_TIMING)
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
        q = _pending.get(stream)
        if q is None:
            q = _pending[stream] = collections.deque()
        q.append((ev, refs))


# -- copies ------------------------------------------------------------------------------


def copy(
    dst: Any,
    src: Any,
    *,
    nbytes: int | None = None,
    stream: StreamLike = None,
    allow_pageable: bool = False,
) -> Any:
    """Copy bytes from ``src`` to ``dst``, between any kinds of memory.

    Without ``stream`` the copy is synchronous: it is complete when ``copy``
    returns (``cuMemcpy``, plus a wait on the legacy default stream when the
    destination may be device memory, since ``cuMemcpy`` returns early there).
    With ``stream`` it is ordered on that stream and returns at once (see
    :func:`copy_async`).

    Parameters
    ----------
    dst, src : buffer, array or pointer
        A :class:`HostBuffer`, :class:`DeviceBuffer`, any cuda_memkit buffer
        (an object with int ``ptr`` and ``nbytes``: managed, pool, growable
        buffers), a :class:`RegisteredHost`, a C-contiguous numpy array or
        buffer-protocol object, an object with ``__cuda_array_interface__``
        (CuPy, torch, numba), or an int address (unified addressing).
    nbytes : int, optional
        Bytes to copy. Default: the size of the operands, which must then
        agree (and, when both are typed, have the same dtype).
    stream : Stream, int or stream-like, optional
        Order the copy on this stream instead of copying synchronously.
    allow_pageable : bool, default False
        Allow a stream-ordered copy from or to pageable numpy memory.

    Returns
    -------
    dst
        The destination object, for chaining.

    Raises
    ------
    TypeError
        For operands that are not memory, or object dtypes.
    ValueError
        For mismatched sizes or dtypes, non-contiguous or read-only
        destinations, or pageable memory in a stream-ordered copy without
        ``allow_pageable``; all before any driver call.
    ClosedError
        If an operand is closed.
    """
    if stream is not None:
        _copy_async(dst, src, nbytes, stream_handle(stream), allow_pageable)
        return dst
    d = _operand(dst, True)
    s = _operand(src, False)
    n = _size(d, s, nbytes)
    if n:
        _need_context()
        _driver.call("cuMemcpy", d[0], s[0], n)
        if d[3] != _HOST and not isinstance(dst, _HOST_TYPES):
            # cuMemcpy returns before a copy into device memory is done (device to
            # device, or staged from pageable memory): wait, so that "synchronous"
            # holds for work on any stream.
            _driver.call("cuStreamSynchronize", 0)
    return dst


def copy_async(
    dst: Any,
    src: Any,
    *,
    stream: StreamLike,
    nbytes: int | None = None,
    allow_pageable: bool = False,
) -> Any:
    """Copy bytes from ``src`` to ``dst`` ordered on ``stream`` (``cuMemcpyAsync``).

    It returns before the copy is done; synchronize the stream (or record an
    event) before reading the destination or reusing the source. The Python
    operands are kept alive until the stream has finished the copy, so
    dropping them early is safe (explicit ``close()`` is not: it frees at once).

    Copies from or to pageable numpy memory are refused unless
    ``allow_pageable=True``: the driver stages them through a bounce buffer,
    and the call blocks the host, so the "asynchronous" copy serialises.
    Page-lock the array with :func:`register_host` or use a :class:`HostBuffer`.
    Int pointers are trusted as given.

    Parameters
    ----------
    dst, src
        As for :func:`copy`.
    stream : Stream, int, None or stream-like
        The stream (``None``: the legacy default stream).
    nbytes : int, optional
        As for :func:`copy`.
    allow_pageable : bool, default False
        Accept pageable host memory.

    Returns
    -------
    dst
    """
    _copy_async(dst, src, nbytes, stream_handle(stream), allow_pageable)
    return dst


def _copy_async(dst: Any, src: Any, nbytes: int | None, stream: int,
                allow_pageable: bool) -> None:
    d = _operand(dst, True)
    s = _operand(src, False)
    n = _size(d, s, nbytes)
    if not n:
        return
    if not allow_pageable:
        if d[3] == _HOST:
            _refuse_pageable(d, "destination")
        if s[3] == _HOST:
            _refuse_pageable(s, "source")
    if _pending:
        reap_pending()
    _need_context()
    _driver.call("cuMemcpyAsync", d[0], s[0], n, stream)
    if s[3] != _RAW or d[3] != _RAW:
        _keep_alive(stream, (dst, src))


_HOST_TYPES = (HostBuffer, RegisteredHost)


# -- DeviceBuffer ------------------------------------------------------------------------


def _free_device(ptr: int) -> None:
    """``cuMemFree`` (the release function of a DeviceBuffer's finalizer)."""
    ensure_context()
    _driver.call("cuMemFree", ptr)


class DeviceBuffer(DeviceMemoryMixin, Resource):
    """Device memory from ``cuMemAlloc``: ``nbytes`` bytes on one device.

    Build with :meth:`alloc` (or :meth:`from_array`). It exports
    ``__cuda_array_interface__`` and DLPack (a 1-D ``uint8`` view; typed views
    with :meth:`as_array`) so CuPy, torch and numba can use it without a copy.
    A zero-length buffer allocates nothing and has ``ptr == 0``.

    Examples
    --------
    >>> d = cm.DeviceBuffer.alloc(1 << 20)
    >>> cm.copy(d, np.arange(1 << 18, dtype=np.float32))
    >>> d.to_numpy(np.float32)[:3]
    array([0., 1., 2.], dtype=float32)
    >>> d.close()
    """

    _ptr: int
    _nbytes: int
    _device: int

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("create a DeviceBuffer with DeviceBuffer.alloc(nbytes)")

    @classmethod
    def alloc(cls, nbytes: int, *, device: Any = None) -> DeviceBuffer:
        """Allocate ``nbytes`` of device memory (``cuMemAlloc``), uninitialised.

        Parameters
        ----------
        nbytes : int
            Size in bytes; 0 allocates nothing.
        device : Device or int, optional
            The device; default: the current context's (device 0 if none).
            Its primary context becomes current.

        Raises
        ------
        TypeError
            If ``nbytes`` is not an int.
        ValueError
            If it is negative or impossibly large (before any driver call).
        CudaOutOfMemoryError
            If the device has not enough free memory.
        """
        n = _check_nbytes(nbytes)
        ordinal = _check_ordinal(device) if device is not None else None
        self = cls.__new__(cls)
        self._nbytes = n
        if n == 0:
            self._ptr = 0
            self._device = ensure_context(ordinal)
            self._open(None)
            return self
        if _pending:
            reap_pending()
        self._device = ensure_context(ordinal)
        ptr = int(_driver.call("cuMemAlloc", n))
        self._ptr = ptr
        self._open(make_finalizer(self, f"DeviceBuffer 0x{ptr:x}", _free_device, ptr))
        return self

    @classmethod
    def from_array(cls, array: Any, *, device: Any = None) -> DeviceBuffer:
        """Allocate a device buffer of ``array``'s size and copy it in (synchronously).

        Parameters
        ----------
        array : array-like or HostBuffer
            Host data (C-contiguous after ``numpy.ascontiguousarray``).
        device : Device or int, optional
            As for :meth:`alloc`.
        """
        if not isinstance(array, HostBuffer):
            import numpy as np

            array = np.ascontiguousarray(array)
            if array.dtype.hasobject:
                raise TypeError("object arrays cannot be copied to the device")
        self = cls.alloc(array.nbytes, device=device)
        try:
            copy(self, array)
        except BaseException:
            self.close()
            raise
        return self

    @property
    def ptr(self) -> int:
        """Device address of the first byte (0 for a zero-length buffer)."""
        if self._state is not State.OPEN:
            self._check_open()
        return self._ptr

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return self._nbytes

    @property
    def device(self) -> int:
        """Ordinal of the device holding the memory."""
        return self._device

    def _dl_device(self) -> tuple[int, int]:
        return (DL_CUDA, self._device)

    def to_numpy(self, dtype: npt.DTypeLike = "uint8",
                 shape: int | tuple[int, ...] | None = None) -> np.ndarray[Any, Any]:
        """Copy the contents to a new numpy array (synchronously).

        Parameters
        ----------
        dtype : dtype-like, default uint8
            Element type.
        shape : int or tuple of int, optional
            Shape; default: as many elements as fit.
        """
        import numpy as np

        from ._interop import _normalize

        dt, shp = _normalize(dtype, shape, self._nbytes)
        out = np.empty(shp, dt)
        if out.nbytes:
            copy(out, self, nbytes=out.nbytes)
        return out

    def memset(self, value: int = 0, *, stream: StreamLike = None) -> None:
        """Set every byte to ``value``.

        Without ``stream`` it is synchronous (``cuMemsetD8`` and a wait); with
        ``stream``, ordered on it (``cuMemsetD8Async``).

        Parameters
        ----------
        value : int, default 0
            The byte value, 0..255.
        stream : stream-like, optional
            Order the memset on this stream instead of waiting for it.

        Raises
        ------
        TypeError
            If ``value`` is not an int.
        ValueError
            If ``value`` is not in 0..255.
        """
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError("value must be an int byte value")
        if not 0 <= value <= 255:
            raise ValueError(f"byte value must be in 0..255, got {value}")
        ptr = self.ptr
        if not self._nbytes:
            return
        if stream is None:
            _need_context()
            _driver.call("cuMemsetD8", ptr, value, self._nbytes)
            _driver.call("cuStreamSynchronize", 0)  # memsets of device memory are async
        else:
            h = stream_handle(stream)
            _need_context()
            _driver.call("cuMemsetD8Async", ptr, value, self._nbytes, h)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"ptr=0x{self._ptr:x}"
        return f"<DeviceBuffer {self._nbytes} bytes on device {self._device} {state}>"
