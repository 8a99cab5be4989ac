"""Pinned (page-locked) host memory and registration of existing host memory.

* :class:`HostBuffer`: memory from ``cuMemHostAlloc``, seen from Python as a
  numpy array (``.array``), with copies in and out and a device pointer for
  mapped (``DEVICEMAP``) buffers.
* :func:`register_host`: page-lock memory you already have (a numpy array) with
  ``cuMemHostRegister`` for as long as the returned :class:`RegisteredHost`
  is open.

Both make transfers faster (the copy engine reads or writes the memory
directly, at full PCIe bandwidth) and truly asynchronous; see
:func:`cuda_memkit.copy`.
"""

from __future__ import annotations

import ctypes
import enum
import math
import operator
import sys
import threading
from typing import TYPE_CHECKING, Any

from . import _driver
from ._device import ensure_any_context, ensure_context
from ._errors import ClosedError, CudaInvalidContextError
from ._resource import (
    _CLOSED,
    _OPEN,
    Resource,
    State,
    _ArrayHolder,
    _run_release,
    host_array,
    make_finalizer,
    pending_operands,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "HostAllocFlags",
    "HostBuffer",
    "HostRegisterFlags",
    "RegisteredHost",
    "register_host",
]

#: Largest byte count a buffer may have (numpy's index type limit).
MAX_NBYTES = sys.maxsize


class HostAllocFlags(enum.IntFlag):
    """Flags of :meth:`HostBuffer.empty` (``CU_MEMHOSTALLOC_*``).

    The flags combine as sets: ``a | b`` is the union, ``a & b`` the
    intersection, ``a ^ b`` the symmetric difference, ``~a`` the complement
    (within the known flags), and ``flag in flags`` is true when every bit of
    ``flag`` is set in ``flags`` (so ``DEFAULT in flags`` is always true).

    Attributes
    ----------
    DEFAULT
        Plain pinned memory, for transfers in the allocating context's device.
    PORTABLE
        Pinned for every CUDA context, not just the current one. (With
        unified addressing, every pinned allocation is usable from every
        device already.)
    DEVICEMAP
        Mapped into the device address space; kernels can read and write it
        directly (zero-copy) through :attr:`HostBuffer.device_ptr`.
        ``MAPPED`` is an alias.
    WRITECOMBINED
        Write-combined: faster host-to-device transfers on some systems, but
        reads from the CPU are very slow (uncached). For buffers the CPU only
        writes. ``WRITE_COMBINED`` is an alias.
    """

    DEFAULT = 0
    PORTABLE = 0x1
    DEVICEMAP = 0x2
    MAPPED = 0x2
    WRITECOMBINED = 0x4
    WRITE_COMBINED = 0x4


class HostRegisterFlags(enum.IntFlag):
    """Flags of :func:`register_host` (``CU_MEMHOSTREGISTER_*``).

    They combine as sets, like :class:`HostAllocFlags`.

    Attributes
    ----------
    DEFAULT
        Page-lock the range for the current context.
    PORTABLE
        Pinned for every CUDA context.
    DEVICEMAP
        Mapped into the device address space (:attr:`RegisteredHost.device_ptr`).
        ``MAPPED`` is an alias.
    IOMEMORY
        The range is I/O memory (e.g. another PCIe device's BAR), not RAM.
    READ_ONLY
        The device only reads the range; required to register memory the CPU
        maps read-only (e.g. a read-only numpy array).
    """

    DEFAULT = 0
    PORTABLE = 0x1
    DEVICEMAP = 0x2
    MAPPED = 0x2
    IOMEMORY = 0x4
    READ_ONLY = 0x8


_ALLOC_BITS = 0x7
_REGISTER_BITS = 0xF


def _check_flags(flags: object, cls: type[enum.IntFlag], known: int) -> int:
    """Validate a flags argument of type ``cls`` (or a plain int) and return it as an int."""
    if isinstance(flags, bool) or not isinstance(flags, int):
        raise TypeError(f"flags must be {cls.__name__} or int, not {type(flags).__name__}")
    if isinstance(flags, enum.Enum) and not isinstance(flags, cls):
        raise TypeError(f"flags must be {cls.__name__}, not {type(flags).__name__}")
    value = int(flags)
    if value < 0 or value & ~known:
        raise ValueError(
            f"unknown {cls.__name__} bits 0x{value & ~known if value >= 0 else value:x}; "
            f"valid flags: {', '.join(m.name or '' for m in cls)}"
        )
    return value


