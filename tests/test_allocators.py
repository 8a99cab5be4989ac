"""The CuPy adaptors' own logic, with a stand-in ``cupy`` module (runs on both backends).

The real CuPy is exercised by ``test_allocators_cupy.py`` on a GPU.
"""

from __future__ import annotations

import ctypes
import gc
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit import allocators
from cuda_memkit._core import _driver, _resource
from cuda_memkit._pools import _cache, _pool

from . import _fake_frameworks as fake
from ._helpers import read, write

KiB = 1 << 10


pytestmark = pytest.mark.usefixtures("default_pinned", "flush_pinned")


@pytest.fixture
def cupy(monkeypatch: pytest.MonkeyPatch) -> Iterator[fake.FakeCupy]:
    module = fake.FakeCupy(ndevices=cm.device_count())
    monkeypatch.setitem(sys.modules, "cupy", module)
    cm.Device(0).set_current()
    yield module
    gc.collect()


Spy = list[tuple[str, int, int]]


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Spy:
    """Record (api, stream handle, pointer) of the pool calls the adaptors make."""
    calls: Spy = []
    real = _driver.function

    def function(api: str) -> Callable[..., Any]:
        fn = real(api)
        if api == "cuMemAllocFromPoolAsync":
            def alloc(size: int, pool: Any, stream: Any) -> Any:
                res = fn(size, pool, stream)
                calls.append((api, int(stream), int(res[1] or 0)))
                return res
            return alloc
        if api == "cuMemFreeAsync":
            def free(ptr: Any, stream: Any) -> Any:
                calls.append((api, int(stream), int(ptr)))
                return fn(ptr, stream)
            return free
        return fn

    monkeypatch.setattr(_driver, "function", function)
    monkeypatch.setattr(_cache, "ALLOC", None)  # re-resolved through the spy
    monkeypatch.setattr(_cache, "FREE", None)
    return calls


def used(pool: cm.MemoryPool) -> int:
    return pool.stats().used_current


# -- import cost ---------------------------------------------------------------------------

def test_importing_allocators_imports_no_framework() -> None:
    code = ("import sys, cuda_memkit, cuda_memkit.allocators as a; "
            "bad = [m for m in ('cupy', 'numba', 'torch', 'numpy') if m in sys.modules]; "
            "assert not bad, bad; assert 'cuda_memkit.allocators' not in "
            "sys.modules['cuda_memkit'].__dict__.get('__all__', ())")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_missing_cupy_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    with pytest.raises(ModuleNotFoundError, match="needs CuPy"):
        allocators.cupy_allocator()


# -- allocation and free ---------------------------------------------------------------------

def test_allocations_come_from_the_pool_and_go_back(cupy: fake.FakeCupy, stream: cm.Stream
                                                    ) -> None:
    with cm.MemoryPool(0) as pool:
        alloc = allocators.cupy_allocator(pool, cache=False)
        base = used(pool)
        a = alloc(4 * KiB)
        b = alloc(100)
        assert isinstance(a, fake.MemoryPointer) and a.device_id == 0
        assert a.ptr and b.ptr and a.ptr != b.ptr and a.mem.size == 4 * KiB
        assert used(pool) >= base + 4 * KiB + 100
        data = np.arange(4 * KiB, dtype=np.uint8)
        write(a.ptr, data)
        assert np.array_equal(read(a.ptr, 4 * KiB), data)
        ledger = _resource.account("pool", 0, pool.handle)
        # The ledger sees them with the bytes asked for, as every allocation; CuPy's memory
        # is the block reserved (CuPy's sizes: multiples of 512).
        assert sorted(ledger.live.values()) == [100, 4 * KiB] and b.mem.size == 512
        del a
        assert used(pool) >= base + 100 and ledger.current == 100
        del b
        assert used(pool) == base and not ledger.live
        default = cm.MemoryPool.default(0)
        dflt = _resource.account("pool", 0, default.handle)
        c = allocators.cupy_allocator(cache=False)(300)
        assert 300 in dflt.live.values() and c.mem.size == 512
        del c
        assert 300 not in dflt.live.values()


