"""copy_batch / CopyBatch: scattered blocks between every kind of memory."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _driver, _inflight
from cuda_memkit._transfer import _copy_batch, _kernels
from cuda_memkit._transfer._copy_batch import CopyBatch, copy_batch

from ._helpers import Calls, no_driver_calls, record_calls

B = 4096  # block size
N = 32  # blocks per buffer
BATCH = "cuMemcpyBatchAsync"


def pattern(n: int, seed: int = 1) -> np.ndarray:
    return ((np.arange(n, dtype=np.uint64) * 2654435761 + seed) % 251).astype(np.uint8)


def expected(dst_before: np.ndarray, src: np.ndarray, d_off: Any, s_off: Any,
             sizes: Any) -> np.ndarray:
    out = dst_before.copy()
    for d, s, z in zip(np.broadcast_to(d_off, np.shape(d_off)), s_off,
                       np.broadcast_to(sizes, np.shape(d_off)), strict=True):
        out[d:d + z] = src[s:s + z]
    return out


def batches(calls: Calls) -> list[tuple[Any, ...]]:
    return [args for api, args in calls if api == BATCH]


def copies_issued(calls: Calls) -> list[str]:
    return [api for api, _ in calls if api.startswith("cuMemcpy")]


@pytest.fixture(autouse=True)
def driver_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the driver batch: "auto" never picks the kernel here.

    The kernel path (and "auto" choosing it) is tested in test_copy_batch_kernel.py.
    """
    monkeypatch.setattr(_kernels, "KERNEL_THRESHOLD", 0)


@pytest.fixture
def host() -> Iterator[cm.HostBuffer]:
    h = cm.HostBuffer.from_array(pattern(N * B))
    yield h
    h.close()


@pytest.fixture
def dev() -> Iterator[cm.DeviceBuffer]:
    d = cm.DeviceBuffer.empty(N * B)
    d.fill(0)
    yield d
    d.close()


@pytest.fixture
def perm() -> np.ndarray:
    return np.random.default_rng(7).permutation(N)


# -- data ---------------------------------------------------------------------------------


def test_scattered_host_to_device(host: cm.HostBuffer, dev: cm.DeviceBuffer,
                                  perm: np.ndarray) -> None:
    out = copy_batch(dev, host, dst_offsets=perm * B, src_offsets=np.arange(N) * B, sizes=B)
    assert out is dev
    got = dev.to_numpy().reshape(N, B)
    assert (got[perm] == host.array.reshape(N, B)).all()


def test_scattered_device_to_host_and_device(host: cm.HostBuffer, dev: cm.DeviceBuffer,
                                             perm: np.ndarray) -> None:
    cm.copy(dev, host)
    back = cm.HostBuffer.zeros(N * B)
    other = cm.DeviceBuffer.empty(N * B)
    try:
        copy_batch(back, dev, dst_offsets=np.arange(N) * B, src_offsets=perm * B, sizes=B)
        assert (back.array.reshape(N, B) == host.array.reshape(N, B)[perm]).all()
        copy_batch(other, dev, blocks=[(0, B, B), (B, 0, B)])  # swap the first two blocks
        got = other.to_numpy()
        assert (got[:B] == host.array[B:2 * B]).all() and (got[B:2 * B] == host.array[:B]).all()
    finally:
        back.close()
        other.close()


def test_pageable_numpy_synchronous(dev: cm.DeviceBuffer) -> None:
    src = pattern(N * B, 3)
    d_off = np.array([5, 0, 9]) * B
    s_off = np.array([1, 2, 3]) * B
    copy_batch(dev, src, dst_offsets=d_off, src_offsets=s_off, sizes=B)
    want = expected(np.zeros(N * B, np.uint8), src, d_off, s_off, [B] * 3)
    assert (dev.to_numpy() == want).all()
    dst = np.zeros(N * B, np.uint8)
    copy_batch(dst, dev, dst_offsets=s_off, src_offsets=d_off, sizes=B)
    assert (dst == expected(np.zeros_like(dst), want, s_off, d_off, [B] * 3)).all()


def test_host_to_host_and_variable_sizes(host: cm.HostBuffer) -> None:
    dst = np.zeros(N * B, np.uint8)
    d_off, s_off, sizes = [0, 10_000, 50_000], [7, 3, 60_000], [100, 1, 5000]
    copy_batch(dst, host, dst_offsets=d_off, src_offsets=s_off, sizes=sizes)
    assert (dst == expected(np.zeros_like(dst), host.array, d_off, s_off, sizes)).all()


