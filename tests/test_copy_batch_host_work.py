"""What the kernel path skips or keeps on the host between calls, and that it stays right.

``copy_batch`` leaves the merge test of equal blocks to the kernel's pick (made
after all when the driver copies the pair); a prebuilt ``CopyBatch`` packs its
launch parameters once, and keeps them while threads share it. All of it is
only worth having if the bytes still land where they belong; and "auto" decides
on the blocks as given, whatever form they are given in.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver
from cuda_memkit._transfer import _kernels
from cuda_memkit._transfer._copy_batch import CopyBatch, copy_batch

from ._helpers import record_calls

KiB = 1 << 10
B = 4 << 10
N = 64


def launches(calls: list[tuple[str, object]]) -> int:
    return sum(api == "cuLaunchKernel" for api, _ in calls)


def batches(calls: list[tuple[str, object]]) -> int:
    return sum(api in ("cuMemcpyBatchAsync", "cuMemcpyAsync") for api, _ in calls)


@pytest.fixture
def host() -> Iterator[cm.HostBuffer]:
    h = cm.HostBuffer.from_array(
        ((np.arange(N * B, dtype=np.uint64) * 2654435761 + 1) % 251).astype(np.uint8))
    yield h
    h.close()


@pytest.fixture
def host_out() -> Iterator[cm.HostBuffer]:
    h = cm.HostBuffer.from_array(np.full(N * B, 0xEE, np.uint8))
    yield h
    h.close()


@pytest.fixture
def dev_out() -> Iterator[cm.DeviceBuffer]:
    d = cm.DeviceBuffer.empty(N * B)
    d.fill(0xEE)
    yield d
    d.close()


@pytest.fixture
def perm() -> np.ndarray:
    return np.random.default_rng(11).permutation(N)


@pytest.mark.parametrize("form", ["int sizes", "sizes array", "triples", "CopyBatch",
                                  "CopyBatch triples"])
def test_auto_decides_by_the_blocks_as_given_in_every_form(
        form: str, host: cm.HostBuffer, dev_out: cm.DeviceBuffer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The same small contiguous blocks, however they are written and whichever API
    # issues them: "auto" decides on the blocks as given (before any merge), so the
    # kernel copies them every time, not only when sizes is one int.
    monkeypatch.setattr(_kernels, "KERNEL_THRESHOLD", 2 * KiB)
    n = 8
    d, s = np.arange(n) * KiB + B, np.arange(n) * KiB
    triples = np.stack([d, s, np.full(n, KiB)], axis=1)
    with record_calls(monkeypatch) as calls:
        if form.startswith("CopyBatch"):
            with CopyBatch() as b:
                if form == "CopyBatch":
                    b.add(dev_out, host, dst_offsets=d, src_offsets=s, sizes=KiB)
                else:
                    b.add(dev_out, host, blocks=triples)
                b.execute()
        elif form == "triples":
            copy_batch(dev_out, host, blocks=triples)
        else:
            copy_batch(dev_out, host, dst_offsets=d, src_offsets=s,
                       sizes=KiB if form == "int sizes" else [KiB] * n)
    assert launches(calls) == 1 and batches(calls) == 0
    got = dev_out.to_numpy()
    assert (got[B: B + n * KiB] == host.array[: n * KiB]).all()
    assert (got[:B] == 0xEE).all() and (got[B + n * KiB:] == 0xEE).all()


def test_small_blocks_the_kernel_refuses_still_merge_for_the_driver(
        host: cm.HostBuffer, host_out: cm.HostBuffer, monkeypatch: pytest.MonkeyPatch) -> None:
    # Pinned host to pinned host: small equal blocks, so the merge test waits for the
    # kernel's pick, which refuses host to host; the driver then gets one merged copy.
    n, b = 16, 256
    with record_calls(monkeypatch) as calls:
        copy_batch(host_out, host, dst_offsets=np.arange(n) * b, src_offsets=np.arange(n) * b,
                   sizes=b)
    assert launches(calls) == 0
    copies = sum(int(args[3]) if api == "cuMemcpyBatchAsync" else 1
                 for api, args in calls if api in ("cuMemcpyBatchAsync", "cuMemcpyAsync"))
    assert copies == 1  # the 16 blocks, merged
    assert (host_out.array[: n * b] == host.array[: n * b]).all()


def test_resident_descriptors_follow_moved_operands(host: cm.HostBuffer, perm: np.ndarray
                                                    ) -> None:
    # One pair's resident descriptors are offsets and its operands' addresses launch
    # parameters (packed once): when the addresses change, the next launch must use the
    # new ones, not the packed old ones.
    from cuda_memkit._transfer import _copy_batch

    first, second = cm.DeviceBuffer.zeros(N * B), cm.DeviceBuffer.zeros(N * B)
    resident = _kernels.Resident()
    try:
        g = _copy_batch._Group(first, host, perm * B, np.arange(N) * B, B, None, None, None)
        ctx = int(_driver.call("cuCtxGetCurrent"))
        for dst in (first, second, first):
            dst.fill(0)
            resident.launch([(g, dst.ptr, host.ptr)], 0, True, ctx)
            cm.Stream.legacy_default().synchronize()
            got = dst.to_numpy()
            for i, slot in enumerate(perm):
                assert (got[slot * B: (slot + 1) * B] == host.array[i * B: (i + 1) * B]).all()
    finally:
        resident.release()
        first.close()
        second.close()


@pytest.mark.multi_gpu
def test_one_batch_executed_from_two_threads_in_two_contexts(
        host: cm.HostBuffer, perm: np.ndarray, two_devices: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Two threads execute one CopyBatch, device 0 current on one and device 1 on the
    # other (each launches its device's pair). The second thread's execution is let run
    # while the first is about to launch: it must not free or replace the descriptors
    # that launch reads (on the GPU: CUDA_ERROR_ILLEGAL_ADDRESS, a context lost).
    with cm.Device(1):
        on1 = cm.DeviceBuffer.zeros(N * B)
    on0 = cm.DeviceBuffer.zeros(N * B)
    batch = CopyBatch()
    real = _driver.call
    second: list[threading.Thread] = []
    errors: list[BaseException] = []

    def in_second_thread() -> None:
        try:
            with cm.Device(1):
                batch.execute()
        except BaseException as e:  # handed to the test's thread
            errors.append(e)

    def spy(api: str, *args: Any) -> Any:
        if api == "cuLaunchKernel" and not second and threading.current_thread() is main:
            t = threading.Thread(target=in_second_thread)
            second.append(t)
            t.start()
            t.join(timeout=0.5)  # it runs to its end unless the batch makes it wait
        return real(api, *args)

    main = threading.current_thread()
    try:
        for dst in (on0, on1):
            batch.add(dst, host, dst_offsets=perm * B, src_offsets=np.arange(N) * B, sizes=B)
        with cm.Device(1):
            batch.execute()  # device 1's descriptors resident
        on1.fill(0)
        with monkeypatch.context() as m:
            m.setattr(_driver, "call", spy)
            with cm.Device(0):
                batch.execute()
            second[0].join()
        assert not errors, errors
        want = np.empty(N * B, np.uint8)
        want.reshape(N, B)[perm] = host.array.reshape(N, B)
        assert (on0.to_numpy() == want).all() and (on1.to_numpy() == want).all()
    finally:
        batch.close()
        on0.close()
        on1.close()


@pytest.mark.multi_gpu
def test_kernel_and_another_devices_pool_memory(host: cm.HostBuffer, perm: np.ndarray,
                                                two_devices: None) -> None:
    # Pool memory has no context: whether device 0's kernel may write device 1's pool
    # memory is the pool's access for device 0 (none by default; read-write once granted).
    # On a stream of device 0 the batch runs there; a synchronous one runs on device 1,
    # whose memory it is.
    def check(buf: cm.PoolBuffer) -> None:
        got = buf.to_numpy()
        for i, slot in enumerate(perm):
            assert (got[slot * B: (slot + 1) * B] == host.array[i * B: (i + 1) * B]).all()

    with cm.Device(0), cm.Stream(0) as s0:
        pool = cm.MemoryPool(1)
        buf = pool.allocate(N * B, stream=None)
        try:
            for method in ("kernel", "auto"):
                with pytest.raises(cm.PeerAccessError, match="no write access"):
                    copy_batch(buf, host, dst_offsets=perm * B, src_offsets=np.arange(N) * B,
                               sizes=B, method=method, stream=s0)
            copy_batch(buf, host, dst_offsets=perm * B, src_offsets=np.arange(N) * B,
                       sizes=B, method="kernel")
            check(buf)
            pool.set_access([0], cm.Access.READWRITE)
            buf.fill(0)
            copy_batch(buf, host, dst_offsets=perm * B, src_offsets=np.arange(N) * B,
                       sizes=B, method="kernel", stream=s0)
            s0.synchronize()
            check(buf)
        finally:
            buf.close()
            pool.close()
