"""Bad-input cases: pinned host memory and registered host arrays."""

from __future__ import annotations

import numpy as np

import cuda_memkit as cm

from ._bad_input_table import N, case

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
