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

import sys
import threading
from typing import Any

from .._core._checks import MAX_NBYTES
from .._core._constants import MEMHOSTALLOC_PORTABLE as _PORTABLE
from .._core._constants import STREAM_LEGACY
from .._core._device import Stream, custream, stream_destroyed
from .._core._errors import ClosedError, CudaError
from .._core._resource import Unshareable, account
from .._pools import _pool
from .._pools._cache import BlockCache, round_size
from .._pools._pool import MemoryPool
from .._pools._pool_buffer import destroy_unused, pending_pools
from . import _pinned
from ._pinned import HostBuffer

__all__ = ["HOST_CACHE_LIMIT", "HOST_CACHE_MAX_BLOCK", "HostBlock", "HostCache", "take"]

#: Largest block the cache keeps (larger requests go to the pool every time).
HOST_CACHE_MAX_BLOCK = 1 << 20
#: Most bytes cached per pool.
HOST_CACHE_LIMIT = 32 << 20

#: Ledger account of buffers lent from pinned pools (host memory: no device).
_ACCOUNT = account("pinned_pooled")
_lock = threading.Lock()
_UINT8 = "uint8"  # HostBuffer.pooled's default dtype (the same interned str)


_LEGACY = custream(STREAM_LEGACY)


class HostCache:
    """The pinned side of one host pool's block cache: its private stream and free lists.

    Holds no reference to the pool, so the pool's finalizer can close it
    before destroying the pool. The cached objects are the :class:`HostBlock`
    objects themselves (reused, not re-made); a block holds its size's list
    (``bin``) and goes back without a lookup.

    Attributes
    ----------
    blocks : BlockCache
        The pool's block cache (limits, counters, the release paths).
    bins : dict
        Rounded size -> free :class:`HostBlock` objects, the private stream's
        lists in ``blocks``.
    """

    __slots__ = ("bins", "blocks", "cus", "handle", "owns", "stream")

    def __init__(self, blocks: BlockCache, owns: bool) -> None:
        self.blocks = blocks
        self.owns = owns  # made here (closed here), or the pool's own cache=True cache
        self.stream: Stream | None = Stream()
        self.cus = self.stream._custream
        self.handle = self.stream._handle
        self.bins = blocks.bins(self.handle, self.cus)

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
        """Whether blocks go back to the cache (false once closed)."""
        return self.blocks.open and self.stream is not None

    def custream(self) -> Any:
        """The ``CUstream`` blocks are allocated and freed on."""
        s = self.stream
        cus = None if s is None else s._custream
        if cus is None or stream_destroyed(s):  # type: ignore[arg-type]  # closed with the
            return _LEGACY  # cache, or collected with it (in one cycle): the blocks are done
        return cus

    def put(self, block: HostBlock) -> None:
        """Take back a released block: cache it, or free it past the limit."""
        blocks = block.bin
        if blocks is not None and self.stream is not None:
            self.blocks.put(block, block.size, blocks, self.cus)
        else:
            self._free(block)

    def _free(self, block: HostBlock) -> None:
        self.blocks.free_block(block, self.custream())
        block.dptr = None
        if pending_pools and not self.open:  # the pool was collected before this block
            destroy_unused()

    def clear(self) -> None:
        """Give every cached block back to the driver pool."""
        self.blocks.clear()

    def close(self) -> None:
        """Empty the cache for good (the pool is about to be destroyed)."""
        if self.owns:
            self.blocks.close()
        s, self.stream = self.stream, None
        if s is not None:
            s.close()  # the close hook gives the stream's blocks back first


class HostBlock(Unshareable):
    """A pinned pool block lent to a :class:`HostBuffer`; :meth:`release` gives it back.

    While lent (``busy``) the buffer holds it; a released block waits in its
    cache for the next buffer of its size. A block collected while lent (its
    buffer was collected without ``close()``) gives its memory back through
    a new block object, never by resurrecting itself.
    """

    __slots__ = ("bin", "busy", "cache", "dptr", "host", "ptr", "size")

    bin: list[HostBlock] | None  # its size's list in the cache; None: never cached
    busy: bool
    cache: BlockCache
    host: HostCache
    dptr: Any  # the CUdeviceptr
    ptr: int  # the block's address
    size: int  # bytes, rounded (round_size) up to HOST_CACHE_MAX_BLOCK

    def __init__(self, dptr: Any, size: int, bin: list[HostBlock] | None, cache: BlockCache,
                 host: HostCache) -> None:
        self.bin = bin
        self.cache = cache
        self.host = host
        self.dptr = dptr
        self.size = size
        self.ptr = int(dptr)
        self.busy = True

    def release(self) -> None:
        """Give the block back (the buffer on it was closed or collected)."""
        if self.busy:
            self.busy = False
            _ACCOUNT.remove(self.ptr)  # first: once cached, the block may be lent again
            self.host.put(self)

    def __del__(self) -> None:
        try:
            if not self.busy or sys.is_finalizing():
                return
        except AttributeError:  # never fully made
            return
        heir = HostBlock(self.dptr, self.size, self.bin, self.cache, self.host)
        self.busy = False
        try:
            heir.release()
        except CudaError as exc:
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


