"""``cuMemcpyBatchAsync`` through the gateway: exact class and CUresult.

Expected answers are named constants below. PROVISIONAL: they come from the
CUDA documentation and the H100's answers for ``cuMemPrefetchBatchAsync``
until ``scripts/probes/copy_batch_probe.py`` has run on the H100 (its cases
carry the same labels); then the constants follow that run and, where it
disagrees, the simulator (``cuda_memkit/sim/_copy_batch.py``) too. They run
on whichever backend is active. Cases that could crash a long-lived process
on a real driver (null, freed or unknown pointers, reads past a pinned
allocation) stay in the probe's isolated children and out of this suite.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit import _driver
from cuda_memkit._device import ensure_context

from ._helpers import Undo, outcome

R = cu.CUresult
ORD = cu.CUmemcpySrcAccessOrder
LT = cu.CUmemLocationType
P = cu.CUdeviceptr
BLK = 1 << 16  # bytes per block
API = "cuMemcpyBatchAsync"

Want = tuple[type[cm.CudaError], R] | None
OK: Want = None
INVALID: Want = (cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE)

# -- the driver's answers (PROVISIONAL until the probe: see the module docstring) ------------
COUNT0 = INVALID
NUMATTRS0 = INVALID
ATTRS_IDX_NOT_ZERO = INVALID  # attrsIdxs [1]
ATTRS_IDXS_REPEATED = INVALID  # [0, 0]: the documentation asks for increasing indices
ATTRS_IDXS_DECREASING = INVALID  # [0, 3, 1]
ATTRS_IDX_EQ_COUNT = INVALID  # [0, 4] with count 4
NUMATTRS_GT_COUNT = INVALID
ORDER: dict[str, Want] = {"INVALID": INVALID, "STREAM": OK, "DURING_API_CALL": OK, "ANY": OK,
                          "MAX": INVALID}
FLAGS: dict[int, Want] = {0: OK, 1: OK, 2: INVALID, 0x80000000: INVALID}
HINTS: dict[str, Want] = {"DEVICE0": OK, "DEVICE7": INVALID, "HOST": OK, "HOST_NUMA0": OK,
                          "HOST_NUMA_CURRENT": OK, "MAX": INVALID}
STREAMS: dict[str, Want] = {"legacy NULL stream 0": INVALID, "CU_STREAM_LEGACY (1)": INVALID,
                            "CU_STREAM_PER_THREAD (2)": OK, "blocking user stream": OK,
                            "non-blocking user stream": OK}
SIZE0_ENTRY = INVALID
DST_PAST_END = INVALID
UNALIGNED = OK
OVERLAPPING_DSTS = OK  # not checked: the copies run in no particular order
SRC_IS_OTHER_DST = OK
FAILED_BATCH_COPIES_NOTHING = True  # all or nothing: a refused batch copies no block
PAGEABLE: dict[str, Want] = {"STREAM": OK, "DURING_API_CALL": OK, "ANY": OK}

HINT_LOCATIONS = {
    "DEVICE0": (LT.CU_MEM_LOCATION_TYPE_DEVICE, 0),
    "DEVICE7": (LT.CU_MEM_LOCATION_TYPE_DEVICE, 7),
    "HOST": (LT.CU_MEM_LOCATION_TYPE_HOST, 0),
    "HOST_NUMA0": (LT.CU_MEM_LOCATION_TYPE_HOST_NUMA, 0),
    "HOST_NUMA_CURRENT": (LT.CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, 0),
    "MAX": (LT.CU_MEM_LOCATION_TYPE_MAX, 0),
}


def attrs(order: Any = ORD.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, flags: int = 0,
          src_hint: Any = None, dst_hint: Any = None) -> cu.CUmemcpyAttributes:
    a = cu.CUmemcpyAttributes()
    a.srcAccessOrder = order
    a.flags = flags
    for field, hint in (("srcLocHint", src_hint), ("dstLocHint", dst_hint)):
        if hint is not None:
            loc = cu.CUmemLocation()
            loc.type, loc.id = HINT_LOCATIONS[hint]
            setattr(a, field, loc)
    return a


@pytest.fixture
def undo() -> Iterator[Undo]:
    ensure_context(0)
    u = Undo()
    yield u
    _driver.call("cuCtxSynchronize")
    u.run()


class Rig:
    """8 blocks of device memory, 8 pinned (a pattern), a non-blocking stream."""

    def __init__(self, undo: Undo) -> None:
        self.dev = int(_driver.call("cuMemAlloc", 8 * BLK))
        undo("cuMemFree", self.dev)
        self.pin = int(_driver.call("cuMemHostAlloc", 8 * BLK, 0))
        undo("cuMemFreeHost", self.pin)
        self.s = int(_driver.call("cuStreamCreate", 1))
        undo("cuStreamDestroy", self.s)
        self.host = np.ctypeslib.as_array(
            (np.ctypeslib.ctypes.c_uint8 * (8 * BLK)).from_address(self.pin))
        self.host[:] = (np.arange(8 * BLK) % 253).astype(np.uint8)
        _driver.call("cuMemsetD8", self.dev, 0, 8 * BLK)
        self.dsts = [P(self.dev + i * BLK) for i in range(4)]
        self.srcs = [P(self.pin + i * BLK) for i in range(4)]
        self.sizes = [BLK] * 4

    def read(self, off: int, n: int) -> np.ndarray:
        out = np.empty(n, np.uint8)
        _driver.call("cuMemcpyDtoH", out, self.dev + off, n)
        return out

    def sync(self) -> None:
        _driver.call("cuStreamSynchronize", self.s)


@pytest.fixture
def rig(undo: Undo) -> Rig:
    return Rig(undo)


def go(rig: Rig, want: Want, *, dsts: Any = None, srcs: Any = None, sizes: Any = None,
       count: int | None = None, at: Any = None, idx: Any = None, nattrs: int | None = None,
       stream: Any = None) -> None:
    dsts = rig.dsts if dsts is None else dsts
    at = [attrs()] if at is None else at
    idx = [0] if idx is None else idx
    outcome(want, API, dsts, rig.srcs if srcs is None else srcs,
            rig.sizes if sizes is None else sizes, len(dsts) if count is None else count, at, idx,
            len(at) if nattrs is None else nattrs, rig.s if stream is None else stream)


# -- it works, and returns nothing (no failIdx in the 13.x form) ---------------------------


def test_batch_copies_and_returns_none(rig: Rig) -> None:
    assert _driver.call(API, rig.dsts[::-1], rig.srcs, rig.sizes, 4, [attrs()], [0], 1,
                        rig.s) is None
    rig.sync()
    got = rig.read(0, 4 * BLK).reshape(4, BLK)
    assert (got[::-1] == rig.host[:4 * BLK].reshape(4, BLK)).all()


def test_views_over_a_numpy_array_are_read_at_the_call(rig: Rig) -> None:
    slots = np.zeros(4, np.uint64)
    views = [P(_ptr=slots.ctypes.data + 8 * i) for i in range(4)]
    slots[:] = [int(p) for p in rig.dsts[::-1]]
    _driver.call(API, views, rig.srcs, rig.sizes, 4, [attrs()], [0], 1, rig.s)
    slots[:] = 0  # rewritten after the call: the driver took the values already
    rig.sync()
    assert (rig.read(3 * BLK, BLK) == rig.host[:BLK]).all()


def test_count_below_list_length_copies_a_prefix(rig: Rig) -> None:
    go(rig, OK, count=2)
    rig.sync()
    assert (rig.read(BLK, BLK) == rig.host[BLK:2 * BLK]).all()
    assert not rig.read(2 * BLK, BLK).any()


def test_tuples_are_accepted(rig: Rig) -> None:
    outcome(OK, API, tuple(rig.dsts), tuple(rig.srcs), tuple(rig.sizes), 4, (attrs(),), (0,), 1,
            rig.s)


# -- the bindings' own checks (before any driver call) -------------------------------------


def test_bindings_want_cudeviceptr_and_int_lists(rig: Rig) -> None:
    with pytest.raises(TypeError, match="'dsts'"):
        _driver.call(API, [int(p) for p in rig.dsts], rig.srcs, rig.sizes, 4, [attrs()], [0], 1,
                     rig.s)
    with pytest.raises(TypeError, match="'srcs'"):
        _driver.call(API, rig.dsts, [int(p) for p in rig.srcs], rig.sizes, 4, [attrs()], [0], 1,
                     rig.s)
    with pytest.raises(TypeError, match="'sizes'"):
        _driver.call(API, rig.dsts, rig.srcs, [np.uint64(BLK)] * 4, 4, [attrs()], [0], 1, rig.s)
    with pytest.raises(TypeError, match="'attrs'"):
        _driver.call(API, rig.dsts, rig.srcs, rig.sizes, 4, [1], [0], 1, rig.s)
    with pytest.raises(RuntimeError, match="too small"):
        _driver.call(API, rig.dsts, rig.srcs, rig.sizes, 5, [attrs()], [0], 1, rig.s)
    with pytest.raises(RuntimeError, match="too small"):
        _driver.call(API, rig.dsts, rig.srcs, rig.sizes[:3], 4, [attrs()], [0], 1, rig.s)
    with pytest.raises(RuntimeError, match="too small"):
        _driver.call(API, rig.dsts, rig.srcs, rig.sizes, 4, [attrs()], [0], 2, rig.s)
    with pytest.raises(OverflowError):
        _driver.call(API, rig.dsts, rig.srcs, [-1] * 4, 4, [attrs()], [0], 1, rig.s)


# -- the driver's rules ---------------------------------------------------------------------


def test_count_zero(rig: Rig) -> None:
    outcome(COUNT0, API, [], [], [], 0, [attrs()], [0], 1, rig.s)
    go(rig, COUNT0, count=0)


@pytest.mark.parametrize(("label", "want", "at", "idx"), [
    ("numAttrs 0", NUMATTRS0, [], []),
    ("attrsIdxs [1]", ATTRS_IDX_NOT_ZERO, [attrs()], [1]),
    ("attrsIdxs [0,2]", OK, [attrs(), attrs(ORD.CU_MEMCPY_SRC_ACCESS_ORDER_ANY)], [0, 2]),
    ("attrsIdxs [0,0]", ATTRS_IDXS_REPEATED, [attrs(), attrs()], [0, 0]),
    ("attrsIdxs [0,3,1]", ATTRS_IDXS_DECREASING, [attrs()] * 3, [0, 3, 1]),
    ("attrsIdxs [0,4] (== count)", ATTRS_IDX_EQ_COUNT, [attrs(), attrs()], [0, 4]),
    ("per-copy attrs", OK, [attrs() for _ in range(4)], [0, 1, 2, 3]),
    ("numAttrs 5 > count 4", NUMATTRS_GT_COUNT, [attrs() for _ in range(5)], [0, 1, 2, 3, 4]),
])
def test_attribute_indices(rig: Rig, label: str, want: Want, at: Any, idx: Any) -> None:
    go(rig, want, at=at, idx=idx)


@pytest.mark.parametrize("order", list(ORDER))
def test_source_access_order(rig: Rig, order: str) -> None:
    value = getattr(ORD, f"CU_MEMCPY_SRC_ACCESS_ORDER_{order}")
    go(rig, ORDER[order], at=[attrs(value)])


def test_unset_access_order_is_the_invalid_one(rig: Rig) -> None:
    go(rig, ORDER["INVALID"], at=[cu.CUmemcpyAttributes()])


@pytest.mark.parametrize("flags", list(FLAGS))
def test_flags(rig: Rig, flags: int) -> None:
    go(rig, FLAGS[flags], at=[attrs(flags=flags)])


@pytest.mark.parametrize("side", ["src", "dst"])
@pytest.mark.parametrize("hint", list(HINTS))
def test_location_hints(rig: Rig, side: str, hint: str) -> None:
    a = attrs(src_hint=hint) if side == "src" else attrs(dst_hint=hint)
    go(rig, HINTS[hint], at=[a])


@pytest.mark.parametrize("label", list(STREAMS))
def test_streams(rig: Rig, undo: Undo, label: str) -> None:
    handles = {"legacy NULL stream 0": 0, "CU_STREAM_LEGACY (1)": 1,
               "CU_STREAM_PER_THREAD (2)": 2, "non-blocking user stream": rig.s}
    if label == "blocking user stream":
        h = int(_driver.call("cuStreamCreate", 0))
        undo("cuStreamDestroy", h)
    else:
        h = handles[label]
    go(rig, STREAMS[label], stream=h)
    _driver.call("cuCtxSynchronize")


def test_sizes(rig: Rig) -> None:
    go(rig, SIZE0_ENTRY, sizes=[BLK, 0, BLK, BLK])
    go(rig, DST_PAST_END, dsts=[P(rig.dev + 8 * BLK - 4096)], srcs=[P(rig.pin)], sizes=[8192])
    go(rig, UNALIGNED, dsts=[P(rig.dev + 1)], srcs=[P(rig.pin + 3)], sizes=[1000])
    rig.sync()
    assert (rig.read(1, 1000) == rig.host[3:1003]).all()


def test_refused_batch_copies_nothing(rig: Rig) -> None:
    dsts = [P(rig.dev), P(rig.dev + BLK), P(rig.dev + 8 * BLK - 4096), P(rig.dev + 2 * BLK)]
    srcs = [P(rig.pin), P(rig.pin + BLK), P(rig.pin), P(rig.pin + 2 * BLK)]
    go(rig, DST_PAST_END, dsts=dsts, srcs=srcs)
    rig.sync()
    landed = [bool((rig.read(i * BLK, BLK) == rig.host[i * BLK:(i + 1) * BLK]).all())
              for i in range(3)]
    assert landed == [not FAILED_BATCH_COPIES_NOTHING] * 3


def test_overlaps_are_not_checked(rig: Rig) -> None:
    go(rig, OVERLAPPING_DSTS, dsts=[P(rig.dev), P(rig.dev)], srcs=[P(rig.pin), P(rig.pin + BLK)],
       sizes=[BLK, BLK])
    go(rig, SRC_IS_OTHER_DST, dsts=[P(rig.dev + BLK), P(rig.dev + 2 * BLK)],
       srcs=[P(rig.dev), P(rig.dev + BLK)], sizes=[BLK, BLK])
    rig.sync()


@pytest.mark.parametrize("order", list(PAGEABLE))
def test_pageable_host_memory(rig: Rig, order: str) -> None:
    value = getattr(ORD, f"CU_MEMCPY_SRC_ACCESS_ORDER_{order}")
    src = (np.arange(4 * BLK) % 241).astype(np.uint8)
    srcs = [P(src.ctypes.data + i * BLK) for i in range(4)]
    go(rig, PAGEABLE[order], srcs=srcs, at=[attrs(value)])
    rig.sync()
    if PAGEABLE[order] is OK:
        assert (rig.read(0, 4 * BLK) == src).all()
    dst = np.zeros(4 * BLK, np.uint8)
    go(rig, PAGEABLE[order], dsts=[P(dst.ctypes.data + i * BLK) for i in range(4)],
       srcs=rig.dsts, at=[attrs(value)])
    rig.sync()
    if PAGEABLE[order] is OK:
        assert (dst == src).all()


@pytest.mark.sim_only
def test_simulator_without_the_batch_call(rig: Rig, no_batch: None) -> None:
    with pytest.raises(cm.CudaDriverNotFoundError):
        _driver.call(API, rig.dsts, rig.srcs, rig.sizes, 4, [attrs()], [0], 1, rig.s)
