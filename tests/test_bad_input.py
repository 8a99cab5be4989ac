"""Bad input across the whole public API: the right exception, a clear message, no side effects.

A table of cases (callable, expected exception class, a regex the message
must match, naming the argument) covering every public callable of
``cuda_memkit.__all__``: functions, constructors and classmethods, and the
methods of every object kind, including closed objects of every kind in every
method. Each case runs inside :func:`tests._nothing.nothing_allocated`: no
allocating, mapping or hint-issuing driver call, and the ledger (simulator
tables, or free device memory on a GPU) unchanged.

Argument errors must be caught before the driver (plain ``TypeError`` /
``ValueError``, not a :class:`CudaError`), except the cases marked
``driver=True`` whose answer is the driver's (a device ordinal past the
count, a range registered twice). The exception classes, enums and result
records (``PlanEntry``, ``PlannedCall``, ``PoolStats``, ``RangeInfo``) are
made by the library, not from user input, and are not in the table.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm

from ._nothing import nothing_allocated

KiB = 1 << 10
N = 4 * KiB


@dataclass(frozen=True)
class Case:
    id: str
    call: Callable[[SimpleNamespace], Any]
    exc: type[BaseException]
    match: str
    driver: bool = False  # the answer comes from the driver (a CudaError is fine)


CASES: list[Case] = []


def case(id: str, call: Callable[[SimpleNamespace], Any], exc: type[BaseException],
         match: str, *, driver: bool = False) -> None:
    CASES.append(Case(id, call, exc, match, driver))


def _closed_fd() -> int:
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    return r


@pytest.fixture(scope="module")
def o() -> Iterator[SimpleNamespace]:
    """Live objects of every kind (made once), and closed ones."""
    cm.MemoryPool.default_pinned()
    cm.HostBuffer.pooled(1).close()
    g = cm.granularity(0)
    ns = SimpleNamespace(g=g)
    ns.stream = cm.Stream()
    ns.host = cm.HostBuffer.zeros(N)
    ns.host_f32 = cm.HostBuffer.zeros(N // 4, np.float32)
    ns.host0d = cm.HostBuffer.zeros(())
    ns.reg_array = np.zeros(N, np.uint8)
    ns.reg = cm.register_host(ns.reg_array)
    ns.ro_array = np.zeros(N, np.uint8)
    ns.ro_array.flags.writeable = False
    ns.reg_ro = cm.register_host(ns.ro_array, flags=cm.HostRegisterFlags.READ_ONLY)
    ns.dev = cm.DeviceBuffer.alloc(N)
    ns.managed = cm.ManagedBuffer.zeros(N)
    ns.managed0 = cm.ManagedBuffer.empty(0)
    ns.pool = cm.MemoryPool(0)
    ns.pool_buf = ns.pool.allocate(N, stream=ns.stream)
    ns.host_pool = cm.MemoryPool(location=cm.Location.host())
    ns.range = cm.AddressRange.reserve(4 * g)
    ns.pm = cm.PhysicalMemory.create(g)
    ns.pm2 = cm.PhysicalMemory.create(g)
    ns.mapping = ns.range.map(ns.pm)
    ns.mapping.set_access(0, cm.Access.READWRITE)
    ns.grow = cm.GrowableBuffer(4 * g, chunk=g)
    ns.grow.resize(g)
    ns.hints = cm.ManagedMemoryHints.for_buffer(ns.managed)
    closed_later = cm.ManagedBuffer.zeros(N)
    ns.plan_of_closed = cm.PrefetchPlan().add(closed_later, 0)
    closed_later.close()
    ns.page = np.zeros(N, np.uint8)
    ns.closed_fd = _closed_fd()
    # -- closed objects of every kind
    c = SimpleNamespace()
    for name, make in {
        "HostBuffer": lambda: cm.HostBuffer.empty(N),
        "HostBuffer.pooled": lambda: cm.HostBuffer.pooled(N),
        "RegisteredHost": lambda: cm.register_host(np.zeros(N, np.uint8)),
        "DeviceBuffer": lambda: cm.DeviceBuffer.alloc(N),
        "ManagedBuffer": lambda: cm.ManagedBuffer.zeros(N),
        "Stream": cm.Stream,
        "MemoryPool": lambda: cm.MemoryPool(0),
        "HostMemoryPool": lambda: cm.MemoryPool(location=cm.Location.host()),
        "AddressRange": lambda: cm.AddressRange.reserve(g),
        "PhysicalMemory": lambda: cm.PhysicalMemory.create(g),
        "GrowableBuffer": lambda: cm.GrowableBuffer(2 * g, chunk=g),
    }.items():
        obj = make()
        obj.close()
        setattr(c, name.replace(".", "_"), obj)
    c.PoolBuffer = ns.pool.allocate(N, stream=ns.stream)
    c.PoolBuffer.free()
    hp = ns.host_pool.allocate(N, stream=ns.stream)
    ns.stream.synchronize()
    hp.close()
    c.HostPoolBuffer = hp
    vr = cm.AddressRange.reserve(g)
    c.Mapping = vr.map(cm.PhysicalMemory.create(g))
    c.Mapping.close()
    vr.close()
    ns.closed = c
    ns.stream.synchronize()
    yield ns
    ns.stream.synchronize()
    for obj in (ns.mapping, ns.range, ns.pm, ns.pm2, ns.grow, ns.pool_buf, ns.pool,
                ns.host_pool, ns.reg, ns.reg_ro, ns.managed, ns.managed0, ns.dev, ns.host,
                ns.host_f32, ns.host0d, ns.stream):
        obj.close()


# == module functions and backend =====================================================

case("use_backend(42)", lambda o: cm.use_backend(42), ValueError, "backend")
case("use_backend('gpu')", lambda o: cm.use_backend("gpu"), ValueError, "backend")
case("use_backend(None)", lambda o: cm.use_backend(None), ValueError, "backend")

# == Device, Location, Stream =========================================================

for bad, exc, rx in [("0", TypeError, "ordinal"), (1.0, TypeError, "ordinal"),
                     (True, TypeError, "ordinal"), (None, TypeError, "ordinal"),
                     (-1, ValueError, "ordinal")]:
    case(f"Device({bad!r})", lambda o, b=bad: cm.Device(b), exc, rx)
case("Device(99)", lambda o: cm.Device(99), ValueError, "DEVICE|device", driver=True)
case("Device.attribute('x')", lambda o: cm.Device(0).attribute("x"), TypeError, "attr")
case("Device.attribute(-5)", lambda o: cm.Device(0).attribute(-5), ValueError, "attr")
case("Device.can_access_peer('1')", lambda o: cm.Device(0).can_access_peer("1"),
     TypeError, "ordinal|peer")
case("Device.can_access_peer(-1)", lambda o: cm.Device(0).can_access_peer(-1),
     ValueError, "ordinal|peer")

case("Location('device')", lambda o: cm.Location("device"), TypeError, "type")
case("Location(9)", lambda o: cm.Location(9), ValueError, "location type")
case("Location(DEVICE, -1)", lambda o: cm.Location(cm.LocationType.DEVICE, -1),
     ValueError, "id")
case("Location(DEVICE, 1.5)", lambda o: cm.Location(cm.LocationType.DEVICE, 1.5),
     TypeError, "id")
case("Location(DEVICE, True)", lambda o: cm.Location(cm.LocationType.DEVICE, True),
     TypeError, "id")
case("Location.device(-1)", lambda o: cm.Location.device(-1), ValueError, "ordinal")
case("Location.device('0')", lambda o: cm.Location.device("0"), TypeError, "ordinal")
case("Location.host_numa(-2)", lambda o: cm.Location.host_numa(-2), ValueError, "NUMA")
case("Location.host_numa(0.0)", lambda o: cm.Location.host_numa(0.0), TypeError, "NUMA")
case("LocationType(7)", lambda o: cm.LocationType(7), ValueError, "LocationType")

case("Stream(non_blocking=1)", lambda o: cm.Stream(non_blocking=1), TypeError,
     "non_blocking")
case("Stream(priority=0.5)", lambda o: cm.Stream(priority=0.5), TypeError, "priority")
case("Stream(priority=True)", lambda o: cm.Stream(priority=True), TypeError, "priority")
case("Stream(device='0')", lambda o: cm.Stream(device="0"), TypeError, "device")
case("Stream(device=-1)", lambda o: cm.Stream(device=-1), ValueError, "device")
case("Stream(device=99)", lambda o: cm.Stream(device=99), ValueError, "DEVICE|device",
     driver=True)
case("Stream.from_handle('1')", lambda o: cm.Stream.from_handle("1"), TypeError, "handle")
case("Stream.from_handle(-1)", lambda o: cm.Stream.from_handle(-1), ValueError, "handle")
case("Stream.from_handle(1.0)", lambda o: cm.Stream.from_handle(1.0), TypeError, "handle")
case("Stream.from_handle(True)", lambda o: cm.Stream.from_handle(True), TypeError, "handle")

# == HostBuffer =======================================================================

for ctor in ("empty", "zeros", "pooled"):
    for bad, exc, rx in [("a", TypeError, "shape"), (-1, ValueError, "dimension|shape"),
                         ((2, -3), ValueError, "dimension|shape"),
                         ((2.0,), TypeError, "shape"), (True, TypeError, "shape"),
                         (None, TypeError, "shape"),
                         ((1 << 62, 1 << 62), ValueError, "bytes")]:
        case(f"HostBuffer.{ctor}(shape={bad!r})",
             lambda o, b=bad, c=ctor: getattr(cm.HostBuffer, c)(b), exc, rx)
    for bad, exc, rx in [(object, TypeError, "dtype|object"), ("V0", TypeError, "dtype|size"),
                         ("nonsense", TypeError, "dtype|data type")]:
        case(f"HostBuffer.{ctor}(dtype={bad!r})",
             lambda o, b=bad, c=ctor: getattr(cm.HostBuffer, c)(8, b), exc, rx)
for ctor in ("empty", "zeros"):
    for bad, exc, rx in [(8, ValueError, "HostAllocFlags|flag"), (-1, ValueError, "flag"),
                         ("PORTABLE", TypeError, "flags"), (1.0, TypeError, "flags"),
                         (cm.HostRegisterFlags.READ_ONLY, TypeError, "HostAllocFlags"),
                         (cm.AttachFlags.GLOBAL, TypeError, "HostAllocFlags")]:
        case(f"HostBuffer.{ctor}(flags={bad!r})",
             lambda o, b=bad, c=ctor: getattr(cm.HostBuffer, c)(N, flags=b), exc, rx)
    case(f"HostBuffer.{ctor}(pool=device pool)",
         lambda o, c=ctor: getattr(cm.HostBuffer, c)(N, pool=o.pool), TypeError, "pool")
    case(f"HostBuffer.{ctor}(pool='x')",
         lambda o, c=ctor: getattr(cm.HostBuffer, c)(N, pool="x"), TypeError, "pool")
    case(f"HostBuffer.{ctor}(pool=..., flags=DEVICEMAP)",
         lambda o, c=ctor: getattr(cm.HostBuffer, c)(N, pool=o.host_pool,
                                                     flags=cm.HostAllocFlags.DEVICEMAP),
         ValueError, "DEVICEMAP|pool")
    case(f"HostBuffer.{ctor}(pool=closed pool)",
         lambda o, c=ctor: getattr(cm.HostBuffer, c)(N, pool=o.closed.HostMemoryPool),
         cm.ClosedError, "closed")
case("HostBuffer.pooled(pool=device pool)", lambda o: cm.HostBuffer.pooled(N, pool=o.pool),
     TypeError, "pool")
case("HostBuffer.pooled(pool=closed pool)",
     lambda o: cm.HostBuffer.pooled(N, pool=o.closed.HostMemoryPool), cm.ClosedError, "closed")
case("HostBuffer.pooled(float32, pool=device pool)",
     lambda o: cm.HostBuffer.pooled(N, np.float32, pool=o.pool), TypeError, "pool")
case("HostBuffer.from_array(object array)",
     lambda o: cm.HostBuffer.from_array(np.array([object()])), TypeError, "object")
case("HostBuffer.from_array(flags=16)",
     lambda o: cm.HostBuffer.from_array(np.zeros(4), flags=16), ValueError, "flag")
case("HostBuffer.from_array(pool=device pool)",
     lambda o: cm.HostBuffer.from_array(np.zeros(4), pool=o.pool), TypeError, "pool")
case("HostBuffer()", lambda o: cm.HostBuffer(), TypeError, "empty")
case("HostBuffer.copy_from(shape mismatch)", lambda o: o.host.copy_from(np.zeros(N + 1, np.uint8)),
     ValueError, "shape")
case("HostBuffer.copy_from(dtype mismatch)",
     lambda o: o.host.copy_from(np.zeros(N, np.int8)), ValueError, "dtype")
case("HostBuffer.copy_from(object array)",
     lambda o: o.host.copy_from(np.array([object()] * N)), TypeError, "object")
case("HostBuffer.copy_from(device, size mismatch)",
     lambda o: o.host_f32.copy_from(cm.DeviceBuffer.alloc(0)), ValueError, "size|bytes")
case("HostBuffer.copy_to(read-only)", lambda o: o.host.copy_to(o.ro_array), ValueError,
     "read-only")
case("HostBuffer.copy_to(shape mismatch)", lambda o: o.host.copy_to(np.zeros(3, np.uint8)),
     ValueError, "shape")
case("HostBuffer.copy_to(dtype mismatch)", lambda o: o.host_f32.copy_to(np.zeros(N // 4)),
     ValueError, "dtype")
case("HostBuffer.device_ptr (not DEVICEMAP)", lambda o: o.host.device_ptr, ValueError,
     "DEVICEMAP|mapped")
case("len(0-d HostBuffer)", lambda o: len(o.host0d), TypeError, "0-d")
case("HostBuffer.__array__(float64, copy=False)",
     lambda o: o.host.__array__(np.float64, copy=False), ValueError, "copy")

# == register_host =====================================================================

case("register_host('abc')", lambda o: cm.register_host("abc"), TypeError,
     "array|buffer|str")
case("register_host(123)", lambda o: cm.register_host(123), TypeError, "array|buffer|int")
case("register_host(strided)", lambda o: cm.register_host(np.zeros(64)[::2]), ValueError,
     "contiguous")
case("register_host(object array)", lambda o: cm.register_host(np.array([object()] * 8)),
     TypeError, "object")
case("register_host(read-only, DEFAULT)", lambda o: cm.register_host(o.ro_array),
     ValueError, "read-only|READ_ONLY")
case("register_host(flags=16)", lambda o: cm.register_host(o.page, flags=16), ValueError,
     "HostRegisterFlags|flag")
case("register_host(flags='x')", lambda o: cm.register_host(o.page, flags="x"), TypeError,
     "flags")
case("register_host(flags=HostAllocFlags)",
     lambda o: cm.register_host(o.page, flags=cm.HostAllocFlags.PORTABLE), TypeError,
     "HostRegisterFlags")
case("register_host(HostBuffer)", lambda o: cm.register_host(o.host), TypeError,
     "HostBuffer|pageable")
case("register_host(HostBuffer.array)", lambda o: cm.register_host(o.host.array), ValueError,
     "HostBuffer")
case("register_host(ManagedBuffer.array)", lambda o: cm.register_host(o.managed.array),
     ValueError, "ManagedBuffer")
case("register_host(DeviceBuffer)", lambda o: cm.register_host(o.dev), TypeError,
     "DeviceBuffer|pageable")
case("register_host(twice)", lambda o: cm.register_host(o.reg_array),
     cm.CudaHostMemoryAlreadyRegisteredError, "cuMemHostRegister", driver=True)
case("register_host(part of a registration)", lambda o: cm.register_host(o.reg_array[64:]),
     cm.CudaHostMemoryAlreadyRegisteredError, "cuMemHostRegister", driver=True)

# == copy / copy_async ===================================================================

case("copy(object(), host)", lambda o: cm.copy(object(), o.host), TypeError,
     "destination|copy to")
case("copy(host, object())", lambda o: cm.copy(o.host, object()), TypeError,
     "source|copy from")
case("copy(None, host)", lambda o: cm.copy(None, o.host), TypeError, "destination")
case("copy(host, True)", lambda o: cm.copy(o.host, True), TypeError, "source")
case("copy(-5, host)", lambda o: cm.copy(-5, o.host), ValueError, "pointer|negative")
case("copy(4 KiB, 16 KiB)", lambda o: cm.copy(o.host, np.zeros(4 * N, np.uint8)), ValueError,
     "size")
case("copy(float32, uint8 same bytes)", lambda o: cm.copy(o.host_f32, o.host), ValueError,
     "dtype")
case("copy(nbytes=-1)", lambda o: cm.copy(o.dev, o.host, nbytes=-1), ValueError, "nbytes")
case("copy(nbytes='1')", lambda o: cm.copy(o.dev, o.host, nbytes="1"), TypeError, "nbytes")
case("copy(nbytes=1.5)", lambda o: cm.copy(o.dev, o.host, nbytes=1.5), TypeError, "nbytes")
case("copy(nbytes=True)", lambda o: cm.copy(o.dev, o.host, nbytes=True), TypeError, "nbytes")
case("copy(nbytes > destination)", lambda o: cm.copy(o.dev, o.host, nbytes=N + 1),
     ValueError, "nbytes")
case("copy(nbytes > source)", lambda o: cm.copy(o.dev, o.host_f32, nbytes=2 * N),
     ValueError, "nbytes")
case("copy(int, int)", lambda o: cm.copy(o.dev.ptr, o.host.ptr), ValueError, "nbytes")
case("copy(strided source)", lambda o: cm.copy(o.dev, np.zeros(2 * N, np.uint8)[::2]),
     ValueError, "contiguous")
case("copy(read-only destination)", lambda o: cm.copy(o.ro_array, o.dev), ValueError,
     "read-only")
case("copy(READ_ONLY registration as destination)", lambda o: cm.copy(o.reg_ro, o.dev),
     ValueError, "READ_ONLY")
case("copy(object array)", lambda o: cm.copy(o.dev, np.array([object()] * N)), TypeError,
     "object")
case("copy(stream='s')", lambda o: cm.copy(o.dev, o.host, stream="s"), TypeError, "stream")
case("copy(stream=-1)", lambda o: cm.copy(o.dev, o.host, stream=-1), ValueError, "stream")
case("copy(stream=1.5)", lambda o: cm.copy(o.dev, o.host, stream=1.5), TypeError, "stream")
case("copy(stream=True)", lambda o: cm.copy(o.dev, o.host, stream=True), TypeError, "stream")
case("copy(stream=closed Stream)", lambda o: cm.copy(o.dev, o.host, stream=o.closed.Stream),
     cm.ClosedError, "closed")
case("copy_async(pageable source)",
     lambda o: cm.copy_async(o.dev, o.page, stream=o.stream), ValueError, "pageable")
case("copy_async(pageable destination)",
     lambda o: cm.copy_async(o.page, o.dev, stream=o.stream), ValueError, "pageable")
case("copy_async(no stream)", lambda o: cm.copy_async(o.dev, o.host), TypeError, "stream")
case("copy_async(stream=object())",
     lambda o: cm.copy_async(o.dev, o.host, stream=object()), TypeError, "stream")
case("copy_async(size mismatch)",
     lambda o: cm.copy_async(o.dev, o.managed0, stream=o.stream), ValueError, "size")


class _BadCAI:
    def __init__(self) -> None:
        self.__cuda_array_interface__ = {"data": (0x1000, False), "shape": (4, 4),
                                         "typestr": "<f4", "strides": (4, 16), "version": 3}


case("copy(strided __cuda_array_interface__)", lambda o: cm.copy(_BadCAI(), o.host_f32),
     ValueError, "contiguous")

# == DeviceBuffer ========================================================================

for bad, exc in [("1", TypeError), (-1, ValueError), (1.5, TypeError), (True, TypeError),
                 (None, TypeError), (1 << 70, ValueError)]:
    case(f"DeviceBuffer.alloc({bad!r})", lambda o, b=bad: cm.DeviceBuffer.alloc(b), exc,
         "nbytes")
case("DeviceBuffer.alloc(device='0')", lambda o: cm.DeviceBuffer.alloc(N, device="0"),
     TypeError, "device")
case("DeviceBuffer.alloc(device=-1)", lambda o: cm.DeviceBuffer.alloc(N, device=-1),
     ValueError, "device")
case("DeviceBuffer.alloc(device=99)", lambda o: cm.DeviceBuffer.alloc(N, device=99),
     ValueError, "DEVICE|device", driver=True)
case("DeviceBuffer(1)", lambda o: cm.DeviceBuffer(1), TypeError, "alloc")
case("DeviceBuffer.from_array(object array)",
     lambda o: cm.DeviceBuffer.from_array(np.array([object()])), TypeError, "object")
case("DeviceBuffer.from_array(device='0')",
     lambda o: cm.DeviceBuffer.from_array(np.zeros(4), device="0"), TypeError, "device")
case("DeviceBuffer.to_numpy(dtype=object)", lambda o: o.dev.to_numpy(object), TypeError,
     "object")
case("DeviceBuffer.to_numpy(shape too big)", lambda o: o.dev.to_numpy("u1", N + 1),
     ValueError, "shape|bytes")
case("DeviceBuffer.to_numpy(shape=-1)", lambda o: o.dev.to_numpy("u1", -1), ValueError,
     "shape")
case("DeviceBuffer.to_numpy(float64 of 4095 bytes)",
     lambda o: cm.DeviceBuffer.alloc(0).to_numpy(np.float64, 1), ValueError, "bytes")
for bad, exc in [(256, ValueError), (-1, ValueError), ("a", TypeError), (1.0, TypeError),
                 (True, TypeError)]:
    case(f"DeviceBuffer.memset({bad!r})", lambda o, b=bad: o.dev.memset(b), exc, "value")
case("DeviceBuffer.memset(stream='s')", lambda o: o.dev.memset(0, stream="s"), TypeError,
     "stream")
case("DeviceBuffer.as_array(object)", lambda o: o.dev.as_array(object), TypeError, "object")
case("DeviceBuffer.as_array(float64, too big)", lambda o: o.dev.as_array(np.float64, N),
     ValueError, "bytes")
case("DeviceBuffer.as_array(shape=(2, -1))", lambda o: o.dev.as_array("u1", (2, -1)),
     ValueError, "shape")
case("DeviceBuffer.as_array(dtype='V0')", lambda o: o.dev.as_array("V0"), TypeError, "size")

# == ManagedBuffer ==========================================================================

for ctor in ("empty", "zeros"):
    for bad, exc, rx in [("a", TypeError, "shape"), (-1, ValueError, "shape"),
                         ((1, -1), ValueError, "shape"), (True, TypeError, "shape"),
                         ((1 << 62, 1 << 62), ValueError, "bytes")]:
        case(f"ManagedBuffer.{ctor}(shape={bad!r})",
             lambda o, b=bad, c=ctor: getattr(cm.ManagedBuffer, c)(b), exc, rx)
    for bad, exc, rx in [(cm.AttachFlags.SINGLE, ValueError, "attach"), (0, ValueError, "attach"),
                         ("GLOBAL", TypeError, "attach"), (True, TypeError, "attach"),
                         (1.0, TypeError, "attach")]:
        case(f"ManagedBuffer.{ctor}(attach={bad!r})",
             lambda o, b=bad, c=ctor: getattr(cm.ManagedBuffer, c)(N, attach=b), exc, rx)
    case(f"ManagedBuffer.{ctor}(dtype=object)",
         lambda o, c=ctor: getattr(cm.ManagedBuffer, c)(N, object), TypeError, "object")
    case(f"ManagedBuffer.{ctor}(dtype='V0')",
         lambda o, c=ctor: getattr(cm.ManagedBuffer, c)(N, "V0"), TypeError, "size")
    case(f"ManagedBuffer.{ctor}(dtype='nonsense')",
         lambda o, c=ctor: getattr(cm.ManagedBuffer, c)(N, "nonsense"), TypeError,
         "dtype|data type")
case("ManagedBuffer.from_array(object array)",
     lambda o: cm.ManagedBuffer.from_array(np.array([object()])), TypeError, "object")
case("ManagedBuffer.from_array(attach=SINGLE)",
     lambda o: cm.ManagedBuffer.from_array(np.zeros(4), attach=cm.AttachFlags.SINGLE),
     ValueError, "attach")
case("ManagedBuffer(1)", lambda o: cm.ManagedBuffer(1), TypeError, "empty")
case("ManagedBuffer.attach(flags=3)", lambda o: o.managed.attach(o.stream, 3), ValueError,
     "flags")
case("ManagedBuffer.attach(flags='x')", lambda o: o.managed.attach(o.stream, "x"), TypeError,
     "flags")
case("ManagedBuffer.attach(legacy stream, SINGLE)", lambda o: o.managed.attach(None),
     ValueError, "legacy|stream")
case("ManagedBuffer.attach(stream='s')", lambda o: o.managed.attach("s"), TypeError, "stream")
case("ManagedBuffer.attach(empty buffer)", lambda o: o.managed0.attach(o.stream), ValueError,
     "empty")
case("ManagedBuffer.advise('x')", lambda o: o.managed.advise("x"), TypeError, "advice")
case("ManagedBuffer.advise(99)", lambda o: o.managed.advise(99), ValueError, "advice")
case("ManagedBuffer.advise(True)", lambda o: o.managed.advise(True), TypeError, "advice")
case("ManagedBuffer.advise(SET_PREFERRED_LOCATION)",
     lambda o: o.managed.advise(cm.MemAdvice.SET_PREFERRED_LOCATION), TypeError, "location")
case("ManagedBuffer.advise(SET_ACCESSED_BY, host NUMA)",
     lambda o: o.managed.advise(cm.MemAdvice.SET_ACCESSED_BY, cm.Location.host_numa(0)),
     ValueError, "ACCESSED_BY location")
case("ManagedBuffer.advise(SET_PREFERRED_LOCATION, 99)",
     lambda o: o.managed.advise(cm.MemAdvice.SET_PREFERRED_LOCATION, 99), ValueError,
     "device 99")
case("ManagedBuffer.advise(location='gpu')",
     lambda o: o.managed.advise(cm.MemAdvice.SET_ACCESSED_BY, "gpu"), TypeError, "Location")
case("ManagedBuffer.advise(offset=-1)",
     lambda o: o.managed.advise(cm.MemAdvice.SET_READ_MOSTLY, offset=-1), ValueError, "offset")
case("ManagedBuffer.advise(nbytes=0)",
     lambda o: o.managed.advise(cm.MemAdvice.SET_READ_MOSTLY, nbytes=0), ValueError,
     "zero-size")
case("ManagedBuffer.advise(offset past end)",
     lambda o: o.managed.advise(cm.MemAdvice.SET_READ_MOSTLY, offset=N + 1), ValueError,
     "offset|outside")
case("ManagedBuffer.advise(nbytes past end)",
     lambda o: o.managed.advise(cm.MemAdvice.SET_READ_MOSTLY, offset=1, nbytes=N), ValueError,
     "outside")
case("ManagedBuffer.advise(nbytes='1')",
     lambda o: o.managed.advise(cm.MemAdvice.SET_READ_MOSTLY, nbytes="1"), TypeError, "nbytes")
case("ManagedBuffer.advise(offset=1.0)",
     lambda o: o.managed.advise(cm.MemAdvice.SET_READ_MOSTLY, offset=1.0), TypeError, "offset")
case("ManagedBuffer.prefetch('gpu')", lambda o: o.managed.prefetch("gpu"), TypeError,
     "Location")
case("ManagedBuffer.prefetch(99)", lambda o: o.managed.prefetch(99), ValueError, "device 99")
case("ManagedBuffer.prefetch(host NUMA 99)",
     lambda o: o.managed.prefetch(cm.Location.host_numa(99)), ValueError, "NUMA")
case("ManagedBuffer.prefetch(stream='s')", lambda o: o.managed.prefetch(0, stream="s"),
     TypeError, "stream")
case("ManagedBuffer.prefetch(offset=N)", lambda o: o.managed.prefetch(0, offset=N),
     ValueError, "zero-size|offset")
case("ManagedBuffer.prefetch(nbytes=-1)", lambda o: o.managed.prefetch(0, nbytes=-1),
     ValueError, "nbytes")
case("ManagedBuffer.prefetch(empty buffer)", lambda o: o.managed0.prefetch(0), ValueError,
     "zero-size")
case("ManagedBuffer.discard(offset=-1)", lambda o: o.managed.discard(offset=-1), ValueError,
     "offset")
case("ManagedBuffer.discard(stream=object())", lambda o: o.managed.discard(stream=object()),
     TypeError, "stream")
case("ManagedBuffer.discard_and_prefetch('x')", lambda o: o.managed.discard_and_prefetch("x"),
     TypeError, "Location")
case("ManagedBuffer.discard_and_prefetch(99)", lambda o: o.managed.discard_and_prefetch(99),
     ValueError, "device 99")
case("ManagedBuffer.range_info(offset=N+1)", lambda o: o.managed.range_info(N + 1),
     ValueError, "offset|outside")
case("ManagedBuffer.range_info(nbytes=0)", lambda o: o.managed.range_info(0, 0), ValueError,
     "zero-size")

# == ManagedMemoryHints, MigrationPolicy ========================================================

case("ManagedMemoryHints(ManagedBuffer, 10)",
     lambda o: cm.ManagedMemoryHints(o.managed, 10), TypeError, "for_buffer")
case("ManagedMemoryHints(ptr, None)", lambda o: cm.ManagedMemoryHints(o.managed.ptr, None),
     TypeError, "nbytes")
case("ManagedMemoryHints(0, 10)", lambda o: cm.ManagedMemoryHints(0, 10), ValueError,
     "managed")
case("ManagedMemoryHints(device ptr, 10)", lambda o: cm.ManagedMemoryHints(o.dev.ptr, 10),
     ValueError, "managed")
case("ManagedMemoryHints(pinned ptr, 10)", lambda o: cm.ManagedMemoryHints(o.host.ptr, 10),
     ValueError, "managed")
case("ManagedMemoryHints(ptr, past end)",
     lambda o: cm.ManagedMemoryHints(o.managed.ptr, N + 1), ValueError, "outside")
case("ManagedMemoryHints('x', 10)", lambda o: cm.ManagedMemoryHints("x", 10), TypeError,
     "pointer")
case("ManagedMemoryHints.for_buffer(DeviceBuffer)",
     lambda o: cm.ManagedMemoryHints.for_buffer(o.dev), TypeError, "ManagedBuffer")
case("ManagedMemoryHints.for_buffer(offset=-1)",
     lambda o: cm.ManagedMemoryHints.for_buffer(o.managed, offset=-1), ValueError, "offset")
case("ManagedMemoryHints.for_buffer(nbytes=N+1)",
     lambda o: cm.ManagedMemoryHints.for_buffer(o.managed, nbytes=N + 1), ValueError,
     "outside")
case("ManagedMemoryHints.set_preferred_location(99)", lambda o: o.hints.set_preferred_location(99),
     ValueError, "device 99")
case("ManagedMemoryHints.set_accessed_by(host NUMA)",
     lambda o: o.hints.set_accessed_by(cm.Location.host_numa(0)), ValueError, "cannot be")
case("ManagedMemoryHints.unset_accessed_by('x')",
     lambda o: o.hints.unset_accessed_by("x"), TypeError,
     "Location")
case("ManagedMemoryHints.prefetch_range(-1, 10, 0)", lambda o: o.hints.prefetch_range(-1, 10, 0),
     ValueError, "offset")
case("ManagedMemoryHints.prefetch_range(0, 2N, 0)", lambda o: o.hints.prefetch_range(0, 2 * N, 0),
     ValueError, "outside")
case("ManagedMemoryHints.prefetch_range(stream='s')",
     lambda o: o.hints.prefetch_range(0, 10, 0, "s"), TypeError, "stream")
case("ManagedMemoryHints.prefetch_to('gpu')",
     lambda o: o.hints.prefetch_to("gpu"), TypeError, "Location")
case("ManagedMemoryHints.prefetch_to(99)",
     lambda o: o.hints.prefetch_to(99), ValueError, "device 99")
case("ManagedMemoryHints.apply_policy('read_mostly')",
     lambda o: o.hints.apply_policy("read_mostly"),
     TypeError, "policy|MigrationPolicy")
case("ManagedMemoryHints.advise('x')", lambda o: o.hints.advise("x"), TypeError, "advice")
case("ManagedMemoryHints.discard(stream=1.5)", lambda o: o.hints.discard(1.5), TypeError, "stream")

case("MigrationPolicy(read_mostly=1)", lambda o: cm.MigrationPolicy(read_mostly=1), TypeError,
     "read_mostly")
case("MigrationPolicy(preferred_location='gpu')",
     lambda o: cm.MigrationPolicy(preferred_location="gpu"), TypeError, "Location")
case("MigrationPolicy(accessed_by=0)", lambda o: cm.MigrationPolicy(accessed_by=0), TypeError,
     "accessed_by")
case("MigrationPolicy(accessed_by=[host NUMA])",
     lambda o: cm.MigrationPolicy(accessed_by=[cm.Location.host_numa(0)]), ValueError,
     "accessed-by")
case("MigrationPolicy.prefer_device(-1)", lambda o: cm.MigrationPolicy.prefer_device(-1),
     ValueError, "ordinal")
case("MigrationPolicy.prefer_device('0')", lambda o: cm.MigrationPolicy.prefer_device("0"),
     TypeError, "ordinal")
case("MigrationPolicy.prefer('x')", lambda o: cm.MigrationPolicy.prefer("x"), TypeError,
     "Location")
case("MigrationPolicy.with_accessed_by('x')",
     lambda o: cm.MigrationPolicy.default().with_accessed_by("x"), TypeError, "Location")
case("MigrationPolicy.prefer_device(0) | prefer_host()",
     lambda o: cm.MigrationPolicy.prefer_device(0) | cm.MigrationPolicy.prefer_host(),
     ValueError, "merge")
case("MigrationPolicy | 3", lambda o: cm.MigrationPolicy.default() | 3, TypeError, r"\|")

# == PrefetchPlan ==========================================================================

case("PrefetchPlan.add(buf, None)", lambda o: cm.PrefetchPlan().add(o.managed, None), TypeError,
     "destination")
case("PrefetchPlan.add(True, 0)", lambda o: cm.PrefetchPlan().add(True, 0), TypeError, "bool")
case("PrefetchPlan.add('x', 0)", lambda o: cm.PrefetchPlan().add("x", 0), TypeError, "target")
case("PrefetchPlan.add(0, 0)", lambda o: cm.PrefetchPlan().add(0, 0), ValueError, "managed")
case("PrefetchPlan.add(offset=-1)", lambda o: cm.PrefetchPlan().add(o.managed, 0, offset=-1),
     ValueError, "offset")
case("PrefetchPlan.add(nbytes=0)", lambda o: cm.PrefetchPlan().add(o.managed, 0, nbytes=0),
     ValueError, "zero-size|nbytes")
case("PrefetchPlan.add(offset=N)", lambda o: cm.PrefetchPlan().add(o.managed, 0, offset=N),
     ValueError, "zero-size|offset")
case("PrefetchPlan.add(to='gpu')", lambda o: cm.PrefetchPlan().add(o.managed, "gpu").validate(),
     TypeError, "Location")
case("PrefetchPlan.add(ptr, nbytes=0)", lambda o: cm.PrefetchPlan().add(o.managed.ptr, 0, nbytes=0),
     ValueError, "nbytes")
case("PrefetchPlan.add(ptr, offset=-1)",
     lambda o: cm.PrefetchPlan().add(o.managed.ptr, 0, offset=-1), ValueError, "offset")
case("PrefetchPlan.add(closed ManagedBuffer)",
     lambda o: cm.PrefetchPlan().add(o.closed.ManagedBuffer, 0),
     cm.ClosedError, "closed")
case("PrefetchPlan.discard(offset=-1)", lambda o: cm.PrefetchPlan().discard(o.managed, offset=-1),
     ValueError, "offset")
case("PrefetchPlan.discard_and_prefetch(buf, None)",
     lambda o: cm.PrefetchPlan().discard_and_prefetch(o.managed, None), TypeError,
     "destination")
case("PrefetchPlan.execute(device 99)",
     lambda o: cm.PrefetchPlan().add(o.managed, 99).execute(o.stream), ValueError,
     "plan entry 0.*device 99")
case("PrefetchPlan.execute(device pointer)",
     lambda o: cm.PrefetchPlan().add(o.dev.ptr, 0).execute(o.stream), ValueError,
     "plan entry 0.*managed")
case("PrefetchPlan.execute(range past allocation)",
     lambda o: cm.PrefetchPlan().add(o.managed.ptr + 16, 0, nbytes=N).execute(o.stream),
     ValueError, "plan entry 0.*outside")
case("PrefetchPlan.execute(one range, two destinations)",
     lambda o: cm.PrefetchPlan().add(o.managed, 0).add(o.managed, cm.Location.host())
     .execute(o.stream), ValueError, "overlapping")
case("PrefetchPlan.execute(second entry bad)",
     lambda o: cm.PrefetchPlan().add(o.managed, 0, nbytes=64).add(o.managed, 99)
     .execute(o.stream), ValueError, "plan entry 1")
case("PrefetchPlan.execute(buffer closed after add)",
     lambda o: o.plan_of_closed.execute(o.stream), cm.ClosedError, "plan entry 0")
case("PrefetchPlan.execute(stream='s')",
     lambda o: cm.PrefetchPlan().add(o.managed, 0).execute("s"), TypeError, "stream")
case("PrefetchPlan.dry_run(stream=-1)", lambda o: cm.PrefetchPlan().add(o.managed, 0).dry_run(-1),
     ValueError, "stream")
case("PrefetchPlan.execute(batch='yes')",
     lambda o: cm.PrefetchPlan().add(o.managed, 0).add(o.managed, 0).execute(o.stream,
                                                                              batch="yes"),
     TypeError, "batch")

# == VMM ===================================================================================

case("granularity('0')", lambda o: cm.granularity("0"), TypeError, "Location|device")
case("granularity(-1)", lambda o: cm.granularity(-1), ValueError, "ordinal")
case("granularity(99)", lambda o: cm.granularity(99), ValueError, "device 99")
case("granularity(recommended=1)", lambda o: cm.granularity(0, recommended=1), TypeError,
     "recommended")
case("granularity(handle_type='bogus')", lambda o: cm.granularity(0, handle_type="bogus"),
     ValueError, "handle type")
case("granularity(handle_type=3)", lambda o: cm.granularity(0, handle_type=3), ValueError,
     "handle type")
case("granularity(handle_type=1.5)", lambda o: cm.granularity(0, handle_type=1.5), TypeError,
     "handle_type")

for bad, exc, rx in [(0, ValueError, "size"), (-1, ValueError, "size"),
                     ("1", TypeError, "size"), (None, TypeError, "size"),
                     (True, TypeError, "size")]:
    case(f"AddressRange.reserve({bad!r})", lambda o, b=bad: cm.AddressRange.reserve(b), exc, rx)
case("AddressRange.reserve(g+1)", lambda o: cm.AddressRange.reserve(o.g + 1), ValueError,
     "granularity")
case("AddressRange.reserve(alignment=3)", lambda o: cm.AddressRange.reserve(o.g, alignment=3),
     ValueError, "alignment")
case("AddressRange.reserve(alignment=-1)",
     lambda o: cm.AddressRange.reserve(o.g, alignment=-1), ValueError, "alignment")
case("AddressRange.reserve(alignment='x')",
     lambda o: cm.AddressRange.reserve(o.g, alignment="x"), TypeError, "alignment")
case("AddressRange.reserve(fixed_address=1)",
     lambda o: cm.AddressRange.reserve(o.g, fixed_address=1), ValueError, "fixed_address")
case("AddressRange.reserve(fixed_address=-g)",
     lambda o: cm.AddressRange.reserve(o.g, fixed_address=-o.g), ValueError, "fixed_address")
case("AddressRange.reserve(fixed over a live range)",
     lambda o: cm.AddressRange.reserve(o.g, fixed_address=o.range.ptr), ValueError, "collides")
case("AddressRange()", lambda o: cm.AddressRange(), TypeError, "reserve")
case("AddressRange.map('pm')", lambda o: o.range.map("pm"), TypeError, "PhysicalMemory")
case("AddressRange.map(offset=1)", lambda o: o.range.map(o.pm2, offset=1), ValueError, "offset")
case("AddressRange.map(offset=-g)", lambda o: o.range.map(o.pm2, offset=-o.g), ValueError, "offset")
case("AddressRange.map(offset='0')", lambda o: o.range.map(o.pm2, offset="0"), TypeError, "offset")
case("AddressRange.map(offset=size)", lambda o: o.range.map(o.pm2, offset=4 * o.g), ValueError,
     "does not fit")
case("AddressRange.map(over a mapping)", lambda o: o.range.map(o.pm2, offset=0), cm.CudaError,
     "cuMemMap", driver=True)
for bad, exc, rx in [(0, ValueError, "size"), (-1, ValueError, "size"),
                     ("1", TypeError, "size")]:
    case(f"PhysicalMemory.create({bad!r})", lambda o, b=bad: cm.PhysicalMemory.create(b), exc,
         rx)
case("PhysicalMemory.create(g+1)", lambda o: cm.PhysicalMemory.create(o.g + 1), ValueError,
     "granularity")
case("PhysicalMemory.create(device='0')",
     lambda o: cm.PhysicalMemory.create(o.g, device="0"), TypeError, "Location|device")
case("PhysicalMemory.create(device=99)", lambda o: cm.PhysicalMemory.create(o.g, device=99),
     ValueError, "device 99")
case("PhysicalMemory.create(handle_type='x')",
     lambda o: cm.PhysicalMemory.create(o.g, handle_type="x"), ValueError, "handle type")
case("PhysicalMemory.create(location='host')",
     lambda o: cm.PhysicalMemory.create(o.g, location="host"), TypeError, "Location")
case("PhysicalMemory()", lambda o: cm.PhysicalMemory(), TypeError, "create")
case("PhysicalMemory.import_(-1, g)", lambda o: cm.PhysicalMemory.import_(-1, o.g), ValueError,
     "fd")
case("PhysicalMemory.import_('3', g)", lambda o: cm.PhysicalMemory.import_("3", o.g),
     TypeError, "fd")
case("PhysicalMemory.import_(closed fd, g)",
     lambda o: cm.PhysicalMemory.import_(o.closed_fd, o.g), ValueError, "not open")
case("PhysicalMemory.import_(fd, 0)", lambda o: cm.PhysicalMemory.import_(0, 0), ValueError,
     "size")
case("PhysicalMemory.import_(handle_type=NONE)",
     lambda o: cm.PhysicalMemory.import_(0, o.g, handle_type=cm.HandleType.NONE), ValueError,
     "POSIX_FD")
case("PhysicalMemory.export() (no handle type)", lambda o: o.pm.export(), ValueError, "handle type")
case("PhysicalMemory.export(handle_type='bogus')", lambda o: o.pm.export("bogus"), ValueError,
     "handle type")
case("Mapping.set_access(99)", lambda o: o.mapping.set_access(99), ValueError,
     "does not exist")
case("Mapping.set_access([])", lambda o: o.mapping.set_access([]), ValueError, "no target")
case("Mapping.set_access('0')", lambda o: o.mapping.set_access("0"), TypeError, "targets")
case("Mapping.set_access(0, access=2)", lambda o: o.mapping.set_access(0, 2), ValueError,
     "access")
case("Mapping.set_access(0, 'rw')", lambda o: o.mapping.set_access(0, "rw"), TypeError,
     "access|Access")
case("Mapping.set_access(0, True)", lambda o: o.mapping.set_access(0, True), TypeError,
     "access|Access")
case("Mapping.access(99)", lambda o: o.mapping.access(99), ValueError, "does not exist")
case("Mapping.access('0')", lambda o: o.mapping.access("0"), TypeError, "Location")
case("Mapping()", lambda o: cm.Mapping(), TypeError, "map")

case("GrowableBuffer(0)", lambda o: cm.GrowableBuffer(0), ValueError, "max_size")
case("GrowableBuffer('1')", lambda o: cm.GrowableBuffer("1"), TypeError, "max_size")
case("GrowableBuffer(device='0')", lambda o: cm.GrowableBuffer(o.g, device="0"), TypeError,
     "device")
case("GrowableBuffer(device=-1)", lambda o: cm.GrowableBuffer(o.g, device=-1), ValueError,
     "device")
case("GrowableBuffer(chunk=g+1)", lambda o: cm.GrowableBuffer(o.g, chunk=o.g + 1), ValueError,
     "chunk")
case("GrowableBuffer(chunk=0)", lambda o: cm.GrowableBuffer(o.g, chunk=0), ValueError, "chunk")
case("GrowableBuffer(peers=[99])", lambda o: cm.GrowableBuffer(o.g, peers=[99]), ValueError,
     "peer")
case("GrowableBuffer(peers=5)", lambda o: cm.GrowableBuffer(o.g, peers=5), TypeError, "peers")
case("GrowableBuffer.resize(-1)", lambda o: o.grow.resize(-1), ValueError, "nbytes")
case("GrowableBuffer.resize(max_size + 1)", lambda o: o.grow.resize(4 * o.g + 1), ValueError,
     "max_size")
case("GrowableBuffer.resize('1')", lambda o: o.grow.resize("1"), TypeError, "nbytes")
case("GrowableBuffer.resize(1.5)", lambda o: o.grow.resize(1.5), TypeError, "nbytes")
case("GrowableBuffer.grant_access(99)",
     lambda o: o.grow.grant_access(99), ValueError, "does not exist")
case("GrowableBuffer.grant_access(host)",
     lambda o: o.grow.grant_access(cm.Location.host()), ValueError,
     "devices")
case("GrowableBuffer.grant_access(0, NONE)", lambda o: o.grow.grant_access(0, cm.Access.NONE),
     ValueError, "owning")
case("GrowableBuffer.grant_access(0, 7)", lambda o: o.grow.grant_access(0, 7), ValueError, "access")
case("GrowableBuffer.access('0')", lambda o: o.grow.access("0"), TypeError, "ordinal|device")

# == MemoryPool and PoolBuffer ==============================================================

for kw, bad, exc, rx in [("device", "0", TypeError, "device"), ("device", -1, ValueError, "device"),
                         ("device", True, TypeError, "device"),
                         ("managed", 1, TypeError, "managed"), ("ipc", "yes", TypeError, "ipc"),
                         ("max_size", -1, ValueError, "max_size"),
                         ("max_size", "1", TypeError, "max_size"),
                         ("max_size", 1 << 64, ValueError, "max_size"),
                         ("release_threshold", -1, ValueError, "release_threshold"),
                         ("release_threshold", 1.5, TypeError, "release_threshold"),
                         ("location", "host", TypeError, "Location"),
                         ("location", cm.Location.host_numa_current(), ValueError, "location")]:
    case(f"MemoryPool({kw}={bad!r})", lambda o, k=kw, b=bad: cm.MemoryPool(**{k: b}), exc, rx)
case("MemoryPool(Location.host(), ipc=True)",
     lambda o: cm.MemoryPool(location=cm.Location.host(), ipc=True), ValueError, "ipc")
case("MemoryPool(managed=True, max_size=1)",
     lambda o: cm.MemoryPool(managed=True, max_size=1), ValueError, "max_size")
case("MemoryPool(managed=True, ipc=True)", lambda o: cm.MemoryPool(managed=True, ipc=True),
     ValueError, "ipc")
case("MemoryPool(99)", lambda o: cm.MemoryPool(99), ValueError, "DEVICE|device", driver=True)
case("MemoryPool.default('0')", lambda o: cm.MemoryPool.default("0"), TypeError, "device")
case("MemoryPool.default(-1)", lambda o: cm.MemoryPool.default(-1), ValueError, "device")
case("MemoryPool.default(99)", lambda o: cm.MemoryPool.default(99), ValueError,
     "DEVICE|device", driver=True)
case("MemoryPool.import_('3')", lambda o: cm.MemoryPool.import_("3"), TypeError, "fd")
case("MemoryPool.import_(-1)", lambda o: cm.MemoryPool.import_(-1), ValueError, "descriptor")
case("MemoryPool.import_(True)", lambda o: cm.MemoryPool.import_(True), TypeError, "fd")
for bad, exc in [(0, ValueError), (-1, ValueError), ("1", TypeError), (1.5, TypeError),
                 (True, TypeError), (None, TypeError)]:
    case(f"MemoryPool.allocate({bad!r})", lambda o, b=bad: o.pool.allocate(b, stream=o.stream), exc,
         "nbytes")
case("MemoryPool.allocate(no stream)", lambda o: o.pool.allocate(N), TypeError, "stream")
case("MemoryPool.allocate(stream='s')", lambda o: o.pool.allocate(N, stream="s"), TypeError,
     "stream")
case("MemoryPool.allocate(stream=-1)",
     lambda o: o.pool.allocate(N, stream=-1), ValueError, "stream")
case("MemoryPool.allocate(stream=closed Stream)",
     lambda o: o.pool.allocate(N, stream=o.closed.Stream), cm.ClosedError, "closed")


def _set(attr: str, value: Any) -> Callable[[SimpleNamespace], Any]:
    return lambda o: setattr(o.pool, attr, value)


case("MemoryPool.release_threshold = -1", _set("release_threshold", -1), ValueError,
     "release_threshold")
case("MemoryPool.release_threshold = '1'", _set("release_threshold", "1"), TypeError,
     "release_threshold")
case("MemoryPool.release_threshold = 2**64", _set("release_threshold", 1 << 64), ValueError,
     "release_threshold")
for attr in ("reuse_follow_event_dependencies", "reuse_allow_opportunistic",
             "reuse_allow_internal_dependencies"):
    case(f"MemoryPool.{attr} = 2", _set(attr, 2), TypeError, "bool")
    case(f"MemoryPool.{attr} = 'yes'", _set(attr, "yes"), TypeError, "bool")
case("MemoryPool.trim(-1)", lambda o: o.pool.trim(-1), ValueError, "keep_bytes")
case("MemoryPool.trim('1')", lambda o: o.pool.trim("1"), TypeError, "keep_bytes")
case("MemoryPool.set_access(0, 'rw')", lambda o: o.pool.set_access(0, "rw"), TypeError, "access")
case("MemoryPool.set_access(0, 2)", lambda o: o.pool.set_access(0, 2), ValueError, "Access")
case("MemoryPool.set_access([], RW)", lambda o: o.pool.set_access([], cm.Access.READWRITE),
     ValueError, "no device")
case("MemoryPool.set_access('gpu', RW)", lambda o: o.pool.set_access("gpu", cm.Access.READWRITE),
     TypeError, "Location")
case("MemoryPool.set_access(99, RW)", lambda o: o.pool.set_access(99, cm.Access.READWRITE),
     ValueError, "does not exist")
case("MemoryPool.access(99)", lambda o: o.pool.access(99), ValueError, "does not exist")
case("MemoryPool.access('0')", lambda o: o.pool.access("0"), TypeError, "Location")
case("MemoryPool.export() (not ipc)", lambda o: o.pool.export(), ValueError, "ipc")
case("MemoryPool.import_pointer('x')", lambda o: o.pool.import_pointer("x"), TypeError, "data")
case("MemoryPool.import_pointer(b'x')",
     lambda o: o.pool.import_pointer(b"x"), ValueError, "64 bytes")
case("MemoryPool.import_pointer(nbytes=0)",
     lambda o: o.pool.import_pointer(bytes(64), nbytes=0), ValueError, "nbytes")
case("MemoryPool.import_pointer(nbytes='1')",
     lambda o: o.pool.import_pointer(bytes(64), nbytes="1"), TypeError, "nbytes")
case("MemoryPool.import_pointer(stream='s')",
     lambda o: o.pool.import_pointer(bytes(64), stream="s"), TypeError, "stream")
case("MemoryPool.close() with a live buffer", lambda o: o.pool.close(), BufferError, "free them")
case("PoolBuffer.array (device pool)", lambda o: o.pool_buf.array, TypeError,
     "host-accessible")
case("PoolBuffer.export() (not ipc)", lambda o: o.pool_buf.export(), ValueError, "ipc")
case("PoolBuffer.free(stream='s')", lambda o: o.pool_buf.free("s"), TypeError, "stream")
case("PoolBuffer.free(stream=closed Stream)", lambda o: o.pool_buf.free(o.closed.Stream),
     cm.ClosedError, "closed")
case("PoolBuffer()", lambda o: cm.PoolBuffer(), TypeError, "allocate")

# == closed objects of every kind, in every method ========================================

CLOSED: dict[str, list[tuple[str, Callable[[Any, SimpleNamespace], Any]]]] = {
    "HostBuffer": [
        ("ptr", lambda b, o: b.ptr), ("array", lambda b, o: b.array),
        ("device_ptr", lambda b, o: b.device_ptr),
        ("copy_from", lambda b, o: b.copy_from(np.zeros(N, np.uint8))),
        ("copy_to", lambda b, o: b.copy_to(np.zeros(N, np.uint8))),
        ("to_numpy", lambda b, o: b.to_numpy()), ("__array__", lambda b, o: np.asarray(b)),
        ("with", lambda b, o: b.__enter__()), ("copy(dst)", lambda b, o: cm.copy(b, o.host)),
        ("copy(src)", lambda b, o: cm.copy(o.host, b)),
        ("register_host(array)", lambda b, o: cm.register_host(b.array)),
    ],
    "RegisteredHost": [
        ("ptr", lambda b, o: b.ptr), ("array", lambda b, o: b.array),
        ("device_ptr", lambda b, o: b.device_ptr), ("with", lambda b, o: b.__enter__()),
        ("copy(src)", lambda b, o: cm.copy(o.host, b)),
    ],
    "DeviceBuffer": [
        ("ptr", lambda b, o: b.ptr), ("to_numpy", lambda b, o: b.to_numpy()),
        ("memset", lambda b, o: b.memset(0)), ("as_array", lambda b, o: b.as_array()),
        ("__cuda_array_interface__", lambda b, o: b.__cuda_array_interface__),
        ("__dlpack__", lambda b, o: b.__dlpack__()), ("with", lambda b, o: b.__enter__()),
        ("copy(dst)", lambda b, o: cm.copy(b, o.host)),
        ("copy_async(src)", lambda b, o: cm.copy_async(o.host, b, stream=o.stream)),
    ],
    "ManagedBuffer": [
        ("ptr", lambda b, o: b.ptr), ("nbytes", lambda b, o: b.nbytes),
        ("array", lambda b, o: b.array), ("to_numpy", lambda b, o: b.to_numpy()),
        ("attach", lambda b, o: b.attach(o.stream)),
        ("advise", lambda b, o: b.advise(cm.MemAdvice.SET_READ_MOSTLY)),
        ("prefetch", lambda b, o: b.prefetch(0)), ("discard", lambda b, o: b.discard()),
        ("discard_and_prefetch", lambda b, o: b.discard_and_prefetch(0)),
        ("range_info", lambda b, o: b.range_info()), ("as_array", lambda b, o: b.as_array()),
        ("__cuda_array_interface__", lambda b, o: b.__cuda_array_interface__),
        ("with", lambda b, o: b.__enter__()),
        ("ManagedMemoryHints.for_buffer", lambda b, o: cm.ManagedMemoryHints.for_buffer(b)),
        ("copy(dst)", lambda b, o: cm.copy(b, o.host)),
    ],
    "PoolBuffer": [
        ("ptr", lambda b, o: b.ptr), ("nbytes", lambda b, o: b.nbytes),
        ("free", lambda b, o: b.free()), ("export", lambda b, o: b.export()),
        ("as_array", lambda b, o: b.as_array()),
        ("__cuda_array_interface__", lambda b, o: b.__cuda_array_interface__),
        ("with", lambda b, o: b.__enter__()), ("copy(dst)", lambda b, o: cm.copy(b, o.host)),
    ],
    "HostPoolBuffer": [
        ("array", lambda b, o: b.array), ("free", lambda b, o: b.free()),
        ("copy(src)", lambda b, o: cm.copy(o.host, b)),
    ],
    "MemoryPool": [
        ("allocate", lambda p, o: p.allocate(N, stream=o.stream)),
        ("handle", lambda p, o: p.handle),
        ("release_threshold", lambda p, o: p.release_threshold),
        ("release_threshold=", lambda p, o: setattr(p, "release_threshold", 0)),
        ("reuse_allow_opportunistic", lambda p, o: p.reuse_allow_opportunistic),
        ("reuse_allow_opportunistic=", lambda p, o: setattr(p, "reuse_allow_opportunistic", 1)),
        ("stats", lambda p, o: p.stats()), ("reset_peaks", lambda p, o: p.reset_peaks()),
        ("trim", lambda p, o: p.trim()),
        ("set_access", lambda p, o: p.set_access(0, cm.Access.READWRITE)),
        ("access", lambda p, o: p.access(0)), ("export", lambda p, o: p.export()),
        ("import_pointer", lambda p, o: p.import_pointer(bytes(64))),
        ("with", lambda p, o: p.__enter__()),
    ],
    "HostMemoryPool": [
        ("HostBuffer.empty(pool=)", lambda p, o: cm.HostBuffer.empty(N, pool=p)),
        ("HostBuffer.pooled(pool=)", lambda p, o: cm.HostBuffer.pooled(N, pool=p)),
        ("allocate", lambda p, o: p.allocate(N, stream=o.stream)),
    ],
    "Stream": [
        ("handle", lambda s, o: s.handle), ("synchronize", lambda s, o: s.synchronize()),
        ("query", lambda s, o: s.query()), ("__cuda_stream__", lambda s, o: s.__cuda_stream__()),
        ("with", lambda s, o: s.__enter__()),
        ("copy(stream=)", lambda s, o: cm.copy(o.dev, o.host, stream=s)),
        ("pool.allocate(stream=)", lambda s, o: o.pool.allocate(N, stream=s)),
        ("prefetch(stream=)", lambda s, o: o.managed.prefetch(0, stream=s)),
        ("plan.execute(stream=)", lambda s, o: cm.PrefetchPlan().add(o.managed, 0).execute(s)),
        ("DeviceBuffer.memset(stream=)", lambda s, o: o.dev.memset(0, stream=s)),
    ],
    "AddressRange": [
        ("ptr", lambda r, o: r.ptr), ("map", lambda r, o: r.map(o.pm2)),
        ("with", lambda r, o: r.__enter__()),
    ],
    "PhysicalMemory": [
        ("handle", lambda p, o: p.handle), ("export", lambda p, o: p.export()),
        ("AddressRange.map", lambda p, o: o.range.map(p, offset=3 * o.g)),
        ("with", lambda p, o: p.__enter__()),
    ],
    "Mapping": [
        ("ptr", lambda m, o: m.ptr), ("nbytes", lambda m, o: m.nbytes),
        ("set_access", lambda m, o: m.set_access(0)), ("access", lambda m, o: m.access()),
        ("as_array", lambda m, o: m.as_array()),
        ("__cuda_array_interface__", lambda m, o: m.__cuda_array_interface__),
        ("with", lambda m, o: m.__enter__()), ("copy(dst)", lambda m, o: cm.copy(m, o.host)),
    ],
    "GrowableBuffer": [
        ("ptr", lambda b, o: b.ptr), ("nbytes", lambda b, o: b.nbytes),
        ("resize", lambda b, o: b.resize(o.g)), ("grant_access", lambda b, o: b.grant_access(0)),
        ("as_array", lambda b, o: b.as_array()),
        ("__cuda_array_interface__", lambda b, o: b.__cuda_array_interface__),
        ("with", lambda b, o: b.__enter__()), ("copy(dst)", lambda b, o: cm.copy(b, o.host)),
    ],
}
CLOSED["HostBuffer.pooled"] = CLOSED["HostBuffer"]

for kind, methods in CLOSED.items():
    for meth, fn in methods:
        case(f"closed {kind}.{meth}",
             lambda o, k=kind, f=fn: f(getattr(o.closed, k.replace(".", "_")), o),
             cm.ClosedError, "closed|freed|unmapped")


# == the test ==========================================================================


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_bad_input(c: Case, o: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    with nothing_allocated(monkeypatch, driver_may_refuse=c.driver), \
            pytest.raises(c.exc) as info:
        c.call(o)
    err = info.value
    import re

    assert re.search(c.match, str(err)), (
        f"{type(err).__name__}: {err!s} does not match {c.match!r} (must name the argument)")
    if not c.driver:
        assert not isinstance(err, cm.CudaError), (
            f"{type(err).__name__} from the driver: the argument should be refused before it")
        assert type(err) is c.exc, f"raised {type(err).__name__}, expected exactly {c.exc.__name__}"


def test_the_matrix_is_large_and_covers_every_public_callable() -> None:
    assert len(CASES) >= 150
    ids = " ".join(c.id for c in CASES)
    not_callables = {"__version__", "LocationType"}
    records = {"PlanEntry", "PlannedCall", "PoolStats", "RangeInfo", "HostAllocFlags",
               "HostRegisterFlags", "AttachFlags", "MemAdvice", "Access", "HandleType",
               "backend_name", "device_count"}
    for name in cm.__all__:
        obj = getattr(cm, name)
        if (name in not_callables or name in records or not callable(obj)
                or (isinstance(obj, type) and issubclass(obj, BaseException))):
            continue
        assert name in ids, f"no bad-input case for cuda_memkit.{name}"


@pytest.mark.parametrize("kind", sorted(CLOSED))
def test_double_close_is_a_no_op(kind: str, o: SimpleNamespace) -> None:
    obj = getattr(o.closed, kind.replace(".", "_"))
    obj.close()
    obj.close()
    assert obj.closed
