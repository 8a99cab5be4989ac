"""Bad-input cases: copies, batched copies and the staging settings."""

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


def _kernel_batch(dst, src):  # type: ignore[no-untyped-def]
    """A synchronous kernel-path batch between two of the case's buffers."""
    return cm.copy_batch(dst, src, dst_offsets=_OFF, src_offsets=_OFF, sizes=_SZ,
                         method="kernel")

# == copy / copy_async ===================================================================

case("copy(object(), host)", lambda o: cm.copy(object(), o.host), TypeError,
     "destination|copy to")
case("copy(host, object())", lambda o: cm.copy(o.host, object()), TypeError,
     "source|copy from")
case("copy(None, host)", lambda o: cm.copy(None, o.host), TypeError, "destination")
case("copy(host, True)", lambda o: cm.copy(o.host, True), TypeError, "source")
case("copy(-5, host)", lambda o: cm.copy(-5, o.host), ValueError, "pointer|negative")
case("copy(4 KiB, 16 KiB)", lambda o: cm.copy(o.host, np.zeros(4 * N, np.uint8)), ValueError,
     "size")
case("copy(float32, uint8 same bytes)", lambda o: cm.copy(o.host_f32, o.host), ValueError,
     "dtype")
case("copy(nbytes=-1)", lambda o: cm.copy(o.dev, o.host, nbytes=-1), ValueError, "nbytes")
case("copy(nbytes='1')", lambda o: cm.copy(o.dev, o.host, nbytes="1"), TypeError, "nbytes")
case("copy(nbytes=1.5)", lambda o: cm.copy(o.dev, o.host, nbytes=1.5), TypeError, "nbytes")
case("copy(nbytes=True)", lambda o: cm.copy(o.dev, o.host, nbytes=True), TypeError, "nbytes")
case("copy(nbytes > destination)", lambda o: cm.copy(o.dev, o.host, nbytes=N + 1),
     ValueError, "nbytes")
case("copy(nbytes > source)", lambda o: cm.copy(o.dev, o.host_f32, nbytes=2 * N),
     ValueError, "nbytes")
case("copy(int, int)", lambda o: cm.copy(o.dev.ptr, o.host.ptr), ValueError, "nbytes")
case("copy(strided source)", lambda o: cm.copy(o.dev, np.zeros(2 * N, np.uint8)[::2]),
     ValueError, "contiguous")
case("copy(read-only destination)", lambda o: cm.copy(o.ro_array, o.dev), ValueError,
     "read-only")
case("copy(READ_ONLY registration as destination)", lambda o: cm.copy(o.reg_ro, o.dev),
     ValueError, "READ_ONLY")
case("copy(object array)", lambda o: cm.copy(o.dev, np.array([object()] * N)), TypeError,
     "object")
case("copy(stream='s')", lambda o: cm.copy(o.dev, o.host, stream="s"), TypeError, "stream")
case("copy(stream=-1)", lambda o: cm.copy(o.dev, o.host, stream=-1), ValueError, "stream")
case("copy(stream=1.5)", lambda o: cm.copy(o.dev, o.host, stream=1.5), TypeError, "stream")
case("copy(stream=True)", lambda o: cm.copy(o.dev, o.host, stream=True), TypeError, "stream")
case("copy(stream=closed Stream)", lambda o: cm.copy(o.dev, o.host, stream=o.closed.Stream),
     cm.ClosedError, "closed")
case("copy_async(pageable source)",
     lambda o: cm.copy_async(o.dev, o.page, stream=o.stream), ValueError, "pageable")
case("copy_async(pageable destination)",
     lambda o: cm.copy_async(o.page, o.dev, stream=o.stream), ValueError, "pageable")
case("copy_async(no stream)", lambda o: cm.copy_async(o.dev, o.host), TypeError, "stream")
case("copy_async(stream=object())",
     lambda o: cm.copy_async(o.dev, o.host, stream=object()), TypeError, "stream")
case("copy_async(size mismatch)",
     lambda o: cm.copy_async(o.dev, o.managed0, stream=o.stream), ValueError, "size")


class _BadCAI:
    def __init__(self) -> None:
        self.__cuda_array_interface__ = {"data": (0x1000, False), "shape": (4, 4),
                                         "typestr": "<f4", "strides": (4, 16), "version": 3}


case("copy(strided __cuda_array_interface__)", lambda o: cm.copy(_BadCAI(), o.host_f32),
     ValueError, "contiguous")

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
     lambda o: _kernel_batch(o.dev, o.page), ValueError, "pageable")
case("copy_batch(method='kernel', pageable destination, synchronous)",
     lambda o: _kernel_batch(o.page, o.dev), ValueError, "pageable")
case("copy_batch(method='kernel', host to host)",
     lambda o: _kernel_batch(o.host, o.reg), ValueError, "host memory")
case("copy_batch(method='kernel', read-only registration as destination)",
     lambda o: _kernel_batch(o.reg_ro, o.dev), ValueError, "READ_ONLY")
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
