"""GrowableBuffer: in-place growth and shrinking, peers, interop, failure undo."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _driver
from cuda_memkit._core._context import ensure_context

from ._helpers import read, write


@pytest.fixture
def g() -> int:
    ensure_context(0)
    return cm.granularity(0)


def access_of(dev: int, ptr: int) -> int:
    loc = cm.Location.device(dev).to_cu()
    return int(_driver.call("cuMemGetAccess", loc, ptr))


def test_grow_keeps_pointer_and_contents(g: int) -> None:
    with cm.GrowableBuffer(64 * g, chunk=2 * g) as buf:
        assert buf.nbytes == 0 and buf.capacity == 0
        assert buf.max_size == 64 * g and buf.reserved == 64 * g
        assert buf.chunk_size == 2 * g and buf.device == 0 and buf.peers == ()
        ptr = buf.ptr
        buf.resize(3 * g + 5)
        assert buf.nbytes == 3 * g + 5 and buf.capacity == 4 * g
        data = (np.arange(buf.nbytes) % 253).astype(np.uint8)
        write(buf.ptr, data)
        buf.resize(40 * g)
        assert buf.ptr == ptr and buf.capacity == 40 * g
        assert (read(buf.ptr, data.nbytes) == data).all()
        tail = np.full(4096, 0xEE, np.uint8)
        write(buf.ptr + 40 * g - 4096, tail)  # the new memory is usable
        assert (read(buf.ptr + 40 * g - 4096, 4096) == 0xEE).all()
        buf.resize(64 * g)
        assert buf.capacity == 64 * g
        assert "GrowableBuffer" in repr(buf)
    assert buf.closed and "closed" in repr(buf)
    with pytest.raises(cm.ClosedError):
        _ = buf.ptr
    with pytest.raises(cm.ClosedError):
        buf.resize(0)


def test_shrink_unmaps_and_frees(g: int, backend: str) -> None:
    dev = cm.Device(0)
    with cm.GrowableBuffer(16 * g, chunk=g) as buf:
        buf.resize(16 * g)
        free_full, _ = dev.mem_info()
        data = np.full(g, 3, np.uint8)
        write(buf.ptr, data)
        buf.resize(g)
        assert buf.capacity == g and buf.nbytes == g
        assert (read(buf.ptr, g) == 3).all()  # kept
        free_small, _ = dev.mem_info()
        assert free_small >= free_full + 15 * g - (4 << 20 if backend == "cuda" else 0)
        if backend == "sim":
            from cuda_memkit.sim import machine

            assert len(machine().ext["vmm.mappings"]) == 1
        buf.resize(0)
        assert buf.capacity == 0 and buf.nbytes == 0
        buf.resize(0)
        buf.resize(2 * g)
        assert buf.capacity == 2 * g


def test_default_chunk_and_rounding(g: int) -> None:
    rec = cm.granularity(0, recommended=True)
    with cm.GrowableBuffer(rec + 1) as buf:
        assert buf.chunk_size == rec
        assert buf.reserved == 2 * rec and buf.max_size == rec + 1
        buf.resize(rec + 1)
        assert buf.capacity == 2 * rec
        with pytest.raises(ValueError, match="max_size"):
            buf.resize(rec + 2)


@pytest.mark.parametrize(
    ("args", "kwargs", "exc"),
    [
        ((0,), {}, ValueError),
        ((-1,), {}, ValueError),
        ((1.5,), {}, TypeError),
        (("G",), {"chunk": 4096}, ValueError),
        (("G",), {"chunk": 0}, ValueError),
        (("G",), {"chunk": "big"}, TypeError),
        (("G",), {"device": "0"}, TypeError),
        (("G",), {"device": -1}, ValueError),
        (("G",), {"peers": ["x"]}, TypeError),
    ],
)
def test_bad_input(g: int, args: tuple[Any, ...], kwargs: dict[str, Any],
                   exc: type[Exception]) -> None:
    args = tuple(g if a == "G" else a for a in args)
    with pytest.raises(exc):
        cm.GrowableBuffer(*args, **kwargs)


def test_peer_that_does_not_exist(g: int) -> None:
    with pytest.raises(ValueError, match="does not exist") as info:
        cm.GrowableBuffer(g, peers=[cm.device_count() + 3])
    assert not isinstance(info.value, cm.CudaError)  # refused before the driver


def test_grant_access_to_a_device_that_does_not_exist(g: int) -> None:
    bad = cm.device_count() + 3
    with cm.GrowableBuffer(4 * g, chunk=g) as buf:
        for sizes in ((), (2 * g,)):  # with no chunks, then with two
            for n in sizes:
                buf.resize(n)
            with pytest.raises(ValueError, match="does not exist") as info:
                buf.grant_access(bad)
            assert not isinstance(info.value, cm.CudaError)
            with pytest.raises(ValueError, match="does not exist"):
                buf.grant_access([0, bad])
            assert buf.peers == () and buf.access(bad) is cm.Access.NONE
        buf.resize(4 * g)  # later resizes still work
        buf.resize(g)
        assert buf.nbytes == g


def test_resize_bad_input(g: int) -> None:
    with cm.GrowableBuffer(4 * g) as buf:
        with pytest.raises(ValueError):
            buf.resize(-1)
        with pytest.raises(ValueError):
            buf.resize(4 * g + 1)
        with pytest.raises(TypeError):
            buf.resize(1.0)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            buf.resize(True)
        assert buf.capacity == 0


def test_interop(g: int) -> None:
    with cm.GrowableBuffer(8 * g, chunk=g) as buf:
        buf.resize(2 * g)
        cai = buf.__cuda_array_interface__
        assert cai["data"] == (buf.ptr, False)
        assert cai["shape"] == (2 * g,) and cai["typestr"] == "|u1" and cai["version"] == 3
        assert buf.__dlpack_device__() == (2, 0)
        view = buf.as_array(np.float32, (4, 256))
        assert view.ptr == buf.ptr and view.shape == (4, 256) and view.owner is buf
        assert view.__cuda_array_interface__["typestr"] == "<f4"
        capsule = buf.__dlpack__()
        assert type(capsule).__name__ == "PyCapsule"
        del capsule
    with pytest.raises(cm.ClosedError):
        _ = view.__cuda_array_interface__


def test_copy_in_and_out(g: int) -> None:
    with cm.GrowableBuffer(8 * g, chunk=g) as buf:
        buf.resize(g)
        src = (np.arange(g) % 249).astype(np.uint8)
        cm.copy(buf, src)
        buf.resize(5 * g)
        out = np.zeros(g, np.uint8)
        cm.copy(out, buf, nbytes=g)
        assert (out == src).all()
        with cm.HostBuffer.empty(5 * g) as host:
            cm.copy(host, buf)
            assert (host.array[:g] == src).all()
        dev = cm.DeviceBuffer.empty(g)
        try:
            cm.copy(dev, buf, nbytes=g)
            back = np.zeros(g, np.uint8)
            cm.copy(back, dev)
            assert (back == src).all()
        finally:
            dev.close()


def test_every_chunk_gets_peer_access(g: int, two_devices: None) -> None:
    if not cm.Device(0).can_access_peer(1):
        pytest.skip("devices 0 and 1 are not peers")
    with cm.GrowableBuffer(8 * g, chunk=g, peers=[1]) as buf:
        assert buf.peers == (1,) and buf.access(1) is cm.Access.READWRITE
        buf.resize(2 * g)
        buf.resize(5 * g)  # chunks added later get it too
        for i in range(5):
            assert access_of(0, buf.ptr + i * g) == 3
            assert access_of(1, buf.ptr + i * g) == 3


def test_grant_and_revoke_access(g: int, two_devices: None) -> None:
    if not cm.Device(0).can_access_peer(1):
        pytest.skip("devices 0 and 1 are not peers")
    with cm.GrowableBuffer(8 * g, chunk=g) as buf:
        buf.resize(2 * g)
        assert access_of(1, buf.ptr) == 0
        buf.grant_access(cm.Device(1))
        assert buf.peers == (1,)
        buf.resize(4 * g)
        assert [access_of(1, buf.ptr + i * g) for i in range(4)] == [3] * 4
        buf.grant_access([1], cm.Access.NONE)
        assert buf.peers == () and buf.access(1) is cm.Access.NONE
        buf.resize(6 * g)
        assert [access_of(1, buf.ptr + i * g) for i in range(6)] == [0] * 6
        assert [access_of(0, buf.ptr + i * g) for i in range(6)] == [3] * 6


def test_grant_access_bad_input(g: int) -> None:
    with cm.GrowableBuffer(2 * g) as buf:
        with pytest.raises(ValueError, match="owning device"):
            buf.grant_access(0, cm.Access.NONE)
        with pytest.raises(ValueError, match="devices"):
            buf.grant_access(cm.Location.host())
        with pytest.raises(ValueError):
            buf.grant_access([])
        with pytest.raises(TypeError):
            buf.grant_access(0, "rw")  # type: ignore[arg-type]
    with pytest.raises(cm.ClosedError):
        buf.grant_access(0)


@pytest.fixture
def failing(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Make the n-th call of an API (counted from the fixture) fail with OUT_OF_MEMORY."""
    plan: dict[str, int] = {}
    counts: dict[str, int] = {}
    real = _driver.function

    def function(api: str) -> Any:
        fn = real(api)

        def wrapped(*args: Any) -> Any:
            counts[api] = counts.get(api, 0) + 1
            if plan.get(api) == counts[api]:
                return (cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY,)
            return fn(*args)

        return wrapped

    monkeypatch.setattr(_driver, "function", function)
    yield plan


