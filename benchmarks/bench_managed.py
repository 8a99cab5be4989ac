"""Prefetching 512 MiB of managed memory: one range vs. many plan entries vs. raw calls.

    python benchmarks/bench_managed.py [--json PATH] [--quick]

Cases, all prefetching the same buffer to device 0 on one non-blocking
stream, in the same run:

* (a) ``ManagedBuffer.prefetch`` of the whole range (and the raw
  ``cuMemPrefetchAsync`` of it, for reference);
* (b) a ``PrefetchPlan`` of 64 contiguous 8 MiB entries, built and
  validated before timing: the sample is ``execute`` of the cached,
  compiled plan (how a plan is meant to be used: built once, executed
  every step);
* (b') the same plan built afresh in every sample: ``add`` x 64,
  ``validate`` and ``execute`` timed together (a plan used once);
* (c) / (c') the same with 4096 contiguous 128 KiB entries;
* a raw loop of ``cuMemPrefetchAsync`` over the same 64 / 4096 entries, and a
  raw ``cuMemPrefetchBatchAsync`` of them (pointer lists built beforehand);
* (c'') the 4096-entry plan built afresh from two arrays (``add_ranges``):
  what a plan of many entries built in one go costs ((c') adds 4096
  Python calls of ``add``);
* (d) a strided plan (every other 128 KiB chunk, 2048 entries, half the
  bytes): by default its 128 KiB gaps are closed (one range), with
  ``exact=True`` it is one batch call of 2048 ranges; and the raw loop of it.

Each timed sample covers issuing the work and ``cuStreamSynchronize``;
before every sample the buffer is prefetched back to the host (and synced)
so that every timed prefetch really migrates. Median of the repeats.

Targets: (b), (b'), (c) and (c'') within 1.1x of (a), (d) within 1.3x;
each row prints its own OK / MISS. On the H100 the raw loop of
4096 x 128 KiB takes ~300 ms against ~11 ms for the whole range; a plan
coalesces contiguous entries into one range.

Safety: the buffer never exceeds what the GPU has free (it shrinks, and says
so). On the simulator the numbers are simulated; ``--quick`` is implied.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from harness import backend

MiB = 1 << 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quick", action="store_true", help="64 MiB, 3 repeats")
    args = ap.parse_args()

    import numpy as np

    import cuda_memkit as cm

    backend_name, simulated, raw = backend()
    dev = cm.Device(0)
    quick = args.quick or simulated
    from cuda.bindings import driver as cu  # types (CUresult, CUdeviceptr)

    size = 64 * MiB if quick else 512 * MiB
    notes: list[str] = []
    free, _total = dev.mem_info()
    while size > 16 * MiB and size + 256 * MiB > free:
        size //= 2
    if size != (64 * MiB if quick else 512 * MiB):
        notes.append(f"buffer shrunk to {size // MiB} MiB: the GPU has {free // MiB} MiB free")
    repeats = 3 if quick else 7

    def check(res: tuple[Any, ...]) -> None:
        if res[0] != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"driver call failed: {res[0]!r}")

    to_dev = cm.Location.device(0)
    dev_loc = to_dev.to_cu()
    host_loc = cm.Location.host().to_cu()

    buf = cm.ManagedBuffer.empty(size)
    stream = cm.Stream(0)
    h = stream.handle
    ptr = buf.ptr
    buf.array[:] = np.uint8(1)  # populate the pages on the host

    def entries(n: int, stride: int = 1) -> list[tuple[int, int]]:
        chunk = size // (n * stride)
        return [(ptr + i * stride * chunk, chunk) for i in range(n)]

    def plan_of(ents: list[tuple[int, int]], exact: bool = False) -> cm.PrefetchPlan:
        plan = cm.PrefetchPlan(exact=exact)
        for p, n in ents:
            plan.add(buf, to_dev, offset=p - ptr, nbytes=n)
        plan.validate()
        return plan

    def fresh(ents: list[tuple[int, int]]) -> Callable[[], None]:
        """Build, validate and execute a new plan: nothing cached between samples."""
        def run() -> None:
            plan = cm.PrefetchPlan()
            for p, n in ents:
                plan.add(buf, to_dev, offset=p - ptr, nbytes=n)
            plan.validate()
            plan.execute(stream)
        return run

    def fresh_arrays(ents: list[tuple[int, int]]) -> Callable[[], None]:
        """The same with add_ranges: one call for every entry, from two arrays."""
        offs = np.array([p - ptr for p, _n in ents], np.int64)
        sizes = np.array([n for _p, n in ents], np.int64)

        def run() -> None:
            cm.PrefetchPlan().add_ranges(buf, to_dev, offs, sizes).execute(stream)
        return run

    def raw_loop(ents: list[tuple[int, int]]) -> Callable[[], None]:
        fn = raw.cuMemPrefetchAsync

        def run() -> None:
            for p, n in ents:
                check(fn(p, n, dev_loc, 0, h))
        return run

    def raw_batch(ents: list[tuple[int, int]]) -> Callable[[], None]:
        dptrs = [cu.CUdeviceptr(p) for p, _ in ents]
        sizes = [n for _, n in ents]
        count = len(ents)

        def run() -> None:
            check(raw.cuMemPrefetchBatchAsync(dptrs, sizes, count, [dev_loc], [0], 1, 0, h))
        return run

    e64, e4096, strided = entries(64), entries(4096), entries(2048, stride=2)
    p64, p4096, pstrided = plan_of(e64), plan_of(e4096), plan_of(strided)
    pexact = plan_of(strided, exact=True)
    chunk64, chunk4096 = e64[0][1], e4096[0][1]

    cases: list[tuple[str, int, int, Callable[[], None]]] = [
        ("(a) buf.prefetch whole range", 1, 1, lambda: buf.prefetch(to_dev, stream=stream)),
        ("raw cuMemPrefetchAsync whole range", 1, 1,
         lambda: check(raw.cuMemPrefetchAsync(ptr, size, dev_loc, 0, h))),
        (f"(b) prebuilt plan, execute 64 x {chunk64 // 1024} KiB", 64,
         len(p64.dry_run(stream)), lambda: p64.execute(stream)),
        (f"(b') build+execute 64 x {chunk64 // 1024} KiB", 64, len(p64.dry_run(stream)),
         fresh(e64)),
        (f"raw loop 64 x {chunk64 // 1024} KiB", 64, 64, raw_loop(e64)),
        (f"raw batch 64 x {chunk64 // 1024} KiB", 64, 1, raw_batch(e64)),
        (f"(c) prebuilt plan, execute 4096 x {chunk4096 // 1024} KiB", 4096,
         len(p4096.dry_run(stream)), lambda: p4096.execute(stream)),
        (f"(c') build+execute 4096 x {chunk4096 // 1024} KiB", 4096,
         len(p4096.dry_run(stream)), fresh(e4096)),
        (f"(c'') build+execute 4096 x {chunk4096 // 1024} KiB, add_ranges", 4096,
         len(p4096.dry_run(stream)), fresh_arrays(e4096)),
        (f"raw loop 4096 x {chunk4096 // 1024} KiB", 4096, 4096, raw_loop(e4096)),
        (f"raw batch 4096 x {chunk4096 // 1024} KiB", 4096, 1, raw_batch(e4096)),
        (f"(d) plan 2048 x {chunk4096 // 1024} KiB strided (half), gaps closed", 2048,
         len(pstrided.dry_run(stream)), lambda: pstrided.execute(stream)),
        (f"plan 2048 x {chunk4096 // 1024} KiB strided (half), exact=True", 2048,
         len(pexact.dry_run(stream)), lambda: pexact.execute(stream)),
        (f"raw loop 2048 x {chunk4096 // 1024} KiB strided (half)", 2048, 2048,
         raw_loop(strided)),
    ]

    def back_to_host() -> None:
        check(raw.cuMemPrefetchAsync(ptr, size, host_loc, 0, h))
        check(raw.cuStreamSynchronize(h))

    def sample(fn: Callable[[], None]) -> float:
        back_to_host()
        t0 = time.perf_counter()
        fn()
        check(raw.cuStreamSynchronize(h))
        return (time.perf_counter() - t0) * 1e3

    for _name, _n, _c, fn in cases:  # warm-up: first-touch costs on the device
        sample(fn)
    samples: dict[str, list[float]] = {name: [] for name, *_ in cases}
    for _ in range(repeats):  # round-robin, so drift hits every case alike
        for name, _n, _c, fn in cases:
            samples[name].append(sample(fn))
    back_to_host()
    ok_bytes = np.all(buf.array[:: max(1, size // 4096)] == 1)

    base = statistics.median(samples[cases[0][0]])
    rows = []
    for name, n, calls, _fn in cases:
        med = statistics.median(samples[name])
        row: dict[str, Any] = {"case": name, "entries": n, "driver_calls": calls,
                               "median_ms": round(med, 3), "ratio": round(med / base, 3),
                               "samples_ms": [round(x, 2) for x in samples[name]]}
        if name.startswith(("(b)", "(b')", "(c)", "(c'')")):
            row["target"] = "<= 1.1x (a)"
            row["ok"] = med / base <= 1.1
        elif name.startswith("(d)"):
            row["target"] = "<= 1.3x (a)"
            row["ok"] = med / base <= 1.3
        rows.append(row)

    stream.close()
    buf.close()

    label = ("  [SIMULATED: CPU simulator, times are not GPU timings]" if simulated else "")
    print(f"bench_managed: {size // MiB} MiB managed -> device 0, backend {backend_name} "
          f"({dev.name}), median of {repeats}{label}")
    for note in notes:
        print(f"note: {note}")
    print(f"{'case':60} {'entries':>7} {'calls':>6} {'median':>10} {'vs (a)':>8}  target")
    for row in rows:
        target = ""
        if "target" in row:
            target = f"{row['target']} {'OK' if row['ok'] else 'MISS'}"
        print(f"{row['case']:60} {row['entries']:7d} {row['driver_calls']:6d} "
              f"{row['median_ms']:8.2f}ms {row['ratio']:7.2f}x  {target}")
    if not ok_bytes:
        print("WARNING: buffer contents changed during the benchmark")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "bench_managed", "backend": backend_name,
                       "simulated": simulated, "device": dev.name, "size": size,
                       "repeats": repeats, "notes": notes, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
