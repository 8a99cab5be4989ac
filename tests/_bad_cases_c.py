"""Bad-input cases, part 3: batched copies and the staging settings."""

from __future__ import annotations

import numpy as np

import cuda_memkit as cm

from ._bad_input_table import N, case

_OFF = np.array([0, 1024], np.int64)
_SZ = np.array([512, 512], np.int64)


def _batch(o, **kw):  # type: ignore[no-untyped-def]
    args = {"dst_offsets": _OFF, "src_offsets": _OFF, "sizes": _SZ, "stream": o.stream}
    args.update(kw)
    return cm.copy_batch(o.dev, o.host, **args)


# == copy_batch / CopyBatch =============================================================

case("copy_batch(dst_offsets=3 entries)", lambda o: _batch(o, dst_offsets=[0, 1, 2]),
     ValueError, "dst_offsets")
case("copy_batch(sizes=3 entries)", lambda o: _batch(o, sizes=[1, 2, 3]), ValueError, "sizes")
case("copy_batch(dst_offsets=[-1, 0])", lambda o: _batch(o, dst_offsets=[-1, 0]), ValueError,
     "dst_offsets")
case("copy_batch(src_offsets float)", lambda o: _batch(o, src_offsets=np.zeros(2)), TypeError,
     "src_offsets")
case("copy_batch(sizes='x')", lambda o: _batch(o, sizes="x"), TypeError, "sizes")
case("copy_batch(sizes=True)", lambda o: _batch(o, sizes=True), TypeError, "sizes")
case("copy_batch(sizes=-1)", lambda o: _batch(o, sizes=-1), ValueError, "sizes")
case("copy_batch(past the destination)", lambda o: _batch(o, dst_offsets=[0, N]), ValueError,
     "destination|dst")
case("copy_batch(past the source)", lambda o: _batch(o, src_offsets=[0, N - 1]), ValueError,
     "source|src")
case("copy_batch(overlapping destinations)", lambda o: _batch(o, dst_offsets=[0, 100]),
     ValueError, "overlap")
case("copy_batch(2-D offsets)", lambda o: _batch(o, dst_offsets=np.zeros((2, 1), np.int64)),
     ValueError, "dst_offsets")
case("copy_batch(no offsets)", lambda o: cm.copy_batch(o.dev, o.host, stream=o.stream),
     TypeError, "offsets|blocks")
case("copy_batch(blocks and offsets)",
     lambda o: _batch(o, blocks=[(0, 0, 1)]), TypeError, "blocks")
case("copy_batch(blocks of pairs)",
     lambda o: cm.copy_batch(o.dev, o.host, blocks=[(0, 0)], stream=o.stream), ValueError,
     "blocks")
case("copy_batch(closed destination)",
     lambda o: cm.copy_batch(o.closed.DeviceBuffer, o.host, dst_offsets=_OFF, src_offsets=_OFF,
                             sizes=_SZ, stream=o.stream), cm.ClosedError, "closed")
case("copy_batch(pageable source on a stream)",
     lambda o: cm.copy_batch(o.dev, o.page, dst_offsets=_OFF, src_offsets=_OFF, sizes=_SZ,
                             stream=o.stream), ValueError, "pageable")
case("copy_batch(stream='s')", lambda o: _batch(o, stream="s"), TypeError, "stream")
case("copy_batch(dst=None)",
     lambda o: cm.copy_batch(None, o.host, dst_offsets=_OFF, src_offsets=_OFF, sizes=_SZ,
                             stream=o.stream), TypeError, "destination")
case("CopyBatch().add(sizes=-5)",
     lambda o: cm.CopyBatch().add(o.dev, o.host, dst_offsets=_OFF, src_offsets=_OFF,
                                  sizes=-5), ValueError, "sizes")
case("CopyBatch().add(overlap)",
     lambda o: cm.CopyBatch().add(o.dev, o.host, dst_offsets=[0, 0], src_offsets=_OFF,
                                  sizes=_SZ).execute(o.stream), ValueError, "overlap")
case("CopyBatch().execute(stream=1.5)",
     lambda o: cm.CopyBatch().add(o.dev, o.host, dst_offsets=_OFF, src_offsets=_OFF,
                                  sizes=_SZ).execute(1.5), TypeError, "stream")

# -- method= (the kernel path): refused before any query that allocates, any copy or launch
case("copy_batch(method='fast')", lambda o: _batch(o, method="fast"), ValueError, "method")
case("copy_batch(method=1)", lambda o: _batch(o, method=1), TypeError, "method")
case("copy_batch(method=None)", lambda o: _batch(o, method=None), TypeError, "method")
case("copy_batch(method='kernel', pageable source)",
     lambda o: cm.copy_batch(o.dev, o.page, dst_offsets=_OFF, src_offsets=_OFF, sizes=_SZ,
                             method="kernel"), ValueError, "pageable")
case("copy_batch(method='kernel', pageable destination, synchronous)",
     lambda o: cm.copy_batch(o.page, o.dev, dst_offsets=_OFF, src_offsets=_OFF, sizes=_SZ,
                             method="kernel"), ValueError, "pageable")
