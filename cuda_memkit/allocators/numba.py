"""numba-cuda External Memory Management (EMM) plugin backed by cuda_memkit.

Select it for the whole process before numba makes a context::

    NUMBA_CUDA_MEMORY_MANAGER=cuda_memkit.allocators.numba python app.py

or ``numba.cuda.set_memory_manager(MemkitNumbaManager)``, or for a block
with :func:`cuda_memkit.allocators.use_with_numba`. Importing this module
imports numba-cuda.

What each plugin method uses:

===================  ==========================================================
``memalloc``         :meth:`MemoryPool.allocate` on the legacy default stream
                     (numba's allocations are not stream-ordered, and its
                     streams are blocking ones), from :func:`get_pool` (default:
                     the device's default pool, through the process's block
                     cache in front of it; :func:`set_caching` turns that off);
                     freed in that stream's order
``memhostalloc``     :meth:`HostBuffer.pooled` for plain pinned memory (the
                     shared pinned pool, accessible from every device, so also
                     *portable*); :meth:`HostBuffer.empty` with ``DEVICEMAP`` /
                     ``PORTABLE`` / ``WRITECOMBINED`` for mapped or
                     write-combined memory
``mempin``           :func:`register_host` (``DEVICEMAP`` when mapped);
                     unregistered as soon as numba drops it, deferred or not
``memallocmanaged``  :class:`ManagedBuffer` (attach ``GLOBAL`` or ``HOST``)
``get_memory_info``  the device's free memory plus what the pool holds unused
``get_ipc_handle``   pool IPC: :meth:`PoolBuffer.export` plus the pool's file
                     descriptor (the pool needs ``ipc=True``)
``reset``            frees everything this manager allocated
``defer_cleanup``    frees wait until the outermost block ends
===================  ==========================================================

numba holds device, mapped and managed memory the way its own manager does
(an ``AutoFreePointer`` that lives while any view of it does), so slices of
an array keep its memory alive.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import warnings
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from numba import cuda as _nbcuda
from numba.cuda.cudadrv import driver as _nbdrv

import cuda_memkit as cm

from .._core._checks import check_bool, check_nonneg
from .._core._errors import CudaError, MemkitWarning
from .._core._resource import EXITING

if TYPE_CHECKING:
    from .._pools._pool import MemoryPool

__all__ = ["MemkitIpcHandle", "MemkitNumbaManager", "get_pool", "set_caching", "set_pool"]

#: The EMM plugin interface version this plugin implements.
INTERFACE_VERSION = 1

# numba-cuda >= 0.x always uses cuda.bindings (``CUdeviceptr``); older numba
# has ``USE_NV_BINDING`` and, when it is false, ctypes pointers.
_CTYPES_POINTERS = not getattr(_nbdrv, "USE_NV_BINDING", True)


def _device_pointer(value: int) -> Any:
    """A device pointer in the representation this numba uses."""
    if _CTYPES_POINTERS:
        return ctypes.c_void_p(value)
    return _nbdrv.binding.CUdeviceptr(value)


def _pointer_value(pointer: Any) -> int:
    """The int address of a numba pointer (``CUdeviceptr``, ctypes pointer or int)."""
    if isinstance(pointer, ctypes._SimpleCData):
        return int(pointer.value or 0)
    return int(pointer)


# -- which pool numba allocates from ------------------------------------------------------

_pools: dict[int, MemoryPool] = {}
_defaults: dict[int, MemoryPool] = {}
_caching = True


def set_caching(enabled: bool) -> None:
    """Whether device memory from the default pools goes through their block cache.

    Parameters
    ----------
    enabled : bool
        ``True`` (the default): blocks numba frees wait in the process's
        cache in front of the device's default pool (see "Caching" on the
        pools page) for numba's next allocation of their size. ``False``:
        every allocation and free calls the driver. A pool chosen with
        :func:`set_pool` is used as it is (``MemoryPool(cache=True)`` caches).
    """
    global _caching
    check_bool(enabled, "enabled")
    _caching = enabled
    _defaults.clear()


def _check_pool(pool: object, device: int) -> MemoryPool:
    if not isinstance(pool, cm.MemoryPool):
        raise TypeError(f"pool must be a cuda_memkit.MemoryPool or None, not "
                        f"{type(pool).__name__}")
    if pool.closed:
        raise cm.ClosedError("the MemoryPool is closed; it cannot back numba allocations")
    if pool.imported:
        raise ValueError("an imported MemoryPool cannot allocate")
    if pool.is_host:
        raise TypeError("a pinned host MemoryPool cannot back numba device arrays (numba's "
                        "pinned memory comes from memhostalloc)")
    if pool.device is not None and pool.device != device:
        raise ValueError(f"the pool holds memory of device {pool.device}, not of device "
                         f"{device}")
    return pool


def set_pool(pool: MemoryPool | None, device: int | None = None) -> None:
    """Choose the pool the plugin allocates numba's device memory from.

    Parameters
    ----------
    pool : MemoryPool or None
        A device (or managed) pool; ``None`` goes back to the device's default
        pool.
    device : int, optional
        The device ordinal; default: the pool's device (required for ``None``
        and managed pools).

    Raises
    ------
    TypeError, ValueError
        For a bad, closed or host pool, or one of another device.
    """
    if device is None:
        device = getattr(pool, "device", None)
        if device is None:
            raise ValueError("give the device ordinal for None or a managed pool")
    device = check_nonneg(device, "device ordinal")
    if pool is None:
        _pools.pop(device, None)
        return
    _pools[device] = _check_pool(pool, device)


def get_pool(device: int = 0) -> MemoryPool:
    """The pool the plugin allocates device ``device``'s memory from."""
    pool = _pools.get(device)
    if pool is None:
        pool = _defaults.get(device)
        if pool is None or pool.closed:
            pool = _defaults[device] = cm.MemoryPool.default(device, cache=_caching)
    return pool


