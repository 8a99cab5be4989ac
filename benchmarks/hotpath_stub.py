"""Hot paths of the allocators against their pure-Python floors, on the simulator (no GPU).

Run from the repository root: ``CUDA_MEMKIT_BACKEND=sim python benchmarks/hotpath_stub.py``;
``--against DIR`` also times the cuda_memkit of another checkout ``DIR`` (for
example the main branch's worktree), alternating the two in subprocesses, and
prints both columns (the medians of the runs' medians).

The cache-hit paths make no driver call, so the simulator measures exactly the
Python work memkit does on them; the uncached pair and its floor call the same
simulated driver functions, so their difference is memkit's own work. The
floors are those of ``bench_pool.py`` (same classes, same free lists), run
interleaved with memkit in this process; the table prints medians (us per
pair) and the ratio memkit / floor. GPU numbers come from bench_pool and
bench_frameworks on the H100; this table is the reproducible stand-in for
working on the Python side.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("CUDA_MEMKIT_BACKEND", "sim")
sys.path.insert(0, os.getcwd())

import cuda_memkit as cm  # the checkout in the working directory (see --against)

# isort: split
from harness import (  # after cuda_memkit: it adds its own root
    cached_floor,
    pinned_floor,
    uncached_floor,
)

N = 10000
SAMPLES = 11
RUNS = 5  # alternating runs of each checkout with --against
MiB = 1 << 20

#: Each memkit case and the floor it is compared with.
REFS = {
    "uncached MemoryPool.allocate().free()": "floor (1 slot, no checks)",
    "cached MemoryPool.allocate(stream=Stream).free()": "cached floor (free list)",
    "cached MemoryPool.allocate(stream=int).free()": "cached floor (free list)",
    "cached MemoryPool.allocate() + del": "cached floor (free list)",
    "HostBuffer.pooled(4096).close()": "pinned floor (free list)",
    "HostBuffer.pooled(4096) + del": "pinned floor (free list)",
}


def measure() -> dict[str, float]:
    """Median microseconds per pair of every case, memkit and floors interleaved."""
    s = cm.Stream()
    from cuda_memkit._core._device import custream
    cus = custream(s.handle)
    # The uncached pair and its floor call no-op driver functions (an address from a
    # counter, success), patched into the modules that call the driver on that path:
    # the simulator's own bookkeeping would otherwise be most of the time measured.
    from cuda_memkit._pools import _pool, _pool_buffer

    addresses = itertools.count(1 << 40, 1 << 20)

    def alloc(nbytes: int, cupool: Any, cus: Any) -> tuple[int, int]:
        return 0, next(addresses)

    def free(dptr: Any, cus: Any) -> tuple[int]:
        return (0,)

    saved = _pool._ALLOC, _pool_buffer.FREE
    _pool._ALLOC, _pool_buffer.FREE = alloc, free
    from cuda_memkit._pools._pool import allocation_handle

    pool = cm.MemoryPool(0)
    cupool = allocation_handle(pool)
    cached_pool = cm.MemoryPool(0, cache=True)
    allocate, cached_allocate = pool.allocate, cached_pool.allocate

    def memkit_cached(k: int) -> None:
        for _ in range(k):
            cached_allocate(MiB, stream=s).free()

    def memkit_cached_int(k: int) -> None:
        h = s.handle
        for _ in range(k):
            cached_allocate(MiB, stream=h).free()

    def memkit_cached_del(k: int) -> None:
        for _ in range(k):
            b = cached_allocate(MiB, stream=s)
            del b

    def memkit_uncached(k: int) -> None:
        for _ in range(k):
            allocate(MiB, stream=s).free()

    floor_h = s.handle
    cached_floor_allocate, _lists = cached_floor(
        floor_h, 512, lambda r: alloc(r, cupool, cus))

    def floor_cached(k: int) -> None:
        for _ in range(k):
            cached_floor_allocate(MiB, stream=s).free()

    floor_allocate = uncached_floor(alloc, free, cupool, cus)

    def floor_device(k: int) -> None:
        for _ in range(k):
            floor_allocate(MiB, stream=s).free()

    def raw(k: int) -> None:
        for _ in range(k):
            _, ptr = alloc(MiB, cupool, cus)
            free(ptr, cus)

    pooled = cm.HostBuffer.pooled

    def memkit_pooled(k: int) -> None:
        for _ in range(k):
            pooled(4096).close()

    def memkit_pooled_del(k: int) -> None:
        for _ in range(k):
            b = pooled(4096)
            del b

    floor_blocks = [object() for _ in range(4)]

    floor_pooled_alloc = pinned_floor(floor_blocks)

    def floor_pinned(k: int) -> None:
        for _ in range(k):
            floor_pooled_alloc(4096).close()

    cases: dict[str, Callable[[int], None]] = {
        "raw pair (no-op driver)": raw,
        "uncached MemoryPool.allocate().free()": memkit_uncached,
        "floor (1 slot, no checks)": floor_device,
        "cached MemoryPool.allocate(stream=Stream).free()": memkit_cached,
        "cached MemoryPool.allocate(stream=int).free()": memkit_cached_int,
        "cached MemoryPool.allocate() + del": memkit_cached_del,
        "cached floor (free list)": floor_cached,
        "HostBuffer.pooled(4096).close()": memkit_pooled,
        "HostBuffer.pooled(4096) + del": memkit_pooled_del,
        "pinned floor (free list)": floor_pinned,
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for fn in cases.values():
        fn(200)  # warm: caches filled, code paths resolved
    gc.disable()
    for _ in range(SAMPLES):
        for name, fn in cases.items():
            t = time.perf_counter()
            fn(N)
            times[name].append((time.perf_counter() - t) / N * 1e6)
    gc.enable()
    med = {k: statistics.median(v) for k, v in times.items()}
    _pool._ALLOC, _pool_buffer.FREE = saved
    cached_pool.close()
    pool.close()
    s.close()
    return med


def main() -> None:
    args = sys.argv[1:]
    if args == ["--json"]:
        print(json.dumps(measure()))
        return
    columns: dict[str, list[dict[str, float]]] = {"this": []}
    if args[:1] == ["--against"]:
        other = os.path.abspath(args[1])
        columns = {"against": [], "this": []}
        me = os.path.abspath(__file__)
        for _ in range(RUNS):  # alternate the checkouts: both see the same machine load
            for name, where in (("against", other), ("this", os.getcwd())):
                out = subprocess.run([sys.executable, me, "--json"], cwd=where, check=True,
                                     capture_output=True, text=True).stdout
                columns[name].append(json.loads(out))
    else:
        columns["this"].append(measure())
    med = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
           for name, runs in columns.items()}
    print(f"hotpath_stub on {os.environ['CUDA_MEMKIT_BACKEND']}, Python {sys.version.split()[0]}; "
          f"us per pair, median of {SAMPLES} samples of {N} pairs, memkit and floors interleaved"
          + (f"; 'against': {args[1]}, 'this': {os.getcwd()}, {RUNS} alternating runs each"
             if len(columns) > 1 else ""))
    head = "".join(f"{name + ' us':>12}{'/floor':>8}" for name in med)
    print(f"{'case':<50}{head}")
    for case in med["this"]:
        cells = ""
        for m in med.values():
            ref = REFS.get(case)
            cells += f"{m[case]:>12.3f}" + (f"{m[case] / m[ref]:>7.2f}x" if ref else " " * 8)
        print(f"{case:<50}{cells}")


if __name__ == "__main__":
    main()
