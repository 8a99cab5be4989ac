"""Simulated ``cuMemcpyBatchAsync`` (CUDA >= 12.8; the 13.x form without ``failIdx``).

``cuMemcpyBatchAsync(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, hStream)``
answers as the H100 did in ``scripts/probes/copy_batch_probe.py`` (driver
580 / CUDA 13.0, cuda-bindings 13.3; the probe case is named next to each
rule below, as ``group: case``).

The bindings' own checks come first, in their order (cuda-bindings 13.x,
read off the bindings without a driver; the probe's ``forms: ints instead
of CUdeviceptr`` confirms that ``srcs`` is checked before ``dsts``):

1. ``count``, ``numAttrs`` and ``hStream`` are converted (a negative value
   is an ``OverflowError``, a non-integer stream a ``TypeError``);
2. the element types of ``attrsIdxs``, ``attrs``, ``sizes``, ``srcs``,
   ``dsts``, in that order (``TypeError`` "Argument 'srcs' is not instance
   of type ..."; numpy integers are not ints: ``forms: numpy ints in sizes``);
3. every element of ``sizes`` as ``size_t`` (``OverflowError``), then
   ``dsts``, ``srcs``, ``sizes`` at least ``count`` long
   (``RuntimeError`` "List is too small: 4 < 5": ``forms: count 5 (lists len
   4)``, ``sizes len 3, count 4``);
4. every element of ``attrsIdxs`` as ``size_t``, then ``attrs`` and
   ``attrsIdxs`` at least ``numAttrs`` long. Longer lists are fine: only the
   first ``count`` / ``numAttrs`` entries are read (``forms: count 2 (lists
   len 4)``, ``numAttrs 1 with 2 attrs listed``).

Then the driver's rules. Refusals of the whole call (``CUDA_ERROR_INVALID_VALUE``;
the simulator copies nothing, which ``tests/conformance/test_copy_batch.py``
checks on the GPU):

* ``count == 0`` (``forms: count 0 ...``); the legacy default stream, handle
  0 or ``CU_STREAM_LEGACY`` (``forms: stream: ...``; the per-thread stream 2
  is accepted);
* ``numAttrs == 0`` or ``numAttrs > count``; ``attrsIdxs[0] != 0``; indices
  not strictly increasing or not below ``count`` (``forms: numAttrs 0``,
  ``attrsIdxs [1]``, ``[0,0]``, ``[0,3,1]``, ``[0,4] (== count)``,
  ``numAttrs 5 > count 4``);
* an attribute whose ``srcAccessOrder`` is not STREAM, DURING_API_CALL or
  ANY (``forms: srcAccessOrder INVALID``/``MAX``, ``default
  CUmemcpyAttributes()``), whose ``flags`` has bits other than
  PREFER_OVERLAP_WITH_COMPUTE (``flags 0x2``, ``0x80000000``), or whose
  location hints are not NONE, an existing device or a host kind (any NUMA
  id is accepted: ``srcLocHint HOST_NUMA99``; ``DEVICE7``, ``MAX`` are not).

Then the copies, one entry after the other, in list order (the stream
completes at once in the simulator). An entry is refused with
``CUDA_ERROR_INVALID_VALUE`` for size 0 (``forms: a size-0 entry``, ``all
sizes 0``), a null pointer (``risky: null dst/src pointer``) or a range that
starts in an allocation and runs past its end (``forms: dst range past the
end of its allocation``, ``risky: pinned src range past its end``, ``size
1<<40 device->device``). **The entries before a refused one have been
copied; it and the ones after it have not** (``data: 4 copies, the third
past the end``: copies 0 and 1 landed, copy 3 did not; which bytes of the
refused entry itself land is unknown -- the simulator copies none. The
simulator refuses size-0 entries and null pointers the same way, entry by
entry, and the conformance suite checks that on the GPU;
``SIZE0_AND_NULL_REFUSED_UP_FRONT`` switches to the other model).

**Crashes.** On the H100 an entry whose source or destination lies in the
device address window but in no allocation (a freed device pointer as
destination: ``risky: freed device pointer as dst``; an unknown address as
source: ``risky: unknown address in the device window as src``) kills the
process with SIGSEGV. The simulator raises :class:`SimulatedDriverCrash`
there instead of returning an error, so that a test driving the library into
such a call fails loudly instead of passing on the simulator and crashing
the GPU run. cuda_memkit never makes that call for operands whose extents it
knows; raw int addresses are trusted.

Other addresses outside the allocation table are pageable host memory,
trusted like the driver does (``data: pageable src/dst ...`` succeed in
every source access order). Overlapping destinations are not refused
(``forms: overlapping destinations``); where they overlap, the last copy in
the list wins here, as it did in the H100's one sample
(``overlap_winner_bytes: [2]``), though the driver promises no order.

``MACHINE.batch_calls = False`` makes the function raise
``FunctionNotFoundError`` (a driver without the call).
"""

