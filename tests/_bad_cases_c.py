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
