"""Bad-input cases: residency of managed memory (ManagedBuffer.residency, managed_residency)."""

from __future__ import annotations

import cuda_memkit as cm

from ._bad_input_table import N, case

# == ManagedBuffer.residency ============================================================

case("ManagedBuffer.residency(granularity=0)",
     lambda o: o.managed.residency(granularity=0), ValueError, "granularity")
case("ManagedBuffer.residency(granularity=1000)",
     lambda o: o.managed.residency(granularity=1000), ValueError, "granularity")
case("ManagedBuffer.residency(granularity=-4096)",
     lambda o: o.managed.residency(granularity=-4096), ValueError, "granularity")
case("ManagedBuffer.residency(granularity='x')",
     lambda o: o.managed.residency(granularity="x"), TypeError, "granularity")
case("ManagedBuffer.residency(granularity=True)",
     lambda o: o.managed.residency(granularity=True), TypeError, "granularity")
case("ManagedBuffer.residency(granularity=4096.0)",
     lambda o: o.managed.residency(granularity=4096.0), TypeError, "granularity")
case("ManagedBuffer.residency(offset=-1)",
     lambda o: o.managed.residency(-1), ValueError, "offset")
case("ManagedBuffer.residency(past the end)",
     lambda o: o.managed.residency(0, N + 1), ValueError, "ManagedBuffer|nbytes")
case("ManagedBuffer.residency(offset='x')",
     lambda o: o.managed.residency("x"), TypeError, "offset")
case("ManagedBuffer.residency(closed)",
     lambda o: o.closed.ManagedBuffer.residency(), cm.ClosedError, "closed")

# == managed_residency ==================================================================

case("managed_residency(device memory)",
     lambda o: cm.managed_residency(o.dev.ptr, N), ValueError, "managed")
case("managed_residency(pinned memory)",
     lambda o: cm.managed_residency(o.host.ptr, N), ValueError, "managed")
case("managed_residency(ptr=0)", lambda o: cm.managed_residency(0, N), ValueError, "managed")
case("managed_residency(ptr='x')", lambda o: cm.managed_residency("x", N), TypeError,
     "pointer")
case("managed_residency(ptr=None)", lambda o: cm.managed_residency(None, N), TypeError,
     "pointer")
case("managed_residency(nbytes=-1)",
     lambda o: cm.managed_residency(o.managed.ptr, -1), ValueError, "nbytes")
case("managed_residency(past the allocation)",
     lambda o: cm.managed_residency(o.managed.ptr, 1 << 40), ValueError, "managed allocation")
case("managed_residency(granularity=0)",
     lambda o: cm.managed_residency(o.managed.ptr, N, granularity=0), ValueError,
     "granularity")
case("managed_residency(granularity=None)",
     lambda o: cm.managed_residency(o.managed.ptr, N, granularity=None), TypeError,
     "granularity")

# == Residency ==========================================================================

case("Residency.prefetched_bytes('x')",
     lambda o: o.managed.residency().prefetched_bytes("x"), TypeError, "Location")
case("Residency.prefetched_bytes(-1)",
     lambda o: o.managed.residency().prefetched_bytes(-1), ValueError, "ordinal|location")
