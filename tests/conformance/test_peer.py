"""Peer access and copies between two devices through the gateway: exact class and CUresult.

Expected answers are two NVLink H200s' (``h200x2_probe.json``, section F of
``scripts/gpu_probe.py``). They run on whichever backend is active; the
simulator must agree. Each test starts and ends with no peer access enabled,
through the library (``tests/_peer.disable_all``), so that its table and the
driver agree for the tests after it. Kernels of one device touching another
device's memory without access fault and leave the context unusable on a GPU
(F_kernel_*_none, F_kernel_*_peer_only): those answers are tested on the
simulator only (``tests/test_multigpu_copies.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _driver

from .._peer import disable_all
from ._helpers import expect, in_fresh_thread

pytestmark = pytest.mark.multi_gpu

R = cu.CUresult
L = cu.CUmemLocationType
MiB = 1 << 20
RW = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
INVALID = (cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE)
NO_CONTEXT = (cm.CudaInvalidContextError, R.CUDA_ERROR_INVALID_CONTEXT)
ALREADY = (cm.CudaError, R.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
NOT_ENABLED = (cm.CudaError, R.CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)
UNSUPPORTED = (cm.CudaPeerAccessUnsupportedError, R.CUDA_ERROR_PEER_ACCESS_UNSUPPORTED)
BAD_DEVICE = (cm.CudaInvalidDeviceError, R.CUDA_ERROR_INVALID_DEVICE)
NOT_SUPPORTED = (cm.CudaNotSupportedError, R.CUDA_ERROR_NOT_SUPPORTED)


@pytest.fixture
def pair(two_devices: None) -> Iterator[tuple[Any, Any]]:
    """Both primary contexts, retained for the test; no peer access before or after."""
    if not cm.Device(0).can_access_peer(1):
        pytest.skip("devices 0 and 1 are not peers")
    disable_all()
    ctxs = tuple(_driver.call("cuDevicePrimaryCtxRetain", cu.CUdevice(i)) for i in (0, 1))
    try:
        yield ctxs
    finally:
        for frm, to in ((0, 1), (1, 0)):
            _driver.call("cuCtxPushCurrent", ctxs[frm])
            try:
                _driver.call("cuCtxDisablePeerAccess", ctxs[to])
            except cm.CudaError as exc:
                assert exc.code == R.CUDA_ERROR_PEER_ACCESS_NOT_ENABLED
            finally:
                _driver.call("cuCtxPopCurrent")
        for i in (0, 1):
            _driver.call("cuDevicePrimaryCtxRelease", cu.CUdevice(i))
        disable_all()


def on(ctx: Any, fn: Callable[[], Any]) -> Any:
    """``fn()`` on a fresh thread with ``ctx`` current (``None``: no context)."""
    def body() -> Any:
        if ctx is not None:
            _driver.call("cuCtxSetCurrent", ctx)
        try:
            return fn()
        finally:
            _driver.call("cuCtxSetCurrent", None)

    return in_fresh_thread(body)


def test_p2p_attributes(two_devices: None) -> None:
    P = cu.CUdevice_P2PAttribute
    want = {P.CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: 0,
            P.CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED: 1,
            P.CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED: 1,
            P.CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED: 1,
            P.CU_DEVICE_P2P_ATTRIBUTE_ONLY_PARTIAL_NATIVE_ATOMIC_SUPPORTED: 0}
    d0, d1 = cu.CUdevice(0), cu.CUdevice(1)
    for attr, value in want.items():
        for a, b in ((d0, d1), (d1, d0)):
            assert int(_driver.call("cuDeviceGetP2PAttribute", attr, a, b)) == value, attr
        expect(BAD_DEVICE, "cuDeviceGetP2PAttribute", attr, d0, d0)
    assert int(_driver.call("cuDeviceCanAccessPeer", d0, d1)) == 1
    assert int(_driver.call("cuDeviceCanAccessPeer", d1, d1)) == 0
    expect(BAD_DEVICE, "cuDeviceCanAccessPeer", d0, cm.device_count())


def test_enable_and_disable_answers(pair: tuple[Any, Any]) -> None:
    c0, c1 = pair

    def body() -> None:
        _driver.call("cuCtxEnablePeerAccess", c1, 0)
        expect(ALREADY, "cuCtxEnablePeerAccess", c1, 0)
        expect(INVALID, "cuCtxEnablePeerAccess", c1, 1)  # the flags first
        expect(UNSUPPORTED, "cuCtxEnablePeerAccess", c0, 0)  # its own context
        expect(NOT_ENABLED, "cuCtxDisablePeerAccess", c0)
        expect(NO_CONTEXT, "cuCtxEnablePeerAccess", cu.CUcontext(0), 0)
        expect(NO_CONTEXT, "cuCtxDisablePeerAccess", cu.CUcontext(0))
        _driver.call("cuCtxDisablePeerAccess", c1)
        expect(NOT_ENABLED, "cuCtxDisablePeerAccess", c1)

    on(c0, body)
    on(None, lambda: expect(NO_CONTEXT, "cuCtxEnablePeerAccess", c1, 0))
    on(None, lambda: expect(NO_CONTEXT, "cuCtxDisablePeerAccess", c1))


def test_each_direction_is_its_own(pair: tuple[Any, Any]) -> None:
    c0, c1 = pair
    on(c1, lambda: _driver.call("cuCtxEnablePeerAccess", c0, 0))
    on(c0, lambda: expect(NOT_ENABLED, "cuCtxDisablePeerAccess", c1))
    on(c1, lambda: expect(ALREADY, "cuCtxEnablePeerAccess", c0, 0))

    def pushed() -> None:  # pushed rather than set: the same answers
        _driver.call("cuCtxPushCurrent", c1)
        try:
            _driver.call("cuCtxDisablePeerAccess", c0)
            _driver.call("cuCtxEnablePeerAccess", c0, 0)
        finally:
            _driver.call("cuCtxPopCurrent")

    on(c0, pushed)


def _alloc(ctx: Any, n: int) -> int:
    return int(on(ctx, lambda: _driver.call("cuMemAlloc", n)))


def _fill(ctx: Any, ptr: int, data: np.ndarray[Any, Any]) -> None:
    on(ctx, lambda: _driver.call("cuMemcpy", ptr, data.ctypes.data, data.nbytes))


def _read(ctx: Any, ptr: int, n: int) -> np.ndarray[Any, Any]:
    out = np.zeros(n, np.uint8)
    on(ctx, lambda: _driver.call("cuMemcpy", out.ctypes.data, ptr, n))
    return out


def _copies(dst: int, dctx: Any, src: int, sctx: Any, n: int) -> list[tuple[str, tuple[Any, ...]]]:
    """Every copy call from ``dst``'s to ``src``'s memory, with its arguments."""
    a = cu.CUmemcpyAttributes()
    a.srcAccessOrder = cu.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    return [("cuMemcpy", (dst, src, n)), ("cuMemcpyDtoD", (dst, src, n)),
            ("cuMemcpyAsync", (dst, src, n, 2)),  # the per-thread default stream
            ("cuMemcpyBatchAsync", ([cu.CUdeviceptr(dst)], [cu.CUdeviceptr(src)], [n], 1, [a],
                                    [0], 1, 2)),
            ("cuMemcpyPeer", (dst, dctx, src, sctx, n)),
            ("cuMemcpyPeerAsync", (dst, dctx, src, sctx, n, 2))]


def _copy_answers(run: Any, dst: int, dctx: Any, src: int, sctx: Any, n: int,
                  want: np.ndarray[Any, Any]) -> dict[str, str]:
    """Each copy call made from context ``run``: ``"ok"`` (and the data arrived) or the error."""
    out = {}
    for api, args in _copies(dst, dctx, src, sctx, n):
        on(dctx, lambda: _driver.call("cuMemsetD8", dst, 0, n))

        def call(api: str = api, args: tuple[Any, ...] = args) -> str:
            try:
                _driver.call(api, *args)
                _driver.call("cuCtxSynchronize")
            except cm.CudaError as exc:
                return exc.name
            return "ok"

        out[api] = on(run, call)
        if out[api] == "ok":
            assert (_read(dctx, dst, n) == want).all(), api
    return out


def test_device_memory_copies_across_devices_with_or_without_peer_access(
        pair: tuple[Any, Any]) -> None:
    # F_copy_device_memory: every copy call works from either context, peer access or not
    # (without it the driver stages the copy through host memory, at a tenth of the speed).
    c0, c1 = pair
    n = MiB
    a0, a1 = _alloc(c0, n), _alloc(c1, n)
    try:
        want = (np.arange(n) % 251).astype(np.uint8)
        _fill(c0, a0, want)
        for phase in ("none", "0->1", "both"):
            if phase == "0->1":
                on(c0, lambda: _driver.call("cuCtxEnablePeerAccess", c1, 0))
            if phase == "both":
                on(c1, lambda: _driver.call("cuCtxEnablePeerAccess", c0, 0))
            for run in (c0, c1):
                answers = _copy_answers(run, a1, c1, a0, c0, n, want)
                assert set(answers.values()) == {"ok"}, (phase, answers)
    finally:
        on(c0, lambda: _driver.call("cuMemFree", a0))
        on(c1, lambda: _driver.call("cuMemFree", a1))


def test_memset_of_another_devices_memory_needs_peer_access(pair: tuple[Any, Any]) -> None:
    c0, c1 = pair
    a1 = _alloc(c1, MiB)
    try:
        def memsets() -> None:
            expect(INVALID, "cuMemsetD8", a1, 7, MiB)
            expect(INVALID, "cuMemsetD8Async", a1, 7, MiB, 2)
            _driver.call("cuCtxEnablePeerAccess", c1, 0)
            _driver.call("cuMemsetD8", a1, 7, MiB)
            _driver.call("cuMemsetD8Async", a1, 9, MiB, 2)
            _driver.call("cuStreamSynchronize", 2)

        on(c0, memsets)
        assert (_read(c1, a1, MiB) == 9).all()
    finally:
        on(c1, lambda: _driver.call("cuMemFree", a1))


def _pool_on_1(c1: Any) -> tuple[Any, int]:
    props = cu.CUmemPoolProps()
    props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.location = _loc(1)
    pool = _driver.call("cuMemPoolCreate", props)
    ptr = int(on(c1, lambda: _driver.call("cuMemAllocFromPoolAsync", MiB, pool, 2)))
    on(c1, lambda: _driver.call("cuStreamSynchronize", 2))
    return pool, ptr


def _loc(i: int) -> cu.CUmemLocation:
    loc = cu.CUmemLocation()
    loc.type = L.CU_MEM_LOCATION_TYPE_DEVICE
    loc.id = i
    return loc


def _desc(i: int, flags: Any = RW) -> cu.CUmemAccessDesc:
    d = cu.CUmemAccessDesc()
    d.location = _loc(i)
    d.flags = flags
    return d


REFUSED = {"cuMemcpy": "CUDA_ERROR_INVALID_VALUE", "cuMemcpyDtoD": "CUDA_ERROR_INVALID_VALUE",
           "cuMemcpyAsync": "CUDA_ERROR_INVALID_VALUE",
           "cuMemcpyBatchAsync": "CUDA_ERROR_INVALID_VALUE",
           "cuMemcpyPeer": "ok", "cuMemcpyPeerAsync": "ok"}


def _both_ways(c0: Any, c1: Any, local: int, remote: int) -> list[dict[str, str]]:
    """The copy answers from device 0's context: ``remote`` -> ``local``, then back."""
    w1, w2 = (np.arange(MiB) % 241).astype(np.uint8), (np.arange(MiB) % 239).astype(np.uint8)
    _fill(c1, remote, w1)
    back = _copy_answers(c0, local, c0, remote, c1, MiB, w1)
    _fill(c0, local, w2)
    return [back, _copy_answers(c0, remote, c1, local, c0, MiB, w2)]