def _check_shape(shape: object) -> tuple[int, ...]:
    if isinstance(shape, bool):
        raise TypeError("shape must be an int or a tuple of ints, not bool")
    try:
        dims: tuple[Any, ...] = (operator.index(shape),)  # type: ignore[arg-type]
    except TypeError:
        if not isinstance(shape, (tuple, list)):
            raise TypeError(
                f"shape must be an int or a tuple of ints, not {type(shape).__name__}"
            ) from None
        dims = tuple(shape)
    out = []
    for d in dims:
        if isinstance(d, bool):
            raise TypeError(f"shape entries must be ints, not bool: {shape!r}")
        try:
            n = operator.index(d)
        except TypeError:
            raise TypeError(
                f"shape entries must be ints, not {type(d).__name__}: {shape!r}"
            ) from None
        if n < 0:
            raise ValueError(f"negative dimension in shape {shape!r}")
        out.append(n)
    return tuple(out)


def _check_dtype(dtype: npt.DTypeLike) -> np.dtype[Any]:
    import numpy as np

    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"not a dtype: {dtype!r}") from exc
    if dt.hasobject:
        raise TypeError(
            f"dtype {dt} holds Python objects, which cannot live in pinned memory"
        )
    if dt.itemsize == 0:
        raise TypeError(f"dtype {dt} has no size; give a sized dtype such as 'S8' or 'U4'")
    return dt


def _nbytes(shape: tuple[int, ...], dtype: np.dtype[Any]) -> int:
    n = math.prod(shape) * dtype.itemsize
    if n > MAX_NBYTES:
        raise ValueError(
            f"shape {shape} of {dtype} needs {n} bytes, more than the largest possible "
            f"buffer ({MAX_NBYTES} bytes)"
        )
    return n


# -- the allocation path (a pinned MemoryPool plugs in here) ---------------------------


def _alloc_pinned(nbytes: int, flags: int) -> int:
    """``cuMemHostAlloc``: return the address of ``nbytes`` new pinned bytes.

    Tried first, then with device 0's primary context made current if the
    thread had no context (``CUDA_ERROR_INVALID_CONTEXT``, which allocates
    nothing): the common case makes one driver call.
    """
    try:
        return int(_driver.call("cuMemHostAlloc", nbytes, flags))
    except CudaInvalidContextError:
        if int(_driver.call("cuCtxGetCurrent")):
            raise
    ensure_any_context()
    return int(_driver.call("cuMemHostAlloc", nbytes, flags))


def _free_pinned(ptr: int) -> None:
    """``cuMemFreeHost``, the release function of a HostBuffer's finalizer.

    Like :func:`_alloc_pinned`: tried first, with a context made current only if needed.
    """
    try:
        _driver.call("cuMemFreeHost", ptr)
        return
    except CudaInvalidContextError:
        if int(_driver.call("cuCtxGetCurrent")):
            raise
    ensure_any_context()
    _driver.call("cuMemFreeHost", ptr)


# -- HostBuffer.empty()'s fast path --------------------------------------------------

_UINT8_NAME = "uint8"  # empty()'s default dtype (the same interned str)
_NO_FLAGS = HostAllocFlags.DEFAULT
_U8: Any = None  # numpy's uint8 dtype, made on first use
_new_object = object.__new__
_PENDING = pending_operands  # non-empty: async copies hold operands (see _memory)


def _uint8() -> Any:
    global _U8
    import numpy as np

    _U8 = np.dtype(np.uint8)
    return _U8


def _reap_pending() -> None:
    from ._memory import reap_pending

    reap_pending()


# -- HostBuffer.pooled()'s fast path ---------------------------------------------------

#: Largest block a pinned pool's cache keeps (see ``_pool.host_block``), and
#: most bytes cached per pool.
HOST_CACHE_MAX_BLOCK = 1 << 20
HOST_CACHE_LIMIT = 32 << 20