def test_the_default_pool_of_cupys_current_device(cupy: fake.FakeCupy, ndevices: int) -> None:
    alloc = allocators.cupy_allocator(cache=False)
    for dev in range(ndevices):
        default = cm.MemoryPool.default(dev)
        with cupy.cuda.Device(dev):
            base = used(default)
            p = alloc(64 * KiB)
            assert p.device_id == dev
            assert used(default) >= base + 64 * KiB
            del p
            assert used(default) == base


def test_ordered_on_the_current_stream_and_freed_on_it(cupy: fake.FakeCupy, spy: Spy) -> None:
    s1, s2 = cm.Stream(), cm.Stream()
    try:
        with cm.MemoryPool(0) as pool:
            alloc = allocators.cupy_allocator(pool, cache=False)
            with cupy.stream(s1.handle):
                p = alloc(KiB)
            with cupy.stream(s2.handle):  # e.g. a stream being captured into a graph
                q = alloc(KiB)
                del p  # freed on s1, where it was allocated, not on the current s2
            r = alloc(KiB)  # the null stream again
            del q, r
            s1.synchronize()
            s2.synchronize()
        pa, qa = spy[0][2], spy[1][2]
        assert [c[:2] for c in spy] == [
            ("cuMemAllocFromPoolAsync", s1.handle), ("cuMemAllocFromPoolAsync", s2.handle),
            ("cuMemFreeAsync", s1.handle), ("cuMemAllocFromPoolAsync", 0),
            ("cuMemFreeAsync", s2.handle), ("cuMemFreeAsync", 0)]
        assert spy[2][2] == pa and spy[4][2] == qa
    finally:
        s1.close()
        s2.close()


def test_the_memory_keeps_its_stream_alive(cupy: fake.FakeCupy, stream: cm.Stream) -> None:
    alloc = allocators.cupy_allocator(cache=False)
    st = cupy.stream(stream.handle)
    gone = weakref.ref(st)
    with st:
        p = alloc(KiB)
    del st
    assert gone() is not None  # the free must not be queued on a destroyed stream
    del p
    assert gone() is None


def test_the_cache_keeps_a_stream_alive_while_it_holds_its_blocks(cupy: fake.FakeCupy) -> None:
    stream = cm.Stream()
    alloc = allocators.cupy_allocator()
    st = cupy.stream(stream.handle)
    gone = weakref.ref(st)
    with st:
        p = alloc(KiB)
    del st, p
    gc.collect()
    cache = _pool.default_cache(0)
    assert gone() is not None and cache.cached >= KiB  # its block waits, on its stream
    stream.close()  # the memkit stream under it: its blocks go back before it is destroyed
    assert gone() is None and cache.cached == 0


@pytest.mark.parametrize("given", [False, True])
def test_zero_bytes_is_a_null_allocation(cupy: fake.FakeCupy, spy: Spy, given: bool) -> None:
    with cm.MemoryPool(0) as pool:
        alloc = allocators.cupy_allocator(pool if given else None)
        p = alloc(0)
        assert p.ptr == 0 and p.mem.size == 0 and p.device_id == 0
        assert spy == []
        del p
        assert spy == []


@pytest.mark.parametrize("size, error", [(-1, ValueError), (2.5, TypeError), ("8", TypeError),
                                         (None, TypeError), (True, TypeError)])
def test_bad_sizes(cupy: fake.FakeCupy, size: object, error: type[Exception]) -> None:
    alloc = allocators.cupy_allocator()
    with pytest.raises(error, match="allocation size"):
        alloc(size)  # type: ignore[arg-type]


def test_out_of_memory_is_a_memory_error(cupy: fake.FakeCupy) -> None:
    with cm.MemoryPool(0, max_size=32 << 20) as pool:
        alloc = allocators.cupy_allocator(pool)
        with pytest.raises(cm.CudaOutOfMemoryError) as info:
            alloc(64 << 20)
        assert isinstance(info.value, MemoryError)
        assert used(pool) == 0


@pytest.mark.uses_managed_memory
def test_managed_pool(cupy: fake.FakeCupy, ndevices: int) -> None:
    if not all(cm.Device(i).concurrent_managed_access for i in range(ndevices)):
        pytest.skip("no managed pools without concurrent managed access")
    with cm.MemoryPool(managed=True) as pool:
        alloc = allocators.cupy_allocator(pool, cache=False)
        with cupy.cuda.Device(ndevices - 1):
            p = alloc(KiB)  # a managed pool serves any device
            assert p.device_id == ndevices - 1 and used(pool) >= KiB
        del p
        assert used(pool) == 0


