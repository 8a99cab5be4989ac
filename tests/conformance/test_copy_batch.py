"""``cuMemcpyBatchAsync`` through the gateway: exact class and CUresult.

Expected answers are named constants below, each from the H100's run of
``scripts/probes/copy_batch_probe.py`` (driver 580 / CUDA 13.0, cuda-bindings
13.3; the probe case is named next to each, as ``group: case``). The
simulator (``cuda_memkit/sim/_copy_batch.py``) follows the same answers. The
constants marked PROVISIONAL were not decided by the probe (it did not read
the data back after those refusals); the simulator's model stands for them
until a GPU run of this module confirms or corrects it.

Cases that crash the process on the H100 stay out of this suite: a freed
device pointer as a destination and an unknown address in the device window
as a source both end in SIGSEGV (``risky: ...``; the simulator raises
``SimulatedDriverCrash`` there, tested sim-only below). Null pointers, a
pinned source past its end and a 1 TiB size are clean ``INVALID_VALUE``
refusals after which the context keeps working (``risky: ...
cuCtxSynchronize#after: CUDA_SUCCESS``), so they are here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _driver

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

# -- the driver's answers (copy_batch_probe on the H100) --------------------------------------
COUNT0 = INVALID  # forms: count 0 (empty lists) / (lists len 4) / count 0, numAttrs 0
COUNT_BELOW_LIST_LENGTH = OK  # forms: count 2 (lists len 4)
NUMATTRS0 = INVALID  # forms: numAttrs 0
ATTRS_IDX_NOT_ZERO = INVALID  # forms: attrsIdxs [1]
ATTRS_IDXS_TWO = OK  # forms: attrsIdxs [0,2] (2 attrs)
ATTRS_IDXS_REPEATED = INVALID  # forms: attrsIdxs [0,0]
ATTRS_IDXS_DECREASING = INVALID  # forms: attrsIdxs [0,3,1] (not increasing)
ATTRS_IDX_EQ_COUNT = INVALID  # forms: attrsIdxs [0,4] (== count)
PER_COPY_ATTRS = OK  # forms: numAttrs 4 == count (per-copy attrs)
NUMATTRS_GT_COUNT = INVALID  # forms: numAttrs 5 > count 4
NUMATTRS_BELOW_LIST_LENGTH = OK  # forms: numAttrs 1 with 2 attrs listed
ORDER: dict[str, Want] = {  # forms: srcAccessOrder <name>
    "INVALID": INVALID, "STREAM": OK, "DURING_API_CALL": OK, "ANY": OK, "MAX": INVALID}
UNSET_ORDER = INVALID  # forms: default CUmemcpyAttributes() (order unset)
FLAGS: dict[int, Want] = {0: OK, 1: OK, 2: INVALID, 0x80000000: INVALID}  # forms: flags <hex>
HINTS: dict[str, Want] = {  # forms: srcLocHint <name> / dstLocHint <name> (same answers)
    "DEVICE0": OK, "DEVICE7": INVALID, "HOST": OK, "HOST_NUMA0": OK, "HOST_NUMA99": OK,
    "HOST_NUMA_CURRENT": OK, "MAX": INVALID}
STREAMS: dict[str, Want] = {  # forms: stream: <label>
    "legacy NULL stream 0": INVALID, "CU_STREAM_LEGACY (1)": INVALID,
    "CU_STREAM_PER_THREAD (2)": OK, "blocking user stream": OK, "non-blocking user stream": OK}
SIZE0_ENTRY = INVALID  # forms: a size-0 entry
ALL_SIZES0 = INVALID  # forms: all sizes 0
DST_PAST_END = INVALID  # forms: dst range past the end of its allocation
PINNED_SRC_PAST_END = INVALID  # risky: pinned src range past its end
HUGE_SIZE = INVALID  # risky: size 1<<40 device->device
NULL_DST = INVALID  # risky: null dst pointer
NULL_SRC = INVALID  # risky: null src pointer
UNALIGNED = OK  # forms: unaligned dst+1 src+3 size 1000
OVERLAPPING_DSTS = OK  # forms: overlapping destinations (same 1 MiB twice): not checked
SRC_IS_OTHER_DST = OK  # forms: src of one copy = dst of another (D2D chain)
SAME_COPY_TWICE = OK  # forms: the same copy twice
IN_PLACE = OK  # forms: src and dst the same range (in place)
#: Which of copies 0, 1 and 3 land when copy 2 of 4 is refused (past the end):
#: the entries before the refused one are made, the ones after it are not
#: (data: "after failed batch: copies 0,1,3 landed: [True, True, False]").
REFUSED_BATCH_LANDED = (True, True, False)
#: PROVISIONAL (not read back by the probe): a size-0 entry at index 1 keeps
#: copy 0 and drops copies 2 and 3, like the past-the-end refusal above. If the
#: H100 answers (False, False, False), set the simulator's
#: SIZE0_AND_NULL_REFUSED_UP_FRONT to True.
SIZE0_REFUSAL_LANDED = (True, False, False)
#: PROVISIONAL (not read back by the probe): a refusal of the call's arguments
#: (here an attribute with an unset access order) copies nothing.
ARGUMENT_REFUSAL_COPIES_NOTHING = True
PAGEABLE: dict[str, Want] = {  # data: pageable src H2D / pageable dst D2H, order <name>
    "STREAM": OK, "DURING_API_CALL": OK, "ANY": OK}
#: The bindings check the element types of srcs before dsts
#: (forms: ints instead of CUdeviceptr -> "Argument 'srcs' ...", both were ints).
FIRST_LIST_CHECKED = "srcs"

HINT_LOCATIONS = {
    "DEVICE0": (LT.CU_MEM_LOCATION_TYPE_DEVICE, 0),
    "DEVICE7": (LT.CU_MEM_LOCATION_TYPE_DEVICE, 7),
    "HOST": (LT.CU_MEM_LOCATION_TYPE_HOST, 0),
    "HOST_NUMA0": (LT.CU_MEM_LOCATION_TYPE_HOST_NUMA, 0),
    "HOST_NUMA99": (LT.CU_MEM_LOCATION_TYPE_HOST_NUMA, 99),
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
    # forms: returned_tuple_len 1, returned ['CUDA_SUCCESS']; ok_data True
    assert _driver.call(API, rig.dsts[::-1], rig.srcs, rig.sizes, 4, [attrs()], [0], 1,
                        rig.s) is None
    rig.sync()
    got = rig.read(0, 4 * BLK).reshape(4, BLK)
    assert (got[::-1] == rig.host[:4 * BLK].reshape(4, BLK)).all()


def test_views_over_a_numpy_array_are_read_at_the_call(rig: Rig) -> None:
    # forms: CUdeviceptr views (_ptr=) over numpy; views_follow_the_array True
    slots = np.zeros(4, np.uint64)
    views = [P(_ptr=slots.ctypes.data + 8 * i) for i in range(4)]
    slots[:] = [int(p) for p in rig.dsts[::-1]]
    _driver.call(API, views, rig.srcs, rig.sizes, 4, [attrs()], [0], 1, rig.s)
    slots[:] = 0  # rewritten after the call: the driver took the values already
    rig.sync()
    assert (rig.read(3 * BLK, BLK) == rig.host[:BLK]).all()


def test_count_below_list_length_copies_a_prefix(rig: Rig) -> None:
    go(rig, COUNT_BELOW_LIST_LENGTH, count=2)
    rig.sync()
    assert (rig.read(BLK, BLK) == rig.host[BLK:2 * BLK]).all()
    assert not rig.read(2 * BLK, BLK).any()


def test_tuples_are_accepted(rig: Rig) -> None:
    # forms: tuples instead of lists
    outcome(OK, API, tuple(rig.dsts), tuple(rig.srcs), tuple(rig.sizes), 4, (attrs(),), (0,), 1,
            rig.s)


# -- the bindings' own checks (before any driver call) -------------------------------------


def test_bindings_want_cudeviceptr_and_int_lists(rig: Rig) -> None:
    ints_d, ints_s = [int(p) for p in rig.dsts], [int(p) for p in rig.srcs]
    with pytest.raises(TypeError, match=f"'{FIRST_LIST_CHECKED}'"):  # both lists are ints
        _driver.call(API, ints_d, ints_s, rig.sizes, 4, [attrs()], [0], 1, rig.s)
    with pytest.raises(TypeError, match="'dsts'"):
        _driver.call(API, ints_d, rig.srcs, rig.sizes, 4, [attrs()], [0], 1, rig.s)
    with pytest.raises(TypeError, match="'srcs'"):
        _driver.call(API, rig.dsts, ints_s, rig.sizes, 4, [attrs()], [0], 1, rig.s)
    with pytest.raises(TypeError, match="'sizes'"):  # forms: numpy ints in sizes
        _driver.call(API, rig.dsts, rig.srcs, [np.uint64(BLK)] * 4, 4, [attrs()], [0], 1, rig.s)
    with pytest.raises(TypeError, match="'attrs'"):
        _driver.call(API, rig.dsts, rig.srcs, rig.sizes, 4, [1], [0], 1, rig.s)
    with pytest.raises(RuntimeError, match="too small: 4 < 5"):  # forms: count 5 (lists len 4)
        _driver.call(API, rig.dsts, rig.srcs, rig.sizes, 5, [attrs()], [0], 1, rig.s)
    with pytest.raises(RuntimeError, match="too small: 3 < 4"):  # forms: sizes len 3, count 4
        _driver.call(API, rig.dsts, rig.srcs, rig.sizes[:3], 4, [attrs()], [0], 1, rig.s)
    with pytest.raises(RuntimeError, match="too small"):
        _driver.call(API, rig.dsts, rig.srcs, rig.sizes, 4, [attrs()], [0], 2, rig.s)
    with pytest.raises(OverflowError):
        _driver.call(API, rig.dsts, rig.srcs, [-1] * 4, 4, [attrs()], [0], 1, rig.s)


# -- the driver's rules ---------------------------------------------------------------------


def test_count_zero(rig: Rig) -> None:
    outcome(COUNT0, API, [], [], [], 0, [attrs()], [0], 1, rig.s)
    go(rig, COUNT0, count=0)
    outcome(COUNT0, API, [], [], [], 0, [], [], 0, rig.s)


@pytest.mark.parametrize(("label", "want", "at", "idx", "nattrs"), [
    ("numAttrs 0", NUMATTRS0, [], [], None),
    ("attrsIdxs [1]", ATTRS_IDX_NOT_ZERO, [attrs()], [1], None),
    ("attrsIdxs [0,2]", ATTRS_IDXS_TWO,
     [attrs(), attrs(ORD.CU_MEMCPY_SRC_ACCESS_ORDER_ANY)], [0, 2], None),
    ("attrsIdxs [0,0]", ATTRS_IDXS_REPEATED, [attrs(), attrs()], [0, 0], None),
    ("attrsIdxs [0,3,1]", ATTRS_IDXS_DECREASING, [attrs()] * 3, [0, 3, 1], None),
    ("attrsIdxs [0,4] (== count)", ATTRS_IDX_EQ_COUNT, [attrs(), attrs()], [0, 4], None),
    ("per-copy attrs", PER_COPY_ATTRS, [attrs() for _ in range(4)], [0, 1, 2, 3], None),
    ("numAttrs 5 > count 4", NUMATTRS_GT_COUNT, [attrs() for _ in range(5)], [0, 1, 2, 3, 4],
     None),
    ("numAttrs 1 with 2 attrs listed", NUMATTRS_BELOW_LIST_LENGTH, [attrs(), attrs()], [0, 2],
     1),
])
def test_attribute_indices(rig: Rig, label: str, want: Want, at: Any, idx: Any,
                           nattrs: int | None) -> None:
    go(rig, want, at=at, idx=idx, nattrs=nattrs)


@pytest.mark.parametrize("order", list(ORDER))
def test_source_access_order(rig: Rig, order: str) -> None:
    value = getattr(ORD, f"CU_MEMCPY_SRC_ACCESS_ORDER_{order}")
    go(rig, ORDER[order], at=[attrs(value)])


def test_unset_access_order_is_refused(rig: Rig) -> None:
    go(rig, UNSET_ORDER, at=[cu.CUmemcpyAttributes()])


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
    go(rig, ALL_SIZES0, sizes=[0] * 4)
    go(rig, DST_PAST_END, dsts=[P(rig.dev + 8 * BLK - 4096)], srcs=[P(rig.pin)], sizes=[8192])
    go(rig, UNALIGNED, dsts=[P(rig.dev + 1)], srcs=[P(rig.pin + 3)], sizes=[1000])
    rig.sync()
    assert (rig.read(1, 1000) == rig.host[3:1003]).all()


def test_bad_ranges_the_driver_refuses_cleanly(rig: Rig) -> None:
    go(rig, NULL_DST, dsts=[P(0)], srcs=[P(rig.pin)], sizes=[4096])
    go(rig, NULL_SRC, dsts=[P(rig.dev)], srcs=[P(0)], sizes=[4096])
    go(rig, PINNED_SRC_PAST_END, dsts=[P(rig.dev)], srcs=[P(rig.pin + 8 * BLK - 4096)],
       sizes=[8192])
    go(rig, HUGE_SIZE, dsts=[P(rig.dev)], srcs=[P(rig.dev + BLK)], sizes=[1 << 40])
    rig.sync()
    _driver.call("cuCtxSynchronize")  # the context still works (risky: ...#after)


def _landed(rig: Rig, blocks: tuple[int, ...]) -> tuple[bool, ...]:
    rig.sync()
    return tuple(bool((rig.read(i * BLK, BLK) == rig.host[i * BLK:(i + 1) * BLK]).all())
                 for i in blocks)


def test_refused_entry_keeps_the_copies_before_it(rig: Rig) -> None:
    # data: 4 copies, the third past the end
    dsts = [P(rig.dev), P(rig.dev + BLK), P(rig.dev + 8 * BLK - 4096), P(rig.dev + 2 * BLK)]
    srcs = [P(rig.pin), P(rig.pin + BLK), P(rig.pin), P(rig.pin + 2 * BLK)]
    go(rig, DST_PAST_END, dsts=dsts, srcs=srcs)
    # blocks 0, 1 and 2 of the device buffer receive copies 0, 1 and 3
    assert _landed(rig, (0, 1, 2)) == REFUSED_BATCH_LANDED


def test_size0_entry_keeps_the_copies_before_it(rig: Rig) -> None:
    go(rig, SIZE0_ENTRY, sizes=[BLK, 0, BLK, BLK])  # PROVISIONAL answer: see the constant
    assert _landed(rig, (0, 2, 3)) == SIZE0_REFUSAL_LANDED


@pytest.mark.sim_only
def test_simulator_switch_for_up_front_size0_refusal(rig: Rig,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The other model of the provisional answer, one constant away in the simulator."""
    from cuda_memkit.sim import _copy_batch as sim_batch

    monkeypatch.setattr(sim_batch, "SIZE0_AND_NULL_REFUSED_UP_FRONT", True)
    go(rig, SIZE0_ENTRY, sizes=[BLK, 0, BLK, BLK])
    assert _landed(rig, (0, 2, 3)) == (False, False, False)


