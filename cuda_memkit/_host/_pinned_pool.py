"""Small pinned buffers from a host memory pool, through the block cache.

:meth:`HostBuffer.pooled` and ``HostBuffer.empty(pool=...)`` take their
memory from a pinned host :class:`~cuda_memkit.MemoryPool` (by default
:meth:`MemoryPool.default_pinned`). A driver host-pool allocation + free
costs a few microseconds, several times a cached block's, so the blocks go
through the pool's
:class:`~cuda_memkit._pools._cache.BlockCache` (the same one
``MemoryPool(cache=True)`` uses, made here with the pinned limits if the pool
has none): freed blocks wait in free lists by rounded size (512 B
granularity) up to :data:`HOST_CACHE_MAX_BLOCK` per block and
:data:`HOST_CACHE_LIMIT` per pool, and are lent again without a driver call.

This module depends on :mod:`cuda_memkit._host._pinned` and :mod:`cuda_memkit._pools._pool`,
never the reverse: it plugs into ``HostBuffer`` through
``_pinned.pool_source`` when it loads, and into the pool through
``_pool.attach_cache`` (the pool empties the cache when it is trimmed and
closes it before it is destroyed). The package loads this module with those
two.

Blocks are ordered on a private, idle stream of the cache (the cache's free
lists are per stream; this stream is the only one they use here): nothing
else is queued on it, so a block allocated on it is usable by the CPU when
the call returns, and a block freed on it is immediately free. As with any
pinned pool (CuPy's, torch's), synchronize the GPU work that uses a buffer
before closing it.
"""

from __future__ import annotations

import threading

from .._core import _driver
from .._core._constants import MEMHOSTALLOC_PORTABLE as _PORTABLE
from .._core._errors import ClosedError, CudaError
from .._core._resource import EXITING, Unshareable, account
from .._core._stream import Stream
from .._pools import _pool
from .._pools._cache import Bin, BlockCache, round_size
from .._pools._pool import MemoryPool
from . import _pinned

__all__ = ["HOST_CACHE_LIMIT", "HOST_CACHE_MAX_BLOCK", "HostBin", "HostBlock", "HostCache",
           "bin_for", "take"]

#: Largest block the cache keeps (larger requests go to the pool every time).
HOST_CACHE_MAX_BLOCK = 1 << 20
#: Most bytes cached per pool.
HOST_CACHE_LIMIT = 32 << 20

#: Ledger account of buffers lent from pinned pools (host memory: no device).
_ACCOUNT = account("pinned_pooled")
_lock = threading.Lock()


class HostBin(Bin):
    """A bin of pinned blocks: its blocks are addresses (ints), as the pinned ledger's keys."""

    __slots__ = ()
    addresses = True


class HostCache:
    """The pinned side of one host pool's block cache: its private stream and its bins.

    Holds no reference to the pool, so the pool's finalizer can close it
    before destroying the pool. Every pinned block of the pool is taken from
    and given back to a :class:`HostBin` of the private stream (size 0: the
    sizes above :data:`HOST_CACHE_MAX_BLOCK`, never kept).

    Attributes
    ----------
    blocks : BlockCache
        The pool's block cache (limits, counters, the release paths).
    bins : dict
        Rounded size -> :class:`HostBin`, the private stream's bins in ``blocks``.
    """

    __slots__ = ("bins", "blocks", "cus", "handle", "max_block", "owns", "stream")

    def __init__(self, blocks: BlockCache, owns: bool) -> None:
        self.blocks = blocks
        self.owns = owns  # made here (closed here), or the pool's own cache=True cache
        self.stream: Stream | None = Stream()
        self.cus = self.stream._custream
        self.handle = self.stream._handle
        self.max_block = min(HOST_CACHE_MAX_BLOCK, blocks.max_block)
        blocks.bin(0, self.handle, self.cus, None, _ACCOUNT, HostBin)  # the stream's bins
        self.bins = blocks.streams[self.handle]

    @property
    def cached(self) -> int:
        """Bytes the pool's block cache holds."""
        return self.blocks.cached

    @property
    def block_cache(self) -> BlockCache:
        """The pool's block cache (what the pool counts and empties)."""
        return self.blocks

    @property
    def open(self) -> bool:
        """Whether blocks can be taken (false once closed)."""
        return self.blocks.open and self.stream is not None

    def bin(self, nbytes: int) -> HostBin:
        """The bin a block of ``nbytes`` (> 0; 0: the bin of sizes not kept) comes from."""
        size = round_size(nbytes) if 0 < nbytes <= self.max_block else 0
        found = self.bins.get(size)
        if found is not None:
            return found  # type: ignore[return-value]
        made = self.blocks.bin(size, self.handle, self.cus, None, _ACCOUNT, HostBin)
        return made  # type: ignore[return-value]  # a HostBin: kind=HostBin

    def clear(self) -> None:
        """Give every cached block back to the driver pool."""
        self.blocks.clear()

    def close(self) -> None:
        """Empty the cache for good (the pool is closed, or about to be destroyed)."""
        if self.owns:
            self.blocks.close()
        s, self.stream = self.stream, None
        if s is not None:
            s.close()  # the close hook gives the stream's blocks back first


