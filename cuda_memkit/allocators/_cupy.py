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
  ``UnownedMemory`` with a ``__del__`` that frees, instead of an
  ``UnownedMemory`` plus an owner object; its C ``__init__`` fills the
  pointer, size, device and owner (the CuPy stream) in one call;
* driver functions come from the gateway once (``_driver.function``); the
  pool's ``CUmemoryPool`` is built once, a ``CUstream`` once per stream handle;
* the rare cases (size 0, a bad size, a closed pool, a thread without a
  current context, driver errors) are handled where the driver call fails or
  before it, off the common path.

The memory object holds the CuPy stream it was allocated on, so that the
stream outlives the memory and the free is never queued on a destroyed stream
(CuPy's ``MemoryAsync`` keeps a weak reference and falls back to the current
stream instead).
"""

from __future__ import annotations

import atexit
import contextlib
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from cuda.bindings import driver as _cu

from .._core import _driver
from .._core._constants import INVALID_CONTEXT as _INVALID_CONTEXT
from .._core._errors import ClosedError, MemkitWarning
from .._core._resource import Unshareable, account, notify, watchers
from .._pools import _pool
from .._pools._cache import alloc_block, driver_pair, round_size

if TYPE_CHECKING:
    from .._pools._cache import BlockCache
    from .._pools._pool import MemoryPool

__all__ = ["cupy_allocator", "cupy_pinned_allocator", "use_with_cupy"]

_STREAM_CACHE_LIMIT = 1024
_SMALL = 1 << 20  # round_size's 512-byte range, written out on the hot path

#: Set at interpreter exit: frees are skipped from then on (a leak at exit is
#: better than a driver call during teardown).
_exiting = False


def _at_exit() -> None:
    global _exiting
    _exiting = True


atexit.register(_at_exit)

_FREE: Any = None  # cuMemFreeAsync, resolved by the first allocator made


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

_MEMORY_CLASSES: dict[type, tuple[type, type]] = {}
_warned_pools: weakref.WeakSet[Any] = weakref.WeakSet()


def _memory_classes(base: type) -> tuple[type, type]:
    """The memory classes for CuPy's ``UnownedMemory`` ``base``: (driver-freed, cached).

    Made with ``(ptr, size, cupy_stream, device_id)``: the stream is the
    ``UnownedMemory``'s owner, kept alive as long as the memory.
    """
    classes = _MEMORY_CLASSES.get(base)
    if classes is not None:
        return classes

    class Memory(Unshareable, base):  # type: ignore[misc]
        """CuPy memory from a cuda_memkit pool, freed stream-ordered when CuPy drops it.

        Memory of a given pool (``_pool``) warns if it is freed after the pool's
        close. Refuses ``copy.copy`` and pickling (:class:`Unshareable` first in the
        bases, before CuPy's own): a copy would free the memory a second time.
        """

        _share_hint = ("share the CuPy array (or its memory pointer); CuPy copies arrays "
                       "into new memory")

        # ledger account, the CUdeviceptr and CUstream, the given pool (None: a default pool)
        __slots__ = ("_a", "_d", "_pool", "_s")

        def __del__(self) -> None:
            if _exiting:
                return
            d = self._d
            res = _FREE(d, self._s)
            if res[0]:
                _free_failed(self, res)
            else:
                pool = self._pool
                if pool is not None and pool.closed:
                    _freed_after_close(pool)
            self._a.remove(d)

        def __repr__(self) -> str:
            return (f"<cuda_memkit CuPy memory 0x{self.ptr:x} size={self.size} "
                    f"device={self.device_id}>")

    class CachedMemory(Memory):
        """Memory lent by a block cache: CuPy's drop gives the block back to its free list."""

        __slots__ = ("_b", "_c", "_r")  # its free list, cache, rounded size

        def __del__(self) -> None:
            if _exiting:
                return
            d = self._d
            acct = self._a  # Account.remove written out; the pop is the claim
            n = acct.live.pop(d, None)
            if n is None:
                return
            acct.current -= n
            if watchers:
                notify(acct, d, n, False)
            pool = self._pool
            cache = self._c  # BlockCache.put written out
            r = self._r
            c = cache.cached + r
            if c <= cache.limit and pool is None:
                self._b.append(d)
                cache.cached = c
                if c > cache.peak:
                    cache.peak = c
                return
            if pool is not None and pool.closed:  # close(force=True) with arrays alive
                res = _FREE(d, self._s)
                if res[0]:
                    _free_failed(self, res)
                else:
                    _freed_after_close(pool)
                return
            if c <= cache.limit:
                cache.put(d, r, self._b, self._s)
                return
            res = _FREE(d, self._s)
            if res[0]:
                _free_failed(self, res)

    Memory.__module__ = CachedMemory.__module__ = __name__
    Memory.__qualname__, CachedMemory.__qualname__ = "CupyMemory", "CupyCachedMemory"
    classes = _MEMORY_CLASSES[base] = (Memory, CachedMemory)
    return classes


def _free_failed(mem: Any, res: Any) -> None:
    """A free the driver refused: retry once a context is current, else warn (never raise)."""
    err = res[0]
    try:
        if int(err) == _INVALID_CONTEXT and not int(_driver.call("cuCtxGetCurrent")):
            import cuda_memkit as cm

            cm.Device(mem.device_id).set_current()  # a thread with no context (GC)
            err = _FREE(mem._d, mem._s)[0]
            if not err:
                return
        _driver.check("cuMemFreeAsync", (err,))
    except Exception as exc:  # a finalizer must not raise
        warnings.warn(f"cuda_memkit: freeing CuPy memory 0x{mem.ptr:x} failed: {exc}",
                      MemkitWarning, stacklevel=2)


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


def _size_arg(size: object) -> int:
    """A size that is not a positive int: an int >= 0, or TypeError / ValueError."""
    if isinstance(size, bool) or not hasattr(size, "__index__"):
        raise TypeError(f"an allocation size must be an int, not {type(size).__name__}")
    n = int(size.__index__())
    if n < 0:
        raise ValueError(f"an allocation size must be >= 0, got {n}")
    return n


def _custream(cache: dict[int, Any], handle: int) -> Any:
    if len(cache) >= _STREAM_CACHE_LIMIT:
        cache.clear()
    cus = cache[handle] = _cu.CUstream(handle)
    return cus


def _alloc_failed(size: int, cupool: Any, cus: Any, device: int, pool: Any) -> Any:
    """The driver refused an allocation: a closed pool, or the shared retries (alloc_block)."""
    if pool is not None and pool.closed:
        raise ClosedError("the MemoryPool behind this CuPy allocator was closed; install "
                          "another pool (allocators.use_with_cupy(pool))")
    return alloc_block(size, cupool, cus, device)


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
    if not isinstance(cache, bool):
        raise TypeError(f"cache must be a bool, not {type(cache).__name__}")
    get_device = cupy.cuda.runtime.getDevice
    if pool is not None:
        _check_device_pool(pool, get_device)
    global _FREE
    alloc, _FREE = driver_pair()
    memory = cupy.cuda.memory
    unowned, pointer = memory.UnownedMemory, memory.MemoryPointer
    Memory, CachedMemory = _memory_classes(unowned)
    get_stream = cupy.cuda.get_current_stream

    def null(device: int) -> Any:
        """The pointer for a 0-byte request: null, no driver call (cuFFT asks for these)."""
        return pointer(unowned(0, 0, None, device), 0)

    import cuda_memkit as cm

    # Per device ordinal: the pools (their driver handles, accounts and caches) to use.
    ndev = cm.device_count()
    pools = [cm.MemoryPool.default(i) for i in range(ndev)] if pool is None else [pool] * ndev
    if cache:
        caches: list[BlockCache] | None = [_pool.cache_for(p) for p in pools]
    else:
        caches = None
    cupools = [_cu.CUmemoryPool(p.handle) for p in pools]
    accounts = [account("pool", p.device, p.handle) for p in pools]
    custreams: dict[int, Any] = {}
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
            size = _size_arg(size)
            if not size:
                return null(dev)
        st = get_stream(dev)
        h = st.ptr
        cus = custreams.get(h)
        if cus is None:
            cus = _custream(custreams, h)
        if caches is None:  # every allocation from the driver
            cupool = cupools[dev]
            err, d = alloc(size, cupool, cus)
            if err:
                d = _alloc_failed(size, cupool, cus, dev, given)
            m = Memory(int(d), size, st, dev)
        else:
            cache = caches[dev]
            if size > cache.max_block:  # not cached: r past any limit sends it to the driver
                d = alloc_block(size, cache.cupool, cus, dev)
                m = CachedMemory(int(d), size, st, dev)
                m._r = 1 << 62
                m._b = None
            else:
                r = (size + 511) & -512 if size <= _SMALL else round_size(size)
                d, blocks = cache.lend(r, h, cus, st)
                if d is None:
                    d = cache.miss(r, cus)
                m = CachedMemory(int(d), size, st, dev)
                m._r = r
                m._b = blocks
            m._c = cache
        m._d = d
        m._s = cus
        m._pool = given
        acct = m._a = accounts[dev]
        acct.add(d, size, h)
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
    if not isinstance(cache, bool):
        raise TypeError(f"cache must be a bool, not {type(cache).__name__}")
    MemoryPool = _memory_pool_class()
    if pool is not None:
        if not isinstance(pool, MemoryPool) or not pool.is_host:
            raise TypeError(f"pool must be a pinned host MemoryPool (Location.host()) or None, "
                            f"not {pool!r}")
        if pool.closed:
            raise ClosedError("the MemoryPool is closed; it cannot back CuPy pinned memory")
    import cuda_memkit as cm

    pinned_pointer = cupy.cuda.pinned_memory.PinnedMemoryPointer
    pooled = cm.HostBuffer.pooled
    if not cache:
        host_allocate = (pool if pool is not None else MemoryPool.default_pinned()).allocate

        def allocate_uncached(size: int) -> Any:
            buf = host_allocate(size, stream=None) if size else None
            return pinned_pointer(_UncachedPinned(buf, size), 0)

        return allocate_uncached
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
    if not isinstance(pinned, bool):
        raise TypeError("pinned must be a bool")
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
