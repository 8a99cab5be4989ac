"""VMM primitives: granularity, AddressRange, PhysicalMemory, Mapping, Access.

Runs on both backends. Teardown order is checked by recording the driver
calls cuda_memkit makes (a spy on the gateway).
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver, _resource
from cuda_memkit._core._context import ensure_context

from ._helpers import read, write

TEARDOWN = ("cuMemUnmap", "cuMemRelease", "cuMemAddressFree")
ALLOCATING = ("cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess")


@pytest.fixture
def g() -> int:
    ensure_context(0)
    return cm.granularity(0)


class Spy:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def teardown(self) -> list[str]:
        return [c for c in self.calls if c in TEARDOWN]


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Spy]:
    s = Spy()
    real = _driver.call

    def call(api: str, *args: Any) -> Any:
        s.calls.append(api)
        return real(api, *args)

    monkeypatch.setattr(_driver, "call", call)
    yield s


# -- granularity -----------------------------------------------------------------


def test_granularity(g: int) -> None:
    assert g > 0 and g & (g - 1) == 0
    rec = cm.granularity(0, recommended=True)
    assert rec >= g and rec % g == 0
    assert cm.granularity(cm.Device(0)) == g
    assert cm.granularity(cm.Location.device(0), handle_type=cm.HandleType.POSIX_FD) % g == 0


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"device": "0"}, TypeError),
        ({"device": -1}, ValueError),
        ({"device": 0, "recommended": 1}, TypeError),
        ({"device": 0, "handle_type": 3}, ValueError),
        ({"device": 0, "handle_type": 1.0}, TypeError),
        ({"device": 0, "handle_type": "nope"}, ValueError),
    ],
)
def test_granularity_bad_input(kwargs: dict[str, Any], exc: type[Exception]) -> None:
    with pytest.raises(exc):
        cm.granularity(**kwargs)


def test_granularity_bad_device(spy: Spy) -> None:
    # The driver answers 2 MiB for any device; cuda_memkit refuses first.
    with pytest.raises(ValueError, match="no device"):
        cm.granularity(cm.device_count() + 5)
    assert "cuMemGetAllocationGranularity" not in spy.calls


# -- AddressRange ------------------------------------------------------------------


def test_reserve_and_close(g: int) -> None:
    r = cm.AddressRange.reserve(4 * g)
    assert r.ptr and r.ptr % g == 0
    assert r.nbytes == 4 * g and r.alignment == 0
    assert r.mappings == []
    assert "AddressRange" in repr(r)
    r.close()
    r.close()
    assert r.closed and "closed" in repr(r)
    with pytest.raises(cm.ClosedError):
        _ = r.ptr
    with cm.AddressRange.reserve(g, alignment=4 * g) as r2:
        assert r2.ptr % (4 * g) == 0
    assert r2.closed


def test_reserve_direct_construction_refused() -> None:
    with pytest.raises(TypeError):
        cm.AddressRange()
    with pytest.raises(TypeError):
        cm.PhysicalMemory()
    with pytest.raises(TypeError):
        cm.Mapping()


@pytest.mark.parametrize(
    ("size", "kwargs", "exc"),
    [
        (0, {}, ValueError),
        (-1, {}, ValueError),
        (1.5, {}, TypeError),
        (True, {}, TypeError),
        ("big", {}, TypeError),
        ("G+4096", {}, ValueError),
        ("G", {"alignment": 3}, ValueError),
        ("G", {"alignment": -2}, ValueError),
        ("G", {"alignment": "x"}, TypeError),
        ("G", {"fixed_address": 4096}, ValueError),
        ("G", {"fixed_address": -1}, ValueError),
    ],
)
def test_reserve_bad_input(g: int, spy: Spy, size: Any, kwargs: dict[str, Any],
                           exc: type[Exception]) -> None:
    if size == "G":
        size = g
    elif size == "G+4096":
        size = g + 4096
    with pytest.raises(exc):
        cm.AddressRange.reserve(size, **kwargs)
    assert not set(spy.calls) & set(ALLOCATING)


def test_reserve_fixed_address(g: int, backend: str) -> None:
    """A freed address asked for again: the simulator honours it; the driver treats
    it as a hint, so on a GPU either it is honoured or ValueError leaves nothing behind."""
    r = cm.AddressRange.reserve(2 * g)
    where = r.ptr
    r.close()
    try:
        r2 = cm.AddressRange.reserve(2 * g, fixed_address=where)
    except ValueError as exc:
        assert backend == "cuda" and "not available" in str(exc)
        return
    assert r2.ptr == where
    r2.close()


def test_reserve_fixed_address_collision(g: int, spy: Spy) -> None:
    with cm.AddressRange.reserve(4 * g) as r:
        spy.calls.clear()
        for addr in (r.ptr, r.ptr + g, r.ptr - g):
            with pytest.raises(ValueError, match="collides"):
                cm.AddressRange.reserve(2 * g, fixed_address=addr)
        assert "cuMemAddressReserve" not in spy.calls


def test_reserve_fixed_address_taken_elsewhere(g: int) -> None:
    """A range reserved behind cuda_memkit's back: the driver moves us, we undo and raise."""
    ensure_context(0)
    raw = int(_driver.call("cuMemAddressReserve", 2 * g, 0, 0, 0))
    try:
        with pytest.raises(ValueError, match="not available"):
            cm.AddressRange.reserve(2 * g, fixed_address=raw)
    finally:
        _driver.call("cuMemAddressFree", raw, 2 * g)


