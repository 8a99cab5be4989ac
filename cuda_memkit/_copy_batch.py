"""Batched copies: many blocks between buffers in one driver call.

* :func:`copy_batch` copies blocks given as arrays of byte offsets and sizes
  (or ``(dst_offset, src_offset, size)`` triples) between two buffers of any
  kind; :class:`CopyBatch` gathers several such pairs (e.g. the two
  directions of a KV-cache swap) into one batch.
* Everything is checked with numpy before anything is issued (integer
  arrays, lengths, bounds, overlapping destinations, a source overlapping
  another block's destination, pageable memory in a stream-ordered copy);
  blocks contiguous on both sides are merged; the blocks go to one
  ``cuMemcpyBatchAsync`` call where the driver has it (CUDA >= 12.8 with the
  13.x form), and to a loop of ``cuMemcpyAsync`` where it does not.
* No per-block Python object is built on the fast path: the ``CUdeviceptr``
  lists the bindings want are views (``CUdeviceptr(_ptr=...)``) over a
  per-thread numpy array, made once and rewritten in place per call.
* Operands of a stream-ordered batch are kept alive until the stream has
  finished it, as :func:`copy_async` does.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from . import _driver
from ._device import StreamLike, as_location, stream_handle
from ._errors import CudaDriverNotFoundError
from ._operands import (
    HOST,
    RAW,
    is_pinned_host,
    keep_alive,
    need_context,
    operand,
    pending_operands,
    reap_pending,
)

if TYPE_CHECKING:
    import numpy as np

    from ._device import LocationLike

__all__ = ["CopyBatch", "copy_batch"]

#: Largest number of copies in one ``cuMemcpyBatchAsync`` call; more are split
#: into several calls. PROVISIONAL until scripts/probes/copy_batch_probe.py
#: (counts up to 262144 were not yet tried on the H100).
CALL_MAX = 1 << 16
#: Copies no larger than this get ``CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE``
#: (RMM and cuDF use 128 KiB). PROVISIONAL: 0 (flag off) until the probe has
#: measured the flag on the H100.
OVERLAP_FLAG_MAX_BLOCK = 0

_STREAM_PER_THREAD = 0x2
_LEGACY = (0, 0x1)
_I64_MAX = (1 << 63) - 1


# -- argument checks --------------------------------------------------------------------


def _int_array(value: Any, what: str) -> np.ndarray[Any, Any]:
    """A 1-D int64 array of non-negative integers from an array-like."""
    import numpy as np

    if isinstance(value, (str, bytes)):
        raise TypeError(f"{what} must be an array of integers, not {type(value).__name__}")
    a = np.asarray(value)
    if a.ndim != 1:
        raise ValueError(f"{what} must be one-dimensional, got shape {a.shape}")
    kind = a.dtype.kind
    if kind not in "iu":
        if a.size == 0 and kind in "fO":  # np.asarray([]) is float64
            return np.zeros(0, np.int64)
        raise TypeError(f"{what} must be an array of integers, not {a.dtype}")
    if a.size and kind == "u" and a.dtype.itemsize == 8 and int(a.max()) > _I64_MAX:
        raise ValueError(f"{what} holds a value above 2**63 - 1")
    a = a.astype(np.int64, copy=False)
    if a.size and int(a.min()) < 0:
        i = int(np.flatnonzero(a < 0)[0])
        raise ValueError(f"{what}[{i}] is negative ({int(a[i])})")
    return a


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
    """The three int64 arrays (dst offsets, src offsets, sizes) of a batch, checked."""
    import numpy as np

    if blocks is not None:
        if dst_offsets is not None or src_offsets is not None or sizes is not None:
            raise TypeError("pass either blocks= or dst_offsets=/src_offsets=/sizes=, not both")
        if isinstance(blocks, (str, bytes)):
            raise TypeError("blocks must be (dst_offset, src_offset, size) triples")
        b = np.asarray(blocks)
        if b.size == 0:
            z = np.zeros(0, np.int64)
            return z, z, z
        if b.ndim != 2 or b.shape[1] != 3:
            raise ValueError(
                f"blocks must be (dst_offset, src_offset, size) triples (shape (n, 3)), "
                f"got shape {b.shape}")
        flat = _int_array(b.reshape(-1), "blocks").reshape(-1, 3)
        return flat[:, 0], flat[:, 1], flat[:, 2]
    if dst_offsets is None or src_offsets is None or sizes is None:
        raise TypeError("copy_batch needs dst_offsets=, src_offsets= and sizes= (or blocks=)")
    d = _int_array(dst_offsets, "dst_offsets")
    s = _int_array(src_offsets, "src_offsets")
    if len(d) != len(s):
        raise ValueError(f"dst_offsets has {len(d)} entries, src_offsets {len(s)}")
    one = _scalar_size(sizes)
    if one is not None:
        z = np.full(len(d), one, np.int64)
    else:
        z = _int_array(sizes, "sizes")
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


# -- one (dst, src) pair --------------------------------------------------------------


class _Group:
    """The checked, coalesced blocks of one (destination, source) pair."""

    __slots__ = ("blocks", "d", "dst", "dst_hint", "dst_op", "nbytes", "s", "src",
                 "src_hint", "src_op", "z")

    def __init__(self, dst: Any, src: Any, dst_offsets: Any, src_offsets: Any, sizes: Any,
                 blocks: Any, src_location: Any, dst_location: Any) -> None:
        import numpy as np

        self.dst, self.src = dst, src
        self.dst_op = operand(dst, True)
        self.src_op = operand(src, False)
        self.src_hint = None if src_location is None else as_location(src_location)
        self.dst_hint = None if dst_location is None else as_location(dst_location)
        d, s, z = _block_arrays(dst_offsets, src_offsets, sizes, blocks)
        _check_bounds(d, z, self.dst_op[1], "destination")
        _check_bounds(s, z, self.src_op[1], "source")
        self.blocks = len(z)
        keep = z > 0  # zero-size blocks are skipped (the driver refuses them)
        if not keep.all():
            idx = np.flatnonzero(keep)
            d, s, z = d[idx], s[idx], z[idx]
        else:
            idx = None
        # Sort by destination (a batch has no order), refuse overlapping
        # destinations, merge blocks contiguous on both sides.
        if len(d) > 1 and not (d[1:] >= d[:-1]).all():
            order = np.argsort(d)
            d, s, z = d[order], s[order], z[order]
            idx = order if idx is None else idx[order]
        if len(d) > 1:
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
        self.d, self.s, self.z = d, s, z
        self.nbytes = int(z.sum()) if len(z) else 0
        for op, role in ((self.dst_op, "destination"), (self.src_op, "source")):
            if self.nbytes and op[0] == 0:
                raise ValueError(f"the copy_batch {role} is a null pointer")

    def refresh(self) -> None:
        """Resolve the operands again (a closed buffer raises ClosedError)."""
        self.dst_op = operand(self.dst, True)
        self.src_op = operand(self.src, False)

    def pageable(self) -> str | None:
        """Which operand is pageable host memory ("destination"/"source"), if any."""
        for op, role in ((self.dst_op, "destination"), (self.src_op, "source")):
            if op[3] == HOST and op[1] and not is_pinned_host(op[4]):
                return role
        return None

    def addresses(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Absolute destination and source addresses (uint64)."""
        import numpy as np

        u = np.uint64
        return (self.d.astype(u) + u(self.dst_op[0]), self.s.astype(u) + u(self.src_op[0]))


