"""copy_batch's kernel path: every direction and method, what "auto" picks, faults, the loader.

On the GPU these run the shipped PTX (``cuda_memkit/kernels/block_copy.ptx``);
on the simulator its numpy twin (``cuda_memkit/sim/_kernels.py``). The
"only the given blocks" tests are the kernel's bounds check on the GPU (and
run under compute-sanitizer memcheck with the rest of the suite).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _driver
from cuda_memkit._transfer import _kernels
from cuda_memkit._transfer._copy_batch import CopyBatch, copy_batch

from ._helpers import record_calls
from ._peer import no_peer_access

KiB = 1 << 10
B = 4 * KiB
N = 64
METHODS = ("auto", "kernel", "driver")


def pattern(n: int, seed: int = 1) -> np.ndarray:
    return ((np.arange(n, dtype=np.uint64) * 2654435761 + seed) % 251).astype(np.uint8)


def launches(calls: list[tuple[str, Any]]) -> int:
    return sum(api == "cuLaunchKernel" for api, _ in calls)


def batches(calls: list[tuple[str, Any]]) -> int:
    return sum(api in ("cuMemcpyBatchAsync", "cuMemcpyAsync") for api, _ in calls)


def read(obj: Any) -> np.ndarray:
    if isinstance(obj, cm.HostBuffer):
        return obj.array.copy()
    return obj.to_numpy()


@pytest.fixture
def host() -> Iterator[cm.HostBuffer]:
    h = cm.HostBuffer.from_array(pattern(N * B))
    yield h
    h.close()


@pytest.fixture
def host_out() -> Iterator[cm.HostBuffer]:
    h = cm.HostBuffer.from_array(np.full(N * B, 0xEE, np.uint8))
    yield h
    h.close()


@pytest.fixture
def dev() -> Iterator[cm.DeviceBuffer]:
    d = cm.DeviceBuffer.empty(N * B)
    cm.copy(d, pattern(N * B, 5))
    yield d
    d.close()


@pytest.fixture
def dev_out() -> Iterator[cm.DeviceBuffer]:
    d = cm.DeviceBuffer.empty(N * B)
    d.fill(0xEE)
    yield d
    d.close()


@pytest.fixture
def perm() -> np.ndarray:
    return np.random.default_rng(11).permutation(N)


def _pair(direction: str, host: cm.HostBuffer, host_out: cm.HostBuffer, dev: cm.DeviceBuffer,
          dev_out: cm.DeviceBuffer) -> tuple[Any, Any]:
    return {"h2d": (dev_out, host), "d2h": (host_out, dev), "d2d": (dev_out, dev)}[direction]


# -- data, every direction and method ---------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("direction", ["h2d", "d2h", "d2d"])
@pytest.mark.parametrize("use_stream", [False, True])
def test_scattered_blocks_every_direction(direction: str, method: str, use_stream: bool,
                                          host: cm.HostBuffer, host_out: cm.HostBuffer,
                                          dev: cm.DeviceBuffer, dev_out: cm.DeviceBuffer,
                                          perm: np.ndarray, stream: cm.Stream,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    dst, src = _pair(direction, host, host_out, dev, dev_out)
    src_bytes = read(src).reshape(N, B)
    d_off, s_off = perm[: N // 2] * B, np.arange(0, N, 2) * B  # scattered on both sides
    with record_calls(monkeypatch) as calls:
        copy_batch(dst, src, dst_offsets=d_off, src_offsets=s_off, sizes=B, method=method,
                   stream=stream if use_stream else None)
        if use_stream:
            stream.synchronize()
    got = read(dst).reshape(N, B)
    assert (got[perm[: N // 2]] == src_bytes[::2]).all()
    untouched = np.setdiff1d(np.arange(N), perm[: N // 2])
    assert (got[untouched] == 0xEE).all()
    kernel = method != "driver"  # 4 KiB blocks: "auto" takes the kernel
    assert launches(calls) == (1 if kernel else 0)
    assert (batches(calls) > 0) == (not kernel)


@pytest.mark.parametrize("direction", ["h2d", "d2h", "d2d"])
def test_only_the_given_bytes_change(direction: str, host: cm.HostBuffer,
                                     host_out: cm.HostBuffer, dev: cm.DeviceBuffer,
                                     dev_out: cm.DeviceBuffer) -> None:
    """Odd offsets and sizes (byte heads and tails, every vector width): nothing else moves."""
    dst, src = _pair(direction, host, host_out, dev, dev_out)
    src_bytes = read(src)
    rng = np.random.default_rng(3)
    # disjoint destination slots of 5000 bytes, blocks of 1..4999 bytes at odd places in them
    slots = rng.permutation(N * B // 5000 - 1)[:40]
    sizes = np.concatenate(([1, 2, 3, 15, 16, 17, 31, 33, 4096, 4999],
                            rng.integers(1, 4999, 30)))
    d_off = slots * 5000 + rng.integers(0, 5000 - sizes)
    s_off = rng.integers(0, N * B - 5000, len(sizes))
    # alignment cases: equal residues mod 16, mod 8, mod 4, and none
    d_off[:4] = slots[:4] * 5000 + np.array([16, 24, 36, 1])
    s_off[:4] = np.array([32, 8, 4, 2]) + 4096
    copy_batch(dst, src, dst_offsets=d_off, src_offsets=s_off, sizes=sizes, method="kernel")
    want = np.full(N * B, 0xEE, np.uint8)
    for d, s, z in zip(d_off, s_off, sizes, strict=True):
        want[d:d + z] = src_bytes[s:s + z]
    got = read(dst)
    assert (got == want).all(), f"{int((got != want).sum())} bytes differ"


def test_large_blocks_and_many_blocks(host: cm.HostBuffer, dev_out: cm.DeviceBuffer) -> None:
    """Blocks of 64 KiB (several passes of a CTA) and 1-byte blocks (many per group)."""
    copy_batch(dev_out, host, dst_offsets=[0, 2 * 64 * KiB], src_offsets=[64 * KiB, 0],
               sizes=64 * KiB, method="kernel")
    got = dev_out.to_numpy()
    h = host.array
    assert (got[: 64 * KiB] == h[64 * KiB: 128 * KiB]).all()
    assert (got[128 * KiB: 192 * KiB] == h[: 64 * KiB]).all()
    assert (got[64 * KiB: 128 * KiB] == 0xEE).all()
    offs = np.arange(0, 2 * 4096, 2)  # 4096 single bytes, every other byte
    copy_batch(dev_out, host, dst_offsets=offs + 200 * KiB, src_offsets=offs, sizes=1,
               method="kernel")
    got = dev_out.to_numpy()[200 * KiB: 200 * KiB + 2 * 4096]
    assert (got[::2] == h[: 2 * 4096: 2]).all() and (got[1::2] == 0xEE).all()


@pytest.mark.parametrize("as_array", [False, True])
def test_triples_through_the_kernel(host: cm.HostBuffer, dev_out: cm.DeviceBuffer,
                                    as_array: bool) -> None:
    triples = [(0, 4096, 100), (8192, 0, 4096), (20000, 777, 3)]
    blocks = np.array(triples) if as_array else triples
    copy_batch(dev_out, host, blocks=blocks, method="kernel")
    want = np.full(N * B, 0xEE, np.uint8)
    for d, s, z in triples:
        want[d:d + z] = host.array[s:s + z]
    assert (dev_out.to_numpy() == want).all()


def test_registered_and_pinned_numpy_views(dev_out: cm.DeviceBuffer, host: cm.HostBuffer
                                           ) -> None:
    arr = pattern(N * B, 9)
    with cm.register_host(arr):
        copy_batch(dev_out, arr, dst_offsets=[B], src_offsets=[3 * B], sizes=B, method="kernel")
        back = np.zeros(N * B, np.uint8)
        with cm.register_host(back):
            copy_batch(back, dev_out, dst_offsets=[0], src_offsets=[B], sizes=B, method="kernel")
    assert (back[:B] == arr[3 * B: 4 * B]).all()
    view = host.array[B:]  # a numpy view of a HostBuffer is pinned
    copy_batch(dev_out, view, dst_offsets=[0], src_offsets=[0], sizes=B, method="kernel")
    assert (dev_out.to_numpy()[:B] == host.array[B: 2 * B]).all()


def test_copy_batch_object_mixes_kernel_and_driver(host: cm.HostBuffer, host_out: cm.HostBuffer,
                                                   dev: cm.DeviceBuffer,
                                                   dev_out: cm.DeviceBuffer,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    b = CopyBatch()
    b.add(dev_out, host, dst_offsets=[0, 2 * B], src_offsets=[B, 0], sizes=B)  # kernel
    b.add(host_out, dev, dst_offsets=[0], src_offsets=[0], sizes=N * B // 2)  # driver (big)
    page = np.zeros(N * B, np.uint8)
    b.add(page, dev, dst_offsets=[0], src_offsets=[B], sizes=B)  # pageable: driver
    with record_calls(monkeypatch) as calls:
        b.execute()
    assert launches(calls) == 1 and batches(calls) > 0
    got = dev_out.to_numpy()
    assert (got[:B] == host.array[B: 2 * B]).all() and (got[2 * B: 3 * B] == host.array[:B]).all()
    assert (host_out.array[: N * B // 2] == dev.to_numpy()[: N * B // 2]).all()
    assert (page[:B] == dev.to_numpy()[B: 2 * B]).all()


# -- what "auto" picks --------------------------------------------------------------------


def test_auto_picks_the_driver_above_the_threshold(host: cm.HostBuffer, dev_out: cm.DeviceBuffer,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_kernels, "KERNEL_THRESHOLD", 2 * KiB)
    with record_calls(monkeypatch) as calls:
        copy_batch(dev_out, host, dst_offsets=[0, 2 * B], src_offsets=[B, 0], sizes=2 * KiB)
    assert launches(calls) == 0 and batches(calls) > 0  # at the threshold: the driver
    with record_calls(monkeypatch) as calls:
        copy_batch(dev_out, host, dst_offsets=[0, 2 * B], src_offsets=[B, 0],
                   sizes=2 * KiB - 1)
    assert launches(calls) == 1
    # the blocks as given decide, before any merge: two contiguous 1 KiB blocks are the kernel's
    with record_calls(monkeypatch) as calls:
        copy_batch(dev_out, host, dst_offsets=[0, KiB], src_offsets=[0, KiB], sizes=KiB)
    assert launches(calls) == 1 and batches(calls) == 0
    assert (dev_out.to_numpy()[: 2 * KiB] == host.array[: 2 * KiB]).all()


def test_auto_leaves_pageable_raw_and_host_to_host_to_the_driver(
        host: cm.HostBuffer, host_out: cm.HostBuffer, dev: cm.DeviceBuffer,
        dev_out: cm.DeviceBuffer, monkeypatch: pytest.MonkeyPatch) -> None:
    page = pattern(N * B, 4)
    with record_calls(monkeypatch) as calls:
        copy_batch(dev_out, page, dst_offsets=[0], src_offsets=[B], sizes=B)
        copy_batch(dev_out.ptr, host, dst_offsets=[B], src_offsets=[0], sizes=B)
        copy_batch(host_out, host, dst_offsets=[0], src_offsets=[2 * B], sizes=B)
    assert launches(calls) == 0
    got = dev_out.to_numpy()
    assert (got[:B] == page[B: 2 * B]).all() and (got[B: 2 * B] == host.array[:B]).all()
    assert (host_out.array[:B] == host.array[2 * B: 3 * B]).all()


def test_kernel_takes_raw_addresses_it_can_classify(host: cm.HostBuffer,
                                                    dev_out: cm.DeviceBuffer,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    with record_calls(monkeypatch) as calls:
        copy_batch(dev_out.ptr, host.ptr, dst_offsets=[B], src_offsets=[0], sizes=B,
                   method="kernel")
    assert launches(calls) == 1
    assert (dev_out.to_numpy()[B: 2 * B] == host.array[:B]).all()


# -- refusals before anything runs ------------------------------------------------------------


def test_kernel_refuses_pageable_before_anything_runs(dev_out: cm.DeviceBuffer,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    page = pattern(N * B)
    with record_calls(monkeypatch) as calls, pytest.raises(ValueError, match="pageable"):
        copy_batch(dev_out, page, dst_offsets=[0], src_offsets=[0], sizes=B, method="kernel")
    made = {api for api, _ in calls}
    assert not made & {"cuLaunchKernel", "cuMemAllocAsync", "cuMemcpyBatchAsync",
                       "cuModuleLoadData", "cuMemcpyHtoDAsync"}
    assert (dev_out.to_numpy() == 0xEE).all()


@pytest.mark.multi_gpu
def test_kernel_refuses_another_devices_memory_without_peer_access(host: cm.HostBuffer) -> None:
    if cm.device_count() < 2:
        pytest.skip("needs two devices")
    with cm.Device(0), no_peer_access(auto=False):  # the caller's context comes back at the end
        other = cm.DeviceBuffer.empty(N * B, device=1)
        s0 = cm.Stream(0)
        try:
            with cm.Device(0):  # device 0's stream runs the batch; device 1's memory
                with pytest.raises(ValueError, match="device 1"):
                    copy_batch(other, host, dst_offsets=[0], src_offsets=[0], sizes=B,
                               method="kernel", stream=s0)
                copy_batch(other, host, dst_offsets=[0], src_offsets=[0], sizes=B,
                           stream=s0)  # the driver's path
                s0.synchronize()
            assert (other.to_numpy()[:B] == host.array[:B]).all()
        finally:
            s0.close()
            other.close()


@pytest.mark.multi_gpu
def test_a_stream_of_another_device(host: cm.HostBuffer,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel runs in the stream's context, whatever is current: device 1's kernel
    writes device 0's memory through peer access (enabled on first use)."""
    if cm.device_count() < 2:
        pytest.skip("needs two devices")
    with cm.Device(0), no_peer_access():  # the caller's context comes back at the end
        s1 = cm.Stream(1)  # makes device 1 current
        with cm.Device(0):
            dev = cm.DeviceBuffer.empty(N * B)
            try:
                with record_calls(monkeypatch) as calls:
                    copy_batch(dev, host, dst_offsets=[0], src_offsets=[0], sizes=B,
                               stream=s1, method="kernel")
                    assert int(_driver.call("cuCtxGetDevice")) == 0
                    s1.synchronize()
                assert launches(calls) == 1 and cm.Device(1).peer_access_enabled(0)
                assert (dev.to_numpy()[:B] == host.array[:B]).all()
            finally:
                s1.close()
                dev.close()


