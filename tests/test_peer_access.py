"""Peer access as a resource of a device pair: Device.enable_peer_access and friends.

Runs on the simulator and on a machine with two GPUs that reach each other
(NVLink or PCIe peer-to-peer); skipped with one device. Every test starts and
ends with no peer access enabled (``tests/_peer``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver, _peer

from ._helpers import record_calls
from ._nothing import nothing_allocated
from ._peer import no_peer_access

pytestmark = pytest.mark.multi_gpu


@pytest.fixture(autouse=True)
def clean(two_devices: None) -> Iterator[None]:
    if not cm.Device(0).can_access_peer(1):
        pytest.skip("devices 0 and 1 are not peers")
    with no_peer_access():
        yield


def enables(calls: list[tuple[str, tuple[object, ...]]]) -> int:
    return sum(api == "cuCtxEnablePeerAccess" for api, _ in calls)


def test_enable_is_idempotent_and_one_direction(monkeypatch: pytest.MonkeyPatch) -> None:
    d0, d1 = cm.Device(0), cm.Device(1)
    assert not d0.peer_access_enabled(1) and not d1.peer_access_enabled(0)
    with record_calls(monkeypatch) as calls:
        d0.enable_peer_access(1)
        d0.enable_peer_access(cm.Device(1))  # enabled: no driver call at all
    assert enables(calls) == 1
    assert d0.peer_access_enabled(1)
    assert not d1.peer_access_enabled(0)  # each direction is its own
    d1.enable_peer_access(0)
    assert d1.peer_access_enabled(0)


def test_disable_is_idempotent() -> None:
    d0 = cm.Device(0)
    d0.disable_peer_access(1)  # never enabled: success
    d0.enable_peer_access(1)
    d0.disable_peer_access(1)
    assert not d0.peer_access_enabled(1)
    d0.disable_peer_access(1)
    d0.enable_peer_access(1)  # and again
    assert d0.peer_access_enabled(1)


def test_enabled_by_another_library_is_success() -> None:
    # PyTorch and CuPy enable peer access in the same primary contexts: the driver then
    # answers ALREADY_ENABLED, which is success, and the pair counts as enabled.
    from cuda_memkit._core._context import primary_context, primary_pushed

    with primary_pushed(0):
        _driver.call("cuCtxEnablePeerAccess", primary_context(1), 0)
    assert not cm.Device(0).peer_access_enabled(1)  # the driver has no query for it
    cm.Device(0).enable_peer_access(1)
    assert cm.Device(0).peer_access_enabled(1)


def test_threads_enable_once(monkeypatch: pytest.MonkeyPatch) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def worker() -> None:
        try:
            start.wait()
            cm.Device(0).enable_peer_access(1)
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    with record_calls(monkeypatch) as calls:
        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    assert enables(calls) == 1
    assert cm.Device(0).peer_access_enabled(1)


def test_enable_keeps_the_threads_context() -> None:
    with cm.Device(1):
        cm.Device(0).enable_peer_access(1)
        assert int(_driver.call("cuCtxGetDevice")) == 1
        cm.Device(0).disable_peer_access(1)
        assert int(_driver.call("cuCtxGetDevice")) == 1


@pytest.mark.parametrize("method", ["enable_peer_access", "disable_peer_access",
                                    "peer_access_enabled"])
def test_bad_peers_are_refused_before_the_driver(method: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    fn = getattr(cm.Device(0), method)
    with nothing_allocated(monkeypatch):
        with pytest.raises(ValueError, match="not a peer of itself"):
            fn(0)
        with pytest.raises(ValueError, match="peer 9 does not exist"):
            fn(9)
        with pytest.raises(TypeError, match="peer must be an int ordinal or a Device"):
            fn(1.0)


def test_settings() -> None:
    assert cm.peer_access_settings() == cm.PeerAccessSettings(auto=True)
    new = cm.configure_peer_access(auto=False)
    assert new.auto is False and cm.peer_access_settings() is new
    with pytest.raises(TypeError, match="auto must be a bool"):
        cm.configure_peer_access(auto="no")  # type: ignore[arg-type]
    assert cm.peer_access_settings() is new  # unchanged by the refused call
    cm.configure_peer_access(auto=True)


def test_a_copy_enables_it_on_first_use(monkeypatch: pytest.MonkeyPatch) -> None:
    a = cm.DeviceBuffer.from_array(np.arange(1024, dtype=np.int32), device=0)
    b = cm.DeviceBuffer.empty(1024, np.int32, device=1)
    try:
        with cm.Device(0), cm.Stream(0) as s:
            cm.copy(b, a, stream=s)
            s.synchronize()
            assert cm.Device(0).peer_access_enabled(1)
            with record_calls(monkeypatch) as calls:
                cm.copy(b, a, stream=s)  # the second copy asks nothing
                s.synchronize()
            assert enables(calls) == 0
        assert (b.to_numpy() == np.arange(1024)).all()
    finally:
        a.close()
        b.close()


def test_auto_off_leaves_it_to_the_user() -> None:
    cm.configure_peer_access(auto=False)
    a = cm.DeviceBuffer.from_array(np.arange(256, dtype=np.int64), device=0)
    b = cm.DeviceBuffer.zeros(256, np.int64, device=1)
    try:
        with cm.Device(0):
            cm.copy(b, a)  # staged by the driver: correct all the same
        assert not cm.Device(0).peer_access_enabled(1)
        assert (b.to_numpy() == np.arange(256)).all()
    finally:
        a.close()
        b.close()


def test_disable_while_a_copy_batch_is_prebuilt() -> None:
    # A CopyBatch remembers its kernel pick; a disable must make it pick again (the
    # kernel would fault on memory it no longer reaches).
    n, block = 64, 256
    src = cm.DeviceBuffer.from_array(np.arange(n * block, dtype=np.uint8), device=1)
    dst = cm.DeviceBuffer.zeros(n * block, np.uint8, device=0)
    batch = cm.CopyBatch()
    try:
        offs = np.arange(n) * block
        batch.add(dst, src, dst_offsets=offs, src_offsets=offs, sizes=block)
        with cm.Device(0), cm.Stream(0) as s:
            batch.execute(s, method="kernel")
            s.synchronize()
            assert cm.Device(0).peer_access_enabled(1)
            cm.configure_peer_access(auto=False)
            cm.Device(0).disable_peer_access(1)
            with pytest.raises(ValueError, match="no peer access"):
                batch.execute(s, method="kernel")
            batch.execute(s)  # "auto": the driver's batch
            s.synchronize()
        assert (dst.to_numpy() == src.to_numpy()).all()
    finally:
        batch.close()
        src.close()
        dst.close()


# -- devices without a peer path (the simulator's configuration) -----------------------


@pytest.fixture
def no_path() -> Iterator[None]:
    """Devices 0 and 1 cannot reach each other (simulator only)."""
    if _driver.backend_name() != "sim":
        pytest.skip("configures the simulator")
    from cuda_memkit.sim import _peer as sim_peer

    st = sim_peer.state()
    st.unsupported |= {(0, 1), (1, 0)}
    _peer.reachable.clear()
    try:
        yield
    finally:
        st.unsupported -= {(0, 1), (1, 0)}
        _peer.reachable.clear()


@pytest.mark.sim_only
def test_no_peer_path_is_a_clear_error_and_copies_are_staged(
        no_path: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda_memkit.sim import _peer as sim_peer

    assert not cm.Device(0).can_access_peer(1)
    with record_calls(monkeypatch) as calls, \
            pytest.raises(cm.CudaPeerAccessUnsupportedError, match="staged"):
        cm.Device(0).enable_peer_access(1)
    assert enables(calls) == 0
    a = cm.DeviceBuffer.from_array(np.arange(512, dtype=np.uint16), device=0)
    b = cm.DeviceBuffer.zeros(512, np.uint16, device=1)
    try:
        staged = sim_peer.state().staged
        with cm.Device(0), cm.Stream(0) as s:
            cm.copy(b, a, stream=s)
            cm.copy_batch(b, a, dst_offsets=[0], src_offsets=[0], sizes=1024, stream=s)
            s.synchronize()
        assert sim_peer.state().staged == staged + 2
        assert (b.to_numpy() == np.arange(512)).all()
        with cm.Device(0), pytest.raises(ValueError, match="no peer access"):
            cm.copy_batch(b, a, dst_offsets=[0], src_offsets=[0], sizes=1024,
                          method="kernel")
    finally:
        a.close()
        b.close()


@pytest.mark.sim_only
def test_a_pool_peer_without_a_path_is_refused_before_the_pool_is_made(
        no_path: None, monkeypatch: pytest.MonkeyPatch) -> None:
    with nothing_allocated(monkeypatch, driver_may_refuse=True), \
            pytest.raises(cm.CudaPeerAccessUnsupportedError, match="cannot access device 0"):
        cm.MemoryPool(0, peers=[1])


@pytest.mark.sim_only
def test_a_growable_peer_without_a_path_is_refused_before_anything_is_made(
        no_path: None, monkeypatch: pytest.MonkeyPatch) -> None:
    with nothing_allocated(monkeypatch, driver_may_refuse=True), \
            pytest.raises(cm.CudaPeerAccessUnsupportedError, match="cannot access device 1"):
        cm.GrowableBuffer(1 << 22, device=1, peers=[0])


@pytest.mark.sim_only
def test_every_grant_to_a_device_without_a_path_is_refused_before_the_driver(
        no_path: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """One can-access rule for every way of granting access to a device's memory."""
    pool = cm.MemoryPool(0)
    grow = cm.GrowableBuffer(1 << 22, device=0)
    phys = cm.PhysicalMemory.create(cm.granularity(0), device=0)
    vrange = cm.AddressRange.reserve(cm.granularity(0))
    mapping = vrange.map(phys)
    try:
        grants = {
            "MemoryPool.set_access": lambda: pool.set_access(1, cm.Access.READWRITE),
            "MemoryPool.set_access(READ)": lambda: pool.set_access([1], cm.Access.READ),
            "GrowableBuffer.set_access": lambda: grow.set_access(1),
            "GrowableBuffer.grant_access": lambda: grow.grant_access([1]),
            "Mapping.set_access": lambda: mapping.set_access(cm.Device(1)),
        }
        for name, grant in grants.items():
            with nothing_allocated(monkeypatch, driver_may_refuse=True), \
                    pytest.raises(cm.CudaPeerAccessUnsupportedError,
                                  match="device 1 cannot access device 0"):
                grant()
            assert grow.access(1) is cm.Access.NONE, name
        assert pool.access(1) is cm.Access.NONE
        assert mapping.access(1) is cm.Access.NONE
    finally:
        mapping.close()
        vrange.close()
        phys.close()
        grow.close()
        pool.close()