def test_pool_memory_of_another_device_needs_the_pools_grant(pair: tuple[Any, Any]) -> None:
    # F_copy_pool_memory: from device 0, every copy that names no contexts is refused until
    # the pool grants device 0 access; peer access between the contexts does not help;
    # cuMemcpyPeer, which names both contexts, copies without; device 1's context copies.
    c0, c1 = pair
    pool, remote = _pool_on_1(c1)
    local = _alloc(c0, MiB)
    try:
        assert int(_driver.call("cuMemPoolGetAccess", pool, _loc(0))) == 0
        assert _both_ways(c0, c1, local, remote) == [REFUSED, REFUSED]
        want = (np.arange(MiB) % 233).astype(np.uint8)
        _fill(c1, remote, want)
        answers = _copy_answers(c1, local, c0, remote, c1, MiB, want)
        assert set(answers.values()) == {"ok"}, answers
        on(c0, lambda: _driver.call("cuCtxEnablePeerAccess", c1, 0))
        on(c1, lambda: _driver.call("cuCtxEnablePeerAccess", c0, 0))
        assert _both_ways(c0, c1, local, remote) == [REFUSED, REFUSED]
        _driver.call("cuMemPoolSetAccess", pool, [_desc(0)], 1)
        assert int(_driver.call("cuMemPoolGetAccess", pool, _loc(0))) == int(RW)
        for answers in _both_ways(c0, c1, local, remote):
            assert set(answers.values()) == {"ok"}, answers
        expect(NOT_SUPPORTED, "cuMemPoolSetAccess", pool,
               [_desc(0, cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ)], 1)
        expect(BAD_DEVICE, "cuMemPoolSetAccess", pool,
               [_desc(1, cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_NONE)], 1)
        # revoked with its memory live: refused again (F_pool_grant_revoked)
        _driver.call("cuMemPoolSetAccess", pool,
                     [_desc(0, cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_NONE)], 1)
        assert _both_ways(c0, c1, local, remote) == [REFUSED, REFUSED]
    finally:
        on(c0, lambda: _driver.call("cuMemFree", local))
        on(c1, lambda: _driver.call("cuMemFreeAsync", remote, 2))
        on(c1, lambda: _driver.call("cuStreamSynchronize", 2))
        _driver.call("cuMemPoolDestroy", pool)