def test_a_thread_without_a_context(cupy: fake.FakeCupy) -> None:
    alloc = allocators.cupy_allocator()
    out: list[Any] = []

    def work() -> None:
        # no current context on this thread: the allocator makes CuPy's device current
        try:
            out.append(alloc(KiB).ptr)
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert isinstance(out[0], int) and out[0]


def test_statistics_follow_a_workload(cupy: fake.FakeCupy) -> None:
    with cm.MemoryPool(0) as pool:
        base = used(pool)
        with allocators.use_with_cupy(pool, cache=False):
            live = [cupy.cuda.alloc(n * KiB) for n in range(1, 40)]
            peak = used(pool)
            assert peak >= base + sum(range(1, 40)) * KiB
            del live[::2]
            assert base < used(pool) < peak
            live.clear()
        assert used(pool) == base
        assert pool.stats().used_high >= peak


# -- install and restore ------------------------------------------------------------------

def test_use_with_cupy_installs_and_restores(cupy: fake.FakeCupy) -> None:
    before = cupy.allocator
    with allocators.use_with_cupy() as alloc:
        assert cupy.allocator is alloc
        with cm.MemoryPool(0) as pool:
            with allocators.use_with_cupy(pool) as inner:
                assert cupy.allocator is inner
            assert cupy.allocator is alloc
    assert cupy.allocator == before
    with pytest.raises(KeyError), allocators.use_with_cupy():
        raise KeyError
    assert cupy.allocator == before


def test_use_with_cupy_pinned_restores(cupy: fake.FakeCupy) -> None:
    default = cupy.pinned_allocator
    with allocators.use_with_cupy(pinned=True):
        outer = cupy.pinned_allocator
        assert outer is not default
        p = cupy.cuda.alloc_pinned_memory(100)
        assert isinstance(p.mem, cm.HostBuffer)
        del p
        with cm.MemoryPool(location=cm.Location.host()) as hp:
            with allocators.use_with_cupy(pinned_pool=hp):
                q = cupy.cuda.alloc_pinned_memory(100)
                assert used(hp) >= 100
                del q
            assert cupy.pinned_allocator is outer
    assert cupy.pinned_allocator == default


def test_cupys_thread_local_allocator_refusal_changes_nothing(cupy: fake.FakeCupy) -> None:
    cupy.thread_local_allocator = object()
    before = cupy.allocator
    with pytest.raises(ValueError, match="using_allocator"), allocators.use_with_cupy():
        pass
    assert cupy.allocator == before


# -- bad input ----------------------------------------------------------------------------

def _refused(cupy: fake.FakeCupy, pool: object, error: type[Exception], match: str) -> None:
    before, before_pinned = cupy.allocator, cupy.pinned_allocator
    with pytest.raises(error, match=match):
        allocators.cupy_allocator(pool)  # type: ignore[arg-type]
    with pytest.raises(error, match=match), allocators.use_with_cupy(pool):  # type: ignore[arg-type]
        pass
    assert cupy.allocator == before and cupy.pinned_allocator == before_pinned


def test_refuses_a_closed_pool(cupy: fake.FakeCupy) -> None:
    pool = cm.MemoryPool(0)
    pool.close()
    _refused(cupy, pool, cm.ClosedError, "closed")
    assert issubclass(cm.ClosedError, ValueError)


def test_refuses_a_pool_of_another_device(cupy: fake.FakeCupy, two_devices: None) -> None:
    with cm.MemoryPool(1) as pool:
        _refused(cupy, pool, ValueError, "device 1.*current device is 0")
        with cupy.cuda.Device(1):
            alloc = allocators.cupy_allocator(pool)
            p = alloc(KiB)
        with pytest.raises(ValueError, match="current device is 0"):
            alloc(KiB)  # checked at each allocation too
        del p


def test_refuses_a_host_pool_for_device_memory(cupy: fake.FakeCupy) -> None:
    with cm.MemoryPool(location=cm.Location.host()) as pool:
        _refused(cupy, pool, TypeError, "pinned host")


