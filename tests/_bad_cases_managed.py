"""Bad-input cases: managed memory, its hints and policies, prefetch plans."""

from __future__ import annotations

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
