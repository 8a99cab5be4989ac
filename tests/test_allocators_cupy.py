"""CuPy on memkit pools, for real: workloads under the adaptors on a GPU.

Skipped on the simulator (CuPy needs a GPU) and where CuPy is not importable.
Every allocation CuPy makes goes through a recording wrapper around the
adaptor, and each pointer is checked to belong to the memkit pool
(``CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE``).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit import allocators
from cuda_memkit._core import _driver, _resource

from . import _sanitizer

if _driver.backend_name() == "sim":
    pytest.skip("CuPy needs a GPU (simulator backend)", allow_module_level=True)
cupy = pytest.importorskip("cupy")

from cuda.bindings import driver as cu  # noqa: E402

MiB = 1 << 20

pytestmark = pytest.mark.framework_kernels


def pool_of(ptr: int) -> int:
    """The memory pool an address belongs to (0: none)."""
    attr = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE
    return int(_driver.call("cuPointerGetAttribute", attr, ptr))


class Recorder:
    """Wraps an installed allocator: every request, and the pool of every pointer."""

    def __init__(self, inner: Callable[[int], Any]) -> None:
        self.inner = inner
        self.sizes: list[int] = []
        self.pools: set[int] = set()

    def __call__(self, size: int) -> Any:
        p = self.inner(size)
        self.sizes.append(size)
        if p.ptr:
            self.pools.add(pool_of(p.ptr))
        return p


def _release_cupy_caches() -> None:
    """Drop what CuPy caches between calls (FFT plans and their work areas, random states)."""
    _sanitizer.release()  # frames CuPy keeps under compute-sanitizer (only there)
    gc.collect()
    cupy.fft.config.get_plan_cache().clear()
    cupy.random.reset_states()
    gc.collect()
    cupy.cuda.Device().synchronize()


def _holders(acct: Any) -> str:
    """Who keeps the CuPy memory objects of ``acct`` alive (for the failure message)."""
    out = []
    for obj in gc.get_objects():
        if type(obj).__qualname__ == "CupyMemory" and obj._d in acct.live:
            refs = [type(r).__name__ for r in gc.get_referrers(obj)][:4]
            out.append(f"{obj!r} held by {refs}")
    return "; ".join(out) or "no CuPy memory object found"


def _workload(xp: Any, rng: np.random.Generator) -> dict[str, Any]:
    """The same computations on numpy (xp=np) or on CuPy (results brought back)."""
    a = rng.standard_normal((256, 192)).astype(np.float32)
    b = rng.standard_normal((192, 128)).astype(np.float32)
    v = rng.standard_normal(1 << 16).astype(np.float32)
    sig = rng.standard_normal(4096) + 1j * rng.standard_normal(4096)
    A, B, V, S = (xp.asarray(t) for t in (a, b, v, sig))
    out = {"matmul": A @ B, "fft": xp.fft.fft(S), "ifft2": xp.fft.ifft2(S.reshape(64, 64)),
           "rfft": xp.fft.rfft(V), "sort": xp.sort(V),
           "argsort": V[xp.argsort(V)],  # the values: ties may come in either order
           "sum": V.sum(), "max": A.max(axis=0), "mean": B.mean(), "std": V.std(),
           "cumsum": xp.cumsum(V[:1000])}
    if xp is np:
        out["kernel"] = a * 2.0 + b[:1, :1]
    else:
        kernel = cupy.ElementwiseKernel("float32 x, float32 y", "float32 z",
                                        "z = x * 2.0f + y", "memkit_axpy_test")
        out["kernel"] = kernel(A, B[:1, :1])
    return {k: (cupy.asnumpy(x) if xp is not np else np.asarray(x)) for k, x in out.items()}


@pytest.fixture(scope="module", autouse=True)
def warm() -> Iterator[None]:
    """Load CuPy's libraries (cuBLAS, cuFFT, cuRAND, kernels) before the leak check's snapshots."""
    cm.Device(0).set_current()
    with allocators.use_with_cupy():
        _workload(cupy, np.random.default_rng(0))
        cupy.random.default_rng(1).random(10)
        cupy.random.RandomState(1).standard_normal(10)
        cupy.cuda.Device().synchronize()
    _settle()
    yield
    _settle()


def _settle() -> None:
    _sanitizer.release()  # frames CuPy keeps under compute-sanitizer (only there)
    gc.collect()
    cupy.fft.config.get_plan_cache().clear()  # plans hold work areas from the allocator
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()
    cupy.cuda.Device().synchronize()
    for d in range(cm.device_count()):
        cm.MemoryPool.default(d).trim()


@pytest.fixture(autouse=True)
def settle() -> Iterator[None]:
    yield
    _settle()


@pytest.fixture(params=["default pool", "memkit pool"])
def pool(request: pytest.FixtureRequest) -> Iterator[cm.MemoryPool | None]:
    if request.param == "default pool":
        yield None
        return
    p = cm.MemoryPool(0, release_threshold=64 * MiB)
    yield p
    _sanitizer.release()  # frames CuPy keeps under compute-sanitizer (only there)
    gc.collect()
    cupy.cuda.Device().synchronize()
    p.close()


def test_workloads_match_numpy_with_every_allocation_from_the_pool(
        pool: cm.MemoryPool | None) -> None:
    expect = _workload(np, np.random.default_rng(7))
    target = pool if pool is not None else cm.MemoryPool.default(0)
    before_cupy = cupy.get_default_memory_pool().total_bytes()
    with allocators.use_with_cupy(pool) as installed:
        rec = Recorder(installed)
        cupy.cuda.set_allocator(rec)
        got = _workload(cupy, np.random.default_rng(7))
        g = cupy.random.default_rng(42)
        r1 = cupy.asnumpy(g.random(1 << 16))
        r2 = cupy.asnumpy(cupy.random.default_rng(42).random(1 << 16))
        n = cupy.asnumpy(cupy.random.RandomState(3).standard_normal(1 << 16))
        cupy.cuda.Device().synchronize()
        del g
    assert cupy.get_default_memory_pool().total_bytes() == before_cupy  # CuPy's pool unused
    assert rec.sizes and rec.pools == {target.handle}, (rec.pools, target.handle)
    for key, want in expect.items():
        # float32 sums, products and transforms: cuBLAS/cuFFT round differently from numpy
        tol = 1e-3 if key in ("matmul", "std", "sum", "mean", "cumsum", "kernel", "fft",
                              "rfft", "ifft2") else 1e-6
        scale = float(np.max(np.abs(want))) if np.size(want) else 1.0
        np.testing.assert_allclose(got[key], want, rtol=tol, atol=tol * max(scale, 1.0),
                                   err_msg=key)
    del got
    _release_cupy_caches()
    left = _resource.account("pool", 0, target.handle)
    assert not left.live, f"CuPy still holds {sorted(left.live.values())} from the pool: " \
        + _holders(left)
    assert np.array_equal(r1, r2) and 0 <= r1.min() and r1.max() < 1
    assert abs(r1.mean() - 0.5) < 0.01 and abs(n.mean()) < 0.02 and abs(n.std() - 1) < 0.02
    print(f"{len(rec.sizes)} CuPy allocations, {rec.sizes.count(0)} of 0 bytes")


@pytest.mark.parametrize("cache", [True, False])
def test_statistics_follow_cupys_arrays(cache: bool) -> None:
    def held(pool: cm.MemoryPool) -> int:  # the driver counts cached blocks as used
        return pool.stats().used_current - pool.cached_bytes

    with cm.MemoryPool(0, release_threshold=64 * MiB) as pool:
        base = held(pool)
        with allocators.use_with_cupy(pool, cache=cache):
            arrays = [cupy.ones(n * 1000, dtype=cupy.float32) for n in range(1, 30)]
            cupy.cuda.Device().synchronize()
            live = held(pool)
            assert live >= base + sum(a.nbytes for a in arrays)
            assert cm.memory_stats(0).pool(pool).current == sum(a.nbytes for a in arrays)
            del arrays[::2]
            gc.collect()
            assert base < held(pool) < live
            arrays.clear()
            gc.collect()
            cupy.cuda.Device().synchronize()
            assert held(pool) == base and cm.memory_stats(0).pool(pool).current == 0
            assert (pool.cached_bytes > 0) is cache
        assert pool.stats().used_high >= live


def test_cupy_asks_for_zero_bytes_and_gets_null() -> None:
    with allocators.use_with_cupy() as installed:
        p = installed(0)
        assert p.ptr == 0 and p.device_id == 0
        empty = cupy.empty(0, dtype=cupy.float32)
        assert empty.size == 0
        x = cupy.fft.fft(cupy.arange(8, dtype=cupy.complex64))  # the call that broke naive adaptors
        np.testing.assert_allclose(cupy.asnumpy(x), np.fft.fft(np.arange(8)), atol=1e-4)


def test_ordered_on_cupys_current_stream() -> None:
    s = cupy.cuda.Stream(non_blocking=True)
    with allocators.use_with_cupy() as installed, s:
        p = installed(MiB)
        assert p.mem._owner is s  # the memory keeps its stream alive
        x = cupy.arange(1 << 20, dtype=cupy.float32)
        y = (x * 3).sum()
        assert float(y) == pytest.approx(3 * (1 << 20) * ((1 << 20) - 1) / 2, rel=1e-5)
        del p, x
    s.synchronize()


def test_graph_capture() -> None:
    if not hasattr(cupy.cuda.Stream, "begin_capture"):
        pytest.skip("this CuPy cannot capture graphs")
    s = cupy.cuda.Stream(non_blocking=True)
    with allocators.use_with_cupy(), s:
        x = cupy.arange(1024, dtype=cupy.float32)
        s.begin_capture()
        y = x * 2 + 1  # allocated while capturing: a graph allocation on the capturing stream
        graph = s.end_capture()
        graph.launch(s)
        s.synchronize()
        np.testing.assert_array_equal(cupy.asnumpy(y), np.arange(1024) * 2 + 1)
        del y, graph, x
    s.synchronize()


def test_pinned_memory_from_the_memkit_pinned_pool() -> None:
    import cupyx

    with allocators.use_with_cupy(pinned=True):
        h = cupyx.empty_pinned((1 << 16,), dtype=np.float32)
        mem = h.base.mem if hasattr(h.base, "mem") else None
        assert isinstance(mem, cm.HostBuffer), type(h.base)
        h[:] = np.arange(1 << 16, dtype=np.float32)
        s = cupy.cuda.Stream(non_blocking=True)
        d = cupy.empty_like(h)
        d.set(h, stream=s)  # an asynchronous copy from pinned memory
        back = cupyx.empty_pinned((1 << 16,), dtype=np.float32)
        d.get(stream=s, out=back)
        s.synchronize()
        np.testing.assert_array_equal(back, h)
        del h, back, d, mem


def test_bad_pools_leave_the_allocator_untouched() -> None:
    before = cupy.cuda.get_allocator()
    closed = cm.MemoryPool(0)
    closed.close()
    with cm.MemoryPool(location=cm.Location.host()) as host:
        for pool, error in [(closed, ValueError), (host, TypeError), ("x", TypeError)]:
            with pytest.raises(error), allocators.use_with_cupy(pool):  # type: ignore[arg-type]
                pass
            assert cupy.cuda.get_allocator() is before


def test_another_devices_pool(two_devices: None) -> None:
    with cm.MemoryPool(1) as pool:
        with pytest.raises(ValueError, match="current device"), allocators.use_with_cupy(pool):
            pass
        with cupy.cuda.Device(1), allocators.use_with_cupy(pool):
            x = cupy.arange(10)
            assert x.device.id == 1 and pool_of(x.data.ptr) == pool.handle
            del x
            cupy.cuda.Device(1).synchronize()


def test_default_pools_follow_the_current_device(two_devices: None) -> None:
    with allocators.use_with_cupy():
        for dev in (0, 1):
            with cupy.cuda.Device(dev):
                x = cupy.zeros(100)
                assert pool_of(x.data.ptr) == cm.MemoryPool.default(dev).handle
                del x


def test_freeing_after_the_pool_was_closed_warns() -> None:
    pool = cm.MemoryPool(0)
    with allocators.use_with_cupy(pool):
        x = cupy.ones(1000)
        cupy.cuda.Device().synchronize()
        pool.close(force=True)
        with pytest.raises(cm.ClosedError):
            cupy.ones(10)
        with pytest.warns(cm.MemkitWarning, match="closed"):
            del x
            gc.collect()
    cupy.cuda.Device().synchronize()
