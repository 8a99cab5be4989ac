#!/usr/bin/env python3
"""Host-side cost of building and compiling a 4096-entry PrefetchPlan.

Times, for 4096 ranges of a 512 MiB (simulator: 64 MiB) managed buffer,
contiguous (they coalesce into one range) and strided (nothing coalesces):

* building: ``add()`` x 4096 against one ``add_ranges()`` from arrays;
* validating + coalescing (``validate()``);
* ``execute()`` with the issuing step stubbed out (no driver work: what the
  plan costs on top of the prefetch itself).

Usage::

    python3 scripts/probes/prefetch_plan_build.py          # the real driver (GPU)
    python3 scripts/probes/prefetch_plan_build.py --sim    # the CPU simulator

Prints a table (microseconds, median of 15) and writes
``$OUT/prefetch_plan_build.json`` when ``$OUT`` is set.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

SIM = "--sim" in sys.argv
if SIM:
    os.environ["CUDA_MEMKIT_BACKEND"] = "sim"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import cuda_memkit as cm  # noqa: E402
from cuda_memkit._managed_memory import _prefetch_plan  # noqa: E402

N = 4096
REPS = 15


def median_us(fn: Callable[[], object]) -> float:
    fn()
    xs = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs) * 1e6


def main() -> int:
    size = (64 if SIM else 512) << 20
    buf = cm.ManagedBuffer.empty(size)
    to = cm.Location.device(0)
    rows: dict[str, float] = {}
    try:
        for layout in ("contiguous", "strided"):
            chunk = size // N // (1 if layout == "contiguous" else 2)
            step = chunk if layout == "contiguous" else 2 * chunk
            offsets = np.arange(N, dtype=np.int64) * step
            off_list = offsets.tolist()

            def per_entry(off_list: list[int] = off_list, chunk: int = chunk) -> cm.PrefetchPlan:
                plan = cm.PrefetchPlan()
                for off in off_list:
                    plan.add(buf, to, offset=off, nbytes=chunk)
                return plan

            def from_arrays(offsets: np.ndarray = offsets, chunk: int = chunk
                            ) -> cm.PrefetchPlan:
                return cm.PrefetchPlan().add_ranges(buf, to, offsets, chunk)

            for label, build in (("add() x 4096", per_entry), ("add_ranges()", from_arrays)):
                rows[f"{layout}: build, {label}"] = median_us(build)
                plan = build()
                rows[f"{layout}: validate, {label}"] = median_us(plan.validate)
                real = _prefetch_plan.issue_step
                _prefetch_plan.issue_step = lambda *a, **k: True  # type: ignore[assignment]
                try:
                    rows[f"{layout}: build + execute (issuing stubbed), {label}"] = median_us(
                        lambda build=build: build().execute())
                finally:
                    _prefetch_plan.issue_step = real  # type: ignore[assignment]
    finally:
        buf.close()
    backend = "simulator" if SIM else "driver"
    print(f"PrefetchPlan of {N} ranges, host-side cost ({backend}; median of {REPS}, us)")
    for k, v in rows.items():
        print(f"  {k:66s} {v:10.1f}")
    for layout in ("contiguous", "strided"):
        a = rows[f"{layout}: build + execute (issuing stubbed), add() x 4096"]
        b = rows[f"{layout}: build + execute (issuing stubbed), add_ranges()"]
        print(f"  {layout}: add_ranges is {a / b:.0f}x cheaper than add() x 4096")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "prefetch_plan_build.json"), "w") as f:
            json.dump({"backend": backend, "n": N, "us": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