@pytest.mark.parametrize("thing", [0, "default", cm.Device])
def test_refuses_what_is_not_a_pool(cupy: fake.FakeCupy, thing: object) -> None:
    _refused(cupy, thing, TypeError, "MemoryPool")


def test_refuses_an_imported_pool(cupy: fake.FakeCupy) -> None:
    import os

    with cm.MemoryPool(0, ipc=True) as pool:
        fd = pool.export()
        try:
            with cm.MemoryPool.import_(fd) as imported:
                _refused(cupy, imported, ValueError, "imported")
        finally:
            os.close(fd)


def test_pinned_allocator_refuses_device_pools(cupy: fake.FakeCupy) -> None:
    with cm.MemoryPool(0) as pool:
        with pytest.raises(TypeError, match="pinned host"):
            allocators.cupy_pinned_allocator(pool)
    with pytest.raises(TypeError, match="pinned host"):
        allocators.cupy_pinned_allocator("host")  # type: ignore[arg-type]
    hp = cm.MemoryPool(location=cm.Location.host())
    hp.close()
    with pytest.raises(cm.ClosedError):
        allocators.cupy_pinned_allocator(hp)
    with pytest.raises(TypeError, match="pinned must be a bool"), \
            allocators.use_with_cupy(pinned=1):  # type: ignore[arg-type]
        pass


# -- a pool closed under the framework --------------------------------------------------------

def test_pool_closed_while_cupy_holds_memory(cupy: fake.FakeCupy) -> None:
    pool = cm.MemoryPool(0)
    alloc = allocators.cupy_allocator(pool)
    p = alloc(KiB)
    with pytest.raises(BufferError):
        pool.close()  # the pool sees CuPy's live allocation
    pool.close(force=True)
    with pytest.raises(cm.ClosedError, match="was closed"):
        alloc(KiB)
    with pytest.warns(cm.MemkitWarning, match="closed"):
        del p
        gc.collect()


def test_closed_default_pool_wrapper_refuses(cupy: fake.FakeCupy) -> None:
    wrapper = cm.MemoryPool.default(0)
    alloc = allocators.cupy_allocator(wrapper)
    base = used(cm.MemoryPool.default(0))
    wrapper.close()
    with pytest.raises(cm.ClosedError, match="was closed"):
        alloc(KiB)
    assert used(cm.MemoryPool.default(0)) == base  # nothing left behind


def test_a_failed_free_warns_and_never_raises(cupy: fake.FakeCupy,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    alloc = allocators.cupy_allocator(cache=False)
    p = alloc(KiB)
    ptr = p.ptr
    real_free = _cache.FREE
    monkeypatch.setattr(_cache, "FREE", lambda d, s: (_driver_error(1),))
    with pytest.warns(cm.MemkitWarning, match=f"0x{ptr:x}"):
        del p
        gc.collect()
    monkeypatch.setattr(_cache, "FREE", real_free)
    from cuda.bindings import driver as cu

    real_free(cu.CUdeviceptr(ptr), cu.CUstream(0))  # the leak-checker wants it back


def _driver_error(code: int) -> Any:
    from cuda.bindings import driver as cu

    return cu.CUresult(code)


# -- the pinned allocator ----------------------------------------------------------------------

def test_pinned_allocations_reuse_pooled_blocks(cupy: fake.FakeCupy) -> None:
    alloc = allocators.cupy_pinned_allocator()
    p = alloc(3000)
    assert isinstance(p, fake.PinnedMemoryPointer) and p.size() == 3000 and p.ptr
    view = np.ctypeslib.as_array((ctypes.c_ubyte * 3000).from_address(p.ptr))
    view[:] = 7  # host memory
    assert _resource.account("pinned_pooled").live.get(p.ptr) == 3000
    ptr = p.ptr
    del p, view
    gc.collect()
    q = alloc(3000)
    assert q.ptr == ptr  # the block went back to the pinned pool's cache
    z = alloc(0)
    assert z.ptr == 0 and z.size() == 0


def test_pinned_allocations_from_a_given_pool(cupy: fake.FakeCupy) -> None:
    with cm.MemoryPool(location=cm.Location.host()) as hp:
        alloc = allocators.cupy_pinned_allocator(hp)
        p = alloc(2 << 20)  # larger than the block cache: straight from the pool
        assert used(hp) >= 2 << 20
        del p
        gc.collect()
        assert used(hp) == 0