# The block cache of MemoryPool.default_pinned() (a ``_pool._HostCache``), and
# the simulator's state module when that pool is simulated: published by
# ``_pool`` when it makes the pool, so that ``HostBuffer.pooled(n)`` takes a
# cached block in one Python frame.
_pooled_cache: Any = None
_pooled_sim: Any = None


# -- pool wiring: HostBuffer.pooled / empty(pool=...) ---------------------------------

_POOLS: Any = None  # cuda_memkit._pool, loaded on first use (feature modules load lazily)


def _pools() -> Any:
    global _POOLS
    if _POOLS is None:
        from . import _pool

        _POOLS = _pool
    return _POOLS


# -- HostBuffer -------------------------------------------------------------------------


class HostBuffer(Resource):
    """Page-locked (pinned) host memory holding an array of ``shape`` and ``dtype``.

    Build with :meth:`empty`, :meth:`zeros` or :meth:`from_array`. The memory
    is freed by :meth:`close`, at the end of a ``with`` block, or when the
    buffer is garbage-collected; numpy views from :attr:`array` keep it alive
    (``close()`` then frees it when the last view goes). A zero-length buffer
    allocates nothing and has ``ptr == 0``.

    Examples
    --------
    >>> import numpy as np, cuda_memkit as cm
    >>> with cm.HostBuffer.empty((1024, 1024), np.float32) as h:
    ...     h.array[:] = 1.0                     # fill in place (zero-copy)
    ...     d = cm.DeviceBuffer.alloc(h.nbytes)
    ...     cm.copy(d, h)                        # fast: pinned source
    ...     d.close()
    """

    # Slots, not a __dict__: the state the hot paths read (Resource's _state,
    # _finalizer, _views included: a class default makes a load generic).
    if not TYPE_CHECKING:
        __slots__ = ("_block", "_dptr", "_dtype", "_finalizer", "_flags", "_nbytes", "_ptr",
                     "_shape", "_state", "_views")
    _ptr: int
    _nbytes: int
    _shape: tuple[int, ...]
    _dtype: np.dtype[Any]
    _flags: int  # HostAllocFlags bits
    _dptr: int | None
    _block: object  # pool wiring: the pinned pool block (see _pool.host_block)

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError(
            "create a HostBuffer with HostBuffer.empty(), .zeros() or .from_array()"
        )

    @classmethod
    def empty(
        cls,
        shape: int | tuple[int, ...],
        dtype: npt.DTypeLike = "uint8",
        *,
        flags: HostAllocFlags | int = HostAllocFlags.DEFAULT,
        pool: object | None = None,
    ) -> HostBuffer:
        """Allocate an uninitialised pinned buffer (``cuMemHostAlloc``).

        Parameters
        ----------
        shape : int or tuple of int
            Array shape; ``0`` (or any zero dimension) allocates nothing.
        dtype : dtype-like, default uint8
            Element type; object dtypes are refused.
        flags : HostAllocFlags, default DEFAULT
            Allocation flags.
        pool : MemoryPool, optional
            A pinned host :class:`MemoryPool` (``Location.host()``, e.g.
            :meth:`MemoryPool.default_pinned`) to take the memory from instead
            of ``cuMemHostAlloc``. Blocks up to ``HOST_CACHE_MAX_BLOCK`` are
            rounded up to a power of two and recycled through the pool's
            cache, so a hit makes no driver call; closing the buffer returns
            the block to the pool. Pool memory is plain pinned memory: only
            ``DEFAULT`` or ``PORTABLE`` flags. Synchronize the GPU work that
            uses the buffer before closing it.

        Returns
        -------
        HostBuffer

        Raises
        ------
        TypeError
            For a non-integer shape, an object or zero-size dtype, flags of
            another type, or a ``pool`` that is not a pinned host pool.
        ValueError
            For negative dimensions, unknown flag bits, flags other than
            ``DEFAULT``/``PORTABLE`` with a ``pool``, or a size that
            overflows; raised before any driver call.
        CudaOutOfMemoryError
            If the driver cannot pin that much memory.
        """
        if (type(shape) is int and 0 < shape <= MAX_NBYTES and dtype is _UINT8_NAME
                and flags is _NO_FLAGS and pool is None):  # the default: 1-D bytes
            nbytes = shape
            shp: tuple[int, ...] = (shape,)
            dt = _U8 if _U8 is not None else _uint8()
            fl = 0
        else:
            shp = _check_shape(shape)
            dt = _check_dtype(dtype)
            fl = _check_flags(flags, HostAllocFlags, _ALLOC_BITS)
            nbytes = _nbytes(shp, dt)
        # The class that frees in __del__ (no weakref.finalize: see _LiveHostBuffer)
        self = _new_object(_LiveHostBuffer if nbytes and pool is None and cls is HostBuffer
                           else cls)
        self._shape = shp
        self._dtype = dt
        self._nbytes = nbytes
        self._flags = fl
        self._dptr = None
        self._views = None
        if nbytes == 0:
            if pool is not None:
                _pools().host_block(pool, 0, fl)  # same pool checks as a real allocation
            self._ptr = 0
            self._open(None)
            return self
        if _PENDING:  # async copies hold operands: drop those of finished ones
            _reap_pending()
        if pool is not None:  # pool wiring: a recycled block; see cuda_memkit._pool.host_block
            block = _pools().host_block(pool, nbytes, fl)
            assert block is not None
            self._ptr = block.ptr
            self._block = block  # collected with the buffer: block.__del__ returns the memory
            self._open(block.release)  # close() calls it
            return self
        ptr = _alloc_pinned(nbytes, fl)
        self._ptr = ptr
        if type(self) is _LiveHostBuffer:
            self._finalizer = None
        else:  # a subclass of HostBuffer
            self._finalizer = make_finalizer(self, ("HostBuffer", ptr), _free_pinned, ptr)
        self._state = _OPEN
        return self

    @classmethod
    def zeros(
        cls,
        shape: int | tuple[int, ...],
        dtype: npt.DTypeLike = "uint8",
        *,
        flags: HostAllocFlags | int = HostAllocFlags.DEFAULT,
        pool: object | None = None,
    ) -> HostBuffer:
        """Allocate a pinned buffer filled with zeros; arguments as :meth:`empty`."""
        self = cls.empty(shape, dtype, flags=flags, pool=pool)
        if self._nbytes:
            ctypes.memset(self._ptr, 0, self._nbytes)
        return self

    @classmethod
    def from_array(
        cls, array: npt.ArrayLike, *, flags: HostAllocFlags | int = HostAllocFlags.DEFAULT,
        pool: object | None = None,
    ) -> HostBuffer:
        """Allocate a pinned buffer with the shape and dtype of ``array`` and copy it in.

        Parameters
        ----------
        array : array-like
            The data (anything ``numpy.asarray`` accepts; object dtypes are refused).
        flags : HostAllocFlags, default DEFAULT
            Allocation flags.
        pool : MemoryPool, optional
            As for :meth:`empty`.
        """
        import numpy as np

        src = np.asarray(array)
        self = cls.empty(src.shape, src.dtype, flags=flags, pool=pool)
        if self._nbytes:
            try:
                np.copyto(self.array, src, casting="no")
            except BaseException:
                self.close()
                raise
        return self

    @classmethod
    def pooled(
        cls,
        shape: int | tuple[int, ...],
        dtype: npt.DTypeLike = "uint8",
        *,
        pool: object | None = None,
    ) -> HostBuffer:
        """Take an uninitialised pinned buffer from a pinned memory pool.

        Costs about a microsecond, where :meth:`empty` pays ``cuMemHostAlloc``
        (about 0.7 ms per 4 KiB pair on the H100): use it for many small or short-lived
        buffers. Closing the buffer returns its block to the pool for the
        next one; synchronize the GPU work that uses it first.

        Parameters
        ----------
        shape, dtype
            As for :meth:`empty`.
        pool : MemoryPool, optional
            A pinned host pool (``MemoryPool(location=Location.host())``);
            default: :meth:`MemoryPool.default_pinned`, shared by the process,
            accessible from every device, keeping up to 64 MiB unused.
        """
        cache = _pooled_cache
        if (cache is not None and pool is None and dtype is _UINT8_NAME and type(shape) is int
                and 0 < shape <= HOST_CACHE_MAX_BLOCK and cls is HostBuffer
                and (_pooled_sim is None or cache.gen is _pooled_sim.MACHINE)):
            # A cached block of the default pool: _pool.host_block's hit, inlined.
            blocks = cache.bins[shape if not shape & (shape - 1) else 1 << shape.bit_length()]
            if blocks:
                try:
                    block = blocks.pop()
                except IndexError:  # another thread took the last one
                    pass
                else:
                    cache.cached -= block._size
                    block._busy = True
                    buf = _PooledHostBuffer()
                    buf._ptr = block.ptr
                    buf._nbytes = shape
                    buf._block = block
                    buf._views = None
                    buf._state = _OPEN
                    return buf
        pools = _POOLS or _pools()
        if type(shape) is int and dtype == "uint8" and type(dtype) is str and shape > 0 \
                and cls is HostBuffer:  # 1-D bytes: a miss, or a given pool
            buf2: HostBuffer = pools.pooled_host_buffer(shape, pool)
            return buf2
        if pool is None:
            pool = pools.MemoryPool.default_pinned()
        return cls.empty(shape, dtype, pool=pool)

    # -- metadata --------------------------------------------------------------------
    @property
    def ptr(self) -> int:
        """Host address of the first byte (0 for a zero-length buffer)."""
        if self._state is not State.OPEN:
            self._check_open()
        return self._ptr

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return self._nbytes

    @property
    def shape(self) -> tuple[int, ...]:
        """Array shape."""
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """Element type."""
        return self._dtype

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self._shape)

    @property
    def flags(self) -> HostAllocFlags:
        """The flags the buffer was allocated with."""
        return HostAllocFlags(self._flags)

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d HostBuffer")
        return self._shape[0]

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"ptr=0x{self._ptr:x}"
        flags = f" flags={HostAllocFlags(self._flags)!r}" if self._flags else ""
        return f"<HostBuffer shape={self._shape} dtype={self._dtype} {state}{flags}>"

    # -- views -----------------------------------------------------------------------
    @property
    def array(self) -> np.ndarray[Any, Any]:
        """A zero-copy numpy view of the buffer; it keeps the buffer alive."""
        self._check_open()
        return host_array(self, self._ptr, self._shape, self._dtype)

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None
                  ) -> np.ndarray[Any, Any]:
        arr = self.array
        if dtype is not None and arr.dtype != dtype:
            if copy is False:
                raise ValueError("converting the buffer to another dtype needs a copy")
            out: np.ndarray[Any, Any] = arr.astype(dtype)
            return out
        if copy:
            dup: np.ndarray[Any, Any] = arr.copy()
            return dup
        return arr

    @property
    def device_ptr(self) -> int:
        """The device address of a ``DEVICEMAP`` buffer (``cuMemHostGetDevicePointer``).

        Raises
        ------
        ValueError
            If the buffer was not allocated with ``HostAllocFlags.DEVICEMAP``.
        """
        return _device_ptr(self, "this HostBuffer",
                           "allocate it with flags=HostAllocFlags.DEVICEMAP")

    # -- copies ----------------------------------------------------------------------
    def copy_from(self, src: Any) -> None:
        """Copy ``src`` into this buffer (synchronously).

        Parameters
        ----------
        src : array-like, HostBuffer or device memory
            Host data must have this buffer's shape and dtype exactly; device
            memory (anything :func:`cuda_memkit.copy` accepts) must have its
            size in bytes.

        Raises
        ------
        ValueError
            On a shape, dtype or size mismatch (before anything is copied).
        ClosedError
            If either buffer is closed.
        """
        self._check_open()
        host = _host_view(src)
        if host is None:
            from ._memory import copy

            copy(self, src)
            return
        _check_same(host, self, "source", "this buffer")
        if self._nbytes:
            import numpy as np

            np.copyto(self.array, host, casting="no")

    def copy_to(self, dst: Any) -> None:
        """Copy this buffer into ``dst`` (synchronously).

        Parameters
        ----------
        dst : numpy array, HostBuffer or device memory
            A writable host array must have this buffer's shape and dtype
            exactly; device memory must have its size in bytes.

        Raises
        ------
        ValueError
            On a shape, dtype or size mismatch, or a read-only destination.
        ClosedError
            If either buffer is closed.
        """
        self._check_open()
        host = _host_view(dst)
        if host is None:
            from ._memory import copy

            copy(dst, self)
            return
        if not host.flags.writeable:
            raise ValueError("the destination array is read-only")
        _check_same(self, host, "this buffer", "destination")
        if self._nbytes:
            import numpy as np

            np.copyto(host, self.array, casting="no")

    def to_numpy(self) -> np.ndarray[Any, Any]:
        """Return a copy of the contents as an ordinary numpy array."""
        out: np.ndarray[Any, Any] = self.array.copy()
        return out