@pytest.mark.parametrize("api", ["cuMemCreate", "cuMemMap", "cuMemSetAccess"])
def test_failed_growth_is_undone(g: int, api: str, failing: dict[str, int]) -> None:
    dev = cm.Device(0)
    with cm.GrowableBuffer(16 * g, chunk=g) as buf:
        buf.resize(2 * g)
        write(buf.ptr, np.full(64, 9, np.uint8))
        free_before, _ = dev.mem_info()
        failing[api] = 4  # the 4th chunk of the next growth fails
        with pytest.raises(cm.CudaOutOfMemoryError):
            buf.resize(10 * g)
        assert buf.capacity == 2 * g and buf.nbytes == 2 * g
        free_after, _ = dev.mem_info()
        assert abs(free_after - free_before) <= (4 << 20)
        assert (read(buf.ptr, 64) == 9).all()
        failing.clear()
        buf.resize(10 * g)  # and it still grows afterwards
        assert buf.capacity == 10 * g


def test_teardown_order_on_drop(g: int, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int]] = []
    real = _driver.call

    def call(api: str, *args: Any) -> Any:
        if api in ("cuMemUnmap", "cuMemRelease", "cuMemAddressFree"):
            calls.append((api, int(args[0])))
        return real(api, *args)

    buf = cm.GrowableBuffer(8 * g, chunk=g)
    buf.resize(3 * g)
    monkeypatch.setattr(_driver, "call", call)
    ptr = buf.ptr
    del buf
    gc.collect()
    kinds = [c[0] for c in calls]
    assert kinds == ["cuMemUnmap"] * 3 + ["cuMemRelease"] * 3 + ["cuMemAddressFree"]
    assert [c[1] for c in calls[:3]] == [ptr + 2 * g, ptr + g, ptr]
    assert calls[-1][1] == ptr


def test_many_small_steps(g: int) -> None:
    with cm.GrowableBuffer(32 * g, chunk=g) as buf:
        ptr = buf.ptr
        for n in range(0, 32 * g + 1, g // 2):
            buf.resize(n)
            assert buf.ptr == ptr and buf.capacity == -(-n // g) * g
        for n in range(32 * g, -1, -3 * g):
            buf.resize(n)
            assert buf.capacity == -(-n // g) * g
