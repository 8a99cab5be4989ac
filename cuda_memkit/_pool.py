"""Stream-ordered memory pools: :class:`MemoryPool` and :class:`PoolBuffer`.

A :class:`MemoryPool` wraps a driver pool (``cuMemPoolCreate``) of device
memory, pinned host memory (``Location.host()`` / ``Location.host_numa(n)``)
or managed memory. ``pool.allocate(n, stream=s)`` is ``cuMemAllocFromPoolAsync``
and returns a :class:`PoolBuffer`, whose ``free()`` is ``cuMemFreeAsync``.

Hot path design
---------------
A raw ``cuMemAllocFromPoolAsync`` + ``cuMemFreeAsync`` pair costs about
1.2 µs on an H100, so allocate + free together may add only a few hundred
nanoseconds, including the buffer object and its finalizer. Measured as
instructions per pair (callgrind, CPython 3.12, stub driver functions: the
simulator's own cost hides the difference) and checked on the H100, the
choices that matter are:

* **No** ``weakref.finalize`` **per buffer**: making and running one costs
  about 1 µs, as much as the driver calls. :class:`PoolBuffer` is a slotted
  object; ``allocate()`` makes a :class:`_LivePoolBuffer`, the subclass with
  a ``__del__`` that calls the module-level :func:`_release` with the plain
  values it holds (the ``CUdeviceptr``, the stream object and the pool), the
  function ``close()`` calls too. ``free()`` inlines the release, then turns
  the object into a plain ``PoolBuffer`` (``__class__`` assignment, same
  layout), so that dropping a freed buffer runs no Python code: the
  assignment costs about 280 instructions, a ``__del__`` call 620. The
  buffer has no ``__dict__`` (``Resource`` declares ``__slots__``): CPython
  materializes an instance dict at a ``__class__`` assignment, which cost
  another 250. ``_LivePoolBuffer()`` is a plain type call (``object.__new__``
  costs more).
* **Numpy views are the exception, so only they pay.** ``.array`` switches a
  buffer to :class:`_ViewedPoolBuffer`, whose ``free()`` / ``close()`` mind
  live views; other buffers skip that test.
* **Typed handles, converted once.** The bindings turn a plain ``int``
  stream, pool or pointer into a ``CUstream`` / ``CUmemoryPool`` /
  ``CUdeviceptr`` first (≈ 0.1 µs each). The pool keeps its ``CUmemoryPool``;
  a :class:`Stream` carries its ``CUstream`` (``_pool_cus``, set on its
  first allocation: one attribute load instead of a dict lookup) and
  ``Stream.close()`` sets it to ``None``, which is the closed-stream test of
  ``allocate()`` and ``free()``; other stream-likes get a :class:`_StreamRef`
  with the same attribute (shared per int handle), so the buffer holds one
  object and reads its stream with one load. The buffer hands the
  ``CUdeviceptr`` the driver returned back to ``cuMemFreeAsync``; ``.ptr``
  makes the ``int`` only when asked.
* **Mind what CPython 3.11/3.12 cannot specialize**: loading an instance
  attribute that a class attribute of the same name shadows (``Resource``'s
  ``_state``, ``_views``) is a generic lookup, about 5x slower than a slot
  or an instance attribute; so hot attributes get slots or no class default.
* **Driver functions resolved once** (``_driver.function``), results checked
  by hand and errors raised through ``_driver.check``; the rare cases (no
  current context on this thread, a closed allocation stream) are handled off
  the hot path.
* **No per-buffer bookkeeping in the pool.** ``close()`` asks the driver
  (``USED_MEM_CURRENT``, which drops at the free on the H100) whether memory
  is still in use, instead of counting buffers.

A buffer keeps its pool and its allocation stream object alive, and is never
freed on a stream that was closed: ``close()`` and the finalizer then
synchronize and free on the legacy default stream, ``free()`` refuses.

Pinned buffers from a pool (:meth:`HostBuffer.pooled`) use :func:`host_block`:
a small cache of freed blocks per power-of-two size class in front of the
driver's host pool, because a driver host-pool pair costs a few µs on the
H100 (probe section E) while the budget is about 1 µs (CuPy's pinned pool).
The default pinned pool publishes its cache to ``_pinned``, where
``HostBuffer.pooled(n)`` for bytes takes a cached block in its own frame (a
second Python frame cost 15 % of the pair); a miss, or another pool, goes
through :func:`pooled_host_buffer`. The buffer is a :class:`_PooledHostBuffer`
(shape and dtype derived from its size, not stored) whose ``close()`` puts the
block straight back in its size class's list.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from cuda.bindings import driver as _cu

from . import _driver, _pinned
from ._device import (
    STREAM_LEGACY,
    Device,
    Location,
    LocationLike,
    LocationType,
    Stream,
    StreamLike,
    _check_exists,
    as_location,
    device_count,
    ensure_context,
    stream_handle,
)
from ._errors import ClosedError, CudaError, CudaNotSupportedError, MemkitWarning
from ._interop import DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED, DeviceMemoryMixin
from ._pinned import HOST_CACHE_LIMIT, HOST_CACHE_MAX_BLOCK, HostBuffer, _PooledHostBuffer
from ._resource import Resource, State, driver_release, host_array, make_finalizer

if TYPE_CHECKING:
    import numpy as np
    from typing_extensions import Self

    from ._vmm import Access

__all__ = ["MemoryPool", "PoolBuffer", "PoolStats"]

_A = _cu.CUmemPool_attribute
_OPEN = State.OPEN
_CLOSED = State.CLOSED
_U64_MAX = (1 << 64) - 1
_INVALID_CONTEXT = 201
#: Size of an exported pointer (``CUmemPoolPtrExportData``).
EXPORT_DATA_SIZE = 64
#: Granularity in which the H100 maps memory into a pool (probe section E).
POOL_CHUNK = 32 << 20
#: Release threshold of :meth:`MemoryPool.default_pinned`.
DEFAULT_PINNED_RELEASE_THRESHOLD = 64 << 20
_PORTABLE = 0x1  # CU_MEMHOSTALLOC_PORTABLE


class PoolStats(NamedTuple):
    """Memory statistics of a pool in bytes (:meth:`MemoryPool.stats`).

    ``reserved_*``: backing memory the pool holds (the H100 maps it in 32 MiB
    chunks); ``used_*``: bytes of live allocations. ``*_high`` are the high
    watermarks since creation or :meth:`MemoryPool.reset_peaks`.
    """

    reserved_current: int
    reserved_high: int
    used_current: int
    used_high: int


# -- hot-path state -----------------------------------------------------------------

_ALLOC: Any = None  # cuMemAllocFromPoolAsync, resolved when a pool is made
_FREE: Any = None  # cuMemFreeAsync
_CUSTREAMS: dict[int, Any] = {}  # int handle -> CUstream


def _resolve() -> None:
    global _ALLOC, _FREE
    _ALLOC = _driver.function("cuMemAllocFromPoolAsync")
    _FREE = _driver.function("cuMemFreeAsync")


def _custream(stream: StreamLike) -> Any:
    """Return the cached ``CUstream`` for anything a ``stream=`` argument accepts."""
    h = stream_handle(stream)
    cs = _CUSTREAMS.get(h)
    if cs is None:
        if len(_CUSTREAMS) >= 1024:
            _CUSTREAMS.clear()
        cs = _CUSTREAMS[h] = _cu.CUstream(h)
    return cs


def _stream_cus(stream: Stream) -> Any:
    """First use of a :class:`Stream` by a pool: cache its ``CUstream`` on it.

    ``allocate()`` then reads ``stream._pool_cus`` (one slot load instead of a
    dict lookup); ``Stream.close()`` sets it to ``None``, which is the
    open-state test of ``allocate()`` and ``free()``.
    """
    cus = _custream(stream)  # raises ClosedError for a closed stream
    stream._pool_cus = cus
    return cus


class _StreamRef:
    """What a buffer holds for a stream given as anything but a :class:`Stream`.

    It carries the ``CUstream`` as ``_pool_cus``, the attribute a
    :class:`Stream` carries too, so a buffer reads its stream (and, for a
    ``Stream``, whether it was closed: ``None``) with one attribute load
    whatever it was given; ``obj`` keeps a stream object (CuPy, torch,
    cuda.core) alive as long as the buffer.
    """

    __slots__ = ("_pool_cus", "obj")

    def __init__(self, cus: Any, obj: object) -> None:
        self._pool_cus = cus
        self.obj = obj


_HANDLE_REFS: dict[int, _StreamRef] = {}  # int handles (and None): one shared _StreamRef each


def _buffer_stream(stream: StreamLike) -> Stream | _StreamRef:
    """The object a buffer allocated on ``stream`` holds (``_pool_cus`` set on it).

    Raises ClosedError for a closed :class:`Stream`.
    """
    if type(stream) is Stream:
        try:
            cus = stream._pool_cus
        except AttributeError:
            cus = _stream_cus(stream)
        if cus is None:
            stream._check_open()  # raises
        return stream
    if stream is None or type(stream) is int:
        ref = _HANDLE_REFS.get(stream)  # type: ignore[arg-type]
        if ref is None:
            if len(_HANDLE_REFS) >= 1024:
                _HANDLE_REFS.clear()
            ref = _HANDLE_REFS[stream] = _StreamRef(_custream(stream), None)  # type: ignore[index]
        return ref
    return _StreamRef(_custream(stream), stream)


def _size_arg(value: object, what: str) -> int:
    """Validate a byte count (an int or ``__index__``, not a bool) and return it."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    return int(value.__index__())


