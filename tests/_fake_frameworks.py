"""Stand-ins for CuPy and numba-cuda, for the simulator tests of ``cuda_memkit.allocators``.

They reproduce the parts of the frameworks' interfaces the adaptors use, with
the frameworks' semantics as documented in their sources (CuPy's
``memory.pyx`` / ``pinned_memory.pyx`` / ``stream.pyx``, numba-cuda's
``cudadrv/driver.py``): CuPy keeps the ``MemoryPointer`` and drops it when an
array dies; numba's ``AutoFreePointer`` frees through its finalizer when the
last ``OwnedPointer`` goes. Installed with ``monkeypatch.setitem(sys.modules,
...)``; the real frameworks are exercised by the GPU tests.
"""

from __future__ import annotations

import contextlib
import types
import weakref
from collections import namedtuple
from collections.abc import Iterator
from typing import Any

import cuda_memkit as cm

# -- CuPy ---------------------------------------------------------------------------------


class BaseMemory:
    """Like ``cupy.cuda.memory.BaseMemory``: public ptr / size / device_id fields."""

    __slots__ = ("__weakref__", "device_id", "ptr", "size")

    def __init__(self) -> None:
        self.ptr = 0
        self.size = 0
        self.device_id = -1


class UnownedMemory(BaseMemory):
    __slots__ = ("_owner",)

    def __init__(self, ptr: int, size: int, owner: object, device_id: int = -1) -> None:
        super().__init__()
        if device_id < 0 and ptr == 0:
            raise RuntimeError("UnownedMemory requires explicit device ID for a null pointer.")
        self.ptr, self.size, self.device_id, self._owner = ptr, size, device_id, owner


class MemoryPointer:
    def __init__(self, mem: BaseMemory, offset: int) -> None:
        if not isinstance(mem, BaseMemory):
            raise TypeError("mem must be a BaseMemory")
        assert mem.ptr != 0 or offset == 0
        self.mem = mem
        self.ptr = mem.ptr + offset
        self.device_id = mem.device_id


class PinnedMemoryPointer:
    def __init__(self, mem: Any, offset: int) -> None:
        self.mem = mem
        self.ptr = mem.ptr + offset

    def size(self) -> int:
        return int(self.mem.size) - (self.ptr - int(self.mem.ptr))


class CupyStream:
    """A CuPy stream: ``ptr`` is the handle; ``with`` makes it current on its device."""

    def __init__(self, cupy: FakeCupy, ptr: int, device_id: int = -1) -> None:
        self._cupy, self.ptr, self.device_id = cupy, ptr, device_id

    def __enter__(self) -> CupyStream:
        dev = self._cupy.current_device if self.device_id < 0 else self.device_id
        self._cupy.stream_stack[dev].append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        dev = self._cupy.current_device if self.device_id < 0 else self.device_id
        self._cupy.stream_stack[dev].pop()

    # CuPy's capture API (``cupy.cuda.Stream.begin_capture`` / ``end_capture`` ->
    # ``cupy.cuda.graph.Graph``), straight on the driver as CuPy's is: instantiated without
    # flags, so a relaunch fails while an allocation of the last launch is still allocated.
    def begin_capture(self, mode: int = 0) -> None:
        from cuda.bindings import driver as cu

        from cuda_memkit._core import _driver

        _driver.call("cuStreamBeginCapture", self.ptr, cu.CUstreamCaptureMode(mode))

    def end_capture(self) -> CupyGraph:
        from cuda_memkit._core import _driver

        graph = _driver.call("cuStreamEndCapture", self.ptr)
        return CupyGraph(graph, _driver.call("cuGraphInstantiate", graph, 0))


class CupyGraph:
    """Like ``cupy.cuda.graph.Graph``: ``launch(stream)``; destroyed when collected."""

    def __init__(self, graph: Any, exe: Any) -> None:
        from cuda_memkit._core import _driver

        self.graph, self.exe = graph, exe
        self._fin = weakref.finalize(self, _destroy_cupy_graph, _driver, graph, exe)

    def launch(self, stream: CupyStream) -> None:
        from cuda_memkit._core import _driver

        _driver.call("cuGraphLaunch", self.exe, stream.ptr)

    def close(self) -> None:
        self._fin()


def _destroy_cupy_graph(driver: Any, graph: Any, exe: Any) -> None:
    driver.call("cuGraphExecDestroy", exe)
    driver.call("cuGraphDestroy", graph)


class PinnedMemoryPool:
    def malloc(self, size: int) -> PinnedMemoryPointer:
        raise AssertionError("the fake's default pinned pool is never asked for memory")


