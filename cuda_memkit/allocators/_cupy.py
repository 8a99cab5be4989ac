"""CuPy allocators over cuda_memkit pools.

``cupy.cuda.set_allocator(f)`` makes CuPy call ``f(nbytes)`` for every device
allocation and keep the returned ``cupy.cuda.MemoryPointer`` while the memory
is in use. :func:`cupy_allocator` returns such an ``f``: the memory comes
from a :class:`~cuda_memkit.MemoryPool` (``cuMemAllocFromPoolAsync``), ordered
on CuPy's current stream, and goes back (``cuMemFreeAsync``, on that same
stream) when CuPy drops the pointer.

Caching
-------
By default (``cache=True``) the allocator lends blocks from a
:class:`~cuda_memkit._pools._cache.BlockCache` in front of the pool (for the
default pools, the process's cache that ``MemoryPool.default(d).trim()``
empties): a block CuPy drops goes back to the free list of its stream and
size, and the next allocation of that rounded size on that stream takes it
without a driver call, as CuPy's own ``MemoryPool`` does. ``cache=False``
calls the driver for every allocation and free.

Hot path
--------
CuPy's own ``malloc_async`` does this in Cython; a Python allocator pays for
every object and call, so the allocator is a closure over everything it
needs, resolved once at install time:

* the memory object *is* the CuPy memory: a slotted subclass of CuPy's
  ``UnownedMemory`` whose ``__del__`` gives the block back to the bin it was
  taken from (:class:`~cuda_memkit._pools._cache.Bin`, the release path of
  every pool kind), instead of an ``UnownedMemory`` plus an owner object; its
  C ``__init__`` fills the pointer, size, device and owner (the CuPy stream)
  in one call;
* the bins, pools and caches are found once; a stream's ``CUstream`` is made
  once per stream handle;
* the rare cases (size 0, a bad size, a closed pool, a thread without a
  current context, driver errors) are handled where the driver call fails or
  before it, off the common path.

The memory object holds the CuPy stream it was allocated on, so that the
stream outlives the memory and the free is never queued on a destroyed stream
(CuPy's ``MemoryAsync`` keeps a weak reference and falls back to the current
stream instead).
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from cuda.bindings import driver as _cu

from .._core import _capture
from .._core._checks import check_bool, check_nonneg
from .._core._errors import ClosedError, CudaError, MemkitWarning
from .._core._resource import EXITING, Unshareable
from .._core._stream import StreamRef
from .._host._pinned import HostBuffer
from .._pools import _pool
from .._pools._cache import bin_for, round_size

if TYPE_CHECKING:
    from .._pools._cache import Bin, BlockCache
    from .._pools._pool import MemoryPool

__all__ = ["cupy_allocator", "cupy_pinned_allocator", "use_with_cupy"]

_STREAM_CACHE_LIMIT = 1024

def _import_cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise ModuleNotFoundError(
            "cuda_memkit.allocators needs CuPy for this (pip install cupy-cuda13x)") from exc
    return cupy


def _memory_pool_class() -> type[MemoryPool]:
    import cuda_memkit as cm

    return cm.MemoryPool


# -- the memory objects CuPy holds ------------------------------------------------------

_MEMORY_CLASSES: dict[type, type] = {}
_warned_pools: weakref.WeakSet[Any] = weakref.WeakSet()


def _memory_class(base: type) -> type:
    """The memory class for CuPy's ``UnownedMemory`` ``base``.

    Made with ``(ptr, size, cupy_stream, device_id)``: the stream is the
    ``UnownedMemory``'s owner, kept alive as long as the memory.
    """
    cls = _MEMORY_CLASSES.get(base)
    if cls is not None:
        return cls

    class Memory(Unshareable, base):  # type: ignore[misc]
        """CuPy memory from a cuda_memkit pool, given back to its bin when CuPy drops it.

        Memory of a given pool (``_pool``) warns if it is freed after the pool's
        close. Refuses ``copy.copy`` and pickling (:class:`Unshareable` first in the
        bases, before CuPy's own): a copy would free the memory a second time.
        """

        _share_hint = ("share the CuPy array (or its memory pointer); CuPy copies arrays "
                       "into new memory")

        # its bin and block, the pool given (None: a default pool), the stream's StreamRef
        __slots__ = ("_bin", "_d", "_pool", "_sref")

        # Everything it uses is bound or an attribute: module globals may be gone at exit.
        def __del__(self, _exiting: list[bool] = EXITING) -> None:
            if _exiting[0]:
                return
            b = self._bin
            try:
                b.give(self._d, self._sref)
            except CudaError as exc:  # a finalizer must not raise
                b.account.remove(self._d)
                warnings.warn(f"cuda_memkit: freeing CuPy memory 0x{self.ptr:x} failed: {exc}",
                              MemkitWarning, stacklevel=2)
                return
            pool = self._pool
            if pool is not None and pool.closed:  # close(force=True) with arrays alive
                _freed_after_close(pool)

        def __repr__(self) -> str:
            return (f"<cuda_memkit CuPy memory 0x{self.ptr:x} size={self.size} "
                    f"device={self.device_id}>")

    Memory.__module__ = __name__
    Memory.__qualname__ = "CupyMemory"
    _MEMORY_CLASSES[base] = Memory
    return Memory


def _freed_after_close(pool: Any) -> None:
    if pool in _warned_pools:
        return
    _warned_pools.add(pool)
    warnings.warn("cuda_memkit: CuPy freed memory of a MemoryPool that was closed while CuPy "
                  "arrays from it were alive (close(force=True)); the driver kept that memory "
                  "until now. Drop the arrays before closing the pool.", MemkitWarning,
                  stacklevel=2)


# -- the device allocator -------------------------------------------------------------------

def _check_device_pool(pool: object, current_device: Callable[[], int]) -> None:
    """Install-time checks: TypeError / ValueError before anything is changed."""
    MemoryPool = _memory_pool_class()
    if not isinstance(pool, MemoryPool):
        raise TypeError(f"pool must be a cuda_memkit.MemoryPool or None, not "
                        f"{type(pool).__name__}")
    if pool.closed:
        raise ClosedError("the MemoryPool is closed; it cannot back CuPy allocations")
    if pool.imported:
        raise ValueError("an imported MemoryPool cannot allocate; give CuPy a pool of this "
                         "process")
    if pool.is_host:
        raise TypeError("a pinned host MemoryPool cannot back CuPy device allocations; use "
                        "cupy_pinned_allocator(pool) for pinned memory")
    if pool.device is not None:
        current = current_device()
        if pool.device != current:
            raise ValueError(f"the pool holds memory of device {pool.device}, but CuPy's "
                             f"current device is {current}; install it under "
                             f"cupy.cuda.Device({pool.device})")


def _stream_ref(refs: dict[int, StreamRef], handle: int) -> StreamRef:
    """The ``StreamRef`` of CuPy stream ``handle`` (its ``CUstream``), made once per handle."""
    if len(refs) >= _STREAM_CACHE_LIMIT:
        refs.clear()
    ref = refs[handle] = StreamRef(_cu.CUstream(handle), None)
    return ref


def _watch_cupy_captures(cupy: Any) -> None:
    """Tell cuda_memkit when CuPy's ``Stream.begin_capture`` / ``end_capture`` run.

    The allocation paths ask the driver whether their stream captures only
    while a capture may be under way (``_capture.active``); CuPy's capture
    entry points are wrapped once per process to say so. Where a CuPy stream
    class cannot take the wrapper, :func:`cuda_memkit.watch_captures` covers it.
    """
    for name in ("Stream", "ExternalStream"):
        cls = getattr(cupy.cuda, name, None)
        if cls is not None:
            _capture.wrap_entry_points(cls, "begin_capture", "end_capture")


def cupy_allocator(pool: MemoryPool | None = None, *, cache: bool = True
                   ) -> Callable[[int], Any]:
    """A CuPy device allocator (for ``cupy.cuda.set_allocator``) over a memkit pool.

    Parameters
    ----------
    pool : MemoryPool, optional
        A device pool (or a managed pool) to allocate from. Default: the
        default pool (:meth:`MemoryPool.default`) of CuPy's current device at
        each allocation, so one allocator serves every device. A given device
        pool must belong to CuPy's current device, at install time and at each
        allocation.
    cache : bool, default True
        Lend blocks from a block cache in front of the pool (see "Caching"
        on the pools page): a block CuPy drops waits for the next
        allocation of its rounded size on its stream. ``False``: every
        allocation and free calls the driver.

    Returns
    -------
    callable
        ``f(nbytes) -> cupy.cuda.MemoryPointer``. The memory is allocated on
        CuPy's current stream and freed on that stream when CuPy drops the
        pointer; ``f(0)`` returns a null pointer without calling the driver.

    Raises
    ------
    TypeError
        For something that is not a :class:`MemoryPool`, or a pinned host pool.
    ValueError
        For a closed or imported pool, or a device pool of another device than
        CuPy's current one (:class:`ClosedError` is a ``ValueError``).
    ModuleNotFoundError
        If CuPy is not installed.

    Notes
    -----
    While the allocator is installed, ``pool.stats()`` counts CuPy's live
    allocations. Closing a given pool makes the allocator refuse new
    allocations (``ClosedError``); memory CuPy still holds stays valid (the
    driver keeps it) and its later free warns once with a
    :class:`MemkitWarning`.

    Examples
    --------
    >>> import cupy
    >>> from cuda_memkit import allocators
    >>> previous = cupy.cuda.get_allocator()
    >>> pool = cm.MemoryPool(0, release_threshold=1 << 30)
    >>> cupy.cuda.set_allocator(allocators.cupy_allocator(pool))
    >>> x = cupy.arange(1 << 20)            # memory from the pool
    >>> del x
    >>> cupy.cuda.set_allocator(previous)
    >>> pool.close()
    """
    cupy = _import_cupy()
    check_bool(cache, "cache")
    get_device = cupy.cuda.runtime.getDevice
    if pool is not None:
        _check_device_pool(pool, get_device)
    _watch_cupy_captures(cupy)
    memory = cupy.cuda.memory
    unowned, pointer = memory.UnownedMemory, memory.MemoryPointer
    Memory = _memory_class(unowned)
    get_stream = cupy.cuda.get_current_stream

    def null(device: int) -> Any:
        """The pointer for a 0-byte request: null, no driver call (cuFFT asks for these)."""
        return pointer(unowned(0, 0, None, device), 0)

    import cuda_memkit as cm

    # Per device ordinal: the pools and, uncached, their bins (every stream), or their caches.
    ndev = cm.device_count()
    pools = [cm.MemoryPool.default(i) for i in range(ndev)] if pool is None else [pool] * ndev
    caches: list[BlockCache] | None = [_pool.cache_for(p) for p in pools] if cache else None
    direct: list[Bin] = [_pool.pool_bin(p) for p in pools]
    refs: dict[int, StreamRef] = {}
    given = pool
    pool_device = -1 if given is None or given.device is None else given.device  # managed: any

    def allocate(size: int) -> Any:
        dev = get_device()
        if given is not None:
            if dev != pool_device and pool_device >= 0:
                raise ValueError(f"CuPy's current device is {dev}, but this allocator's pool "
                                 f"holds memory of device {pool_device}")
            if given.closed:  # before the driver: a destroyed pool must never reach it
                raise ClosedError("the MemoryPool behind this CuPy allocator was closed; "
                                  "install another pool (allocators.use_with_cupy(pool))")
        if type(size) is not int or size <= 0:
            size = check_nonneg(size, "an allocation size")
            if not size:
                return null(dev)
        st = get_stream(dev)
        h = st.ptr
        sref = refs.get(h)
        if sref is None:
            sref = _stream_ref(refs, h)
        cus = sref._custream
        if caches is None or _capture.active:  # uncached, or a capture may be under way
            b = bin_for(None if caches is None else caches[dev], direct[dev], h, cus, st, size)
        else:  # the stream's bin of this size (bin_for rounds and remembers it on a miss)
            lane = caches[dev].streams.get(h)
            found = lane.get(size) if lane is not None else None
            b = found if found is not None else bin_for(caches[dev], direct[dev], h, cus, st,
                                                        size)
        # CuPy's memory is the block reserved, a multiple of 512 bytes, as its own pools
        # give (CuPy's code relies on it): the bin's size, or the request rounded. The
        # ledger counts the bytes asked for, as for every allocation (architecture.md).
        reserved = b.size or round_size(size)
        d = b.take(size, cus, reserved)
        m = Memory(int(d), reserved, st, dev)
        m._bin = b
        m._d = d
        m._pool = given
        m._sref = sref
        return pointer(m, 0)

    return allocate


# -- the pinned allocator -------------------------------------------------------------------

class _UncachedPinned:
    """CuPy pinned memory straight from a pinned pool (``cache=False``): freed when dropped."""

    __slots__ = ("buf", "ptr", "size")

    def __init__(self, buf: Any, size: int) -> None:
        self.buf = buf  # a host PoolBuffer: its collection frees it on the legacy stream
        self.ptr = buf.ptr if size else 0
        self.size = size


def cupy_pinned_allocator(pool: MemoryPool | None = None, *, cache: bool = True
                          ) -> Callable[[int], Any]:
    """A CuPy pinned-memory allocator (``cupy.cuda.set_pinned_memory_allocator``).

    Parameters
    ----------
    pool : MemoryPool, optional
        A pinned host pool (``MemoryPool(location=Location.host())``). Default:
        :meth:`MemoryPool.default_pinned`, the pool behind
        :meth:`HostBuffer.pooled`.
    cache : bool, default True
        Blocks through the pool's block cache (:meth:`HostBuffer.pooled`).
        ``False``: every allocation is ``MemoryPool.allocate`` on the
        legacy stream, and every free ``cuMemFreeAsync``.

    Returns
    -------
    callable
        ``f(nbytes) -> cupy.cuda.PinnedMemoryPointer`` whose memory is a
        :meth:`HostBuffer.pooled` buffer; its block goes back to the pool's
        cache when CuPy drops the pointer (CuPy keeps pinned memory alive until
        the asynchronous copies that use it are done).

    Raises
    ------
    TypeError
        For something that is not a pinned host :class:`MemoryPool`.
    ValueError
        For a closed pool.
    """
    cupy = _import_cupy()
    check_bool(cache, "cache")
    MemoryPool = _memory_pool_class()
    if pool is not None:
        if not isinstance(pool, MemoryPool) or not pool.is_host:
            raise TypeError(f"pool must be a pinned host MemoryPool (Location.host()) or None, "
                            f"not {pool!r}")
        if pool.closed:
            raise ClosedError("the MemoryPool is closed; it cannot back CuPy pinned memory")
    pinned_pointer = cupy.cuda.pinned_memory.PinnedMemoryPointer
    if not cache:
        host_allocate = (pool if pool is not None else MemoryPool.default_pinned()).allocate

        def allocate_uncached(size: int) -> Any:
            buf = host_allocate(size, stream=None) if size else None
            return pinned_pointer(_UncachedPinned(buf, size), 0)

        return allocate_uncached
    pooled = HostBuffer.pooled
    if pool is None:
        MemoryPool.default_pinned()  # made now, not inside the first allocation

        def allocate(size: int) -> Any:
            return pinned_pointer(pooled(size), 0)

        return allocate

    given = pool

    def allocate_from_pool(size: int) -> Any:
        return pinned_pointer(pooled(size, pool=given), 0)

    return allocate_from_pool


# -- install and restore --------------------------------------------------------------------

#: Pinned allocators installed by use_with_cupy, innermost last: CuPy has no getter
#: for its pinned allocator, so this is what a block restores.
_pinned_installed: list[Callable[[int], Any]] = []


@contextlib.contextmanager
def use_with_cupy(pool: MemoryPool | None = None, *, pinned: bool = False,
                  pinned_pool: MemoryPool | None = None, cache: bool = True
                  ) -> Iterator[Callable[[int], Any]]:
    """Route CuPy's allocations through memkit pools inside a ``with`` block.

    Parameters
    ----------
    pool : MemoryPool, optional
        Device (or managed) pool for CuPy's device memory (see
        :func:`cupy_allocator`); default: each device's default pool.
    pinned : bool, default False
        Also route CuPy's pinned host memory (see :func:`cupy_pinned_allocator`).
    pinned_pool : MemoryPool, optional
        The pinned host pool for that (implies ``pinned=True``).
    cache : bool, default True
        Allocate through block caches (see :func:`cupy_allocator`); ``False``
        calls the driver for every allocation and free.

    Yields
    ------
    callable
        The device allocator installed.

    Raises
    ------
    TypeError, ValueError
        For a bad pool, before CuPy's allocators are touched.

    Notes
    -----
    CuPy's allocator setting is global (all threads). On exit the previous
    device allocator is restored. CuPy has no getter for its pinned
    allocator: the pinned allocator restored is the one an enclosing
    ``use_with_cupy`` installed, else CuPy's default pinned memory pool.
    """
    cupy = _import_cupy()
    check_bool(pinned, "pinned")
    device_alloc = cupy_allocator(pool, cache=cache)
    pinned_alloc = (cupy_pinned_allocator(pinned_pool, cache=cache)
                    if pinned or pinned_pool is not None else None)
    previous = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(device_alloc)
    try:
        if pinned_alloc is None:
            yield device_alloc
            return
        restore = (_pinned_installed[-1] if _pinned_installed
                   else cupy.get_default_pinned_memory_pool().malloc)
        cupy.cuda.set_pinned_memory_allocator(pinned_alloc)
        _pinned_installed.append(pinned_alloc)
        try:
            yield device_alloc
        finally:
            _pinned_installed.remove(pinned_alloc)
            cupy.cuda.set_pinned_memory_allocator(restore)
    finally:
        cupy.cuda.set_allocator(previous)
