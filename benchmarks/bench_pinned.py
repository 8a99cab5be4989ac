"""Pinned-memory transfers and allocation, cuda_memkit against raw cuda.bindings.

    python benchmarks/bench_pinned.py [--json PATH] [--quick]

One table, every row measured in this run:

* 256 MiB host-to-device and device-to-host copies, stream-ordered: raw
  ``cuMemcpyHtoDAsync`` / ``cuMemcpyDtoHAsync`` on raw ``cuMemHostAlloc``
  memory (the reference), ``cuda_memkit.copy(..., stream=s)`` with a
  HostBuffer, a registered numpy array and a write-combined HostBuffer, and
  raw copies from pageable numpy memory. Each sample is the wall-clock time of
  issuing the copy and synchronising the stream; the table shows the median
  bandwidth, and the ratio to the raw pinned copy.
* ``HostBuffer.empty(n).close()`` against raw ``cuMemHostAlloc`` +
  ``cuMemFreeHost`` (median time per pair).

Targets: copies >= 0.97x raw pinned bandwidth both ways; allocation
overhead within 5 % of raw. On the simulator backend the numbers are the
simulator's (``--quick`` uses small sizes there).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from harness import backend, check

MiB = 1 << 20


def timed(fn: Callable[[], None], sync: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def interleaved(cases: dict[str, Callable[[], None]], sync: Callable[[], None], repeat: int,
                warmup: int = 2) -> dict[str, float]:
    """Median seconds per case, the cases taking turns so drift hits them alike."""
    for _ in range(warmup):
        for fn in cases.values():
            timed(fn, sync)
    samples: dict[str, list[float]] = {k: [] for k in cases}
    order = list(cases.items())
    for i in range(repeat):
        # Alternate the order as well (ABBA...), so that no case always
        # follows the same one (the driver's state after a free matters).
        for key, fn in (order if i % 2 == 0 else order[::-1]):
            samples[key].append(timed(fn, sync))
    return {k: statistics.median(v) for k, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quick", action="store_true", help="fewer repeats (small sizes on sim)")
    args = ap.parse_args()

    import cuda_memkit as cm

    backend_name, simulated, raw = backend()
    nbytes = 4 * MiB if (simulated and args.quick) else 256 * MiB
    repeat = 5 if args.quick else 15
    alloc_sizes = (4096, 16 * MiB)
    alloc_repeat = 7 if args.quick else 41

    s = cm.Stream()
    h = s.handle

    def sync() -> None:
        check(raw.cuStreamSynchronize(h))

    # -- memory for the transfer cases ----------------------------------------------
    raw_pinned = int(check(raw.cuMemHostAlloc(nbytes, 0)))
    dptr = int(check(raw.cuMemAlloc(nbytes)))
    dev = cm.DeviceBuffer.empty(nbytes)
    hb = cm.HostBuffer.empty(nbytes)
    wc = cm.HostBuffer.empty(nbytes, flags=cm.HostAllocFlags.WRITECOMBINED)
    pageable = np.ones(nbytes, np.uint8)
    reg_arr = np.ones(nbytes, np.uint8)
    reg = cm.register_host(reg_arr)
    for buf in (hb.array, wc.array):
        buf[:] = 1
    ctypes.memset(raw_pinned, 1, nbytes)  # every host buffer touched alike
    check(raw.cuMemsetD8(dptr, 1, nbytes))
    dev.fill(1)

    h2d = interleaved({
        "raw": lambda: check(raw.cuMemcpyHtoDAsync(dptr, raw_pinned, nbytes, h)),
        "hostbuffer": lambda: cm.copy(dev, hb, stream=s),
        "registered": lambda: cm.copy(dev, reg_arr, stream=s),
        "writecombined": lambda: cm.copy(dev, wc, stream=s),
        "pageable": lambda: check(raw.cuMemcpyHtoDAsync(dptr, pageable, nbytes, h)),
    }, sync, repeat)
    d2h = interleaved({
        "raw": lambda: check(raw.cuMemcpyDtoHAsync(raw_pinned, dptr, nbytes, h)),
        "hostbuffer": lambda: cm.copy(hb, dev, stream=s),
        "registered": lambda: cm.copy(reg_arr, dev, stream=s),
        "pageable": lambda: check(raw.cuMemcpyDtoHAsync(pageable, dptr, nbytes, h)),
    }, sync, repeat)

    reg.close()
    for obj in (hb, wc, dev):
        obj.close()
    check(raw.cuMemFree(dptr))
    check(raw.cuMemFreeHost(raw_pinned))

    # -- allocation overhead -----------------------------------------------------------
    # Several pairs per sample: one 4 KiB cuMemHostAlloc varies by ~5 % on its own.
    pairs = {4096: 10, 16 * MiB: 4}

    def raw_pair(n: int) -> None:
        for _ in range(pairs.get(n, 1)):
            p = check(raw.cuMemHostAlloc(n, 0))
            check(raw.cuMemFreeHost(p))

    def memkit_pair(n: int) -> None:
        for _ in range(pairs.get(n, 1)):
            cm.HostBuffer.empty(n).close()

    allocs = {}
    for n in alloc_sizes:
        allocs[n] = interleaved({"raw": lambda n=n: raw_pair(n),
                                 "memkit": lambda n=n: memkit_pair(n)},
                                lambda: None, alloc_repeat)
    s.close()

    # -- table ---------------------------------------------------------------------------
    rows: list[dict[str, Any]] = []
    size = f"{nbytes // MiB} MiB"
    for direction, res in (("H2D", h2d), ("D2H", d2h)):
        ref = nbytes / res["raw"] / 1e9
        rows.append({"case": f"{direction} {size} raw cuMemcpy*Async, raw pinned",
                     "gbps": ref, "ratio": 1.0, "target": "reference", "ok": None})
        labels = {"hostbuffer": ("copy(stream=) HostBuffer", ">= 0.97x"),
                  "registered": ("copy(stream=) register_host numpy", "info"),
                  "writecombined": ("copy(stream=) HostBuffer WRITECOMBINED", "info"),
                  "pageable": ("raw cuMemcpy*Async, pageable numpy", "info")}
        for key, (label, target) in labels.items():
            if key not in res:
                continue
            bw = nbytes / res[key] / 1e9
            ratio = bw / ref
            rows.append({"case": f"{direction} {size} {label}", "gbps": bw, "ratio": ratio,
                         "target": target,
                         "ok": (ratio >= 0.97) if target.startswith(">=") else None})
    for n, res in allocs.items():
        label = f"{n // 1024} KiB" if n < MiB else f"{n // MiB} MiB"
        ratio = res["memkit"] / res["raw"]
        rows.append({"case": f"alloc+free {label}: raw cuMemHostAlloc+cuMemFreeHost",
                     "ms": res["raw"] * 1e3 / pairs[n], "ratio": 1.0, "target": "reference",
                     "ok": None})
        rows.append({"case": f"alloc+free {label}: HostBuffer.empty().close()",
                     "ms": res["memkit"] * 1e3 / pairs[n], "ratio": ratio, "target": "<= 1.05x",
                     "ok": ratio <= 1.05})

    note = " -- SIMULATED: numbers are the CPU simulator's, not a GPU's" if simulated else ""
    print(f"bench_pinned on backend {backend_name} ({cm.Device(0).name}){note}")
    print(f"median of {repeat} (transfers) / {alloc_repeat} (allocations: 10 pairs of 4 KiB or "
          "4 of 16 MiB each) samples, wall clock incl. stream synchronize")
    print(f"{'case':62} {'result':>13} {'vs raw':>7}  target")
    for row in rows:
        value = f"{row['gbps']:8.2f} GB/s" if "gbps" in row else f"{row['ms']:10.3f} ms"
        verdict = "" if row["ok"] is None else (" OK" if row["ok"] else " MISS")
        print(f"{row['case']:62} {value:>13} {row['ratio']:6.3f}x  {row['target']}{verdict}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": backend_name, "simulated": simulated, "nbytes": nbytes,
                       "repeat": repeat, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
