"""Bad-input cases: sizes of growable buffers that no 64-bit driver size can hold."""

from __future__ import annotations

import cuda_memkit as cm

from ._bad_input_table import case

U64 = 1 << 64

case("GrowableBuffer(2**64)", lambda o: cm.GrowableBuffer(U64), ValueError, "max_size")
case("GrowableBuffer(2**64 - 1) (rounded up past 2**64)",
     lambda o: cm.GrowableBuffer(U64 - 1), ValueError, "max_size")
case("GrowableBuffer(chunk=2**64)", lambda o: cm.GrowableBuffer(o.g, chunk=U64), ValueError,
     "chunk")
case("GrowableBuffer(chunk=2**64 + g)", lambda o: cm.GrowableBuffer(o.g, chunk=U64 + o.g),
     ValueError, "chunk")
case("GrowableBuffer.registrable(2**64)", lambda o: cm.GrowableBuffer.registrable(U64),
     ValueError, "nbytes")
case("GrowableBuffer.registrable(2**64 - 1) (rounded up past 2**64)",
     lambda o: cm.GrowableBuffer.registrable(U64 - 1), ValueError, "nbytes")
