"""Copies between the memory of two devices, every kind and every path.

``copy`` (synchronous and on a stream of either device), ``copy_batch`` (the
driver's batch and the kernel path) and ``CopyBatch`` between device,
pool (cached and not), growable, mapped and managed memory of device 0 and of
device 1; pool and mapped memory granted to the other device (``peers=``,
``set_access``). Without the grant a copy names the call that grants it
(``PeerAccessError``) before anything is issued. Runs on the simulator and on
two GPUs that reach each other; every test starts and ends with no peer access.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver

from ._helpers import record_calls
from ._peer import no_peer_access

pytestmark = pytest.mark.multi_gpu

MiB = 1 << 20
N = 2 * MiB  # one VMM granule
KINDS = ("device", "pool", "pool_cached", "growable", "mapping", "managed")
COPIES = ("cuMemcpy", "cuMemcpyAsync", "cuMemcpyBatchAsync", "cuLaunchKernel")


@pytest.fixture(autouse=True)
def clean(two_devices: None) -> Iterator[None]:
    if not cm.Device(0).can_access_peer(1):
        pytest.skip("devices 0 and 1 are not peers")
    with no_peer_access():
        yield


def make(kind: str, device: int, stack: ExitStack, *, granted: bool = True) -> Any:
    """``N`` bytes of ``kind`` memory of ``device``; the other device granted access."""
    other = [1 - device] if granted else []
    if kind == "device":
        return stack.enter_context(cm.DeviceBuffer.zeros(N, np.uint8, device=device))
    if kind in ("pool", "pool_cached"):
        pool = stack.enter_context(cm.MemoryPool(device, peers=other,
                                                 cache=kind == "pool_cached"))
        with cm.Device(device), cm.Stream(device) as s:
            buf = pool.allocate(N, stream=s)
            s.synchronize()
        stack.callback(buf.close)
        return buf
    if kind == "growable":
        grow = stack.enter_context(cm.GrowableBuffer(4 * N, device=device, peers=other))
        grow.resize(N)
        return grow
    if kind == "mapping":
        phys = stack.enter_context(cm.PhysicalMemory.create(N, device=device))
        rng = stack.enter_context(cm.AddressRange.reserve(N))
        m = stack.enter_context(rng.map(phys))
        m.set_access([device, *other])
        return m
    return stack.enter_context(cm.ManagedBuffer.zeros(N, np.uint8))


def pattern(seed: int) -> np.ndarray[Any, Any]:
    return ((np.arange(N, dtype=np.uint32) * 31 + seed) % 253).astype(np.uint8)


def reset(buf: Any, data: np.ndarray[Any, Any]) -> None:
    cm.copy(buf, data)


def paths(dst: Any, src: Any) -> dict[str, Callable[[], None]]:
    """Every way to copy ``src`` into ``dst`` (each complete when it returns)."""
    offs = np.arange(N // 4096) * 4096

    def on_stream(device: int) -> Callable[[], None]:
        def run() -> None:
            with cm.Device(device), cm.Stream(device) as s:
                cm.copy_async(dst, src, stream=s)
                s.synchronize()
        return run

    def batch(method: str, device: int) -> Callable[[], None]:
        def run() -> None:
            with cm.Device(device), cm.Stream(device) as s:
                cm.copy_batch(dst, src, dst_offsets=offs, src_offsets=offs, sizes=4096,
                              stream=s, method=method)
                s.synchronize()
        return run

    def prebuilt() -> None:
        with cm.CopyBatch() as b, cm.Device(1), cm.Stream(1) as s:
            b.add(dst, src, dst_offsets=offs[::-1], src_offsets=offs[::-1], sizes=4096)
            b.execute(s)
            b.execute(s, method="kernel")
            s.synchronize()

    def sync(device: int) -> Callable[[], None]:
        def run() -> None:
            with cm.Device(device):
                cm.copy(dst, src)
        return run

    return {"copy from 0": sync(0), "copy from 1": sync(1), "copy_async on 0": on_stream(0),
            "copy_async on 1": on_stream(1), "copy_batch driver on 0": batch("driver", 0),
            "copy_batch kernel on 1": batch("kernel", 1), "CopyBatch on 1": prebuilt}


@pytest.mark.parametrize(("src_kind", "dst_kind"), [
    pytest.param(a, b, marks=pytest.mark.uses_managed_memory) if "managed" in (a, b) else (a, b)
    for a, b in itertools.product(KINDS, KINDS)])
def test_every_kind_to_every_kind_across_devices(src_kind: str, dst_kind: str) -> None:
    with ExitStack() as stack:
        src = make(src_kind, 0, stack)
        dst = make(dst_kind, 1, stack)
        for i, (name, run) in enumerate(paths(dst, src).items()):
            want = pattern(i)
            reset(src, want)
            reset(dst, np.zeros(N, np.uint8))
            run()
            assert (dst.to_numpy() == want).all(), f"{src_kind} -> {dst_kind}: {name}"


@pytest.mark.sim_only
def test_context_memory_goes_peer_to_peer() -> None:
    from cuda_memkit.sim import _peer as sim_peer

    st = sim_peer.state()
    with ExitStack() as stack:
        a, b = make("device", 0, stack), make("device", 1, stack)
        for name, run in paths(b, a).items():
            staged = st.staged
            run()
            assert st.staged == staged, name
    assert cm.Device(0).peer_access_enabled(1) and cm.Device(1).peer_access_enabled(0)


@pytest.mark.parametrize("kind", ["pool", "growable", "mapping"])
def test_a_missing_grant_names_the_call_before_anything_is_issued(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    grant = {"pool": r"MemoryPool\(1, peers=\[0\]\) or pool.set_access\(0",
             "growable": r"GrowableBuffer\(\.\.\., device=1, peers=\[0\]\) or "
                         r"buf.grant_access\(0\)",
             "mapping": r"mapping.set_access\(\[1, 0\]\)"}[kind]
    with ExitStack() as stack:
        remote = make(kind, 1, stack, granted=False)
        local = make("device", 0, stack)
        offs = np.arange(4) * 4096
        with cm.Device(0), cm.Stream(0) as s:
            calls_made = []
            for attempt in (
                    lambda: cm.copy_async(remote, local, stream=s),
                    lambda: cm.copy_async(local, remote, stream=s),
                    lambda: cm.copy_batch(remote, local, dst_offsets=offs, src_offsets=offs,
                                          sizes=4096, stream=s),
                    lambda: cm.copy_batch(local, remote, dst_offsets=offs, src_offsets=offs,
                                          sizes=4096, stream=s, method="kernel")):
                with record_calls(monkeypatch) as calls, \
                        pytest.raises(cm.PeerAccessError, match=grant) as info:
                    attempt()
                assert isinstance(info.value, ValueError)
                assert info.value.name == "CUDA_ERROR_INVALID_VALUE"
                calls_made += [api for api, _ in calls if api in COPIES]
            assert not calls_made
            s.synchronize()


@pytest.mark.parametrize("kind", ["pool", "growable", "mapping"])
def test_a_synchronous_copy_runs_on_the_device_that_was_granted(kind: str) -> None:
    with ExitStack() as stack:
        remote = make(kind, 1, stack, granted=False)  # device 0 may not touch it
        local = make("device", 0, stack)
        want = pattern(7)
        reset(local, want)
        with cm.Device(0):
            cm.copy(remote, local)  # device 1 copies (its peer access to device 0 enabled)
            assert int(_driver.call("cuCtxGetDevice")) == 0  # the caller's context kept
        assert (remote.to_numpy() == want).all()
        assert cm.Device(1).peer_access_enabled(0)


def test_two_ungranted_pools_name_both_grants() -> None:
    with ExitStack() as stack:
        pa = make("pool", 0, stack, granted=False)
        pb = make("pool", 1, stack, granted=False)
        with pytest.raises(cm.PeerAccessError) as info:
            cm.copy(pb, pa)
        text = str(info.value)
        assert "MemoryPool(1, peers=[0])" in text and "MemoryPool(0, peers=[1])" in text
        assert text.startswith("cuMemcpy: CUDA_ERROR_INVALID_VALUE")


def test_scattered_blocks_between_devices_on_the_kernel_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # expert-parallel token shuffles: many small blocks from device 0 to device 1, the kernel
    # of device 1 reading device 0's memory (65536 x 4 KiB in benchmarks/bench_multigpu.py)
    n, block = 4096, 4096
    rng = np.random.default_rng(5)
    src_off = rng.permutation(n) * block
    dst_off = np.arange(n) * block
    data = rng.integers(0, 256, n * block, dtype=np.uint8)
    with ExitStack() as stack:
        src = stack.enter_context(cm.DeviceBuffer.from_array(data, device=0))
        dst = stack.enter_context(cm.DeviceBuffer.zeros(n * block, np.uint8, device=1))
        with cm.Device(1), cm.Stream(1) as s, record_calls(monkeypatch) as calls:
            cm.copy_batch(dst, src, dst_offsets=dst_off, src_offsets=src_off, sizes=block,
                          stream=s, method="kernel")
            s.synchronize()
        assert sum(api == "cuLaunchKernel" for api, _ in calls) == 1
        assert cm.Device(1).peer_access_enabled(0)
        got = dst.to_numpy().reshape(n, block)
        assert (got == data.reshape(n, block)[src_off // block]).all()


def test_closed_operands_and_streams_fail_before_the_driver(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ._nothing import nothing_allocated

    a = cm.DeviceBuffer.zeros(4096, np.uint8, device=0)
    b = cm.DeviceBuffer.zeros(4096, np.uint8, device=1)
    s = cm.Stream(0)
    s.close()
    try:
        with nothing_allocated(monkeypatch):
            with pytest.raises(cm.ClosedError):
                cm.copy(b, a, stream=s)
            with pytest.raises(cm.ClosedError):
                cm.copy_batch(b, a, dst_offsets=[0], src_offsets=[0], sizes=16, stream=s)
        assert not cm.Device(0).peer_access_enabled(1)
        b.close()
        with nothing_allocated(monkeypatch), pytest.raises(cm.ClosedError):
            cm.copy(b, a)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("kind", ["device", "pool", "growable", "mapping"])
def test_host_copies_of_another_devices_memory_from_any_context(kind: str) -> None:
    # Host <-> device 1's memory with device 0's context current involves one device: it
    # needs no grant (the copy runs where the memory is) for every export path too.
    with ExitStack() as stack:
        remote = make(kind, 1, stack, granted=False)
        want = pattern(3)
        with cm.Device(0):
            remote.copy_from(want)
            assert (remote.to_numpy() == want).all()
            out = np.zeros(N, np.uint8)
            cm.copy(out, remote)
            assert (out == want).all()
            remote.fill(5)
            assert int(_driver.call("cuCtxGetDevice")) == 0
        assert (remote.to_numpy() == 5).all()


def test_a_copy_on_another_devices_stream_stays_asynchronous(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Issued in the stream's context, so that the operands' hold (an event) goes on the
    # stream rather than waiting for the copy; the caller's context is kept.
    with ExitStack() as stack:
        a, b = make("device", 0, stack), make("device", 1, stack)
        s0 = stack.enter_context(cm.Stream(0))
        with cm.Device(1), record_calls(monkeypatch) as calls:
            cm.copy_async(b, a, stream=s0)
            assert int(_driver.call("cuCtxGetDevice")) == 1
        made = [api for api, _ in calls]
        assert "cuMemcpyAsync" in made and "cuStreamSynchronize" not in made
        assert made.index("cuCtxPushCurrent") < made.index("cuMemcpyAsync")
        s0.synchronize()


# -- work on a stream runs in the stream's context, whatever is current ---------------------

GRANTED_KINDS = ("pool", "pool_cached", "growable", "mapping")


def _stream_paths(buf: Any, host: Any, s: Any) -> dict[str, Callable[[], None]]:
    """Every stream-ordered way to write ``buf`` (device 1) and read it back into ``host``."""
    offs = np.arange(N // 4096) * 4096

    def batch() -> None:
        cm.copy_batch(buf, host, dst_offsets=offs, src_offsets=offs, sizes=4096, stream=s)

    def prebuilt() -> None:
        with cm.CopyBatch() as b:
            b.add(buf, host, dst_offsets=offs[::-1], src_offsets=offs[::-1], sizes=4096)
            b.execute(s)

    return {"copy_async": lambda: cm.copy_async(buf, host, stream=s),
            "copy(stream=)": lambda: cm.copy(buf, host, stream=s),
            "copy_from(stream=)": lambda: buf.copy_from(host, stream=s),
            "copy_async into a view": lambda: cm.copy_async(buf.as_array(), host, stream=s),
            "copy_batch": batch, "CopyBatch.execute": prebuilt}


@pytest.mark.parametrize("handle", [False, True], ids=["Stream", "int handle"])
@pytest.mark.parametrize("kind", ["device", *GRANTED_KINDS])
def test_work_on_another_devices_stream_runs_in_its_context(kind: str, handle: bool) -> None:
    # Device 0 current, a stream of device 1, device 1's memory device 0 was given no
    # access to: every path issues in device 1's context (where the memory is), and the
    # caller's context stays current.
    with ExitStack() as stack:
        remote = make(kind, 1, stack, granted=False)
        host = stack.enter_context(cm.HostBuffer.empty(N))
        back = stack.enter_context(cm.HostBuffer.empty(N))
        s1 = stack.enter_context(cm.Stream(1))
        s = s1.handle if handle else s1
        with cm.Device(0):
            for seed, (name, run) in enumerate(_stream_paths(remote, host, s).items()):
                want = pattern(seed)
                host.array[:] = want
                run()
                cm.copy_async(back, remote, stream=s)
                s1.synchronize()
                assert (back.array == want).all(), name
                assert int(_driver.call("cuCtxGetDevice")) == 0, name
            remote.fill(9, stream=s)
            cm.copy_async(back, remote, stream=s)
            s1.synchronize()
            assert (back.array == 9).all()
            assert int(_driver.call("cuCtxGetDevice")) == 0
        assert not cm.Device(0).peer_access_enabled(1)


def test_a_ring_slot_reaches_a_pool_of_the_streams_device() -> None:
    with ExitStack() as stack:
        ring = stack.enter_context(cm.SharedHostRing(2, (N // 4,), np.float32, timeout=10))
        pool = stack.enter_context(cm.MemoryPool(1))  # device 0 given no access
        s1 = stack.enter_context(cm.Stream(1))
        w = ring.handle.writer()
        stack.callback(w.close)
        for given in (pool, None):  # None: the default pool of the stream's device
            slot = w.acquire(timeout=10)
            slot.array[...] = 4.5
            got = ring.take(slot.publish())
            with cm.Device(0):
                buf = got.to_device(stream=s1, pool=given)
                s1.synchronize()
            with buf:
                assert buf.device == 1 and (buf.to_numpy(np.float32) == 4.5).all()
                assert buf.pool is pool if given is not None else buf.pool.device == 1


@pytest.mark.parametrize("kind", GRANTED_KINDS)
def test_another_devices_memory_on_this_devices_stream_names_the_grant(kind: str) -> None:
    # Two of device 1's buffers (and one, filled) on device 0's stream: device 0 runs the
    # work and was given no access, so the grant is named before anything is issued.
    grant = {"pool": "MemoryPool(1, peers=[0])", "pool_cached": "MemoryPool(1, peers=[0])",
             "growable": "GrowableBuffer(..., device=1, peers=[0])",
             "mapping": "mapping.set_access([1, 0])"}[kind]
    with ExitStack() as stack:
        a = make(kind, 1, stack, granted=False)
        b = make(kind, 1, stack, granted=False)
        s0 = stack.enter_context(cm.Stream(0))
        offs = np.arange(4) * 4096
        prebuilt = stack.enter_context(cm.CopyBatch())
        prebuilt.add(a, b, dst_offsets=offs, src_offsets=offs, sizes=4096)
        for attempt in (lambda: cm.copy_async(a, b, stream=s0),
                        lambda: cm.copy_async(a.as_array(), b.as_array(), stream=s0),
                        lambda: cm.copy_batch(a, b, dst_offsets=offs, src_offsets=offs,
                                              sizes=4096, stream=s0),
                        lambda: prebuilt.execute(s0),
                        lambda: a.fill(3, stream=s0)):
            with pytest.raises(cm.PeerAccessError) as info:
                attempt()
            assert grant in str(info.value)
            assert "device 0 was given no" in str(info.value)
        s0.synchronize()


@pytest.mark.parametrize("closing", ["close(force=True)", "closed default wrapper"])
def test_a_buffer_outlives_its_closed_pool_object_across_devices(closing: str) -> None:
    with ExitStack() as stack:
        local = make("device", 0, stack)
        if closing == "close(force=True)":
            pool = cm.MemoryPool(1, peers=[0])
        else:
            pool = cm.MemoryPool.default(1)
            pool.set_access(0, cm.Access.READWRITE)
            stack.callback(lambda: cm.MemoryPool.default(1).set_access(0, cm.Access.NONE))
        with cm.Device(1), cm.Stream(1) as s:
            remote = pool.allocate(N, stream=s)
            s.synchronize()
        stack.callback(remote.close)
        pool.close(force=True)
        assert pool.closed and not remote.closed
        want = pattern(11)
        reset(local, want)
        offs = np.arange(N // 4096) * 4096
        with cm.Device(0), cm.Stream(0) as s0:
            cm.copy(remote, local)
            assert (remote.to_numpy() == want).all()
            cm.copy_async(local, remote.as_array(), stream=s0)
            remote.fill(2, stream=s0)
            cm.copy_batch(local, remote, dst_offsets=offs, src_offsets=offs, sizes=4096,
                          stream=s0)
            s0.synchronize()
        assert (local.to_numpy() == 2).all()


def test_a_synchronous_batch_runs_where_a_synchronous_copy_does() -> None:
    # Device 1's pool memory device 0 may not touch, device 0 current: copy and copy_batch
    # without a stream (and CopyBatch.execute()) run on device 1, which may.
    with ExitStack() as stack:
        remote = make("pool", 1, stack, granted=False)
        local = make("device", 0, stack)
        offs = np.arange(N // 4096) * 4096
        want = pattern(21)
        reset(local, want)
        with cm.Device(0):
            cm.copy(remote, local)
            assert (remote.to_numpy() == want).all()
            reset(local, pattern(22))
            cm.copy_batch(remote, local, dst_offsets=offs, src_offsets=offs, sizes=4096)
            assert (remote.to_numpy() == pattern(22)).all()
            with cm.CopyBatch() as b:
                b.add(local, remote, dst_offsets=offs[::-1], src_offsets=offs, sizes=4096)
                b.execute()
            other = make("pool", 1, stack, granted=False)  # two of device 1's: device 1 runs
            cm.copy_batch(other, remote, dst_offsets=offs, src_offsets=offs, sizes=4096)
            assert int(_driver.call("cuCtxGetDevice")) == 0
        got = local.to_numpy().reshape(-1, 4096)
        assert (got == pattern(22).reshape(-1, 4096)[::-1]).all()
        assert (other.to_numpy() == pattern(22)).all()
