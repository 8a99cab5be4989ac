"""Bad-input cases, part 1: module functions, devices, pinned, registered, copies, device memory."""

from __future__ import annotations

import numpy as np

import cuda_memkit as cm

from ._bad_input_table import N, case

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
     lambda o: o.host_f32.copy_from(cm.DeviceBuffer.empty(0)), ValueError, "size|bytes")
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
    case(f"DeviceBuffer.empty({bad!r})", lambda o, b=bad: cm.DeviceBuffer.empty(b), exc,
         "shape")
case("DeviceBuffer.empty(device='0')", lambda o: cm.DeviceBuffer.empty(N, device="0"),
     TypeError, "device")
case("DeviceBuffer.empty(device=-1)", lambda o: cm.DeviceBuffer.empty(N, device=-1),
     ValueError, "device")
case("DeviceBuffer.empty(device=99)", lambda o: cm.DeviceBuffer.empty(N, device=99),
     ValueError, "DEVICE|device", driver=True)
case("DeviceBuffer(1)", lambda o: cm.DeviceBuffer(1), TypeError, "empty")
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
     lambda o: cm.DeviceBuffer.empty(0).to_numpy(np.float64, 1), ValueError, "bytes")
for bad, exc in [(256, ValueError), (-1, ValueError), ("a", TypeError), (1.0, TypeError),
                 (True, TypeError)]:
    case(f"DeviceBuffer.fill({bad!r})", lambda o, b=bad: o.dev.fill(b), exc, "value")
case("DeviceBuffer.fill(stream='s')", lambda o: o.dev.fill(0, stream="s"), TypeError,
     "stream")
case("DeviceBuffer.as_array(object)", lambda o: o.dev.as_array(object), TypeError, "object")
case("DeviceBuffer.as_array(float64, too big)", lambda o: o.dev.as_array(np.float64, N),
     ValueError, "bytes")
case("DeviceBuffer.as_array(shape=(2, -1))", lambda o: o.dev.as_array("u1", (2, -1)),
     ValueError, "shape")
case("DeviceBuffer.as_array(dtype='V0')", lambda o: o.dev.as_array("V0"), TypeError, "size")

