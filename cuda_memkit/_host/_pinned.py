"""Pinned (page-locked) host memory: :class:`HostBuffer`.

A :class:`HostBuffer` is memory from ``cuMemHostAlloc``, seen from Python as a
numpy array (``.array``), with copies in and out and a device pointer for
mapped (``DEVICEMAP``) buffers. Pinned memory makes transfers faster (the copy
engine reads or writes it directly, at full PCIe bandwidth) and truly
asynchronous; see :func:`cuda_memkit.copy`.

Buffers from a pinned :class:`~cuda_memkit.MemoryPool` (:meth:`HostBuffer.pooled`,
``HostBuffer.empty(pool=...)``) come from the pinned block cache in
:mod:`cuda_memkit._host._pinned_pool`. That module builds on this one and on the
pools, so this one cannot import it at load time: it plugs in through
:data:`pool_source` when it loads (the package loads it together with this
module, and the first pooled buffer asked for without it loads it).

Lifetime: a buffer holds the owner of its memory, a :class:`PinnedAlloc` for
``cuMemHostAlloc`` memory or a pool's block; ``close()`` calls its
``release()``, and when a buffer is collected without ``close()`` the owner's
``__del__`` releases it through the same path. (Not a ``weakref.finalize``
per buffer: making and running one costs several microseconds, which pooled
buffers cannot afford; and the buffer itself needs no ``__del__``.)
"""

from __future__ import annotations

import ctypes
import enum
import math
import sys
import warnings
from typing import TYPE_CHECKING, Any, Protocol