class _LiveHostBuffer(HostBuffer):
    """A :class:`HostBuffer` that owns ``cuMemHostAlloc`` memory: what ``empty()`` makes.

    It frees the memory in ``__del__`` instead of through a ``weakref.finalize``,
    whose making and running cost several µs of Python, and, measured on the
    H100, slowed the driver's next ``cuMemHostAlloc`` by several percent more.
    ``close()`` frees the memory and turns the object into a plain
    :class:`HostBuffer` (``__class__`` assignment, same slots), so a closed
    buffer runs no ``__del__``. With numpy views alive, ``close()`` leaves
    the free to ``__del__``, which runs once the views (holding the buffer)
    are gone.
    """

    __slots__ = ()

    def _check_open(self) -> None:
        if self._state is _CLOSED:
            raise ClosedError("HostBuffer is closed; it cannot be used any more")

    def close(self) -> None:
        """Free the memory now (or, with numpy views alive, once they are gone)."""
        if self._state is _CLOSED:
            return
        self._state = _CLOSED
        if self._views:
            return  # __del__ frees once the views (which hold this buffer) are gone
        self.__class__ = HostBuffer  # type: ignore[assignment]  # nothing left for __del__
        ptr = self._ptr
        _run_release(("HostBuffer", ptr), _free_pinned, (ptr,))

    def __del__(self) -> None:
        try:
            ptr = self._ptr
        except AttributeError:  # cuMemHostAlloc failed: nothing to free
            return
        _run_release(("HostBuffer", ptr), _free_pinned, (ptr,))


