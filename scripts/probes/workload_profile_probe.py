"""Where the CuPy adaptor's time goes on a real training step, against the floors' allocators.

    python scripts/probes/workload_profile_probe.py [--size small] [--steps 300] [--top 15]

Runs bench_workload's MLP step (one size) with CuPy's allocator set to memkit's
cached adaptor, the pure-Python cached floor, that floor with the exact ledger
and CuPy's own pool, and prints, per step:

1. time (interleaved medians, as bench_workload), with the garbage collector
   on and off;
2. counts: allocations, the cache's misses, driver allocations and frees, and
   garbage collections per generation with the time they took;
3. the time spent inside the allocator calls (a wrapper's timer, its own cost
   measured on an empty function and taken off);
4. cProfile of the steps under memkit and under the floor with the ledger: the
   functions with the most time per step under memkit, and those whose time or
   calls per step differ the most between the two (CuPy's own functions
   included, so a CuPy path memkit's memory makes slower shows there).

Needs CuPy and a GPU (the numbers are the point); on the simulator it says so
and exits 0.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import sys
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from bench_workload import SIZES, mlp  # noqa: E402
from harness import backend, cupy_cached_floor, floor_ledger, measure  # noqa: E402

Alloc = Callable[[int], Any]


def counting(fn: Alloc, counter: list[int]) -> Alloc:
    def wrapped(size: int) -> Any:
        counter[0] += 1
        return fn(size)
    return wrapped


def timed(fn: Alloc, acc: list[float]) -> Alloc:
    clock = time.perf_counter

    def wrapped(size: int) -> Any:
        t = clock()
        r = fn(size)
        acc[0] += clock() - t
        return r
    return wrapped


class GcWatch:
    """Garbage collections (per generation) and the time they take, while installed."""

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.seconds = 0.0
        self._t = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t
            self.counts[info["generation"]] += 1


def profile(cupy: Any, fn: Alloc, step: Callable[[], None], steps: int, sync: Any
            ) -> dict[str, tuple[int, float]]:
    """``function -> (calls, seconds of its own time)`` per step, under cProfile."""
    cupy.cuda.set_allocator(fn)
    step()
    sync()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    sync()
    prof.disable()
    out: dict[str, tuple[int, float]] = {}
    for (file, line, name), (_cc, nc, tt, _ct, _callers) in \
            pstats.Stats(prof).stats.items():  # type: ignore[attr-defined]
        short = f"{os.path.basename(file)}:{line}({name})" if file != "~" else name
        calls, own = out.get(short, (0, 0.0))
        out[short] = (calls + nc, own + tt)
    return {k: (c // steps, t / steps) for k, (c, t) in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--size", default="small", choices=list(SIZES))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()

    import cuda_memkit as cm
    from cuda_memkit import allocators
    from cuda_memkit._pools import _cache, _pool

    backend_name, simulated, raw = backend()
    if simulated:
        print(f"workload_profile_probe on backend {backend_name}: needs CuPy on a GPU")
        return 0
    import cupy
    from cuda.bindings import driver as cu

    def sync() -> None:
        (err,) = raw.cuCtxSynchronize()
        if err:
            raise RuntimeError(err)

    s = cm.Stream()
    cupy.cuda.ExternalStream(s.handle).use()
    default = cm.MemoryPool.default(0)
    old_threshold = default.release_threshold
    default.release_threshold = (1 << 64) - 1
    previous = cupy.cuda.get_allocator()
    driver = [0, 0]  # driver allocations, frees (the floors' and memkit's)

    def raw_alloc(n: int, pool: Any, st: Any) -> Any:
        driver[0] += 1
        return raw.cuMemAllocFromPoolAsync(n, pool, st)

    def raw_free(d: Any, st: Any) -> Any:
        driver[1] += 1
        return raw.cuMemFreeAsync(d, st)

    cupool = cu.CUmemoryPool(default.handle)
    floor, release_floor = cupy_cached_floor(cupy, raw_alloc, raw_free, cupool)
    floor_l, release_floor_l = cupy_cached_floor(cupy, raw_alloc, raw_free, cupool, floor_ledger())
    _cache.driver_pair()
    real_alloc, real_free = _cache.ALLOC, _cache.FREE
    _cache.ALLOC, _cache.FREE = raw_alloc, raw_free  # memkit's driver calls counted too
    memkit = allocators.cupy_allocator()
    cupy_pool = cupy.cuda.MemoryPool()
    allocs: dict[str, Alloc] = {"memkit cached": memkit, "floor cached": floor,
                                "floor cached + ledger": floor_l, "cupy pool": cupy_pool.malloc}
    batch, dim, hidden = SIZES[args.size]
    step = mlp(cupy, batch, dim, hidden)  # its arrays from CuPy's allocator of the moment
    cache = _pool.cache_for(default)
    try:
        def under(fn: Alloc, gc_on: bool) -> Callable[[int], None]:
            def loop(k: int) -> None:
                cupy.cuda.set_allocator(fn)
                if not gc_on:
                    gc.disable()
                try:
                    for _ in range(k):
                        step()
                finally:
                    gc.enable()
            return loop

        cases = {f"{name}{'' if on else ', gc off'}": under(fn, on)
                 for name, fn in allocs.items() for on in (True, False)}
        times = measure(cases, dict.fromkeys(cases, args.steps), 11, sync, 7)
        print(f"workload_profile_probe: {args.size} MLP step ({batch}x{dim}, hidden {hidden}), "
              f"{cm.Device(0).name}, CuPy {cupy.__version__}, {args.steps} steps per sample")
        print("\n1. us per step (median of 11 interleaved samples)")
        ref = times["floor cached + ledger"]
        for name, v in times.items():
            ratio = f"{v / ref:6.3f}x the floor + ledger" if v and ref else ""
            print(f"   {name:36} {v * 1e6 if v else 0:10.1f}  {ratio}")

        print("\n2. per step: allocations, cache misses, driver allocs/frees, collections "
              "(gen 0/1/2) and their time")
        for name, fn in allocs.items():
            n = [0]
            watch = GcWatch()
            misses0 = cache.misses
            driver[:] = [0, 0]
            cupy.cuda.set_allocator(counting(fn, n))
            gc.callbacks.append(watch)
            try:
                for _ in range(args.steps):
                    step()
                sync()
            finally:
                gc.callbacks.remove(watch)
            k = args.steps
            print(f"   {name:24} allocs {n[0] / k:6.1f}  misses {(cache.misses - misses0) / k:6.2f}"
                  f"  driver {driver[0] / k:5.2f}/{driver[1] / k:5.2f}  gc "
                  f"{'/'.join(f'{c / k:.3f}' for c in watch.counts)}  "
                  f"{watch.seconds / k * 1e6:7.1f} us")

        print("\n3. us per step inside the allocator calls (the timer's own cost taken off)")
        empty = [0.0]
        probe = timed(lambda size: None, empty)
        for _ in range(10000):
            probe(0)
        own = empty[0] / 10000
        for name, fn in allocs.items():
            acc, n = [0.0], [0]
            cupy.cuda.set_allocator(counting(timed(fn, acc), n))
            for _ in range(args.steps):
                step()
            sync()
            per = (acc[0] - own * n[0]) / args.steps
            print(f"   {name:24} {per * 1e6:8.1f} us in {n[0] / args.steps:.1f} calls "
                  f"({per / max(n[0] / args.steps, 1) * 1e9:6.0f} ns each)")

        print(f"\n4. cProfile, {args.steps} steps each (own time per step; calls per step)")
        prof_m = profile(cupy, memkit, step, args.steps, sync)
        prof_f = profile(cupy, floor_l, step, args.steps, sync)
        print(f"   top {args.top} under memkit cached:")
        for k, (c, t) in sorted(prof_m.items(), key=lambda kv: -kv[1][1])[:args.top]:
            print(f"     {t * 1e6:8.1f} us {c:6d}  {k}")
        keys = set(prof_m) | set(prof_f)
        diff = sorted(((prof_m.get(k, (0, 0.0))[1] - prof_f.get(k, (0, 0.0))[1], k)
                       for k in keys), reverse=True)
        print(f"   top {args.top} differences, memkit minus the floor + ledger (us per step, "
              f"calls memkit/floor):")
        for d, k in diff[:args.top]:
            calls = f"{prof_m.get(k, (0,))[0]:6d}/{prof_f.get(k, (0,))[0]:<6d}"
            print(f"     {d * 1e6:+8.1f} us {calls}  {k}")
        moved = [k for k in keys if prof_m.get(k, (0,))[0] != prof_f.get(k, (0,))[0]]
        print("   functions called a different number of times per step: "
              + ", ".join(f"{k} {prof_m.get(k, (0,))[0]}/{prof_f.get(k, (0,))[0]}"
                          for k in sorted(moved)[:args.top]))
        print(f"   total own time per step: memkit {sum(t for _, t in prof_m.values()) * 1e6:.1f}"
              f" us, floor + ledger {sum(t for _, t in prof_f.values()) * 1e6:.1f} us")
    finally:
        cupy.cuda.set_allocator(previous)
        gc.collect()
        sync()
        release_floor()
        release_floor_l()
        _cache.empty_all()
        _cache.ALLOC, _cache.FREE = real_alloc, real_free
        cupy_pool.free_all_blocks()
        sync()
        default.release_threshold = old_threshold
        default.trim()
        cupy.cuda.Stream.null.use()
        s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