def test_registered_and_pool_and_cai_operands(dev: cm.DeviceBuffer) -> None:
    arr = pattern(N * B, 5)
    pool = cm.MemoryPool(0)
    s = cm.Stream()
    try:
        with cm.register_host(arr):
            pb = pool.allocate(N * B, stream=s)
            copy_batch(pb, arr, dst_offsets=[B, 0], src_offsets=[0, B], sizes=B, stream=s)
            cai_src = type("CAI", (), {"__cuda_array_interface__": {
                "data": (pb.ptr, False), "shape": (N * B,), "typestr": "|u1", "version": 3}})()
            copy_batch(dev, cai_src, blocks=np.array([[0, 0, 2 * B]]), stream=s)
            s.synchronize()
            got = dev.to_numpy()
            assert (got[:B] == arr[B:2 * B]).all() and (got[B:2 * B] == arr[:B]).all()
            pb.free(stream=s)
            s.synchronize()
    finally:
        pool.close()
        s.close()


@pytest.mark.uses_managed_memory
def test_managed_with_location_hints(dev: cm.DeviceBuffer, host: cm.HostBuffer,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    m = cm.ManagedBuffer.zeros(N * B)
    try:
        with record_calls(monkeypatch) as calls:
            copy_batch(m, host, dst_offsets=[0, B], src_offsets=[B, 0], sizes=B,
                       dst_location=cm.Location.device(0), src_location=cm.Location.host())
        at = batches(calls)[0][4][0] if batches(calls) else None
        if at is not None:  # the batch call (not the fallback)
            assert int(at.dstLocHint.type) == int(cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE)
            assert int(at.srcLocHint.type) == int(cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST)
        assert (m.array[:B] == host.array[B:2 * B]).all()
        assert (m.array[B:2 * B] == host.array[:B]).all()
        copy_batch(dev, m, dst_offsets=[0], src_offsets=[0], sizes=2 * B, src_location=0)
        assert (dev.to_numpy()[:2 * B] == m.array[:2 * B]).all()
    finally:
        m.close()


def test_same_buffer_moves(dev: cm.DeviceBuffer, host: cm.HostBuffer) -> None:
    cm.copy(dev, host)
    copy_batch(dev, dev, dst_offsets=[0, 4 * B], src_offsets=[8 * B, 12 * B], sizes=2 * B)
    got = dev.to_numpy()
    h = host.array
    assert (got[:2 * B] == h[8 * B:10 * B]).all() and (got[4 * B:6 * B] == h[12 * B:14 * B]).all()
    assert (got[2 * B:4 * B] == h[2 * B:4 * B]).all()


def test_triples_and_arrays_agree(host: cm.HostBuffer, perm: np.ndarray) -> None:
    a = cm.HostBuffer.zeros(N * B)
    b = cm.HostBuffer.zeros(N * B)
    try:
        d_off, s_off = perm[:10] * B, np.arange(10) * B
        copy_batch(a, host, dst_offsets=d_off, src_offsets=s_off, sizes=np.full(10, B))
        copy_batch(b, host, blocks=[(int(x), int(y), B) for x, y in zip(d_off, s_off,
                                                                         strict=True)])
        assert (a.array == b.array).all() and a.array.any()
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.int32, np.uint32, np.int64,
                                   np.uint64])
def test_any_integer_dtype(host: cm.HostBuffer, dev: cm.DeviceBuffer, dtype: Any) -> None:
    copy_batch(dev, host, dst_offsets=np.array([110, 0], dtype),
               src_offsets=np.array([0, 1], dtype), sizes=np.array([10, 100], dtype))
    got = dev.to_numpy()
    assert (got[110:120] == host.array[:10]).all() and (got[:100] == host.array[1:101]).all()


# -- merging, skipping, what is issued ---------------------------------------------------