class HostBlock(Unshareable):
    """The owner of a pinned pool block lent to a :class:`HostBuffer`.

    :meth:`release` (the buffer was closed) and the block's collection (the
    buffer was collected unclosed) give it back to its bin, once.
    """

    __slots__ = ("bin", "ptr")

    def __init__(self, b: HostBin, ptr: int) -> None:
        self.bin: HostBin | None = b
        self.ptr = ptr

    def release(self) -> None:
        """Give the block back (the buffer on it was closed)."""
        b = self.bin
        if b is not None:
            self.bin = None
            b.give(self.ptr)

    # Everything it uses is bound or an attribute: module globals may be gone at exit.
    def __del__(self, _exiting: list[bool] = EXITING) -> None:
        try:
            b = self.bin
        except AttributeError:  # never fully made
            return
        if b is None or _exiting[0]:
            return
        self.bin = None
        try:
            b.give(self.ptr)
        except CudaError as exc:  # a finalizer warns instead of raising
            _pinned.warn_free_failed("pinned pool block", self.ptr, exc)


def _cache_of(pool: object, flags: int) -> HostCache:
    """The cache in front of host pool ``pool``, checked and made on first use."""
    if type(pool) is not MemoryPool or not pool.is_host:
        raise TypeError(f"pool must be a pinned host MemoryPool (Location.host() or "
                        f"host_numa(n)), not {pool!r}")
    if flags & ~_PORTABLE:
        raise ValueError("memory from a pool is plain pinned memory (DEFAULT or PORTABLE); "
                         "DEVICEMAP and WRITECOMBINED need pool=None")
    if pool.closed:
        raise ClosedError("MemoryPool is closed; it cannot be used any more")
    cache: HostCache | None = _pool.find_cache(pool, HostCache)
    if cache is None:
        with _lock:
            cache = _pool.find_cache(pool, HostCache)
            if cache is None:
                cupool = _pool.allocation_handle(pool)
                if cupool is None:
                    raise TypeError(f"{pool!r} cannot give pinned blocks")
                own = pool.cache  # MemoryPool(cache=True): the same cache
                blocks = own if own is not None else BlockCache(
                    cupool, None, _ACCOUNT, HOST_CACHE_LIMIT, HOST_CACHE_MAX_BLOCK)
                cache = HostCache(blocks, own is None)
                _pool.attach_cache(pool, cache)
    return cache


# The default pinned pool's cache and its bins: HostBuffer.pooled(n) without a pool finds
# its bin with a load and a lookup. sim.reset() drops them (forget_default) with the
# machine they were made on.
_default_cache: HostCache | None = None


def _refresh_default() -> HostCache:
    global _default_cache
    pool = _pool.default_pinned()
    cache = _cache_of(pool, 0)
    _default_cache = cache
    _pinned.default_bins = cache.bins
    return cache


def forget_default() -> None:
    """Drop the default pool's cache (the simulated machine it lives on was replaced)."""
    global _default_cache
    _default_cache = _pinned.default_bins = None


_driver.reset_hooks.append(forget_default)


def _bin_of(pool: object, nbytes: int, flags: int = 0) -> HostBin | None:
    """The bin a block of ``nbytes`` comes from in host pool ``pool`` (``None``: the default).

    ``flags`` are ``HostAllocFlags``: a pool gives ``DEFAULT`` / ``PORTABLE``
    memory. With ``nbytes == 0`` only the arguments are checked (and ``None``
    returned).
    """
    if pool is not None:
        cache = _cache_of(pool, flags)
    else:
        cache = _default_cache  # type: ignore[assignment]
        if cache is None:
            cache = _refresh_default()
    if nbytes <= 0:
        return None
    if not cache.open:
        raise ClosedError("MemoryPool is closed; it cannot be used any more")
    return cache.bin(nbytes)


def take(pool: object, nbytes: int, flags: int = 0) -> HostBlock | None:
    """Take ``nbytes`` of pinned memory from host pool ``pool`` (``None``: the default).

    Arguments as for :func:`_bin_of`. Blocks up to :data:`HOST_CACHE_MAX_BLOCK`
    are rounded up (:func:`~cuda_memkit._pools._cache.round_size`) and
    recycled through the pool's cache; the driver is called only on a miss.
    """
    b = _bin_of(pool, nbytes, flags)
    if b is None:
        return None
    return HostBlock(b, b.take(nbytes, b.cus))


def bin_for(pool: object, nbytes: int) -> Bin:
    """The bin a block of ``nbytes`` > 0 of host pool ``pool`` (``None``: the default) comes from.

    What ``HostBuffer.pooled`` takes a block from when it has not found the
    default pool's bin itself; ``pool`` is checked.
    """
    b = _bin_of(pool, nbytes)
    assert b is not None  # nbytes > 0
    return b


class _Source:
    """What ``_pinned.pool_source`` holds: this module's entry points (no wrapper frames)."""

    take = staticmethod(take)
    bin_for = staticmethod(bin_for)
    default_pool = staticmethod(_pool.default_pinned)


_pinned.pool_source = _Source()