def test_refused_arguments_copy_nothing(rig: Rig) -> None:
    go(rig, UNSET_ORDER, at=[cu.CUmemcpyAttributes()])  # PROVISIONAL answer: see the constant
    assert _landed(rig, (0, 1, 2, 3)) == (not ARGUMENT_REFUSAL_COPIES_NOTHING,) * 4


def test_overlaps_and_aliasing_are_not_checked(rig: Rig) -> None:
    go(rig, OVERLAPPING_DSTS, dsts=[P(rig.dev), P(rig.dev)], srcs=[P(rig.pin), P(rig.pin + BLK)],
       sizes=[BLK, BLK])
    go(rig, SRC_IS_OTHER_DST, dsts=[P(rig.dev + BLK), P(rig.dev + 2 * BLK)],
       srcs=[P(rig.dev), P(rig.dev + BLK)], sizes=[BLK, BLK])
    go(rig, SAME_COPY_TWICE, dsts=[P(rig.dev), P(rig.dev)], srcs=[P(rig.pin), P(rig.pin)],
       sizes=[BLK, BLK])
    go(rig, IN_PLACE, dsts=[P(rig.dev)], srcs=[P(rig.dev)], sizes=[BLK])
    rig.sync()
    assert (rig.read(0, BLK) == rig.host[:BLK]).all()  # the same copy twice, then in place


