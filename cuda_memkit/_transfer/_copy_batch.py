"""Batched copies: many blocks between buffers in a few driver calls.

* :func:`copy_batch` copies blocks given as arrays of byte offsets and sizes
  (or ``(dst_offset, src_offset, size)`` triples) between two buffers of any
  kind; :class:`CopyBatch` gathers several such pairs (e.g. the two
  directions of a KV-cache swap) into one batch.
* Everything is checked with numpy before anything is issued (integer
  arrays, lengths, bounds, overlapping destinations, a source overlapping
  another block's destination, pageable memory in a stream-ordered copy);
  blocks contiguous on both sides are merged (equal blocks in slots are
  checked in O(n) without a sort, see ``_distinct_slots``); the blocks go to
  ``cuMemcpyBatchAsync`` calls of at most :data:`CALL_MAX` copies and
  :data:`CALL_BYTES` bytes each where the driver has the call (CUDA >= 12.8
  with the 13.x form), and to a loop of ``cuMemcpyAsync`` where it does not.
* A batch moving at least :data:`DUPLEX_MIN_BYTES` each way between host and
  device issues its device-to-host copies on a private stream forked from and
  joined back to the caller's stream, so both copy engines work; the batch is
  ordered on the caller's stream all the same.
* No per-block Python object is built on the fast path: the ``CUdeviceptr``
  lists the bindings want are views (``CUdeviceptr(_ptr=...)``) over a
  per-thread numpy array, made once and rewritten in place per call (the
  driver reads them during the call); sizes of equal blocks are one shared
  int.
* Operands of a stream-ordered batch are kept alive until the stream has
  finished it, as :func:`copy_async` does.
* Small blocks between pinned host and device memory, or device to device,
  go to a block-copy kernel instead (:mod:`cuda_memkit._transfer._kernels`): the driver
  spends a fixed time per copy whatever its size, the kernel moves them at PCIe
  speed (docs/decisions.md). ``method="auto"`` picks it below ``KERNEL_THRESHOLD`` bytes per block
  (``KERNEL_THRESHOLD_D2D`` within device memory).

**What reaches the driver.** The driver checks each entry as it walks the
list and stops at the first bad one, keeping the copies before it (the
H100); worse, an address in the device window that is no allocation (a freed
pointer) kills the process. So every block of an operand whose extent the
library knows (its buffers, arrays, ``__cuda_array_interface__`` objects) is
checked against that extent before the first call, and again at each
:meth:`CopyBatch.execute` (a buffer closed or shrunk since :meth:`~CopyBatch.add`
is refused there). Raw int addresses are trusted: the caller vouches for
them, and a bad one is the driver's to refuse -- or to crash on.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from .._core import _capture, _driver, _peer
from .._core._checks import (
    ADDRESS_END,
    check_bool,
    check_int64_array,
    integer_array,
    refuse_negative,
)
from .._core._checks import INT64_MAX as _I64_MAX
from .._core._constants import LEGACY_STREAMS, STREAM_PER_THREAD
from .._core._context import ensure_any_context, primary_pushed
from .._core._errors import CudaDriverNotFoundError, CudaError
from .._core._host_registry import is_pinned_host
from .._core._inflight import keep_alive, pending_operands, reap_pending
from .._core._location import check_exists, to_location
from .._core._operands import DRIVER, HOST, PINNED, RAW, operand
from .._core._resource import Resource, State
from .._core._runner import place
from .._core._stream import StreamLike, forked_stream, stream_handle
from . import _kernels

if TYPE_CHECKING:
    import numpy as np

    from .._core._location import LocationLike

__all__ = ["CopyBatch", "copy_batch"]

KiB, MiB = 1 << 10, 1 << 20

# The values below were measured on the H100: see docs/decisions.md (copy_batch).

#: At most this many copies go to one ``cuMemcpyBatchAsync`` call, since the
#: driver walks all of a call's entries before its copy engine starts, and ...
CALL_MAX = 256
#: ... a call stops once it holds this many bytes (it holds at least one copy).
CALL_BYTES = 16 * MiB
#: Copies no larger than this get ``CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE``,
#: which speeds up tiny blocks and slows larger ones.
OVERLAP_FLAG_MAX_BLOCK = 4 * KiB
#: A batch with at least this many bytes host-to-device AND device-to-host
#: issues the device-to-host copies on a private second stream, so that both
#: copy engines work; below it the fork costs more than it buys.
DUPLEX_MIN_BYTES = 8 * MiB
#: The source access order given to the driver: STREAM (sources are read in
#: stream order, like cuMemcpyAsync), since the weaker orders measured no faster.
SRC_ACCESS_ORDER = 1  # CU_MEMCPY_SRC_ACCESS_ORDER_STREAM

#: Equal blocks in distinct slots are sorted (to merge the contiguous ones) only
#: when at least one in this many continues its neighbour in both buffers.
MERGE_WORTH_SORT = 16


# -- argument checks --------------------------------------------------------------------


def _scalar_size(value: Any) -> int | None:
    """``sizes`` given as one int (every block that size), else None."""
    import numpy as np

    if isinstance(value, bool):
        raise TypeError("sizes must be integers, not bool")
    if isinstance(value, (int, np.integer)):
        n = int(value)
        if n < 0:
            raise ValueError(f"sizes must be >= 0, got {n}")
        if n > _I64_MAX:
            raise ValueError("sizes is above 2**63 - 1")
        return n
    return None


def _block_arrays(dst_offsets: Any, src_offsets: Any, sizes: Any, blocks: Any
                  ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The three int64 arrays (dst offsets, src offsets, sizes) of a batch, checked.

    With one size for every block (an int ``sizes``) the offsets' signs are
    left to the caller, whose bounds pass finds their minimum anyway.
    """
    import numpy as np

    if blocks is not None:
        if dst_offsets is not None or src_offsets is not None or sizes is not None:
            raise TypeError("pass either blocks= or dst_offsets=/src_offsets=/sizes=, not both")
        if isinstance(blocks, (str, bytes)):
            raise TypeError("blocks must be (dst_offset, src_offset, size) triples")
        b = integer_array(blocks)
        if b.size == 0:
            z = np.zeros(0, np.int64)
            return z, z, z
        if b.ndim != 2 or b.shape[1] != 3:
            raise ValueError(
                f"blocks must be (dst_offset, src_offset, size) triples (shape (n, 3)), "
                f"got shape {b.shape}")
        flat = check_int64_array(b.reshape(-1), "blocks", nonnegative=True).reshape(-1, 3)
        return flat[:, 0], flat[:, 1], flat[:, 2]
    if dst_offsets is None or src_offsets is None or sizes is None:
        raise TypeError("copy_batch needs dst_offsets=, src_offsets= and sizes= (or blocks=)")
    one = _scalar_size(sizes)
    d = check_int64_array(dst_offsets, "dst_offsets", nonnegative=one is None)
    s = check_int64_array(src_offsets, "src_offsets", nonnegative=one is None)
    if len(d) != len(s):
        raise ValueError(f"dst_offsets has {len(d)} entries, src_offsets {len(s)}")
    if one is not None:
        # One read-only int broadcast over the blocks: no n-entry array to build.
        z = np.broadcast_to(np.int64(one), (len(d),))
    else:
        z = check_int64_array(sizes, "sizes", nonnegative=True)
        if len(z) != len(d):
            raise ValueError(f"sizes has {len(z)} entries, the offsets {len(d)}")
    return d, s, z