class FakeCupy(types.ModuleType):
    """``cupy`` with ``cuda.runtime.getDevice``, streams, allocators and memory classes."""

    def __init__(self, ndevices: int = 2) -> None:
        super().__init__("cupy")
        self.current_device = 0
        self.null = CupyStream(self, 0)
        self.stream_stack: list[list[CupyStream]] = [[self.null] for _ in range(ndevices)]
        self.allocator: Any = "cupy default pool"
        self.default_pinned_pool = PinnedMemoryPool()
        self.pinned_allocator: Any = self.default_pinned_pool.malloc
        self.thread_local_allocator: Any = None
        self.calls: list[str] = []
        cuda = types.SimpleNamespace()
        cuda.runtime = types.SimpleNamespace(getDevice=self._get_device)
        cuda.memory = types.SimpleNamespace(BaseMemory=BaseMemory, UnownedMemory=UnownedMemory,
                                            MemoryPointer=MemoryPointer)
        cuda.pinned_memory = types.SimpleNamespace(PinnedMemoryPointer=PinnedMemoryPointer)
        cuda.get_current_stream = self._get_current_stream
        cuda.set_allocator = self._set_allocator
        cuda.get_allocator = lambda: self.allocator
        cuda.set_pinned_memory_allocator = self._set_pinned
        cuda.alloc = lambda size: self.allocator(size)
        cuda.alloc_pinned_memory = lambda size: self.pinned_allocator(size)
        cuda.Device = self._device
        cuda.Stream = CupyStream
        self.cuda = cuda
        self.get_default_pinned_memory_pool = lambda: self.default_pinned_pool

    def _get_device(self) -> int:
        self.calls.append("getDevice")
        return self.current_device

    def _get_current_stream(self, device_id: int = -1) -> CupyStream:
        return self.stream_stack[self.current_device if device_id < 0 else device_id][-1]

    def _set_allocator(self, allocator: Any = None) -> None:
        if self.thread_local_allocator is not None:
            raise ValueError("Can't change the global allocator inside `using_allocator` "
                             "context manager")
        self.allocator = allocator if allocator is not None else "cupy raw malloc"

    def _set_pinned(self, allocator: Any = None) -> None:
        self.pinned_allocator = allocator if allocator is not None else "cupy raw pinned"

    @contextlib.contextmanager
    def _device(self, n: int) -> Iterator[None]:
        """``with cupy.cuda.Device(n):``: cudaSetDevice switches the current context."""
        prev = self.current_device
        self.current_device = n
        cm.Device(n).set_current()
        try:
            yield
        finally:
            self.current_device = prev
            cm.Device(prev).set_current()

    def stream(self, handle: int, device_id: int = -1) -> CupyStream:
        return CupyStream(self, handle, device_id)


# -- numba-cuda ---------------------------------------------------------------------------

MemoryInfo = namedtuple("MemoryInfo", "free,total")


class NumbaMemoryPointer:
    """Like numba's MemoryPointer: reference counted, finalizer run by ``free()`` or GC."""

    __cuda_memory__ = True

    def __init__(self, context: Any, pointer: Any, size: int, owner: Any = None,
                 finalizer: Any = None) -> None:
        self.context = context
        self.device_pointer = pointer
        self.size = size
        self.is_managed = finalizer is not None
        self.refct = 1
        self.handle = self.device_pointer
        self._owner = owner
        if finalizer is not None:
            self._finalizer = weakref.finalize(self, finalizer)

    @property
    def owner(self) -> Any:
        return self if self._owner is None else self._owner

    def own(self) -> OwnedPointer:
        return OwnedPointer(weakref.proxy(self))

    def free(self) -> None:
        if self.is_managed:
            if not self._finalizer.alive:
                raise RuntimeError("Freeing dead memory")
            self._finalizer()

    def view(self, start: int) -> Any:
        from cuda.bindings import driver as cu

        view = NumbaMemoryPointer(self.context, cu.CUdeviceptr(int(self.device_pointer) + start),
                                  self.size - start, owner=self.owner)
        return OwnedPointer(weakref.proxy(self.owner), view)

    @property
    def device_pointer_value(self) -> int | None:
        return int(self.device_pointer) or None


class AutoFreePointer(NumbaMemoryPointer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refct -= 1


class MappedMemory(AutoFreePointer):
    def __init__(self, context: Any, pointer: int, size: int, owner: Any = None,
                 finalizer: Any = None) -> None:
        from cuda.bindings import driver as cu

        from cuda_memkit._core import _driver

        self.owned = owner
        self.host_pointer = pointer
        devptr = cu.CUdeviceptr(int(_driver.call("cuMemHostGetDevicePointer", pointer, 0))
                                if size else 0)
        super().__init__(context, devptr, size, finalizer=finalizer)
        self.handle = self.host_pointer

    def own(self) -> OwnedPointer:
        return OwnedPointer(weakref.proxy(self))


class ManagedMemory(AutoFreePointer):
    pass


class PinnedMemory:
    def __init__(self, context: Any, pointer: int, size: int, owner: Any = None,
                 finalizer: Any = None) -> None:
        self.context, self.owned, self.size = context, owner, size
        self.host_pointer = self.handle = pointer
        self.is_managed = finalizer is not None
        if finalizer is not None:
            weakref.finalize(self, finalizer)

    def own(self) -> PinnedMemory:
        return self


class OwnedPointer:
    def __init__(self, memptr: Any, view: Any = None) -> None:
        self._mem = memptr
        self._view = self._mem if view is None else view
        mem = self._mem

        def deref() -> None:
            try:
                mem.refct -= 1
                if mem.refct == 0:
                    mem.free()
            except ReferenceError:
                pass

        self._mem.refct += 1
        weakref.finalize(self, deref)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._view, name)