from __future__ import annotations

import itertools
from typing import Any

from cuda.bindings import driver as cu

from . import _state as S
from ._state import DEVICE_VA_BASE, DEVICE_VA_END, Fail, R, api, memmove

__all__ = ["SimulatedDriverCrash", "cuMemcpyBatchAsync"]

#: Accepted ``srcAccessOrder`` values: STREAM, DURING_API_CALL, ANY
#: (``forms: srcAccessOrder STREAM/DURING_API_CALL/ANY`` succeed; INVALID (0),
#: MAX and an unset attribute are refused).
ORDERS = frozenset({1, 2, 3})
#: Accepted ``flags`` bits: CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE only
#: (``forms: flags 0x1`` succeeds, ``flags 0x2`` and ``flags 0x80000000`` are refused).
FLAGS = 0x1
_HINT_NONE, _HINT_DEVICE = 0, 1
#: Host location kinds accepted as hints with any id: HOST, HOST_NUMA,
#: HOST_NUMA_CURRENT (``forms: srcLocHint HOST``, ``HOST_NUMA0``, ``HOST_NUMA99``,
#: ``HOST_NUMA_CURRENT`` succeed; ``MAX`` is refused).
HINT_HOST_KINDS = frozenset({2, 3, 4})
#: Handles refused as the stream: the legacy NULL stream 0 and CU_STREAM_LEGACY
#: (``forms: stream: legacy NULL stream 0``, ``CU_STREAM_LEGACY (1)``).
REFUSED_STREAMS = (0, 1)

#: False: size-0 entries and null pointers are refused entry by entry, like a
#: range past its end (the entries before them are copied), the model the
#: conformance suite checks on the GPU. True: refused before any entry is copied.
SIZE0_AND_NULL_REFUSED_UP_FRONT = False

# The bindings' words for the expected list types (cuda-bindings 13.x).
_PTRS = "tuple[cydriver.CUdeviceptr,] or list[cydriver.CUdeviceptr,]"
_ATTRS = "tuple[cydriver.CUmemcpyAttributes,] or list[cydriver.CUmemcpyAttributes,]"
_INTS = "tuple[int] or list[int]"


class SimulatedDriverCrash(RuntimeError):
    """A call that kills the process on the H100 (SIGSEGV); the simulator raises this."""


def _typed_list(name: str, value: Any, typ: type, expected: str) -> list[Any]:
    """The bindings' element-type check of a list argument."""
    if value is None:
        raise TypeError("'NoneType' object is not iterable")
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, typ) for v in value):
        raise TypeError(f"Argument '{name}' is not instance of type (expected {expected}")
    return list(value)


def _size_t(value: Any) -> int:
    v = int(value)
    if v < 0:
        raise OverflowError("can't convert negative value to size_t")
    if v >= 1 << 64:
        raise OverflowError("Python int too large to convert to C unsigned long")
    return v


def _stream_arg(value: Any) -> int:
    """``hStream`` as the bindings take it: None, an int or a CUstream."""
    if value is None:
        return 0
    if isinstance(value, cu.CUstream):
        return int(value)
    if not isinstance(value, int):
        raise TypeError("an integer is required")
    if value < 0:
        raise OverflowError("can't convert negative value to unsigned PY_LONG_LONG")
    return value


def _long_enough(items: list[Any], count: int) -> None:
    if count > len(items):
        raise RuntimeError(f"List is too small: {len(items)} < {count}")


def _check_hint(loc: Any) -> None:
    t, i = int(loc.type), int(loc.id)
    if t == _HINT_NONE or t in HINT_HOST_KINDS:
        return
    if t == _HINT_DEVICE and 0 <= i < len(S.MACHINE.devices):
        return
    raise Fail(R.CUDA_ERROR_INVALID_VALUE)


