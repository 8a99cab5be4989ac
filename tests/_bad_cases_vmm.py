"""Bad-input cases: virtual memory (ranges, physical memory, mappings, growable buffers)."""

from __future__ import annotations

import cuda_memkit as cm

from ._bad_input_table import case

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

for bad, exc, rx in [(0, ValueError, "nbytes"), (-1, ValueError, "nbytes"),
                     ("1", TypeError, "nbytes"), (None, TypeError, "nbytes"),
                     (True, TypeError, "nbytes")]:
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
for bad, exc, rx in [(0, ValueError, "nbytes"), (-1, ValueError, "nbytes"),
                     ("1", TypeError, "nbytes")]:
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
     "nbytes")
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
case("GrowableBuffer.set_access(99)",
     lambda o: o.grow.set_access(99), ValueError, "does not exist")
case("GrowableBuffer.set_access(host)",
     lambda o: o.grow.set_access(cm.Location.host()), ValueError, "takes devices")
case("GrowableBuffer.set_access([])", lambda o: o.grow.set_access([]), ValueError, "no target")
case("GrowableBuffer.set_access('0')", lambda o: o.grow.set_access("0"), TypeError, "devices")
case("GrowableBuffer.set_access(0, NONE)", lambda o: o.grow.set_access(0, cm.Access.NONE),
     ValueError, "owning device")
case("GrowableBuffer.set_access(0, 7)", lambda o: o.grow.set_access(0, 7), ValueError, "access")
case("GrowableBuffer.grant_access(99)",
     lambda o: o.grow.grant_access(99), ValueError, "does not exist")
case("GrowableBuffer.grant_access(host)",
     lambda o: o.grow.grant_access(cm.Location.host()), ValueError,
     "devices")
case("GrowableBuffer.grant_access(0, NONE)", lambda o: o.grow.grant_access(0, cm.Access.NONE),
     ValueError, "owning")
case("GrowableBuffer.grant_access(0, 7)", lambda o: o.grow.grant_access(0, 7), ValueError, "access")
case("GrowableBuffer.access('0')", lambda o: o.grow.access("0"), TypeError, "ordinal|device")
