"""bench_transfers' small-block section: the kernel path against the driver and the peers.

Shapes and targets (contiguous copy of the same bytes = 1.0):

* 65536 x 4 KiB pinned->device and device->pinned, scattered on both sides
  (the blocks are permutations of the whole 256 MiB on each side): >= 0.8x;
* 16384 x 16 KiB, both directions: >= 0.85x;
* 65536 x 4 KiB device->device (a paged-cache block copy): >= 0.8x a
  contiguous device copy, for ``CopyBatch.execute`` (a ``copy_batch`` call
  checks its 65536 blocks on the host, which takes longer than the ~0.2 ms
  copy: an info row).

Rows per shape: one raw contiguous ``cuMemcpyAsync`` of the same bytes (the
reference), a raw loop of ``cuMemcpyAsync``, ``copy_batch(method="driver")``,
``copy_batch(method="kernel")``, ``copy_batch`` as users call it (``"auto"``,
a verdict row: one call per copy, every check and the descriptor upload
included), ``CopyBatch.execute`` of a batch built once (``"auto"``, its own
verdict row: the paged-cache swap pattern, descriptors resident on the
device), ``cuda.core``'s ``copy_batch`` (prebuilt Buffer lists) and CuPy:
one contiguous copy plus a scatter/gather kernel (``dst[perm_d] =
stage[perm_s]``; device to device, the scatter kernel alone).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from harness import check

KiB, MiB = 1 << 10, 1 << 20

#: (blocks, block size, direction, target ratio against contiguous)
SHAPES = [
    (65536, 4 * KiB, "h2d", 0.8),
    (65536, 4 * KiB, "d2h", 0.8),
    (16384, 16 * KiB, "h2d", 0.85),
    (16384, 16 * KiB, "d2h", 0.85),
    (65536, 4 * KiB, "d2d", 0.8),
]
NAMES = {"h2d": "pinned->device", "d2h": "device->pinned", "d2d": "device->device"}
Interleaved = Callable[..., dict[str, float]]


def core_case(dst_ptrs: list[int], src_ptrs: list[int], b: int, h: int
              ) -> Callable[[], None] | str:
    """cuda.core.utils.copy_batch over prebuilt Buffer lists, or why it cannot run."""
    try:
        from cuda import core
        from cuda.core.utils import copy_batch as core_copy_batch

        core.Device(0).set_current()
        stream = core.Stream.from_handle(h)
        dsts = [core.Buffer.from_handle(x, b) for x in dst_ptrs]
        srcs = [core.Buffer.from_handle(x, b) for x in src_ptrs]
    except Exception as exc:  # not importable, or an API this version lacks
        return f"{type(exc).__name__}: {exc}"[:80]
    return lambda: core_copy_batch(stream, srcs, dsts)


def cupy_case(raw: Any, direction: str, dst: Any, src: Any, stage: Any, perm_d: np.ndarray,
              perm_s: np.ndarray, b: int, h: int) -> Callable[[], None] | str:
    """One contiguous copy through a device staging area plus a CuPy scatter/gather kernel."""
    try:
        import cupy

        n = len(perm_d)
        cstream = cupy.cuda.ExternalStream(h)

        def view(buf: Any) -> Any:
            mem = cupy.cuda.UnownedMemory(buf.ptr, n * b, buf)
            return cupy.ndarray((n, b // 8), cupy.uint64, cupy.cuda.MemoryPointer(mem, 0))

        idx_d, idx_s = cupy.asarray(perm_d), cupy.asarray(perm_s)
        st = view(stage)
        d = view(dst) if direction != "d2h" else None
        s = view(src) if direction != "h2d" else None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:80]
    nbytes = n * b

    def run() -> None:
        if direction == "h2d":
            check(raw.cuMemcpyAsync(stage.ptr, src.ptr, nbytes, h))
            with cstream:
                d[idx_d] = st[idx_s]
        elif direction == "d2h":
            with cstream:
                st[idx_d] = s[idx_s]
            check(raw.cuMemcpyAsync(dst.ptr, stage.ptr, nbytes, h))
        else:
            with cstream:
                d[idx_d] = s[idx_s]
    return run


def small_blocks(cm: Any, raw: Any, table: Any, quick: bool, repeat: int,
                 interleaved: Interleaved) -> None:
    """Add the rows of :data:`SHAPES` to ``table``."""
    div = 64 if quick else 1
    total = max(n * b for n, b, _, _ in SHAPES) // div
    s = cm.Stream()
    h = s.handle
    data = ((np.arange(total, dtype=np.uint64) * 2654435761) % 251).astype(np.uint8)
    host_src = cm.HostBuffer.from_array(data)
    host_dst = cm.HostBuffer.zeros(total)
    dev_src = cm.DeviceBuffer.empty(total)
    dev_dst = cm.DeviceBuffer.empty(total)
    stage = cm.DeviceBuffer.empty(total)
    cm.copy(dev_src, host_src)
    rng = np.random.default_rng(23)
    batches: list[Any] = []
    try:
        for n_full, b, direction, need in SHAPES:
            dst, src = {"h2d": (dev_dst, host_src), "d2h": (host_dst, dev_src),
                        "d2d": (dev_dst, dev_src)}[direction]
            n = n_full // div
            nbytes = n * b
            perm_d, perm_s = rng.permutation(n), rng.permutation(n)
            d_off, s_off = perm_d * b, perm_s * b
            dps, sps = (dst.ptr + d_off).tolist(), (src.ptr + s_off).tolist()
            _verify(cm, dst, src, d_off, s_off, b, data)

            def loop(dps: list[int] = dps, sps: list[int] = sps, b: int = b) -> None:
                fn = raw.cuMemcpyAsync
                for x, y in zip(dps, sps, strict=True):
                    if fn(x, y, b, h)[0]:
                        raise RuntimeError("raw loop copy failed")

            def batch(method: str, d_off: np.ndarray = d_off, s_off: np.ndarray = s_off,
                      b: int = b, dst: Any = dst, src: Any = src) -> Callable[[], None]:
                return lambda: cm.copy_batch(dst, src, dst_offsets=d_off, src_offsets=s_off,
                                             sizes=b, stream=s, method=method)

            prebuilt = cm.CopyBatch().add(dst, src, dst_offsets=d_off, src_offsets=s_off,
                                          sizes=b)
            batches.append(prebuilt)
            cases: dict[str, Callable[[], None]] = {
                "contiguous": lambda dst=dst, src=src, nbytes=nbytes: check(
                    raw.cuMemcpyAsync(dst.ptr, src.ptr, nbytes, h)),
                "loop": loop,
                "driver": batch("driver"),
                "kernel": batch("kernel"),
                "auto": batch("auto"),
                "prebuilt": partial(prebuilt.execute, stream=s),
            }
            notes: dict[str, str] = {}
            for key, case in (("cuda.core", core_case(dps, sps, b, h)),
                              ("cupy", cupy_case(raw, direction, dst, src, stage, perm_d,
                                                 perm_s, b, h))):
                if isinstance(case, str):
                    notes[key] = case
                else:
                    cases[key] = case
            res = interleaved(cases, s.synchronize, repeat, rewarm=True)
            bw = {k: nbytes / v / 1e9 for k, v in res.items()}
            _rows(table, f"{n} x {b // KiB} KiB {NAMES[direction]}", bw, notes, need, quick,
                  direction)
    finally:
        s.synchronize()
        for obj in (*batches, host_src, host_dst, dev_src, dev_dst, stage, s):
            obj.close()


def _verify(cm: Any, dst: Any, src: Any, d_off: np.ndarray, s_off: np.ndarray, b: int,
            data: np.ndarray) -> None:
    """The kernel path's result, once, before the timing: every block where it belongs."""
    if isinstance(dst, cm.HostBuffer):
        dst.array[:] = 0
    else:
        dst.fill(0)
    cm.copy_batch(dst, src, dst_offsets=d_off, src_offsets=s_off, sizes=b, method="kernel")
    got = dst.array if isinstance(dst, cm.HostBuffer) else dst.to_numpy()
    n = len(d_off)
    want = np.empty(n * b, np.uint8)
    want.reshape(n, b)[d_off // b] = data[: n * b].reshape(n, b)[s_off // b]
    if not (got[: n * b] == want).all():
        raise RuntimeError("copy_batch(method='kernel') left wrong bytes")


def _rows(table: Any, tag: str, bw: dict[str, float], notes: dict[str, str], need: float,
          quick: bool, direction: str) -> None:
    ref = bw["contiguous"]
    table.add(f"{tag}: raw contiguous cuMemcpyAsync (same bytes)", gbps=ref, ratio=1.0,
              vs="contig", target="reference")
    for key, label in (("loop", "raw loop cuMemcpyAsync"),
                       ("driver", "copy_batch(method='driver')"),
                       ("kernel", "copy_batch(method='kernel')")):
        table.add(f"{tag}: {label}", gbps=bw[key], ratio=bw[key] / ref, vs="contig",
                  target="info")
    mk = bw["auto"]
    if direction == "d2d":  # checking 65536 blocks on the host outlasts the whole copy
        table.add(f"{tag}: copy_batch (auto)", gbps=mk, ratio=mk / ref, vs="contig",
                  target="info", note="per call: the host checks outlast a ~0.2 ms copy; "
                  "the d2d path is CopyBatch.execute (docs/transfers.md)")
    else:
        table.add(f"{tag}: copy_batch (auto)", gbps=mk, ratio=mk / ref, vs="contig",
                  target=f">= {need}x contig", ok=None if quick else mk / ref >= need)
    pb = bw["prebuilt"]
    table.add(f"{tag}: CopyBatch.execute (prebuilt, auto)", gbps=pb, ratio=pb / ref,
              vs="contig", target=f">= {need}x contig", ok=None if quick else pb / ref >= need)
    peer = "CuPy scatter kernel" if direction == "d2d" else (
        "1 contiguous copy + CuPy scatter kernel")
    for key, label in (("cuda.core", "cuda.core copy_batch (prebuilt Buffers)"),
                       ("cupy", peer)):
        if key in bw:
            table.add(f"{tag}: {label}", gbps=bw[key], ratio=bw[key] / ref, vs="contig",
                      target="info")
        else:
            table.add(f"{tag}: {label}", target="info", note=notes[key])
