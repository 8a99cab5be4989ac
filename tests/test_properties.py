"""Hypothesis properties: prefetch-plan coalescing, VMM offset arithmetic, copy size checks.

* A :class:`PrefetchPlan` executed on a stream issues calls (seen at the driver
  gateway, byte for byte) that cover exactly the union of its entries per
  destination, each byte once, coalesced maximally, one batch call per step;
  discards split into discard-only and discard-and-prefetch; a conflict issues
  nothing. The fallback without batch calls covers the same union.
* VMM: a mapping lands at ``range.ptr + offset`` with its physical size;
  misaligned or out-of-range offsets are refused before ``cuMemMap``;
  overlaps are refused by the driver with nothing left behind; a
  :class:`GrowableBuffer` keeps its pointer, rounds its capacity up to whole
  chunks and keeps the contents of what it keeps.
* ``copy``: the size/dtype rules decide exactly when a copy is refused; a
  refused copy writes nothing; an accepted one copies exactly ``nbytes``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import cuda_memkit as cm
from cuda_memkit._core import _driver

from ._helpers import ISSUING, record_calls

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])
D0, HOST = cm.Location.device(0), cm.Location.host()


@pytest.fixture(scope="module")
def stream() -> Iterator[cm.Stream]:
    s = cm.Stream()
    yield s
    s.synchronize()
    s.close()


# -- prefetch plans ------------------------------------------------------------------------

Span = tuple[int, int, Any]  # ptr, nbytes, destination key or None


def _loc_key(loc: Any) -> tuple[int, int]:
    return (int(loc.type), int(loc.id))


def decode(calls: list[tuple[str, tuple[Any, ...]]]) -> dict[str, list[Span]]:
    """The ranges each hint call kind received, with their destinations."""
    out: dict[str, list[Span]] = {}
    for api, args in calls:
        if api not in ISSUING:
            continue
        spans = out.setdefault(api, [])
        if api == "cuMemPrefetchAsync":
            ptr, n, loc = args[0], args[1], args[2]
            spans.append((int(ptr), int(n), _loc_key(loc)))
            continue
        dptrs, sizes, count = args[0], args[1], args[2]
        assert count == len(dptrs) == len(sizes)
        if api == "cuMemDiscardBatchAsync":
            spans.extend((int(p), int(n), None) for p, n in zip(dptrs, sizes, strict=True))
            continue
        locs, idxs, nlocs = args[3], args[4], args[5]
        assert nlocs == len(locs) == len(idxs) and idxs[0] == 0 and idxs == sorted(idxs)
        for i, (p, n) in enumerate(zip(dptrs, sizes, strict=True)):
            j = max(k for k, start in enumerate(idxs) if start <= i)
            spans.append((int(p), int(n), _loc_key(locs[j])))
    return out


def _bytes(spans: list[Span]) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for p, n, loc in spans:
        for b in range(p, p + n):
            assert b not in out, f"byte 0x{b:x} issued twice"
            out[b] = loc
    return out


def _assert_maximal(spans: list[Span], allocs: list[tuple[int, int]]) -> None:
    """Ranges of one destination never touch inside one allocation: they were coalesced."""
    def alloc_of(p: int) -> int:
        return next(i for i, (s, n) in enumerate(allocs) if s <= p < s + n)

    by = sorted(spans, key=lambda s: (str(s[2]), s[0]))
    for a, b in itertools.pairwise(by):
        if a[2] == b[2] and alloc_of(a[0]) == alloc_of(b[0]):
            assert a[0] + a[1] < b[0], f"ranges {a} and {b} should have been coalesced"


entry = st.tuples(st.integers(0, 2), st.integers(0, 1 << 14), st.integers(1, 1 << 14),
                  st.sampled_from(["prefetch", "discard", "dp"]), st.integers(0, 2),
                  st.booleans())


@pytest.mark.uses_managed_memory
@SETTINGS
@given(sizes=st.lists(st.integers(1, 3 * 4096), min_size=1, max_size=3),
       entries=st.lists(entry, min_size=1, max_size=14), batch=st.sampled_from([None, False]))
def test_issued_prefetches_cover_exactly_the_union_per_destination(
        sizes: list[int], entries: list[tuple[int, int, int, str, int, bool]],
        batch: bool | None, stream: cm.Stream, monkeypatch: pytest.MonkeyPatch) -> None:
    dests = [D0, HOST] + ([cm.Location.device(1)] if cm.device_count() > 1 else [D0])
    bufs = [cm.ManagedBuffer.empty(n) for n in sizes]
    try:
        plan = cm.PrefetchPlan(exact=True)  # ranges as added: the union, no gaps closed
        want: dict[int, Any] = {}
        discarded: set[int] = set()
        conflict = False
        for bi, off, n, op, d, raw in entries:
            buf = bufs[bi % len(bufs)]
            size = buf.nbytes
            off %= size
            n = 1 + (n - 1) % (size - off)
            target: Any = buf.ptr + off if raw else buf
            kw = {"nbytes": n} if raw else {"offset": off, "nbytes": n}
            loc = dests[d]
            if op == "discard":
                plan.discard(target, **kw)
            elif op == "dp":
                plan.discard_and_prefetch(target, loc, **kw)
            else:
                plan.add(target, loc, **kw)
            span = range(buf.ptr + off, buf.ptr + off + n)
            if op != "prefetch":
                discarded.update(span)
            if op != "discard":
                for b in span:
                    if want.setdefault(b, _loc_key(loc)) != _loc_key(loc):
                        conflict = True
        with record_calls(monkeypatch) as calls:
            if conflict:
                with pytest.raises(ValueError, match="overlapping"):
                    plan.execute(stream, batch=batch)
            else:
                plan.execute(stream, batch=batch)
        stream.synchronize()
        got = decode(calls)
        event("conflict" if conflict else f"calls: {sorted(got)}")
        if conflict:
            assert got == {}, "a refused plan issued calls"
            return
        for api in ("cuMemPrefetchBatchAsync", "cuMemDiscardBatchAsync",
                    "cuMemDiscardAndPrefetchBatchAsync"):
            assert sum(1 for a, _ in calls if a == api) <= 1, f"more than one {api}"
        allocs = [(b.ptr, b.nbytes) for b in bufs]
        if batch is False:  # single prefetches only, discards skipped
            # (a discarded-and-prefetched range and a prefetched one next to it stay two
            # calls here: the plan keeps its steps apart, only the batch calls need that)
            assert set(got) <= {"cuMemPrefetchAsync"}
            assert _bytes(got.get("cuMemPrefetchAsync", [])) == want
            return
        prefetched = got.get("cuMemPrefetchBatchAsync", []) + got.get("cuMemPrefetchAsync", [])
        dp = got.get("cuMemDiscardAndPrefetchBatchAsync", [])
        only = got.get("cuMemDiscardBatchAsync", [])
        if got.get("cuMemPrefetchAsync"):
            assert len(got["cuMemPrefetchAsync"]) == 1 and not got.get("cuMemPrefetchBatchAsync")
        assert _bytes(prefetched + dp) == want  # per destination, each byte once
        assert set(_bytes(dp)) == discarded & set(want)
        assert set(_bytes(only)) == discarded - set(want)
        assert not set(_bytes(prefetched)) & discarded
        for spans in (prefetched, dp, only):
            _assert_maximal(spans, allocs)
    finally:
        for b in bufs:
            b.close()


# -- VMM offset arithmetic ------------------------------------------------------------------


@SETTINGS
@given(k=st.integers(1, 6),
       ops=st.lists(st.tuples(st.integers(0, 7), st.integers(1, 3),
                              st.sampled_from([False, False, False, True])), max_size=6))
def test_mappings_land_where_the_offset_says(k: int, ops: list[tuple[int, int, bool]],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    g = cm.granularity(0)
    vr = cm.AddressRange.reserve(k * g)
    physical: list[cm.PhysicalMemory] = []
    model: dict[int, int] = {}  # chunk index -> mapping start chunk
    mappings: list[tuple[cm.Mapping, int, int]] = []
    try:
        for start, size, misaligned in ops:
            start %= k + 1  # mostly inside the range, sometimes just past it
            pm = cm.PhysicalMemory.create(size * g)
            physical.append(pm)
            offset = start * g + (g // 2 if misaligned else 0)
            with record_calls(monkeypatch) as calls:
                if misaligned:
                    event("misaligned offset")
                    with pytest.raises(ValueError, match="offset"):
                        vr.map(pm, offset=offset)
                elif start + size > k:
                    event("does not fit")
                    with pytest.raises(ValueError, match="does not fit"):
                        vr.map(pm, offset=offset)
                elif any(c in model for c in range(start, start + size)):
                    event("overlap")
                    with pytest.raises(cm.CudaError):
                        vr.map(pm, offset=offset)
                    assert pm.mappings == []
                else:
                    m = vr.map(pm, offset=offset)
                    assert (m.ptr, m.nbytes, m.offset) == (vr.ptr + offset, size * g, offset)
                    for c in range(start, start + size):
                        model[c] = start
                    mappings.append((m, start, size))
                    continue
            assert "cuMemMap" not in [a for a, _ in calls] or not misaligned
        assert [mp.ptr for mp in vr.mappings] == sorted(vr.ptr + s * g for _, s, _ in mappings)
        for i, (m, _start, _size) in enumerate(mappings):
            m.set_access(0, cm.Access.READWRITE)
            cm.copy(m, np.full(m.nbytes, i + 1, np.uint8))
        for i, (_m, start, size) in enumerate(mappings):
            out = np.zeros(size * g, np.uint8)
            _driver.call("cuMemcpy", int(out.ctypes.data), vr.ptr + start * g, size * g)
            assert (out == i + 1).all()
        vr.close()
        assert all(m.closed for m, _, _ in mappings)
    finally:
        vr.close()
        for pm in physical:
            pm.close()


@SETTINGS
@given(sizes=st.lists(st.integers(0, 6), min_size=1, max_size=6), half=st.booleans())
def test_growable_buffer_arithmetic(sizes: list[int], half: bool) -> None:
    g = cm.granularity(0)
    with cm.GrowableBuffer(6 * g, chunk=g) as buf:
        ptr = buf.ptr
        mark = 0
        for chunks in sizes:
            n = max(chunks * g - (g // 2 if half and chunks else 0), 0)
            keep = min(n, buf.nbytes)
            if keep:
                before = np.zeros(keep, np.uint8)
                cm.copy(before, buf.ptr, nbytes=keep)
            buf.resize(n)
            assert buf.ptr == ptr and buf.nbytes == n
            assert buf.capacity == -(-n // g) * g
            if keep:
                after = np.zeros(keep, np.uint8)
                cm.copy(after, buf.ptr, nbytes=keep)
                assert (after == before).all(), "resize lost contents it kept"
            if n:
                mark = (mark % 250) + 1
                cm.copy(buf, np.full(n, mark, np.uint8), nbytes=n)


# -- copy size checks ------------------------------------------------------------------------

KINDS = ["numpy", "HostBuffer", "DeviceBuffer", "ManagedBuffer", "int"]
DTYPES = [np.uint8, np.float32, np.int64]


class Operand:
    """A copy operand, its memory, its known size and dtype (None where copy cannot know)."""

    def __init__(self, kind: str, dtype: Any, count: int) -> None:
        self.kind = kind
        dt = np.dtype(dtype)
        n = count * dt.itemsize
        self.owned: list[Any] = []
        if kind == "numpy":
            self.obj = np.zeros(count, dt)
            self.ptr, self.size, self.dtype = int(self.obj.ctypes.data), n, dt
        elif kind == "HostBuffer":
            self.obj = cm.HostBuffer.zeros(count, dt)
            self.ptr, self.size, self.dtype = self.obj.ptr, n, dt
        elif kind == "ManagedBuffer":
            self.obj = cm.ManagedBuffer.zeros(count, dt)
            self.ptr, self.size, self.dtype = self.obj.ptr, n, dt
        elif kind == "DeviceBuffer":
            self.obj = cm.DeviceBuffer.empty(n)
            self.ptr, self.size, self.dtype = self.obj.ptr, n, None
        else:  # a raw pointer to 1 KiB of device memory: copy trusts its size
            hidden = cm.DeviceBuffer.empty(1024)
            self.owned.append(hidden)
            self.obj = hidden.ptr
            self.ptr, self.size, self.dtype = hidden.ptr, None, None
        if isinstance(self.obj, cm.DeviceBuffer | cm.HostBuffer | cm.ManagedBuffer):
            self.owned.append(self.obj)
        self.fill(0xAB)

    @property
    def extent(self) -> int:
        return 1024 if self.size is None else self.size

    def fill(self, value: int) -> None:
        if self.extent:
            _driver.call("cuMemsetD8", self.ptr, value, self.extent) if self.kind in (
                "DeviceBuffer", "int", "ManagedBuffer") else _fill_host(self.ptr, value,
                                                                      self.extent)
            _driver.call("cuCtxSynchronize")

    def read(self) -> np.ndarray:
        out = np.zeros(self.extent, np.uint8)
        if self.extent:
            _driver.call("cuMemcpy", int(out.ctypes.data), self.ptr, self.extent)
        return out

    def close(self) -> None:
        for o in self.owned:
            o.close()


def _fill_host(ptr: int, value: int, n: int) -> None:
    import ctypes

    ctypes.memset(ptr, value, n)


def expected_size(d: Operand, s: Operand, nbytes: int | None) -> int | str:
    """The bytes copy() must copy, or the regex of the ValueError it must raise."""
    if nbytes is None:
        if d.size is None and s.size is None:
            return "nbytes"
        if d.size is not None and s.size is not None:
            if d.size != s.size:
                return "size mismatch"
            if d.dtype is not None and s.dtype is not None and d.dtype != s.dtype:
                return "dtype mismatch"
            return d.size
        return d.size if d.size is not None else s.size  # type: ignore[return-value]
    if nbytes < 0:
        return "nbytes"
    if d.size is not None and nbytes > d.size:
        return "larger than the destination"
    if s.size is not None and nbytes > s.size:
        return "larger than the source"
    return nbytes


operand = st.tuples(st.sampled_from(KINDS), st.sampled_from(DTYPES),
                    st.sampled_from([0, 1, 2, 3, 4, 8, 16, 64]))


@pytest.mark.uses_managed_memory
@SETTINGS
@given(dst=operand, src=operand,
       nbytes=st.none() | st.integers(-2, 520), stream=st.booleans())
def test_copy_size_rules(dst: tuple[str, Any, int], src: tuple[str, Any, int],
                         nbytes: int | None, stream: bool, monkeypatch: pytest.MonkeyPatch
                         ) -> None:
    d, s = Operand(*dst), Operand(*src)
    try:
        s.fill(0x5C)
        if s.kind == "numpy":
            s.obj[...] = np.frombuffer(bytes([0x5C]) * s.extent, s.obj.dtype)
        want = expected_size(d, s, nbytes)
        before = d.read()
        kw: dict[str, Any] = {"nbytes": nbytes}
        if stream:
            kw["stream"] = cu.CUstream(0)
            kw["allow_pageable"] = True
        with record_calls(monkeypatch) as calls:
            event(f"refused: {want}" if isinstance(want, str) else "copied")
            if isinstance(want, str):
                with pytest.raises(ValueError) as info:
                    cm.copy(d.obj, s.obj, **kw)
                assert re.search(want, str(info.value)), (want, str(info.value))
                assert not isinstance(info.value, cm.CudaError)
            else:
                assert cm.copy(d.obj, s.obj, **kw) is d.obj
        _driver.call("cuCtxSynchronize")
        after = d.read()
        if isinstance(want, str):
            assert (after == before).all(), "a refused copy wrote to the destination"
            assert not [a for a, _ in calls if a.startswith("cuMemcpy")]
            return
        assert (after[:want] == 0x5C).all(), "copy() did not copy nbytes"
        assert (after[want:] == before[want:]).all(), "copy() wrote past nbytes"
    finally:
        d.close()
        s.close()