def _ordinal_arg(device: object) -> int:
    if isinstance(device, bool) or not isinstance(device, (int, Device)):
        raise TypeError(f"device must be an int ordinal or a Device, not {type(device).__name__}")
    ordinal = int(device)
    if ordinal < 0:
        raise ValueError(f"device ordinal must be >= 0, got {ordinal}")
    return ordinal


# -- release ---------------------------------------------------------------------------


def _release(dptr: Any, sref: Stream | _StreamRef, pool: MemoryPool) -> None:
    """Free one pool allocation, stream-ordered: the path of close() and the finalizer."""
    cus = sref._pool_cus
    if cus is None:
        # The allocation stream is closed and work queued on it may still use
        # the memory: wait for the device, then free on the legacy stream.
        ensure_context(pool._device)
        _driver.call("cuCtxSynchronize")
        cus = _custream(STREAM_LEGACY)
    res = _FREE(dptr, cus)
    if res[0]:
        _free_failed(res, dptr, cus, pool)


def _free_failed(res: Any, dptr: Any, cus: Any, pool: MemoryPool) -> None:
    if not res[0]:
        return
    if int(res[0]) == _INVALID_CONTEXT and not int(_driver.call("cuCtxGetCurrent")):
        ensure_context(pool._device)  # a default stream on a thread with no context
        res = _FREE(dptr, cus)
        if not res[0]:
            return
    _driver.check("cuMemFreeAsync", res)


# -- buffers ---------------------------------------------------------------------------


