"""Simulated ``cuMemcpyBatchAsync`` (CUDA >= 12.8; the 13.x form without ``failIdx``).

``cuMemcpyBatchAsync(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, hStream)``
with the bindings' argument checks (lists of ``CUdeviceptr`` and of
``CUmemcpyAttributes``, lists of ints; a wrong element type is a
``TypeError``, a list shorter than its count a ``RuntimeError`` "List is too
small"), then the driver's rules, which return ``CUDA_ERROR_INVALID_VALUE``:

* ``count == 0``; the legacy default stream (handle 0 or ``CU_STREAM_LEGACY``);
* ``numAttrs == 0`` or ``numAttrs > count``; ``attrsIdxs[0] != 0``; indices
  not strictly increasing or not below ``count``;
* an attribute whose ``srcAccessOrder`` is not STREAM, DURING_API_CALL or
  ANY, whose ``flags`` has bits other than PREFER_OVERLAP_WITH_COMPUTE, or
  whose location hints are not NONE, an existing device or a host kind;
* a copy of size 0, a null pointer, or a range that is not inside one
  allocation (device-only memory) -- the same checks as ``cuMemcpyAsync``.

Every copy is checked before any is made (all or nothing). Streams complete
at once, so the copies are made during the call, in list order: where
destinations overlap the last copy wins (the driver gives no order).

``MACHINE.batch_calls = False`` makes the function raise
``FunctionNotFoundError`` (a driver without the call).

PROVISIONAL: the rules above come from the CUDA documentation and from the
H100's answers for ``cuMemPrefetchBatchAsync``; ``scripts/probes/copy_batch_probe.py``
records the H100's own answers for this call, and the simulator follows them
once that run is in.
"""

from __future__ import annotations

import itertools
from typing import Any

from cuda.bindings import driver as cu

from . import _state as S
from ._state import Fail, R, api, memmove

__all__ = ["cuMemcpyBatchAsync"]

_ORDERS = frozenset({1, 2, 3})  # STREAM, DURING_API_CALL, ANY
_FLAGS = 0x1  # CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE
_HINT_NONE, _HINT_DEVICE = 0, 1
_HINT_HOST_KINDS = frozenset({2, 3, 4})  # HOST, HOST_NUMA, HOST_NUMA_CURRENT
# The bindings' words for the expected list types (cuda-bindings 13.x).
_PTRS = "tuple[cydriver.CUdeviceptr,] or list[cydriver.CUdeviceptr,]"
_ATTRS = "tuple[cydriver.CUmemcpyAttributes,] or list[cydriver.CUmemcpyAttributes,]"
_INTS = "tuple[int] or list[int]"


def _typed_list(name: str, value: Any, typ: type, expected: str) -> list[Any]:
    """The bindings' element-type check of a list argument (None is an empty list)."""
    items = [] if value is None else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(v, typ) for v in items):
        raise TypeError(f"Argument '{name}' is not instance of type (expected {expected}")
    return list(items)


def _size_t(value: Any) -> int:
    v = int(value)
    if v < 0:
        raise OverflowError("can't convert negative value to size_t")
    return v


def _long_enough(items: list[Any], count: int) -> None:
    if count > len(items):
        raise RuntimeError(f"List is too small: {len(items)} < {count}")


def _check_hint(loc: Any) -> None:
    t, i = int(loc.type), int(loc.id)
    if t == _HINT_NONE or t in _HINT_HOST_KINDS:
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
        if int(a.srcAccessOrder) not in _ORDERS or int(a.flags) & ~_FLAGS:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        _check_hint(a.srcLocHint)
        _check_hint(a.dstLocHint)


def _resolve(dst: int, src: int, size: int) -> tuple[list[tuple[int, int]],
                                                     list[tuple[int, int]]]:
    """Check one copy as ``cuMemcpyAsync`` does; its (dst runs, src runs)."""
    from ._core import _writable
    from ._vmm import real_runs

    if size == 0 or dst == 0 or src == 0:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    _writable(dst, size)
    return real_runs(dst, size, True), real_runs(src, size, False)


@api(0)
def _batch(dsts: list[Any], srcs: list[Any], sizes: list[int], count: int,
           attrs: list[Any], idxs: list[int], nattrs: int, h_stream: Any) -> None:
    m = S.MACHINE
    n = count
    h = int(h_stream) if h_stream is not None else 0
    if m.stream(h) is None:
        m.need_ctx()
    if n == 0 or h in (0, 1):  # nothing to copy; the legacy NULL stream is refused
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    _check_attrs(attrs, idxs, nattrs, n)
    plan = [_resolve(int(dsts[k]), int(srcs[k]), sizes[k]) for k in range(n)]
    for (d, s), size in zip(plan, sizes, strict=False):
        if len(d) == 1 and len(s) == 1:
            memmove(d[0][0], s[0][0], size)
        else:
            from ._vmm import move_runs

            move_runs(d, s, size)


def cuMemcpyBatchAsync(dsts: Any, srcs: Any, sizes: Any, count: Any, attrs: Any,
                       attrsIdxs: Any, numAttrs: Any, hStream: Any) -> Any:
    """Simulated ``cuMemcpyBatchAsync`` (see the module docstring)."""
    if not S.MACHINE.batch_calls:
        raise S.FunctionNotFoundError('Function "cuMemcpyBatchAsync" not found')
    d = _typed_list("dsts", dsts, cu.CUdeviceptr, _PTRS)
    s = _typed_list("srcs", srcs, cu.CUdeviceptr, _PTRS)
    sz = _typed_list("sizes", sizes, int, _INTS)
    at = _typed_list("attrs", attrs, cu.CUmemcpyAttributes, _ATTRS)
    ix = _typed_list("attrsIdxs", attrsIdxs, int, _INTS)
    n = _size_t(count)
    k = _size_t(numAttrs)
    sz = [_size_t(v) for v in sz]
    ix = [_size_t(v) for v in ix]
    for items in (d, s, sz):
        _long_enough(items, n)
    for items in (at, ix):
        _long_enough(items, k)
    return _batch(d, s, sz, n, at, ix, k, hStream)
