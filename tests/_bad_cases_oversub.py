"""Bad-input cases: AccessPlan, its runs and chunks, and PrefetchPlan's ``exact``.

The objects are those of the ``o`` fixture of test_bad_input.py (``o.managed`` holds
N bytes of uint8).
"""

from __future__ import annotations

import cuda_memkit as cm

from ._bad_input_table import N, case

case("AccessPlan(lookahead=0)", lambda o: cm.AccessPlan(lookahead=0), ValueError, "lookahead")
case("AccessPlan(lookahead=1.5)", lambda o: cm.AccessPlan(lookahead=1.5), TypeError,
     "lookahead")
case("AccessPlan.add(a DeviceBuffer)", lambda o: cm.AccessPlan().add(o.dev), TypeError,
     "ManagedBuffer")
case("AccessPlan.add(an int pointer)", lambda o: cm.AccessPlan().add(o.managed.ptr), TypeError,
     "ManagedBuffer")
case("AccessPlan.add(an empty buffer)", lambda o: cm.AccessPlan().add(o.managed0), ValueError,
     "empty")
case("AccessPlan.add(a closed buffer)", lambda o: cm.AccessPlan().add(o.closed.ManagedBuffer),
     cm.ClosedError, "closed")
case("AccessPlan.add(offset past the end)",
     lambda o: cm.AccessPlan().add(o.managed, offset=N + 1), ValueError, "offset")
case("AccessPlan.add(nbytes=0)", lambda o: cm.AccessPlan().add(o.managed, nbytes=0),
     ValueError, "zero-size")
case("AccessPlan.add(access='write')", lambda o: cm.AccessPlan().add(o.managed, access="write"),
     ValueError, "access")
case("AccessPlan.add(access=1)", lambda o: cm.AccessPlan().add(o.managed, access=1), TypeError,
     "access")
case("AccessPlan.add(reads=0)", lambda o: cm.AccessPlan().add(o.managed, reads=0), ValueError,
     "reads")
case("AccessPlan.add(reads=2.0)", lambda o: cm.AccessPlan().add(o.managed, reads=2.0),
     TypeError, "reads")
case("AccessPlan.add(mechanism='dma')", lambda o: cm.AccessPlan().add(o.managed,
                                                                   mechanism="dma"),
     ValueError, "mechanism")
case("AccessPlan.add(mechanism=None)", lambda o: cm.AccessPlan().add(o.managed,
                                                                  mechanism=None),
     TypeError, "mechanism")
case("AccessPlan.add(read_mostly, readwrite)",
     lambda o: cm.AccessPlan().add(o.managed, access="readwrite", mechanism="read_mostly"),
     ValueError, "read_mostly")
case("AccessPlan.chunks(chunk_bytes=0)", lambda o: cm.AccessPlan().chunks(o.managed, 0),
     ValueError, "chunk_bytes")
case("AccessPlan.chunks(chunk_bytes='1')", lambda o: cm.AccessPlan().chunks(o.managed, "1"),
     TypeError, "chunk_bytes")
case("AccessPlan.chunks(reads=-1)", lambda o: cm.AccessPlan().chunks(o.managed, 64, reads=-1),
     ValueError, "reads")
case("AccessPlan.run(empty plan)", lambda o: cm.AccessPlan().run(o.stream), ValueError, "empty")
case("AccessPlan.run(stream='s')", lambda o: cm.AccessPlan().add(o.managed).run("s"), TypeError,
     "stream")
case("AccessRun()", lambda o: cm.AccessRun(), TypeError, r"AccessPlan\.run")
case("AccessChunk()", lambda o: cm.AccessChunk(), TypeError, "missing")
case("PrefetchPlan(exact=1)", lambda o: cm.PrefetchPlan(exact=1), TypeError, "exact")
