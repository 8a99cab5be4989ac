from __future__ import annotations

import threading
from typing import Any

import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _context, _driver
from cuda_memkit._core._context import ensure_context
from cuda_memkit._core._location import to_location
from cuda_memkit._core._stream import stream_handle


def test_device_count_positive() -> None:
    assert cm.device_count() >= 1


def test_device_properties() -> None:
    dev = cm.Device(0)
    assert dev.ordinal == 0 and int(dev) == 0
    assert isinstance(dev.name, str) and dev.name
    assert dev.total_memory > 0
    free, total = dev.mem_info()
    assert 0 < free <= total
    assert total == dev.total_memory
    major, minor = dev.compute_capability
    assert major >= 3 and minor >= 0
    caps = dev.capabilities()
    assert set(caps) >= {"managed_memory", "memory_pools", "virtual_memory_management",
                         "host_register", "concurrent_managed_access", "pageable_memory_access"}
    assert all(isinstance(v, bool) for v in caps.values())
    assert caps["unified_addressing"] is True
    assert repr(dev) == "<Device 0>"
    assert dev == cm.Device(0) and hash(dev) == hash(cm.Device(0))


@pytest.mark.parametrize("bad", ["0", 1.0, None, True])
def test_device_bad_type(bad: Any) -> None:
    with pytest.raises(TypeError):
        cm.Device(bad)


def test_device_negative() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        cm.Device(-1)


def test_device_out_of_range() -> None:
    with pytest.raises(cm.CudaInvalidDeviceError) as info:
        cm.Device(cm.device_count())
    assert info.value.api == "cuDeviceGet"


def test_set_current_and_context_manager_restores() -> None:
    _driver.call("cuCtxSetCurrent", 0)
    with cm.Device(0) as dev:
        assert int(_driver.call("cuCtxGetDevice")) == 0
        assert dev.ordinal == 0
    assert int(_driver.call("cuCtxGetCurrent")) == 0
    cm.Device(0).set_current()
    assert int(_driver.call("cuCtxGetCurrent")) != 0


def test_context_manager_switches_device(two_devices: None) -> None:
    cm.Device(0).set_current()
    with cm.Device(1):
        assert int(_driver.call("cuCtxGetDevice")) == 1
    assert int(_driver.call("cuCtxGetDevice")) == 0


def test_context_manager_failed_switch_saves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda_memkit._core import _device

    dev = cm.Device(0)
    with dev:
        pass

    def refuse(ordinal: object = None) -> int:
        raise cm.CudaInvalidDeviceError(101, "cuCtxSetCurrent", "CUDA_ERROR_INVALID_DEVICE", "x")

    with monkeypatch.context() as m:
        m.setattr(_device, "ensure_context", refuse)
        with pytest.raises(cm.CudaInvalidDeviceError):
            dev.__enter__()
    assert dev._saved.stack == []  # this thread's stack: nothing pushed for the failed switch
    _driver.call("cuCtxSetCurrent", 0)
    with dev:
        assert int(_driver.call("cuCtxGetDevice")) == 0
    assert int(_driver.call("cuCtxGetCurrent")) == 0


def test_context_manager_is_per_thread() -> None:
    # Interleaved, not nested: the other thread enters, this one enters, the
    # other leaves, this one leaves. Each must get back its own context.
    dev = cm.Device(0)
    other_inside, main_inside, other_left = (threading.Event() for _ in range(3))
    seen: list[Any] = []

    def other() -> None:
        try:
            assert int(_driver.call("cuCtxGetCurrent")) == 0
            with dev:  # same Device object, another thread
                other_inside.set()
                main_inside.wait(10)
            seen.append(int(_driver.call("cuCtxGetCurrent")))  # restored to none here
        except Exception as exc:
            seen.append(exc)
        finally:
            other_inside.set()
            other_left.set()

    t = threading.Thread(target=other)
    t.start()
    other_inside.wait(10)
    dev.set_current()
    ctx = int(_driver.call("cuCtxGetCurrent"))
    assert ctx != 0
    with dev:
        main_inside.set()
        other_left.wait(10)
    t.join()
    assert seen == [0]
    assert int(_driver.call("cuCtxGetCurrent")) == ctx  # this thread's own saved context


def test_ensure_context_on_a_fresh_thread() -> None:
    seen: list[Any] = []

    def work() -> None:
        try:
            assert int(_driver.call("cuCtxGetCurrent")) == 0
            seen.append(ensure_context())
            seen.append(int(_driver.call("cuCtxGetDevice")))
        except Exception as exc:
            seen.append(exc)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen == [0, 0]


def test_capability_helpers_agree_with_attributes() -> None:
    dev = cm.Device(0)
    raw = dev.attribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
    assert dev.memory_pools is bool(raw)