# -- the bookkeeping finalizers share (never the manager itself) ------------------------------

class _State:
    """Live allocations of one manager, and its deferred frees."""

    def __init__(self) -> None:
        self.live: dict[int, tuple[Any, Any]] = {}  # key -> (memkit object, numba object)
        self.by_ptr: dict[int, int] = {}  # device address -> key (for get_ipc_handle)
        self.deferred = 0
        self.pending: list[Any] = []
        self.keys = itertools.count(1)


def _close(obj: Any) -> None:
    """Free a memkit object for numba; warnings, never exceptions (finalizer context)."""
    try:
        obj.close()
    except (CudaError, BufferError) as exc:
        warnings.warn(f"cuda_memkit: freeing numba memory {obj!r} failed: {exc}",
                      MemkitWarning, stacklevel=2)
        return
    if isinstance(obj, cm.PoolBuffer) and obj.pool.closed:
        warnings.warn("cuda_memkit: numba freed memory of a MemoryPool that was closed while "
                      "numba arrays from it were alive (close(force=True)); the driver kept "
                      "that memory until now", MemkitWarning, stacklevel=2)


def _releaser(state: _State, key: int, deferrable: bool = True) -> Any:
    # Everything it uses is bound or an attribute: module globals may be gone at exit.
    def release(_exiting: list[bool] = EXITING) -> None:
        if _exiting[0]:
            return
        entry = state.live.pop(key, None)
        if entry is None:  # reset() freed it already
            return
        obj = entry[0]
        if isinstance(obj, cm.PoolBuffer):
            state.by_ptr.pop(obj.ptr, None)
        if deferrable and state.deferred:
            state.pending.append(obj)
            return
        _close(obj)

    return release


# -- the plugin -----------------------------------------------------------------------------

