"""copy_batch / CopyBatch: calls of the measured size, attributes, the duplex fork, refusals.

The constants tested here come from the H100's ``copy_batch_probe`` run (see
``cuda_memkit/_transfer/_copy_batch.py``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cuda_memkit as cm
from cuda_memkit._transfer import _copy_batch, _kernels
from cuda_memkit._transfer._copy_batch import CopyBatch, copy_batch

from ._helpers import record_calls
from .test_copy_batch import BATCH, B, N, batches, copies_issued, expected, pattern

KiB, MiB = 1 << 10, 1 << 20


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


# -- calls of a measured size (CALL_MAX copies, CALL_BYTES bytes) ---------------------------


def _contiguous_cover(bounds: list[tuple[int, int]], n: int) -> bool:
    return (bounds[0][0] == 0 and bounds[-1][1] == n
            and all(x[1] == y[0] and x[0] < x[1] for x, y in itertools.pairwise(bounds)))


@pytest.mark.parametrize(("n", "size", "calls", "per_call"), [
    (4096, 64 * KiB, 16, 256),  # the probe's best row: 16 calls of 16 MiB
    (1024, 256 * KiB, 16, 64),  # the probe's best row: 16 calls of 16 MiB
    (65536, 4 * KiB, 256, 256),
    (3, 64 * MiB, 3, 1),  # a block above CALL_BYTES goes alone
])
def test_call_bounds_of_the_measured_shapes(n: int, size: int, calls: int,
                                            per_call: int) -> None:
    bounds = _copy_batch.call_bounds(np.full(n, size, np.int64))
    assert len(bounds) == calls and {b - a for a, b in bounds} == {per_call}
    assert _contiguous_cover(bounds, n)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(1, 40 * MiB) | st.sampled_from([4 * KiB, 64 * KiB, 1]),
                min_size=1, max_size=700))
def test_call_bounds_are_greedy_within_both_limits(sizes: list[int]) -> None:
    z = np.array(sizes, np.int64)
    bounds = _copy_batch.call_bounds(z)
    assert _contiguous_cover(bounds, len(z))
    cap, limit = _copy_batch.CALL_MAX, _copy_batch.CALL_BYTES
    for a, b in bounds:
        assert b - a <= cap
        assert b - a == 1 or sum(sizes[a:b]) <= limit
        if b < len(z):  # the next copy did not fit
            assert b - a == cap or sum(sizes[a:b + 1]) > limit


def test_a_large_batch_goes_in_calls_of_the_measured_size(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    n = 600
    host = cm.HostBuffer.from_array(pattern(n * B, 4))
    dev = cm.DeviceBuffer.empty(n * B)
    perm = np.random.default_rng(5).permutation(n)
    try:
        with record_calls(monkeypatch) as calls:
            copy_batch(dev, host, dst_offsets=perm * B, src_offsets=np.arange(n) * B, sizes=B)
        issued = batches(calls)
        if issued:  # the batch call (not the fallback)
            assert [args[3] for args in issued] == [256, 256, 88]
            assert all(len(args[0]) == args[3] and len(args[2]) == args[3] for args in issued)
        assert (dev.to_numpy().reshape(n, B)[perm] == host.array.reshape(n, B)).all()
    finally:
        host.close()
        dev.close()


def test_variable_sizes_split_by_bytes(host: cm.HostBuffer, dev: cm.DeviceBuffer,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_copy_batch, "CALL_BYTES", 3 * B)
    d_off = np.array([0, 2, 4, 7, 9]) * B
    s_off = np.array([10, 13, 16, 20, 24]) * B
    sizes = np.array([B, 2 * B, 3 * B, B, 4 * B])
    with record_calls(monkeypatch) as calls:
        copy_batch(dev, host, dst_offsets=d_off, src_offsets=s_off, sizes=sizes)
    issued = batches(calls)
    if issued:
        assert [args[2] for args in issued] == [[B, 2 * B], [3 * B], [B], [4 * B]]
    want = expected(np.zeros(N * B, np.uint8), host.array, d_off, s_off, sizes)
    assert (dev.to_numpy() == want).all()


# -- attributes: access order and the overlap flag ----------------------------------------


@pytest.mark.parametrize(("block", "flag"), [(4 * KiB, 1), (4 * KiB + 1, 0), (100, 1)])
def test_overlap_flag_only_for_small_blocks(host: cm.HostBuffer, dev: cm.DeviceBuffer,
                                            block: int, flag: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    assert _copy_batch.OVERLAP_FLAG_MAX_BLOCK == 4 * KiB
    with record_calls(monkeypatch) as calls:
        copy_batch(dev, host, dst_offsets=[0, 4 * B], src_offsets=[8 * B, 12 * B], sizes=block)
    for args in batches(calls):
        assert int(args[4][0].flags) == flag
    assert (dev.to_numpy()[4 * B:4 * B + block] == host.array[12 * B:12 * B + block]).all()


def test_pageable_sources_are_read_in_stream_order(dev: cm.DeviceBuffer, stream: cm.Stream,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    src = pattern(N * B, 12)
    with record_calls(monkeypatch) as calls:
        copy_batch(dev, src, dst_offsets=[B], src_offsets=[0], sizes=B, stream=stream,
                   allow_pageable=True)
    stream.synchronize()
    order = cu.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    for args in batches(calls):
        assert args[4][0].srcAccessOrder == order
    assert (dev.to_numpy()[B:2 * B] == src[:B]).all()


# -- both directions at once: a forked and joined second stream -----------------------------


def _swap(monkeypatch: pytest.MonkeyPatch, floor: int) -> tuple[CopyBatch, list[Any]]:
    monkeypatch.setattr(_copy_batch, "DUPLEX_MIN_BYTES", floor)
    host = cm.HostBuffer.from_array(pattern(N * B, 21))
    dev = cm.DeviceBuffer.empty(N * B)
    back = cm.HostBuffer.zeros(N * B)
    cm.copy(dev, host)
    b = CopyBatch()
    b.add(back, dev, dst_offsets=np.arange(8) * B, src_offsets=np.arange(8, 16)[::-1] * B,
          sizes=B)  # evict device blocks 8..15 to the host
    b.add(dev, host, dst_offsets=np.arange(8) * B, src_offsets=np.arange(16, 24) * B,
          sizes=B)  # load other blocks into device slots 0..7
    return b, [host, dev, back]


def _check_swap(bufs: list[Any]) -> None:
    host, dev, back = bufs
    h = host.array.reshape(N, B)
    assert (back.array.reshape(N, B)[:8] == h[8:16][::-1]).all()
    assert (dev.to_numpy().reshape(N, B)[:8] == h[16:24]).all()


@pytest.mark.parametrize("sync", [False, True])
def test_duplex_batch_forks_and_joins_a_second_stream(stream: cm.Stream, sync: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    b, bufs = _swap(monkeypatch, 8 * B)
    try:
        with record_calls(monkeypatch) as calls:
            b.execute() if sync else b.execute(stream=stream)
        stream.synchronize()
        _check_swap(bufs)
        main = 2 if sync else stream.handle  # the per-thread stream stands in for legacy
        names = [api for api, _ in calls]
        if BATCH in names:  # the batch call (not the fallback)
            seq = [(api, args) for api, args in calls
                   if api in ("cuEventRecord", "cuStreamWaitEvent", BATCH, "cuStreamCreate",
                              "cuStreamDestroy")]
            assert [api for api, _ in seq[:8]] == [
                "cuEventRecord", "cuStreamCreate", "cuStreamWaitEvent", BATCH, BATCH,
                "cuEventRecord", "cuStreamWaitEvent", "cuStreamDestroy"]
            private = int(seq[2][1][0])
            assert int(seq[0][1][1]) == main  # fork: recorded on the caller's stream ...
            assert private != main  # ... waited for by the private stream
            # device to host (8 copies: reversed sources do not merge) on the private
            # stream; host to device (contiguous on both sides: merged into 1) on the caller's
            assert (int(seq[3][1][7]), seq[3][1][3]) == (private, 8)
            assert (int(seq[4][1][7]), seq[4][1][3]) == (main, 1)
            assert int(seq[5][1][1]) == private  # join: recorded on the private stream ...
            assert int(seq[6][1][0]) == main  # ... and waited for by the caller's
            assert int(seq[7][1][0]) == private
            assert names.count("cuEventCreate") >= 1 and "cuEventDestroy" in names
        if sync:
            syncs = [args for api, args in calls if api == "cuStreamSynchronize"]
            assert syncs and int(syncs[-1][0]) == (main if BATCH in names else 0)
    finally:
        for x in bufs:
            x.close()


def test_small_duplex_batch_stays_on_one_stream(stream: cm.Stream,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    b, bufs = _swap(monkeypatch, 8 * B + 1)  # one byte more than each direction moves
    try:
        with record_calls(monkeypatch) as calls:
            b.execute(stream=stream)
        stream.synchronize()
        _check_swap(bufs)
        assert "cuStreamCreate" not in [api for api, _ in calls]
        assert {int(args[7]) for args in batches(calls)} <= {stream.handle}
    finally:
        for x in bufs:
            x.close()


@pytest.mark.sim_only
@pytest.mark.usefixtures("no_batch")
def test_duplex_fallback_without_the_batch_call(stream: cm.Stream,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    b, bufs = _swap(monkeypatch, B)
    try:
        b.execute(stream=stream)
        stream.synchronize()
        _check_swap(bufs)
    finally:
        for x in bufs:
            x.close()


# -- what never reaches the driver ---------------------------------------------------------


def test_copy_batch_object_sees_a_shrunk_buffer(host: cm.HostBuffer,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    g = cm.GrowableBuffer(max_size=64 * MiB)
    try:
        g.resize(4 * MiB)
        b = CopyBatch().add(g, host, dst_offsets=[0, 3 * MiB], src_offsets=[0, B], sizes=B)
        g.resize(MiB)  # the chunk holding byte 3 MiB is unmapped
        with record_calls(monkeypatch) as calls, \
                pytest.raises(ValueError, match=r"now has 1048576 bytes.*reach byte 3149824"):
            b.execute()
        assert not copies_issued(calls)
        g.resize(4 * MiB)  # grown again: valid
        b.execute()
        out = np.zeros(B, np.uint8)
        copy_batch(out, g, dst_offsets=[0], src_offsets=[3 * MiB], sizes=B)
        assert (out == host.array[B:2 * B]).all()
    finally:
        g.close()


def test_a_refused_later_call_leaves_the_earlier_ones_done() -> None:
    # Two calls of 256 copies; the last block starts inside a raw (unchecked)
    # destination of 2 MiB and runs past its end: a clean INVALID_VALUE on the
    # H100 ("dst range past the end of its allocation"), not a crash.
    n = 512
    dev = cm.DeviceBuffer.empty(n * B)
    src = cm.HostBuffer.from_array(pattern((n + 1) * B, 17))
    # With unified addressing the driver may place the pinned source right after the
    # device buffer (H100, device run 1 of 2026-11-24): the overrun then lands on the
    # source, which copy_batch rightly refuses first (ValueError). Keep such a source
    # and take another one.
    placed_after: list[cm.HostBuffer] = []
    while src.ptr < dev.ptr + (n + 1) * B and src.ptr + src.nbytes > dev.ptr + n * B:
        placed_after.append(src)
        src = cm.HostBuffer.from_array(pattern((n + 1) * B, 17))
    s_off = np.arange(n)[::-1] * B  # reversed: nothing merges
    sizes = np.full(n, B)
    sizes[-1] = 2 * B
    try:
        dev.fill(0)
        with pytest.raises(cm.CudaInvalidValueError):
            copy_batch(dev.ptr, src, dst_offsets=np.arange(n) * B, src_offsets=s_off,
                       sizes=sizes)
        got = dev.to_numpy().reshape(n, B)
        want = src.array[:n * B].reshape(n, B)[::-1]
        assert (got[:n - 1] == want[:n - 1]).all()  # every copy before the refused entry
    finally:
        dev.close()
        src.close()
        for h in placed_after:
            h.close()
