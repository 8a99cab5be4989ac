"""Bad-input cases, part 2: managed memory, hints, plans, VMM, pools, closed objects."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

import cuda_memkit as cm

from ._bad_input_table import N, case

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
for kw2, exc2, rx2 in [
        ({"cache": 1}, TypeError, "cache"),
        ({"cache": True, "cache_limit": -1}, ValueError, "cache_limit"),
        ({"cache": True, "cache_limit": 1.5}, TypeError, "cache_limit"),
        ({"cache": True, "cache_limit": True}, TypeError, "cache_limit"),
        ({"cache": True, "cache_limit": "1"}, TypeError, "cache_limit"),
        ({"cache_limit": 1 << 20}, ValueError, "cache_limit needs cache=True")]:
    case(f"MemoryPool({kw2!r})", lambda o, k=kw2: cm.MemoryPool(**k), exc2, rx2)
case("MemoryPool.default(cache=1)", lambda o: cm.MemoryPool.default(0, cache=1), TypeError,
     "cache")
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
        ("fill", lambda b, o: b.fill(0)), ("as_array", lambda b, o: b.as_array()),
        ("__cuda_array_interface__", lambda b, o: b.__cuda_array_interface__),
        ("__dlpack__", lambda b, o: b.__dlpack__()), ("with", lambda b, o: b.__enter__()),
        ("copy(dst)", lambda b, o: cm.copy(b, o.host)),
        ("copy_async(src)", lambda b, o: cm.copy_async(o.host, b, stream=o.stream)),
    ],
    "ManagedBuffer": [
        ("ptr", lambda b, o: b.ptr),
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
        ("ptr", lambda b, o: b.ptr),
        ("export", lambda b, o: b.export()),
        ("as_array", lambda b, o: b.as_array()),
        ("__cuda_array_interface__", lambda b, o: b.__cuda_array_interface__),
        ("with", lambda b, o: b.__enter__()), ("copy(dst)", lambda b, o: cm.copy(b, o.host)),
    ],
    "HostPoolBuffer": [
        ("array", lambda b, o: b.array),
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
        ("DeviceBuffer.fill(stream=)", lambda s, o: o.dev.fill(0, stream=s)),
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
        ("ptr", lambda m, o: m.ptr),
        ("set_access", lambda m, o: m.set_access(0)), ("access", lambda m, o: m.access()),
        ("as_array", lambda m, o: m.as_array()),
        ("__cuda_array_interface__", lambda m, o: m.__cuda_array_interface__),
        ("with", lambda m, o: m.__enter__()), ("copy(dst)", lambda m, o: cm.copy(m, o.host)),
    ],
    "GrowableBuffer": [
        ("ptr", lambda b, o: b.ptr),
        ("resize", lambda b, o: b.resize(o.g)), ("grant_access", lambda b, o: b.grant_access(0)),
        ("set_access", lambda b, o: b.set_access(0)),
        ("as_array", lambda b, o: b.as_array()),
        ("__cuda_array_interface__", lambda b, o: b.__cuda_array_interface__),
        ("with", lambda b, o: b.__enter__()), ("copy(dst)", lambda b, o: cm.copy(b, o.host)),
    ],
}
#: The buffer contract (cuda_memkit.Buffer): everything that touches the memory refuses.
CONTRACT: list[tuple[str, Callable[[Any, SimpleNamespace], Any]]] = [
    ("fill", lambda b, o: b.fill(0)), ("fill(stream=)", lambda b, o: b.fill(0, stream=o.stream)),
    ("copy_from", lambda b, o: b.copy_from(np.zeros(N, np.uint8))),
    ("copy_to", lambda b, o: b.copy_to(np.zeros(N, np.uint8))),
    ("copy_to(stream=)", lambda b, o: b.copy_to(o.dev, stream=o.stream)),
    ("to_numpy", lambda b, o: b.to_numpy()), ("to_numpy(u1)", lambda b, o: b.to_numpy("u1")),
]
for _kind in ("HostBuffer", "RegisteredHost", "DeviceBuffer", "ManagedBuffer", "PoolBuffer",
              "HostPoolBuffer", "Mapping", "GrowableBuffer"):
    _have = {m for m, _ in CLOSED[_kind]}
    CLOSED[_kind] += [(m, f) for m, f in CONTRACT if m not in _have]
CLOSED["HostBuffer.pooled"] = CLOSED["HostBuffer"]

for kind, methods in CLOSED.items():
    for meth, fn in methods:
        case(f"closed {kind}.{meth}",
             lambda o, k=kind, f=fn: f(getattr(o.closed, k.replace(".", "_")), o),
             cm.ClosedError, "closed|freed|unmapped")