def _check_hazards(groups: list[_Group]) -> None:
    """No destination may overlap another block's destination or any source."""
    import numpy as np

    pairs = [g.addresses() for g in groups if len(g.z)]
    if not pairs:
        return
    zs = [g.z.astype(np.uint64) for g in groups if len(g.z)]
    ds = np.concatenate([p[0] for p in pairs])
    ss = np.concatenate([p[1] for p in pairs])
    z = np.concatenate(zs)
    if len(groups) > 1:  # within one group this was checked on offsets
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
    # STREAM: the source is read in stream order, like cuMemcpyAsync. PROVISIONAL for
    # pageable sources too: the probe measures DURING_API_CALL and ANY against it.
    a.srcAccessOrder = CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    if OVERLAP_FLAG_MAX_BLOCK and len(g.z) and int(g.z.max()) <= OVERLAP_FLAG_MAX_BLOCK:
        a.flags = 1  # CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE
    if g.src_hint is not None:
        a.srcLocHint = g.src_hint.to_cu()
    if g.dst_hint is not None:
        a.dstLocHint = g.dst_hint.to_cu()
    return a


def _issue_batch(groups: list[_Group], stream: int) -> None:
    """One ``cuMemcpyBatchAsync`` per CALL_MAX copies; one attrs entry per group."""
    import numpy as np

    live = [g for g in groups if len(g.z)]
    addrs = [g.addresses() for g in live]
    dst = np.concatenate([a[0] for a in addrs]) if len(addrs) > 1 else addrs[0][0]
    src = np.concatenate([a[1] for a in addrs]) if len(addrs) > 1 else addrs[0][1]
    z = np.concatenate([g.z for g in live]) if len(live) > 1 else live[0].z
    starts = np.cumsum([0] + [len(g.z) for g in live])
    attrs = [_attrs(g) for g in live]
    total = len(z)
    uniform = bool((z == z[0]).all())
    call = _driver.call
    for a in range(0, total, CALL_MAX):
        b = min(a + CALL_MAX, total)
        n = b - a
        dl, sl, shared = _ptr_lists(dst[a:b], src[a:b])
        sizes = [int(z[a])] * n if uniform else z[a:b].tolist()
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