def _check_bounds(off: np.ndarray[Any, Any], sz: np.ndarray[Any, Any], limit: int | None,
                  role: str) -> None:
    """Every block inside its buffer (``limit`` bytes; None: a raw pointer, unchecked)."""
    import numpy as np

    if not len(off):
        return
    room = (_I64_MAX if limit is None else limit) - off
    bad = sz > room
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        if limit is None:
            raise ValueError(f"block {i}: {role} offset + size overflows 64 bits")
        raise ValueError(
            f"block {i} is out of range: {role} bytes [{int(off[i])}, "
            f"{int(off[i]) + int(sz[i])}) of a {limit}-byte {role}")


def _check_wrap(op: Any, need: int, off: np.ndarray[Any, Any], sz: np.ndarray[Any, Any],
                role: str) -> None:
    """The blocks end below 2**64 from the operand's address ``op.ptr``: none wraps around.

    ``need`` is the largest end offset of the blocks (known from the bounds
    pass): one comparison, and the block is named only when one fails.
    """
    import numpy as np

    base = op.ptr
    if base + need <= ADDRESS_END:
        return
    over = np.flatnonzero(off + sz > ADDRESS_END - base)  # < need <= 2**63 - 1: exact in int64
    i = int(over[0]) if len(over) else 0
    raise ValueError(
        f"block {i}: the {role} address 0x{base:x} + offset {int(off[i])} + size "
        f"{int(sz[i])} passes 2**64 (it would wrap around to another allocation)")