def test_contiguous_runs_are_merged(host: cm.HostBuffer, dev: cm.DeviceBuffer,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    with record_calls(monkeypatch) as calls:
        copy_batch(dev, host, dst_offsets=np.arange(8) * B, src_offsets=np.arange(8) * B,
                   sizes=B)
        # contiguous on the destination only: not merged
        copy_batch(dev, host, dst_offsets=np.arange(4) * B, src_offsets=[3 * B, B, 0, 2 * B],
                   sizes=B)
        # two runs, given out of order: [8,9,10] and [20,21]
        copy_batch(dev, host, dst_offsets=np.array([21, 9, 20, 8, 10]) * B,
                   src_offsets=np.array([2, 11, 1, 10, 12]) * B, sizes=B)
    issued = batches(calls)
    if issued:
        counts = [args[3] for args in issued]
        assert counts == [1, 4, 2]
        assert issued[0][2] == [8 * B]
        assert sorted(issued[2][2]) == [2 * B, 3 * B]
    got = dev.to_numpy().reshape(N, B)
    h = host.array.reshape(N, B)
    assert (got[8:11] == h[10:13]).all() and (got[20:22] == h[1:3]).all()


def test_zero_size_blocks_are_skipped(host: cm.HostBuffer, dev: cm.DeviceBuffer,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    with record_calls(monkeypatch) as calls:
        copy_batch(dev, host, dst_offsets=[0, 5 * B, N * B], src_offsets=[0, 0, N * B],
                   sizes=[0, B, 0])
    assert (dev.to_numpy()[5 * B:6 * B] == host.array[:B]).all()
    for args in batches(calls):
        assert args[3] == 1 and args[2] == [B]


def test_nothing_to_copy_makes_no_call(host: cm.HostBuffer, dev: cm.DeviceBuffer,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch):
        copy_batch(dev, host, dst_offsets=[], src_offsets=[], sizes=[])
        copy_batch(dev, host, dst_offsets=[0, B], src_offsets=[0, 0], sizes=0)
        copy_batch(dev, host, blocks=[])
        copy_batch(dev, host, blocks=np.zeros((0, 3), np.int64))


def test_uniform_and_variable_sizes_lists(host: cm.HostBuffer, dev: cm.DeviceBuffer,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    with record_calls(monkeypatch) as calls:
        copy_batch(dev, host, dst_offsets=[0, 2 * B], src_offsets=[0, 2 * B], sizes=[B, 100])
    for args in batches(calls):
        sizes = args[2]
        assert sorted(sizes) == [100, B] and all(type(x) is int for x in sizes)
        assert all(isinstance(p, cu.CUdeviceptr) for p in args[0] + args[1])
        attrs, idxs, nattrs = args[4], args[5], args[6]
        assert nattrs == 1 and idxs == [0]
        order = cu.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
        assert attrs[0].srcAccessOrder == order


@pytest.mark.sim_only
def test_large_batches_are_split(host: cm.HostBuffer, dev: cm.DeviceBuffer, perm: np.ndarray,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_copy_batch, "CALL_MAX", 5)
    back = cm.HostBuffer.zeros(N * B)
    try:
        b = CopyBatch()
        b.add(dev, host, dst_offsets=perm[:12] * B, src_offsets=np.arange(12) * B, sizes=B)
        b.add(back, host, dst_offsets=perm[:7] * B, src_offsets=np.arange(7) * B, sizes=B)
        with record_calls(monkeypatch) as calls:
            b.execute()
        counts = [(args[3], args[5], args[6]) for args in batches(calls)]
        # 19 copies in calls of 5: the pairs change inside the third call
        assert counts == [(5, [0], 1), (5, [0], 1), (5, [0, 2], 2), (4, [0], 1)]
        h = host.array.reshape(N, B)
        assert (dev.to_numpy().reshape(N, B)[perm[:12]] == h[:12]).all()
        assert (back.array.reshape(N, B)[perm[:7]] == h[:7]).all()
    finally:
        back.close()


# -- streams, lifetimes, fallback ---------------------------------------------------------


def test_stream_ordered_keeps_operands_alive(dev: cm.DeviceBuffer, stream: cm.Stream,
                                            perm: np.ndarray) -> None:
    src = cm.HostBuffer.from_array(pattern(N * B, 9))
    want = src.array.reshape(N, B).copy()
    copy_batch(dev, src, dst_offsets=perm * B, src_offsets=np.arange(N) * B, sizes=B,
               stream=stream)
    del src  # the pending copy holds it
    stream.synchronize()
    _inflight.reap_pending()
    assert _inflight.pending_count() == 0
    assert (dev.to_numpy().reshape(N, B)[perm] == want).all()


@pytest.mark.parametrize("legacy", [None, 0, 1, cm.Stream.legacy_default])
def test_legacy_default_stream_goes_to_the_per_thread_stream(
        host: cm.HostBuffer, dev: cm.DeviceBuffer, legacy: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    st = legacy() if callable(legacy) else legacy
    with record_calls(monkeypatch) as calls:
        if st is None:
            copy_batch(dev, host, dst_offsets=[B], src_offsets=[0], sizes=B)
        else:
            copy_batch(dev, host, dst_offsets=[B], src_offsets=[0], sizes=B, stream=st)
            _driver.call("cuStreamSynchronize", 0)
    issued = batches(calls)
    if issued:
        assert int(issued[0][7]) == 2  # CU_STREAM_PER_THREAD
    if st is None:  # synchronous: it waited for that stream
        syncs = [args for api, args in calls if api == "cuStreamSynchronize"]
        assert syncs and int(syncs[0][0]) == (2 if issued else 0)
    assert (dev.to_numpy()[B:2 * B] == host.array[:B]).all()


def test_per_thread_stream_directly(host: cm.HostBuffer, dev: cm.DeviceBuffer) -> None:
    copy_batch(dev, host, dst_offsets=[0], src_offsets=[B], sizes=B, stream=2)
    _driver.call("cuStreamSynchronize", 2)
    assert (dev.to_numpy()[:B] == host.array[B:2 * B]).all()


@pytest.mark.sim_only
@pytest.mark.usefixtures("no_batch")
@pytest.mark.parametrize("with_stream", [False, True])
def test_fallback_without_the_batch_call(host: cm.HostBuffer, dev: cm.DeviceBuffer,
                                         perm: np.ndarray, stream: cm.Stream,
                                         with_stream: bool,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    loop: list[tuple[Any, ...]] = []
    real_function = _driver.function

    def spy_function(api: str) -> Any:
        fn = real_function(api)
        if api != "cuMemcpyAsync":
            return fn

        def counted(*args: Any) -> Any:
            loop.append(args)
            return fn(*args)
        return counted

    monkeypatch.setattr(_driver, "function", spy_function)
    kw: dict[str, Any] = {"stream": stream} if with_stream else {}
    with record_calls(monkeypatch) as calls:
        copy_batch(dev, host, dst_offsets=perm[:10] * B, src_offsets=np.arange(10) * B,
                   sizes=B, **kw)
    stream.synchronize()
    assert [api for api, _ in calls if api == BATCH] == [BATCH]  # tried, not found
    assert len(loop) == 10 - int((np.diff(perm[:10]) == 1).sum())
    assert {int(args[3]) for args in loop} == {stream.handle if with_stream else 0}
    assert (dev.to_numpy().reshape(N, B)[perm[:10]] == host.array.reshape(N, B)[:10]).all()


def test_threads_use_their_own_slots(dev: cm.DeviceBuffer) -> None:
    srcs = [cm.HostBuffer.from_array(pattern(N * B, k)) for k in range(4)]
    dsts = [cm.HostBuffer.zeros(N * B) for _ in range(4)]
    errors: list[BaseException] = []
    rng = np.random.default_rng(3)
    perms = [rng.permutation(N) for _ in range(4)]

    def work(k: int) -> None:
        try:
            for _ in range(20):
                copy_batch(dsts[k], srcs[k], dst_offsets=perms[k] * B,
                           src_offsets=np.arange(N) * B, sizes=B)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors
        for k in range(4):
            got = dsts[k].array.reshape(N, B)[perms[k]]
            assert (got == srcs[k].array.reshape(N, B)).all()
    finally:
        for b in srcs + dsts:
            b.close()


@pytest.mark.parametrize("mode", ["busy", "no views"])
def test_pointer_lists_without_shared_slots(host: cm.HostBuffer, dev: cm.DeviceBuffer,
                                            perm: np.ndarray, mode: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    slots = _copy_batch._slots
    if slots.cap == 0:
        slots.grow(1)
    monkeypatch.setattr(slots, "busy" if mode == "busy" else "ok",
                        mode == "busy")
    copy_batch(dev, host, dst_offsets=perm * B, src_offsets=np.arange(N) * B, sizes=B)
    assert (dev.to_numpy().reshape(N, B)[perm] == host.array.reshape(N, B)).all()


# -- CopyBatch --------------------------------------------------------------------------


def test_copy_batch_object_two_directions(host: cm.HostBuffer, dev: cm.DeviceBuffer,
                                          stream: cm.Stream,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    cm.copy(dev, host)
    back = cm.HostBuffer.zeros(N * B)
    try:
        b = CopyBatch()
        assert b.add(back, dev, dst_offsets=[0, B], src_offsets=[4 * B, 6 * B], sizes=B) is b
        b.add(dev, host, dst_offsets=[0, 2 * B], src_offsets=[10 * B, 11 * B], sizes=B)
        assert b.blocks == 4 and len(b) == 4 and b.nbytes == 4 * B
        assert "2 pairs" in repr(b)
        with record_calls(monkeypatch) as calls:
            b.execute(stream=stream)
        stream.synchronize()
        issued = batches(calls)
        if issued:
            assert len(issued) == 1 and issued[0][3] == 4
            assert issued[0][5] == [0, 2] and issued[0][6] == 2
        h = host.array
        assert (back.array[:B] == h[4 * B:5 * B]).all()
        assert (back.array[B:2 * B] == h[6 * B:7 * B]).all()
        got = dev.to_numpy()
        assert (got[:B] == h[10 * B:11 * B]).all() and (got[2 * B:3 * B] == h[11 * B:12 * B]).all()
        b.execute()  # again, synchronously
    finally:
        back.close()


def test_copy_batch_object_refuses_aliasing_pairs(host: cm.HostBuffer,
                                                  dev: cm.DeviceBuffer,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    back = cm.HostBuffer.zeros(N * B)
    try:
        # evict block 0 to host and load another block into the same device slot
        b = CopyBatch().add(back, dev, dst_offsets=[0], src_offsets=[0], sizes=B)
        b.add(dev, host, dst_offsets=[0], src_offsets=[B], sizes=B)
        with record_calls(monkeypatch) as calls, pytest.raises(ValueError, match="source block"):
            b.execute()
        two = CopyBatch().add(dev, host, dst_offsets=[0], src_offsets=[0], sizes=B)
        two.add(dev, host, dst_offsets=[B // 2], src_offsets=[B], sizes=B)
        with pytest.raises(ValueError, match="overlapping memory"):
            two.execute()
        assert not copies_issued(calls)
    finally:
        back.close()


def test_copy_batch_object_sees_closed_buffers(host: cm.HostBuffer) -> None:
    d = cm.DeviceBuffer.empty(N * B)
    b = CopyBatch().add(d, host, dst_offsets=[0], src_offsets=[0], sizes=B)
    d.close()
    with pytest.raises(cm.ClosedError):
        b.execute()


# -- bad input: refused before anything is issued -----------------------------------------

BAD: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("lengths", {"dst_offsets": [0, B], "src_offsets": [0], "sizes": B}, ValueError, "entries"),
    ("sizes length", {"dst_offsets": [0, B], "src_offsets": [0, B], "sizes": [B]}, ValueError,
     "entries"),
    ("negative dst", {"dst_offsets": [0, -B], "src_offsets": [0, B], "sizes": B}, ValueError,
     r"dst_offsets\[1\] is negative"),
    ("negative src", {"dst_offsets": [0], "src_offsets": [-1], "sizes": B}, ValueError,
     "negative"),
    ("negative size", {"dst_offsets": [0], "src_offsets": [0], "sizes": [-5]}, ValueError,
     "negative"),
    ("negative scalar size", {"dst_offsets": [0], "src_offsets": [0], "sizes": -5}, ValueError,
     ">= 0"),
    ("dst past end", {"dst_offsets": [0, (N - 1) * B + 1], "src_offsets": [0, B], "sizes": B},
     ValueError, "block 1 is out of range: destination"),
    ("src past end", {"dst_offsets": [0], "src_offsets": [N * B], "sizes": 1}, ValueError,
     "out of range: source"),
    ("huge offset", {"dst_offsets": [2**62], "src_offsets": [0], "sizes": B}, ValueError,
     "out of range"),
    ("uint64 above int64", {"dst_offsets": np.array([2**63], np.uint64), "src_offsets": [0],
                            "sizes": B}, ValueError, "2\\*\\*63"),
    ("overlapping dst", {"dst_offsets": [B, 0, B + 100], "src_offsets": [0, B, 2 * B],
                         "sizes": B}, ValueError, "destination blocks 0 and 2 overlap"),
    ("float offsets", {"dst_offsets": [0.0, 4096.0], "src_offsets": [0, B], "sizes": B},
     TypeError, "integers"),
    ("bool offsets", {"dst_offsets": [True], "src_offsets": [0], "sizes": B}, TypeError,
     "integers"),
    ("bool size", {"dst_offsets": [0], "src_offsets": [0], "sizes": True}, TypeError, "bool"),
    ("offsets past 64 bits", {"dst_offsets": [0, 2**70], "src_offsets": [0, 0], "sizes": 1},
     ValueError, "past 64 bits"),
    ("object offsets", {"dst_offsets": [0, None], "src_offsets": [0, 0], "sizes": 1},
     TypeError, "integers"),
    ("2-D offsets", {"dst_offsets": [[0]], "src_offsets": [[0]], "sizes": B}, ValueError,
     "one-dimensional"),
    ("string offsets", {"dst_offsets": "0", "src_offsets": [0], "sizes": B}, TypeError,
     "integers"),
    ("missing sizes", {"dst_offsets": [0], "src_offsets": [0]}, TypeError, "needs"),
    ("blocks and arrays", {"blocks": [(0, 0, B)], "sizes": B}, TypeError, "not both"),
    ("blocks shape", {"blocks": [(0, 0)]}, ValueError, "triples"),
    ("blocks floats", {"blocks": [(0.5, 0, B)]}, TypeError, "integers"),
    ("blocks negative", {"blocks": [(0, 0, -1)]}, ValueError, "negative"),
    ("src overlaps dst", {}, ValueError, "source block overlaps"),
]


@pytest.mark.parametrize(("label", "kwargs", "exc", "match"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_refused_before_any_call(host: cm.HostBuffer, dev: cm.DeviceBuffer,
                                              label: str, kwargs: dict[str, Any],
                                              exc: type[Exception], match: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    before = dev.to_numpy()
    dst, src = dev, host
    if label == "src overlaps dst":
        src = dev
        kwargs = {"dst_offsets": [0, 4 * B], "src_offsets": [2 * B, B], "sizes": 2 * B}
    with no_driver_calls(monkeypatch), pytest.raises(exc, match=match):
        copy_batch(dst, src, **kwargs)
    assert (dev.to_numpy() == before).all()


def test_closed_and_read_only_operands(host: cm.HostBuffer,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    d = cm.DeviceBuffer.empty(N * B)
    d.close()
    ro = np.zeros(N * B, np.uint8)
    ro.flags.writeable = False
    with no_driver_calls(monkeypatch):
        with pytest.raises(cm.ClosedError):
            copy_batch(d, host, dst_offsets=[0], src_offsets=[0], sizes=B)
        with pytest.raises(cm.ClosedError):
            copy_batch(host, d, dst_offsets=[0], src_offsets=[0], sizes=B)
        with pytest.raises(ValueError, match="read-only"):
            copy_batch(ro, host, dst_offsets=[0], src_offsets=[0], sizes=B)
        with pytest.raises(TypeError):
            copy_batch(None, host, dst_offsets=[0], src_offsets=[0], sizes=B)
        with pytest.raises(ValueError, match="null pointer"):
            copy_batch(0, host, dst_offsets=[0], src_offsets=[0], sizes=B)
        with pytest.raises(TypeError):
            copy_batch(host, host, dst_offsets=[0], src_offsets=[B], sizes=B,
                       src_location="host")


@pytest.mark.parametrize("side", ["source", "destination"])
def test_pageable_memory_needs_allow_pageable_on_a_stream(dev: cm.DeviceBuffer,
                                                           stream: cm.Stream, side: str,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    arr = pattern(N * B, 11)
    dst, src = (dev, arr) if side == "source" else (arr, dev)
    with record_calls(monkeypatch) as calls, pytest.raises(ValueError, match=f"{side} is "
                                                                            "pageable"):
        copy_batch(dst, src, dst_offsets=[0], src_offsets=[0], sizes=B, stream=stream)
    assert not copies_issued(calls)
    copy_batch(dst, src, dst_offsets=[0], src_offsets=[0], sizes=B, stream=stream,
               allow_pageable=True)
    stream.synchronize()
    if side == "source":
        assert (dev.to_numpy()[:B] == arr[:B]).all()
    else:
        assert (arr[:B] == dev.to_numpy()[:B]).all()


def test_pinned_numpy_views_are_not_pageable(dev: cm.DeviceBuffer, host: cm.HostBuffer,
                                             stream: cm.Stream) -> None:
    copy_batch(dev, host.array, dst_offsets=[0], src_offsets=[B], sizes=B, stream=stream)
    stream.synchronize()
    assert (dev.to_numpy()[:B] == host.array[B:2 * B]).all()


def test_bad_stream_is_refused(dev: cm.DeviceBuffer, host: cm.HostBuffer,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    s = cm.Stream()
    s.close()
    with no_driver_calls(monkeypatch):
        with pytest.raises(cm.ClosedError):
            copy_batch(dev, host, dst_offsets=[0], src_offsets=[0], sizes=B, stream=s)
        with pytest.raises(TypeError):
            copy_batch(dev, host, dst_offsets=[0], src_offsets=[0], sizes=B, stream="s")
