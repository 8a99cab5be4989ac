#!/usr/bin/env python3
"""Does the state of managed host pages decide how fast the device reads them through the mapping?

``AccessPlan``'s probe (``mapped_reads_fast``) reads 64 MiB of managed memory filled
by the CPU and answered "fast" on hosts where ``bench_oversub.py``'s zero-copy walk
ran at a fifth of the link. The walk's pages had been on the device and were sent
back to the host before each sample. This probe reads the same managed array
through the mapping (zero-copy advice: preferred location the host, accessed by
the device; the block-copy kernel into a device scratch buffer, 256 MiB at a time)
in three states, each twice (a first and a second read):

* ``cpu``: filled by the CPU, never on the device (the library's probe);
* ``back``: prefetched to the device, then prefetched back to the host;
* ``back+cpu``: as ``back``, then written once more by the CPU.

and, beside them, a DMA copy of as many bytes from pinned memory (the link). The
first 64 MiB of each first read are timed apart (what the library's probe sees), and so
are the advice calls (set before the reads, unset after: an ``AccessPlan`` walk pays both
inside the walk, the library's probe outside its timing).

    python3 scripts/probes/mapped_state_probe.py [--gib 4]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
from harness import backend

import cuda_memkit as cm

MiB = 1 << 20
STEP = 256 * MiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.0)
    args = ap.parse_args()
    backend_name, simulated, _ = backend()
    step = 4 * MiB if simulated else STEP
    n = 8 * step if simulated else int(args.gib * (1 << 30)) // step * step
    host, dev = cm.Location.host(), cm.Location.device(0)
    with cm.Stream(0) as s, cm.ManagedBuffer.empty(n) as buf, \
            cm.DeviceBuffer.empty(step) as scratch, cm.HostBuffer.empty(step) as pinned:
        def read(start: int, nbytes: int, src: Any = None) -> float:
            """Seconds of the kernel (or, with ``src``, a DMA copy) reading ``nbytes``."""
            s.synchronize()
            t0 = time.perf_counter()
            for off in range(start, start + nbytes, step):
                size = min(step, start + nbytes - off)
                if src is None:
                    cm.copy_batch(scratch, buf, dst_offsets=[0], src_offsets=[off], sizes=size,
                                  stream=s, method="kernel")
                else:
                    cm.copy_batch(scratch, src, dst_offsets=[0], src_offsets=[0], sizes=size,
                                  stream=s, method="driver")
            s.synchronize()
            return time.perf_counter() - t0

        def zero_copy() -> None:
            buf.advise(cm.MemAdvice.SET_PREFERRED_LOCATION, host)
            buf.advise(cm.MemAdvice.SET_ACCESSED_BY, dev)

        def unadvise() -> None:
            buf.advise(cm.MemAdvice.UNSET_ACCESSED_BY, dev)
            buf.advise(cm.MemAdvice.UNSET_PREFERRED_LOCATION)

        read(0, step, pinned)  # the kernel and the DMA path loaded and warm
        cm.copy_batch(scratch, pinned, dst_offsets=[0], src_offsets=[0], sizes=step,
                      stream=s, method="kernel")
        head_n = min(64 * MiB, step)
        print(f"{n / (1 << 30):.2f} GiB of managed memory on {cm.Device(0).name} "
              f"({backend_name}); GB/s")
        print(f"{'state':12s} {'first 64 MiB':>13s} {'first read':>11s} {'second read':>12s}"
              f"   pinned DMA   advise ms unadvise   first read with advice")
        for state in ("cpu", "back", "back+cpu"):
            buf.array[:] = 1  # filled by the CPU
            if state != "cpu":
                buf.prefetch(dev, stream=s)
                buf.prefetch(host, stream=s)
                s.synchronize()
            if state == "back+cpu":
                buf.array[:] = 2
            t0 = time.perf_counter()
            zero_copy()
            t_advise = time.perf_counter() - t0
            t_head = read(0, head_n)
            t_rest = read(head_n, n - head_n)
            t_second = read(0, n)
            t0 = time.perf_counter()
            unadvise()
            t_unadvise = time.perf_counter() - t0
            dma = min(n, 8 * step) / read(0, min(n, 8 * step), pinned) / 1e9
            walk = n / (t_advise + t_head + t_rest + t_unadvise) / 1e9
            print(f"{state:12s} {head_n / t_head / 1e9:13.1f} {n / (t_head + t_rest) / 1e9:11.1f} "
                  f"{n / t_second / 1e9:12.1f}   {dma:10.1f}   {t_advise * 1e3:8.1f} "
                  f"{t_unadvise * 1e3:8.1f}   {walk:14.1f}")

if __name__ == "__main__":
    main()
