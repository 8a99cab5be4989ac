"""Bad-input cases: device memory and the buffer contract every live kind shares."""

from __future__ import annotations

import numpy as np

import cuda_memkit as cm

from ._bad_input_table import N, case

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

# == the buffer contract, on every live kind =============================================

BUFFERS = {"HostBuffer": "host", "HostBuffer(float32)": "host_f32", "RegisteredHost": "reg",
           "DeviceBuffer": "dev", "ManagedBuffer": "managed", "PoolBuffer": "pool_buf",
           "Mapping": "mapping", "GrowableBuffer": "grow"}
for _name, _attr in BUFFERS.items():
    def _b(o, a=_attr):  # type: ignore[no-untyped-def]
        return getattr(o, a)

    for _bad, _exc, _rx in [("a", TypeError, "value"), (True, TypeError, "value"),
                            (None, TypeError, "value"),
                            (np.complex128(1 + 2j), ValueError, "pattern"),
                            (np.datetime64(1, "s"), ValueError, "numbers")]:
        case(f"{_name}.fill({_bad!r})", lambda o, b=_b, v=_bad: b(o).fill(v), _exc, _rx)
    case(f"{_name}.fill(stream='s')", lambda o, b=_b: b(o).fill(np.uint8(0), stream="s"),
         TypeError, "stream")
    case(f"{_name}.to_numpy(object)", lambda o, b=_b: b(o).to_numpy(object), TypeError,
         "object")
    case(f"{_name}.to_numpy(shape too big)", lambda o, b=_b: b(o).to_numpy("u1", 1 << 40),
         ValueError, "needs|bytes")
    case(f"{_name}.to_numpy(shape=-1)", lambda o, b=_b: b(o).to_numpy("u1", -1), ValueError,
         "shape")
    case(f"{_name}.copy_from(3 bytes)", lambda o, b=_b: b(o).copy_from(np.zeros(3, np.uint8)),
         ValueError, "mismatch")
    case(f"{_name}.copy_to(3 bytes)", lambda o, b=_b: b(o).copy_to(np.zeros(3, np.uint8)),
         ValueError, "mismatch")
    case(f"{_name}.copy_to(read-only)", lambda o, b=_b: b(o).copy_to(o.ro_array), ValueError,
         "read-only")
    case(f"{_name}.copy_from(object array)",
         lambda o, b=_b: b(o).copy_from(np.array([object()] * 4)), TypeError, "object")
    case(f"{_name}.copy_from(stream='s')", lambda o, b=_b: b(o).copy_from(o.dev, stream="s"),
         TypeError, "stream")
    case(f"{_name}.copy_to(stream='s')", lambda o, b=_b: b(o).copy_to(o.dev, stream="s"),
         TypeError, "stream")

case("HostBuffer.fill(256)", lambda o: o.host.fill(256), ValueError, "value")
case("HostBuffer(float32).fill(np.float64(0.1))", lambda o: o.host_f32.fill(np.float64(0.1)),
     ValueError, "pattern")
case("HostBuffer(0-d, 1 byte).fill(np.uint32(1))",
     lambda o: o.host0d.fill(np.uint32(1)), ValueError, "elements")
case("RegisteredHost.fill (READ_ONLY)", lambda o: o.reg_ro.fill(0), ValueError, "READ_ONLY")
case("RegisteredHost.copy_from (READ_ONLY)", lambda o: o.reg_ro.copy_from(o.dev), ValueError,
     "READ_ONLY")
for _bad, _exc, _rx in [("1", TypeError, "shape"), (-1, ValueError, "shape"),
                        ((2, 2), TypeError, "shape"), (None, TypeError, "shape")]:
    case(f"DeviceBuffer.zeros({_bad!r})", lambda o, b=_bad: cm.DeviceBuffer.zeros(b), _exc, _rx)
case("DeviceBuffer.empty((2, -1), float32)",
     lambda o: cm.DeviceBuffer.empty((2, -1), np.float32), ValueError, "shape|>= 0")
case("DeviceBuffer.empty(4, object)", lambda o: cm.DeviceBuffer.empty(4, object), TypeError,
     "object")
case("DeviceBuffer.zeros(4, 'V0')", lambda o: cm.DeviceBuffer.zeros(4, "V0"), TypeError, "size")
case("DeviceBuffer.zeros(device='0')", lambda o: cm.DeviceBuffer.zeros(4, device="0"),
     TypeError, "device")
case("DeviceBuffer.empty(float32, overflow)",
     lambda o: cm.DeviceBuffer.empty((1 << 62, 4), np.float32), ValueError, "bytes")
