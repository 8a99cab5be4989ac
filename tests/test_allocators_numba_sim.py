"""The numba EMM plugin's method contract, with a stand-in numba-cuda (runs on both backends).

The real numba-cuda is exercised by ``test_allocators_numba.py`` and by numba's
own tests (``scripts/run_numba_suite.py``) on a GPU.
"""

from __future__ import annotations

import gc
import importlib
import pickle
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit import allocators

from . import _fake_frameworks as fake
from ._helpers import read, write

KiB = 1 << 10
PLUGIN = "cuda_memkit.allocators.numba"


pytestmark = pytest.mark.usefixtures("default_pinned")


@pytest.fixture
def numba(monkeypatch: pytest.MonkeyPatch, default_pinned: cm.MemoryPool
          ) -> Iterator[fake.FakeNumba]:
    module = fake.FakeNumba()
    for name, mod in module.modules().items():
        monkeypatch.setitem(sys.modules, name, mod)
    sys.modules.pop(PLUGIN, None)
    cm.Device(0).set_current()
    yield module
    for ctx in module.contexts.values():
        ctx.reset()
    module.contexts.clear()
    sys.modules.pop(PLUGIN, None)
    if hasattr(allocators, "numba"):
        delattr(allocators, "numba")
    gc.collect()
    default_pinned.trim()


@pytest.fixture
def plugin(numba: fake.FakeNumba) -> ModuleType:
    return importlib.import_module(PLUGIN)


@pytest.fixture
def ctx(numba: fake.FakeNumba, plugin: ModuleType) -> fake.NumbaContext:
    numba.set_memory_manager(plugin.MemkitNumbaManager)
    return numba.current_context()


def used(pool: cm.MemoryPool) -> int:
    return pool.stats().used_current


# -- the plugin module -------------------------------------------------------------------------

def test_the_module_names_its_manager(plugin: ModuleType, numba: fake.FakeNumba) -> None:
    # what numba does for NUMBA_CUDA_MEMORY_MANAGER=cuda_memkit.allocators.numba
    manager = importlib.import_module(PLUGIN)._numba_memory_manager
    assert manager is plugin.MemkitNumbaManager
    numba.set_memory_manager(manager)  # numba checks the interface version on a dummy
    assert manager(context=None).interface_version == 1 == plugin.INTERFACE_VERSION
    assert issubclass(manager, fake.BaseCUDAMemoryManager)
    with pytest.raises(RuntimeError, match="requires a context"):
        manager()


def test_a_missing_numba_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "numba", None)
    sys.modules.pop(PLUGIN, None)
    with pytest.raises(ModuleNotFoundError, match="needs numba-cuda"), \
            allocators.use_with_numba():
        pass


# -- device memory ----------------------------------------------------------------------------

def held(pool: cm.MemoryPool) -> int:
    """Bytes of the pool in users' hands: used, less what its block caches hold."""
    return used(pool) - pool.cached_bytes


def test_memalloc_from_the_default_pool(ctx: fake.NumbaContext) -> None:
    pool = cm.MemoryPool.default(0)
    base = held(pool)
    mem = ctx.memalloc(4 * KiB)
    assert isinstance(mem, fake.OwnedPointer)
    ptr = int(mem.device_pointer)
    assert held(pool) >= base + 4 * KiB
    data = np.arange(4 * KiB, dtype=np.uint8)
    write(ptr, data)
    assert np.array_equal(read(ptr, 4 * KiB), data)
    view = mem.view(100)  # a slice keeps the allocation alive
    del mem
    gc.collect()
    assert held(pool) >= base + 4 * KiB
    assert int(view.device_pointer) == ptr + 100
    del view
    gc.collect()
    assert held(pool) == base


def test_memalloc_from_a_chosen_pool(ctx: fake.NumbaContext, plugin: ModuleType) -> None:
    with cm.MemoryPool(0) as pool:
        plugin.set_pool(pool)
        try:
            assert plugin.get_pool(0) is pool and ctx.memory_manager.pool is pool
            mem = ctx.memalloc(KiB)
            assert used(pool) >= KiB
            del mem
            gc.collect()
            assert used(pool) == 0
        finally:
            plugin.set_pool(None, 0)
        assert plugin.get_pool(0) is not pool


def test_memalloc_zero_bytes(ctx: fake.NumbaContext) -> None:
    mem = ctx.memalloc(0)
    assert mem.device_pointer_value is None and mem.size == 0


def test_defer_cleanup_holds_frees_back(ctx: fake.NumbaContext) -> None:
    pool = cm.MemoryPool.default(0)
    base = held(pool)
    with ctx.defer_cleanup():
        with ctx.defer_cleanup():
            mem = ctx.memalloc(KiB)
            del mem
            gc.collect()
            assert held(pool) >= base + KiB
        assert held(pool) >= base + KiB  # still inside the outer block
    assert held(pool) == base