def _run(groups: list[_Group], stream: StreamLike, sync: bool, allow_pageable: bool) -> None:
    """Check across groups, then issue the batch (or the loop) on the stream."""
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
    _check_hazards(groups)
    if not any(g.nbytes for g in groups):
        return
    if pending_operands:
        reap_pending()
    need_context()
    # The batch call refuses the legacy stream: issue on the per-thread default
    # stream, a blocking stream, which the legacy stream waits for and which
    # waits for it (the same ordering as work on the legacy stream).
    issue_on = _STREAM_PER_THREAD if h in _LEGACY else h
    try:
        _issue_batch(groups, issue_on)
    except CudaDriverNotFoundError:  # a driver without cuMemcpyBatchAsync
        issue_on = h
        _issue_loop(groups, issue_on)
    if sync:
        _driver.call("cuStreamSynchronize", issue_on)
        return
    refs = tuple(x for g in groups for x, op in ((g.dst, g.dst_op), (g.src, g.src_op))
                 if op[3] != RAW)
    if refs:
        keep_alive(h, refs)


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
) -> Any:
    """Copy many blocks from ``src`` to ``dst`` in one batched driver call.

    Block ``i`` copies ``sizes[i]`` bytes from byte ``src_offsets[i]`` of
    ``src`` to byte ``dst_offsets[i]`` of ``dst``. Everything is checked
    before anything is issued; blocks contiguous in both buffers are merged;
    the copies go to one ``cuMemcpyBatchAsync`` (a loop of ``cuMemcpyAsync``
    on drivers without it). The blocks of a batch run in no particular order.

    Without ``stream`` the copy is synchronous (complete on return, ordered
    like :func:`copy`); with ``stream`` it is ordered on that stream and
    returns at once, keeping the operands alive until the stream is done.

    Parameters
    ----------
    dst, src : buffer, array or pointer
        Anything :func:`copy` accepts: :class:`HostBuffer`,
        :class:`DeviceBuffer`, pool, managed or growable buffers, a
        registered or plain C-contiguous numpy array, an object with
        ``__cuda_array_interface__``, or an int address (not bounds-checked).
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

    Returns
    -------
    dst

    Raises
    ------
    TypeError
        Non-integer offset or size arrays, both or neither of ``blocks`` and
        the arrays, operands that are not memory.
    ValueError
        Arrays of different lengths, negative offsets or sizes, a block past
        the end of its buffer, overlapping destination blocks, a source block
        overlapping a destination block, read-only destinations, pageable
        memory in a stream-ordered batch without ``allow_pageable``.
    ClosedError
        If an operand is closed.
    CudaError
        If the driver refuses the batch (e.g. an int address that is not
        memory).

    Examples
    --------
    >>> host = cm.HostBuffer.empty(64 << 20)
    >>> dev = cm.DeviceBuffer.alloc(64 << 20)
    >>> slots = np.array([7, 2, 9]) * (1 << 20)
    >>> cm.copy_batch(dev, host, dst_offsets=slots, src_offsets=[0, 1 << 20, 2 << 20],
    ...               sizes=1 << 20)
    """
    g = _Group(dst, src, dst_offsets, src_offsets, sizes, blocks, src_location, dst_location)
    _run([g], stream, stream is None, allow_pageable)
    return dst


class CopyBatch:
    """Several (destination, source) block lists issued as one batch.

    Each :meth:`add` is checked like :func:`copy_batch`; :meth:`execute` also
    checks across the pairs (no two blocks may write overlapping memory, no
    source may overlap a destination) and issues every block in one
    ``cuMemcpyBatchAsync``, with one attribute entry per pair. Use it for the
    two directions of a swap whose blocks do not alias (evict to host while
    loading other blocks into free device slots), or to build once and run
    several times.

    Examples
    --------
    >>> b = cm.CopyBatch()
    >>> b.add(host_cache, dev_cache, dst_offsets=out_slots, src_offsets=evict, sizes=BLOCK)
    >>> b.add(dev_cache, host_cache, dst_offsets=free, src_offsets=load, sizes=BLOCK)
    >>> b.execute(stream=s)
    """

    def __init__(self) -> None:
        self._groups: list[_Group] = []

    def add(self, dst: Any, src: Any, *, dst_offsets: Any = None, src_offsets: Any = None,
            sizes: Any = None, blocks: Any = None, src_location: LocationLike | None = None,
            dst_location: LocationLike | None = None) -> CopyBatch:
        """Add the blocks of one (destination, source) pair; arguments as :func:`copy_batch`.

        Returns
        -------
        CopyBatch
            This batch (chainable).
        """
        self._groups.append(_Group(dst, src, dst_offsets, src_offsets, sizes, blocks,
                                   src_location, dst_location))
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

    def execute(self, stream: StreamLike = None, *, allow_pageable: bool = False) -> None:
        """Issue the batch: synchronous without ``stream``, else ordered on it.

        Parameters
        ----------
        stream : Stream, int or stream-like, optional
            As for :func:`copy_batch`.
        allow_pageable : bool, default False
            As for :func:`copy_batch`.

        Raises
        ------
        ValueError
            Blocks of different pairs writing overlapping memory, a source
            overlapping a destination, pageable memory (as :func:`copy_batch`).
        ClosedError
            If an operand was closed since :meth:`add`.
        """
        for g in self._groups:
            g.refresh()
        _run(self._groups, stream, stream is None, allow_pageable)

    def __repr__(self) -> str:
        return (f"<CopyBatch {len(self._groups)} pairs, {self.blocks} blocks, "
                f"{len(self)} copies, {self.nbytes} bytes>")