def _check_attrs(attrs: list[Any], idxs: list[int], nattrs: int, n: int) -> None:
    if nattrs == 0 or nattrs > n:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    starts = idxs[:nattrs]
    if starts[0] != 0 or any(b <= a for a, b in itertools.pairwise(starts)):
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if starts[-1] >= n:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    for a in attrs[:nattrs]:
        if int(a.srcAccessOrder) not in ORDERS or int(a.flags) & ~FLAGS:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        _check_hint(a.srcLocHint)
        _check_hint(a.dstLocHint)


def _crash_if_unknown(addr: int, role: str, k: int) -> None:
    """The H100 segfaults on an address in the device window that is no allocation."""
    if DEVICE_VA_BASE <= addr < DEVICE_VA_END and S.MACHINE.find(addr) is None:
        raise SimulatedDriverCrash(
            f"cuMemcpyBatchAsync entry {k}: the {role} 0x{addr:x} is in the device address "
            "window but in no allocation (freed or never allocated); the H100 kills the "
            "process here (SIGSEGV, copy_batch_probe 'risky' cases)")


def _resolve(k: int, dst: int, src: int, size: int) -> tuple[list[tuple[int, int]],
                                                            list[tuple[int, int]]]:
    """Check entry ``k`` as the driver does; its (dst runs, src runs)."""
    from ._core import _writable, refuse_unreachable_pool
    from ._peer import note_copy
    from ._vmm import real_runs

    if size == 0 or dst == 0 or src == 0:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    _crash_if_unknown(dst, "destination", k)
    _crash_if_unknown(src, "source", k)
    refuse_unreachable_pool(dst, src)  # as cuMemcpy
    note_copy(dst, src)
    _writable(dst, size)
    return real_runs(dst, size, True), real_runs(src, size, False)


def _copy(d: list[tuple[int, int]], s: list[tuple[int, int]], size: int) -> None:
    if len(d) == 1 and len(s) == 1:
        memmove(d[0][0], s[0][0], size)
    else:
        from ._vmm import move_runs

        move_runs(d, s, size)


@api(0)
def _batch(dsts: list[Any], srcs: list[Any], sizes: list[int], count: int,
           attrs: list[Any], idxs: list[int], nattrs: int, h: int) -> None:
    m = S.MACHINE
    n = count
    if m.stream(h) is None:
        m.need_ctx()
    if n == 0 or h in REFUSED_STREAMS:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    _check_attrs(attrs, idxs, nattrs, n)
    if SIZE0_AND_NULL_REFUSED_UP_FRONT and any(
            sizes[k] == 0 or int(dsts[k]) == 0 or int(srcs[k]) == 0 for k in range(n)):
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    # Entry by entry, stopping at the first refused one: the copies before it
    # stay made (data: "after failed batch: copies 0,1,3 landed: [True, True, False]").
    for k in range(n):
        d, s = _resolve(k, int(dsts[k]), int(srcs[k]), sizes[k])
        _copy(d, s, sizes[k])


def cuMemcpyBatchAsync(dsts: Any, srcs: Any, sizes: Any, count: Any, attrs: Any,
                       attrsIdxs: Any, numAttrs: Any, hStream: Any) -> Any:
    """Simulated ``cuMemcpyBatchAsync`` (see the module docstring)."""
    if not S.MACHINE.batch_calls:
        raise S.FunctionNotFoundError('Function "cuMemcpyBatchAsync" not found')
    n = _size_t(count)
    k = _size_t(numAttrs)
    h = _stream_arg(hStream)
    ix = _typed_list("attrsIdxs", attrsIdxs, int, _INTS)
    at = _typed_list("attrs", attrs, cu.CUmemcpyAttributes, _ATTRS)
    sz = _typed_list("sizes", sizes, int, _INTS)
    s = _typed_list("srcs", srcs, cu.CUdeviceptr, _PTRS)
    d = _typed_list("dsts", dsts, cu.CUdeviceptr, _PTRS)
    sz = [_size_t(v) for v in sz]
    for items in (d, s, sz):
        _long_enough(items, n)
    ix = [_size_t(v) for v in ix]
    for items in (at, ix):
        _long_enough(items, k)
    return _batch(d, s, sz, n, at, ix, k, h)