# The default pinned pool's cache, its free lists and block cache:
# HostBuffer.pooled(n) without a pool finds its lists with a load and a test.
# sim.reset() drops them (forget_default) with the machine they were made on.
_default_cache: HostCache | None = None
_default_bins: dict[int, list[HostBlock]] | None = None
_default_blocks: BlockCache | None = None


def _refresh_default() -> HostCache:
    global _default_cache, _default_bins, _default_blocks
    pool = _pool.default_pinned()
    cache = _cache_of(pool, 0)
    _default_cache = cache
    _default_bins = _pinned.default_bins = cache.bins
    _default_blocks = cache.blocks
    return cache


def default_exists() -> bool:
    """Whether the default pinned pool's cache (and so its stream) has been made."""
    return _default_cache is not None and _default_cache.stream is not None


def forget_default() -> None:
    """Drop the default pool's cache (the simulated machine it lives on was replaced)."""
    global _default_cache, _default_bins, _default_blocks
    _default_cache = _default_bins = _default_blocks = _pinned.default_bins = None


def take(pool: object, nbytes: int, flags: int = 0) -> HostBlock | None:
    """Take ``nbytes`` of pinned memory from host pool ``pool`` (``None``: the default).

    ``flags`` are ``HostAllocFlags``: a pool gives ``DEFAULT`` / ``PORTABLE``
    memory. With ``nbytes == 0`` only the arguments are checked (and ``None``
    returned). Blocks up to :data:`HOST_CACHE_MAX_BLOCK` are rounded up
    (:func:`~cuda_memkit._pools._cache.round_size`) and recycled through the
    pool's cache; the driver is called only on a miss.
    """
    if pool is not None:
        cache = _cache_of(pool, flags)
    else:
        cache = _default_cache  # type: ignore[assignment]
        if cache is None:
            cache = _refresh_default()
    if nbytes <= 0:
        return None
    if not cache.open:  # before lend(), which would make the closed stream's lists again
        raise ClosedError("MemoryPool is closed; it cannot be used any more")
    bc = cache.blocks
    block: HostBlock | None
    blocks: list[HostBlock] | None
    if nbytes <= HOST_CACHE_MAX_BLOCK and nbytes <= bc.max_block:
        size = round_size(nbytes)
        block, blocks = bc.lend(size, cache.handle, cache.cus)
    else:
        size = nbytes
        block = blocks = None
    if block is None:  # a miss: the context and out-of-memory retries
        block = HostBlock(bc.miss(size, cache.cus), size, blocks, bc, cache)
    else:
        block.busy = True
    _ACCOUNT.add(block.ptr, nbytes)
    return block


# -- HostBuffer.pooled(n) ---------------------------------------------------------------


def pooled(cls: type[HostBuffer], shape: Any, dtype: Any, pool: object) -> HostBuffer:
    """``HostBuffer.pooled(shape, dtype, pool=pool)`` past its hit path: a block from ``take``.

    1-D bytes (the common case) give a :class:`PooledHostBuffer`, made here
    (the hits of the default pool are made by ``HostBuffer.pooled`` itself);
    anything else is ``cls.empty(shape, dtype, pool=...)``.
    """
    if (type(shape) is not int or not 0 < shape <= MAX_NBYTES or cls is not HostBuffer
            or not (dtype is _UINT8 or (type(dtype) is str and dtype == "uint8"))):
        return cls.empty(shape, dtype, pool=_pool.default_pinned() if pool is None else pool)
    block = take(pool, shape)  # checks the pool; a miss, another pool
    assert block is not None  # shape > 0
    return _pinned.pooled_buffer(block, shape)


class _Source:
    """What ``_pinned.pool_source`` holds: this module's entry points (no wrapper frames)."""

    take = staticmethod(take)
    pooled = staticmethod(pooled)


_pinned.pool_source = _Source()