@pytest.mark.parametrize("order", list(PAGEABLE))
def test_pageable_host_memory(rig: Rig, order: str) -> None:
    value = getattr(ORD, f"CU_MEMCPY_SRC_ACCESS_ORDER_{order}")
    src = (np.arange(4 * BLK) % 241).astype(np.uint8)
    srcs = [P(src.ctypes.data + i * BLK) for i in range(4)]
    go(rig, PAGEABLE[order], srcs=srcs, at=[attrs(value)])
    rig.sync()
    assert (rig.read(0, 4 * BLK) == src).all()
    dst = np.zeros(4 * BLK, np.uint8)
    go(rig, PAGEABLE[order], dsts=[P(dst.ctypes.data + i * BLK) for i in range(4)],
       srcs=rig.dsts, at=[attrs(value)])
    rig.sync()
    assert (dst == src).all()


@pytest.mark.sim_only
def test_simulator_without_the_batch_call(rig: Rig, no_batch: None) -> None:
    with pytest.raises(cm.CudaDriverNotFoundError):
        _driver.call(API, rig.dsts, rig.srcs, rig.sizes, 4, [attrs()], [0], 1, rig.s)


@pytest.mark.sim_only
@pytest.mark.parametrize("role", ["freed device pointer as dst",
                                  "unknown address in the device window as src"])
def test_simulator_crashes_where_the_h100_does(rig: Rig, role: str) -> None:
    from cuda_memkit.sim._copy_batch import SimulatedDriverCrash

    if role.startswith("freed"):
        q = int(_driver.call("cuMemAlloc", BLK))
        _driver.call("cuMemFree", q)
        dsts, srcs = [P(q)], [P(rig.pin)]
    else:
        dsts, srcs = [P(rig.dev)], [P(rig.dev + (64 << 30))]
    with pytest.raises(SimulatedDriverCrash, match="SIGSEGV"):
        _driver.call(API, dsts, srcs, [BLK], 1, [attrs()], [0], 1, rig.s)