def test_reset_frees_everything(ctx: fake.NumbaContext) -> None:
    pool = cm.MemoryPool.default(0)
    base = held(pool)
    a, b = ctx.memalloc(KiB), ctx.memalloc(2 * KiB)
    pinned = ctx.memhostalloc(KiB)
    ctx.reset()
    assert held(pool) == base
    del a, b, pinned  # their finalizers find nothing left to free
    gc.collect()
    assert held(pool) == base


def test_out_of_memory_flushes_deferred_frees(ctx: fake.NumbaContext, plugin: ModuleType
                                             ) -> None:
    with cm.MemoryPool(0, max_size=32 << 20) as pool:
        plugin.set_pool(pool)
        try:
            mgr = ctx.memory_manager
            with ctx.defer_cleanup():
                a = ctx.memalloc(20 << 20)
                del a
                gc.collect()
            assert used(pool) == 0
            mgr._state.deferred = 0
            b = ctx.memalloc(20 << 20)
            with pytest.raises(cm.CudaOutOfMemoryError):
                ctx.memalloc(20 << 20)
            del b
            gc.collect()
        finally:
            plugin.set_pool(None, 0)


def test_freed_after_the_pool_was_closed_warns(ctx: fake.NumbaContext, plugin: ModuleType
                                               ) -> None:
    pool = cm.MemoryPool(0)
    plugin.set_pool(pool)
    try:
        mem = ctx.memalloc(KiB)
        pool.close(force=True)
        with pytest.raises(cm.ClosedError):
            ctx.memalloc(KiB)
        with pytest.warns(cm.MemkitWarning, match="closed"):
            del mem
            gc.collect()
    finally:
        plugin.set_pool(None, 0)


# -- host memory ------------------------------------------------------------------------------

def test_memhostalloc_plain_is_pooled(ctx: fake.NumbaContext, default_pinned: cm.MemoryPool
                                      ) -> None:
    mem = ctx.memhostalloc(3000)
    assert isinstance(mem, fake.PinnedMemory) and mem.size == 3000
    buf = ctx.memory_manager._state.live[max(ctx.memory_manager._state.live)][0]
    assert isinstance(buf, cm.HostBuffer) and buf.ptr == mem.host_pointer
    assert default_pinned.stats().used_current >= 3000  # from the shared pinned pool
    buf.array[:] = 5
    del mem, buf
    gc.collect()
    assert not ctx.memory_manager._state.live


@pytest.mark.parametrize("portable, wc", [(False, False), (True, False), (True, True)])
def test_memhostalloc_mapped_honours_the_flags(ctx: fake.NumbaContext, portable: bool,
                                               wc: bool) -> None:
    mem = ctx.memhostalloc(KiB, mapped=True, portable=portable, wc=wc)
    assert isinstance(mem, fake.OwnedPointer)
    state = ctx.memory_manager._state
    buf = next(b for b, m in state.live.values() if m is not None)
    H = cm.HostAllocFlags
    want = H.DEVICEMAP | (H.PORTABLE if portable else 0) | (H.WRITECOMBINED if wc else 0)
    assert buf.flags == want
    assert int(mem.device_pointer) == buf.device_ptr
    del mem, buf
    gc.collect()
    assert not state.live


def test_memhostalloc_write_combined_unmapped(ctx: fake.NumbaContext) -> None:
    mem = ctx.memhostalloc(KiB, wc=True)
    buf = next(iter(ctx.memory_manager._state.live.values()))[0]
    assert buf.flags == cm.HostAllocFlags.WRITECOMBINED and mem.host_pointer == buf.ptr


@pytest.mark.parametrize("mapped", [False, True])
def test_mempin_registers_until_dropped(ctx: fake.NumbaContext, mapped: bool) -> None:
    arr = np.arange(4096, dtype=np.uint8)
    mem = ctx.mempin(arr, arr.ctypes.data, arr.nbytes, mapped=mapped)
    assert mem.owned is arr if not mapped else mem._view.owned is arr
    with pytest.raises(cm.CudaHostMemoryAlreadyRegisteredError):
        cm.register_host(arr)  # pinned now
    if mapped:
        assert int(mem.device_pointer) == int(cm._core._driver.call("cuMemHostGetDevicePointer",
                                                              arr.ctypes.data, 0))
    with ctx.defer_cleanup():
        del mem
        gc.collect()
        cm.register_host(arr).close()  # unpinned at once, even while frees are deferred


def test_memallocmanaged(ctx: fake.NumbaContext) -> None:
    for attach_global in (True, False):
        mem = ctx.memallocmanaged(KiB, attach_global=attach_global)
        buf = next(iter(ctx.memory_manager._state.live.values()))[0]
        assert isinstance(buf, cm.ManagedBuffer) and int(mem.device_pointer) == buf.ptr
        del mem, buf
        gc.collect()
        assert not ctx.memory_manager._state.live