class MemkitNumbaManager(_nbcuda.BaseCUDAMemoryManager):  # type: ignore[misc]
    """numba-cuda EMM plugin: numba's memory from cuda_memkit pools and buffers.

    numba makes one per context (``MemkitNumbaManager(context=ctx)``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._state = _State()

    @property
    def interface_version(self) -> int:
        """The EMM plugin interface version implemented (1)."""
        return INTERFACE_VERSION

    @property
    def device(self) -> int:
        """Ordinal of this manager's context's device."""
        return int(self.context.device.id)

    def initialize(self) -> None:
        """Make this context's device current for memkit too (they share the primary context)."""
        cm.Device(self.device).set_current()

    @property
    def pool(self) -> MemoryPool:
        """The pool device allocations come from now (:func:`get_pool`)."""
        return get_pool(self.device)

    def _retry_oom(self, allocate: Any) -> Any:
        try:
            return allocate()
        except cm.CudaOutOfMemoryError:
            state = self._state
            if state.deferred or not state.pending:
                raise
            self._flush()
            return allocate()

    def _flush(self) -> None:
        state = self._state
        while state.pending:
            _close(state.pending.pop())

    # -- device memory ----------------------------------------------------------------
    def memalloc(self, size: int) -> Any:
        """Device memory from the pool (:meth:`MemoryPool.allocate`, legacy stream)."""
        ctx = weakref.proxy(self.context)
        if size == 0:
            return _nbdrv.MemoryPointer(ctx, _device_pointer(0), 0)
        pool = self.pool
        buf = self._retry_oom(lambda: pool.allocate(size, stream=None))
        state = self._state
        key = next(state.keys)
        ptr = buf.ptr
        mem = _nbdrv.AutoFreePointer(ctx, _device_pointer(ptr), size,
                                     finalizer=_releaser(state, key))
        state.live[key] = (buf, mem)
        state.by_ptr[ptr] = key
        return mem.own()

    def memallocmanaged(self, size: int, attach_global: bool = True) -> Any:
        """Managed memory (:class:`ManagedBuffer`, attached ``GLOBAL`` or ``HOST``)."""
        import numpy as np

        attach = cm.AttachFlags.GLOBAL if attach_global else cm.AttachFlags.HOST
        buf = self._retry_oom(lambda: cm.ManagedBuffer.empty(size, np.uint8, attach=attach))
        state = self._state
        key = next(state.keys)
        mem = _nbdrv.ManagedMemory(weakref.proxy(self.context), _device_pointer(buf.ptr), size,
                                   finalizer=_releaser(state, key))
        state.live[key] = (buf, mem)
        return mem.own()

    # -- host memory ------------------------------------------------------------------
    def memhostalloc(self, size: int, mapped: bool = False, portable: bool = False,
                     wc: bool = False) -> Any:
        """Pinned host memory: pooled when plain, ``cuMemHostAlloc`` flags when mapped/wc."""
        H = cm.HostAllocFlags
        if not mapped and not wc:
            buf = cm.HostBuffer.pooled(size) if size else cm.HostBuffer.empty(0)
        else:
            flags = ((H.DEVICEMAP if mapped else H.DEFAULT) | (H.PORTABLE if portable else 0)
                     | (H.WRITECOMBINED if wc else 0))
            buf = self._retry_oom(lambda: cm.HostBuffer.empty(max(size, 1), flags=flags))
        state = self._state
        key = next(state.keys)
        release = _releaser(state, key)
        ctx = weakref.proxy(self.context)
        if mapped:
            mem = _nbdrv.MappedMemory(ctx, buf.ptr, size, finalizer=release)
            state.live[key] = (buf, mem)
            return mem.own()
        state.live[key] = (buf, None)  # numba holds the PinnedMemory; it frees when dropped
        return _nbdrv.PinnedMemory(ctx, buf.ptr, size, finalizer=release)

    def mempin(self, owner: Any, pointer: int, size: int, mapped: bool = False) -> Any:
        """Page-lock existing host memory (:func:`register_host`) while numba holds it."""
        import numpy as np

        address = _pointer_value(pointer)
        view = (np.frombuffer(memoryview((ctypes.c_ubyte * size).from_address(address)), np.uint8)
                if size else np.empty(0, np.uint8))
        flags = cm.HostRegisterFlags.DEVICEMAP if mapped else cm.HostRegisterFlags.DEFAULT
        reg = self._retry_oom(lambda: cm.register_host(view, flags=flags))
        state = self._state
        key = next(state.keys)
        release = _releaser(state, key, deferrable=False)  # re-pinning must work at once
        ctx = weakref.proxy(self.context)
        if mapped:
            mem = _nbdrv.MappedMemory(ctx, address, size, owner=owner, finalizer=release)
            state.live[key] = (reg, mem)
            return mem.own()
        state.live[key] = (reg, None)
        return _nbdrv.PinnedMemory(ctx, address, size, owner=owner, finalizer=release)

    # -- information, IPC, lifetime ---------------------------------------------------
    def get_memory_info(self) -> Any:
        """``(free, total)``: the device's free memory plus the pool's unused reserve."""
        free, total = cm.Device(self.device).mem_info()
        pool = self.pool
        spare = 0
        if not pool.managed:
            st = pool.stats()
            spare = st.reserved_current - st.used_current
        return _nbdrv.MemoryInfo(free=free + spare, total=total)

    def get_ipc_handle(self, memory: Any) -> MemkitIpcHandle:
        """Export a device allocation through pool IPC (the pool needs ``ipc=True``)."""
        base = memory.owner
        base_ptr = _pointer_value(base.device_pointer)
        key = self._state.by_ptr.get(base_ptr)
        if key is None:
            raise ValueError("this memory was not allocated by this cuda_memkit manager")
        buf = self._state.live[key][0]
        pool = buf.pool
        if not pool.ipc:
            raise ValueError("IPC needs a pool created with ipc=True: "
                             "cuda_memkit.allocators.numba.set_pool(cm.MemoryPool(dev, ipc=True))")
        data = buf.export()
        fd = pool.export()
        offset = _pointer_value(memory.device_pointer) - base_ptr
        return MemkitIpcHandle(memory, data, memory.size, self.context.device.get_device_identity(),
                               offset, pool_fd=fd)

    def reset(self) -> None:
        """Free everything this manager allocated (numba calls it at context reset)."""
        state = self._state
        live = list(state.live.values())
        state.live.clear()
        state.by_ptr.clear()
        pending, state.pending = state.pending, []
        for obj, _ in live:
            _close(obj)
        for obj in pending:
            _close(obj)

    @contextlib.contextmanager
    def defer_cleanup(self) -> Iterator[None]:
        """Hold every free back until the outermost block ends."""
        state = self._state
        state.deferred += 1
        try:
            yield
        finally:
            state.deferred -= 1
            if not state.deferred:
                self._flush()