class _PooledHostBuffer(HostBuffer):
    """What ``HostBuffer.pooled(n)`` gives for 1-D bytes: a HostBuffer on a cached block.

    Everything a :class:`HostBuffer` does (``array``, ``ptr``, copies,
    ``with``, ``ClosedError``), trimmed for a pair that must cost about as
    much as CuPy's pinned pool: slots for the state read on the hot path (a
    ``Resource`` class default would make those loads generic), a plain type
    call to make it, and a ``close()`` that puts the block back in its cache
    itself. A buffer collected without ``close()`` drops its block, whose
    ``__del__`` gives the memory back; with numpy views alive, ``close()``
    leaves that to them in the same way.
    """

    __slots__ = ()  # HostBuffer's slots
    if TYPE_CHECKING:
        def __init__(self) -> None: ...
    else:
        __init__ = object.__init__  # made by pooled_host_buffer() (HostBuffer() refuses)
    _flags = 0  # HostAllocFlags.DEFAULT
    _dptr = None
    if not TYPE_CHECKING:  # shape and dtype follow from _nbytes: nothing to store per buffer
        @property
        def _shape(self) -> tuple[int, ...]:
            return (self._nbytes,)

        @property
        def _dtype(self) -> Any:
            return _U8 if _U8 is not None else _uint8()

    _block: Any  # _pool._HostBlock, or None once closed
    _views: Any

    def _check_open(self) -> None:
        if self._state is _CLOSED:
            raise ClosedError("HostBuffer is closed; it cannot be used any more")

    def close(self) -> None:
        """Give the block back to the pool's cache; calling it again does nothing."""
        if self._state is _CLOSED:
            return
        self._state = _CLOSED
        if self._views:
            return  # the block goes back once the views and the buffer are gone
        block = self._block
        assert block is not None
        self._block = None
        block._busy = False
        cache = block._cache
        size = block._size
        blocks = block._bin  # _HostCache.put() inlined
        if blocks is not None and cache.open and cache.cached + size <= HOST_CACHE_LIMIT:
            blocks.append(block)
            cache.cached += size
        else:
            cache.put(block)


