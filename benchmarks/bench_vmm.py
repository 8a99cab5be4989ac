"""Growing a device buffer by one 32 MiB chunk: GrowableBuffer vs raw VMM calls vs realloc+copy.

    python benchmarks/bench_vmm.py [--json PATH] [--quick]

One table, every row measured in this run. For each buffer size S (32 MiB,
64 MiB, ... 8 GiB) the buffer already holds S - 32 MiB and we time adding the
chunk that brings it to S:

* ``GrowableBuffer.resize(S)`` (then shrunk back, untimed);
* the reference: raw ``cuda.bindings`` ``cuMemCreate`` + ``cuMemMap`` +
  ``cuMemSetAccess`` of one chunk, at the same address of the same
  reservation (then ``cuMemUnmap`` + ``cuMemRelease``, untimed); the two take
  turns so drift hits them alike;
* the copy-based alternative: ``cuMemAlloc(S)`` + ``cuMemcpyDtoD`` of the old
  S - 32 MiB + ``cuMemFree(old)`` + synchronize. Sizes whose old+new
  buffers would exceed the memory budget (10 GiB) are skipped.

Targets: GrowableBuffer <= 1.2x raw per chunk, flat in buffer size.
Peak device memory: about 8 GiB. On the simulator (``--quick``: sizes up to
256 MiB) the numbers are the simulator's, not a GPU's.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from harness import backend, check

MiB = 1 << 20
GiB = 1 << 30
CHUNK = 32 * MiB
BUDGET = 10 * GiB


def timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quick", action="store_true",
                    help="fewer repeats (and sizes up to 256 MiB on the simulator)")
    args = ap.parse_args()

    import cuda_memkit as cm

    backend_name, simulated, raw = backend()
    top = 256 * MiB if (simulated and args.quick) else 8 * GiB
    sizes = []
    s = CHUNK
    while s <= top:
        sizes.append(s)
        s *= 2
    repeat = 5 if args.quick else 31
    realloc_repeat = 3 if args.quick else 5

    # the raw reference's allocation properties and access descriptor, built by hand
    from cuda.bindings import driver as cu  # the struct and enum types

    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    loc = cu.CUmemLocation()
    loc.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    loc.id = 0
    prop.location = loc
    desc = cu.CUmemAccessDesc()
    desc.location = loc
    desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    descs = [desc]

    t_start = time.perf_counter()
    grow: dict[int, float] = {}
    rawt: dict[int, float] = {}
    buf = cm.GrowableBuffer(top, chunk=CHUNK)
    base = buf.ptr
    for _ in range(10):  # warm the driver and both code paths up
        buf.resize(CHUNK)
        buf.resize(0)
    gc.disable()
    try:
        for size in sizes:
            buf.resize(size - CHUNK)
            addr = base + size - CHUNK

            def memkit(size: int = size) -> None:
                buf.resize(size)

            def raw_chunk(addr: int = addr) -> int:
                h = check(raw.cuMemCreate(CHUNK, prop, 0))
                check(raw.cuMemMap(addr, CHUNK, 0, h, 0))
                check(raw.cuMemSetAccess(addr, CHUNK, descs, 1))
                return int(h)

            def raw_undo(h: int, addr: int = addr) -> None:
                check(raw.cuMemUnmap(addr, CHUNK))
                check(raw.cuMemRelease(h))

            samples_m: list[float] = []
            samples_r: list[float] = []
            for i in range(repeat + 2):  # two warm-up rounds
                # Alternate which side goes first, so that neither always
                # follows the other's unmap/release (the driver's state after
                # a release can favour the next create).
                if i % 2:
                    tm = timed(memkit)
                    buf.resize(size - CHUNK)
                t0 = time.perf_counter()
                h = raw_chunk()
                tr = time.perf_counter() - t0
                raw_undo(h)
                if not i % 2:
                    tm = timed(memkit)
                    buf.resize(size - CHUNK)
                if i >= 2:
                    samples_r.append(tr)
                    samples_m.append(tm)
            grow[size] = statistics.median(samples_m)
            rawt[size] = statistics.median(samples_r)
    finally:
        gc.enable()
        buf.close()

    # -- realloc + copy ------------------------------------------------------------------
    realloc: dict[int, float | None] = {}
    for size in sizes:
        if 2 * size - CHUNK > BUDGET:
            realloc[size] = None
            continue
        samples: list[float] = []
        for _ in range(realloc_repeat):
            keep = size - CHUNK  # the old contents (nothing for the first chunk)
            old = int(check(raw.cuMemAlloc(keep))) if keep else 0
            t0 = time.perf_counter()
            new = int(check(raw.cuMemAlloc(size)))
            if keep:
                check(raw.cuMemcpyDtoD(new, old, keep))
                check(raw.cuMemFree(old))
            check(raw.cuCtxSynchronize())
            samples.append(time.perf_counter() - t0)
            check(raw.cuMemFree(new))
        realloc[size] = statistics.median(samples)

    # -- table ---------------------------------------------------------------------------
    rows: list[dict[str, Any]] = []
    for size in sizes:
        ratio = grow[size] / rawt[size]
        rc = realloc[size]
        rows.append({
            "size": size, "growable_us": grow[size] * 1e6, "raw_us": rawt[size] * 1e6,
            "ratio": ratio, "ok": ratio <= 1.2,
            "realloc_us": None if rc is None else rc * 1e6,
            "realloc_vs_raw": None if rc is None else rc / rawt[size],
        })
    gvals = [r["growable_us"] for r in rows]
    flat = max(gvals) / min(gvals)
    worst = max(r["ratio"] for r in rows)

    note = " -- SIMULATED: numbers are the CPU simulator's, not a GPU's" if simulated else ""
    print(f"bench_vmm on backend {backend_name} ({cm.Device(0).name}){note}")
    print(f"one {CHUNK // MiB} MiB chunk added to a buffer of S - {CHUNK // MiB} MiB; "
          f"median of {repeat} (VMM) / {realloc_repeat} (realloc) samples")
    print(f"{'buffer size S':>14} {'GrowableBuffer':>15} {'raw VMM':>10} {'vs raw':>7} "
          f"{'realloc+copy':>13} {'vs raw':>8}  target")
    for r in rows:
        size = r["size"]
        label = f"{size // GiB} GiB" if size >= GiB else f"{size // MiB} MiB"
        rc = "skipped" if r["realloc_us"] is None else f"{r['realloc_us']:9.1f} us"
        rv = "" if r["realloc_vs_raw"] is None else f"{r['realloc_vs_raw']:7.1f}x"
        verdict = "OK" if r["ok"] else "MISS"
        print(f"{label:>14} {r['growable_us']:12.1f} us {r['raw_us']:7.1f} us "
              f"{r['ratio']:6.2f}x {rc:>13} {rv:>8}  <= 1.2x {verdict}")
    print(f"GrowableBuffer per-chunk time, largest/smallest over sizes: {flat:.2f}x "
          f"(flat: <= 1.5x {'OK' if flat <= 1.5 else 'MISS'}); worst ratio vs raw {worst:.2f}x")
    print(f"realloc+copy skipped where old+new > {BUDGET // GiB} GiB; "
          f"run time {time.perf_counter() - t_start:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": backend_name, "simulated": simulated, "chunk": CHUNK,
                       "repeat": repeat, "rows": rows, "flatness": flat,
                       "worst_ratio": worst}, f, indent=1)


if __name__ == "__main__":
    main()