def test_stream_lifecycle() -> None:
    s = cm.Stream()
    assert s.owned and not s.closed
    h = s.handle
    assert h > 2
    assert stream_handle(s) == h
    assert s.__cuda_stream__() == (0, h)
    s.synchronize()
    assert s.query() is True
    s.close()
    s.close()  # idempotent
    assert s.closed
    with pytest.raises(cm.ClosedError, match="Stream is closed"):
        _ = s.handle
    with pytest.raises(cm.ClosedError):
        stream_handle(s)
    assert "closed" in repr(s)


def test_stream_destroyed_by_gc(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    # Using a destroyed stream is undefined behaviour on the real driver (it can
    # crash), so watch the gateway for the cuStreamDestroy call instead.
    real = _driver.function("cuStreamDestroy")
    seen: list[int] = []

    def spy(handle: Any) -> Any:
        seen.append(int(handle))
        return real(handle)

    monkeypatch.setitem(_driver._fns, "cuStreamDestroy", spy)
    s = cm.Stream(non_blocking=False)
    h = s.handle
    del s
    gc.collect()
    assert seen == [h]


def test_stream_context_manager_and_device_argument() -> None:
    with cm.Stream(cm.Device(0), priority=0) as s:
        assert int(_driver.call("cuStreamGetDevice", s.handle)) == 0
    assert s.closed


def test_stream_bad_arguments() -> None:
    with pytest.raises(TypeError):
        cm.Stream(non_blocking=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cm.Stream(priority=0.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cm.Stream("0")  # type: ignore[arg-type]


def test_from_handle_borrows() -> None:
    with cm.Stream() as owner:
        borrowed = cm.Stream.from_handle(owner.handle)
        assert not borrowed.owned
        borrowed.close()
        owner.synchronize()  # still alive
    with pytest.raises(TypeError):
        cm.Stream.from_handle("1")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        cm.Stream.from_handle(-5)
    assert cm.Stream.legacy_default().handle == 1


class CoreStream:
    def __init__(self, h: int) -> None:
        self.h = h

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.h)


class TorchStream:
    def __init__(self, h: int) -> None:
        self.cuda_stream = h


def test_stream_handle_conversions() -> None:
    assert stream_handle(None) == 0
    assert stream_handle(7) == 7
    assert stream_handle(CoreStream(99)) == 99
    assert stream_handle(TorchStream(42)) == 42
    assert stream_handle(cu.CUstream(5)) == 5
    with pytest.raises(TypeError, match="expected a stream"):
        stream_handle("stream")
    with pytest.raises(TypeError):
        stream_handle(True)
    with pytest.raises(ValueError):
        stream_handle(-1)


def test_location_constructor_validates() -> None:
    loc = cm.Location(1, 2)  # type: ignore[arg-type]
    assert loc.type is cm.LocationType.DEVICE and loc == cm.Location.device(2)
    assert hash(loc) == hash(cm.Location.device(2))
    assert cm.Location(cm.LocationType.HOST).id == 0
    with pytest.raises(ValueError, match="unknown location type"):
        cm.Location(99, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown location type"):
        cm.Location(0, 0)  # type: ignore[arg-type]
    for bad_type in ("device", 1.0, None, True):
        with pytest.raises(TypeError, match="type"):
            cm.Location(bad_type, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 0"):
        cm.Location(cm.LocationType.DEVICE, -1)
    for bad_id in (1.0, "0", None, False):
        with pytest.raises(TypeError, match="id"):
            cm.Location(cm.LocationType.HOST_NUMA, bad_id)  # type: ignore[arg-type]
    assert cm.Location.from_cu(1, -2) is None  # an invalid device is no location


def test_locations() -> None:
    assert cm.Location.device(1) == cm.Location(cm.LocationType.DEVICE, 1)
    assert cm.Location.host().is_host
    assert cm.Location.host_numa(3).id == 3
    assert cm.Location.host_numa_current().type is cm.LocationType.HOST_NUMA_CURRENT
    assert to_location(cm.Device(0)) == cm.Location.device(0)
    assert to_location(0) == cm.Location.device(0)
    loc = cm.Location.host_numa(2).to_cu()
    assert loc.type == cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA
    assert loc.id == 2
    assert cm.Location.from_cu(1, 0) == cm.Location.device(0)
    assert cm.Location.from_cu(0, 0) is None
    assert str(cm.Location.host_numa(1)) == "host NUMA 1"
    with pytest.raises(TypeError):
        to_location("host")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        cm.Location.device(-1)
    with pytest.raises(TypeError):
        cm.Location.host_numa(1.5)  # type: ignore[arg-type]


def test_location_is_frozen() -> None:
    loc = cm.Location.host()
    with pytest.raises(AttributeError):
        loc.id = 3  # type: ignore[misc]


def test_primary_context_is_cached() -> None:
    a = _context.primary_context(0)
    assert _context.primary_context(0) == a