def _sort_merge(d: np.ndarray[Any, Any], s: np.ndarray[Any, Any], z: np.ndarray[Any, Any],
                idx: np.ndarray[Any, Any] | None
                ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The blocks sorted by destination, overlaps refused, contiguous runs merged.

    ``idx``: the caller's index of each block (blocks were dropped), for the
    error; ``None``: positions are the caller's.
    """
    import numpy as np

    if not (d[1:] >= d[:-1]).all():
        order = np.argsort(d)
        d, s, z = d[order], s[order], z[order]
        idx = order if idx is None else idx[order]
    end = d + z
    over = d[1:] < end[:-1]
    if over.any():
        k = int(np.flatnonzero(over)[0])
        i, j = (k, k + 1) if idx is None else (int(idx[k]), int(idx[k + 1]))
        raise ValueError(
            f"destination blocks {min(i, j)} and {max(i, j)} overlap (bytes "
            f"[{int(d[k])}, {int(end[k])}) and [{int(d[k + 1])}, {int(end[k + 1])})): "
            "the copies of a batch run in no particular order")
    brk = (d[1:] != end[:-1]) | (s[1:] != s[:-1] + z[:-1])
    if not brk.all():
        starts = np.flatnonzero(np.concatenate(([True], brk)))
        z = np.add.reduceat(z, starts)
        d, s = d[starts], s[starts]
    return d, s, z


# -- one (dst, src) pair --------------------------------------------------------------


class _Group:
    """The checked, coalesced blocks of one (destination, source) pair."""

    __slots__ = ("blocks", "d", "dst", "dst_hint", "dst_need", "dst_op", "given",
                 "merge_pending", "nbytes", "s", "size", "sorted", "span", "src", "src_hint",
                 "src_need", "src_op", "z")

    def __init__(self, dst: Any, src: Any, dst_offsets: Any, src_offsets: Any, sizes: Any,
                 blocks: Any, src_location: Any, dst_location: Any,
                 method: str | None = None) -> None:
        """Check and coalesce the blocks; ``method``: the copy's, when already known.

        Blocks the copy kernel will take (``method``, the operands' kinds and
        the block size say so) are not tested for merging: the kernel copies
        a block of 4 KiB as fast as a merged run of them.
        """
        import numpy as np

        self.dst, self.src = dst, src
        self.dst_op = operand(dst, True)
        self.src_op = operand(src, False)
        # A device hint must name a device that exists, whichever path copies (the driver
        # refuses one that does not, the kernel would ignore it): checked before anything.
        self.src_hint = None if src_location is None else check_exists(
            to_location(src_location))
        self.dst_hint = None if dst_location is None else check_exists(
            to_location(dst_location))
        d, s, z = _block_arrays(dst_offsets, src_offsets, sizes, blocks)
        one = _scalar_size(sizes) if blocks is None else None
        span = None
        if one is not None and len(d):
            # One size for every block: signs and bounds are two min/max passes per side.
            d0, s0 = int(d.min()), int(s.min())
            if d0 < 0:
                refuse_negative(d, "dst_offsets")
            if s0 < 0:
                refuse_negative(s, "src_offsets")
        if one is not None and one > 0 and len(d):
            d1, s1 = int(d.max()) + one, int(s.max()) + one
            lim_d, lim_s = self.dst_op.nbytes, self.src_op.nbytes
            if not (d1 <= (_I64_MAX if lim_d is None else lim_d)
                    and s1 <= (_I64_MAX if lim_s is None else lim_s)):
                _check_bounds(d, z, self.dst_op.nbytes, "destination")  # names the block
                _check_bounds(s, z, self.src_op.nbytes, "source")
            span = (d0, d1, s0, s1)
            self.dst_need, self.src_need = d1, s1
        else:
            _check_bounds(d, z, self.dst_op.nbytes, "destination")
            _check_bounds(s, z, self.src_op.nbytes, "source")
            # The bytes each operand must have (checked again by refresh()).
            self.dst_need = int((d + z).max()) if len(z) else 0
            self.src_need = int((s + z).max()) if len(z) else 0
        _check_wrap(self.dst_op, self.dst_need, d, z, "destination")
        _check_wrap(self.src_op, self.src_need, s, z, "source")
        self.blocks = len(z)
        idx = None
        if span is None:
            keep = z > 0  # zero-size blocks are skipped (the driver refuses them)
            if not keep.all():
                idx = np.flatnonzero(keep)
                d, s, z = d[idx], s[idx], z[idx]
        #: The blocks as given that copy bytes ("auto" averages over these, not the merged).
        self.given = len(z)
        # Sort by destination (a batch has no order), refuse overlapping
        # destinations, merge blocks contiguous on both sides; equal blocks in
        # distinct slots with nothing to merge (the common scattered case) skip
        # the sort, whose cost the kernel path would otherwise wait for.
        # (sorted False: no overlap and nothing to merge, kept in the caller's order)
        # (with one size, the slot test takes the largest offset from the bounds pass)
        size, d_max = (one, span[1] - one) if span is not None and one is not None else (
            None, None)
        merge = size is None or not _kernels.likely(self, size, method)
        self.sorted = not (len(d) > 1 and _distinct_slots(d, s, z, size, d_max, merge))
        #: Distinct slots, the merge test left to coalesce() (the kernel will likely copy them).
        self.merge_pending = not merge and not self.sorted
        if self.sorted and len(d) > 1:
            d, s, z = _sort_merge(d, s, z, idx)
        self.d, self.s, self.z = d, s, z
        # offsets_span(), once; merging keeps the span, so the uniform pass's holds
        self.span: tuple[int, int, int, int] | None = span
        # With one size, merging keeps the total and ``size`` says whether it merged.
        self.size = one if span is not None and len(z) == self.blocks else 0
        self.nbytes = (one * self.blocks if span is not None and one is not None
                       else int(z.sum()) if len(z) else 0)
        self._check_null()

    def coalesce(self) -> None:
        """Merge the blocks contiguous on both sides where worth it, if that test was left.

        For a pair the copy kernel was expected to take (``merge_pending``)
        that goes to the driver's copies after all: fewer, larger copies.
        """
        if not self.merge_pending:
            return
        self.merge_pending = False
        size, span = self.size, self.span
        assert size and span is not None  # only pairs of one block size defer the test
        if _distinct_slots(self.d, self.s, self.z, size, span[1] - size):
            return  # (almost) nothing to merge
        self.sorted = True
        self.d, self.s, self.z = _sort_merge(self.d, self.s, self.z, None)
        if len(self.z) != self.blocks:
            self.size = 0

    def offsets_span(self) -> tuple[int, int, int, int]:
        """``(dst start, dst end, src start, src end)`` as offsets into the operands (cached)."""
        span = self.span
        if span is None:
            span = self.span = (int(self.d.min()), int((self.d + self.z).max()),
                                int(self.s.min()), int((self.s + self.z).max()))
        return span

    def extents(self) -> tuple[int, int, int, int]:
        """``(dst start, dst end, src start, src end)``: the addresses the blocks span."""
        d0, d1, s0, s1 = self.offsets_span()
        dp, sp = self.dst_op.ptr, self.src_op.ptr
        return dp + d0, dp + d1, sp + s0, sp + s1

    def _check_null(self) -> None:
        for op, role in ((self.dst_op, "destination"), (self.src_op, "source")):
            if self.nbytes and op.ptr == 0:
                raise ValueError(f"the copy_batch {role} is a null pointer")

    def refresh(self) -> None:
        """Resolve the operands again and check the blocks against their sizes now.

        A closed buffer raises ClosedError; a buffer that shrank since the
        blocks were added (``GrowableBuffer.resize``) raises ValueError: its
        tail may be unmapped, and a copy there can kill the process.
        """
        self.dst_op = operand(self.dst, True)
        self.src_op = operand(self.src, False)
        for op, need, role in ((self.dst_op, self.dst_need, "destination"),
                               (self.src_op, self.src_need, "source")):
            if op.nbytes is not None and need > op.nbytes:
                raise ValueError(
                    f"the {role} now has {op.nbytes} bytes, but the batch's blocks reach byte "
                    f"{need} of it (it was resized since they were added)")
            if op.ptr + need > ADDRESS_END:  # an object now at another address
                _check_wrap(op, need, self.d if role == "destination" else self.s, self.z,
                            role)
        self._check_null()

    def direction(self) -> int:
        """1: host to device, 2: device to host, 0: anything else (by operand kind)."""
        d, s = self.dst_op.kind, self.src_op.kind
        if d == DRIVER and s in (HOST, PINNED):
            return 1
        if s == DRIVER and d in (HOST, PINNED):
            return 2
        return 0

    def pageable(self) -> str | None:
        """Which operand is pageable host memory ("destination"/"source"), if any."""
        for op, role in ((self.dst_op, "destination"), (self.src_op, "source")):
            if op.kind == HOST and op.nbytes and not is_pinned_host(op.host_array):
                return role
        return None

    def addresses(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Absolute destination and source addresses (uint64)."""
        import numpy as np

        u = np.uint64
        return (self.d.astype(u) + u(self.dst_op.ptr), self.s.astype(u) + u(self.src_op.ptr))


class _Scratch(threading.local):
    """Per-thread work arrays of the checks, reused from call to call.

    A fresh temporary of 65536 int64 is new memory the kernel faults in page
    by page at every call (docs/decisions.md); a reused one is already mapped.
    """

    #: Arrays above this many entries are not kept (a huge batch frees its own).
    KEEP_MAX = 1 << 22

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray[Any, Any]] = {}
        self.busy = False

    def get(self, key: str, n: int, dtype: Any) -> np.ndarray[Any, Any]:
        """An uninitialised array of ``n`` entries (a view of the kept one)."""
        import numpy as np

        a = self.arrays.get(key)
        if a is None or len(a) < n:
            a = np.empty(max(n, 1024), dtype)
            if n <= self.KEEP_MAX:
                self.arrays[key] = a
        return a[:n]


