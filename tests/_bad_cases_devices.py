"""Bad-input cases: module functions, the backend, devices, locations, streams and peer access."""

from __future__ import annotations

import cuda_memkit as cm

from ._bad_input_table import case

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

# == peer access between devices ======================================================

case("configure_peer_access(auto=1)", lambda o: cm.configure_peer_access(auto=1), TypeError,
     "auto")
case("configure_peer_access(auto=None)", lambda o: cm.configure_peer_access(auto=None),
     TypeError, "auto")
case("PeerAccessSettings(auto='yes')", lambda o: cm.PeerAccessSettings(auto="yes"), TypeError,
     "auto")
for _m in ("enable_peer_access", "disable_peer_access", "peer_access_enabled"):
    for _bad, _exc, _rx in [(0, ValueError, "not a peer of itself"),
                            (99, ValueError, "peer 99 does not exist"),
                            ("1", TypeError, "peer must be"), (True, TypeError, "peer must be"),
                            (-1, ValueError, "peer ordinal")]:
        case(f"Device.{_m}({_bad!r})",
             lambda o, m=_m, b=_bad: getattr(cm.Device(0), m)(b), _exc, _rx)
for _bad, _exc, _rx in [(1, TypeError, "peers must be an iterable"),
                        ("1", TypeError, "peers must be an iterable"),
                        ([99], ValueError, "peer 99 does not exist"),
                        (["1"], TypeError, "peer must be"), ([-1], ValueError, "peer ordinal")]:
    case(f"MemoryPool(peers={_bad!r})", lambda o, b=_bad: cm.MemoryPool(0, peers=b), _exc, _rx)
case("MemoryPool(Location.host(), peers=[0])",
     lambda o: cm.MemoryPool(location=cm.Location.host(), peers=[0]), ValueError, "peers=")
case("MemoryPool(managed=True, peers=[1])",
     lambda o: cm.MemoryPool(managed=True, peers=[1]), ValueError, "peers=")
for _bad, _exc, _rx in [(0, ValueError, "nbytes"), ("1", TypeError, "nbytes"),
                        (-5, ValueError, "nbytes")]:
    case(f"GrowableBuffer.registrable({_bad!r})",
         lambda o, b=_bad: cm.GrowableBuffer.registrable(b), _exc, _rx)
case("GrowableBuffer.registrable(device='0')",
     lambda o: cm.GrowableBuffer.registrable(1 << 20, device="0"), TypeError, "device")
case("GrowableBuffer.registrable(peers=1)",
     lambda o: cm.GrowableBuffer.registrable(1 << 20, peers=1), TypeError, "peers")
case("GrowableBuffer(handle_type='bogus')",
     lambda o: cm.GrowableBuffer(1 << 21, handle_type="bogus"), ValueError, "handle type")
case("GrowableBuffer(handle_type=True)",
     lambda o: cm.GrowableBuffer(1 << 21, handle_type=True), TypeError, "handle_type")