class PoolBuffer(Resource, DeviceMemoryMixin):
    """Memory from a :class:`MemoryPool` (``cuMemAllocFromPoolAsync``).

    Made by :meth:`MemoryPool.allocate` or :meth:`MemoryPool.import_pointer`.
    The allocation is stream-ordered: use it on its stream, or after
    synchronizing with it. :meth:`free` returns it to the pool in stream
    order; ``close()``, the ``with`` block and garbage collection free it on
    the stream it was allocated on.

    Device-pool buffers expose ``__cuda_array_interface__`` and DLPack; host
    and managed pool buffers also give a numpy view (:attr:`array`). Any
    buffer works with :func:`cuda_memkit.copy`.
    """

    # No __dict__: ``__class__`` assignment (free()) would materialize it.
    __slots__ = ("_deferred", "_dptr", "_nbytes", "_pool", "_sref", "_views")

    _dptr: Any
    _nbytes: int
    _sref: Stream | _StreamRef  # its _pool_cus: the CUstream, None once a Stream is closed
    _pool: MemoryPool

    def __init__(self) -> None:
        raise TypeError("PoolBuffer objects are made by MemoryPool.allocate()")

    @property
    def closed(self) -> bool:
        """Whether the buffer was freed or closed."""
        return self._dptr is None

    def _check_open(self) -> None:
        if self._dptr is None:
            raise ClosedError("PoolBuffer was freed; it cannot be used any more")

    @property
    def ptr(self) -> int:
        """Address of the allocation (a device pointer; for host pools also the host address)."""
        d = self._dptr
        if d is None:
            raise ClosedError("PoolBuffer was freed; it cannot be used any more")
        return int(d)

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        self._check_open()
        return self._nbytes

    @property
    def pool(self) -> MemoryPool:
        """The pool the memory came from."""
        return self._pool

    @property
    def stream(self) -> int:
        """Handle of the stream the buffer was allocated on (and is freed on by default)."""
        sref = self._sref
        cus = sref._pool_cus
        return int(cus) if cus is not None else cast(Stream, sref)._handle

    def free(self, stream: StreamLike = None) -> None:
        """Return the memory to the pool, ordered on ``stream`` (``cuMemFreeAsync``).

        Parameters
        ----------
        stream : stream-like, optional
            Default: the stream the buffer was allocated on. Work queued on
            that stream before the free may still use the memory.

        Raises
        ------
        ClosedError
            If the buffer was already freed, or the stream is a closed
            :class:`Stream` (the buffer then stays allocated; free it on
            another stream, or ``close()`` it).
        BufferError
            If numpy views of the memory (:attr:`array`) are alive (the
            buffer then stays allocated; drop them, or ``close()`` it, which
            frees once they are gone).
        CudaError
            If the driver refuses (the buffer then stays allocated).
        """
        d = self._dptr  # _release() inlined: this is the hot path
        if d is None:  # (numpy views: _ViewedPoolBuffer.free checks them first)
            raise ClosedError("PoolBuffer was already freed")
        if stream is None:
            cus = self._sref._pool_cus
            if cus is None:
                raise ClosedError("the stream this buffer was allocated on is closed; "
                                  "free it with stream=another stream, or close() it")
        else:
            cus = _custream(stream)
        self._dptr = None  # claimed before the driver call, so that nothing frees it twice
        res = _FREE(d, cus)
        if res[0]:
            self._dptr = d
            _free_failed(res, d, cus, self._pool)  # raises, or freed once a context is current
            self._dptr = None
        self.__class__ = PoolBuffer  # nothing left for a finalizer: drop __del__

    def close(self) -> None:
        """Free the buffer on its allocation stream; calling it again does nothing.

        With numpy views of the memory alive (:attr:`array`), the free
        happens once they and the buffer are gone.
        """
        d = self._dptr
        if d is None:
            return
        self._dptr = None
        try:
            _release(d, self._sref, self._pool)
        except BaseException:
            self._dptr = d
            raise
        self.__class__ = PoolBuffer

    def __enter__(self) -> Self:
        self._check_open()
        return self

    def _dl_device(self) -> tuple[int, int]:
        pool = self._pool
        if pool._managed:
            return (DL_CUDA_MANAGED, 0)
        if pool._host:
            return (DL_CUDA_HOST, 0)
        return (DL_CUDA, pool._device or 0)

    @property
    def array(self) -> np.ndarray[Any, Any]:
        """A zero-copy ``uint8`` numpy view (host-located and managed pools only).

        The view keeps the buffer alive. Synchronize the allocation stream
        before the CPU touches the memory.

        Raises
        ------
        TypeError
            For device pools, whose memory the CPU cannot address.
        """
        import numpy as np

        pool = self._pool
        if not (pool._host or pool._managed):
            raise TypeError("device pool memory is not host-accessible; copy it to a host "
                            "buffer or allocate from a host-located pool")
        ptr = self.ptr  # ClosedError once freed
        if type(self) is _LivePoolBuffer:  # from now on free() and close() mind the views
            self._views = None
            self.__class__ = _ViewedPoolBuffer
        return host_array(self, ptr, (self._nbytes,), np.dtype(np.uint8))

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
        arr = self.array
        return arr if dtype is None else arr.astype(dtype)

    def export(self) -> bytes:
        """Export the allocation to another process (``cuMemPoolExportPointer``).

        The pool must be IPC-capable (``ipc=True``). The other process imports
        the pool (:meth:`MemoryPool.import_`), then this pointer
        (:meth:`MemoryPool.import_pointer`), and must free its mapping before
        this process frees the buffer. Exports the pool first if it never was
        (the H100 refuses pointers of a pool not yet exported), and waits for
        the allocation's stream.

        Returns
        -------
        bytes
            64 opaque bytes, safe to send through any channel.
        """
        self._check_open()
        if not self._pool._ipc or self._pool._imported:
            raise ValueError("only buffers of a pool created with ipc=True can be exported")
        if not self._pool._exported:
            os.close(self._pool.export())  # the driver exports pointers of exported pools only
        cus = self._sref._pool_cus
        if cus is None:
            ensure_context(self._pool._device)  # its stream is gone: wait for the device
            _driver.call("cuCtxSynchronize")
        else:
            _driver.call("cuStreamSynchronize", cus)
        data = _driver.call("cuMemPoolExportPointer", self._dptr)
        return ctypes.string_at(data.getPtr(), EXPORT_DATA_SIZE)

    def __repr__(self) -> str:
        if self._dptr is None:
            return "<PoolBuffer freed>"
        return f"<PoolBuffer 0x{int(self._dptr):x} nbytes={self._nbytes} from {self._pool!r}>"


class _LivePoolBuffer(PoolBuffer):
    """A :class:`PoolBuffer` that still owns its memory: the only kind with a finalizer.

    ``allocate()`` makes these; ``free()`` and ``close()`` turn the object
    into a plain :class:`PoolBuffer` (``__class__`` assignment, same layout)
    once the memory is gone, so that dropping a freed buffer runs no Python
    ``__del__`` at all: cheaper than a ``__del__`` call that finds nothing to
    do. A buffer whose free failed, or whose close() waits for numpy views,
    keeps this class and is freed by garbage collection.
    """

    __slots__ = ()
    if TYPE_CHECKING:
        def __init__(self) -> None: ...
    else:
        __init__ = object.__init__  # made by _LivePoolBuffer() (PoolBuffer() refuses)

    def __del__(self) -> None:
        try:
            d = self._dptr
        except AttributeError:  # never fully made
            return
        if d is not None:
            self._dptr = None
            _finalize(d, self._sref, self._pool)


