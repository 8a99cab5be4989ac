"""PrefetchPlan.add_ranges: entries from arrays, the same plan as adding them one by one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cuda_memkit as cm
from cuda_memkit._managed_memory import _plan_ranges

from ._helpers import no_driver_calls, record_calls
from ._nothing import nothing_allocated

pytestmark = pytest.mark.uses_managed_memory

KiB, MiB = 1 << 10, 1 << 20
PAGE = 4096
D0 = cm.Location.device(0)
HOST = cm.Location.host()


@pytest.fixture
def buf() -> Iterator[cm.ManagedBuffer]:
    b = cm.ManagedBuffer.empty(8 * MiB)
    yield b
    b.close()


def one_by_one(buf: Any, to: Any, offsets: Any, sizes: Any) -> cm.PrefetchPlan:
    plan = cm.PrefetchPlan()
    sizes = np.broadcast_to(sizes, np.shape(offsets))
    for off, n in zip(np.asarray(offsets).tolist(), np.asarray(sizes).tolist(), strict=True):
        plan.add(buf, to, offset=off, nbytes=n)
    return plan


def same_plans(a: cm.PrefetchPlan, b: cm.PrefetchPlan, stream: Any) -> None:
    assert len(a) == len(b) and bool(a) == bool(b)
    assert a.entries == b.entries
    assert [e.target for e in a] == [e.target for e in b]
    assert a.dry_run(stream) == b.dry_run(stream)
    assert a.dry_run(stream, batch=False) == b.dry_run(stream, batch=False)
    assert repr(a) == repr(b)


# -- the same plan as one by one ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["contiguous", "strided", "shuffled", "overlapping"])
def test_same_as_adding_one_by_one(buf: cm.ManagedBuffer, stream: cm.Stream, kind: str,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    n, chunk = 512, 4 * KiB
    offsets = {"contiguous": np.arange(n) * chunk,
               "strided": np.arange(n) * 2 * chunk,
               "shuffled": np.random.default_rng(3).permutation(n) * chunk,
               "overlapping": np.arange(n) * (chunk // 2)}[kind]
    a = cm.PrefetchPlan().add_ranges(buf, D0, offsets, chunk)
    b = one_by_one(buf, D0, offsets, chunk)
    same_plans(a, b, stream)
    calls_a = a.dry_run(stream)
    # every kind is one range: the strided plan's 4 KiB gaps are closed
    assert [c.api for c in calls_a] == ["cuMemPrefetchAsync"]
    with record_calls(monkeypatch) as got_a:
        a.execute(stream)
    with record_calls(monkeypatch) as got_b:
        b.execute(stream)
    assert [api for api, _ in got_a] == [api for api, _ in got_b]
    stream.synchronize()
    assert buf.range_info(int(offsets[0]), chunk).last_prefetch_location == D0


def _build(spec: list[tuple[str, int, list[int], list[int], int]], bufs: list[Any],
           bulk: bool) -> cm.PrefetchPlan:
    plan = cm.PrefetchPlan()
    dests = (D0, HOST)
    for kind, b, offs, sizes, d in spec:
        target = bufs[b]
        if kind == "discard":
            plan.discard(target, offset=offs[0] * PAGE, nbytes=sizes[0] * PAGE)
        elif bulk and kind == "ranges":
            plan.add_ranges(target, dests[d], np.array(offs) * PAGE, np.array(sizes) * PAGE)
        else:
            for o, z in zip(offs, sizes, strict=True):
                plan.add(target, dests[d], offset=o * PAGE, nbytes=z * PAGE)
    return plan


def _group(draw: Any) -> tuple[str, int, list[int], list[int], int]:
    kind = draw(st.sampled_from(["ranges", "ranges", "add", "discard"]))
    k = draw(st.integers(1, 8))
    offs = draw(st.lists(st.integers(0, 40), min_size=k, max_size=k))
    sizes = [draw(st.integers(1, 64 - o)) for o in offs]
    return kind, draw(st.integers(0, 1)), offs, sizes, draw(st.integers(0, 1))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.composite(_group)(), min_size=1, max_size=6))
def test_property_identical_to_one_by_one(spec: list[Any]) -> None:
    with cm.ManagedBuffer.empty(64 * PAGE) as b0, cm.ManagedBuffer.empty(64 * PAGE) as b1, \
            cm.Stream() as s:
        bulk, single = _build(spec, [b0, b1], True), _build(spec, [b0, b1], False)
        try:
            single.validate()
        except ValueError as exc:  # one range sent to two destinations
            with pytest.raises(ValueError) as info:
                bulk.validate()
            assert str(info.value) == str(exc)
            return
        same_plans(bulk, single, s)
        bulk.execute(s)
        s.synchronize()


def test_buffer_like_targets_go_through_the_pointer_checks(buf: cm.ManagedBuffer,
                                                           stream: cm.Stream) -> None:
    view = type("View", (), {"ptr": buf.ptr + MiB, "nbytes": MiB})()
    offsets, sizes = np.array([0, 8192, 4096]), np.array([4096, 4096, 4096])
    a = cm.PrefetchPlan().add_ranges(view, HOST, offsets, sizes)
    same_plans(a, one_by_one(view, HOST, offsets, sizes), stream)
    assert a.dry_run(stream)[0].ranges == ((buf.ptr + MiB, 3 * 4096, HOST),)


def test_mixed_with_add_and_discard(buf: cm.ManagedBuffer, stream: cm.Stream) -> None:
    a = cm.PrefetchPlan().add(buf, HOST, offset=0, nbytes=PAGE)
    a.add_ranges(buf, D0, [PAGE, 3 * PAGE], PAGE).discard(buf, offset=3 * PAGE, nbytes=PAGE)
    b = cm.PrefetchPlan().add(buf, HOST, offset=0, nbytes=PAGE)
    b.add(buf, D0, offset=PAGE, nbytes=PAGE).add(buf, D0, offset=3 * PAGE, nbytes=PAGE)
    b.discard(buf, offset=3 * PAGE, nbytes=PAGE)
    same_plans(a, b, stream)
    assert [c.api for c in a.dry_run(stream)] == ["cuMemDiscardAndPrefetchBatchAsync",
                                                  "cuMemPrefetchBatchAsync"]


@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.int32, np.uint32, np.int64,
                                   np.uint64])
def test_integer_dtypes_lists_and_a_scalar_size(buf: cm.ManagedBuffer, dtype: Any) -> None:
    plan = cm.PrefetchPlan()
    plan.add_ranges(buf, 0, np.array([0, 100], dtype), np.array([10, 20], dtype))
    plan.add_ranges(buf, D0, [200, 300], 7)
    plan.add_ranges(buf, D0, (400,), [np.int64(5)])
    assert [(e.offset, e.nbytes) for e in plan] == [(0, 10), (100, 20), (200, 7), (300, 7),
                                                    (400, 5)]
    assert all(type(e.offset) is int and type(e.nbytes) is int for e in plan)
    assert len(plan) == 5


def test_empty_arrays_add_nothing(buf: cm.ManagedBuffer, monkeypatch: pytest.MonkeyPatch
                                  ) -> None:
    plan = cm.PrefetchPlan()
    with no_driver_calls(monkeypatch):
        assert plan.add_ranges(buf, D0, [], []) is plan
        plan.add_ranges(buf, D0, np.zeros(0, np.int64), 4096)
        plan.execute()
    assert len(plan) == 0 and not plan and plan.entries == ()


def test_arrays_are_copied(buf: cm.ManagedBuffer) -> None:
    offsets, sizes = np.array([0, PAGE]), np.array([PAGE, PAGE])
    plan = cm.PrefetchPlan().add_ranges(buf, D0, offsets, sizes)
    offsets[:] = 7 * MiB
    sizes[:] = 10 * MiB
    assert [(e.offset, e.nbytes) for e in plan] == [(0, PAGE), (PAGE, PAGE)]


def test_stored_without_an_object_per_entry(buf: cm.ManagedBuffer,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    plan = cm.PrefetchPlan().add_ranges(buf, D0, np.arange(4096) * 2 * KiB, 2 * KiB)
    assert len(plan) == 4096
    assert len(plan._entries) == 1 and type(plan._entries[0]) is _plan_ranges.Ranges
    made: list[Any] = []
    real = cm.PlanEntry.__init__

    def counting(self: Any, *args: Any, **kw: Any) -> None:
        made.append(1)
        real(self, *args, **kw)

    monkeypatch.setattr(cm.PlanEntry, "__init__", counting)
    with record_calls(monkeypatch) as calls:
        plan.execute()
    assert not made  # validated, coalesced and issued without a PlanEntry per range
    assert [api for api, _ in calls if api.startswith("cuMemPrefetch")] == ["cuMemPrefetchAsync"]
    _ = plan.entries
    assert len(made) == 4096  # made when asked for


# -- bad input: refused at once, nothing added ----------------------------------------------

BAD: list[tuple[str, Any, Any, Any, type[Exception], str]] = [
    ("lengths", D0, [0, PAGE], [PAGE], ValueError, "sizes has 1 entries, offsets 2"),
    ("negative offset", D0, [0, -PAGE], PAGE, ValueError, r"offsets\[1\] is negative"),
    ("zero size", D0, [0, PAGE, 2 * PAGE], [PAGE, PAGE, 0], ValueError, r"sizes\[2\] is 0"),
    ("zero scalar size", D0, [0], 0, ValueError, "sizes must be > 0"),
    ("negative size", D0, [0], [-1], ValueError, r"sizes\[0\] is -1"),
    ("past the end", D0, [0, 8 * MiB - PAGE], [PAGE, 2 * PAGE], ValueError,
     r"range 1 \[8384512, 8392704\) is out of range of the 8388608-byte ManagedBuffer"),
    ("offset past the end", D0, [9 * MiB], 1, ValueError, "range 0"),
    ("huge offset", D0, [2**62], 1, ValueError, "range 0"),
    ("uint64 above int64", D0, np.array([2**63], np.uint64), 1, ValueError,
     r"offsets\[0\] is above 2\*\*63"),
    ("float offsets", D0, [0.0, 4096.0], PAGE, TypeError, "offsets must be an array of integers"),
    ("float sizes", D0, [0], [1.5], TypeError, "sizes must be an array of integers"),
    ("float scalar size", D0, [0], 1.5, TypeError, "sizes must be an array of integers"),
    ("bool offsets", D0, [True], PAGE, TypeError, "offsets must be an array of integers"),
    ("bool size", D0, [0], True, TypeError, "sizes must be integers, not bool"),
    ("offsets past 64 bits", D0, [0, 2**70], 1, ValueError, "offsets holds integers past 64 bits"),
    ("object offsets", D0, [0, "1"], 1, TypeError, "offsets must be an array of integers"),
    ("2-D offsets", D0, [[0]], PAGE, ValueError, "one-dimensional"),
    ("string offsets", D0, "0", PAGE, TypeError, "offsets must be an array of integers"),
    ("no destination", None, [0], PAGE, TypeError, "needs a destination"),
    ("bad destination", "gpu", [0], PAGE, TypeError, "expected a Location"),
]


@pytest.mark.parametrize(("label", "to", "offsets", "sizes", "exc", "match"), BAD,
                         ids=[b[0] for b in BAD])
def test_bad_input_adds_nothing(buf: cm.ManagedBuffer, label: str, to: Any, offsets: Any,
                                sizes: Any, exc: type[Exception], match: str,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    plan = cm.PrefetchPlan().add(buf, D0, nbytes=PAGE)
    with nothing_allocated(monkeypatch), pytest.raises(exc, match=match):
        plan.add_ranges(buf, to, offsets, sizes)
    assert len(plan) == 1 and len(plan.entries) == 1


@pytest.mark.parametrize(("target", "match"), [(12345, "int pointer"), (True, "int pointer"),
                                               ("x", "needs a ManagedBuffer")])
def test_targets_that_are_not_buffers(target: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        cm.PrefetchPlan().add_ranges(target, D0, [0], PAGE)


def test_closed_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    b = cm.ManagedBuffer.empty(MiB)
    b.close()
    with no_driver_calls(monkeypatch), pytest.raises(cm.ClosedError):
        cm.PrefetchPlan().add_ranges(b, D0, [0], PAGE)


def test_buffer_closed_after_adding_names_the_first_entry(stream: cm.Stream) -> None:
    keep = cm.ManagedBuffer.empty(MiB)
    b = cm.ManagedBuffer.empty(MiB)
    try:
        a = cm.PrefetchPlan().add(keep, D0, nbytes=PAGE).add_ranges(b, D0, [0, PAGE], PAGE)
        one = cm.PrefetchPlan().add(keep, D0, nbytes=PAGE)
        one.add(b, D0, offset=0, nbytes=PAGE).add(b, D0, offset=PAGE, nbytes=PAGE)
        a.validate()
        b.close()
        for plan in (a, one):
            with pytest.raises(cm.ClosedError, match="plan entry 1 ") as info:
                plan.execute(stream)
        assert "plan entry 1 " in str(info.value)
    finally:
        keep.close()
        b.close()


def test_missing_destination_names_the_first_entry(buf: cm.ManagedBuffer) -> None:
    a = cm.PrefetchPlan().add(buf, D0, nbytes=PAGE).add_ranges(buf, 99, [PAGE, 2 * PAGE], PAGE)
    b = cm.PrefetchPlan().add(buf, D0, nbytes=PAGE)
    b.add(buf, 99, offset=PAGE, nbytes=PAGE).add(buf, 99, offset=2 * PAGE, nbytes=PAGE)
    errors = []
    for plan in (a, b):
        with pytest.raises(ValueError, match="plan entry 1 ") as info:
            plan.validate()
        errors.append(str(info.value))
    assert errors[0] == errors[1]


def test_merge_arrays_matches_merge() -> None:
    rng = np.random.default_rng(11)
    for _ in range(50):
        n = int(rng.integers(1, 60))
        alloc = rng.choice([1 << 20, 2 << 20], n)
        start = alloc + rng.integers(0, 500, n)
        end = start + rng.integers(1, 60, n)
        want = _plan_ranges.merge(list(zip(alloc.tolist(), start.tolist(), end.tolist(),
                                           strict=True)))
        assert _plan_ranges.merge_arrays(alloc, start, end) == want