# -- PhysicalMemory ------------------------------------------------------------------


def test_create(g: int) -> None:
    with cm.PhysicalMemory.create(2 * g) as p:
        assert p.nbytes == 2 * g and not hasattr(p, "size")
        assert p.handle != 0
        assert p.device == 0 and p.location == cm.Location.device(0)
        assert p.handle_type is cm.HandleType.NONE
        assert p.granularity == g
        assert p.mappings == []
        assert "PhysicalMemory" in repr(p)
    assert p.closed
    with pytest.raises(cm.ClosedError):
        _ = p.handle


@pytest.mark.parametrize(
    ("size", "kwargs", "exc"),
    [
        (0, {}, ValueError),
        (-4, {}, ValueError),
        (2.0, {}, TypeError),
        ("G+4096", {}, ValueError),
        ("G/2", {}, ValueError),
        ("G", {"device": "gpu"}, TypeError),
        ("G", {"device": -1}, ValueError),
        ("G", {"handle_type": 7}, ValueError),
        ("G", {"location": "host"}, TypeError),
    ],
)
def test_create_bad_input(g: int, spy: Spy, size: Any, kwargs: dict[str, Any],
                          exc: type[Exception]) -> None:
    size = {"G": g, "G+4096": g + 4096, "G/2": g // 2}.get(size, size) if isinstance(
        size, str) else size
    with pytest.raises(exc):
        cm.PhysicalMemory.create(size, **kwargs)
    assert "cuMemCreate" not in spy.calls


def test_create_out_of_memory(g: int) -> None:
    huge = (1 << 50) // g * g
    with pytest.raises(cm.CudaOutOfMemoryError):
        cm.PhysicalMemory.create(huge)


def test_host_physical_memory(g: int, backend: str) -> None:
    """Host-located physical memory, mapped for the device (where the driver supports it)."""
    loc = cm.Location.host_numa(0)
    try:
        gh = cm.granularity(loc)
        p = cm.PhysicalMemory.create(gh, location=loc)
    except (cm.CudaNotSupportedError, cm.CudaInvalidValueError) as exc:
        if backend == "sim":
            raise
        pytest.skip(f"host-located VMM memory unsupported here: {exc.name}")
    with p, cm.AddressRange.reserve(gh) as r:
        assert p.device is None and p.location == loc
        m = r.map(p)
        m.set_access(0)
        data = np.arange(4096, dtype=np.uint8)
        write(m.ptr, data)
        assert (read(m.ptr, 4096) == data).all()
        m.close()


# -- mapping -----------------------------------------------------------------------