def _device_ptr(buf: HostBuffer | RegisteredHost, what: str, how: str) -> int:
    """``device_ptr`` of a mapped buffer or registration, looked up once and kept.

    ``DEVICEMAP`` is the same bit (0x2) in :class:`HostAllocFlags` and
    :class:`HostRegisterFlags`; an empty range maps to 0 without a driver call.
    """
    buf._check_open()
    if not buf._flags & HostAllocFlags.DEVICEMAP:
        raise ValueError(
            f"{what} is not mapped into the device address space; {how} to get a device pointer"
        )
    if buf._dptr is None:
        if buf._nbytes == 0:
            buf._dptr = 0
        else:
            ensure_context()
            buf._dptr = int(_driver.call("cuMemHostGetDevicePointer", buf._ptr, 0))
    return buf._dptr


def _address(arr: np.ndarray[Any, Any]) -> int:
    return int(arr.__array_interface__["data"][0])


def _host_view(obj: Any) -> np.ndarray[Any, Any] | None:
    """A numpy view of host data ``obj``, or ``None`` if it is device memory."""
    import numpy as np

    if isinstance(obj, np.ndarray):
        arr = obj
    elif isinstance(obj, HostBuffer):
        arr = obj.array
    elif isinstance(obj, RegisteredHost):
        arr = obj.array
    elif hasattr(obj, "__cuda_array_interface__") or (
        hasattr(obj, "ptr") and hasattr(obj, "nbytes") and not hasattr(obj, "__array__")
    ):
        return None
    else:
        arr = np.asarray(obj)
    if arr.dtype.hasobject:
        raise TypeError("object arrays cannot be copied to or from pinned memory")
    return arr


