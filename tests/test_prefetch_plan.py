"""PrefetchPlan: entries, all-or-nothing validation, coalescing, batching, fallback, streams."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cuda_memkit as cm
from cuda_memkit._core import _driver
from cuda_memkit._core._context import ensure_context
from cuda_memkit._managed_memory import _plan_ranges as plan_ranges
from cuda_memkit._managed_memory import _prefetch_plan as plan_mod

from ._helpers import issued, record_calls, without_hold

pytestmark = pytest.mark.uses_managed_memory

KiB = 1 << 10
MiB = 1 << 20
PAGE = 4096
D0 = cm.Location.device(0)
HOST = cm.Location.host()

@pytest.fixture
def buf() -> Iterator[cm.ManagedBuffer]:
    b = cm.ManagedBuffer.empty(8 * MiB)
    yield b
    b.close()


def strided(buf: cm.ManagedBuffer, n: int, chunk: int, to: cm.Location = D0) -> cm.PrefetchPlan:
    """Every other chunk: nothing coalesces."""
    plan = cm.PrefetchPlan(exact=True)
    for i in range(n):
        plan.add(buf, to, offset=2 * i * chunk, nbytes=chunk)
    return plan


# -- building and inspection ---------------------------------------------------------


def test_empty_plan_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = cm.PrefetchPlan()
    with record_calls(monkeypatch) as calls:
        plan.execute()
        plan.execute(cm.Stream.legacy_default())
        assert plan.dry_run() == []
    assert calls == []
    assert len(plan) == 0 and not plan and list(plan) == [] and plan.entries == ()
    assert repr(plan) == "<PrefetchPlan 0 entries>"


def test_add_is_chainable_and_recorded(buf: cm.ManagedBuffer) -> None:
    plan = cm.PrefetchPlan()
    out = plan.add(buf, 0).add(buf, HOST, offset=MiB, nbytes=PAGE).discard(buf, nbytes=PAGE)
    assert out is plan
    assert len(plan) == 3 and bool(plan)
    e0, e1, e2 = plan.entries
    assert (e0.op, e0.ptr, e0.nbytes, e0.location) == ("prefetch", buf.ptr, 8 * MiB, D0)
    assert (e1.offset, e1.nbytes, e1.location) == (MiB, PAGE, HOST)
    assert (e2.op, e2.location) == ("discard", None)
    assert list(plan) == [e0, e1, e2]
    assert e0.target is buf
    assert "prefetch" in str(e0) and "device 0" in str(e0)
    plan.clear()
    assert len(plan) == 0


@pytest.mark.parametrize(("target", "to", "kwargs", "exc"), [
    ("buf", D0, {"nbytes": 0}, ValueError),
    ("buf", D0, {"offset": 8 * MiB}, ValueError),
    ("buf", D0, {"offset": 8 * MiB - 1, "nbytes": 2}, ValueError),
    ("buf", D0, {"offset": -1}, ValueError),
    ("buf", D0, {"offset": 0.5}, TypeError),
    ("buf", None, {}, TypeError),
    ("buf", "gpu", {}, TypeError),
    ("str", D0, {}, TypeError),
    (True, D0, {}, TypeError),
    (0, D0, {"nbytes": 10}, ValueError),
    (-5, D0, {"nbytes": 10}, ValueError),
    ("ptr", D0, {"nbytes": 0}, ValueError),
    ("ptr", D0, {"offset": -1}, ValueError),
])
def test_add_checks_what_it_can_at_once(buf: cm.ManagedBuffer, target: Any, to: Any,
                                        kwargs: dict[str, Any], exc: type) -> None:
    named = {"buf": buf, "str": "buffer", "ptr": buf.ptr}
    t = named[target] if isinstance(target, str) else target
    with pytest.raises(exc):
        cm.PrefetchPlan().add(t, to, **kwargs)


def test_add_a_closed_buffer_is_a_closed_error() -> None:
    b = cm.ManagedBuffer.empty(PAGE)
    b.close()
    with pytest.raises(cm.ClosedError):
        cm.PrefetchPlan().add(b, D0)
    with pytest.raises(cm.ClosedError):
        cm.PrefetchPlan().discard(b)


# -- coalescing ------------------------------------------------------------------------


def test_contiguous_entries_become_one_call(monkeypatch: pytest.MonkeyPatch,
                                            buf: cm.ManagedBuffer, stream: cm.Stream) -> None:
    plan = cm.PrefetchPlan()
    chunk = 128 * KiB
    for i in range(buf.nbytes // chunk):
        plan.add(buf, D0, offset=i * chunk, nbytes=chunk)
    assert len(plan) == 64
    (call,) = plan.dry_run(stream)
    assert call.api == "cuMemPrefetchAsync"
    assert call.ranges == ((buf.ptr, buf.nbytes, D0),)
    with record_calls(monkeypatch) as calls:
        plan.execute(stream)
    assert issued(calls) == ["cuMemPrefetchAsync"]
    stream.synchronize()
    assert buf.range_info().last_prefetch_location == D0


def test_4096_small_entries_coalesce(monkeypatch: pytest.MonkeyPatch,
                                     buf: cm.ManagedBuffer, stream: cm.Stream) -> None:
    plan = cm.PrefetchPlan()
    chunk = buf.nbytes // 4096
    order = list(range(4096))
    random.Random(4).shuffle(order)  # the order entries are added in does not matter
    for i in order:
        plan.add(buf, D0, offset=i * chunk, nbytes=chunk)
    with record_calls(monkeypatch) as calls:
        plan.execute(stream)
    assert issued(calls) == ["cuMemPrefetchAsync"]
    assert "cuMemPrefetchAsync(1 range" in repr(plan)


def test_overlapping_entries_coalesce(buf: cm.ManagedBuffer) -> None:
    plan = (cm.PrefetchPlan()
            .add(buf, D0, offset=0, nbytes=3 * PAGE)
            .add(buf, D0, offset=PAGE, nbytes=PAGE)
            .add(buf, D0, offset=2 * PAGE + 7, nbytes=5 * PAGE))
    (call,) = plan.dry_run()
    assert call.ranges == ((buf.ptr, 7 * PAGE + 7, D0),)


def test_gaps_and_destinations_are_kept_apart(monkeypatch: pytest.MonkeyPatch,
                                              buf: cm.ManagedBuffer, stream: cm.Stream) -> None:
    plan = (cm.PrefetchPlan()
            .add(buf, D0, offset=0, nbytes=PAGE)
            .add(buf, HOST, offset=PAGE, nbytes=PAGE)       # adjacent, other destination
            .add(buf, D0, offset=4 * PAGE, nbytes=PAGE)     # gap
            .add(buf, HOST, offset=6 * PAGE, nbytes=PAGE))
    (call,) = plan.dry_run(stream)
    assert call.api == "cuMemPrefetchBatchAsync"
    p = buf.ptr
    assert call.ranges == ((p, PAGE, D0), (p + 4 * PAGE, PAGE, D0),
                           (p + PAGE, PAGE, HOST), (p + 6 * PAGE, PAGE, HOST))
    with record_calls(monkeypatch) as calls:
        plan.execute(stream)
    stream.synchronize()
    batch = [args for api, args in calls if api == "cuMemPrefetchBatchAsync"]
    if batch:  # the driver has the batch call: check its arguments
        dptrs, sizes, count, locs, idxs, nlocs, flags, hstream = batch[0]
        assert all(isinstance(x, cu.CUdeviceptr) for x in dptrs)
        assert [int(x) for x in dptrs] == [p, p + 4 * PAGE, p + PAGE, p + 6 * PAGE]
        assert sizes == [PAGE] * 4 and count == 4
        assert idxs == [0, 2] and nlocs == 2 and flags == 0
        assert [(int(x.type), x.id) for x in locs] == [(1, 0), (2, 0)]
        assert int(hstream) == stream.handle
    for off, where in ((0, D0), (PAGE, HOST), (4 * PAGE, D0), (6 * PAGE, HOST)):
        assert buf.range_info(off, PAGE).last_prefetch_location == where
    assert buf.range_info(2 * PAGE, PAGE).last_prefetch_location is None


def test_entries_in_two_buffers(buf: cm.ManagedBuffer, stream: cm.Stream) -> None:
    with cm.ManagedBuffer.empty(MiB) as other:
        plan = cm.PrefetchPlan().add(buf, D0).add(other, D0)
        (call,) = plan.dry_run(stream)
        assert len(call.ranges) == 2  # never coalesced across allocations
        plan.execute(stream)
        stream.synchronize()
        assert other.range_info().last_prefetch_location == D0
        assert buf.range_info().last_prefetch_location == D0


def test_interval_helpers() -> None:
    assert plan_ranges.merge([(1, 10, 20), (1, 0, 5), (1, 5, 10), (2, 20, 30)]) == [(0, 20),
                                                                                  (20, 30)]
    assert plan_ranges.merge([(1, 0, 10), (1, 2, 3), (1, 12, 14)]) == [(0, 10), (12, 14)]
    assert plan_ranges.intersect([(0, 10), (20, 30)], [(5, 25)]) == [(5, 10), (20, 25)]
    assert plan_ranges.subtract([(0, 10), (20, 30)], [(5, 25)]) == [(0, 5), (25, 30)]
    assert plan_ranges.subtract([(0, 10)], [(2, 3), (5, 6)]) == [(0, 2), (3, 5), (6, 10)]
    assert plan_ranges.subtract([(0, 10)], []) == [(0, 10)]
    assert plan_ranges.subtract([(0, 10)], [(0, 10)]) == []


# -- validation ---------------------------------------------------------------------------


def test_validation_is_all_or_nothing(monkeypatch: pytest.MonkeyPatch,
                                      buf: cm.ManagedBuffer, stream: cm.Stream) -> None:
    host = np.zeros(MiB, np.uint8)
    plan = (cm.PrefetchPlan().add(buf, D0, nbytes=MiB).discard(buf, offset=2 * MiB)
            .add(buf, HOST, offset=MiB, nbytes=MiB).add(host.ctypes.data, D0, nbytes=MiB))
    with record_calls(monkeypatch) as calls:
        with pytest.raises(ValueError, match="plan entry 3"):
            plan.validate()
        with pytest.raises(ValueError, match="plan entry 3"):
            plan.execute(stream)
    assert issued(calls) == []


def test_device_memory_entry_is_refused(monkeypatch: pytest.MonkeyPatch,
                                        buf: cm.ManagedBuffer) -> None:
    ensure_context()
    p = int(_driver.call("cuMemAlloc", MiB))
    try:
        plan = cm.PrefetchPlan().add(buf, D0).add(p, D0, nbytes=MiB)
        with record_calls(monkeypatch) as calls, pytest.raises(ValueError, match="managed"):
            plan.execute()
        assert issued(calls) == []
    finally:
        _driver.call("cuMemFree", p)


@pytest.mark.parametrize("to", [cm.Location.device(7), cm.Location.host_numa(4096)])
def test_missing_destination_is_found_by_validate(monkeypatch: pytest.MonkeyPatch,
                                                  buf: cm.ManagedBuffer, to: cm.Location) -> None:
    plan = cm.PrefetchPlan().add(buf, D0, nbytes=PAGE).add(buf, to, offset=PAGE, nbytes=PAGE)
    with record_calls(monkeypatch) as calls, pytest.raises(ValueError, match="plan entry 1"):
        plan.execute()
    assert issued(calls) == []


def test_raw_range_past_the_allocation(buf: cm.ManagedBuffer) -> None:
    plan = cm.PrefetchPlan().add(buf.ptr + MiB, D0, nbytes=8 * MiB)
    with pytest.raises(ValueError, match="outside"):
        plan.validate()


def test_same_range_to_two_destinations_is_refused(buf: cm.ManagedBuffer) -> None:
    plan = cm.PrefetchPlan().add(buf, D0, nbytes=2 * PAGE).add(buf, HOST, offset=PAGE,
                                                                 nbytes=2 * PAGE)
    with pytest.raises(ValueError, match="overlapping"):
        plan.validate()
    nested = (cm.PrefetchPlan().add(buf, D0, nbytes=10 * PAGE)
              .add(buf, HOST, offset=2 * PAGE, nbytes=PAGE)
              .add(buf, D0, offset=4 * PAGE, nbytes=PAGE))
    with pytest.raises(ValueError, match="overlapping"):
        nested.validate()
    assert "not valid" in repr(nested)


def test_closed_buffer_fails_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    b = cm.ManagedBuffer.empty(MiB)
    plan = cm.PrefetchPlan().add(b, D0)
    plan.execute()  # compiled and cached
    b.close()
    with record_calls(monkeypatch) as calls, pytest.raises(cm.ClosedError, match="plan entry 0"):
        plan.execute()
    assert issued(calls) == []


def test_raw_pointer_freed_after_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    b = cm.ManagedBuffer.empty(MiB)
    plan = cm.PrefetchPlan().add(b.ptr, D0)
    assert plan.dry_run()[0].ranges == ((b.ptr, MiB, D0),)  # nbytes=None: to the end
    b.close()
    with record_calls(monkeypatch) as calls, pytest.raises(ValueError, match="plan entry 0"):
        plan.execute()
    assert issued(calls) == []


def test_raw_pointers_and_views(buf: cm.ManagedBuffer, stream: cm.Stream) -> None:
    view = buf.as_array(np.float32)
    plan = (cm.PrefetchPlan().add(buf.ptr + MiB, D0, nbytes=MiB)
            .add(view, D0, offset=2 * MiB, nbytes=MiB))
    (call,) = plan.dry_run(stream)
    assert call.ranges == ((buf.ptr + MiB, 2 * MiB, D0),)
    plan.execute(stream)
    stream.synchronize()
    assert buf.range_info(MiB, 2 * MiB).last_prefetch_location == D0


def _pointer_queries(calls: list[tuple[str, tuple[Any, ...]]]) -> int:
    return sum(api == "cuPointerGetAttribute" for api, _ in calls)


def test_buffer_entries_validate_without_pointer_queries(monkeypatch: pytest.MonkeyPatch,
                                                         buf: cm.ManagedBuffer) -> None:
    plan = strided(buf, 512, PAGE)
    with record_calls(monkeypatch) as calls:
        plan.validate()
    assert _pointer_queries(calls) == 0 and issued(calls) == []


def test_raw_pointers_are_looked_up_once_per_allocation(monkeypatch: pytest.MonkeyPatch,
                                                        buf: cm.ManagedBuffer) -> None:
    with record_calls(monkeypatch) as one:
        plan_mod.managed_extent(buf.ptr)
    per_lookup = _pointer_queries(one)
    with cm.ManagedBuffer.empty(MiB) as other:
        plan = cm.PrefetchPlan()
        for i in range(256):  # interleaved: every entry switches allocation
            plan.add(buf.ptr + i * PAGE, D0, nbytes=PAGE)
            plan.add(other.ptr + i * PAGE, HOST, nbytes=PAGE)
        with record_calls(monkeypatch) as calls:
            plan.validate()
        assert _pointer_queries(calls) == 2 * per_lookup
        assert [c.ranges for c in plan.dry_run(cm.Stream.legacy_default())] == [
            ((buf.ptr, MiB, D0), (other.ptr, MiB, HOST))]


def test_cached_allocation_still_bounds_later_pointers(buf: cm.ManagedBuffer) -> None:
    plan = (cm.PrefetchPlan().add(buf.ptr, D0, nbytes=PAGE)
            .add(buf.ptr + 8 * MiB - PAGE, D0, nbytes=2 * PAGE))
    with pytest.raises(ValueError, match=r"plan entry 1.*outside"):
        plan.validate()
    tail = cm.PrefetchPlan().add(buf.ptr, D0, nbytes=PAGE).add(buf.ptr + 4 * MiB, HOST)
    assert tail.dry_run()[0].ranges == ((buf.ptr, PAGE, D0), (buf.ptr + 4 * MiB, 4 * MiB, HOST))


def test_fast_and_general_add_record_the_same_entry(buf: cm.ManagedBuffer) -> None:
    fast = cm.PrefetchPlan().add(buf, D0, offset=PAGE, nbytes=PAGE)
    general = cm.PrefetchPlan().add(buf, cm.Device(0), offset=np.int64(PAGE),
                                    nbytes=np.int64(PAGE))
    assert fast.entries == general.entries
    assert fast.entries[0].target is buf and general.entries[0].target is buf
    with pytest.raises(ValueError, match="outside"):
        cm.PrefetchPlan().add(buf, D0, offset=8 * MiB - PAGE, nbytes=2 * PAGE)


def test_adding_invalidates_the_cached_form(buf: cm.ManagedBuffer) -> None:
    plan = cm.PrefetchPlan().add(buf, D0, nbytes=PAGE)
    assert plan.dry_run()[0].nbytes == PAGE
    plan.add(buf, D0, offset=PAGE, nbytes=PAGE)
    assert plan.dry_run()[0].nbytes == 2 * PAGE


# -- discards and their order ------------------------------------------------------------


def test_discard_only(monkeypatch: pytest.MonkeyPatch, buf: cm.ManagedBuffer,
                      stream: cm.Stream) -> None:
    plan = cm.PrefetchPlan().discard(buf, nbytes=MiB).discard(buf, offset=MiB, nbytes=MiB)
    (call,) = plan.dry_run(stream)
    assert call.api == "cuMemDiscardBatchAsync" and call.ranges == ((buf.ptr, 2 * MiB, None),)
    with record_calls(monkeypatch) as calls:
        plan.execute(stream)
    assert issued(calls) == ["cuMemDiscardBatchAsync"]


def test_discard_and_prefetch_of_one_range(buf: cm.ManagedBuffer, stream: cm.Stream) -> None:
    plan = cm.PrefetchPlan().add(buf, D0).discard(buf)
    (call,) = plan.dry_run(stream)
    assert call.api == "cuMemDiscardAndPrefetchBatchAsync"
    assert call.ranges == ((buf.ptr, buf.nbytes, D0),)
    explicit = cm.PrefetchPlan().discard_and_prefetch(buf, D0)
    assert explicit.dry_run(stream) == plan.dry_run(stream)
    plan.execute(stream)
    stream.synchronize()
    assert buf.range_info().last_prefetch_location == D0


def test_partial_overlap_is_split_in_the_documented_order(buf: cm.ManagedBuffer,
                                                          stream: cm.Stream) -> None:
    p = buf.ptr
    a = cm.PrefetchPlan().discard(buf, nbytes=4 * PAGE).add(buf, D0, offset=2 * PAGE,
                                                            nbytes=4 * PAGE)
    b = cm.PrefetchPlan().add(buf, D0, offset=2 * PAGE, nbytes=4 * PAGE).discard(buf,
                                                                                 nbytes=4 * PAGE)
    calls = a.dry_run(stream)
    assert calls == b.dry_run(stream)  # insertion order does not matter
    assert [c.api for c in calls] == ["cuMemDiscardBatchAsync",
                                      "cuMemDiscardAndPrefetchBatchAsync",
                                      "cuMemPrefetchAsync"]
    assert calls[0].ranges == ((p, 2 * PAGE, None),)
    assert calls[1].ranges == ((p + 2 * PAGE, 2 * PAGE, D0),)
    assert calls[2].ranges == ((p + 4 * PAGE, 2 * PAGE, D0),)
    a.execute(stream)
    stream.synchronize()
    assert buf.range_info(2 * PAGE, 4 * PAGE).last_prefetch_location == D0


# -- streams -------------------------------------------------------------------------------


@pytest.mark.parametrize("legacy", [None, 0, 1])
def test_batch_on_the_legacy_stream(monkeypatch: pytest.MonkeyPatch, buf: cm.ManagedBuffer,
                                    legacy: Any) -> None:
    plan = strided(buf, 8, PAGE)
    assert "private stream" in plan.dry_run(legacy)[0].note
    with record_calls(monkeypatch) as calls:
        plan.execute(legacy)
    _driver.call("cuCtxSynchronize")
    names = without_hold([api for api, _ in calls])
    batch = [args for api, args in calls if api == "cuMemPrefetchBatchAsync"]
    if batch:
        private = int(batch[0][-1])
        assert private not in (0, 1)
        created = [i for i, n in enumerate(names) if n == "cuStreamCreate"]
        assert created and created[0] < names.index("cuMemPrefetchBatchAsync")
        waits = [int(args[0]) for api, args in calls if api == "cuStreamWaitEvent"]
        assert waits == [private, 0 if legacy is None else legacy]
        assert names[-2:] == ["cuStreamDestroy", "cuEventDestroy"]
    assert buf.range_info(0, PAGE).last_prefetch_location == D0


def test_batch_on_a_stream_needs_no_private_stream(monkeypatch: pytest.MonkeyPatch,
                                                   buf: cm.ManagedBuffer,
                                                   stream: cm.Stream) -> None:
    plan = strided(buf, 8, PAGE)
    assert plan.dry_run(stream)[0].note == ""
    with record_calls(monkeypatch) as calls:
        plan.execute(stream)
    names = without_hold([api for api, _ in calls])
    assert "cuStreamCreate" not in names and "cuEventCreate" not in names


def test_stream_like_objects(buf: cm.ManagedBuffer, stream: cm.Stream) -> None:
    class Foreign:
        def __cuda_stream__(self) -> tuple[int, int]:
            return (0, stream.handle)

    strided(buf, 4, PAGE).execute(Foreign())
    strided(buf, 4, PAGE).execute(stream.handle)
    stream.synchronize()
    with pytest.raises(TypeError):
        strided(buf, 4, PAGE).execute("stream")


# -- single calls and the fallback ----------------------------------------------------------


def test_batch_false_forces_single_calls(monkeypatch: pytest.MonkeyPatch,
                                         buf: cm.ManagedBuffer, stream: cm.Stream) -> None:
    plan = strided(buf, 5, PAGE).discard(buf, offset=7 * MiB)
    calls_planned = plan.dry_run(stream, batch=False)
    assert [c.api for c in calls_planned] == ["cuMemDiscardBatchAsync"] + \
        ["cuMemPrefetchAsync"] * 5
    assert "skipped" in calls_planned[0].note
    with record_calls(monkeypatch) as calls:
        plan.execute(stream, batch=False)
    assert issued(calls) == ["cuMemPrefetchAsync"] * 5


@pytest.mark.sim_only
def test_fallback_without_batch_calls(monkeypatch: pytest.MonkeyPatch, buf: cm.ManagedBuffer,
                                      stream: cm.Stream, no_batch: None) -> None:
    plan = strided(buf, 6, PAGE).discard(buf, offset=7 * MiB).discard_and_prefetch(
        buf, HOST, offset=6 * MiB, nbytes=MiB)
    with record_calls(monkeypatch) as calls:
        plan.execute(stream)
    got = issued(calls)
    assert got[0] == "cuMemDiscardBatchAsync"  # tried once, then never again
    assert got[1:] == ["cuMemPrefetchAsync"] * 7
    for i in range(6):
        assert buf.range_info(2 * i * PAGE, PAGE).last_prefetch_location == D0
    assert buf.range_info(6 * MiB, MiB).last_prefetch_location == HOST


@pytest.mark.sim_only
def test_fallback_on_the_legacy_stream_leaves_nothing(buf: cm.ManagedBuffer,
                                                      no_batch: None) -> None:
    strided(buf, 6, PAGE).discard(buf, offset=7 * MiB).execute()
    assert buf.range_info(0, PAGE).last_prefetch_location == D0


@pytest.mark.sim_only
def test_batch_true_raises_without_batch_calls(buf: cm.ManagedBuffer, stream: cm.Stream,
                                               no_batch: None) -> None:
    with pytest.raises(cm.CudaDriverNotFoundError):
        strided(buf, 3, PAGE).execute(stream, batch=True)


@pytest.mark.sim_only
def test_two_devices_in_one_batch(monkeypatch: pytest.MonkeyPatch, buf: cm.ManagedBuffer,
                                  stream: cm.Stream, two_devices: None) -> None:
    d1 = cm.Location.device(1)
    plan = (cm.PrefetchPlan().add(buf, d1, nbytes=PAGE).add(buf, D0, offset=PAGE, nbytes=PAGE)
            .add(buf, d1, offset=3 * PAGE, nbytes=PAGE))
    (call,) = plan.dry_run(stream)
    assert [loc for _p, _n, loc in call.ranges] == [d1, d1, D0]  # first-seen destination first
    plan.execute(stream)
    assert buf.range_info(3 * PAGE, PAGE).last_prefetch_location == d1


# -- reprs ------------------------------------------------------------------------------------


def test_repr_and_planned_call_text(buf: cm.ManagedBuffer, stream: cm.Stream) -> None:
    plan = strided(buf, 3, PAGE)
    text = repr(plan)
    assert text.startswith("<PrefetchPlan 3 entries → cuMemPrefetchBatchAsync(3 ranges")
    (call,) = plan.dry_run(stream)
    assert str(call).startswith("cuMemPrefetchBatchAsync(3 ranges, 12288 bytes; device 0: 3;")
    assert call.nbytes == 3 * PAGE


# -- property: the plan covers exactly the union of its entries ---------------------------------

entry = st.tuples(st.sampled_from(["prefetch", "discard", "dp"]),
                  st.integers(0, 63), st.integers(1, 16), st.sampled_from([0, 1]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.lists(entry, min_size=1, max_size=12))
def test_plan_model(entries: list[tuple[str, int, int, int]]) -> None:
    dests = (D0, HOST)
    npages = 80
    want: dict[int, cm.Location] = {}
    discarded: set[int] = set()
    conflict = False
    with cm.ManagedBuffer.empty(npages * PAGE) as b, cm.Stream() as s:
        plan = cm.PrefetchPlan(exact=True)
        for op, start, length, d in entries:
            pages = range(start, min(start + length, npages))
            kw = {"offset": start * PAGE, "nbytes": len(pages) * PAGE}
            if op == "discard":
                plan.discard(b, **kw)
                discarded.update(pages)
                continue
            if op == "dp":
                plan.discard_and_prefetch(b, dests[d], **kw)
                discarded.update(pages)
            else:
                plan.add(b, dests[d], **kw)
            for pg in pages:
                if want.setdefault(pg, dests[d]) != dests[d]:
                    conflict = True
        if conflict:
            with pytest.raises(ValueError, match="overlapping"):
                plan.validate()
            return
        calls = plan.dry_run(s)
        covered: dict[int, cm.Location | None] = {}
        for c in calls:
            for p, n, loc in c.ranges:
                assert p % PAGE == 0 and n % PAGE == 0 and n > 0
                for pg in range((p - b.ptr) // PAGE, (p - b.ptr + n) // PAGE):
                    assert pg not in covered  # ranges never repeat
                    covered[pg] = loc
                    if c.api == "cuMemDiscardBatchAsync":
                        assert pg in discarded and pg not in want
                    elif c.api == "cuMemDiscardAndPrefetchBatchAsync":
                        assert pg in discarded
                    else:
                        assert pg not in discarded
        assert {pg: loc for pg, loc in covered.items() if loc is not None} == want
        assert set(covered) == set(want) | discarded
        plan.execute(s)
        s.synchronize()
        for pg, loc in want.items():
            assert b.range_info(pg * PAGE, PAGE).last_prefetch_location == loc


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.lists(entry, min_size=1, max_size=12))
def test_plan_model_with_gaps_closed(entries: list[tuple[str, int, int, int]]) -> None:
    """A default plan covers what an exact one does, plus whole gaps between two ranges
    of one destination (at most MERGE_GAP, with no other entry in them), prefetched there."""
    dests = (D0, HOST)
    npages = 80
    with cm.ManagedBuffer.empty(npages * PAGE) as b, cm.Stream() as s:
        exact, merged = cm.PrefetchPlan(exact=True), cm.PrefetchPlan()
        for plan in (exact, merged):
            for op, start, length, d in entries:
                kw = {"offset": start * PAGE,
                      "nbytes": (min(start + length, npages) - start) * PAGE}
                if op == "discard":
                    plan.discard(b, **kw)
                elif op == "dp":
                    plan.discard_and_prefetch(b, dests[d], **kw)
                else:
                    plan.add(b, dests[d], **kw)
        try:
            want_calls = exact.dry_run(s)
        except ValueError:
            with pytest.raises(ValueError, match="overlapping"):
                merged.validate()
            return

        def pages(calls: list[cm.PlannedCall]) -> dict[int, tuple[str, object]]:
            out = {}
            for c in calls:
                for p, n, loc in c.ranges:
                    for pg in range((p - b.ptr) // PAGE, (p - b.ptr + n) // PAGE):
                        assert pg not in out  # ranges never repeat
                        out[pg] = (c.api.replace("Batch", ""), loc)  # one call or a batch
            return out

        want, got = pages(want_calls), pages(merged.dry_run(s))
        for pg, kind in want.items():
            assert got[pg] == kind
        for pg in sorted(set(got) - set(want)):  # in a gap between pages sent to one place
            loc = got[pg][1]
            lo = max(q for q in want if q < pg)
            hi = min(q for q in want if q > pg)
            assert want[lo][1] == loc == want[hi][1] and loc is not None
            assert (hi - lo - 1) * PAGE <= cm.PrefetchPlan.MERGE_GAP
        plan = merged
        plan.execute(s)
        s.synchronize()


def test_gaps_close_up_to_the_merge_gap_and_not_past_it(stream: cm.Stream) -> None:
    gap = cm.PrefetchPlan.MERGE_GAP
    with cm.ManagedBuffer.empty(4 * gap) as b:
        near = cm.PrefetchPlan().add(b, D0, nbytes=PAGE).add(b, D0, offset=PAGE + gap,
                                                              nbytes=PAGE)
        assert [len(c.ranges) for c in near.dry_run(stream)] == [1]
        assert near.dry_run(stream)[0].nbytes == gap + 2 * PAGE
        far = cm.PrefetchPlan().add(b, D0, nbytes=PAGE).add(b, D0, offset=2 * PAGE + gap,
                                                             nbytes=PAGE)
        assert [len(c.ranges) for c in far.dry_run(stream)] == [2]
        exact = cm.PrefetchPlan(exact=True).add(b, D0, nbytes=PAGE).add(
            b, D0, offset=2 * PAGE, nbytes=PAGE)
        assert [len(c.ranges) for c in exact.dry_run(stream)] == [2]
        host_between = (cm.PrefetchPlan().add(b, D0, nbytes=PAGE)
                        .add(b, HOST, offset=2 * PAGE, nbytes=PAGE)
                        .add(b, D0, offset=4 * PAGE, nbytes=PAGE))
        d0 = [r for c in host_between.dry_run(stream) for r in c.ranges if r[2] == D0]
        assert len(d0) == 2  # the host's range between them keeps them apart
        discard_between = (cm.PrefetchPlan().add(b, D0, nbytes=PAGE)
                           .discard(b, offset=2 * PAGE, nbytes=PAGE)
                           .add(b, D0, offset=4 * PAGE, nbytes=PAGE))
        apis = [c.api for c in discard_between.dry_run(stream)]
        assert apis == ["cuMemDiscardBatchAsync", "cuMemPrefetchBatchAsync"]
    with cm.ManagedBuffer.empty(PAGE) as one, cm.ManagedBuffer.empty(PAGE) as two:
        pair = cm.PrefetchPlan().add(one, D0).add(two, D0)
        assert sum(len(c.ranges) for c in pair.dry_run(stream)) == 2  # never across buffers