def test_map_set_access_roundtrip(g: int) -> None:
    with cm.AddressRange.reserve(4 * g) as r, cm.PhysicalMemory.create(2 * g) as p:
        m = r.map(p, offset=2 * g)
        assert m.ptr == r.ptr + 2 * g and m.nbytes == 2 * g
        assert m.offset == 2 * g and m.range is r and m.physical is p and m.device == 0
        assert r.mappings == [m] and p.mappings == [m]
        assert m.access(0) is cm.Access.NONE
        m.set_access(0, cm.Access.READWRITE)
        assert m.access() is cm.Access.READWRITE
        assert m.access(cm.Device(0)) is cm.Access.READWRITE
        data = (np.arange(2 * g) % 251).astype(np.uint8)
        write(m.ptr, data)
        assert (read(m.ptr, 2 * g) == data).all()
        cai = m.__cuda_array_interface__
        assert cai["data"] == (m.ptr, False) and cai["shape"] == (2 * g,)
        assert m.__dlpack_device__() == (2, 0)
        m.close()
        assert m.closed and r.mappings == [] and p.mappings == []
        with pytest.raises(cm.ClosedError):
            m.set_access(0)
        with pytest.raises(cm.ClosedError):
            m.access(0)


def test_map_access_to_a_device_that_does_not_exist(g: int) -> None:
    bad = cm.device_count() + 3
    with cm.AddressRange.reserve(g) as r, cm.PhysicalMemory.create(g) as p:
        m = r.map(p)
        for target in (bad, [0, bad], cm.Location.device(bad)):
            with pytest.raises(ValueError, match="does not exist") as info:
                m.set_access(target)
            assert not isinstance(info.value, cm.CudaError)  # refused before the driver
        assert m.access() is cm.Access.NONE  # nothing was set
        with pytest.raises(ValueError, match="does not exist") as info:
            m.access(bad)
        assert not isinstance(info.value, cm.CudaError)
        m.close()


def test_two_mappings_alias_the_same_memory(g: int) -> None:
    with cm.AddressRange.reserve(g) as r1, cm.AddressRange.reserve(2 * g) as r2, \
            cm.PhysicalMemory.create(g) as p:
        m1 = r1.map(p)
        m2 = r2.map(p, offset=g)
        for m in (m1, m2):
            m.set_access([0])
        write(m1.ptr, np.full(64, 0x5A, np.uint8))
        assert (read(m2.ptr, 64) == 0x5A).all()
        m1.close()
        m2.close()


def test_set_access_host_on_device_memory(g: int) -> None:
    with cm.AddressRange.reserve(g) as r, cm.PhysicalMemory.create(g) as p:
        m = r.map(p)
        with pytest.raises(cm.CudaNotSupportedError):
            m.set_access(cm.Location.host())
        m.close()


def test_no_access_means_no_copies(g: int) -> None:
    """Before set_access (or after revoking) the GPU refuses copies: CudaInvalidValueError."""
    with cm.AddressRange.reserve(g) as r, cm.PhysicalMemory.create(g) as p:
        m = r.map(p)
        with pytest.raises(cm.CudaInvalidValueError):
            write(m.ptr, np.ones(16, np.uint8))
        m.set_access(0, cm.Access.READ)
        assert m.access(0) is cm.Access.READ
        read(m.ptr, 16)
        m.set_access(0, cm.Access.NONE)
        with pytest.raises(cm.CudaInvalidValueError):
            read(m.ptr, 16)
        m.close()


def test_set_access_several_targets(g: int, two_devices: None) -> None:
    if not cm.Device(0).can_access_peer(1):
        pytest.skip("devices 0 and 1 are not peers")
    with cm.AddressRange.reserve(g) as r, cm.PhysicalMemory.create(g) as p:
        m = r.map(p)
        m.set_access([0, cm.Device(1)], cm.Access.READWRITE)
        assert m.access(0) is cm.Access.READWRITE
        assert m.access(1) is cm.Access.READWRITE
        m.set_access(cm.Location.device(1), cm.Access.NONE)
        assert m.access(1) is cm.Access.NONE
        assert m.access(0) is cm.Access.READWRITE
        m.close()