def _check_same(a: Any, b: Any, a_name: str, b_name: str) -> None:
    if a.dtype != b.dtype:
        raise ValueError(f"dtype mismatch: {a_name} is {a.dtype}, {b_name} is {b.dtype}")
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(
            f"shape mismatch: {a_name} has shape {tuple(a.shape)}, {b_name} {tuple(b.shape)}"
        )


# -- registration ----------------------------------------------------------------------

# Live registrations made by register_host: base address -> (end, flags).
_registered: dict[int, tuple[int, int]] = {}
_reg_lock = threading.Lock()


def registered_flags(ptr: int, nbytes: int) -> int | None:
    """Flags of the live :func:`register_host` range holding ``[ptr, ptr+nbytes)``, or None."""
    if not _registered:
        return None
    end = ptr + nbytes
    for start, (stop, flags) in list(_registered.items()):
        if start <= ptr and end <= stop:
            return flags
    return None


def _unregister(ptr: int) -> None:
    """``cuMemHostUnregister`` (the release function of a RegisteredHost's finalizer)."""
    with _reg_lock:
        _registered.pop(ptr, None)
    ensure_context()
    _driver.call("cuMemHostUnregister", ptr)


class RegisteredHost(Resource):
    """Host memory page-locked by :func:`register_host` until :meth:`close`.

    It keeps the registered array alive. Closing it (or leaving its ``with``
    block, or dropping it) unregisters the memory; the array stays valid,
    ordinary pageable memory.
    """

    _array: np.ndarray[Any, Any]
    _ptr: int
    _nbytes: int
    _flags: HostRegisterFlags
    _dptr: int | None

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("use cuda_memkit.register_host(array) to register host memory")

    @property
    def array(self) -> np.ndarray[Any, Any]:
        """The registered array (for ``READ_ONLY`` registrations, a read-only view)."""
        self._check_open()
        return self._array

    @property
    def ptr(self) -> int:
        """Host address of the registered range."""
        self._check_open()
        return self._ptr

    @property
    def nbytes(self) -> int:
        """Size of the registered range in bytes."""
        return self._nbytes

    @property
    def flags(self) -> HostRegisterFlags:
        """The registration flags."""
        return self._flags

    @property
    def read_only(self) -> bool:
        """Whether the device may only read the range (``READ_ONLY``)."""
        return bool(self._flags & HostRegisterFlags.READ_ONLY)

    @property
    def device_ptr(self) -> int:
        """The device address of a ``DEVICEMAP`` registration (``cuMemHostGetDevicePointer``).

        Raises
        ------
        ValueError
            If the range was not registered with ``HostRegisterFlags.DEVICEMAP``.
        """
        return _device_ptr(self, "this registration",
                           "register with flags=HostRegisterFlags.DEVICEMAP")

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"ptr=0x{self._ptr:x}"
        return f"<RegisteredHost {state} nbytes={self._nbytes} flags={self._flags!r}>"