_scratch = _Scratch()


def _distinct_slots(d: np.ndarray[Any, Any], s: np.ndarray[Any, Any],
                    z: np.ndarray[Any, Any], size: int | None = None,
                    d_max: int | None = None, merge: bool = True) -> bool:
    """Whether equal blocks sit in distinct slots with (almost) nothing to merge.

    Blocks of one size ``b`` at multiples of ``b`` overlap only when two share
    a slot; block ``i`` merges with the block in the next slot when that one's
    source continues ``i``'s. Both are found in O(n) with a slot table (a sort
    is O(n log n)). Random slots on both sides hold about one such pair
    whatever their number, so fewer than one in :data:`MERGE_WORTH_SORT` are
    left unmerged. False when the blocks are not of that form, share a slot,
    merge more often, or the slot table would be much larger than the blocks:
    the sort then decides (and names the overlap). ``size``: every block is
    known to be that size (``z`` is not read); ``d_max``: the largest
    destination offset, when the caller knows it; ``merge`` false: only
    whether the slots are distinct (the copy kernel takes the blocks, and
    merging buys it nothing), with a table of flags instead of source
    offsets. The work arrays are the thread's :class:`_Scratch` ones (a
    fresh set when re-entered).
    """
    import numpy as np

    if size is None:
        size = int(z[0])
        if size <= 0 or not (z == size).all():
            return False
    b = size
    if b <= 0:
        return False
    sc = _scratch if not _scratch.busy else _Scratch()
    sc.busy = True
    try:
        n = len(d)
        slot = sc.get("slot", n, np.int64)
        if b & (b - 1) == 0:  # a power of two: an OR reduction and a shift, no int64 division
            if int(np.bitwise_or.reduce(d)) & (b - 1):
                return False
            np.right_shift(d, b.bit_length() - 1, out=slot)
        else:
            np.remainder(d, b, out=slot)
            if slot.any():
                return False
            np.floor_divide(d, b, out=slot)
        top = int(slot.max()) if d_max is None else d_max // b
        if top > 4 * n + 1024:
            return False
        if not merge:  # one byte per slot: the fill and the count read 8x less
            taken = sc.get("taken", top + 1, np.bool_)
            taken.fill(False)
            taken[slot] = True
            return int(np.count_nonzero(taken)) == n
        # The source offset of the block in each slot (INT64_MIN: none); one scatter,
        # then every test reads the table in order (random gathers cost far more).
        # An empty slot plus b stays negative, so it never equals a source offset:
        # the merge test needs no mask of the taken slots.
        empty = np.iinfo(np.int64).min
        src_of = sc.get("table", top + 2, np.int64)
        src_of.fill(empty)
        src_of[slot] = s
        here = src_of[:-1]  # the last entry is past the top slot: always empty
        flags = sc.get("flags", top + 1, np.bool_)
        np.not_equal(here, empty, out=flags)
        if int(np.count_nonzero(flags)) != n:
            return False  # two blocks share a slot: the sort names them
        nxt = sc.get("next", top + 1, np.int64)
        np.add(here, b, out=nxt)
        np.equal(src_of[1:], nxt, out=flags)
        merges = int(np.count_nonzero(flags))
        return merges * MERGE_WORTH_SORT <= n  # a stray pair or two is not worth the sort
    finally:
        sc.busy = False


def _check_hazards(groups: list[_Group]) -> None:
    """No destination may overlap another block's destination or any source."""
    import numpy as np

    live = [g for g in groups if len(g.z)]
    if not live:
        return
    if len(live) == 1:
        d0, d1, s0, s1 = live[0].extents()
        if d1 <= s0 or s1 <= d0:
            return  # one pair whose destination and source spans do not meet
    pairs = [g.addresses() for g in live]
    zs = [g.z.astype(np.uint64) for g in live]
    ds = np.concatenate([p[0] for p in pairs])
    ss = np.concatenate([p[1] for p in pairs])
    z = np.concatenate(zs)
    if len(live) > 1 or not live[0].sorted:  # a sorted group was checked on offsets
        order = np.argsort(ds)
        ds_sorted, de_sorted = ds[order], ds[order] + z[order]
        if (ds_sorted[1:] < de_sorted[:-1]).any():
            raise ValueError("two blocks of the batch write overlapping memory: the copies of "
                             "a batch run in no particular order")
    else:
        ds_sorted, de_sorted = ds, ds + z
    # A source that overlaps any destination (when the memories can overlap).
    se = ss + z
    if int(ss.min()) >= int(de_sorted.max()) or int(se.max()) <= int(ds_sorted.min()):
        return
    j = np.searchsorted(ds_sorted, se, side="left").astype(np.int64) - 1
    hit = (j >= 0) & (de_sorted[np.maximum(j, 0)] > ss)
    if hit.any():
        raise ValueError(
            "a source block overlaps a destination block of the same batch: the copies of "
            "a batch run in no particular order, so the result would be undefined; split "
            "it into two batches on one stream")


# -- issuing ------------------------------------------------------------------------------