def test_can_access_peer_asks_the_driver_once_per_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    if cm.device_count() < 2:
        pytest.skip("needs two devices")
    first = cm.Device(0).can_access_peer(1)
    with record_calls(monkeypatch) as calls:
        assert cm.Device(0).can_access_peer(cm.Device(1)) is first
        assert cm.Device(0).can_access_peer(1) is first
    assert "cuDeviceCanAccessPeer" not in [api for api, _ in calls]


def test_grants_of_a_closed_pool_or_buffer_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = cm.MemoryPool(1, peers=[0])
    assert pool.access(0) is cm.Access.READWRITE  # granted at creation
    grow = cm.GrowableBuffer(1 << 22, device=1)
    pool.close()
    grow.close()
    with nothing_allocated(monkeypatch):
        with pytest.raises(cm.ClosedError):
            pool.set_access(0, cm.Access.READWRITE)
        with pytest.raises(cm.ClosedError):
            grow.grant_access(0)


@pytest.mark.parametrize("closing", ["close()", "collected"])
def test_a_pools_peers_lose_access_before_it_is_destroyed(
        closing: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A later pool may get the destroyed pool's handle: it must not start with its peers.
    import gc

    pool = cm.MemoryPool(0, peers=[1])
    handle = pool.handle
    with record_calls(monkeypatch) as calls:
        if closing == "collected":
            del pool
            gc.collect()
        else:
            pool.close()
    made = [(api, args) for api, args in calls
            if api in ("cuMemPoolSetAccess", "cuMemPoolDestroy")]
    assert [api for api, _ in made] == ["cuMemPoolSetAccess", "cuMemPoolDestroy"]
    (_, (cupool, descs, count)), (_, (destroyed,)) = made
    assert int(cupool) == int(destroyed) == handle and count == 1
    assert int(descs[0].location.id) == 1 and int(descs[0].flags) == 0


def test_a_pool_without_peers_is_destroyed_without_revoking(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pool = cm.MemoryPool(1)
    with record_calls(monkeypatch) as calls:
        pool.close()
    # one query for the other device, no grant to take back
    assert [api for api, _ in calls if api in ("cuMemPoolGetAccess", "cuMemPoolSetAccess",
                                               "cuMemPoolDestroy")] == [
        "cuMemPoolGetAccess", "cuMemPoolDestroy"]
