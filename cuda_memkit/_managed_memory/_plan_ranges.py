"""The interval arithmetic of prefetch plans, and their array-built entries.

Used by :mod:`cuda_memkit._managed_memory._prefetch_plan`: coalescing ``(allocation, start,
end)`` intervals (in Python for a few entries, with numpy for many), the
intersection and difference of sorted interval lists, and the checked int64
arrays behind :meth:`PrefetchPlan.add_ranges`.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from .._core._checks import INT64_MAX, check_int64_array
from .._core._location import Location

if TYPE_CHECKING:
    import numpy as np

__all__ = ["EntryTuple", "Interval", "Ranges", "close_gaps", "intersect", "merge",
           "merge_all", "merge_arrays", "range_arrays", "subtract"]

#: A plan entry as stored: PlanEntry's fields, in order
#: ``(op, base, offset, nbytes, location, target)``.
EntryTuple = tuple[str, int, int, "int | None", "Location | None", object]

Interval = tuple[int, int]


def merge(intervals: list[tuple[int, int, int]]) -> list[Interval]:
    """Coalesce ``(alloc, start, end)`` intervals that touch or overlap within an allocation."""
    out: list[Interval] = []
    cur_alloc = -1
    for alloc, start, end in sorted(intervals):
        if out and alloc == cur_alloc and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
            cur_alloc = alloc
    return out


def close_gaps(ivs: list[Interval], gap: int, bounds: list[Interval],
               others: list[Interval]) -> list[Interval]:
    """Merge sorted intervals ``ivs`` across gaps of at most ``gap`` bytes.

    A gap is closed only inside one allocation (``bounds``: the sorted
    ``[start, end)`` of the allocations, ManagedBuffers and raw allocations)
    and only where no interval of ``others`` (the plan's other ranges) meets it.
    """
    if len(ivs) < 2:
        return ivs
    starts = [b[0] for b in bounds]
    ostarts = [o[0] for o in others]
    reach = list(accumulate((o[1] for o in others), max))  # furthest end so far

    def alloc_of(ptr: int) -> int:
        k = bisect_right(starts, ptr) - 1
        return k if k >= 0 and ptr < bounds[k][1] else -1 - ptr  # unknown: its own

    out = [ivs[0]]
    cur_alloc = alloc_of(ivs[0][0])
    for lo, hi in ivs[1:]:
        plo, phi = out[-1]
        a = alloc_of(lo)
        if lo - phi <= gap and a == cur_alloc:
            k = bisect_left(ostarts, lo) - 1  # the others starting before lo
            if k < 0 or reach[k] <= phi:  # none of them reaches into the gap
                out[-1] = (plo, max(phi, hi))
                continue
        out.append((lo, hi))
        cur_alloc = a
    return out


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    j = 0
    for start, end in a:
        cur = start
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < end:
            out.append((cur, end))
    return out


class Ranges:
    """The entries of one :meth:`PrefetchPlan.add_ranges` call, as two int64 arrays."""

    __slots__ = ("base", "loc", "offsets", "op", "sizes", "target")

    def __init__(self, op: str, base: int, offsets: np.ndarray[Any, Any],
                 sizes: np.ndarray[Any, Any], loc: Location | None, target: object) -> None:
        self.op, self.base, self.loc, self.target = op, base, loc, target
        self.offsets, self.sizes = offsets, sizes

    def __len__(self) -> int:
        return len(self.offsets)

    def rows(self) -> list[EntryTuple]:
        """The entries as :data:`EntryTuple` tuples."""
        op, base, loc, t = self.op, self.base, self.loc, self.target
        return [(op, base, o, n, loc, t)
                for o, n in zip(self.offsets.tolist(), self.sizes.tolist(), strict=True)]


def range_arrays(offsets: object, sizes: object, total: int, what: str
                  ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Checked int64 ``(offsets, sizes)`` of ranges inside ``[0, total)``, sizes > 0."""
    import numpy as np

    off = check_int64_array(offsets, "offsets", copy=True)
    if isinstance(sizes, bool):
        raise TypeError("sizes must be integers, not bool")
    if isinstance(sizes, (int, np.integer)):
        one = int(sizes)
        if one <= 0:
            raise ValueError(f"sizes must be > 0, got {one}")
        if one > INT64_MAX:
            raise ValueError(f"sizes is above 2**63 - 1: {one}")
        size = np.full(len(off), one, np.int64)
    else:
        size = check_int64_array(sizes, "sizes", copy=True)
        if len(size) != len(off):
            raise ValueError(f"sizes has {len(size)} entries, offsets {len(off)}")
    if not len(off):
        return off, size
    if int(off.min()) < 0:
        i = int(np.flatnonzero(off < 0)[0])
        raise ValueError(f"offsets[{i}] is negative ({int(off[i])})")
    if int(size.min()) <= 0:
        i = int(np.flatnonzero(size <= 0)[0])
        raise ValueError(f"sizes[{i}] is {int(size[i])}: a prefetch range needs at least "
                         "one byte")
    bad = (off > total) | (size > total - np.minimum(off, total))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"range {i} [{int(off[i])}, {int(off[i]) + int(size[i])}) is out of "
                         f"range of the {total}-byte {what}")
    return off, size


def merge_arrays(alloc: np.ndarray[Any, Any], start: np.ndarray[Any, Any],
                  end: np.ndarray[Any, Any]) -> list[Interval]:
    """:func:`merge` of intervals given as three int64 arrays, with numpy."""
    import numpy as np

    # Sorted by (alloc, start): the union does not depend on the order of equal starts.
    same = bool((alloc == alloc[0]).all())
    if not (same and bool((start[1:] >= start[:-1]).all())):
        order = np.argsort(start, kind="stable") if same else np.lexsort((start, alloc))
        alloc, start, end = alloc[order], start[order], end[order]
    cuts = np.flatnonzero(alloc[1:] != alloc[:-1]) + 1
    out: list[Interval] = []
    for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(alloc)], strict=True):
        s, e = start[lo:hi], end[lo:hi]
        reach = np.maximum.accumulate(e)
        first = np.flatnonzero(np.concatenate(([True], s[1:] > reach[:-1])))
        out.extend(zip(s[first].tolist(), np.maximum.reduceat(e, first).tolist(),
                       strict=True))
    return out


def merge_all(scalars: list[tuple[int, int, int]],
               arrays: list[tuple[int, np.ndarray[Any, Any], np.ndarray[Any, Any]]]
               ) -> list[Interval]:
    """:func:`merge` of ``(alloc, start, end)`` tuples plus ``(alloc, starts, ends)`` arrays."""
    if not arrays:
        return merge(scalars)
    import numpy as np

    allocs = [np.full(len(st), a, np.int64) for a, st, _e in arrays]
    starts = [st for _a, st, _e in arrays]
    ends = [e for _a, _s, e in arrays]
    if scalars:
        sc = np.array(scalars, np.int64).reshape(-1, 3)
        allocs.append(sc[:, 0])
        starts.append(sc[:, 1])
        ends.append(sc[:, 2])
    return merge_arrays(np.concatenate(allocs), np.concatenate(starts), np.concatenate(ends))