class _Slots(threading.local):
    """Per-thread ``CUdeviceptr`` views over two uint64 arrays, rewritten per call."""

    def __init__(self) -> None:
        self.cap = 0
        self.busy = False
        self.dst: Any = None
        self.src: Any = None
        self.dst_views: list[Any] = []
        self.src_views: list[Any] = []
        self.ok = True  # the bindings honour CUdeviceptr(_ptr=...) views

    def grow(self, n: int) -> None:
        import numpy as np
        from cuda.bindings.driver import CUdeviceptr

        cap = max(n, 2 * self.cap, 256)
        dst = np.zeros(cap, np.uint64)
        src = np.zeros(cap, np.uint64)
        try:
            dv = [CUdeviceptr(_ptr=dst.ctypes.data + 8 * i) for i in range(cap)]
            sv = [CUdeviceptr(_ptr=src.ctypes.data + 8 * i) for i in range(cap)]
            dst[-1] = 0x1234_5678_9ABC
            self.ok = int(dv[-1]) == 0x1234_5678_9ABC
        except TypeError:  # bindings without the _ptr form
            dv, sv, self.ok = [], [], False
        self.dst, self.src, self.dst_views, self.src_views = dst, src, dv, sv
        self.cap = cap


_slots = _Slots()


def _ptr_lists(dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any]
               ) -> tuple[list[Any], list[Any], bool]:
    """The two ``CUdeviceptr`` lists for a call; True if they are the shared slots."""
    from cuda.bindings.driver import CUdeviceptr

    n = len(dst)
    sl = _slots
    if not sl.busy:
        if sl.cap < n:
            sl.grow(n)
        if sl.ok:
            sl.dst[:n] = dst
            sl.src[:n] = src
            return sl.dst_views[:n], sl.src_views[:n], True
    # re-entered on this thread (a finalizer, a signal handler) or no views: objects
    return (list(map(CUdeviceptr, dst.tolist())), list(map(CUdeviceptr, src.tolist())), False)


def _attrs(g: _Group) -> Any:
    from cuda.bindings.driver import CUmemcpyAttributes, CUmemcpySrcAccessOrder

    a = CUmemcpyAttributes()
    a.srcAccessOrder = CUmemcpySrcAccessOrder(SRC_ACCESS_ORDER)
    if OVERLAP_FLAG_MAX_BLOCK and len(g.z) and (g.size or int(g.z.max())) <= OVERLAP_FLAG_MAX_BLOCK:
        a.flags = 1  # CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE
    if g.src_hint is not None:
        a.srcLocHint = g.src_hint.to_cu()
    if g.dst_hint is not None:
        a.dstLocHint = g.dst_hint.to_cu()
    return a


