"""Bad-input cases, part 4: the shared pinned ring, its workers' side, and the Loader.

The objects (a ring, a writer, a lent slot, a slot being filled; closed ones) are made by the
``o`` fixture of test_bad_input.py; the Loader's cases fail before any process starts.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

import cuda_memkit as cm

from ._bad_cases_closed import CLOSED
from ._bad_input_table import N, case

SHAPE = (N // 4,)


def _ring(**kw: Any) -> cm.SharedHostRing:
    args: dict[str, Any] = {"slots": 2, "shape": SHAPE, "dtype": np.float32}
    args.update(kw)
    return cm.SharedHostRing(**args)


def _noop(batch: int, out: Any) -> None:
    out[...] = batch


def _loader(**kw: Any) -> cm.Loader:
    args: dict[str, Any] = {"make_batch": _noop, "batches": 4, "shape": SHAPE,
                            "dtype": np.float32, "workers": 1, "start_method": "spawn"}
    args.update(kw)
    return cm.Loader(**args)


def ring_objects(ns: SimpleNamespace) -> None:
    """A ring with a lent slot, a writer holding another, and half a slot of device memory."""
    ns.ring = _ring()
    ns.ring_writer = ns.ring.handle.writer(worker=0)
    filled = ns.ring_writer.acquire(timeout=60)
    filled.array[...] = 1
    ns.ring_slot = ns.ring.take(filled.publish())
    ns.writer_slot = ns.ring_writer.acquire(timeout=60)
    ns.dev_half = cm.DeviceBuffer.empty(N // 2)


def closed_ring_objects(c: SimpleNamespace) -> None:
    """A closed ring, a slot given back, a closed Loader."""
    ring = _ring(slots=1)
    filled = ring.handle.writer().acquire(timeout=60)
    c.RingSlot = ring.take(filled.publish())
    c.RingSlot.close()
    ring.close()
    c.SharedHostRing = ring
    c.Loader = _loader()
    c.Loader.close()


# == SharedHostRing =====================================================================

case("SharedHostRing(slots=0)", lambda o: _ring(slots=0), ValueError, "slots")
case("SharedHostRing(slots=-1)", lambda o: _ring(slots=-1), ValueError, "slots")
case("SharedHostRing(slots=1.5)", lambda o: _ring(slots=1.5), TypeError, "slots")
case("SharedHostRing(slots=True)", lambda o: _ring(slots=True), TypeError, "slots")
case("SharedHostRing(slots=2**20)", lambda o: _ring(slots=1 << 20), ValueError, "slots")
case("SharedHostRing(shape=0)", lambda o: _ring(shape=0), ValueError, "no bytes")
case("SharedHostRing(shape=(4, 0))", lambda o: _ring(shape=(4, 0)), ValueError, "no bytes")
case("SharedHostRing(shape=-1)", lambda o: _ring(shape=-1), ValueError, "negative")
case("SharedHostRing(shape='x')", lambda o: _ring(shape="x"), TypeError, "shape")
case("SharedHostRing(dtype=object)", lambda o: _ring(dtype=object), TypeError, "objects")
case("SharedHostRing(dtype='nope')", lambda o: _ring(dtype="nope"), TypeError, "dtype")
case("SharedHostRing(grants=0)", lambda o: _ring(grants=0), ValueError, "grants")
case("SharedHostRing(timeout=0)", lambda o: _ring(timeout=0), ValueError, "timeout")
case("SharedHostRing(timeout='1')", lambda o: _ring(timeout="1"), TypeError, "timeout")
case("SharedHostRing(larger than any allocation)",
     lambda o: _ring(slots=4, shape=(1 << 59,), dtype=np.int64), ValueError,
     "larger than any")
case("SharedHostRing.take('x')", lambda o: o.ring.take("x"), TypeError, "ticket")
case("SharedHostRing.take((99, 1))", lambda o: o.ring.take((99, 1)), ValueError, "ticket")
case("SharedHostRing.take((0, 0))", lambda o: o.ring.take((0, 0)), ValueError, "ticket")
case("SharedHostRing.take((True, 1))", lambda o: o.ring.take((True, 1)), TypeError, "ticket")
case("SharedHostRing.take(a ticket from the future)", lambda o: o.ring.take((1, 99)),
     ValueError, "ticket")
case("SharedHostRing.timeout = -1", lambda o: setattr(o.ring, "timeout", -1), ValueError,
     "timeout")

# == RingSlot ===========================================================================

case("RingSlot()", lambda o: cm.RingSlot(), TypeError, r"get\(\)")
case("RingSlot.copy_to(half the bytes)", lambda o: o.ring_slot.copy_to(o.dev_half),
     ValueError, "size mismatch")
case("RingSlot.copy_to(half the bytes, stream)",
     lambda o: o.ring_slot.copy_to(o.dev_half, stream=o.stream), ValueError, "size mismatch")
case("RingSlot.copy_from(wrong shape)",
     lambda o: o.ring_slot.copy_from(np.zeros(3, np.float32)), ValueError, "shape")
case("RingSlot.as_array(too large)", lambda o: o.ring_slot.as_array(np.float32, (N,)),
     ValueError, "needs")
case("RingSlot.fill('x')", lambda o: o.ring_slot.fill("x"), TypeError, "fill value")
case("RingSlot.to_device(pool=3)", lambda o: o.ring_slot.to_device(pool=3), TypeError, "pool")
case("RingSlot.to_device(pool=a host pool)", lambda o: o.ring_slot.to_device(pool=o.host_pool),
     ValueError, "device pool")
case("RingSlot.to_device(stream='s')", lambda o: o.ring_slot.to_device(stream="s"), TypeError,
     "stream")
case("RingSlot.to_numpy(object)", lambda o: o.ring_slot.to_numpy(object), TypeError,
     "objects")

# == the workers' side ==================================================================

case("RingHandle()", lambda o: cm.RingHandle(), TypeError, r"ring\.handle")
case("RingHandle.writer(worker=-1)", lambda o: o.ring.handle.writer(worker=-1), ValueError,
     "worker")
case("RingHandle.writer(worker='a')", lambda o: o.ring.handle.writer(worker="a"), TypeError,
     "worker")
case("RingHandle.writer(timeout=0)", lambda o: o.ring.handle.writer(timeout=0), ValueError,
     "timeout")
case("RingWriter.acquire(timeout=-1)", lambda o: o.ring_writer.acquire(timeout=-1), ValueError,
     "timeout")
case("RingWriter.acquire(timeout='1')", lambda o: o.ring_writer.acquire(timeout="1"),
     TypeError, "timeout")
case("RingWriter.publish(not a slot)", lambda o: o.ring_writer.publish("slot"), TypeError,
     "WriterSlot")
case("RingWriter.fail(error=3)", lambda o: o.ring_writer.fail(o.writer_slot, 3), TypeError,
     "error")
case("RingWriter.abort(error=3)", lambda o: o.ring_writer.abort(3), TypeError, "error")
case("WriterSlot()", lambda o: cm.WriterSlot(), TypeError, r"acquire\(\)")
case("WriterSlot.publish(tag=-1)", lambda o: o.writer_slot.publish(tag=-1), ValueError, "tag")
case("WriterSlot.publish(tag='x')", lambda o: o.writer_slot.publish(tag="x"), TypeError, "tag")

# == Loader (every case fails before a process starts or memory is taken) ================

case("Loader(make_batch=3)", lambda o: _loader(make_batch=3), TypeError, "make_batch")
case("Loader(batches=-1)", lambda o: _loader(batches=-1), ValueError, "batches")
case("Loader(batches='x')", lambda o: _loader(batches="x"), TypeError, "batch")
case("Loader(batches=True)", lambda o: _loader(batches=True), TypeError, "batches")
case("Loader(batches=[1, -2])", lambda o: _loader(batches=[1, -2]), ValueError, "batches")
case("Loader(batches=[1.5])", lambda o: _loader(batches=[1.5]), TypeError, "batch")
case("Loader(shape=0)", lambda o: _loader(shape=0), ValueError, "no bytes")
case("Loader(dtype=object)", lambda o: _loader(dtype=object), TypeError, "objects")
case("Loader(workers=0)", lambda o: _loader(workers=0), ValueError, "workers")
case("Loader(workers=10**6)", lambda o: _loader(workers=10**6), ValueError, "workers")
case("Loader(prefetch=0)", lambda o: _loader(prefetch=0), ValueError, "prefetch")
case("Loader(ordered=1)", lambda o: _loader(ordered=1), TypeError, "ordered")
case("Loader(output='tensor')", lambda o: _loader(output="tensor"), ValueError, "output")
case("Loader(init=3)", lambda o: _loader(init=3), TypeError, "init")
case("Loader(timeout=0)", lambda o: _loader(timeout=0), ValueError, "timeout")
case("Loader(start_method='thread')", lambda o: _loader(start_method="thread"), ValueError,
     "start_method")
case("Loader(device=-1)", lambda o: _loader(device=-1), ValueError, "device")
case("Loader(device=99)", lambda o: _loader(device=99), ValueError, "device 99")
case("Loader(stream='s')", lambda o: _loader(stream="s"), TypeError, "stream")
case("Loader(pool=3)", lambda o: _loader(pool=3), TypeError, "pool")
case("Loader(pool=a host pool)", lambda o: _loader(pool=o.host_pool), ValueError,
     "device pool")
case("Loader.timeout = 0", lambda o: setattr(o.closed.Loader, "timeout", 0), ValueError,
     "timeout")
case("Loader.timeout = nan", lambda o: setattr(o.closed.Loader, "timeout", float("nan")),
     ValueError, "timeout")

# == numbers past what the wire carries (signed 64 bits), and sizes the Loader computes ====

case("RingHandle.writer(worker=2**63)", lambda o: o.ring.handle.writer(worker=1 << 63),
     ValueError, "worker")
case("WriterSlot.publish(tag=2**63)", lambda o: o.writer_slot.publish(tag=1 << 63), ValueError,
     "tag")
case("RingWriter.publish(tag=2**64)", lambda o: o.ring_writer.publish(o.writer_slot, 1 << 64),
     ValueError, "tag")
case("SharedHostRing(timeout=nan)", lambda o: _ring(timeout=float("nan")), ValueError,
     "timeout")
case("SharedHostRing(timeout=-inf)", lambda o: _ring(timeout=float("-inf")), ValueError,
     "timeout")
case("RingWriter.acquire(timeout=nan)", lambda o: o.ring_writer.acquire(timeout=float("nan")),
     ValueError, "timeout")
case("Loader(batches=2**63)", lambda o: _loader(batches=1 << 63), ValueError, "batches")
case("Loader(batches=[2**63])", lambda o: _loader(batches=[1 << 63]), ValueError, "batch")
case("Loader(batches=range(2**63 - 1, 2**63 + 1))",
     lambda o: _loader(batches=range((1 << 63) - 1, (1 << 63) + 1)), ValueError, "batch")
case("Loader(batches=range(-1, 4))", lambda o: _loader(batches=range(-1, 4)), ValueError,
     "batch")
case("Loader(batches=range(2**63))", lambda o: _loader(batches=range(1 << 63)), ValueError,
     "batches")
case("Loader(batches=array([1, -2]))", lambda o: _loader(batches=np.array([1, -2])),
     ValueError, "batch")
case("Loader(batches=array([2**63], uint64))",
     lambda o: _loader(batches=np.array([1 << 63], np.uint64)), ValueError, "batch")
case("Loader(batches=2-d array)", lambda o: _loader(batches=np.zeros((2, 2), np.int64)),
     ValueError, "one-dimensional")
case("Loader(prefetch=10**6)", lambda o: _loader(prefetch=10**6), ValueError,
     r"workers \* prefetch")
case("Loader(timeout=nan)", lambda o: _loader(timeout=float("nan")), ValueError, "timeout")
case("Loader(pool=closed MemoryPool)", lambda o: _loader(pool=o.closed.MemoryPool),
     cm.ClosedError, "closed")
case("RingSlot.to_device(pool=closed MemoryPool)",
     lambda o: o.ring_slot.to_device(pool=o.closed.MemoryPool), cm.ClosedError, "closed")

# == closed objects ====================================================================

_Closed = list[tuple[str, Callable[[Any, Any], Any]]]
RING_CLOSED: dict[str, _Closed] = {
    "SharedHostRing": [
        ("get", lambda r, o: r.get()), ("take", lambda r, o: r.take((0, 1))),
        ("handle", lambda r, o: r.handle), ("with", lambda r, o: r.__enter__()),
    ],
    "RingSlot": [
        ("ptr", lambda b, o: b.ptr), ("array", lambda b, o: b.array),
        ("device_ptr", lambda b, o: b.device_ptr), ("to_numpy", lambda b, o: b.to_numpy()),
        ("as_array", lambda b, o: b.as_array()),
        ("__cuda_array_interface__", lambda b, o: b.__cuda_array_interface__),
        ("__dlpack__", lambda b, o: b.__dlpack__()), ("with", lambda b, o: b.__enter__()),
        ("copy_to", lambda b, o: b.copy_to(o.dev_half)),
        ("to_device", lambda b, o: b.to_device()),
        ("copy(src)", lambda b, o: cm.copy(o.host, b)),
    ],
    "Loader": [
        ("iter", lambda ld, o: iter(ld)), ("ring", lambda ld, o: ld.ring),
        ("with", lambda ld, o: ld.__enter__()),
    ],
}
CLOSED.update(RING_CLOSED)
for _kind, _methods in RING_CLOSED.items():
    for _meth, _fn in _methods:
        case(f"closed {_kind}.{_meth}",
             lambda o, k=_kind, f=_fn: f(getattr(o.closed, k), o), cm.ClosedError, "closed")