def test_mapped_memory_of_another_device_needs_its_grant(pair: tuple[Any, Any]) -> None:
    # F_copy_vmm_memory: as pool memory, with cuMemSetAccess as the grant.
    c0, c1 = pair
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location = _loc(1)
    g = int(_driver.call("cuMemGetAllocationGranularity", prop,
                         cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
    assert g == 2 * MiB
    handle = _driver.call("cuMemCreate", g, prop, 0)
    va = int(_driver.call("cuMemAddressReserve", g, 0, 0, 0))
    local = _alloc(c0, MiB)
    try:
        _driver.call("cuMemMap", va, g, 0, handle, 0)
        _driver.call("cuMemSetAccess", va, g, [_desc(1)], 1)
        assert int(_driver.call("cuMemGetAccess", _loc(0), va)) == 0
        assert _both_ways(c0, c1, local, va) == [REFUSED, REFUSED]
        on(c0, lambda: _driver.call("cuCtxEnablePeerAccess", c1, 0))
        assert _both_ways(c0, c1, local, va) == [REFUSED, REFUSED]
        _driver.call("cuMemSetAccess", va, g, [_desc(0), _desc(1)], 2)
        for answers in _both_ways(c0, c1, local, va):
            assert set(answers.values()) == {"ok"}, answers
    finally:
        on(c0, lambda: _driver.call("cuMemFree", local))
        _driver.call("cuMemUnmap", va, g)
        _driver.call("cuMemAddressFree", va, g)
        _driver.call("cuMemRelease", handle)


@pytest.mark.parametrize("revoke_first", [False, True], ids=["granted", "revoked first"])
def test_a_new_pool_starts_without_a_destroyed_pools_peers(pair: tuple[Any, Any],
                                                           revoke_first: bool) -> None:
    # F_pool_handle_reuse: a pool of device 0 granting device 1 is destroyed (its grant
    # revoked first, or not); every pool made after it, the one that gets its handle again
    # included, starts with no access for device 1. cuda.core revokes before destroying
    # because a recycled handle kept the old pool's access; the two-GPU recording of this
    # case says whether this driver does.
    c0 = pair[0]
    props = cu.CUmemPoolProps()
    props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.location = _loc(0)

    def body() -> list[int]:
        first = _driver.call("cuMemPoolCreate", props)
        _driver.call("cuMemPoolSetAccess", first, [_desc(1)], 1)
        assert int(_driver.call("cuMemPoolGetAccess", first, _loc(1))) == int(RW)
        if revoke_first:
            _driver.call("cuMemPoolSetAccess", first,
                         [_desc(1, cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_NONE)], 1)
        _driver.call("cuMemPoolDestroy", first)
        made = []
        try:
            for _ in range(8):
                made.append(_driver.call("cuMemPoolCreate", props))
                if int(made[-1]) == int(first):
                    break
            return [int(_driver.call("cuMemPoolGetAccess", p, _loc(1))) for p in made]
        finally:
            for p in made:
                _driver.call("cuMemPoolDestroy", p)

    answers = on(c0, body)
    assert answers and answers == [0] * len(answers)


def test_a_copy_on_a_stream_of_the_other_context(pair: tuple[Any, Any]) -> None:
    # F_copy_device_memory ("ctx 0 current, stream of ctx 1"): with peer access both ways,
    # cuMemcpyAsync on device 1's stream from device 0's context copies. Pool memory on such
    # a stream is F_stream_of_other_context (two GPUs); cuda_memkit issues stream-ordered
    # work in the stream's context, so it does not depend on that answer.
    c0, c1 = pair
    n = MiB
    a0, a1 = _alloc(c0, n), _alloc(c1, n)
    s1 = on(c1, lambda: _driver.call("cuStreamCreate", 1))
    try:
        want = (np.arange(n) % 247).astype(np.uint8)
        _fill(c0, a0, want)
        on(c0, lambda: _driver.call("cuCtxEnablePeerAccess", c1, 0))
        on(c1, lambda: _driver.call("cuCtxEnablePeerAccess", c0, 0))

        def copy() -> None:
            _driver.call("cuMemcpyAsync", a1, a0, n, s1)
            _driver.call("cuStreamSynchronize", s1)

        on(c0, copy)
        assert (_read(c1, a1, n) == want).all()
    finally:
        on(c1, lambda: _driver.call("cuStreamDestroy", s1))
        on(c0, lambda: _driver.call("cuMemFree", a0))
        on(c1, lambda: _driver.call("cuMemFree", a1))
