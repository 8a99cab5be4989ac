"""Stream-ordered memory pools: :class:`MemoryPool` and :class:`PoolBuffer`.

A :class:`MemoryPool` wraps a driver pool (``cuMemPoolCreate``) of device
memory, pinned host memory (``Location.host()`` / ``Location.host_numa(n)``)
or managed memory. ``pool.allocate(n, stream=s)`` is ``cuMemAllocFromPoolAsync``
and returns a :class:`PoolBuffer`, whose ``free()`` is ``cuMemFreeAsync``.
Sharing pools and allocations with other processes is in
:mod:`cuda_memkit._pools._pool_ipc`; small pinned buffers from a host pool
(``HostBuffer.pooled``) in :mod:`cuda_memkit._host._pinned_pool`.

Hot path
--------
A raw ``cuMemAllocFromPoolAsync`` + ``cuMemFreeAsync`` pair costs about a
microsecond, so ``allocate()`` + ``free()`` together may add only a few
hundred nanoseconds, the buffer object, its finalizer and the ledger entry
included (the measurements behind each point are in ``docs/decisions.md``):

* One way back: ``allocate()`` takes the block from a bin
  (:class:`~cuda_memkit._pools._cache.Bin`: the cache's bin of the stream and
  rounded size, or the pool's bin without a cache), the buffer keeps that bin,
  and ``free()``, ``close()`` and ``__del__`` give the block back to it; the bin
  calls the ledger.
* The buffer is a slotted object that frees in ``__del__`` when it is
  collected unfreed, since a ``weakref.finalize`` per buffer costs as much as
  the driver calls.
* No class swap: a freed buffer's ``__del__`` still runs at its collection
  (and returns at once), since swapping the class after ``free()`` bought
  less than the 5 % a hot-path trick must buy.
* Typed handles, converted once: the bindings turn a plain ``int`` stream,
  pool or pointer into a ``CUstream`` / ``CUmemoryPool`` / ``CUdeviceptr``
  first, at a cost on every call. The pool keeps its ``CUmemoryPool``; a
  :class:`~cuda_memkit.Stream` carries its ``CUstream`` (``None`` once
  closed, which is also the closed test); other stream-likes get a
  :class:`StreamRef` carrying the same attribute. The buffer hands the
  ``CUdeviceptr`` the driver returned back to ``cuMemFreeAsync`` (and uses it
  as its ledger key); ``.ptr`` makes the ``int`` only when asked.
* Driver functions resolved once (``_driver.function``), results checked by
  hand and errors raised through ``_driver.check``; the rare cases (no
  current context on this thread, a closed allocation stream) are handled off
  the hot path.
* No per-buffer bookkeeping in the pool: ``close()`` asks the driver
  (``USED_MEM_CURRENT``, which drops at the free on the H100) whether memory
  is still in use.

A buffer keeps its pool and its allocation stream object alive, and is never
freed on a stream that was closed: ``close()`` and the finalizer then
synchronize and free on the legacy default stream, ``free()`` refuses.
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from collections.abc import Iterable
from typing import Any

from cuda.bindings import driver as _cu

from .._core import _capture, _driver
from .._core._access import Access, access_descs, check_peers
from .._core._checks import check_bool, check_index
from .._core._context import ensure_context
from .._core._device import Device, check_ordinal, device_count
from .._core._errors import CudaNotSupportedError, MemkitWarning
from .._core._inflight import releases_waiting, wait_pending
from .._core._location import Location, LocationLike, LocationType, to_location
from .._core._resource import (
    CLOSED,
    LEDGER,
    Account,
    Resource,
    account,
    forget_account,
    make_finalizer,
)
from .._core._stream import Stream, StreamLike, StreamRef, buffer_stream
from . import _cache, _pool_ipc
from ._cache import (
    DEFAULT_CACHE_LIMIT,
    Bin,
    BlockCache,
    bin_for,
    check_cache_limit,
    destroy_unused,
    destroy_when_unused,
    pending_pools,
)
from ._pool_attrs import PoolAttributes, PoolStats, check_threshold
from ._pool_buffer import PoolBufferBase, new_buffer

__all__ = ["MemoryPool", "PoolBuffer", "PoolStats"]

_A = _cu.CUmemPool_attribute
#: Granularity in which the H100 maps memory into a pool.
POOL_CHUNK = 32 << 20
#: Release threshold of :meth:`MemoryPool.default_pinned`.
DEFAULT_PINNED_RELEASE_THRESHOLD = 64 << 20


# -- driver functions ------------------------------------------------------


def resolve() -> tuple[Any, Any]:
    """Resolve (once) and return ``(cuMemAllocFromPoolAsync, cuMemFreeAsync)``."""
    return _cache.driver_pair()


#: A copy of ``_capture.active`` (``_capture.mirror``): while zero, ``allocate`` finds
#: its bin without asking whether its stream captures.
CAPTURING = 0
_capture.mirror(globals(), "CAPTURING")


# -- buffers ---------------------------------------------------------------------------


class PoolBuffer(PoolBufferBase):
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

    __slots__ = ()
    _pool: MemoryPool

    def __init__(self) -> None:
        raise TypeError("PoolBuffer objects are made by MemoryPool.allocate()")

    @property
    def pool(self) -> MemoryPool:
        """The pool the memory came from."""
        return self._pool


def _not_supported(what: str) -> CudaNotSupportedError:
    return CudaNotSupportedError(801, "cuMemPoolCreate", "CUDA_ERROR_NOT_SUPPORTED",
                                 f"{what} are not supported by this device or driver")


def _destroy_pool(cupool: Any, caches: list[Any], device: int | None) -> None:
    """Release function of an owned pool: empty the caches in front of it, then destroy it.

    The destroy waits while buffers from the pool are alive (the pool was
    collected in one garbage cycle with them): see ``destroy_when_unused``.
    """
    for cache in caches:
        cache.close()
    destroy_when_unused(functools.partial(_busy, cupool, device, bool(caches)),
                        functools.partial(_destroy_now, cupool, device))


def _busy(cupool: Any, device: int | None, cached: bool) -> bool:
    """Whether buffers of an owned pool are alive: its account's, and blocks a cache lent.

    The ledger, not ``USED_MEM_CURRENT``, for the pool's own buffers: the driver
    does not count a ``cuMemFree`` of pool memory there, so raw
    misuse would keep the pool forever. Blocks a pinned cache lent are not in
    the pool's account: for a pool with a cache the driver's count decides.
    """
    acct = LEDGER.get(("pool", device, int(cupool)))
    if acct is not None and acct.live:
        return True
    return cached and bool(int(_driver.call("cuMemPoolGetAttribute", cupool,
                                             _A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT)))


def _destroy_now(cupool: Any, device: int | None) -> None:
    try:
        if device is not None:
            _revoke_peers(cupool, device)
    finally:
        _driver.call("cuMemPoolDestroy", cupool)
    # The driver may give a later pool the same handle: its account and its
    # export record must start afresh.
    forget_account("pool", device, int(cupool))
    _pool_ipc.forget(int(cupool))


def _revoke_peers(cupool: Any, device: int) -> None:
    """Take back other devices' access to a device pool that is about to be destroyed.

    The driver may give a later pool the same handle, and a pool with a
    recycled handle was seen to start with the old one's peers (cuda.core
    revokes for the same reason; see docs/decisions.md). One query per other
    device, nothing on a machine of one device.
    """
    for peer in range(device_count()):
        if peer == device:
            continue
        loc = Location.device(peer)
        if int(_driver.call("cuMemPoolGetAccess", cupool, loc.to_cu())):
            _driver.call("cuMemPoolSetAccess", cupool, access_descs([loc], Access.NONE), 1)


class MemoryPool(PoolAttributes, Resource):
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
    cache : bool, default False
        Put a block cache in front of the pool: a freed buffer's block waits
        in a per-stream free list and is lent again to the next allocation of
        its rounded size on the same stream, without a driver call (see
        "Caching" on the pools page). :meth:`trim` and :meth:`empty_cache`
        give cached blocks back.
    cache_limit : int, optional
        Most bytes the cache holds (default ``DEFAULT_CACHE_LIMIT``, 1 GiB);
        a free beyond it goes to the driver. Only with ``cache=True``.
    peers : iterable of int or Device, optional
        Other devices given READWRITE access to the pool's memory at creation
        (:meth:`set_access`), so that their kernels and copies reach it: a
        copy between this pool's memory and another device's runs on one of
        the two devices, which needs this grant (see "Several GPUs" in the
        docs). Only for device pools.

    Raises
    ------
    TypeError, ValueError
        For bad arguments, before any driver call.
    CudaNotSupportedError
        If the device or driver has no pools of this kind.
    CudaPeerAccessUnsupportedError
        If a device of ``peers`` cannot access the pool's device's memory
        (the pool is not made).

    Examples
    --------
    >>> with cm.Stream() as stream, cm.MemoryPool(0, release_threshold=1 << 30) as pool:
    ...     buf = pool.allocate(1 << 20, stream=stream)
    ...     buf.free()
    ...     stream.synchronize()
    """

    _share_hint = ("share the MemoryPool object itself; another process imports it from "
                   "export() with MemoryPool.import_(), and its buffers from "
                   "PoolBuffer.export() with import_pointer()")

    _cache: BlockCache | None  # the cache allocate() lends from (cache=True)
    _acct: Account  # the ledger account of its buffers
    _bin: Bin  # the bin of allocations without a cache (every stream)

    def __init__(
        self,
        device: Device | int = 0,
        *,
        location: LocationLike | None = None,
        managed: bool = False,
        max_size: int = 0,
        ipc: bool = False,
        release_threshold: int | None = None,
        cache: bool = False,
        cache_limit: int | None = None,
        peers: Iterable[Device | int] = (),
    ) -> None:
        ordinal = check_ordinal(device)
        loc = None if location is None else to_location(location)
        check_bool(managed, "managed")
        check_bool(ipc, "ipc")
        check_bool(cache, "cache")
        limit = DEFAULT_CACHE_LIMIT if cache_limit is None else check_cache_limit(cache_limit)
        if cache_limit is not None and not cache:
            raise ValueError("cache_limit needs cache=True")
        max_size = check_index(max_size, "max_size")
        if not 0 <= max_size < 1 << 64:
            raise ValueError(f"max_size must be in [0, 2**64), got {max_size}")
        threshold = None if release_threshold is None else check_threshold(release_threshold)
        if loc is not None and loc.type is LocationType.HOST_NUMA_CURRENT:
            raise ValueError("a pool needs a fixed location; use Location.host_numa(n)")
        if managed:
            if ipc or max_size:
                raise ValueError("managed pools take neither ipc nor max_size")
        elif loc is None:
            loc = Location.device(ordinal)
        elif loc.type is LocationType.HOST and ipc:
            raise ValueError("Location.host() pools cannot be shared (ipc); use host_numa(n)")
        device_pool = loc is not None and loc.type is LocationType.DEVICE and not managed
        pool_device = loc.id if device_pool and loc is not None else None
        grant = check_peers(peers, pool_device)
        if grant and pool_device is None:
            raise ValueError("peers= is for device pools; give devices access to a host "
                             "pool's memory with set_access()")

        ensure_context(None)
        if pending_pools:  # pools collected with their buffers, and since then unused
            destroy_unused()
        self._check_support(loc, managed)
        props = _cu.CUmemPoolProps()
        T = _cu.CUmemAllocationType
        props.allocType = (T.CU_MEM_ALLOCATION_TYPE_MANAGED if managed
                           else T.CU_MEM_ALLOCATION_TYPE_PINNED)
        props.handleTypes = _cu.CUmemAllocationHandleType(1 if ipc else 0)
        if loc is not None:
            props.location = loc.to_cu()
        props.maxSize = max_size
        resolve()
        cupool = _driver.call("cuMemPoolCreate", props)
        caches: list[Any] = []
        fin = make_finalizer(self, f"memory pool 0x{int(cupool):x}", _destroy_pool, cupool,
                             caches, loc.id if loc is not None and not managed
                             and loc.type is LocationType.DEVICE else None)
        self._setup(cupool, loc, managed, ipc, owned=True, imported=False)
        self._caches = caches
        if cache:
            own = self._cache = BlockCache(cupool, self._device, self._acct, limit)
            caches.append(own)
        self._open(fin)
        self._max_size = -(-max_size // POOL_CHUNK) * POOL_CHUNK
        if threshold is not None or grant:
            try:
                if threshold is not None:
                    self.release_threshold = threshold
                if grant:  # checked above, once
                    self._grant([Location.device(d) for d in grant], Access.READWRITE)
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
        _capture.watch_frameworks()  # torch's or cuda.core's captures, when they are loaded
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
        self._import_device: int | None = None  # an imported pool's device (device)
        self._max_size = 0
        self._imports: weakref.WeakSet[PoolBuffer] = weakref.WeakSet()
        self._caches: list[Any] = []  # block caches in front of the pool (attach_cache)
        self._cache = None
        self._acct = account("pool", self._device, self._handle)
        # Where allocate() takes a block without a cache, and every buffer of the pool
        # without one gives its block back (import_pointer's mappings too).
        self._bin = Bin(self._acct, self._acu, self._device)

    # -- other constructors --------------------------------------------------------
    @classmethod
    def default(cls, device: Device | int = 0, *, cache: bool = False) -> MemoryPool:
        """The device's default pool (``cuDeviceGetDefaultMemPool``), not owned.

        Closing the returned object never destroys the pool. Its
        :meth:`trim` and :meth:`empty_cache` also empty the process's cache in
        front of it (:func:`default_cache`, used by the CuPy and numba
        adaptors).

        Parameters
        ----------
        device : int or Device, default 0
            The device whose default pool to wrap.
        cache : bool, default False
            Allocate through the process's block cache in front of that
            pool (the one the CuPy adaptor and the numba plugin use).
        """
        ordinal = check_ordinal(device)
        check_bool(cache, "cache")
        ensure_context(None)
        cupool = _driver.call("cuDeviceGetDefaultMemPool", _driver.call("cuDeviceGet", ordinal))
        resolve()
        self = cls.__new__(cls)
        self._setup(cupool, Location.device(ordinal), False, False, owned=False, imported=False)
        self._caches = _default_caches(ordinal, cupool)
        self._open(None)
        if cache:
            self._cache = cache_for(self)
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
        return default_pinned()

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
        fd = _pool_ipc.check_fd(fd)
        ensure_context(None)
        resolve()
        cupool = _pool_ipc.import_pool(fd)
        self = cls.__new__(cls)
        fin = make_finalizer(self, f"imported memory pool 0x{int(cupool):x}", _destroy_now,
                             cupool, None)
        self._setup(cupool, None, False, True, owned=True, imported=True)
        self._open(fin)
        try:
            self._import_device = _pool_ipc.imported_device(cupool, device_count())
        except BaseException:
            self.close()
            raise
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
        """Ordinal of the device holding the memory; ``None`` for host and managed pools.

        An imported pool's device is the one that may access its memory when
        it was imported (its own device, as this process numbers devices);
        ``None`` if the driver named no single one.
        """
        return self._device if not self._imported else self._import_device

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
            nbytes = check_index(nbytes, "nbytes")
            if nbytes <= 0:
                raise ValueError(f"nbytes must be > 0, got {nbytes}")
        cupool = self._acu
        if cupool is None:
            self._check_open()
            raise ValueError("an imported pool cannot allocate; use import_pointer()")
        if type(stream) is Stream:
            cus = stream._custream
            if cus is None:  # closed
                stream._check_open()
            sref: Stream | StreamRef = stream
        else:
            sref = buffer_stream(stream)
            cus = sref._custream
        cache = self._cache
        if CAPTURING:  # a capture may be under way: bin_for asks the driver
            b = bin_for(cache, self._bin, -1, cus, sref, nbytes)
        elif cache is None:
            b = self._bin
        else:  # the stream's bin of this size (bin_for rounds and remembers it on a miss)
            h = stream._handle if sref is stream else int(cus)  # type: ignore[union-attr]
            lane = cache.streams.get(h)
            found = lane.get(nbytes) if lane is not None else None
            b = found if found is not None else bin_for(cache, self._bin, h, cus, sref, nbytes)
        buf: PoolBuffer = new_buffer(PoolBuffer, b.take(nbytes, cus), nbytes, sref, self, b)
        return buf

    # -- the cache ---------------------------------------------------------------------
    @property
    def cache(self) -> BlockCache | None:
        """The block cache ``allocate()`` lends from (``cache=True``), else ``None``."""
        return self._cache

    def _block_caches(self) -> list[BlockCache]:
        """The block caches in front of the pool, each once (a pinned cache shares the pool's)."""
        unique = {id(c.block_cache): c.block_cache for c in list(self._caches)}
        return list(unique.values())

    @property
    def cached_bytes(self) -> int:
        """Bytes freed by their users and held by the caches in front of the pool."""
        return sum(c.cached for c in self._block_caches())

    def empty_cache(self) -> int:
        """Give every block the caches in front of the pool hold back to it (``cuMemFreeAsync``).

        Each block is freed on the stream it was freed on by its user. The
        memory stays in the driver pool (see :meth:`trim` to give it back to
        the system).

        Returns
        -------
        int
            The bytes released.
        """
        _capture.retry_deferred()  # graph memory freed before its (foreign) graph ran
        return sum(cache.clear() for cache in self._block_caches())

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
        return _pool_ipc.export_pool(self._cu)

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
        raw = _pool_ipc.check_pointer_data(data)
        size = None if nbytes is None else check_index(nbytes, "nbytes")
        if size is not None and size <= 0:
            raise ValueError(f"nbytes must be > 0, got {size}")
        sref = buffer_stream(stream)
        self._check_open()
        dptr = _pool_ipc.import_pointer(self._cu, raw)
        buf: PoolBuffer = new_buffer(PoolBuffer, dptr, 0, sref, self, self._bin)
        self._imports.add(buf)
        if size is None:
            try:
                size = _pool_ipc.pointer_size(dptr)
            except BaseException:
                buf.close()
                raise
        buf._nbytes = size
        self._acct.add(dptr, size)
        return buf

    # -- lifetime ----------------------------------------------------------------------
    def _in_use(self) -> str:
        """Describe live allocations ("" if none); ``USED_MEM_CURRENT`` drops at the free."""
        if self._imported:
            n = sum(1 for b in self._imports if not b.closed)
            return f"{n} imported buffer(s) alive" if n else ""
        for cache in self._caches:
            cache.clear()
        used = self._get(_A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
        return f"{used} bytes in live allocations" if used else ""

    def close(self, force: bool = False) -> None:
        """Destroy the pool (``cuMemPoolDestroy``); calling it again does nothing.

        Parameters
        ----------
        force : bool, default False
            Close even with allocations alive: the pool takes no new
            allocations at once, its caches are emptied and closed (memory
            given back from then on goes to the driver), and it is destroyed
            once this object and the buffers holding it are gone, so their
            ``free()`` stays valid.
            (Destroying a pool with allocations outstanding and freeing them
            afterwards crashed later pool calls on the H100.)

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
        live = self._in_use() if self._owned else ""
        if live and releases_waiting():  # buffers closed under a copy in flight go after it
            wait_pending()
            live = self._in_use()
        if live and not force:
            raise BufferError(f"cannot close a memory pool with {live}; free them first "
                              "or pass force=True")
        self._acu = None
        if live:  # destroyed by its finalizer, once the buffers holding it are gone
            for cache in list(self._caches):  # what is given back from now on goes to the
                cache.close()  # driver, not into caches nobody can lend from any more
            self._state = CLOSED
            return
        super().close()

    def _close_on_error(self) -> None:
        """Left by an exception: closed as ``close(force=True)`` would, warning of live buffers."""
        if not self.closed and self._owned and self is not _pinned_default:
            live = self._in_use()
            if live:
                warnings.warn(f"cuda_memkit: a MemoryPool was left by an exception with {live}: "
                              "closed as close(force=True) would (destroyed once they are "
                              "freed)", MemkitWarning, stacklevel=4)
        self.close(force=True)


# -- the caches in front of the devices' default pools (the adaptors') -----------------------

_default_lock = threading.Lock()
#: device -> (the caches list of the default pool, the pool handle)
_defaults: dict[int, tuple[list[Any], int]] = {}


def _default_caches(ordinal: int, cupool: Any) -> list[Any]:
    """The caches list shared by every :meth:`MemoryPool.default` object of a device."""
    entry = _defaults.get(ordinal)
    if entry is None or entry[1] != int(cupool):
        with _default_lock:
            entry = _defaults.get(ordinal)
            if entry is None or entry[1] != int(cupool):
                entry = _defaults[ordinal] = ([], int(cupool))
    return entry[0]


def cache_for(pool: MemoryPool) -> BlockCache:
    """The block cache in front of ``pool``: its own (``cache=True``), or one made and attached.

    For :meth:`MemoryPool.default` pools this is the process's cache of the
    device's default pool, shared by the CuPy adaptor, the numba plugin and
    ``MemoryPool.default(device, cache=True)``; ``trim()`` / ``empty_cache()``
    on any wrapper of the pool empty it. Its limit is
    :data:`DEFAULT_CACHE_LIMIT`.
    """
    cache = pool._cache
    if cache is not None:
        return cache
    caches = pool._caches
    for c in caches:
        if type(c) is BlockCache:
            return c
    with _default_lock:
        for c in caches:
            if type(c) is BlockCache:
                return c
        if pool._acu is None:
            pool._check_open()
            raise ValueError("an imported pool cannot allocate")
        cache = BlockCache(pool._acu, pool._device, pool._acct, DEFAULT_CACHE_LIMIT)
        caches.append(cache)
        return cache


def default_cache(device: int = 0) -> BlockCache:
    """The process's block cache in front of device ``device``'s default pool (made on use)."""
    return cache_for(MemoryPool.default(device))


# -- caches in front of a pool (the pinned block cache of cuda_memkit._host._pinned_pool) --------


def attach_cache(pool: MemoryPool, cache: Any) -> None:
    """Put ``cache`` (with ``clear()``, ``close()`` and ``block_cache``) in front of ``pool``.

    The pool clears it in :meth:`~MemoryPool.trim` and before it decides
    whether memory is still in use (``close()``), and closes it before the
    pool is destroyed, so memory the cache holds never keeps the pool alive.
    """
    pool._caches.append(cache)


def find_cache(pool: MemoryPool, kind: type) -> Any:
    """The cache of type ``kind`` in front of ``pool``, or ``None``."""
    for cache in pool._caches:
        if type(cache) is kind:
            return cache
    return None


def pool_bin(pool: MemoryPool) -> Bin:
    """The bin ``pool`` lends from without a cache (every stream; see ``Bin``)."""
    return pool._bin


def allocation_handle(pool: MemoryPool) -> Any:
    """The ``CUmemoryPool`` that ``pool`` allocates from (``None`` once closed or imported)."""
    return pool._acu


# -- the process's pinned pool ------------------------------------------------------------

_pinned_lock = threading.Lock()
_pinned_default: MemoryPool | None = None


def _forget_defaults() -> None:
    """Forget the default pools' caches and the pinned pool: their machine was replaced."""
    global _pinned_default
    with _default_lock:
        _defaults.clear()
    with _pinned_lock:
        _pinned_default = None


_driver.reset_hooks.append(_forget_defaults)


def default_pinned() -> MemoryPool:
    """:meth:`MemoryPool.default_pinned`: made on first use (again after a simulator reset)."""
    global _pinned_default
    pool = _pinned_default
    if pool is not None:
        return pool
    with _pinned_lock:
        pool = _pinned_default
        if pool is not None:
            return pool
        # Made on first use, which may come during a capture (HostBuffer.pooled on a
        # capturing stream): relaxed, since the driver refuses cuMemPoolCreate during a
        # global capture and invalidates it.
        with _capture.relaxed():
            pool = MemoryPool(location=Location.host(),
                              release_threshold=DEFAULT_PINNED_RELEASE_THRESHOLD)
            try:
                pool.set_access(range(device_count()), Access.READWRITE)
            except BaseException:
                pool.close()
                raise
        _pinned_default = pool
        return pool