# -- information, IPC ---------------------------------------------------------------------------

def test_get_memory_info(ctx: fake.NumbaContext) -> None:
    free, total = cm.Device(0).mem_info()
    info = ctx.get_memory_info()
    assert info.total == total and free <= info.free <= total


def test_ipc_needs_an_ipc_pool(ctx: fake.NumbaContext) -> None:
    mem = ctx.memalloc(KiB)
    with pytest.raises(ValueError, match="ipc=True"):
        ctx.get_ipc_handle(mem)


def test_ipc_handle_round_trip(ctx: fake.NumbaContext, plugin: ModuleType, backend: str
                              ) -> None:
    if backend != "sim":
        pytest.skip("in-process pointer import is the simulator's stand-in for the "
                    "two-process test (the GPU case is test_allocators_numba.py::"
                    "test_ipc_through_pool_export)")
    with cm.MemoryPool(0, ipc=True) as pool:
        plugin.set_pool(pool)
        try:
            mem = ctx.memalloc(4 * KiB)
            data = np.arange(4 * KiB, dtype=np.uint8)
            write(int(mem.device_pointer), data)
            view = mem.view(1 * KiB)
            handle = ctx.get_ipc_handle(view)
            assert isinstance(handle, plugin.MemkitIpcHandle)
            assert handle.offset == KiB and handle.size == 3 * KiB
            with pytest.raises(ValueError, match="original process"):
                handle.open(ctx)
            received = pickle.loads(pickle.dumps(handle))  # what a queue to a child does
            opened = received.open(ctx)
            got = read(int(opened.device_pointer), 3 * KiB)
            assert np.array_equal(got, data[KiB:])
            with pytest.raises(ValueError, match="already opened"):
                received.open(ctx)
            received.close()
            with pytest.raises(ValueError, match="not opened"):
                received.close()
            del view, mem, handle, received, opened
            gc.collect()
            assert used(pool) == 0
        finally:
            plugin.set_pool(None, 0)


# -- use_with_numba ----------------------------------------------------------------------------

def test_use_with_numba_installs_and_restores(numba: fake.FakeNumba) -> None:
    ctx = numba.current_context()
    before_mgr, before_cls = ctx.memory_manager, numba.driver._memory_manager
    with cm.MemoryPool(0) as pool:
        with allocators.use_with_numba(pool) as mgr:
            plugin = sys.modules[PLUGIN]
            assert ctx.memory_manager is mgr and isinstance(mgr, plugin.MemkitNumbaManager)
            assert numba.driver._memory_manager is plugin.MemkitNumbaManager
            mem = ctx.memalloc(KiB)
            assert used(pool) >= KiB
        assert ctx.memory_manager is before_mgr and numba.driver._memory_manager is before_cls
        assert plugin.get_pool(0) is not pool
        del mem  # memory made inside the block stays valid; freed when numba drops it
        gc.collect()
        assert used(pool) == 0


@pytest.mark.parametrize("make, error, match", [
    (lambda: "pool", TypeError, "MemoryPool"),
    (lambda: cm.MemoryPool(location=cm.Location.host()), TypeError, "pinned host"),
    (lambda: _closed(cm.MemoryPool(0)), cm.ClosedError, "closed"),
])
def test_use_with_numba_refuses_bad_pools(numba: fake.FakeNumba, make: Any,
                                          error: type[Exception], match: str) -> None:
    ctx = numba.current_context()
    before = ctx.memory_manager
    pool = make()
    try:
        with pytest.raises(error, match=match), allocators.use_with_numba(pool):
            pass
    finally:
        if isinstance(pool, cm.MemoryPool):
            pool.close()
    assert ctx.memory_manager is before


def test_use_with_numba_refuses_another_devices_pool(numba: fake.FakeNumba, two_devices: None
                                                     ) -> None:
    ctx = numba.current_context()
    with cm.MemoryPool(1) as pool:
        with pytest.raises(ValueError, match="device 1"), allocators.use_with_numba(pool):
            pass
    assert not isinstance(ctx.memory_manager, sys.modules[PLUGIN].MemkitNumbaManager)


def test_set_pool_checks(plugin: ModuleType) -> None:
    with pytest.raises(TypeError):
        plugin.set_pool("x", 0)
    with pytest.raises(ValueError, match="device ordinal"):
        plugin.set_pool(None)
    with cm.MemoryPool(0) as pool, pytest.raises(ValueError, match="device 0"):
        plugin.set_pool(pool, 1)


def _closed(pool: cm.MemoryPool) -> cm.MemoryPool:
    pool.close()
    return pool
