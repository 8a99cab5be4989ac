"""DLPack consumers keep memory alive past ``close()``, on a real GPU.

What the simulator cannot decide: numpy, CuPy and torch consume DLPack
capsules of every exporting kind; after the buffer's ``close()`` (or a pool
buffer's ``close()``) the consumer's array must still be backed by our
allocation, GPU kernels writing it must stay inside live memory (run under
``compute-sanitizer --tool memcheck``: 0 errors), and the memory must go
when the consumer's array goes. Skipped on the simulator (no consumer runs
kernels there) and where a framework is missing.
"""

from __future__ import annotations

import copy
import gc
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver, _resource

from . import _sanitizer

if _driver.backend_name() == "sim":
    pytest.skip("DLPack consumers running kernels need a GPU (simulator backend)",
                allow_module_level=True)

pytestmark = pytest.mark.framework_kernels

N = 1 << 20  # float32 elements: 4 MiB, enough for a kernel to touch many pages


def live_keys() -> set[int]:
    return {int(key) for _a, key, _n in _resource.live_allocations()}  # type: ignore[call-overload]


def _device_kinds(stream: cm.Stream) -> dict[str, Callable[[], Any]]:
    return {
        "DeviceBuffer": lambda: cm.DeviceBuffer.empty(4 * N),
        "ManagedBuffer": lambda: cm.ManagedBuffer.zeros(N, np.float32),
        "device PoolBuffer": lambda: cm.MemoryPool.default(0).allocate(4 * N, stream=stream),
        "managed PoolBuffer": lambda: _managed_pool().allocate(4 * N, stream=stream),
    }


_POOLS: list[cm.MemoryPool] = []


def _managed_pool() -> cm.MemoryPool:
    pool = cm.MemoryPool(managed=True)
    _POOLS.append(pool)
    return pool


@pytest.fixture(autouse=True)
def _close_pools() -> Iterator[None]:
    yield
    gc.collect()
    while _POOLS:
        _POOLS.pop().close()


KINDS = ["DeviceBuffer", "ManagedBuffer", "device PoolBuffer", "managed PoolBuffer"]


def _check_kept_then_freed(buf: Any, consume: Callable[[Any], Any],
                           bump: Callable[[Any], None], read: Callable[[Any], float],
                           stream: cm.Stream) -> None:
    """Consume ``buf`` by DLPack, close it, run a kernel on the consumer's array, drop it."""
    stream.synchronize()
    ptr = buf.ptr
    x = consume(buf)
    buf.close()
    assert buf.closed and ptr in live_keys(), "close() freed memory a DLPack consumer holds"
    # A newcomer must not get the address while the consumer holds it.
    other = cm.DeviceBuffer.empty(4 * N)
    assert not (ptr <= other.ptr < ptr + 4 * N)
    bump(x)  # a kernel writing every element: memcheck reports it if the memory were freed
    assert read(x) == float(N)
    other.close()
    del x
    _sanitizer.release()  # frames a framework keeps under compute-sanitizer (only there)
    gc.collect()
    assert ptr not in live_keys(), "the last consumer is gone: the memory must be freed"


@pytest.mark.uses_managed_memory
@pytest.mark.parametrize("kind", KINDS)
def test_cupy_consumer_keeps_memory(kind: str, stream: cm.Stream) -> None:
    cupy = pytest.importorskip("cupy")
    buf = _device_kinds(stream)[kind]()
    cm.copy(buf, np.zeros(N, np.float32))

    def consume(b: Any) -> Any:
        return cupy.from_dlpack(b.as_array(np.float32, N))

    def bump(x: Any) -> None:
        x += 1
        cupy.cuda.Device().synchronize()

    _check_kept_then_freed(buf, consume, bump, lambda x: float(x.sum()), stream)


@pytest.mark.parametrize("kind", ["DeviceBuffer", "device PoolBuffer"])  # device memory
def test_torch_consumer_keeps_memory(kind: str, stream: cm.Stream) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    buf = _device_kinds(stream)[kind]()
    cm.copy(buf, np.zeros(N, np.float32))

    def consume(b: Any) -> Any:
        return torch.from_dlpack(b.as_array(np.float32, N))

    def bump(x: Any) -> None:
        x.add_(1)
        torch.cuda.synchronize()

    _check_kept_then_freed(buf, consume, bump, lambda x: float(x.sum().item()), stream)


@pytest.mark.uses_managed_memory
@pytest.mark.parametrize("kind", ["ManagedBuffer", "managed PoolBuffer"])
def test_numpy_consumer_of_managed_memory_keeps_it(kind: str, stream: cm.Stream) -> None:
    buf = _device_kinds(stream)[kind]()
    cm.copy(buf, np.zeros(N, np.float32))

    def bump(x: Any) -> None:
        # cuMemcpy into the consumer's memory (numpy marks DLPack imports read-only).
        cm.copy(int(x.ctypes.data), np.ones(N, np.float32), nbytes=4 * N)

    _check_kept_then_freed(buf, lambda b: np.from_dlpack(b.as_array(np.float32, N)), bump,
                           lambda x: float(x.sum()), stream)


def test_cupy_allocator_memory_refuses_copy() -> None:
    cupy = pytest.importorskip("cupy")
    from cuda_memkit import allocators

    with allocators.use_with_cupy():
        x = cupy.zeros(1024, cupy.float32)
        mem = x.data.mem
        for action in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match="cannot be"):
                action(mem)
        del x, mem
    _sanitizer.release()
    gc.collect()


def test_a_pooled_block_closed_under_a_copy_is_not_lent_again(stream: cm.Stream) -> None:
    """The real race behind test_ownership's close-during-copy tests: a pooled block closed
    while a queued copy still reads it must not be handed to the next ``pooled()``, whose
    host write would land in the copy."""
    big = 256 << 20
    with cm.HostBuffer.empty(big) as slow_src, cm.DeviceBuffer.empty(big) as slow_dst, \
            cm.DeviceBuffer.empty(1 << 20) as dev:
        h = cm.HostBuffer.pooled(1 << 20)
        h.array[:] = 1
        cm.copy_async(slow_dst, slow_src, stream=stream)  # ~5 ms: our copy waits behind it
        cm.copy_async(dev, h, stream=stream)
        ptr = h.ptr
        h.close()
        again = cm.HostBuffer.pooled(1 << 20)
        try:
            assert again.ptr != ptr
            again.array[:] = 2  # the host writes the block it was given, at once
            stream.synchronize()
            assert (dev.to_numpy() == 1).all()
        finally:
            again.close()
    assert ptr not in live_keys()
