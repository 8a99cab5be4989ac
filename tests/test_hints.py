"""ManagedMemoryHints: the builder over a buffer or a checked raw pointer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver
from cuda_memkit._core._context import ensure_context

from ._helpers import issued, record_calls

pytestmark = pytest.mark.uses_managed_memory

MiB = 1 << 20
PAGE = 4096
D0 = cm.Location.device(0)
HOST = cm.Location.host()
H = cm.ManagedMemoryHints
P = cm.MigrationPolicy

@pytest.fixture
def buf() -> Iterator[cm.ManagedBuffer]:
    b = cm.ManagedBuffer.empty(4 * MiB)
    yield b
    b.close()


@pytest.fixture
def device_ptr() -> Iterator[int]:
    ensure_context()
    p = int(_driver.call("cuMemAlloc", MiB))
    yield p
    _driver.call("cuMemFree", p)


def test_builder_chains_and_applies(buf: cm.ManagedBuffer, stream: cm.Stream) -> None:
    h = H.for_buffer(buf)
    out = (h.set_read_mostly()
            .set_preferred_location(D0)
            .set_accessed_by(HOST)
            .prefetch_to(D0, stream))
    assert out is h
    stream.synchronize()
    info = h.range_info()
    assert info.read_mostly
    assert info.preferred_location == D0
    assert info.accessed_by == (HOST,)
    assert info.last_prefetch_location == D0
    h.unset_read_mostly().unset_preferred_location().unset_accessed_by(HOST)
    info = h.range_info()
    assert not info.read_mostly and info.preferred_location is None and info.accessed_by == ()


def test_hints_on_a_buffer_sub_range(buf: cm.ManagedBuffer) -> None:
    h = H.for_buffer(buf, offset=MiB, nbytes=MiB)
    assert h.ptr == buf.ptr + MiB and h.nbytes == MiB
    h.set_read_mostly()
    assert buf.range_info(MiB, MiB).read_mostly
    assert not buf.range_info(0, MiB).read_mostly
    assert not buf.range_info(2 * MiB).read_mostly


def test_raw_pointer_inside_a_managed_allocation(buf: cm.ManagedBuffer) -> None:
    h = H(buf.ptr + MiB, 2 * MiB)
    assert (h.ptr, h.nbytes) == (buf.ptr + MiB, 2 * MiB)
    h.set_preferred_location(HOST)
    assert buf.range_info(MiB, 2 * MiB).preferred_location == HOST
    assert "ManagedMemoryHints" in repr(h)


def test_raw_pointer_to_the_last_byte(buf: cm.ManagedBuffer) -> None:
    assert not buf.range_info(buf.nbytes - 1, 1).read_mostly
    H(buf.ptr + buf.nbytes - 1, 1).set_read_mostly()
    assert buf.range_info(buf.nbytes - 1, 1).read_mostly


def test_device_memory_is_refused(monkeypatch: pytest.MonkeyPatch, device_ptr: int) -> None:
    with record_calls(monkeypatch) as calls, pytest.raises(ValueError, match="managed"):
        H(device_ptr, MiB)
    assert issued(calls) == []


def test_host_memory_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    arr = np.zeros(MiB, np.uint8)
    with record_calls(monkeypatch) as calls, pytest.raises(ValueError):
        H(arr.ctypes.data, MiB)
    assert issued(calls) == []


@pytest.mark.parametrize(("ptr_off", "nbytes", "exc"), [
    (0, 0, ValueError),
    (0, 4 * MiB + 1, ValueError),
    (4 * MiB - PAGE, 2 * PAGE, ValueError),
    (0, -1, ValueError),
    (0, None, TypeError),
    (0, 1.5, TypeError),
])
def test_raw_ranges_are_bounds_checked(monkeypatch: pytest.MonkeyPatch, buf: cm.ManagedBuffer,
                                       ptr_off: int, nbytes: Any, exc: type) -> None:
    with record_calls(monkeypatch) as calls, pytest.raises(exc):
        H(buf.ptr + ptr_off, nbytes)
    assert issued(calls) == []


def test_bad_pointers() -> None:
    with pytest.raises(ValueError):
        H(0, 10)
    with pytest.raises(TypeError):
        H("0x1000", 10)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        H(True, 10)


def test_constructor_and_for_buffer_take_the_right_things(buf: cm.ManagedBuffer) -> None:
    with pytest.raises(TypeError, match="for_buffer"):
        H(buf, 10)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="raw pointer"):
        H.for_buffer(buf.ptr)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        H.for_buffer(buf, offset=4 * MiB)


def test_prefetch_range_is_bounds_checked(monkeypatch: pytest.MonkeyPatch,
                                          buf: cm.ManagedBuffer, stream: cm.Stream) -> None:
    h = H.for_buffer(buf, offset=MiB, nbytes=MiB)
    for off, n in ((0, MiB + 1), (MiB, 1), (-1, 10), (0, 0)):
        with record_calls(monkeypatch) as calls, pytest.raises(ValueError):
            h.prefetch_range(off, n, D0, stream)
        assert issued(calls) == []
    h.prefetch_range(PAGE, PAGE, D0, stream)
    stream.synchronize()
    assert buf.range_info(MiB + PAGE, PAGE).last_prefetch_location == D0
    assert buf.range_info(MiB, PAGE).last_prefetch_location is None


def test_prefetch_bad_destination(monkeypatch: pytest.MonkeyPatch,
                                  buf: cm.ManagedBuffer) -> None:
    h = H.for_buffer(buf)
    with record_calls(monkeypatch) as calls, pytest.raises(ValueError, match="device 7"):
        h.prefetch_to(cm.Location.device(7))
    assert issued(calls) == []


def test_apply_default_policy_issues_nothing(monkeypatch: pytest.MonkeyPatch,
                                             buf: cm.ManagedBuffer) -> None:
    with record_calls(monkeypatch) as calls:
        H.for_buffer(buf).apply_policy(P.default())
    assert issued(calls) == []


def test_apply_policy_issues_its_pairs(monkeypatch: pytest.MonkeyPatch,
                                       buf: cm.ManagedBuffer) -> None:
    policy = P.read_mostly() | P.prefer_host().with_accessed_by(0)
    with record_calls(monkeypatch) as calls:
        H.for_buffer(buf).apply_policy(policy)
    advised = [int(args[2]) for api, args in calls if api == "cuMemAdvise"]
    assert advised == [int(a) for a, _ in policy.advice]
    info = buf.range_info()
    assert info.read_mostly and info.preferred_location == HOST
    assert info.accessed_by == (D0,)


def test_prefer_host_policy_really_prefers_the_host(buf: cm.ManagedBuffer) -> None:
    H.for_buffer(buf).apply_policy(P.prefer_host())
    assert buf.range_info().preferred_location == HOST
    assert buf.range_info().raw["preferred_location"] == -1  # CU_DEVICE_CPU


def test_invalid_policy_issues_nothing(monkeypatch: pytest.MonkeyPatch,
                                       buf: cm.ManagedBuffer) -> None:
    policy = P.read_mostly() | P.prefer_device(7)
    with record_calls(monkeypatch) as calls, pytest.raises(ValueError, match="device 7"):
        H.for_buffer(buf).apply_policy(policy)
    assert issued(calls) == []
    assert not buf.range_info().read_mostly
    with pytest.raises(TypeError):
        H.for_buffer(buf).apply_policy("read_mostly")  # type: ignore[arg-type]


def test_reset_undoes_everything(buf: cm.ManagedBuffer) -> None:
    h = H.for_buffer(buf).apply_policy(P.read_mostly() | P.prefer_device(0)
                                       .with_accessed_by(0, HOST))
    h.reset()
    info = h.range_info()
    assert (info.read_mostly, info.preferred_location, info.accessed_by) == (False, None, ())


def test_closed_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    b = cm.ManagedBuffer.empty(PAGE)
    h = H.for_buffer(b)
    b.close()
    with record_calls(monkeypatch) as calls, pytest.raises(cm.ClosedError):
        h.set_read_mostly()
    assert calls == []
    with pytest.raises(cm.ClosedError):
        H.for_buffer(b)


def test_freed_raw_pointer_is_refused_later(monkeypatch: pytest.MonkeyPatch) -> None:
    b = cm.ManagedBuffer.empty(PAGE)
    h = H(b.ptr, PAGE)
    b.close()
    with record_calls(monkeypatch) as calls, pytest.raises(ValueError):
        h.set_read_mostly()
    assert issued(calls) == []


def test_discard_via_hints(buf: cm.ManagedBuffer, stream: cm.Stream) -> None:
    H.for_buffer(buf, nbytes=MiB).discard(stream).prefetch_to(D0, stream)
    stream.synchronize()
    assert buf.range_info(0, MiB).last_prefetch_location == D0


def test_generic_advise(buf: cm.ManagedBuffer) -> None:
    H.for_buffer(buf).advise(cm.MemAdvice.SET_ACCESSED_BY, cm.Device(0))
    assert buf.range_info().accessed_by == (D0,)
    with pytest.raises(TypeError):
        H.for_buffer(buf).advise(cm.MemAdvice.SET_ACCESSED_BY)