@pytest.mark.parametrize(
    ("targets", "access", "exc"),
    [
        ([], cm.Access.READWRITE, ValueError),
        ("0", cm.Access.READWRITE, TypeError),
        (0.0, cm.Access.READWRITE, TypeError),
        ([0, "x"], cm.Access.READWRITE, TypeError),
        (0, 2, ValueError),
        (0, "rw", TypeError),
        (0, True, TypeError),
    ],
)
def test_set_access_bad_input(g: int, targets: Any, access: Any, exc: type[Exception]) -> None:
    with cm.AddressRange.reserve(g) as r, cm.PhysicalMemory.create(g) as p:
        m = r.map(p)
        with pytest.raises(exc):
            m.set_access(targets, access)
        m.close()


def test_map_bad_input(g: int, spy: Spy) -> None:
    with cm.AddressRange.reserve(2 * g) as r, cm.PhysicalMemory.create(2 * g) as p, \
            cm.PhysicalMemory.create(g) as small:
        spy.calls.clear()
        with pytest.raises(ValueError, match="multiple"):
            r.map(small, offset=4096)
        with pytest.raises(ValueError, match="does not fit"):
            r.map(small, offset=2 * g)
        with pytest.raises(ValueError, match="does not fit"):
            r.map(p, offset=g)
        with pytest.raises(ValueError):
            r.map(small, offset=-g)
        with pytest.raises(TypeError):
            r.map(small, offset=1.0)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            r.map("memory")  # type: ignore[arg-type]
        assert "cuMemMap" not in spy.calls
        with cm.AddressRange.reserve(g) as tiny:
            with pytest.raises(ValueError, match="does not fit"):
                tiny.map(p)
    with pytest.raises(cm.ClosedError):
        r.map(small)


def test_map_closed_physical(g: int) -> None:
    p = cm.PhysicalMemory.create(g)
    p.close()
    with cm.AddressRange.reserve(g) as r, pytest.raises(cm.ClosedError):
        r.map(p)


def test_double_map_raises_and_leaves_nothing(g: int) -> None:
    with cm.AddressRange.reserve(2 * g) as r, cm.PhysicalMemory.create(g) as p, \
            cm.PhysicalMemory.create(2 * g) as q:
        m = r.map(p)
        with pytest.raises(cm.CudaError):
            r.map(p)
        with pytest.raises(cm.CudaError):
            r.map(q)
        assert r.mappings == [m]
        m.close()


# -- teardown order -------------------------------------------------------------------


def _trio(g: int) -> tuple[cm.AddressRange, cm.PhysicalMemory, cm.Mapping]:
    r = cm.AddressRange.reserve(2 * g)
    p = cm.PhysicalMemory.create(g)
    m = r.map(p, offset=g)
    m.set_access(0)
    return r, p, m


API = {"p": "cuMemRelease", "r": "cuMemAddressFree"}


@pytest.mark.parametrize("order", list(itertools.permutations("rpm")))
def test_drop_order_refcount(g: int, spy: Spy, order: tuple[str, ...]) -> None:
    """Unmap always comes first. What the mapping kept alive goes when it goes
    (physical memory, then range); what is dropped after it goes when dropped."""
    objs: dict[str, Any] = dict(zip("rpm", _trio(g), strict=True))
    spy.calls.clear()
    for name in order:
        del objs[name]
    gc.collect()
    at = order.index("m")
    held = [k for k in "pr" if k in order[:at]]
    expected = ["cuMemUnmap"] + [API[k] for k in held + list(order[at + 1:])]
    assert spy.teardown() == expected


def test_drop_together(g: int, spy: Spy) -> None:
    def scope() -> None:
        objs = _trio(g)
        spy.calls.clear()
        assert len(objs) == 3

    scope()
    assert spy.teardown() == list(TEARDOWN)