# -- IPC ---------------------------------------------------------------------------------

def _rebuild_ipc(data: bytes, size: int, source_info: Any, offset: int, fd: Any) -> MemkitIpcHandle:
    return MemkitIpcHandle(None, data, size, source_info, offset, pool_fd=fd)


class MemkitIpcHandle(_nbdrv.IpcHandle):  # type: ignore[misc]
    """An exported pool allocation: picklable (the pool's descriptor travels with it).

    Pickled through ``multiprocessing`` (a queue, a pipe, process arguments),
    the pool's file descriptor goes along by ``SCM_RIGHTS``
    (``multiprocessing.reduction.DupFd``). ``open()`` in the other process
    imports the pool and the pointer; ``close()`` frees that mapping.
    """

    def __init__(self, base: Any, handle: bytes, size: int, source_info: Any = None,
                 offset: int = 0, *, pool_fd: Any = None) -> None:
        super().__init__(base, handle, size, source_info, offset)
        self._pool_fd = pool_fd
        self._mapping: tuple[Any, Any] | None = None
        if isinstance(pool_fd, int):
            weakref.finalize(self, os.close, pool_fd)

    def __reduce__(self) -> Any:
        from multiprocessing.reduction import DupFd

        fd = self._pool_fd
        if not isinstance(fd, int):
            raise ValueError("an IPC handle received from another process cannot be sent on")
        return (_rebuild_ipc, (bytes(self.handle), self.size, self.source_info, self.offset,
                               DupFd(fd)))

    def open(self, context: Any) -> Any:
        """Import the pool and the allocation; return a numba pointer to the memory."""
        if self.base is not None:
            raise ValueError("opening IpcHandle from original process")
        if self._mapping is not None:
            raise ValueError("IpcHandle is already opened")
        fd = self._pool_fd
        fd = fd.detach() if hasattr(fd, "detach") else os.dup(fd)
        try:
            pool = cm.MemoryPool.import_(fd)
        finally:
            os.close(fd)
        try:
            buf = pool.import_pointer(self.handle, nbytes=self.offset + self.size)
        except BaseException:
            pool.close()
            raise
        self._mapping = (pool, buf)
        return _nbdrv.MemoryPointer(weakref.proxy(context),
                                    _device_pointer(buf.ptr + self.offset), self.size)

    open_direct = open

    def open_staged(self, context: Any) -> Any:
        """As :meth:`open` (pool IPC needs no staging on one node)."""
        return self.open(context)

    def close(self) -> None:
        """Free the imported mapping and the imported pool."""
        if self._mapping is None:
            raise ValueError("IpcHandle not opened")
        pool, buf = self._mapping
        self._mapping = None
        buf.close()
        pool.close()


#: What ``NUMBA_CUDA_MEMORY_MANAGER=cuda_memkit.allocators.numba`` loads.
_numba_memory_manager = MemkitNumbaManager


# -- install for a block ------------------------------------------------------------------

@contextlib.contextmanager
def use(pool: MemoryPool | None = None, cache: bool = True) -> Iterator[MemkitNumbaManager]:
    """Install the plugin on numba's current context for a block (see ``use_with_numba``)."""
    ctx = _nbcuda.current_context()
    previous_caching = _caching
    device = int(ctx.device.id)
    if pool is not None:
        _check_pool(pool, device)
    previous_class = getattr(_nbdrv, "_memory_manager", None)
    previous_manager = ctx.memory_manager
    previous_pool = _pools.get(device)
    _nbcuda.set_memory_manager(MemkitNumbaManager)  # checks the interface version
    if cache is not previous_caching:
        set_caching(cache)
    try:
        manager = MemkitNumbaManager(context=ctx)
        manager.initialize()
        ctx.memory_manager = manager
        if pool is not None:
            _pools[device] = pool
        yield manager
    finally:
        ctx.memory_manager = previous_manager
        _nbdrv._memory_manager = previous_class
        if previous_pool is None:
            _pools.pop(device, None)
        else:
            _pools[device] = previous_pool
        if _caching is not previous_caching:
            set_caching(previous_caching)
