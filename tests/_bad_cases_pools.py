"""Bad-input cases: memory pools and their buffers."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import cuda_memkit as cm

from ._bad_input_table import N, case

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