class _ViewedPoolBuffer(_LivePoolBuffer):
    """A live :class:`PoolBuffer` of which :attr:`~PoolBuffer.array` made numpy views.

    ``.array`` switches a buffer to this class (same layout), so that only
    such buffers pay for the check that no view is alive: :meth:`free`
    refuses while one is, :meth:`close` defers the free until they are gone.
    """

    __slots__ = ()

    def free(self, stream: StreamLike = None) -> None:
        """As :meth:`PoolBuffer.free`; raises ``BufferError`` while numpy views are alive."""
        if self._dptr is not None and self._views:
            raise BufferError("numpy views of this buffer are alive; drop them first, "
                              "or close() it, which frees once they are gone")
        PoolBuffer.free(self, stream)

    def close(self) -> None:
        """As :meth:`PoolBuffer.close`; with numpy views alive, frees once they are gone."""
        d = self._dptr
        if d is not None and self._views:
            self._dptr = None
            self._deferred = d  # freed by __del__, once the views (which hold us) are gone
            return
        PoolBuffer.close(self)

    def __del__(self) -> None:
        try:
            d = self._dptr
        except AttributeError:  # never fully made
            return
        if d is None:  # closed while numpy views were alive: the free was deferred
            try:
                d = self._deferred
            except AttributeError:
                return
            del self._deferred
        self._dptr = None
        _finalize(d, self._sref, self._pool)


def _finalize(d: Any, sref: Stream | _StreamRef, pool: MemoryPool) -> None:
    """The release a buffer's ``__del__`` runs: warnings instead of exceptions."""
    if sys.is_finalizing():
        return
    try:
        _release(d, sref, pool)
    except CudaError as exc:
        warnings.warn(f"cuda_memkit: freeing pool buffer 0x{int(d):x} failed: {exc}",
                      MemkitWarning, stacklevel=2)


_new_object = object.__new__


# -- pools -------------------------------------------------------------------------------


def _threshold_arg(value: object) -> int:
    v = _size_arg(value, "release_threshold")
    if not 0 <= v <= _U64_MAX:
        raise ValueError(f"release_threshold must be in [0, 2**64), got {v}")
    return v


def _access_arg(access: object) -> Access:
    from ._vmm import Access  # the VMM module's enum, loaded when access is used

    if isinstance(access, _cu.CUmemAccess_flags):
        access = int(access)
    if isinstance(access, bool) or not isinstance(access, int):
        raise TypeError(f"access must be an Access value, not {type(access).__name__}")
    try:
        return Access(int(access))
    except ValueError:
        raise ValueError(f"{access!r} is not an Access value (NONE, READ, READWRITE)") from None


def _not_supported(what: str) -> CudaNotSupportedError:
    return CudaNotSupportedError(801, "cuMemPoolCreate", "CUDA_ERROR_NOT_SUPPORTED",
                                 f"{what} are not supported by this device or driver")


def _destroy_pool(cupool: Any, cache: _HostCache) -> None:
    """Release function of an owned pool: empty its pinned-block cache, then destroy it."""
    cache.close()
    _driver.call("cuMemPoolDestroy", cupool)


