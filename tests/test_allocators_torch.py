"""The supported torch path (GPU): DLPack both ways, torch streams, pinned sources.

torch cannot take a pure-Python allocator (``CUDAPluggableAllocator`` needs a
compiled library), so there is no torch adaptor; these tests show the path
that works. Skipped on the simulator and where torch (with CUDA) is missing.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver

if _driver.backend_name() == "sim":
    pytest.skip("torch needs a GPU (simulator backend)", allow_module_level=True)
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch has no CUDA device", allow_module_level=True)

MiB = 1 << 20

pytestmark = pytest.mark.framework_kernels


@pytest.fixture(scope="module", autouse=True)
def warm() -> Iterator[None]:
    torch.ones(1, device="cuda").sum().item()  # torch's context and caching allocator
    cm.MemoryPool.default_pinned()
    cm.HostBuffer.pooled(1).close()
    yield


@pytest.fixture(autouse=True)
def settle() -> Iterator[None]:
    yield
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    cm.MemoryPool.default_pinned().trim()


def test_memkit_memory_into_torch_by_dlpack() -> None:
    s = torch.cuda.Stream()
    with cm.MemoryPool(0) as pool:
        buf = pool.allocate(4 * MiB, stream=s)  # a torch stream as stream=
        assert buf.stream == s.cuda_stream
        t = torch.from_dlpack(buf.as_array(np.float32, (MiB,)))
        assert t.data_ptr() == buf.ptr and t.device.type == "cuda"
        with torch.cuda.stream(s):
            t.copy_(torch.arange(MiB, dtype=torch.float32, device="cuda"))
            total = t.sum().item()
        assert total == pytest.approx(MiB * (MiB - 1) / 2, rel=1e-6)
        assert pool.stats().used_current >= 4 * MiB
        del t
        s.synchronize()
        buf.free()


def test_torch_tensors_into_memkit() -> None:
    t = torch.arange(1000, dtype=torch.float64, device="cuda")
    v = cm.Stream.from_handle(torch.cuda.current_stream().cuda_stream)
    with cm.HostBuffer.empty(1000, np.float64) as h:
        cm.copy(h, t, stream=v)  # __cuda_array_interface__ / DLPack source
        v.synchronize()
        np.testing.assert_array_equal(h.array, np.arange(1000))
    with cm.MemoryPool(0) as pool:
        buf = pool.allocate(t.nbytes, stream=v)
        cm.copy(buf, t, stream=v)
        back = torch.from_dlpack(buf.as_array(np.float64, (1000,)))
        assert torch.equal(back, t)
        del back
        v.synchronize()
        buf.free()


@pytest.mark.parametrize("kind", ["empty", "pooled"])
def test_pinned_sources_for_non_blocking_copies(kind: str) -> None:
    n = 1 << 20
    h = cm.HostBuffer.empty(n, np.float32) if kind == "empty" else cm.HostBuffer.pooled(n * 4)
    arr = h.array.view(np.float32)
    arr[:] = np.arange(n, dtype=np.float32)
    th = torch.from_numpy(arr)
    assert th.is_pinned()  # torch sees page-locked memory: non_blocking copies are async
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        d = th.to("cuda", non_blocking=True)
        total = d.sum()
    s.synchronize()
    assert total.item() == pytest.approx(n * (n - 1) / 2, rel=1e-6)
    del th, arr, d
    h.close()
