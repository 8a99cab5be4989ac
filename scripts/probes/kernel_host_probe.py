#!/usr/bin/env python3
"""Where the time of copy_batch's kernel path goes: host work, upload, kernel, whole call.

For each shape of ``benchmarks/small_blocks.py`` (65536 x 4 KiB and
16384 x 16 KiB pinned<->device, 65536 x 4 KiB device->device; blocks a
permutation of the whole buffer on each side), interleaved, median of
``--repeat`` samples, it times

* ``host``: the Python and numpy work of ``copy_batch(method="kernel")`` up
  to the launch, phase by phase -- ``group`` (argument checks, bounds,
  overlap, merge test), ``hazards`` (across pairs), ``pick`` (the kernel's
  reachability queries), ``prepare`` (the descriptor array) -- with no copy
  and no launch;
* ``upload``: a device copy of the descriptors alone (``cuMemAllocAsync``, one
  ``cuMemcpyHtoDAsync`` from pinned memory, ``cuMemFreeAsync``, waited for),
  which ``copy_batch`` no longer makes;
* ``direct``: the kernel alone, launched over descriptors already on the
  device, reading and writing host memory through its mapping, waited for;
* ``zerocopy``: the same kernel reading the descriptors from pinned host
  memory in place, as ``copy_batch`` does;
* ``nolaunch``: the whole ``copy_batch`` call with the launch left out, waited for;
* ``call``: the whole ``copy_batch(method="kernel", stream=s)`` and the wait;
* ``execute``: a prebuilt ``CopyBatch.execute(stream=s, method="kernel")``
  and the wait (descriptors resident on the device);
* ``contig``: one raw contiguous ``cuMemcpyAsync`` of the same bytes.

It prints microseconds per phase and the bandwidth of ``direct``,
``call``, ``execute`` and ``contig`` (and their ratios to ``contig``). If
``call`` is close to ``host + upload + direct``, the phases are serial and
the host work is what to cut; if ``direct`` alone is far from ``contig``, the
kernel is.

Usage::

    python scripts/probes/kernel_host_probe.py [--repeat 7] [--json PATH]
    CUDA_MEMKIT_BACKEND=sim python scripts/probes/kernel_host_probe.py --quick

On the simulator the ``host`` phases are meaningful (the same Python runs),
the device timings are not (the simulator copies with numpy at once).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import cuda_memkit as cm  # noqa: E402
from cuda_memkit._core import _driver  # noqa: E402
from cuda_memkit._transfer import _copy_batch, _kernels  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
#: (blocks, block size, direction), as benchmarks/small_blocks.py.
SHAPES = [(65536, 4 * KiB, "h2d"), (65536, 4 * KiB, "d2h"), (16384, 16 * KiB, "h2d"),
          (16384, 16 * KiB, "d2h"), (65536, 4 * KiB, "d2d")]
HOST_PHASES = ("group", "hazards", "pick", "prepare")


def _med(fn: Callable[[], Any], repeat: int, sync: Callable[[], None]) -> float:
    fn()
    sync()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def host_phases(dst: Any, src: Any, d_off: Any, s_off: Any, b: int, h: int,
                repeat: int) -> tuple[dict[str, float], Any, Any]:
    """Median seconds of each host phase; the last run's prepared descriptors and pick."""
    samples: dict[str, list[float]] = {k: [] for k in HOST_PHASES}
    prep = picked = None
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        g = _copy_batch._Group(dst, src, d_off, s_off, b, None, None, None)
        t1 = time.perf_counter()
        _copy_batch._check_hazards([g])
        t2 = time.perf_counter()
        picked = _kernels.kernel_groups([g], "kernel", h)
        t3 = time.perf_counter()
        _fn, sms = _kernels.copy_function()
        prep = _kernels.prepare(picked, sms)
        t4 = time.perf_counter()
        for k, v in zip(HOST_PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            samples[k].append(v)
    return {k: statistics.median(v[1:]) for k, v in samples.items()}, prep, picked


def measure(repeat: int, div: int) -> list[dict[str, Any]]:
    total = max(n * b for n, b, _ in SHAPES) // div
    s = cm.Stream()
    h = s.handle
    host_src = cm.HostBuffer.from_array(np.full(total, 3, np.uint8))
    host_dst = cm.HostBuffer.zeros(total)
    dev_src = cm.DeviceBuffer.empty(total)
    dev_dst = cm.DeviceBuffer.empty(total)
    rng = np.random.default_rng(23)
    call = _driver.call
    rows = []
    try:
        for n_full, b, direction in SHAPES:
            dst, src = {"h2d": (dev_dst, host_src), "d2h": (host_dst, dev_src),
                        "d2d": (dev_dst, dev_src)}[direction]
            n = n_full // div
            nbytes = n * b
            d_off, s_off = rng.permutation(n) * b, rng.permutation(n) * b
            t = {k: v * 1e6 for k, v in
                 host_phases(dst, src, d_off, s_off, b, h, repeat)[0].items()}
            _phases, prep, _picked = host_phases(dst, src, d_off, s_off, b, h, 1)
            desc = prep.desc
            resident = cm.DeviceBuffer.from_array(desc.view(np.uint8))

            pinned = cm.HostBuffer.pooled(desc.nbytes)
            pinned.array[:] = desc.view(np.uint8)

            def upload(src: Any = pinned) -> None:  # as launch() does: from pinned memory
                base = int(call("cuMemAllocAsync", src.nbytes, h))
                call("cuMemcpyHtoDAsync", base, src.ptr, src.nbytes, h)
                call("cuMemFreeAsync", base, h)

            def zerocopy(prep: Any = prep, base: int = pinned.ptr) -> None:
                # the kernel reads the descriptors from pinned host memory, no device copy
                _kernels.launch_prepared(prep, base, h)

            def nolaunch(dst: Any = dst, src: Any = src, d_off: Any = d_off,
                         s_off: Any = s_off, b: int = b) -> None:
                real = _kernels.launch_prepared
                _kernels.launch_prepared = lambda *a: None
                try:
                    cm.copy_batch(dst, src, dst_offsets=d_off, src_offsets=s_off, sizes=b,
                                  stream=s, method="kernel")
                finally:
                    _kernels.launch_prepared = real

            def direct(prep: Any = prep, base: int = resident.ptr) -> None:
                _kernels.launch_prepared(prep, base, h)

            def whole(dst: Any = dst, src: Any = src, d_off: Any = d_off, s_off: Any = s_off,
                      b: int = b) -> None:
                cm.copy_batch(dst, src, dst_offsets=d_off, src_offsets=s_off, sizes=b,
                              stream=s, method="kernel")

            batch = cm.CopyBatch().add(dst, src, dst_offsets=d_off, src_offsets=s_off, sizes=b)

            def execute(batch: Any = batch) -> None:
                batch.execute(stream=s, method="kernel")

            def contig(dst: Any = dst, src: Any = src, nbytes: int = nbytes) -> None:
                call("cuMemcpyAsync", dst.ptr, src.ptr, nbytes, h)

            cases: dict[str, Callable[[], None]] = {
                "upload": upload, "direct": direct, "zerocopy": zerocopy,
                "nolaunch": nolaunch, "call": whole,
                "execute": execute, "contig": contig}
            for key, fn in cases.items():
                t[key] = _med(fn, repeat, s.synchronize) * 1e6
            s.synchronize()
            batch.close()
            resident.close()
            pinned.close()
            t["host"] = sum(t[k] for k in HOST_PHASES)
            row: dict[str, Any] = {"direction": direction, "block": b, "blocks": n,
                                   "nbytes": nbytes, "us": t}
            row["gbps"] = {k: nbytes / (t[k] * 1e-6) / 1e9
                           for k in ("direct", "zerocopy", "call", "execute", "contig")}
            rows.append(row)
            print(f"{direction} {b // KiB:3d} KiB x {n:6d}: host " + " + ".join(
                f"{k} {t[k]:7.1f}" for k in HOST_PHASES) + f" = {t['host']:7.1f} us; upload "
                f"{t['upload']:7.1f}; direct {t['direct']:7.1f}; "
                f"zerocopy {t['zerocopy']:7.1f}; call without the launch {t['nolaunch']:7.1f}; "
                f"call {t['call']:7.1f}; execute {t['execute']:7.1f}; "
                f"contig {t['contig']:7.1f} us", flush=True)
            print("      GB/s: " + "  ".join(f"{k} {v:8.2f}" for k, v in row["gbps"].items())
                  + "   /contig: " + "  ".join(
                      f"{k} {row['gbps'][k] / row['gbps']['contig']:.3f}"
                      for k in ("direct", "zerocopy", "call", "execute")),
                  flush=True)
    finally:
        s.synchronize()
        for obj in (host_src, host_dst, dev_src, dev_dst, s):
            obj.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="1/64 of the blocks, 3 repeats")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    repeat, div = (3, 64) if args.quick else (args.repeat, 1)
    cm.Device(0).set_current()
    print(f"kernel_host_probe on {_driver.backend_name()} ({cm.Device(0).name}): median of "
          f"{repeat}, microseconds per call", flush=True)
    rows = measure(repeat, div)
    out = args.json or (os.path.join(os.environ["OUT"], "kernel_host_probe.json")
                        if os.environ.get("OUT") else None)
    if out:
        with open(out, "w") as f:
            json.dump({"device": cm.Device(0).name, "backend": _driver.backend_name(),
                       "repeat": repeat, "rows": rows}, f, indent=1)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