def call_bounds(z: np.ndarray[Any, Any]) -> list[tuple[int, int]]:
    """Split copies of sizes ``z`` into calls: at most CALL_MAX copies, CALL_BYTES bytes each.

    A call always holds at least one copy (a copy larger than CALL_BYTES goes alone).
    """
    import numpy as np

    total = len(z)
    if not total:
        return []
    first = int(z[0])
    if (z == first).all():
        step = max(1, min(CALL_MAX, CALL_BYTES // first if first else CALL_MAX))
        return [(a, min(a + step, total)) for a in range(0, total, step)]
    cum = np.concatenate(([0], np.cumsum(z, dtype=np.int64)))
    out: list[tuple[int, int]] = []
    a = 0
    while a < total:
        fit = int(np.searchsorted(cum, int(cum[a]) + CALL_BYTES, side="right")) - 1
        b = min(a + CALL_MAX, max(fit, a + 1), total)
        out.append((a, b))
        a = b
    return out


def _issue_batch(groups: list[_Group], stream: int) -> None:
    """The copies of ``groups`` in calls of :func:`call_bounds`; one attrs entry per group.

    Raises
    ------
    CudaDriverNotFoundError
        From the first call, before anything was issued, on a driver without
        ``cuMemcpyBatchAsync``.
    """
    import numpy as np

    live = [g for g in groups if len(g.z)]
    if not live:
        return
    addrs = [g.addresses() for g in live]
    dst = np.concatenate([a[0] for a in addrs]) if len(addrs) > 1 else addrs[0][0]
    src = np.concatenate([a[1] for a in addrs]) if len(addrs) > 1 else addrs[0][1]
    z = np.concatenate([g.z for g in live]) if len(live) > 1 else live[0].z
    starts = np.cumsum([0] + [len(g.z) for g in live])
    attrs = [_attrs(g) for g in live]
    uniform = bool((z == z[0]).all())
    same_sizes: list[int] = []
    call = _driver.call
    for a, b in call_bounds(z):
        n = b - a
        dl, sl, shared = _ptr_lists(dst[a:b], src[a:b])
        if uniform:  # one list of one int, reused while the count stays the same
            if len(same_sizes) != n:
                same_sizes = [int(z[0])] * n
            sizes = same_sizes
        else:
            sizes = z[a:b].tolist()
        first = int(np.searchsorted(starts, a, side="right")) - 1
        last = int(np.searchsorted(starts, b, side="left"))
        at = attrs[first:last]
        idx = [max(int(starts[k]) - a, 0) for k in range(first, last)]
        if shared:
            _slots.busy = True
        try:
            call("cuMemcpyBatchAsync", dl, sl, sizes, n, at, idx, len(at), stream)
        finally:
            _slots.busy = False


def _duplex(groups: list[_Group]) -> tuple[list[_Group], list[_Group]]:
    """(groups for the caller's stream, groups for a second stream): see DUPLEX_MIN_BYTES."""
    side = [g for g in groups if g.nbytes and g.direction() == 2]
    if not side:
        return groups, []
    h2d = sum(g.nbytes for g in groups if g.nbytes and g.direction() == 1)
    d2h = sum(g.nbytes for g in side)
    if min(h2d, d2h) < DUPLEX_MIN_BYTES:
        return groups, []
    return [g for g in groups if not (g.nbytes and g.direction() == 2)], side


def _issue_forked(main: list[_Group], side: list[_Group], stream: int) -> None:
    """``main`` on ``stream``, ``side`` on a private stream forked from and joined to it.

    The batch is ordered exactly as if every copy had gone to ``stream``
    (:func:`~cuda_memkit._core._stream.forked_stream`).
    """
    with forked_stream(stream) as private:
        _issue_batch(side, private)  # a driver without the call: nothing issued
        _issue_batch(main, stream)


def _issue_loop(groups: list[_Group], stream: int) -> None:
    """The fallback: one ``cuMemcpyAsync`` per (coalesced) block."""
    fn = _driver.function("cuMemcpyAsync")
    check = _driver.check
    for g in groups:
        if not len(g.z):
            continue
        dst, src = g.addresses()
        for dp, sp, n in zip(dst.tolist(), src.tolist(), g.z.tolist(), strict=True):
            res = fn(dp, sp, n, stream)
            if res[0]:
                check("cuMemcpyAsync", res)


class _Memo:
    """What a :class:`CopyBatch` keeps between executions (its blocks never change)."""

    __slots__ = ("checked", "device", "pick_key", "picked", "resident")

    def __init__(self) -> None:
        #: The operand addresses at which the pairs passed :func:`_check_hazards`.
        self.checked: tuple[int, ...] | None = None
        self.resident = _kernels.Resident()
        #: ``(context, method, stream, operand addresses)`` of the last kernel pick.
        self.pick_key: tuple[Any, ...] | None = None
        self.picked: list[tuple[Any, int, int]] = []
        #: The device the picked pairs' kernel runs on.
        self.device = -1

    def forget(self) -> None:
        """The pairs changed: check and pick again at the next execution."""
        self.checked = self.pick_key = None
        self.picked = []

    def pick(self, groups: list[_Group], method: str, stream: int,
             where: tuple[int, ...], ctx: int) -> list[tuple[Any, int, int]]:
        """:func:`_kernels.kernel_groups`, remembered while nothing it depends on moved.

        The operands are the same objects, alive (``refresh()`` checked it) and at
        the same addresses in the same context, so their kind and mapping are
        too; only the stream's device is asked again. Registered numpy arrays and
        int addresses are asked every time (a registration can be undone).
        """
        if any(op.kind in (HOST, RAW) for g in groups for op in (g.dst_op, g.src_op)):
            return _kernels.kernel_groups(groups, method, stream)
        key = (ctx, method, stream, where, _peer.generation[0])  # (a disable: pick again)
        # (cuStreamGetDevice is refused on a capturing stream: while a capture may run,
        # the groups are picked again.)
        if key == self.pick_key and not _capture.active and (not self.picked or int(
                _driver.call("cuStreamGetDevice", stream)) == self.device):
            return self.picked
        self.pick_key = None
        picked = _kernels.kernel_groups(groups, method, stream)
        self.device = int(_driver.call("cuCtxGetDevice")) if picked else -1
        self.picked, self.pick_key = picked, key
        return picked


def _run(groups: list[_Group], stream: StreamLike, sync: bool, allow_pageable: bool,
         method: str, memo: _Memo | None = None) -> None:
    """Check across groups, then issue the kernel and the batch (or the loop) on the stream.

    With ``memo`` (a :class:`CopyBatch`), the cross-pair check is skipped while
    the operands are where they were when it passed, and the kernel's
    descriptors stay on the device.
    """
    h = 0 if sync else stream_handle(stream)
    if not sync and not allow_pageable:
        for g in groups:
            role = g.pageable() if g.nbytes else None
            if role is not None:
                raise ValueError(
                    f"the copy_batch {role} is pageable host memory: a stream-ordered copy "
                    "from or to it is staged by the driver and serialises with the host. "
                    "Use a HostBuffer, page-lock it with register_host(), copy without "
                    "stream= (synchronous), or pass allow_pageable=True")
    where: tuple[int, ...] = ()
    if memo is None:
        _check_hazards(groups)
    else:
        where = tuple(x for g in groups for x in (g.dst_op.ptr, g.src_op.ptr))
        if memo.checked != where:
            memo.checked = None
            _check_hazards(groups)
            memo.checked = where
    if not any(g.nbytes for g in groups):
        return
    if pending_operands:
        reap_pending()
    ctx = ensure_any_context()
    # The stream's device runs the batch, whatever is current; a synchronous batch runs
    # where a synchronous copy of its pairs would (see _core._runner).
    runner = place([(x, w) for g in groups if g.nbytes for x, w in ((g.dst, True), (g.src, False))],
                   None if sync else h, "cuMemcpyBatchAsync", stream, ctx)
    if runner is None:
        _issue_all(groups, h, sync, method, memo, where, ctx)
        return
    with primary_pushed(runner):
        _issue_all(groups, h, sync, method, memo, where, ensure_any_context())


def _issue_all(groups: list[_Group], h: int, sync: bool, method: str, memo: _Memo | None,
               where: tuple[int, ...], ctx: int) -> None:
    """Issue the kernel and the batch (or the loop) in the current context, which runs them."""
    # The batch call refuses the legacy stream: issue on the per-thread default
    # stream, a blocking stream, which the legacy stream waits for and which
    # waits for it (the same ordering as work on the legacy stream).
    issue_on = STREAM_PER_THREAD if h in LEGACY_STREAMS else h
    picked = (_kernels.kernel_groups(groups, method, issue_on) if memo is None  # may refuse
              else memo.pick(groups, method, issue_on, where, ctx))
    rest = groups
    if picked:
        taken = {id(g) for g, _, _ in picked}
        rest = [g for g in groups if id(g) not in taken]
    for g in rest:
        g.coalesce()
    main, side = _duplex(rest)
    done = False
    held: list[Any] = []  # what the stream reads besides the operands: the descriptors
    try:
        if memo is not None and picked:
            held.append(memo.resident.launch(picked, issue_on, sync, ctx))
        else:
            _kernels.launch(picked, issue_on, held)
        try:
            if side:
                _issue_forked(main, side, issue_on)
            else:
                _issue_batch(rest, issue_on)
        except CudaDriverNotFoundError:  # a driver without cuMemcpyBatchAsync
            if not picked:  # else stay on the kernel's stream, which _settle waits for
                issue_on = h
            _issue_loop(rest, issue_on)
        done = True
    finally:
        # Also when the driver refused a later call (int addresses): the calls
        # before it are in flight and read or write the operands.
        _settle(groups, issue_on, sync, done, tuple(held))


def _settle(groups: list[_Group], stream: int, sync: bool, done: bool,
            hold: tuple[Any, ...] = ()) -> None:
    """Wait for the batch (synchronous) or hold its operands until the stream is done.

    After a refused call (``done`` False) the driver's refusal is the error to
    report: a failure here is then dropped.
    """
    refs = tuple(x for g in groups for x, op in ((g.dst, g.dst_op), (g.src, g.src_op))
                 if op.kind != RAW) + hold
    try:
        if sync:
            _driver.call("cuStreamSynchronize", stream)
        elif refs:
            keep_alive(stream, refs)
    except CudaError:
        if done:
            raise


# -- public API ----------------------------------------------------------------------------


def copy_batch(
    dst: Any,
    src: Any,
    *,
    dst_offsets: Any = None,
    src_offsets: Any = None,
    sizes: Any = None,
    blocks: Any = None,
    stream: StreamLike = None,
    allow_pageable: bool = False,
    src_location: LocationLike | None = None,
    dst_location: LocationLike | None = None,
    method: str = "auto",
) -> Any:
    """Copy many blocks from ``src`` to ``dst`` in a few batched driver calls.

    Block ``i`` copies ``sizes[i]`` bytes from byte ``src_offsets[i]`` of
    ``src`` to byte ``dst_offsets[i]`` of ``dst``. Everything is checked
    before anything is issued; blocks contiguous in both buffers are merged
    for the driver's copies; the copies go to ``cuMemcpyBatchAsync`` calls of at most 256 copies and
    16 MiB (a loop of ``cuMemcpyAsync`` on drivers without it), or, for small
    blocks between pinned host and device memory or within device memory, to
    one launch of a block-copy kernel (see ``method``). The blocks of a batch
    run in no particular order.

    Without ``stream`` the copy is synchronous (complete on return, ordered
    like :func:`copy`); with ``stream`` it is ordered on that stream and
    returns at once, keeping the operands alive until the stream is done.

    Parameters
    ----------
    dst, src : buffer, array or pointer
        Anything :func:`copy` accepts: :class:`HostBuffer`,
        :class:`DeviceBuffer`, pool, managed or growable buffers, a
        registered or plain C-contiguous numpy array, an object with
        ``__cuda_array_interface__``, or an int address. An int address is
        trusted: it is not bounds-checked, and a freed or unknown device
        address can crash the process in the driver (the H100 segfaults).
        They may be the same buffer (blocks moved inside it).
    dst_offsets, src_offsets : array-like of int
        Byte offsets, one per block (any integer dtype, or lists).
    sizes : int or array-like of int
        Bytes per block, or one int for blocks all of that size. Blocks of
        size 0 are skipped (after the offset checks).
    blocks : array-like, optional
        Instead of the three arrays: ``(dst_offset, src_offset, size)``
        triples, an ``(n, 3)`` integer array or a list of tuples.
    stream : Stream, int or stream-like, optional
        Order the batch on this stream instead of copying synchronously. The
        legacy default stream is accepted (the batch then goes to the
        per-thread default stream, which is ordered with it).
    allow_pageable : bool, default False
        Allow pageable numpy memory in a stream-ordered batch (the driver
        stages it and the call blocks). Synchronous batches always allow it.
    src_location, dst_location : Location, Device or int, optional
        Location hints for managed memory operands (``srcLocHint`` /
        ``dstLocHint``); ignored by the driver for other memory.
    method : {"auto", "kernel", "driver"}, default "auto"
        ``"kernel"``: a block-copy kernel of the current context's device
        moves the blocks, reading or writing pinned host memory through its
        device-mapped address; both operands must be device or managed
        memory of that device or pinned host memory. ``"driver"``: the
        driver's batch copies. ``"auto"``: the kernel when both operands
        qualify (int addresses never do, nor host to host) and the blocks,
        as given (before any merge), average less than ``KERNEL_THRESHOLD``
        bytes (64 KiB) between host and device or ``KERNEL_THRESHOLD_D2D``
        (2 MiB) within device memory, else the driver.

    Returns
    -------
    dst

    Raises
    ------
    TypeError
        Non-integer offset or size arrays, both or neither of ``blocks`` and
        the arrays, operands that are not memory, an ``allow_pageable`` that
        is not a bool.
    ValueError
        Arrays of different lengths, negative offsets or sizes, a block past
        the end of its buffer, overlapping destination blocks, a source block
        overlapping a destination block, read-only destinations, pageable
        memory in a stream-ordered batch without ``allow_pageable``, an
        unknown ``method``, ``method="kernel"`` with an operand the kernel
        cannot reach (pageable memory, another device's memory it has no peer
        access to).
    ClosedError
        If an operand is closed.
    PeerAccessError
        The stream's device was given no access to another device's pool or
        mapped memory among the operands (without ``stream``: no device that
        could run the batch was; see :func:`copy`); nothing is issued.
        Another device's context memory is reached through peer access,
        enabled on first use (:func:`configure_peer_access`), or staged by
        the driver where the devices cannot reach each other. The batch is
        issued in the stream's context whatever context is current; without
        ``stream`` it runs where a synchronous :func:`copy` of its pairs would.
    CudaError
        If the driver refuses a call: only an int address can lead there, as
        those are not checked. The calls before it, and the copies before
        the refused entry in it, have then been made. A kernel that faults
        on such an address reports ``CUDA_ERROR_ILLEGAL_ADDRESS`` at the
        next synchronisation.

    Examples
    --------
    >>> host = cm.HostBuffer.empty(16 << 20)
    >>> dev = cm.DeviceBuffer.empty(16 << 20)
    >>> slots = np.array([7, 2, 9]) * (1 << 20)
    >>> cm.copy_batch(dev, host, dst_offsets=slots, src_offsets=[0, 1 << 20, 2 << 20],
    ...               sizes=1 << 20)     # returns dst
    <DeviceBuffer 16777216 bytes on device 0 ptr=0x...>
    >>> host.close(); dev.close()
    """
    _kernels.check_method(method)
    check_bool(allow_pageable, "allow_pageable")
    g = _Group(dst, src, dst_offsets, src_offsets, sizes, blocks, src_location, dst_location,
               method)
    _run([g], stream, stream is None, allow_pageable, method)
    return dst


def _frozen(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """A read-only copy of ``a``."""
    out: np.ndarray[Any, Any] = a.copy()
    out.flags.writeable = False
    return out


class CopyBatch(Resource):
    """Several (destination, source) block lists issued as one batch.

    Each :meth:`add` is checked like :func:`copy_batch`; :meth:`execute` also
    checks across the pairs (no two blocks may write overlapping memory, no
    source may overlap a destination) and every pair's blocks against the
    operands' sizes at that moment, then issues every block in
    ``cuMemcpyBatchAsync`` calls with one attribute entry per pair. With at
    least 8 MiB each way between host and device, the device-to-host pairs
    go to a private stream forked from and joined back to ``stream``, so that
    both directions move at once. Use it for the
    two directions of a swap whose blocks do not alias (evict to host while
    loading other blocks into free device slots), or to build once and run
    several times.

    The batch keeps read-only copies of the blocks given to :meth:`add`. On
    the kernel path it keeps the kernel's descriptors on the device between
    executions (:attr:`device_nbytes`, in the allocation ledger), so that a
    repeated :meth:`execute` is one launch after the operand checks;
    :meth:`close` (or ``with``) frees them, as does collecting the batch.
    Threads may share a batch: its executions, :meth:`add` and :meth:`close`
    take turns (a synchronous execution holds the batch until its copies are
    done), since they share the checks and the descriptors.

    Examples
    --------
    >>> BLOCK = 4096
    >>> host_cache, dev_cache = cm.HostBuffer.zeros(64 * BLOCK), cm.DeviceBuffer.zeros(64 * BLOCK)
    >>> evict, out_slots = np.array([3, 7]) * BLOCK, np.array([0, 1]) * BLOCK
    >>> load, free = np.array([40, 41]) * BLOCK, np.array([20, 21]) * BLOCK
    >>> s = cm.Stream()
    >>> b = cm.CopyBatch()
    >>> b.add(host_cache, dev_cache, dst_offsets=out_slots, src_offsets=evict, sizes=BLOCK)
    <CopyBatch 1 pairs, 2 blocks, 2 copies, 8192 bytes>
    >>> b.add(dev_cache, host_cache, dst_offsets=free, src_offsets=load, sizes=BLOCK)
    <CopyBatch 2 pairs, 4 blocks, 3 copies, 16384 bytes>
    >>> b.execute(stream=s)
    >>> s.synchronize()
    >>> b.close(); s.close(); host_cache.close(); dev_cache.close()
    """

    def __init__(self) -> None:
        self._groups: list[_Group] = []
        self._memo = _Memo()
        # One execution at a time: another context's would free the descriptors a launch reads.
        self._lock = threading.RLock()
        self._open(None)  # the device memory it may hold is a DeviceBuffer's, with its finalizer

    def close(self) -> None:
        """Free the kernel descriptors kept on the device; the batch cannot run any more.

        Descriptors a stream may still read (an :meth:`execute` with
        ``stream=`` not waited for) are freed once that stream has run them.
        Calling it again does nothing; ``with CopyBatch() as b:`` closes on exit.
        """
        with self._lock:
            if self._state is State.OPEN:
                self._memo.resident.release()
                self._memo.forget()  # the last kernel pick names the pairs, and their operands
                self._groups = []
            super().close()

    @property
    def device_nbytes(self) -> int:
        """Device bytes this batch holds: the kernel's descriptors (0 until the kernel ran)."""
        return self._memo.resident.nbytes

    def add(self, dst: Any, src: Any, *, dst_offsets: Any = None, src_offsets: Any = None,
            sizes: Any = None, blocks: Any = None, src_location: LocationLike | None = None,
            dst_location: LocationLike | None = None) -> CopyBatch:
        """Add the blocks of one (destination, source) pair; arguments as :func:`copy_batch`.

        Returns
        -------
        CopyBatch
            This batch (chainable).
        """
        self._check_open()
        g = _Group(dst, src, dst_offsets, src_offsets, sizes, blocks, src_location, dst_location)
        # The blocks are the batch's own, read-only copies: the caller may reuse
        # its arrays, and what was checked here is what every execute() runs.
        g.d, g.s, g.z = (_frozen(a) for a in (g.d, g.s, g.z))
        with self._lock:
            self._check_open()
            self._groups.append(g)
            self._memo.forget()
        return self

    def __len__(self) -> int:
        """Number of copies issued (after merging contiguous blocks)."""
        return sum(len(g.z) for g in self._groups)

    @property
    def nbytes(self) -> int:
        """Total bytes the batch copies."""
        return sum(g.nbytes for g in self._groups)

    @property
    def blocks(self) -> int:
        """Number of blocks added (before merging; zero-size blocks included)."""
        return sum(g.blocks for g in self._groups)

    def execute(self, stream: StreamLike = None, *, allow_pageable: bool = False,
                method: str = "auto") -> None:
        """Issue the batch: synchronous without ``stream``, else ordered on it.

        Parameters
        ----------
        stream : Stream, int or stream-like, optional
            As for :func:`copy_batch`.
        allow_pageable : bool, default False
            As for :func:`copy_batch`.
        method : {"auto", "kernel", "driver"}, default "auto"
            As for :func:`copy_batch`, pair by pair (``"kernel"``: every
            pair); the pairs the kernel copies go to one launch.

        Raises
        ------
        ValueError
            Blocks of different pairs writing overlapping memory, a source
            overlapping a destination, pageable memory (as :func:`copy_batch`),
            an operand resized below the blocks added for it, a ``method``
            refused as by :func:`copy_batch`.
        ClosedError
            If an operand was closed since :meth:`add`.
        PeerAccessError
            As for :func:`copy_batch`.
        """
        with self._lock:
            self._check_open()
            _kernels.check_method(method)
            check_bool(allow_pageable, "allow_pageable")
            for g in self._groups:
                g.refresh()
            _run(self._groups, stream, stream is None, allow_pageable, method, self._memo)

    def __repr__(self) -> str:
        return (f"<CopyBatch {len(self._groups)} pairs, {self.blocks} blocks, "
                f"{len(self)} copies, {self.nbytes} bytes>")