from .._core import _driver
from .._core._buffer import MemoryKind, TypedBufferMixin
from .._core._checks import MAX_NBYTES, check_dtype, check_flags, check_shape, shape_nbytes
from .._core._context import ensure_any_context, release_call
from .._core._errors import CudaError, CudaInvalidContextError, MemkitWarning
from .._core._host_registry import mapped_device_ptr, mark_pinned_class
from .._core._inflight import pending_operands, reap_pending, release_after_copies
from .._core._resource import (
    CLOSED,
    EXITING,
    OPEN,
    Resource,
    Unshareable,
    account,
    array_protocol,
    host_array,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["HostAllocFlags", "HostBuffer"]


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


_ALLOC_BITS = 0x7


# -- the allocation path ---------------------------------------------------------------


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


#: Ledger account of ``cuMemHostAlloc`` memory (host memory: no device).
_ACCOUNT = account("pinned")


class PinnedAlloc(Unshareable):
    """The owner of one ``cuMemHostAlloc`` allocation: the memory a HostBuffer holds.

    :meth:`release` frees it (``cuMemFreeHost``, which needs no current
    context on the H100) and leaves the ledger; ``__del__`` releases it if
    nobody did, so a buffer collected without ``close()`` frees its memory
    through the same path. Blocks of a pinned pool play the same part for
    pooled buffers (``_pinned_pool.HostBlock``).
    """

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr  #: 0 once released

    def release(self) -> None:
        """Free the memory now (once)."""
        ptr = self.ptr
        if ptr:
            self.ptr = 0
            # Out of the ledger first: once freed, the address may be another
            # thread's new allocation before this call returns. Given up even
            # if the driver refuses (the caller warns).
            _ACCOUNT.remove(ptr)
            release_call(0, "cuMemFreeHost", ptr)

    # (sys.is_finalizing bound as a default: module globals may be gone at interpreter exit,
    # when a module that outlives this one drops the buffer)
    def __del__(self, _finalizing: Any = sys.is_finalizing) -> None:
        ptr = self.ptr
        if ptr and not _finalizing():
            try:
                self.release()
            except CudaError as exc:
                warn_free_failed("HostBuffer", ptr, exc)
_PINNED = MemoryKind.PINNED
_PINNED_POOLED = MemoryKind.PINNED_POOLED
_UINT8_NAME = "uint8"  # empty()'s default dtype (the same interned str)
_NO_FLAGS = HostAllocFlags.DEFAULT
_U8: Any = None  # numpy's uint8 dtype, made on first use
_new_object = object.__new__


def uint8() -> Any:
    """Numpy's ``uint8`` dtype (made once; numpy is imported on first use)."""
    global _U8
    if _U8 is None:
        import numpy as np

        _U8 = np.dtype(np.uint8)
    return _U8


# -- the pinned pool plugs in here ---------------------------------------------------------


class PooledBlock(Protocol):
    """A block of pinned pool memory lent to one buffer."""

    ptr: int

    def release(self) -> None:
        """Give the block back to its pool."""


class PoolSource(Protocol):
    """What :class:`HostBuffer` takes from the pinned pool (``cuda_memkit._host._pinned_pool``)."""

    def take(self, pool: object, nbytes: int, flags: int) -> PooledBlock | None:
        """A block of ``nbytes`` from pinned pool ``pool`` (``None``: the default pool).

        Checks ``pool`` and ``flags`` first; ``nbytes == 0`` only checks (returns None).
        """

    def bin_for(self, pool: object, nbytes: int) -> Any:
        """The bin (``cuda_memkit._pools._cache.Bin``) a block of ``nbytes`` > 0 comes from.

        ``pool`` as for :meth:`take`, checked.
        """

    def default_pool(self) -> object:
        """The default pinned pool (``MemoryPool.default_pinned()``)."""


#: Set by ``cuda_memkit._host._pinned_pool`` when it loads.
pool_source: PoolSource | None = None
#: The default pinned pool's bins (rounded size -> ``Bin``), set by ``_pinned_pool``
#: once that pool's cache exists and dropped by ``sim.reset()``: :meth:`HostBuffer.pooled`
#: takes from them without a call into the pinned pool module.
default_bins: dict[int, Any] | None = None


def _pool_source() -> PoolSource:
    if pool_source is None:
        # Reached without `cuda_memkit.HostBuffer` loading it (an internal import, such as
        # the copy kernel's descriptors): the pinned pool plugs itself in as it loads.
        import importlib

        importlib.import_module(f"{__package__}._pinned_pool")
    if pool_source is None:  # pragma: no cover - the module sets it at import
        raise RuntimeError("the pinned pool (cuda_memkit._host._pinned_pool) did not load")
    return pool_source


def warn_free_failed(what: str, ptr: int, exc: CudaError) -> None:
    """A failed free becomes a warning: ``close()`` and collection never raise driver errors."""
    warnings.warn(f"cuda_memkit: releasing {what} 0x{ptr:x} failed: {exc}", MemkitWarning,
                  stacklevel=3)


# -- HostBuffer -------------------------------------------------------------------------


class HostBuffer(TypedBufferMixin, Resource):
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
    ...     d = cm.DeviceBuffer.empty(h.nbytes)
    ...     h.copy_to(d)                         # fast: pinned source
    ...     d.close()
    """

    if not TYPE_CHECKING:
        __slots__ = ("_block", "_dptr", "_dtype", "_finalizer", "_flags", "_kind", "_nbytes",
                     "_ptr", "_shape", "_state", "_views")
    _ptr: int
    _nbytes: int
    _shape: tuple[int, ...]
    _dtype: np.dtype[Any]
    _flags: int  # HostAllocFlags bits
    _dptr: int | None
    # What gives the memory back (PinnedAlloc, a pool's HostBlock, the bin of a pooled
    # buffer's block); None: freed.
    _block: PooledBlock | None
    _kind: MemoryKind  # PINNED, or PINNED_POOLED for a pool's block

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
            dt = _U8 if _U8 is not None else uint8()
            fl = 0
        else:
            shp = check_shape(shape)
            dt = check_dtype(dtype)
            fl = check_flags(flags, HostAllocFlags, _ALLOC_BITS)
            nbytes = shape_nbytes(shp, dt)
        self = _new_object(cls)
        self._shape = shp
        self._dtype = dt
        self._nbytes = nbytes
        self._flags = fl
        self._dptr = None
        self._views = None
        self._block = None
        self._finalizer = None
        self._kind = _PINNED if pool is None else _PINNED_POOLED
        if nbytes == 0:
            if pool is not None:
                _pool_source().take(pool, 0, fl)  # same pool checks as a real allocation
            self._ptr = 0
            self._state = OPEN
            return self
        if pending_operands:  # async copies hold operands: drop those of finished ones
            reap_pending()
        if pool is not None:
            block = self._block = _pool_source().take(pool, nbytes, fl)
            assert block is not None
            self._ptr = block.ptr
            self._state = OPEN
            return self
        ptr = _alloc_pinned(nbytes, fl)
        self._ptr = ptr
        self._block = PinnedAlloc(ptr)
        _ACCOUNT.add(ptr, nbytes)
        self._state = OPEN
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
        (hundreds of microseconds per pair): use it for many small or short-lived
        buffers. Closing the buffer returns its block to the pool for the
        next one, once the asynchronous copies cuda_memkit queued on it have
        finished; synchronize other GPU work that uses it (your kernels)
        first.

        Parameters
        ----------
        shape, dtype
            As for :meth:`empty`.
        pool : MemoryPool, optional
            A pinned host pool (``MemoryPool(location=Location.host())``);
            default: :meth:`MemoryPool.default_pinned`, shared by the process,
            accessible from every device, keeping up to 64 MiB unused.
        """
        if (type(shape) is int and 0 < shape <= MAX_NBYTES and cls is HostBuffer
                and (dtype is _UINT8_NAME or (type(dtype) is str and dtype == "uint8"))):
            # 1-D bytes (the common case): a PooledHostBuffer on a block of the pool's bin,
            # the default pool's found here without a call.
            bins = default_bins
            b = (bins.get((shape + 511) & -512) if bins is not None and pool is None
                 and shape <= 1048576 else None)
            if b is None:
                b = (pool_source or _pool_source()).bin_for(pool, shape)  # checks the pool
            self = _new_object(PooledHostBuffer)
            self._ptr = b.take(shape, b.cus)
            self._nbytes = shape
            self._views = None
            self._block = b
            self._state = OPEN
            return self
        if pool is None:
            pool = (pool_source or _pool_source()).default_pool()
        return cls.empty(shape, dtype, pool=pool)

    # -- lifetime ----------------------------------------------------------------------
    def _release_deferred(self) -> None:
        block = self._block
        if block is not None:
            self._block = None
            try:
                block.release()
            except CudaError as exc:  # close() never raises driver errors: warn
                warn_free_failed("HostBuffer", self._ptr, exc)

    # -- metadata --------------------------------------------------------------------
    @property
    def ptr(self) -> int:
        """Host address of the first byte (0 for a zero-length buffer)."""
        if self._state is not OPEN:
            self._check_open()
        return self._ptr

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self._shape)

    @property
    def device(self) -> None:
        """``None``: the memory is host memory."""
        return None

    @property
    def kind(self) -> MemoryKind:
        """``MemoryKind.PINNED``, or ``MemoryKind.PINNED_POOLED`` for pool memory."""
        return self._kind

    def _host_only(self) -> bool:
        return True

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
        """A zero-copy numpy view of the buffer; it keeps the memory allocated.

        After :meth:`close` the memory is freed once the last such view (and
        every slice of it) is gone.
        """
        self._check_open()
        return host_array(self, self._ptr, self._shape, self._dtype)

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None
                  ) -> np.ndarray[Any, Any]:
        return array_protocol(self.array, dtype, copy)

    @property
    def device_ptr(self) -> int:
        """The device address of a ``DEVICEMAP`` buffer (``cuMemHostGetDevicePointer``).

        Raises
        ------
        ValueError
            If the buffer was not allocated with ``HostAllocFlags.DEVICEMAP``.
        """
        self._check_open()
        dptr = self._dptr
        if dptr is None:
            dptr = self._dptr = mapped_device_ptr(
                self._flags, self._ptr, self._nbytes, "this HostBuffer",
                "allocate it with flags=HostAllocFlags.DEVICEMAP")
        return dptr


