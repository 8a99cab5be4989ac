"""Bad-input cases: closed objects of every kind, in every method."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

import cuda_memkit as cm

from ._bad_input_table import N, case

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
