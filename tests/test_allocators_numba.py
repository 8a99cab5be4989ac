"""numba-cuda on memkit through the EMM plugin, for real (GPU).

Skipped on the simulator and where numba-cuda is not importable. The kernel
test is skipped, saying why, where this numba cannot compile kernels (the GPU
image's numba-cuda with numpy 2.5); numba's own memory tests run through
``scripts/run_numba_suite.py``.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit import allocators
from cuda_memkit._core import _driver, _resource

if _driver.backend_name() == "sim":
    pytest.skip("numba-cuda needs a GPU (simulator backend)", allow_module_level=True)
nbcuda = pytest.importorskip("numba.cuda")
nbcuda_errors = pytest.importorskip("numba.cuda.core.errors")
if not nbcuda.is_available():
    pytest.skip("numba-cuda finds no usable GPU", allow_module_level=True)

KiB, MiB = 1 << 10, 1 << 20

pytestmark = pytest.mark.framework_kernels


@pytest.fixture(scope="module", autouse=True)
def context() -> Iterator[Any]:
    """numba's context and the pinned pool, made before the leak check's snapshots."""
    ctx = nbcuda.current_context()
    cm.MemoryPool.default_pinned()
    cm.HostBuffer.pooled(1).close()
    nbcuda.to_device(np.zeros(1))  # numba's own first-use allocations
    yield ctx


@pytest.fixture(autouse=True)
def settle() -> Iterator[None]:
    yield
    gc.collect()
    nbcuda.synchronize()
    cm.MemoryPool.default(0).trim()
    cm.MemoryPool.default_pinned().trim()


@pytest.fixture
def pool() -> Iterator[cm.MemoryPool]:
    p = cm.MemoryPool(0, release_threshold=64 * MiB)
    yield p
    gc.collect()
    nbcuda.synchronize()
    p.close()


def test_device_arrays_come_from_the_pool(pool: cm.MemoryPool) -> None:
    host = np.arange(100_000, dtype=np.float64)
    with allocators.use_with_numba(pool) as mgr:
        assert nbcuda.current_context().memory_manager is mgr
        d = nbcuda.to_device(host)
        e = nbcuda.device_array_like(host)
        e.copy_to_device(d)
        assert pool.stats().used_current >= 2 * host.nbytes
        sl = e[10:20]  # a view keeps the allocation alive
        del e
        gc.collect()
        np.testing.assert_array_equal(sl.copy_to_host(), host[10:20])
        np.testing.assert_array_equal(d.copy_to_host(), host)
        del d, sl
        gc.collect()
        nbcuda.synchronize()
        assert pool.stats().used_current == 0
    assert not isinstance(nbcuda.current_context().memory_manager, type(mgr))


def test_pinned_mapped_and_managed_host_arrays(pool: cm.MemoryPool) -> None:
    with allocators.use_with_numba(pool):
        p = nbcuda.pinned_array(1000, dtype=np.float32)
        p[:] = np.arange(1000)
        d = nbcuda.to_device(p)
        np.testing.assert_array_equal(d.copy_to_host(), p)
        m = nbcuda.mapped_array(1000, dtype=np.int32)
        m[:] = 7
        # numba's own MappedNDArray cannot be copied from or to (no ``_dummy`` /
        # ``alloc_size`` in numba-cuda): check that the memory is memkit's
        # mapped pinned memory, which the device can address.
        assert _resource.account("pinned").live.get(m.ctypes.data) == m.nbytes or \
            _resource.account("pinned_pooled").live.get(m.ctypes.data) == m.nbytes
        np.testing.assert_array_equal(np.asarray(m), 7)
        g = nbcuda.managed_array(1000, dtype=np.float64)
        g[:] = 2.5  # managed memory from memkit (numba's ManagedNDArray cannot be copied:
        assert _resource.account("managed", 0).live.get(g.ctypes.data) == g.nbytes  # alloc_size)
        np.testing.assert_array_equal(np.asarray(g), 2.5)
        del p, d, m, g


def test_pinning_existing_memory(pool: cm.MemoryPool) -> None:
    a = np.arange(1 << 18, dtype=np.float64)
    with allocators.use_with_numba(pool):
        with nbcuda.pinned(a):
            with pytest.raises(cm.CudaHostMemoryAlreadyRegisteredError):
                cm.register_host(a)
            s = nbcuda.stream()
            d = nbcuda.to_device(a, stream=s)
            d.copy_to_host(a, stream=s)
            s.synchronize()
        cm.register_host(a).close()  # unpinned again
        with nbcuda.mapped(a) as m:
            assert m.shape == a.shape


def test_memory_info_and_reset(pool: cm.MemoryPool) -> None:
    with allocators.use_with_numba(pool) as mgr:
        ctx = nbcuda.current_context()
        info = ctx.get_memory_info()
        free, total = cm.Device(0).mem_info()
        assert info.total == total and info.free >= free * 0.9
        keep = nbcuda.device_array(1 << 20, dtype=np.uint8)
        assert pool.stats().used_current >= MiB
        mgr.reset()
        nbcuda.synchronize()
        assert pool.stats().used_current == 0
        del keep


def test_a_kernel_through_the_plugin(pool: cm.MemoryPool) -> None:
    try:
        @nbcuda.jit
        def axpy(out: Any, x: Any, y: Any) -> None:  # pragma: no cover - runs on the GPU
            i = nbcuda.grid(1)
            if i < out.size:
                out[i] = 2.0 * x[i] + y[i]

        probe = nbcuda.device_array(1 << 16, dtype=np.float32)
        with warnings.catch_warnings():  # numba warns about low occupancy below ~2 blocks/SM
            warnings.simplefilter("ignore", nbcuda_errors.NumbaPerformanceWarning)
            axpy[256, 256](probe, probe, probe)
    except Exception as exc:  # the GPU image's numba cannot compile with its numpy
        if "row_stack" in str(exc) or isinstance(exc, AttributeError):
            pytest.skip(f"numba cannot compile kernels here: {type(exc).__name__}: {exc}")
        raise
    x = np.arange(4096, dtype=np.float32)
    with allocators.use_with_numba(pool):
        dx, dy = nbcuda.to_device(x), nbcuda.to_device(x)
        out = nbcuda.device_array_like(x)
        with warnings.catch_warnings():  # numba's low-occupancy warning (16 blocks)
            warnings.simplefilter("ignore", nbcuda_errors.NumbaPerformanceWarning)
            axpy[16, 256](out, dx, dy)
        np.testing.assert_array_equal(out.copy_to_host(), 3 * x)
        assert pool.stats().used_current >= 3 * x.nbytes
        del dx, dy, out


def _child_sum(handle: Any, queue: Any) -> None:  # pragma: no cover - another process
    try:
        os.environ["NUMBA_CUDA_MEMORY_MANAGER"] = "cuda_memkit.allocators.numba"
        with handle as arr:
            queue.put(float(arr.copy_to_host().sum()))
    except BaseException as exc:
        queue.put(repr(exc))


def test_ipc_through_pool_export() -> None:
    with cm.MemoryPool(0, ipc=True) as pool, allocators.use_with_numba(pool):
        a = np.arange(1000, dtype=np.float64)
        d = nbcuda.to_device(a)
        handle = d.get_ipc_handle()
        mp = multiprocessing.get_context("spawn")
        queue = mp.Queue()
        proc = mp.Process(target=_child_sum, args=(handle, queue))
        proc.start()
        got = queue.get(timeout=120)
        proc.join(60)
        assert got == a.sum(), got
        del handle, d
        gc.collect()
        nbcuda.synchronize()
