"""What tracking costs: allocation pairs with tracking off, ``track()`` and ``track(stacks=True)``.

    python benchmarks/bench_observe.py [--json PATH] [--quick]

One table, every row measured in this run (median over interleaved samples of
the time per alloc+free pair; each sample runs a loop of pairs, then
synchronizes; the cases take turns in a shuffled order). Three allocation
paths, each against its raw cuda.bindings reference:

* pool pair, 1 MiB: raw ``cuMemAllocFromPoolAsync`` + ``cuMemFreeAsync`` vs
  ``MemoryPool.allocate(n, stream=s).free()`` (release threshold UINT64_MAX);
* pooled pinned pair, 4 KiB: raw host-pool calls vs ``HostBuffer.pooled(4096).close()``;
* HostBuffer pair, 4 KiB: raw ``cuMemHostAlloc`` + ``cuMemFreeHost`` vs
  ``HostBuffer.empty(4096).close()``.

memkit runs with tracking off (the statistics are always on: the ledger),
inside ``with cm.track():`` and inside ``with cm.track(stacks=True):`` (one
tracker per sample, so its start and stop are included), the latter also from
a call 40 frames deep (stack capture walks every frame, up to 64). The
"vs off" column is the cost of tracking; "vs raw" the cost over the driver.
The always-on cost of the statistics is measured across commits with
bench_pool and bench_pinned (not here). On the simulator the run is always
--quick and the numbers are the simulator's.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from harness import Loop, backend, check, measure

MiB = 1 << 20
U64_MAX = (1 << 64) - 1


def deep(depth: int, fn: Callable[[], None]) -> None:
    """Call ``fn`` ``depth`` frames down."""
    if depth <= 0:
        fn()
    else:
        deep(depth - 1, fn)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quick", action="store_true", help="fewer and shorter samples")
    args = ap.parse_args()

    import cuda_memkit as cm

    backend_name, simulated, raw = backend()
    quick = args.quick or simulated
    from cuda.bindings import driver as cu  # the types, on either backend

    samples = 5 if quick else 15
    n_pool = 300 if quick else 10000
    n_pinned = 300 if quick else 10000
    n_hostalloc = 5 if quick else 20

    s = cm.Stream()
    cus = cu.CUstream(s.handle)

    def sync() -> None:
        check(raw.cuCtxSynchronize())

    alloc, free = raw.cuMemAllocFromPoolAsync, raw.cuMemFreeAsync

    def raw_pairs(nbytes: int, cupool: Any) -> Loop:
        def loop(k: int) -> None:
            for _ in range(k):
                err, ptr = alloc(nbytes, cupool, cus)
                if err:
                    raise RuntimeError(err)
                (err,) = free(ptr, cus)
                if err:
                    raise RuntimeError(err)
        return loop

    def tracked(loop: Loop, stacks: bool | None, depth: int = 0) -> Loop:
        """``loop`` with tracking off (None), or inside one tracker per sample."""
        if stacks is None:
            return loop

        def run(k: int) -> None:
            with cm.track(stacks=stacks):
                if depth:
                    deep(depth, lambda: loop(k))
                else:
                    loop(k)
        return run

    # -- the three paths ------------------------------------------------------------------
    pool = cm.MemoryPool(0, release_threshold=U64_MAX)
    cached_pool = cm.MemoryPool(0, release_threshold=U64_MAX, cache=True)
    cached_allocate = cached_pool.allocate
    host_pool = cm.MemoryPool(location=cm.Location.host(), release_threshold=U64_MAX)
    allocate = pool.allocate
    pooled = cm.HostBuffer.pooled
    empty = cm.HostBuffer.empty

    def pool_pairs(k: int) -> None:
        for _ in range(k):
            allocate(MiB, stream=s).free()

    def cached_pairs(k: int) -> None:
        for _ in range(k):
            cached_allocate(MiB, stream=s).free()

    def pooled_pairs(k: int) -> None:
        for _ in range(k):
            pooled(4096).close()

    def host_pairs(k: int) -> None:
        for _ in range(k):
            empty(4096).close()

    def raw_host(k: int) -> None:
        for _ in range(k):
            p = check(raw.cuMemHostAlloc(4096, 0))
            check(raw.cuMemFreeHost(p))

    modes: list[tuple[str, bool | None, int]] = [
        ("off", None, 0), ("track()", False, 0), ("track(stacks=True)", True, 0),
        ("track(stacks=True), 40 frames deep", True, 40)]
    paths = {
        "pool 1 MiB": (raw_pairs(MiB, cu.CUmemoryPool(pool.handle)), pool_pairs, n_pool,
                       "raw cuMemAllocFromPoolAsync+cuMemFreeAsync"),
        "cached pool 1 MiB": (raw_pairs(MiB, cu.CUmemoryPool(pool.handle)), cached_pairs,
                              n_pool, "raw cuMemAllocFromPoolAsync+cuMemFreeAsync"),
        "pooled pinned 4 KiB": (raw_pairs(4096, cu.CUmemoryPool(host_pool.handle)),
                                pooled_pairs, n_pinned, "raw host-pool alloc+free"),
        "HostBuffer 4 KiB": (raw_host, host_pairs, n_hostalloc,
                             "raw cuMemHostAlloc+cuMemFreeHost"),
    }
    rows: list[dict[str, Any]] = []
    for path, (raw_loop, memkit_loop, n, raw_label) in paths.items():
        cases: dict[str, Loop | None] = {"raw": raw_loop}
        for label, stacks, depth in modes:
            cases[label] = tracked(memkit_loop, stacks, depth)
        res = measure(cases, dict.fromkeys(cases, n), samples, sync, 12)
        rows.append({"path": path, "case": raw_label, "us": res["raw"] * 1e6, "vs_raw": 1.0,
                     "vs_off": None})
        for label, _stacks, _depth in modes:
            rows.append({"path": path, "case": f"memkit, tracking {label}",
                         "us": res[label] * 1e6, "vs_raw": res[label] / res["raw"],
                         "vs_off": res[label] / res["off"]})
    sync()
    host_pool.close()
    pool.close()
    cached_pool.close()
    s.close()

    note = " -- SIMULATED: numbers are the CPU simulator's, not a GPU's" if simulated else ""
    print(f"bench_observe on backend {backend_name} ({cm.Device(0).name}){note}")
    print(f"median of {samples} samples per case (pairs per sample: pool {n_pool}, "
          f"pooled {n_pinned}, HostBuffer {n_hostalloc}), wall clock incl. synchronize")
    print(f"{'path':20} {'case':52} {'us/pair':>9} {'vs raw':>7} {'vs off':>7}")
    for r in rows:
        vs_off = "" if r["vs_off"] is None else f"{r['vs_off']:6.2f}x"
        print(f"{r['path']:20} {r['case']:52} {r['us']:9.2f} {r['vs_raw']:6.2f}x {vs_off:>7}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": backend_name, "simulated": simulated, "samples": samples,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