def register_host(
    array: Any, *, flags: HostRegisterFlags | int = HostRegisterFlags.DEFAULT
) -> RegisteredHost:
    """Page-lock an existing host array (``cuMemHostRegister``) while the result is open.

    Registration makes copies from and to the array as fast, and as truly
    asynchronous, as from a :class:`HostBuffer`. It costs milliseconds per
    range (less than allocating pinned memory when the array is already
    populated), so register long-lived arrays, not one per transfer.

    Parameters
    ----------
    array : numpy array or buffer
        C- or Fortran-contiguous memory (anything with the buffer protocol).
        A read-only array needs ``flags=HostRegisterFlags.READ_ONLY``.
    flags : HostRegisterFlags, default DEFAULT
        Registration flags.

    Returns
    -------
    RegisteredHost
        A context manager; leaving it (or ``close()``, or garbage collection)
        unregisters the memory. A zero-size array registers nothing.

    Raises
    ------
    TypeError
        If ``array`` is not host memory, or holds Python objects.
    ValueError
        If it is not contiguous, read-only without ``READ_ONLY``, or the flags
        have unknown bits (all before any driver call).
    CudaHostMemoryAlreadyRegisteredError
        If (part of) the range is already registered.
    CudaInvalidValueError
        If the range is memory the driver allocated (e.g. pinned by another
        library); views of cuda_memkit buffers are refused with ``ValueError``
        before the driver is called.
    CudaNotSupportedError
        If ``READ_ONLY`` registration is not supported by the device.

    Examples
    --------
    >>> a = np.ones(1 << 20, np.float32)
    >>> with cm.register_host(a):
    ...     cm.copy(dev, a, stream=s)           # async: `a` is pinned now
    ...     s.synchronize()
    """
    import numpy as np

    fl = _check_flags(flags, HostRegisterFlags, _REGISTER_BITS)
    if isinstance(array, np.ndarray):
        arr = array
    else:
        if hasattr(array, "__cuda_array_interface__") or isinstance(array, HostBuffer):
            raise TypeError(
                f"register_host() takes pageable host memory, not {type(array).__name__}"
            )
        try:
            arr = np.asarray(memoryview(array))
        except TypeError:
            raise TypeError(
                "register_host() needs a numpy array or an object with the buffer protocol, "
                f"not {type(array).__name__}"
            ) from None
    if arr.dtype.hasobject:
        raise TypeError("an array of Python objects cannot be registered")
    base: Any = arr.base
    while isinstance(base, np.ndarray):
        base = base.base
    if type(base) is _ArrayHolder and isinstance(base.owner, Resource):
        raise ValueError(
            f"this array is a view of a {type(base.owner).__name__}, memory the driver "
            "already pins or manages; it needs no registration"
        )
    if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
        raise ValueError(
            "register_host() needs contiguous memory; this array is a strided view. "
            "Register its base array, or np.ascontiguousarray(a)"
        )
    read_only = bool(fl & HostRegisterFlags.READ_ONLY)
    if not arr.flags.writeable and not read_only:
        raise ValueError(
            "the array is read-only, but a registration lets the device write to it; "
            "pass flags=HostRegisterFlags.READ_ONLY"
        )
    if read_only and arr.flags.writeable:
        view = arr.view()
        view.flags.writeable = False
    else:
        view = arr
    self = RegisteredHost.__new__(RegisteredHost)
    self._array = view
    self._nbytes = int(arr.nbytes)
    self._flags = HostRegisterFlags(fl)
    self._dptr = None
    if self._nbytes == 0:
        self._ptr = _address(arr)
        self._open(None)
        return self
    ptr = _address(arr)
    ensure_context()
    _driver.call("cuMemHostRegister", ptr, self._nbytes, fl)
    self._ptr = ptr
    with _reg_lock:
        _registered[ptr] = (ptr + self._nbytes, fl)
    self._open(make_finalizer(self, f"registration 0x{ptr:x}", _unregister, ptr))
    return self