# -- the loader ------------------------------------------------------------------------------


def test_the_module_is_loaded_once_per_context(host: cm.HostBuffer, dev_out: cm.DeviceBuffer,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    copy_batch(dev_out, host, dst_offsets=[0], src_offsets=[0], sizes=B, method="kernel")
    with record_calls(monkeypatch) as calls:
        for i in range(3):
            copy_batch(dev_out, host, dst_offsets=[i * B], src_offsets=[0], sizes=B,
                       method="kernel")
    names = [api for api, _ in calls]
    assert "cuModuleLoadData" not in names and "cuModuleGetFunction" not in names
    assert names.count("cuLaunchKernel") == 3


def test_the_launch_arguments(host: cm.HostBuffer, dev_out: cm.DeviceBuffer,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The ((values), (ctypes types)) form cuda-bindings 13 packs, all 8 parameters."""
    with record_calls(monkeypatch) as calls:
        copy_batch(dev_out, host, dst_offsets=[0, 3 * B], src_offsets=[B, 0],
                   sizes=[B, 100], method="kernel")
    (args,) = [a for api, a in calls if api == "cuLaunchKernel"]
    _f, gx, gy, gz, bx, by, bz, shared, _stream, params, extra = args
    assert (gy, gz, by, bz, shared, extra) == (1, 1, 1, 1, 0, 0)
    assert bx == _kernels.THREADS and 1 <= gx
    values, types = params
    assert types == (ctypes.c_void_p,) * 5 + (ctypes.c_uint64,) * 3
    assert all(type(v) is int for v in values)
    assert values[4] != 0 and values[6] == 2  # sizes array given, 2 blocks
    assert values[7] == _kernels.lanes_for(B)


@pytest.mark.parametrize(("size", "lanes"), [(1, 32), (4096, 32), (4097, 64), (8192, 64),
                                             (16384, 128), (32768, 256),
                                             (1 << 20, 256)])
def test_lanes_per_block(size: int, lanes: int) -> None:
    assert _kernels.lanes_for(size) == lanes


# -- failures (simulator: injected, or addresses a GPU context would not survive) ------------


@pytest.mark.sim_only
@pytest.mark.parametrize(("api", "code"), [
    ("cuLaunchKernel", cu.CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES),
    ("cuMemAllocFromPoolAsync", cu.CUresult.CUDA_ERROR_INVALID_VALUE),  # the descriptors' block
])
def test_a_failing_call_raises_its_typed_error(api: str, code: cu.CUresult, host: cm.HostBuffer,
                                               dev_out: cm.DeviceBuffer) -> None:
    from cuda_memkit.sim import machine

    copy_batch(dev_out, host, dst_offsets=[0], src_offsets=[0], sizes=B, method="kernel")
    dev_out.fill(0xEE)
    cm.MemoryPool.default_pinned().trim()  # the descriptors' pinned block is not cached
    machine().fail_next(api, code)
    with pytest.raises(cm.CudaError) as info:
        copy_batch(dev_out, host, dst_offsets=[B], src_offsets=[0], sizes=B, method="kernel")
    assert info.value.code == int(code) and info.value.api == api
    assert (dev_out.to_numpy() == 0xEE).all()  # nothing copied; the leak check: nothing kept


@pytest.mark.sim_only
def test_a_kernel_fault_is_illegal_address(host: cm.HostBuffer) -> None:
    """A raw address the kernel cannot use: CUDA_ERROR_ILLEGAL_ADDRESS (the GPU: at the sync)."""
    gone = cm.DeviceBuffer.empty(N * B)
    ptr = gone.ptr
    target = cm.DeviceBuffer.empty(N * B)
    gone.close()
    try:
        # a raw int inside a live allocation passes the kernel path's checks, but runs past it
        with pytest.raises(cm.CudaError) as info:
            copy_batch(target.ptr + N * B - 16, host, dst_offsets=[0], src_offsets=[0],
                       sizes=B, method="kernel")
        assert info.value.code == int(cu.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS)
        with pytest.raises(ValueError, match="does not know"):  # freed: refused, not launched
            copy_batch(ptr, host, dst_offsets=[0], src_offsets=[0], sizes=B, method="kernel")
    finally:
        target.close()


def test_pinned_pool_memory_is_not_the_kernels(monkeypatch: pytest.MonkeyPatch,
                                               dev_out: cm.DeviceBuffer) -> None:
    """The driver gives no mapped device address for pinned pool memory (the H100:
    ``cuMemHostGetDevicePointer`` answers INVALID_VALUE, with or without set_access), so
    "kernel" refuses it before anything runs and "auto" leaves it to the driver."""
    pool = cm.MemoryPool(location=cm.Location.host())
    h = cm.HostBuffer.empty(N * B, pool=pool)
    try:
        h.array[:] = pattern(N * B)
        for access in (None, cm.Access.READWRITE):
            if access is not None:
                pool.set_access(0, access)
            with pytest.raises(ValueError, match="not mapped"):
                copy_batch(dev_out, h, dst_offsets=[0], src_offsets=[0], sizes=B,
                           method="kernel")
            with pytest.raises(ValueError, match="not mapped"):
                copy_batch(h, dev_out, dst_offsets=[0], src_offsets=[0], sizes=B,
                           method="kernel")
            with record_calls(monkeypatch) as calls:
                copy_batch(dev_out, h, dst_offsets=[0], src_offsets=[B], sizes=B,
                           method="auto")
            assert launches(calls) == 0
            assert (dev_out.to_numpy()[:B] == pattern(N * B)[B:2 * B]).all()
            dev_out.fill(0)
    finally:
        h.close()
        pool.close()


@pytest.mark.sim_only
def test_the_simulated_kernel_faults_on_a_host_pool_without_access(
        host: cm.HostBuffer, dev_out: cm.DeviceBuffer) -> None:
    """The kernel reads its descriptors from the default pinned pool: only because that pool
    gives every device access (the simulator faults as the H100 would without it)."""
    pool = cm.MemoryPool.default_pinned()
    assert all(pool.access(i) == cm.Access.READWRITE for i in range(cm.device_count()))
    pool.set_access(0, cm.Access.NONE)
    try:
        with pytest.raises(cm.CudaError) as info:
            copy_batch(dev_out, host, dst_offsets=[0], src_offsets=[0], sizes=B,
                       method="kernel")
        assert info.value.code == int(cu.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS)
    finally:
        pool.set_access(0, cm.Access.READWRITE)


@pytest.mark.sim_only
def test_module_load_failures_leave_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda_memkit.sim import machine

    monkeypatch.setattr(_kernels, "_loaded", {})
    machine().fail_next("cuModuleLoadData", cu.CUresult.CUDA_ERROR_INVALID_PTX)
    with pytest.raises(cm.CudaError, match="INVALID_PTX"):
        _kernels.copy_function()
    machine().fail_next("cuModuleGetFunction", cu.CUresult.CUDA_ERROR_NOT_FOUND)
    with pytest.raises(cm.CudaError, match="NOT_FOUND"):
        _kernels.copy_function()  # the module it loaded is unloaded again
    assert not _kernels._loaded
    _fn, sms = _kernels.copy_function()
    assert sms > 0
    (mod, _f, _n), = _kernels._loaded.values()
    _driver.call("cuModuleUnload", mod)


# -- the checks' O(n) path for equal blocks in slots (what keeps them off the kernel's time) --


def _group(dst: Any, src: Any, d_off: Any, s_off: Any, size: Any) -> Any:
    from cuda_memkit._transfer._copy_batch import _Group

    return _Group(dst, src, d_off, s_off, size, None, None, None)


def test_scattered_slots_skip_the_sort(host: cm.HostBuffer, dev_out: cm.DeviceBuffer,
                                       perm: np.ndarray) -> None:
    s_off = (np.arange(N) % (N // 2)) * 2 * B  # even slots only: no source continues another
    g = _group(dev_out, host, perm * B, s_off, B)
    assert not g.sorted and len(g.z) == N and (g.d == perm * B).all()
    copy_batch(dev_out, host, dst_offsets=perm * B, src_offsets=s_off, sizes=B)
    got = dev_out.to_numpy().reshape(N, B)
    assert (got[perm] == host.array.reshape(N, B)[s_off // B]).all()


def test_slots_that_merge_or_collide_take_the_sort(host: cm.HostBuffer,
                                                   dev_out: cm.DeviceBuffer) -> None:
    g = _group(dev_out, host, np.array([7, 3, 4]) * B, np.array([0, 10, 11]) * B, B)
    assert g.sorted and g.z.tolist() == [2 * B, B]  # slots 3 and 4 merged
    with pytest.raises(ValueError, match=r"destination blocks 0 and 2 overlap"):
        _group(dev_out, host, np.array([5, 1, 5]) * B, np.array([0, 1, 2]) * B, B)
    g = _group(dev_out, host, [9 * B, 100], [0, 2 * B], B)  # not at multiples of B
    assert g.sorted and g.d.tolist() == [100, 9 * B]
    g = _group(dev_out, host, [9 * B, 0], [0, 2 * B], [B, 2 * B])  # unequal sizes
    assert g.sorted and g.d.tolist() == [0, 9 * B]


@pytest.mark.parametrize("method", METHODS)
def test_unsorted_blocks_in_one_buffer_still_refuse_aliasing(dev: cm.DeviceBuffer,
                                                             method: str) -> None:
    """A source slot that is another block's destination: refused, whatever the order."""
    d_off = np.array([9, 2, 30, 17]) * B
    s_off = np.array([40, 41, 17, 50]) * B  # block 2 reads slot 17, which block 3 writes
    with pytest.raises(ValueError, match="source block overlaps a destination"):
        copy_batch(dev, dev, dst_offsets=d_off, src_offsets=s_off, sizes=B, method=method)
    before = dev.to_numpy()
    copy_batch(dev, dev, dst_offsets=d_off, src_offsets=s_off + B, sizes=B, method=method)
    got = dev.to_numpy().reshape(N, B)
    for d, s in zip(d_off // B, (s_off + B) // B, strict=True):
        assert (got[d] == before.reshape(N, B)[s]).all()


# -- CopyBatch: descriptors kept on the device ------------------------------------------------


def _device_bytes() -> int:
    from cuda_memkit._core._resource import LEDGER

    return sum(a.current for (kind, _d, _p), a in LEDGER.items() if kind == "device")


@pytest.mark.parametrize("direction", ["h2d", "d2h", "d2d"])
@pytest.mark.parametrize("use_stream", [False, True])
def test_copy_batch_keeps_its_descriptors_on_the_device(
        direction: str, use_stream: bool, host: cm.HostBuffer, host_out: cm.HostBuffer,
        dev: cm.DeviceBuffer, dev_out: cm.DeviceBuffer, perm: np.ndarray, stream: cm.Stream,
        monkeypatch: pytest.MonkeyPatch) -> None:
    dst, src = _pair(direction, host, host_out, dev, dev_out)
    s = stream if use_stream else None
    before = _device_bytes()
    with CopyBatch() as b:
        b.add(dst, src, dst_offsets=perm * B, src_offsets=np.arange(N) * B, sizes=B)
        assert b.device_nbytes == 0
        with record_calls(monkeypatch) as first:
            b.execute(stream=s, method="kernel")
        assert launches(first) == 1 and b.device_nbytes == 2 * N * 8
        assert _device_bytes() == before + b.device_nbytes  # in the ledger
        if isinstance(dst, cm.HostBuffer):
            dst.array[:] = 0
        else:
            dst.fill(0)
        with record_calls(monkeypatch) as again:
            b.execute(stream=s, method="kernel")
        names = [api for api, _ in again]
        assert names.count("cuLaunchKernel") == 1
        # one launch: no descriptor allocation, upload or free
        assert not {"cuMemAllocAsync", "cuMemFreeAsync", "cuMemAlloc", "cuMemcpyHtoDAsync",
                    "cuMemcpyHtoD"} & set(names)
        if s is not None:
            s.synchronize()
        got = read(dst)
        want = read(src)
        for i, slot in enumerate(perm):
            assert (got[slot * B: (slot + 1) * B] == want[i * B: (i + 1) * B]).all()
    assert b.closed and b.device_nbytes == 0
    if s is not None:
        s.synchronize()
        from cuda_memkit._core._inflight import reap_pending

        reap_pending()
    assert _device_bytes() == before
    with pytest.raises(cm.ClosedError):
        b.execute()
    with pytest.raises(cm.ClosedError):
        b.add(dst, src, dst_offsets=[0], src_offsets=[0], sizes=B)
    b.close()  # again: nothing


def test_copy_batch_closed_in_flight_frees_its_descriptors_after_the_stream(
        host: cm.HostBuffer, dev_out: cm.DeviceBuffer, stream: cm.Stream) -> None:
    import weakref

    from cuda_memkit._core._inflight import reap_pending

    b = CopyBatch().add(dev_out, host, dst_offsets=[B, 0], src_offsets=[0, B], sizes=B)
    b.execute(stream=stream, method="kernel")
    buf = weakref.ref(b._memo.resident.buf)
    b.close()
    stream.synchronize()
    reap_pending()
    assert buf() is None
    got = dev_out.to_numpy()
    assert (got[B: 2 * B] == host.array[:B]).all() and (got[:B] == host.array[B: 2 * B]).all()


def test_copy_batch_collected_frees_its_descriptors(host: cm.HostBuffer,
                                                    dev_out: cm.DeviceBuffer) -> None:
    before = _device_bytes()
    b = CopyBatch().add(dev_out, host, dst_offsets=[B], src_offsets=[0], sizes=B)
    b.execute(method="kernel")
    assert _device_bytes() > before
    del b
    assert _device_bytes() == before


def test_copy_batch_owns_its_blocks(host: cm.HostBuffer, dev_out: cm.DeviceBuffer) -> None:
    """Arrays the caller changes after add() change nothing: what was checked is what runs."""
    d_off = np.array([0, B], np.int64)
    s_off = np.array([B, 0], np.int64)
    with CopyBatch() as b:
        b.add(dev_out, host, dst_offsets=d_off, src_offsets=s_off, sizes=B)
        d_off[:] = 10 * N * B  # far out of range, had the batch kept the caller's array
        s_off[:] = 0
        b.execute(method="kernel")
        b.execute(method="driver")
    got = dev_out.to_numpy()
    assert (got[:B] == host.array[B: 2 * B]).all() and (got[B: 2 * B] == host.array[:B]).all()


def test_copy_batch_checks_new_pairs_across_the_old_ones(host: cm.HostBuffer,
                                                         dev_out: cm.DeviceBuffer) -> None:
    with CopyBatch() as b:
        b.add(dev_out, host, dst_offsets=[0], src_offsets=[0], sizes=B)
        b.execute(method="kernel")
        b.add(dev_out, host, dst_offsets=[B // 2], src_offsets=[B], sizes=B)
        with pytest.raises(ValueError, match="overlap"):
            b.execute(method="kernel")


def test_copy_batch_rebuilds_descriptors_when_the_kernel_pairs_change(
        host: cm.HostBuffer, dev: cm.DeviceBuffer, dev_out: cm.DeviceBuffer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    with CopyBatch() as b:
        b.add(dev_out, host, dst_offsets=[0], src_offsets=[0], sizes=B)
        b.execute(method="kernel")
        one = b.device_nbytes
        b.add(dev_out, dev, dst_offsets=[2 * B, 3 * B], src_offsets=[0, 5 * B],
              sizes=[B, 100])
        with record_calls(monkeypatch) as calls:
            b.execute(method="kernel")
        assert launches(calls) == 1 and b.device_nbytes == 3 * 3 * 8 > one
        got = dev_out.to_numpy()
        assert (got[:B] == host.array[:B]).all()
        d = dev.to_numpy()
        assert (got[2 * B: 3 * B] == d[:B]).all()
        assert (got[3 * B: 3 * B + 100] == d[5 * B: 5 * B + 100]).all()


# -- "auto" thresholds by direction -------------------------------------------------------


@pytest.mark.parametrize(("direction", "kernel"), [("h2d", False), ("d2h", False),
                                                   ("d2d", True)])
def test_auto_threshold_is_per_direction(direction: str, kernel: bool, host: cm.HostBuffer,
                                         host_out: cm.HostBuffer, dev: cm.DeviceBuffer,
                                         dev_out: cm.DeviceBuffer,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks between the two thresholds: the kernel device to device only."""
    monkeypatch.setattr(_kernels, "KERNEL_THRESHOLD", 4 * KiB)
    monkeypatch.setattr(_kernels, "KERNEL_THRESHOLD_D2D", 16 * KiB)
    dst, src = _pair(direction, host, host_out, dev, dev_out)
    with record_calls(monkeypatch) as calls:
        copy_batch(dst, src, dst_offsets=[0, 16 * B], src_offsets=[8 * B, 0], sizes=2 * B)
    assert launches(calls) == (1 if kernel else 0)
    got, want = read(dst), read(src)
    assert (got[:2 * B] == want[8 * B: 10 * B]).all()
    assert (got[16 * B: 18 * B] == want[:2 * B]).all()
    with record_calls(monkeypatch) as calls:
        copy_batch(dst, src, dst_offsets=[0, 16 * B], src_offsets=[8 * B, 0], sizes=4 * B)
    assert launches(calls) == 0  # at the D2D threshold too: the driver


# -- dense host spans: the kernel reads and writes them through the mapping too -------------------
# (staging a dense span through one DMA measured slower on the H100: docs/decisions.md)


def _dma(calls: list[tuple[str, Any]]) -> list[tuple[Any, ...]]:
    return [a for api, a in calls if api == "cuMemcpyAsync"]


@pytest.mark.parametrize("prebuilt", [False, True])
@pytest.mark.parametrize("to_host", [False, True])
def test_a_dense_host_span_is_one_launch_and_no_dma(
        prebuilt: bool, to_host: bool, host: cm.HostBuffer, host_out: cm.HostBuffer,
        dev: cm.DeviceBuffer, dev_out: cm.DeviceBuffer, stream: cm.Stream,
        monkeypatch: pytest.MonkeyPatch) -> None:
    dst, src = (host_out, dev) if to_host else (dev_out, host)
    d_off = np.random.default_rng(3).permutation(N) * B  # every slot: the span is tiled
    s_off = np.arange(N) * B
    with record_calls(monkeypatch) as calls:
        if prebuilt:
            with CopyBatch() as b:
                b.add(dst, src, dst_offsets=d_off, src_offsets=s_off, sizes=B)
                b.execute(stream=stream)
                stream.synchronize()
        else:
            copy_batch(dst, src, dst_offsets=d_off, src_offsets=s_off, sizes=B, stream=stream)
    stream.synchronize()
    assert launches(calls) == 1 and not _dma(calls)
    want = dev.to_numpy() if to_host else host.array
    got = host_out.array if to_host else dev_out.to_numpy()
    for d, sl in zip(d_off, s_off, strict=True):
        assert (got[d: d + B] == want[sl: sl + B]).all()


def test_a_gap_in_the_host_destination_is_never_written(
        host_out: cm.HostBuffer, dev: cm.DeviceBuffer, monkeypatch: pytest.MonkeyPatch) -> None:
    d_off = np.array([s for s in range(N) if s != 7]) * B  # one slot missing
    s_off = np.random.default_rng(2).permutation(N)[: N - 1] * B
    with record_calls(monkeypatch) as calls:
        copy_batch(host_out, dev, dst_offsets=d_off, src_offsets=s_off, sizes=B)
    assert launches(calls) == 1 and not _dma(calls)
    assert (host_out.array[7 * B: 8 * B] == 0xEE).all()
    src = dev.to_numpy()
    for d, sl in zip(d_off, s_off, strict=True):
        assert (host_out.array[d: d + B] == src[sl: sl + B]).all()


# -- few large blocks: cut into pieces for the whole grid ----------------------------------------


@pytest.mark.parametrize("shift", [0, 3])
def test_few_large_blocks_are_cut_into_pieces(shift: int,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    size = 2 << 20
    src_data = pattern(size, 9)
    with cm.DeviceBuffer.from_array(src_data) as src, cm.DeviceBuffer.empty(size) as dst:
        dst.fill(0xEE)
        d_off = [shift, 700_000 + shift, 1_500_000]
        s_off = [1_000_000, 5, 300_000 + shift]
        sizes = [300_000, 500_001, 200_000]
        with record_calls(monkeypatch) as calls:
            copy_batch(dst, src, dst_offsets=d_off, src_offsets=s_off, sizes=sizes,
                       method="kernel")
        (args,) = [a for api, a in calls if api == "cuLaunchKernel"]
        values = args[9][0]
        pieces = values[6]
        assert pieces > 3 and values[4] != 0  # cut, sizes as an array
        got = dst.to_numpy()
        want = np.full(size, 0xEE, np.uint8)
        for d, s, z in zip(d_off, s_off, sizes, strict=True):
            want[d: d + z] = src_data[s: s + z]
        assert (got == want).all()  # every byte of the blocks, nothing outside them


def test_equal_large_blocks_cut_into_equal_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    size = 4 << 20
    src_data = pattern(size, 2)
    with cm.DeviceBuffer.from_array(src_data) as src, cm.DeviceBuffer.empty(size) as dst:
        with record_calls(monkeypatch) as calls:
            copy_batch(dst, src, dst_offsets=[3 << 20, 0, 2 << 20, 1 << 20],
                       src_offsets=[0, 1 << 20, 2 << 20, 3 << 20], sizes=1 << 20)
        (args,) = [a for api, a in calls if api == "cuLaunchKernel"]
        values = args[9][0]
        assert values[6] > 4 and values[4] == 0 and values[5] * values[6] == size
        got = dst.to_numpy().reshape(4, -1)
        want = src_data.reshape(4, -1)
        assert (got[3] == want[0]).all() and (got[0] == want[1]).all()
        assert (got[2] == want[2]).all() and (got[1] == want[3]).all()


# -- one size for every block: the bounds from min/max ----------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_one_size_bounds_name_the_block(method: str, host: cm.HostBuffer,
                                        dev_out: cm.DeviceBuffer) -> None:
    with pytest.raises(ValueError, match=r"block 2 is out of range: destination"):
        copy_batch(dev_out, host, dst_offsets=[0, B, N * B - B + 1], src_offsets=[0, B, 2 * B],
                   sizes=B, method=method)
    with pytest.raises(ValueError, match=r"block 1 is out of range: source"):
        copy_batch(dev_out, host, dst_offsets=[0, B], src_offsets=[0, N * B], sizes=B,
                   method=method)
    with cm.DeviceBuffer.empty(0) as empty, pytest.raises(ValueError, match="out of range"):
        copy_batch(empty, host, dst_offsets=[0], src_offsets=[0], sizes=1, method=method)
    copy_batch(dev_out, host, dst_offsets=[N * B - B], src_offsets=[0], sizes=B, method=method)
    assert (dev_out.to_numpy()[N * B - B:] == host.array[:B]).all()  # the last byte: in range


# -- a prebuilt batch remembers its kernel pick --------------------------------------------------


def test_a_repeated_execute_asks_no_pointer_query(
        host: cm.HostBuffer, dev_out: cm.DeviceBuffer, stream: cm.Stream,
        monkeypatch: pytest.MonkeyPatch) -> None:
    perm = np.random.default_rng(8).permutation(N) * B
    with CopyBatch() as b:
        b.add(dev_out, host, dst_offsets=perm, src_offsets=np.arange(N) * B, sizes=B)
        b.execute(stream=stream)
        stream.synchronize()
        dev_out.fill(0)
        with record_calls(monkeypatch) as calls:
            b.execute(stream=stream)
        stream.synchronize()
    names = [api for api, _ in calls]
    assert launches(calls) == 1
    assert "cuPointerGetAttribute" not in names and "cuMemHostGetDevicePointer" not in names
    got = dev_out.to_numpy()
    for i, d in enumerate(perm):
        assert (got[d: d + B] == host.array[i * B: (i + 1) * B]).all()


def test_an_unregistered_array_is_refused_at_the_next_execute(dev: cm.DeviceBuffer) -> None:
    arr = np.zeros(N * B, np.uint8)
    reg = cm.register_host(arr)
    with CopyBatch() as b:
        b.add(arr, dev, dst_offsets=np.arange(N) * B, src_offsets=np.arange(N) * B, sizes=B)
        b.execute(method="kernel")
        reg.close()
        with pytest.raises(ValueError, match="pageable"):
            b.execute(method="kernel")

