"""ManagedBuffer: allocation, views, attach, and advise/prefetch/discard on any range."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _driver

from ._helpers import Calls, record_calls, without_hold

pytestmark = pytest.mark.uses_managed_memory

MiB = 1 << 20
PAGE = 4096
D0 = cm.Location.device(0)
HOST = cm.Location.host()
A = cm.MemAdvice

def apis(calls: Calls) -> list[str]:
    return [api for api, _ in calls]


@pytest.fixture
def buf() -> Iterator[cm.ManagedBuffer]:
    b = cm.ManagedBuffer.zeros(4 * MiB // 4, np.float32)
    yield b
    b.close()


# -- enums -----------------------------------------------------------------------------


def test_attach_flags_match_the_driver() -> None:
    f = cu.CUmemAttach_flags
    assert cm.AttachFlags.GLOBAL == f.CU_MEM_ATTACH_GLOBAL
    assert cm.AttachFlags.HOST == f.CU_MEM_ATTACH_HOST
    assert cm.AttachFlags.SINGLE == f.CU_MEM_ATTACH_SINGLE


def test_mem_advice_matches_the_driver() -> None:
    for adv in cm.MemAdvice:
        assert int(getattr(cu.CUmem_advise, f"CU_MEM_ADVISE_{adv.name}")) == adv
    assert {a for a in cm.MemAdvice if a.needs_location} == {
        A.SET_PREFERRED_LOCATION, A.SET_ACCESSED_BY, A.UNSET_ACCESSED_BY}


# -- construction ------------------------------------------------------------------------


def test_empty_shape_dtype_and_pointer() -> None:
    with cm.ManagedBuffer.empty((4, 256), np.float64) as b:
        assert b.shape == (4, 256)
        assert b.dtype == np.float64
        assert b.nbytes == 4 * 256 * 8
        assert b.ptr != 0
        assert b.attach_flags is cm.AttachFlags.GLOBAL
        assert b.array.shape == (4, 256) and b.array.dtype == np.float64
        assert b.device == 0


def test_default_dtype_is_bytes() -> None:
    with cm.ManagedBuffer.empty(100) as b:
        assert b.dtype == np.uint8 and b.shape == (100,) and b.nbytes == 100


def test_direct_construction_is_refused() -> None:
    with pytest.raises(TypeError, match="empty"):
        cm.ManagedBuffer(100)


def test_zeros_are_zero() -> None:
    with cm.ManagedBuffer.zeros((3, 1000), np.int32) as b:
        assert not b.to_numpy().any()
        assert not b.array.any()


def test_from_array_round_trip() -> None:
    src = np.arange(12345, dtype=np.float32).reshape(3, -1)
    with cm.ManagedBuffer.from_array(src) as b:
        assert b.shape == src.shape and b.dtype == src.dtype
        np.testing.assert_array_equal(b.array, src)
        np.testing.assert_array_equal(b.to_numpy(), src)
        b.array[0, 0] = -1
        assert b.to_numpy()[0, 0] == -1
        assert np.asarray(b)[0, 0] == -1
        assert np.array(b, copy=True) is not b.array


def test_from_array_takes_non_contiguous_input() -> None:
    src = np.arange(100, dtype=np.int64)[::3]
    with cm.ManagedBuffer.from_array(src) as b:
        np.testing.assert_array_equal(b.array, src)


def test_attach_host_at_allocation() -> None:
    with cm.ManagedBuffer.empty(PAGE, attach=cm.AttachFlags.HOST) as b:
        assert b.attach_flags is cm.AttachFlags.HOST


def test_zero_length_allocates_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    with record_calls(monkeypatch) as calls:
        b = cm.ManagedBuffer.zeros((0, 4), np.float32)
    assert "cuMemAllocManaged" not in apis(calls)
    assert b.ptr == 0 and b.nbytes == 0 and b.array.shape == (0, 4)
    with pytest.raises(ValueError, match="zero-size"):
        b.prefetch(D0)
    b.close()


@pytest.mark.parametrize(("kwargs", "exc"), [
    ({"shape": -1}, ValueError),
    ({"shape": (2, -3)}, ValueError),
    ({"shape": 1.5}, TypeError),
    ({"shape": True}, TypeError),
    ({"shape": 4, "dtype": object}, TypeError),
    ({"shape": 4, "attach": cm.AttachFlags.SINGLE}, ValueError),
    ({"shape": 4, "attach": cm.AttachFlags.GLOBAL | cm.AttachFlags.HOST}, ValueError),
    ({"shape": 4, "attach": True}, TypeError),
    ({"shape": 4, "attach": "global"}, TypeError),
    ({"shape": (2**40, 2**40)}, ValueError),  # too many bytes for any buffer
    ({"shape": 1 << 61, "dtype": "float64"}, ValueError),
    ({"shape": 1 << 63}, ValueError),
])
def test_bad_arguments_fail_before_the_driver(monkeypatch: pytest.MonkeyPatch,
                                              kwargs: dict[str, Any], exc: type) -> None:
    with record_calls(monkeypatch) as calls, pytest.raises(exc):
        cm.ManagedBuffer.empty(**kwargs)
    assert "cuMemAllocManaged" not in apis(calls)


# -- lifetime ------------------------------------------------------------------------------


def test_close_is_idempotent_and_blocks_use(buf: cm.ManagedBuffer) -> None:
    buf.close()
    buf.close()
    assert buf.closed
    assert buf.nbytes == 4 * MiB  # describing it is not using it: nbytes answers
    uses = (lambda: buf.ptr, lambda: buf.array,
            lambda: buf.advise(A.SET_READ_MOSTLY), lambda: buf.prefetch(D0),
            lambda: buf.discard(), lambda: buf.range_info(),
            lambda: buf.attach(None, cm.AttachFlags.GLOBAL))
    for use in uses:
        with pytest.raises(cm.ClosedError):
            use()
    assert "closed" in repr(buf)


def test_advising_a_closed_buffer_is_a_closed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    b = cm.ManagedBuffer.empty(PAGE)
    b.close()
    with record_calls(monkeypatch) as calls, pytest.raises(cm.ClosedError):
        b.advise(A.SET_PREFERRED_LOCATION, D0)
    assert calls == []


def test_context_manager_frees(monkeypatch: pytest.MonkeyPatch) -> None:
    with record_calls(monkeypatch) as calls:
        with cm.ManagedBuffer.empty(PAGE) as b:
            ptr = b.ptr
    assert ("cuMemFree", (ptr,)) in calls


def test_garbage_collection_frees(monkeypatch: pytest.MonkeyPatch) -> None:
    with record_calls(monkeypatch) as calls:
        b = cm.ManagedBuffer.empty(PAGE)
        ptr = b.ptr
        del b
        gc.collect()
    assert ("cuMemFree", (ptr,)) in calls


def test_close_waits_for_views(monkeypatch: pytest.MonkeyPatch) -> None:
    b = cm.ManagedBuffer.from_array(np.arange(10, dtype=np.int32))
    view = b.array
    with record_calls(monkeypatch) as calls:
        b.close()
        assert "cuMemFree" not in apis(calls)
        assert view[9] == 9  # still valid memory
        del view, b
        gc.collect()
    assert "cuMemFree" in apis(calls)


def test_repr(buf: cm.ManagedBuffer) -> None:
    text = repr(buf)
    assert "ManagedBuffer" in text and "float32" in text and f"0x{buf.ptr:x}" in text


# -- interop -------------------------------------------------------------------------------


def test_cuda_array_interface_is_typed(buf: cm.ManagedBuffer) -> None:
    cai = buf.__cuda_array_interface__
    assert cai["shape"] == buf.shape
    assert cai["typestr"] == "<f4"
    assert cai["data"] == (buf.ptr, False)
    assert cai["version"] == 3


def test_dlpack_device_is_cuda_managed(buf: cm.ManagedBuffer) -> None:
    assert buf.__dlpack_device__() == (13, 0)
    view = buf.as_array(np.int32, (2, 2))
    assert view.__dlpack_device__() == (13, 0)
    assert view.ptr == buf.ptr


# -- attach ----------------------------------------------------------------------------------


def test_attach_single_to_a_stream(buf: cm.ManagedBuffer, stream: cm.Stream) -> None:
    buf.attach(stream)
    assert buf.attach_flags is cm.AttachFlags.SINGLE
    buf.attach(stream, cm.AttachFlags.GLOBAL)
    stream.synchronize()
    assert buf.attach_flags is cm.AttachFlags.GLOBAL


def test_attach_global_or_host_on_the_default_stream(buf: cm.ManagedBuffer) -> None:
    buf.attach(None, cm.AttachFlags.HOST)
    assert buf.attach_flags is cm.AttachFlags.HOST
    buf.attach(None, cm.AttachFlags.GLOBAL)
    assert buf.attach_flags is cm.AttachFlags.GLOBAL
    _driver.call("cuStreamSynchronize", 0)


@pytest.mark.parametrize(("stream_arg", "flags", "exc"), [
    (None, cm.AttachFlags.SINGLE, ValueError),
    (1, cm.AttachFlags.SINGLE, ValueError),
    (None, cm.AttachFlags.GLOBAL | cm.AttachFlags.HOST, ValueError),
    (None, 0, ValueError),
    (None, True, TypeError),
    ("stream", cm.AttachFlags.GLOBAL, TypeError),
])
def test_attach_bad_input(monkeypatch: pytest.MonkeyPatch, buf: cm.ManagedBuffer,
                          stream_arg: Any, flags: Any, exc: type) -> None:
    with record_calls(monkeypatch) as calls, pytest.raises(exc):
        buf.attach(stream_arg, flags)
    assert "cuStreamAttachMemAsync" not in apis(calls)


# -- advise --------------------------------------------------------------------------------


def test_read_mostly_on_the_whole_buffer(buf: cm.ManagedBuffer) -> None:
    assert not buf.range_info().read_mostly
    buf.advise(A.SET_READ_MOSTLY)
    assert buf.range_info().read_mostly
    buf.advise(A.UNSET_READ_MOSTLY)
    assert not buf.range_info().read_mostly


def test_advice_on_a_sub_range(buf: cm.ManagedBuffer) -> None:
    half = buf.nbytes // 2
    buf.advise(A.SET_READ_MOSTLY, offset=0, nbytes=half)
    assert buf.range_info(0, half).read_mostly
    assert not buf.range_info(half).read_mostly
    assert not buf.range_info().read_mostly  # pages disagree


def test_preferred_location_kinds(buf: cm.ManagedBuffer) -> None:
    buf.advise(A.SET_PREFERRED_LOCATION, D0)
    assert buf.range_info().preferred_location == D0
    buf.advise(A.SET_PREFERRED_LOCATION, cm.Device(0))
    assert buf.range_info().preferred_location == D0
    buf.advise(A.SET_PREFERRED_LOCATION, HOST)
    assert buf.range_info().preferred_location == HOST
    buf.advise(A.UNSET_PREFERRED_LOCATION)
    assert buf.range_info().preferred_location is None


def test_mixed_preferred_locations_report_none(buf: cm.ManagedBuffer) -> None:
    half = buf.nbytes // 2
    buf.advise(A.SET_PREFERRED_LOCATION, D0, nbytes=half)
    buf.advise(A.SET_PREFERRED_LOCATION, HOST, offset=half)
    info = buf.range_info()
    assert info.preferred_location is None
    assert info.raw["preferred_location"] == -2
    assert buf.range_info(0, half).preferred_location == D0
    assert buf.range_info(half).preferred_location == HOST


def test_accessed_by_device_and_host(buf: cm.ManagedBuffer) -> None:
    buf.advise(A.SET_ACCESSED_BY, 0)
    assert buf.range_info().accessed_by == (D0,)
    buf.advise(A.SET_ACCESSED_BY, HOST)
    assert buf.range_info().accessed_by == (D0, HOST)
    buf.advise(A.UNSET_ACCESSED_BY, HOST)
    buf.advise(A.UNSET_ACCESSED_BY, D0)
    assert buf.range_info().accessed_by == ()


def test_advice_accepts_driver_enum_and_int(buf: cm.ManagedBuffer) -> None:
    buf.advise(cu.CUmem_advise.CU_MEM_ADVISE_SET_READ_MOSTLY)
    buf.advise(2)
    assert not buf.range_info().read_mostly


def test_ignored_location_is_still_type_checked(buf: cm.ManagedBuffer) -> None:
    buf.advise(A.SET_READ_MOSTLY, location=D0)
    with pytest.raises(TypeError):
        buf.advise(A.SET_READ_MOSTLY, location="gpu")  # type: ignore[arg-type]


@pytest.mark.parametrize(("advice", "location", "kwargs", "exc"), [
    (A.SET_PREFERRED_LOCATION, None, {}, TypeError),
    (A.SET_ACCESSED_BY, None, {}, TypeError),
    (A.SET_ACCESSED_BY, cm.Location.host_numa(0), {}, ValueError),
    (A.SET_ACCESSED_BY, cm.Location.host_numa_current(), {}, ValueError),
    (A.SET_PREFERRED_LOCATION, cm.Location.device(7), {}, ValueError),
    (A.SET_PREFERRED_LOCATION, cm.Location.host_numa(999), {}, ValueError),
    (A.SET_PREFERRED_LOCATION, "host", {}, TypeError),
    (99, None, {}, ValueError),
    ("read_mostly", None, {}, TypeError),
    (True, None, {}, TypeError),
    (A.SET_READ_MOSTLY, None, {"nbytes": 0}, ValueError),
    (A.SET_READ_MOSTLY, None, {"offset": 4 * MiB}, ValueError),
    (A.SET_READ_MOSTLY, None, {"offset": 4 * MiB - 1, "nbytes": 2}, ValueError),
    (A.SET_READ_MOSTLY, None, {"offset": -1}, ValueError),
    (A.SET_READ_MOSTLY, None, {"nbytes": -5}, ValueError),
    (A.SET_READ_MOSTLY, None, {"offset": 1.0}, TypeError),
    (A.SET_READ_MOSTLY, None, {"nbytes": True}, TypeError),
])
def test_advise_bad_input_fails_before_the_driver(
        monkeypatch: pytest.MonkeyPatch, buf: cm.ManagedBuffer, advice: Any, location: Any,
        kwargs: dict[str, Any], exc: type) -> None:
    with record_calls(monkeypatch) as calls, pytest.raises(exc):
        buf.advise(advice, location, **kwargs)
    assert "cuMemAdvise" not in apis(calls)


def test_device_seven_message(buf: cm.ManagedBuffer) -> None:
    with pytest.raises(ValueError, match="device 7 does not exist"):
        buf.prefetch(cm.Location.device(7))


# -- prefetch / discard ------------------------------------------------------------------------


def test_prefetch_records_the_last_location(buf: cm.ManagedBuffer, stream: cm.Stream) -> None:
    assert buf.range_info().last_prefetch_location is None
    buf.prefetch(D0, stream=stream)
    stream.synchronize()
    assert buf.range_info().last_prefetch_location == D0
    half = buf.nbytes // 2
    buf.prefetch(HOST, stream=stream, offset=half)
    stream.synchronize()
    assert buf.range_info().last_prefetch_location is None
    assert buf.range_info(half).last_prefetch_location == HOST
    assert buf.range_info(0, half).last_prefetch_location == D0


@pytest.mark.parametrize("stream_arg", [None, 0, 1, "fixture"])
def test_prefetch_on_any_stream(buf: cm.ManagedBuffer, stream: cm.Stream,
                                stream_arg: Any) -> None:
    s = stream if stream_arg == "fixture" else stream_arg
    buf.prefetch(cm.Device(0), stream=s)
    _driver.call("cuCtxSynchronize")
    assert buf.range_info().last_prefetch_location == D0


def test_prefetch_keeps_the_data(stream: cm.Stream) -> None:
    src = np.random.default_rng(1).random(1 << 16)
    with cm.ManagedBuffer.from_array(src) as b:
        b.prefetch(D0, stream=stream)
        b.prefetch(HOST, stream=stream)
        stream.synchronize()
        np.testing.assert_array_equal(b.array, src)


def test_prefetch_bad_destination_fails_before_the_driver(
        monkeypatch: pytest.MonkeyPatch, buf: cm.ManagedBuffer) -> None:
    for bad, exc in ((cm.Location.device(7), ValueError), (cm.Location.host_numa(4096),
                                                            ValueError), ("gpu0", TypeError)):
        with record_calls(monkeypatch) as calls, pytest.raises(exc):
            buf.prefetch(bad)
        assert "cuMemPrefetchAsync" not in apis(calls)


def test_discard_then_prefetch(buf: cm.ManagedBuffer, stream: cm.Stream) -> None:
    buf.discard(stream=stream)
    buf.discard_and_prefetch(D0, stream=stream, offset=PAGE, nbytes=PAGE)
    stream.synchronize()
    assert buf.range_info(PAGE, PAGE).last_prefetch_location == D0


def test_discard_on_the_legacy_stream_uses_a_private_stream(
        monkeypatch: pytest.MonkeyPatch, buf: cm.ManagedBuffer) -> None:
    with record_calls(monkeypatch) as calls:
        buf.discard()
    _driver.call("cuCtxSynchronize")
    names = without_hold(apis(calls))
    batch = [args for api, args in calls if api == "cuMemDiscardBatchAsync"]
    if batch:  # the driver has the batch calls
        assert int(batch[0][-1]) not in (0, 1)
        assert names.index("cuStreamCreate") < names.index("cuMemDiscardBatchAsync")
        assert names[-2:] == ["cuStreamDestroy", "cuEventDestroy"]
        waits = [args for api, args in calls if api == "cuStreamWaitEvent"]
        assert int(waits[-1][0]) == 0  # the legacy stream waits for the private one


def test_discard_sub_range_bounds(buf: cm.ManagedBuffer) -> None:
    with pytest.raises(ValueError):
        buf.discard(offset=buf.nbytes, nbytes=1)


@pytest.mark.sim_only
def test_without_batch_calls_discard_is_skipped(monkeypatch: pytest.MonkeyPatch,
                                                buf: cm.ManagedBuffer, stream: cm.Stream,
                                                no_batch: None) -> None:
    with record_calls(monkeypatch) as calls:
        buf.discard(stream=stream)
        buf.discard_and_prefetch(D0, stream=stream)
    names = apis(calls)
    assert "cuMemPrefetchAsync" in names
    assert names.count("cuMemDiscardBatchAsync") == 1  # tried once, then skipped
    assert buf.range_info().last_prefetch_location == D0


# -- simulator -------------------------------------------------------------------------------


@pytest.mark.sim_only
def test_managed_out_of_memory_leaves_nothing() -> None:
    from cuda_memkit.sim import machine

    m = machine()
    saved = m.host_memory
    m.host_memory = m.host_used + MiB
    try:
        before = len(m.allocs)
        with pytest.raises(cm.CudaOutOfMemoryError) as info:
            cm.ManagedBuffer.empty(2 * MiB)
        assert info.value.api == "cuMemAllocManaged"
        assert len(m.allocs) == before
    finally:
        m.host_memory = saved


@pytest.mark.sim_only
def test_simulator_charges_and_releases_host_memory() -> None:
    from cuda_memkit.sim import machine

    before = machine().host_used
    with cm.ManagedBuffer.empty(MiB):
        assert machine().host_used == before + MiB
    assert machine().host_used == before


@pytest.mark.sim_only
def test_simulator_keeps_advice_per_page() -> None:
    with cm.ManagedBuffer.empty(8 * PAGE) as b:
        b.advise(A.SET_READ_MOSTLY, offset=PAGE + 10, nbytes=1)  # rounds out to page 1
        assert b.range_info(PAGE, PAGE).read_mostly
        assert not b.range_info(0, PAGE).read_mostly
        assert not b.range_info(2 * PAGE, PAGE).read_mostly


@pytest.fixture(params=[True, False], ids=["typed-attributes", "bindings-13.3"])
def typed_attributes(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Run with and without bindings that read the typed range attributes."""
    from cuda_memkit._managed_memory import _managed_ranges
    from cuda_memkit.sim import _managed as sim_managed

    saved = sim_managed.TYPED_RANGE_ATTRIBUTES
    sim_managed.TYPED_RANGE_ATTRIBUTES = request.param
    _managed_ranges._typed_readable[0] = True  # cuda_memkit asks the bindings again
    try:
        yield request.param
    finally:
        sim_managed.TYPED_RANGE_ATTRIBUTES = saved
        _managed_ranges._typed_readable[0] = True


@pytest.mark.sim_only
def test_range_info_with_and_without_typed_attributes(typed_attributes: bool,
                                                      buf: cm.ManagedBuffer,
                                                      stream: cm.Stream) -> None:
    numa = cm.Location.host_numa(0)
    buf.advise(A.SET_PREFERRED_LOCATION, numa)
    buf.prefetch(D0, stream=stream)
    info = buf.range_info()
    assert info.last_prefetch_location == D0
    assert ("preferred_location_type" in info.raw) is typed_attributes
    # Only the typed attributes tell a NUMA node from the host.
    assert info.preferred_location == (numa if typed_attributes else HOST)
    assert info.raw["preferred_location"] == -1
    buf.advise(A.SET_PREFERRED_LOCATION, D0, nbytes=PAGE)
    assert buf.range_info().preferred_location is None