@pytest.mark.parametrize("order", list(itertools.permutations("rpm")))
def test_drop_order_cycle(g: int, spy: Spy, order: tuple[str, ...]) -> None:
    objs = dict(zip("rpm", _trio(g), strict=True))
    cycle = [objs[k] for k in order]
    for o in cycle:
        o._test_cycle = cycle  # type: ignore[attr-defined]
    del objs, o
    spy.calls.clear()
    gc.disable()
    try:
        del cycle
        assert spy.teardown() == []
        gc.collect()
    finally:
        gc.enable()
    assert spy.teardown() == list(TEARDOWN)


@pytest.mark.parametrize("order", list(itertools.permutations("rpm")))
def test_close_in_any_order(g: int, spy: Spy, order: tuple[str, ...]) -> None:
    objs = dict(zip("rpm", _trio(g), strict=True))
    spy.calls.clear()
    for name in order:
        objs[name].close()
        assert objs[name].closed
    seq = spy.teardown()
    assert sorted(seq) == sorted(TEARDOWN)
    assert seq[0] == "cuMemUnmap"
    assert objs["m"].closed


def test_close_range_unmaps_live_mappings(g: int, spy: Spy) -> None:
    r, p, m = _trio(g)
    spy.calls.clear()
    r.close()
    assert spy.teardown() == ["cuMemUnmap", "cuMemAddressFree"]
    assert m.closed
    with pytest.raises(cm.ClosedError):
        _ = m.ptr
    m.close()
    assert spy.teardown() == ["cuMemUnmap", "cuMemAddressFree"]
    p.close()
    assert spy.teardown() == list(("cuMemUnmap", "cuMemAddressFree", "cuMemRelease"))


def test_close_physical_while_mapped_defers_release(g: int, spy: Spy) -> None:
    r, p, m = _trio(g)
    spy.calls.clear()
    p.close()
    assert p.closed and spy.teardown() == []
    write(m.ptr, np.full(16, 7, np.uint8))  # still usable through the mapping
    assert (read(m.ptr, 16) == 7).all()
    with pytest.raises(cm.ClosedError):
        p.export()
    m.close()
    assert spy.teardown() == ["cuMemUnmap", "cuMemRelease"]
    r.close()
    assert spy.teardown() == list(TEARDOWN)


def test_mapping_context_manager(g: int, spy: Spy) -> None:
    with cm.AddressRange.reserve(g) as r, cm.PhysicalMemory.create(g) as p:
        with r.map(p) as m:
            m.set_access(0)
        assert m.closed
        with pytest.raises(cm.ClosedError), m:
            pass
    assert spy.teardown() == list(TEARDOWN)


def test_undo_helper_runs_in_reverse_and_only_on_failure() -> None:
    done: list[int] = []
    with _resource.Transaction() as undo:
        undo.push(done.append, 1)
    assert done == []
    with pytest.raises(RuntimeError), _resource.Transaction() as undo:
        undo.push(done.append, 1)
        undo.push(done.append, 2)
        raise RuntimeError("step 3 failed")
    assert done == [2, 1]


def test_undo_failure_becomes_warning() -> None:
    def bad() -> None:
        raise cm.CudaInvalidValueError(1, "cuMemRelease")

    with pytest.raises(RuntimeError), pytest.warns(cm.MemkitWarning), \
            _resource.Transaction() as undo:
        undo.push(bad)
        raise RuntimeError("boom")


def test_close_on_a_thread_without_context(g: int, spy: Spy) -> None:
    """Teardown makes no context current: the VMM calls are device-level."""
    import threading

    r, p, m = _trio(g)
    buf = cm.GrowableBuffer(4 * g, chunk=g)
    buf.resize(2 * g)
    errors: list[BaseException] = []

    def body() -> None:
        try:
            assert int(_driver.call("cuCtxGetCurrent")) == 0
            for obj in (m, p, r, buf):
                obj.close()
        except BaseException as exc:  # handed back to the test thread
            errors.append(exc)

    spy.calls.clear()
    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert not errors, errors
    assert spy.teardown()[:3] == ["cuMemUnmap", "cuMemRelease", "cuMemAddressFree"]