class IpcHandle:
    def __init__(self, base: Any, handle: Any, size: int, source_info: Any = None,
                 offset: int = 0) -> None:
        self.base, self.handle, self.size = base, handle, size
        self.source_info, self.offset = source_info, offset


class BaseCUDAMemoryManager:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if "context" not in kwargs:
            raise RuntimeError("Memory manager requires a context")
        self.context = kwargs.pop("context")


class NumbaDevice:
    def __init__(self, ordinal: int) -> None:
        self.id = ordinal

    def get_device_identity(self) -> dict[str, int]:
        return {"pci_domain_id": 0, "pci_bus_id": self.id, "pci_device_id": 0}


class NumbaContext:
    def __init__(self, numba: FakeNumba, ordinal: int) -> None:
        self.device = NumbaDevice(ordinal)
        self.memory_manager = numba.driver._memory_manager(context=self)
        self.memory_manager.initialize()

    def memalloc(self, size: int) -> Any:
        return self.memory_manager.memalloc(size)

    def memhostalloc(self, size: int, mapped: bool = False, portable: bool = False,
                     wc: bool = False) -> Any:
        return self.memory_manager.memhostalloc(size, mapped, portable, wc)

    def mempin(self, owner: Any, pointer: int, size: int, mapped: bool = False) -> Any:
        return self.memory_manager.mempin(owner, pointer, size, mapped)

    def memallocmanaged(self, size: int, attach_global: bool = True) -> Any:
        return self.memory_manager.memallocmanaged(size, attach_global)

    def get_memory_info(self) -> Any:
        return self.memory_manager.get_memory_info()

    def get_ipc_handle(self, memory: Any) -> Any:
        return self.memory_manager.get_ipc_handle(memory)

    def reset(self) -> None:
        self.memory_manager.reset()

    @contextlib.contextmanager
    def defer_cleanup(self) -> Iterator[None]:
        with self.memory_manager.defer_cleanup():
            yield


class DefaultNumbaManager(BaseCUDAMemoryManager):
    """What numba uses without a plugin (never asked for memory by these tests)."""

    interface_version = 1

    def initialize(self) -> None:
        pass

    def reset(self) -> None:
        pass


class FakeNumba(types.ModuleType):
    """``numba`` with ``numba.cuda`` and ``numba.cuda.cudadrv.driver``."""

    def __init__(self) -> None:
        from cuda.bindings import driver as binding

        super().__init__("numba")
        self.contexts: dict[int, NumbaContext] = {}
        self.current = 0
        drv = types.ModuleType("numba.cuda.cudadrv.driver")
        for name, obj in [("MemoryPointer", NumbaMemoryPointer),
                          ("AutoFreePointer", AutoFreePointer), ("MappedMemory", MappedMemory),
                          ("PinnedMemory", PinnedMemory), ("ManagedMemory", ManagedMemory),
                          ("OwnedPointer", OwnedPointer), ("IpcHandle", IpcHandle),
                          ("MemoryInfo", MemoryInfo), ("binding", binding),
                          ("BaseCUDAMemoryManager", BaseCUDAMemoryManager)]:
            setattr(drv, name, obj)
        drv._memory_manager = DefaultNumbaManager
        self.driver = drv
        cudadrv = types.ModuleType("numba.cuda.cudadrv")
        cudadrv.driver = drv  # type: ignore[attr-defined]
        cuda = types.ModuleType("numba.cuda")
        cuda.cudadrv = cudadrv  # type: ignore[attr-defined]
        cuda.BaseCUDAMemoryManager = BaseCUDAMemoryManager  # type: ignore[attr-defined]
        cuda.current_context = self.current_context  # type: ignore[attr-defined]
        cuda.set_memory_manager = self.set_memory_manager  # type: ignore[attr-defined]
        self.cuda = cuda

    def modules(self) -> dict[str, types.ModuleType]:
        return {"numba": self, "numba.cuda": self.cuda, "numba.cuda.cudadrv": self.cuda.cudadrv,
                "numba.cuda.cudadrv.driver": self.driver}

    def current_context(self) -> NumbaContext:
        ctx = self.contexts.get(self.current)
        if ctx is None:
            ctx = self.contexts[self.current] = NumbaContext(self, self.current)
        return ctx

    def set_memory_manager(self, plugin: Any) -> None:
        version = plugin(context=None).interface_version
        if version != 1:
            raise RuntimeError(f"EMM Plugin interface has version {version} - version 1 "
                               "required")
        self.driver._memory_manager = plugin