mark_pinned_class(HostBuffer)


class PooledHostBuffer(HostBuffer):
    """What ``HostBuffer.pooled(n)`` gives for bytes: a HostBuffer on a block of a pinned pool.

    Everything a :class:`HostBuffer` does. Its ``_block`` is the bin its block
    came from (``cuda_memkit._pools._cache.Bin``); ``close()``, the last
    export's release and the buffer's collection give the block (its address,
    ``_ptr``) back to that bin, once.
    """

    __slots__ = ()
    # Never changed on these buffers: class constants instead of per-buffer stores.
    _kind = MemoryKind.PINNED_POOLED
    _flags = 0
    _finalizer = None
    _dptr = None  # no DEVICEMAP: device_ptr raises before it would store a mapped pointer

    # 1-D bytes: the shape and dtype follow from _nbytes, made when read (shape, array,
    # repr, copies), not stored per buffer: 6-8 % of the pooled pair.
    @property
    def _shape(self) -> tuple[int, ...]:  # type: ignore[override]
        return (self._nbytes,)

    @property
    def _dtype(self) -> np.dtype[Any]:  # type: ignore[override]
        dt: np.dtype[Any] = _U8 if _U8 is not None else uint8()
        return dt

    # The constructors of HostBuffer, reached through a pooled buffer's type: they make
    # what HostBuffer's make (this class's shape and dtype follow from its size alone).
    @classmethod
    def empty(cls, *args: Any, **kwargs: Any) -> HostBuffer:
        """As :meth:`HostBuffer.empty`."""
        return HostBuffer.empty(*args, **kwargs)

    @classmethod
    def zeros(cls, *args: Any, **kwargs: Any) -> HostBuffer:
        """As :meth:`HostBuffer.zeros`."""
        return HostBuffer.zeros(*args, **kwargs)

    @classmethod
    def from_array(cls, *args: Any, **kwargs: Any) -> HostBuffer:
        """As :meth:`HostBuffer.from_array`."""
        return HostBuffer.from_array(*args, **kwargs)

    @classmethod
    def pooled(cls, *args: Any, **kwargs: Any) -> HostBuffer:
        """As :meth:`HostBuffer.pooled`."""
        return HostBuffer.pooled(*args, **kwargs)

    def close(self) -> None:
        """Give the block back to the pool's cache; calling it again does nothing."""
        if self._state is CLOSED:
            return
        self._state = CLOSED
        views = self._views
        if views is not None and views() is not None:
            return  # the Exports record gives the block back once the last export is gone
        if pending_operands and release_after_copies(self):
            return  # a copy in flight still uses the block: it goes back after the copy
        self._release_deferred()

    # Everything it uses is bound or an attribute: module globals may be gone at exit.
    def _release_deferred(self, _exiting: list[bool] = EXITING) -> None:
        """Give the block back, once: at close, after the last export, or at collection.

        The collection of a buffer runs it too (``__del__``): one collected
        unclosed (CuPy's pinned adaptor drops them), or closed under a copy
        still running at interpreter exit (the copy holds it).
        """
        try:
            b: Any = self._block
        except AttributeError:  # never fully made
            return
        if b is None or _exiting[0]:
            return
        self._block = None
        try:
            b.give(self._ptr)
        except CudaError as exc:  # close() and finalizers never raise driver errors
            warn_free_failed("pinned pool block", self._ptr, exc)

    __del__ = _release_deferred