case("copy_batch(method='kernel', host to host)",
     lambda o: cm.copy_batch(o.host, o.reg, dst_offsets=_OFF, src_offsets=_OFF, sizes=_SZ,
                             method="kernel"), ValueError, "host memory")
case("copy_batch(method='kernel', read-only registration as destination)",
     lambda o: cm.copy_batch(o.reg_ro, o.dev, dst_offsets=_OFF, src_offsets=_OFF, sizes=_SZ,
                             method="kernel"), ValueError, "READ_ONLY")
case("copy_batch(method='kernel', overlapping destinations)",
     lambda o: _batch(o, dst_offsets=[0, 100], method="kernel"), ValueError, "overlap")
case("copy_batch(method='kernel', past the source)",
     lambda o: _batch(o, src_offsets=[0, N - 1], method="kernel"), ValueError, "out of range")
case("CopyBatch().execute(method='gpu')",
     lambda o: cm.CopyBatch().add(o.dev, o.host, dst_offsets=_OFF, src_offsets=_OFF,
                                  sizes=_SZ).execute(o.stream, method="gpu"), ValueError,
     "method")
case("CopyBatch().execute(method='kernel', pageable)",
     lambda o: cm.CopyBatch().add(o.dev, o.page, dst_offsets=_OFF, src_offsets=_OFF,
                                  sizes=_SZ).execute(method="kernel"), ValueError, "pageable")

# -- allow_pageable is a bool everywhere (a truthy string must not enable pageable memory)
for _bad in ("False", 1, None, np.bool_(False)):
    case(f"copy(allow_pageable={_bad!r})",
         lambda o, v=_bad: cm.copy(o.dev, o.host, allow_pageable=v), TypeError, "allow_pageable")
    case(f"copy_async(allow_pageable={_bad!r})",
         lambda o, v=_bad: cm.copy_async(o.dev, o.page, stream=o.stream, allow_pageable=v),
         TypeError, "allow_pageable")
    case(f"copy_batch(allow_pageable={_bad!r})", lambda o, v=_bad: _batch(o, allow_pageable=v),
         TypeError, "allow_pageable")
    case(f"CopyBatch().execute(allow_pageable={_bad!r})",
         lambda o, v=_bad: cm.CopyBatch().add(o.dev, o.page, dst_offsets=_OFF,
                                              src_offsets=_OFF, sizes=_SZ).execute(
             o.stream, allow_pageable=v), TypeError, "allow_pageable")

# -- int addresses: address + offset + size must stay below 2**64 (never wrap)
case("copy_batch(int destination wrapping past 2**64)",
     lambda o: cm.copy_batch((1 << 64) - 4096, o.host, blocks=[(4096 + 64, 0, 64)],
                             stream=o.stream), ValueError, "2\\*\\*64")
case("copy(int source wrapping past 2**64)",
     lambda o: cm.copy(o.host, (1 << 64) - 16, nbytes=64), ValueError, "2\\*\\*64")

# -- offset arrays: objects are a TypeError
case("copy_batch(dst_offsets=object array)",
     lambda o: _batch(o, dst_offsets=np.array([0, 1024], object)), TypeError, "dst_offsets")

# == staging settings ====================================================================

case("configure_staging(chunk=100)", lambda o: cm.configure_staging(chunk=100), ValueError,
     "chunk")
case("configure_staging(buffers=1)", lambda o: cm.configure_staging(buffers=1), ValueError,
     "buffers")
case("configure_staging(threads='4')", lambda o: cm.configure_staging(threads="4"), TypeError,
     "threads")
case("configure_staging(enabled=1)", lambda o: cm.configure_staging(enabled=1), TypeError,
     "enabled")
case("configure_staging(nonsense=1)", lambda o: cm.configure_staging(nonsense=1), TypeError,
     "nonsense")
case("StagingSettings(threshold=-1)", lambda o: cm.StagingSettings(threshold=-1), ValueError,
     "threshold")
case("copy(staged='yes')", lambda o: cm.copy(o.dev, o.host, staged="yes"), TypeError,
     "staged")

# == statistics and tracking =============================================================

case("memory_stats(device='0')", lambda o: cm.memory_stats("0"), TypeError, "device")
case("memory_stats(device=-1)", lambda o: cm.memory_stats(-1), ValueError, "device")
case("memory_stats(device=True)", lambda o: cm.memory_stats(True), TypeError, "device")
case("reset_peak_stats(device=1.0)", lambda o: cm.reset_peak_stats(1.0), TypeError, "device")
case("reset_peak_stats(device=-2)", lambda o: cm.reset_peak_stats(-2), ValueError, "device")
case("track(stacks='yes')", lambda o: cm.track("yes"), TypeError, "stacks")
case("track(threads='mine')", lambda o: cm.track(threads="mine"), ValueError, "threads")
case("track(threads=1)", lambda o: cm.track(threads=1), TypeError, "threads")


def _reentered(o):  # type: ignore[no-untyped-def]
    t = cm.track()
    with t:
        pass
    with t:  # a tracker records once
        pass


case("Tracker re-entered", _reentered, RuntimeError, "track")
case("Tracker.save(unwritable path)",
     lambda o: cm.track().save("/nonexistent-dir/x/track.json"), FileNotFoundError,
     "nonexistent|track")

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