class MemoryPool(Resource):
    """A stream-ordered memory pool (``cuMemPoolCreate``).

    Parameters
    ----------
    device : Device or int, default 0
        Device whose memory the pool holds, when ``location`` is not given.
    location : Location, optional
        ``Location.device(n)``, or ``Location.host()`` / ``Location.host_numa(n)``
        for pinned host memory. For managed pools: the preferred location
        (default: none).
    managed : bool, default False
        A managed-memory pool (CUDA >= 13, concurrent managed access on
        every device).
    max_size : int, default 0
        Most bytes the pool may reserve (0: no limit; the driver rounds it
        up to its 32 MiB chunks). Beyond it allocations raise
        :class:`CudaOutOfMemoryError`.
    ipc : bool, default False
        Shareable with other processes through a POSIX file descriptor
        (:meth:`export`). Not for ``Location.host()`` or managed pools.
    release_threshold : int, optional
        Unused bytes the pool keeps at synchronization points instead of
        returning them to the system (driver default 0).

    Raises
    ------
    TypeError, ValueError
        For bad arguments, before any driver call.
    CudaNotSupportedError
        If the device or driver has no pools of this kind.

    Examples
    --------
    >>> with cm.MemoryPool(0, release_threshold=1 << 30) as pool:
    ...     buf = pool.allocate(1 << 20, stream=stream)
    ...     buf.free()
    """

    _gen: object = None  # default_pinned(): the simulated machine it was made on
    # Host pools: released blocks for HostBuffer. Set by _setup(), no class default:
    # an instance attribute shadowing a class attribute is a slow (unspecialized) load.
    _hcache: _HostCache | None

    def __init__(
        self,
        device: Device | int = 0,
        *,
        location: LocationLike | None = None,
        managed: bool = False,
        max_size: int = 0,
        ipc: bool = False,
        release_threshold: int | None = None,
    ) -> None:
        ordinal = _ordinal_arg(device)
        loc = None if location is None else as_location(location)
        if not isinstance(managed, bool) or not isinstance(ipc, bool):
            raise TypeError("managed and ipc must be bools")
        max_size = _size_arg(max_size, "max_size")
        if not 0 <= max_size < 1 << 64:
            raise ValueError(f"max_size must be in [0, 2**64), got {max_size}")
        threshold = None if release_threshold is None else _threshold_arg(release_threshold)
        if loc is not None and loc.type is LocationType.HOST_NUMA_CURRENT:
            raise ValueError("a pool needs a fixed location; use Location.host_numa(n)")
        if managed:
            if ipc or max_size:
                raise ValueError("managed pools take neither ipc nor max_size")
        elif loc is None:
            loc = Location.device(ordinal)
        elif loc.type is LocationType.HOST and ipc:
            raise ValueError("Location.host() pools cannot be shared (ipc); use host_numa(n)")

        ensure_context(None)
        self._check_support(loc, managed)
        props = _cu.CUmemPoolProps()
        T = _cu.CUmemAllocationType
        props.allocType = (T.CU_MEM_ALLOCATION_TYPE_MANAGED if managed
                           else T.CU_MEM_ALLOCATION_TYPE_PINNED)
        props.handleTypes = _cu.CUmemAllocationHandleType(1 if ipc else 0)
        if loc is not None:
            props.location = loc.to_cu()
        props.maxSize = max_size
        _resolve()
        cupool = _driver.call("cuMemPoolCreate", props)
        cache = _HostCache()
        fin = make_finalizer(self, f"memory pool 0x{int(cupool):x}", _destroy_pool, cupool,
                             cache)
        self._setup(cupool, loc, managed, ipc, owned=True, imported=False)
        if self._host:
            self._hcache = cache
        self._open(fin)
        self._max_size = -(-max_size // POOL_CHUNK) * POOL_CHUNK
        if threshold is not None:
            try:
                self.release_threshold = threshold
            except BaseException:
                self.close()
                raise

    @staticmethod
    def _check_support(loc: Location | None, managed: bool) -> None:
        if managed:
            n = device_count()
            if not (hasattr(_cu.CUmemAllocationType, "CU_MEM_ALLOCATION_TYPE_MANAGED") and n
                    and all(Device(i).concurrent_managed_access for i in range(n))):
                raise _not_supported("managed memory pools")
            return
        assert loc is not None
        if loc.type is LocationType.DEVICE:
            if not Device(loc.id).memory_pools:
                raise _not_supported("memory pools")
        elif not Device(0).host_memory_pools:
            raise _not_supported("host memory pools")

    def _setup(self, cupool: Any, loc: Location | None, managed: bool, ipc: bool, *,
               owned: bool, imported: bool) -> None:
        self._cu = cupool
        self._acu = None if imported else cupool  # for allocate(); None: cannot allocate
        self._handle = int(cupool)
        self._location = loc
        self._managed = managed
        self._host = loc is not None and loc.is_host and not managed
        self._device = (loc.id if loc is not None and loc.type is LocationType.DEVICE
                        and not managed else None)
        self._ipc = ipc
        self._owned = owned
        self._imported = imported
        self._max_size = 0
        self._imports: weakref.WeakSet[PoolBuffer] = weakref.WeakSet()
        self._hcache = None

    # -- other constructors --------------------------------------------------------
    @classmethod
    def default(cls, device: Device | int = 0) -> MemoryPool:
        """The device's default pool (``cuDeviceGetDefaultMemPool``), not owned.

        Closing the returned object never destroys the pool.

        Parameters
        ----------
        device : int or Device, default 0
            The device whose default pool to wrap.
        """
        ordinal = _ordinal_arg(device)
        ensure_context(None)
        cupool = _driver.call("cuDeviceGetDefaultMemPool", _driver.call("cuDeviceGet", ordinal))
        _resolve()
        self = cls.__new__(cls)
        self._setup(cupool, Location.device(ordinal), False, False, owned=False, imported=False)
        self._open(None)
        return self

    @staticmethod
    def default_pinned() -> MemoryPool:
        """The process's shared pinned-host pool, created on first use.

        ``Location.host()`` memory that every device may read and write,
        keeping up to ``DEFAULT_PINNED_RELEASE_THRESHOLD`` (64 MiB) of unused
        memory, so that small pinned buffers cost microseconds instead of the
        milliseconds of ``cuMemHostAlloc``; :meth:`HostBuffer.pooled` uses it.
        It lives as long as the process; ``close()`` on it does nothing.
        """
        pool = _pinned_default
        if pool is None or (_sim_state is not None and pool._gen is not _sim_state.MACHINE):
            pool = _make_default_pinned()
        return pool

    @classmethod
    def import_(cls, fd: int) -> MemoryPool:
        """Import a pool another process exported (``cuMemPoolImportFromShareableHandle``).

        Parameters
        ----------
        fd : int
            The POSIX file descriptor from :meth:`export` (inherited, or
            received through ``socket.recv_fds``). It stays open: close it.

        Returns
        -------
        MemoryPool
            An imported pool: it cannot allocate, and the driver answers no
            attribute queries on it; use :meth:`import_pointer`.
        """
        if isinstance(fd, bool) or not isinstance(fd, int):
            raise TypeError(f"fd must be an int file descriptor, not {type(fd).__name__}")
        if fd < 0:
            raise ValueError(f"invalid file descriptor {fd}")
        ensure_context(None)
        _resolve()
        H = _cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        cupool = _driver.call("cuMemPoolImportFromShareableHandle", fd, H, 0)
        self = cls.__new__(cls)
        fin = make_finalizer(self, f"imported memory pool 0x{int(cupool):x}", driver_release,
                             "cuMemPoolDestroy", cupool)
        self._setup(cupool, None, False, True, owned=True, imported=True)
        self._open(fin)
        return self

    # -- identity ------------------------------------------------------------------
    @property
    def handle(self) -> int:
        """The ``CUmemoryPool`` handle as an int."""
        self._check_open()
        return self._handle

    @property
    def location(self) -> Location | None:
        """Where the memory lives (managed pools: the preferred location; imported: None)."""
        return self._location

    @property
    def device(self) -> int | None:
        """Ordinal of the device holding the memory; ``None`` for host, managed, imported."""
        return self._device

    @property
    def managed(self) -> bool:
        """Whether the pool holds managed memory."""
        return self._managed

    @property
    def is_host(self) -> bool:
        """Whether the pool holds pinned host memory."""
        return self._host

    @property
    def ipc(self) -> bool:
        """Whether the pool is shareable with other processes (imported pools too)."""
        return self._ipc

    @property
    def owned(self) -> bool:
        """Whether closing this object destroys the pool."""
        return self._owned

    @property
    def imported(self) -> bool:
        """Whether the pool was imported from another process."""
        return self._imported

    def __repr__(self) -> str:
        if self.closed:
            return "<MemoryPool closed>"
        kind = "imported" if self._imported else (
            "managed" if self._managed else str(self._location))
        tags = ("" if self._owned else " default") + (" ipc" if self._ipc else "")
        return f"<MemoryPool 0x{self._handle:x} {kind}{tags}>"

    # -- allocation ----------------------------------------------------------------
    def allocate(self, nbytes: int, *, stream: StreamLike) -> PoolBuffer:
        """Allocate ``nbytes`` ordered on ``stream`` (``cuMemAllocFromPoolAsync``).

        Parameters
        ----------
        nbytes : int
            Size in bytes (> 0).
        stream : stream-like
            The stream the allocation is ordered on (required; ``None`` is
            the legacy default stream).

        Returns
        -------
        PoolBuffer

        Raises
        ------
        TypeError, ValueError
            For a size that is not a positive int.
        ClosedError
            If the pool, or a :class:`Stream` given, is closed.
        CudaOutOfMemoryError
            Beyond ``max_size`` or the device's memory.
        """
        if type(nbytes) is not int or nbytes <= 0:
            nbytes = _size_arg(nbytes, "nbytes")
            if nbytes <= 0:
                raise ValueError(f"nbytes must be > 0, got {nbytes}")
        cupool = self._acu
        if cupool is None:
            self._check_open()
            raise ValueError("an imported pool cannot allocate; use import_pointer()")
        if type(stream) is Stream:
            try:
                cus = stream._pool_cus
            except AttributeError:
                cus = _stream_cus(stream)
            if cus is None:  # closed
                stream._check_open()
            sref: Stream | _StreamRef = stream
        else:
            sref = _buffer_stream(stream)
            cus = sref._pool_cus
        err, dptr = _ALLOC(nbytes, cupool, cus)
        if err:
            dptr = self._alloc_failed((err, dptr), nbytes, cupool, cus)[1]
        buf = _LivePoolBuffer()
        buf._dptr = dptr
        buf._nbytes = nbytes
        buf._sref = sref
        buf._pool = self
        return buf

    def _alloc_failed(self, res: Any, nbytes: int, cupool: Any, cus: Any) -> Any:
        if not res[0]:
            return res
        if int(res[0]) == _INVALID_CONTEXT and not int(_driver.call("cuCtxGetCurrent")):
            ensure_context(self._device)  # a default stream on a thread with no context
            res = _ALLOC(nbytes, cupool, cus)
            if not res[0]:
                return res
        _driver.check("cuMemAllocFromPoolAsync", res)
        raise AssertionError("unreachable")  # pragma: no cover

    # -- attributes ------------------------------------------------------------------
    def _get(self, attr: _cu.CUmemPool_attribute) -> int:
        self._check_open()
        return int(_driver.call("cuMemPoolGetAttribute", self._cu, attr))

    def _set(self, attr: _cu.CUmemPool_attribute, value: Any) -> None:
        self._check_open()
        _driver.call("cuMemPoolSetAttribute", self._cu, attr, value)

    @property
    def release_threshold(self) -> int:
        """Unused bytes kept when a stream, event or context is synchronized (get/set).

        Above it, the driver returns whole unused chunks to the system at the
        next synchronization. New and default pools start at 0.
        """
        return self._get(_A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)

    @release_threshold.setter
    def release_threshold(self, value: int) -> None:
        self._set(_A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, _cu.cuuint64_t(_threshold_arg(value)))

    def _set_flag(self, attr: _cu.CUmemPool_attribute, value: object) -> None:
        if not isinstance(value, (bool, int)) or value not in (0, 1):
            raise TypeError(f"expected a bool, not {value!r}")
        self._set(attr, int(value))

    @property
    def reuse_follow_event_dependencies(self) -> bool:
        """Reuse memory freed on another stream when an event orders the two (get/set)."""
        return bool(self._get(_A.CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES))

    @reuse_follow_event_dependencies.setter
    def reuse_follow_event_dependencies(self, value: bool) -> None:
        self._set_flag(_A.CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, value)

    @property
    def reuse_allow_opportunistic(self) -> bool:
        """Reuse memory whose free has already completed, without ordering (get/set)."""
        return bool(self._get(_A.CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC))

    @reuse_allow_opportunistic.setter
    def reuse_allow_opportunistic(self, value: bool) -> None:
        self._set_flag(_A.CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, value)

    @property
    def reuse_allow_internal_dependencies(self) -> bool:
        """Let the driver add stream dependencies to reuse freed memory (get/set)."""
        return bool(self._get(_A.CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES))

    @reuse_allow_internal_dependencies.setter
    def reuse_allow_internal_dependencies(self, value: bool) -> None:
        self._set_flag(_A.CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, value)

    @property
    def max_size(self) -> int:
        """Most bytes the pool may reserve, in whole 32 MiB chunks; 0: no limit (read-only)."""
        try:
            return self._get(_A.CU_MEMPOOL_ATTR_MAX_POOL_SIZE)
        except TypeError:  # cuda-bindings < 13.4 cannot read this attribute
            return self._max_size

    def stats(self) -> PoolStats:
        """Return reserved and used memory and their high watermarks."""
        return PoolStats(
            self._get(_A.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
            self._get(_A.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH),
            self._get(_A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
            self._get(_A.CU_MEMPOOL_ATTR_USED_MEM_HIGH),
        )

    def reset_peaks(self) -> None:
        """Reset both high watermarks to the current values."""
        zero = _cu.cuuint64_t(0)
        self._set(_A.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, zero)
        self._set(_A.CU_MEMPOOL_ATTR_USED_MEM_HIGH, zero)

    def trim(self, keep_bytes: int = 0) -> None:
        """Return unused memory to the system, keeping at least ``keep_bytes`` reserved.

        Only whole unused 32 MiB chunks go; memory of frees the host has not
        seen complete may still count as used, so synchronize first.

        Parameters
        ----------
        keep_bytes : int, default 0
            Bytes to keep reserved, in ``[0, 2**64)``.

        Raises
        ------
        TypeError, ValueError
            For a non-int or out-of-range ``keep_bytes`` (before the driver call).
        ClosedError
            If the pool is closed.
        """
        keep = _size_arg(keep_bytes, "keep_bytes")
        if not 0 <= keep < 1 << 64:
            raise ValueError(f"keep_bytes must be in [0, 2**64), got {keep}")
        self._check_open()
        if self._hcache is not None:
            self._hcache.clear()
        _driver.call("cuMemPoolTrimTo", self._cu, keep)

    # -- access ------------------------------------------------------------------------
    def set_access(self, device: LocationLike | Iterable[LocationLike], access: Access) -> None:
        """Grant or revoke devices' access to the pool's memory (``cuMemPoolSetAccess``).

        Parameters
        ----------
        device : Device, int, Location, or an iterable of them
            The device(s): peers of a device pool's own device, or any device
            for a pinned host pool.
        access : Access
            ``Access.READWRITE`` or ``Access.NONE`` (the H100 refuses
            ``READ`` with ``CudaNotSupportedError``, and revoking the owning
            device's access with ``CudaInvalidDeviceError``).

        Raises
        ------
        TypeError, ValueError
            For a bad location or access, or a device that does not exist
            (before the driver call).
        """
        flags = _access_arg(access)
        items = list(device) if isinstance(device, Iterable) else [device]
        if not items:
            raise ValueError("no device given")
        locs = [_check_exists(as_location(d)) for d in items]
        self._check_open()
        descs = []
        for loc in locs:
            desc = _cu.CUmemAccessDesc()
            desc.location = loc.to_cu()
            desc.flags = _cu.CUmemAccess_flags(int(flags))
            descs.append(desc)
        _driver.call("cuMemPoolSetAccess", self._cu, descs, len(descs))

    def access(self, device: LocationLike) -> Access:
        """Return the access ``device`` (or a host location) has to the pool's memory.

        Parameters
        ----------
        device : Device, int or Location
            Whose access to read (``cuMemPoolGetAccess``).

        Returns
        -------
        Access

        Raises
        ------
        TypeError, ValueError
            For a bad location or a device that does not exist (before the
            driver call).
        """
        loc = _check_exists(as_location(device))
        self._check_open()
        flags = int(_driver.call("cuMemPoolGetAccess", self._cu, loc.to_cu()))
        return _access_arg(flags)

    # -- IPC ---------------------------------------------------------------------------
    def export(self) -> int:
        """Export the pool as a POSIX file descriptor (``cuMemPoolExportToShareableHandle``).

        Returns
        -------
        int
            A new descriptor owned by the caller: hand it to the other process
            (``pass_fds``, ``socket.send_fds``), then close it.
        """
        self._check_open()
        if not self._ipc or self._imported:
            raise ValueError("only pools created with ipc=True can be exported")
        H = _cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        fd = int(_driver.call("cuMemPoolExportToShareableHandle", self._cu, H, 0))
        self._exported = True
        return fd

    #: Whether :meth:`export` ran: the H100 refuses to export pointers of a
    #: pool that was never exported (``CUDA_ERROR_INVALID_VALUE``).
    _exported = False

    def import_pointer(self, data: bytes, *, stream: StreamLike = None,
                       nbytes: int | None = None) -> PoolBuffer:
        """Map an allocation another process exported (``cuMemPoolImportPointer``).

        Parameters
        ----------
        data : bytes
            The 64 bytes of :meth:`PoolBuffer.export`.
        stream : stream-like, optional
            Stream the returned buffer is freed on by default.
        nbytes : int, optional
            Size of the allocation; default: asked from the driver.

        Returns
        -------
        PoolBuffer
            The mapping; free it before the exporter frees the original.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data must be the bytes of PoolBuffer.export(), not "
                            f"{type(data).__name__}")
        raw = bytes(data)
        if len(raw) != EXPORT_DATA_SIZE:
            raise ValueError(f"exported pointer data is {EXPORT_DATA_SIZE} bytes, got {len(raw)}")
        size = None if nbytes is None else _size_arg(nbytes, "nbytes")
        if size is not None and size <= 0:
            raise ValueError(f"nbytes must be > 0, got {size}")
        sref = _buffer_stream(stream)
        self._check_open()
        share = _cu.CUmemPoolPtrExportData()
        ctypes.memmove(share.getPtr(), raw, EXPORT_DATA_SIZE)
        dptr = _driver.call("cuMemPoolImportPointer", self._cu, share)
        buf = _LivePoolBuffer()
        buf._dptr, buf._nbytes, buf._sref, buf._pool = dptr, 0, sref, self
        self._imports.add(buf)
        if size is None:
            try:
                size = int(_driver.call("cuPointerGetAttribute",
                                        _cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                        dptr))
            except BaseException:
                buf.close()
                raise
        buf._nbytes = size
        return buf

    # -- lifetime ----------------------------------------------------------------------
    def _in_use(self) -> str:
        """Describe live allocations ("" if none); ``USED_MEM_CURRENT`` drops at the free."""
        if self._imported:
            n = sum(1 for b in self._imports if not b.closed)
            return f"{n} imported buffer(s) alive" if n else ""
        if self._hcache is not None:
            self._hcache.clear()
        used = self._get(_A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
        return f"{used} bytes in live allocations" if used else ""

    def close(self, force: bool = False) -> None:
        """Destroy the pool (``cuMemPoolDestroy``); calling it again does nothing.

        Parameters
        ----------
        force : bool, default False
            Destroy even with allocations alive: the driver keeps their memory
            until they are freed (their ``free()`` stays valid); the pool
            takes no new allocations.

        Raises
        ------
        BufferError
            If allocations are alive and ``force`` is false.

        Notes
        -----
        For :meth:`default` pools this only closes the Python object, and
        :meth:`default_pinned` ignores it.
        """
        if self.closed or self is _pinned_default:
            return
        if self._owned and not force:
            live = self._in_use()
            if live:
                raise BufferError(f"cannot close a memory pool with {live}; free them first "
                                  "or pass force=True")
        self._acu = None
        super().close()


# -- the default pinned pool and pinned blocks for HostBuffer ------------------------------

_pinned_lock = threading.Lock()
_pinned_default: MemoryPool | None = None
_host_stream: Stream | None = None
_sim_state: Any = None  # cuda_memkit.sim._state if the default pinned pool is simulated


def _generation() -> object:
    """The simulated machine (replaced by ``sim.reset()``), or None on a GPU."""
    state = sys.modules.get("cuda_memkit.sim._state")
    return getattr(state, "MACHINE", None) if state is not None else None


def _make_default_pinned() -> MemoryPool:
    global _pinned_default, _host_stream, _sim_state
    with _pinned_lock:
        pool = _pinned_default
        if pool is not None and pool._gen is _generation():
            return pool
        pool = MemoryPool(location=Location.host(),
                          release_threshold=DEFAULT_PINNED_RELEASE_THRESHOLD)
        try:
            pool.set_access(range(device_count()), _access_arg(3))  # READWRITE
        except BaseException:
            pool.close()
            raise
        pool._gen = _generation()  # after the first driver call loaded the backend
        _host_stream = None
        # default_pinned() compares the machine only on the simulator (a
        # function call per buffer otherwise; the backend never changes).
        _sim_state = sys.modules.get("cuda_memkit.sim._state") if pool._gen is not None else None
        _pinned_default = pool
        cache = pool._hcache
        assert cache is not None
        cache.gen = pool._gen
        # HostBuffer.pooled(n) takes cached blocks straight from this cache.
        _pinned._pooled_sim = _sim_state
        _pinned._pooled_cache = cache
        return pool


def host_stream() -> Stream:
    """The private, idle stream that pinned pool blocks are ordered on.

    Nothing else is queued on it, so a block allocated on it is usable by the
    CPU when the call returns, and a block freed on it is immediately free.
    """
    global _host_stream
    s = _host_stream
    if s is None or s.closed:
        with _pinned_lock:
            s = _host_stream
            if s is None or s.closed:
                s = _host_stream = Stream()
    return s


class _HostCache:
    """Freed pinned blocks of one host pool, per power-of-two size class.

    Holds no reference to the pool, so the pool's finalizer can take it as a
    plain argument and empty it before destroying the pool. The cached
    objects are the :class:`_HostBlock` objects themselves (reused, not
    re-made). ``bins`` has a list for every size class from the start and
    keeps it for good: a block holds its class's list (``_bin``) and goes
    back without a lookup.
    """

    __slots__ = ("bins", "cached", "cus", "gen", "open")

    def __init__(self) -> None:
        self.bins: dict[int, list[_HostBlock]] = {
            1 << i: [] for i in range(HOST_CACHE_MAX_BLOCK.bit_length())}
        self.cached = 0
        self.cus: Any = None  # the CUstream of host_stream(), set on first use
        self.open = True
        self.gen: object = None  # the simulated machine of the default pinned pool

    def put(self, block: _HostBlock) -> None:
        size = block._size
        blocks = block._bin
        if blocks is not None and self.open and self.cached + size <= HOST_CACHE_LIMIT:
            blocks.append(block)
            self.cached += size
            return
        d, block._dptr = block._dptr, None
        _driver.check("cuMemFreeAsync", _FREE(d, self.cus))

    def clear(self) -> None:
        """Give every cached block back to the driver pool."""
        for blocks in self.bins.values():
            while blocks:
                try:
                    block = blocks.pop()
                except IndexError:  # another thread took the last one
                    break
                self.cached -= block._size
                d, block._dptr = block._dptr, None
                _driver.check("cuMemFreeAsync", _FREE(d, self.cus))

    def close(self) -> None:
        self.open = False
        self.clear()


class _HostBlock:
    """A pinned pool block lent to a :class:`HostBuffer`; ``release()`` gives it back.

    While lent (``_busy``) the buffer holds it; a released block waits in its
    cache for the next buffer of its size class. A block collected while
    lent (its buffer was garbage-collected) gives its memory back through a
    new block object, never by resurrecting itself.
    """

    __slots__ = ("_bin", "_busy", "_cache", "_dptr", "_size", "ptr")

    _bin: list[_HostBlock] | None  # its size class's list in the cache; None: never cached
    _busy: bool
    _cache: _HostCache
    _dptr: Any
    _size: int
    ptr: int  #: the block's address

    def release(self) -> None:
        if self._busy:
            self._busy = False
            self._cache.put(self)

    def __del__(self) -> None:
        try:
            if not self._busy or sys.is_finalizing():
                return
        except AttributeError:  # never fully made
            return
        self._busy = False
        heir = _new_object(_HostBlock)
        heir._cache, heir._dptr, heir._size, heir.ptr = (self._cache, self._dptr, self._size,
                                                         self.ptr)
        heir._bin = self._bin
        heir._busy = False
        try:
            self._cache.put(heir)
        except CudaError as exc:
            warnings.warn(f"cuda_memkit: freeing pinned pool block 0x{self.ptr:x} failed: "
                          f"{exc}", MemkitWarning, stacklevel=1)


def _host_block_checks(pool: object, flags: int) -> None:
    if type(pool) is not MemoryPool or not pool._host:
        raise TypeError(f"pool must be a pinned host MemoryPool (Location.host() or "
                        f"host_numa(n)), not {pool!r}")
    if flags & ~_PORTABLE:
        raise ValueError("memory from a pool is plain pinned memory (DEFAULT or PORTABLE); "
                         "DEVICEMAP and WRITECOMBINED need pool=None")
    pool._check_open()
    if pool._hcache is None:
        raise TypeError(f"{pool!r} cannot give pinned blocks")


def host_block(pool: object, nbytes: int, flags: int = 0) -> _HostBlock | None:
    """Take ``nbytes`` of pinned memory from host pool ``pool`` (for :class:`HostBuffer`).

    ``flags`` are :class:`HostAllocFlags`: a pool gives ``DEFAULT`` / ``PORTABLE``
    memory (every device may access :meth:`MemoryPool.default_pinned`). With
    ``nbytes == 0`` only the arguments are checked (and ``None`` returned).

    Blocks up to :data:`HOST_CACHE_MAX_BLOCK` are rounded up to a power of
    two and recycled through the pool's cache of released blocks (at most
    :data:`HOST_CACHE_LIMIT` bytes); the driver is called only on a miss. As
    with any pinned pool (CuPy's, torch's), synchronize the GPU work that
    uses a buffer before closing it.
    """
    cache: _HostCache | None = getattr(pool, "_hcache", None)
    if cache is None or not cache.open or flags & ~_PORTABLE or nbytes <= 0:
        _host_block_checks(pool, flags)
        return None
    size = 1 << (nbytes - 1).bit_length() if nbytes <= HOST_CACHE_MAX_BLOCK else nbytes
    blocks = cache.bins.get(size)
    if blocks:
        try:
            block = blocks.pop()
        except IndexError:  # another thread took the last one
            pass
        else:
            cache.cached -= size
            block._busy = True
            return block
    cus = cache.cus
    if cus is None:
        cus = cache.cus = _custream(host_stream())
    res = _ALLOC(size, cast(MemoryPool, pool)._acu, cus)
    if res[0]:
        _driver.check("cuMemAllocFromPoolAsync", res)
    block = _new_object(_HostBlock)
    block._bin = cache.bins.get(size)
    block._cache = cache
    block._dptr = res[1]
    block._size = size
    block.ptr = int(res[1])
    block._busy = True
    return block


# -- HostBuffer.pooled(n): 1-D pinned bytes from a pool's block cache --------------------

def pooled_host_buffer(nbytes: int, pool: object) -> HostBuffer:
    """``HostBuffer.pooled(nbytes)`` for an int ``nbytes > 0`` and dtype uint8.

    ``pool``: a pinned host MemoryPool, or None for :meth:`MemoryPool.default_pinned`.
    A cache hit is :func:`host_block` inlined; anything else (a miss, a large
    block, a bad or closed pool) goes through :func:`host_block`.
    """
    if pool is None:
        pool = _pinned_default
        if pool is None or (_sim_state is not None and pool._gen is not _sim_state.MACHINE):
            pool = _make_default_pinned()
        cache = pool._hcache
    else:
        cache = pool._hcache if type(pool) is MemoryPool else None
    block = None
    if cache is not None and nbytes <= HOST_CACHE_MAX_BLOCK:  # closed: the bins are empty
        blocks = cache.bins[nbytes if not nbytes & (nbytes - 1) else 1 << nbytes.bit_length()]
        if blocks:
            try:
                block = blocks.pop()
            except IndexError:  # another thread took the last one
                pass
            else:
                cache.cached -= block._size
                block._busy = True
    if block is None:
        block = host_block(pool, nbytes)  # checks the pool; the driver on a miss
        assert block is not None
    buf = _PooledHostBuffer()
    buf._ptr = block.ptr
    buf._nbytes = nbytes
    buf._block = block
    buf._views = None
    buf._state = _OPEN
    return buf
