"""CuPy on memkit pools: allocation cost of the adaptor against CuPy's own allocators.

    python benchmarks/bench_frameworks.py [--json PATH] [--quick]

One table, every row measured in this run (median over interleaved samples
of the time per allocate+free pair, 1 MiB, on one non-blocking stream that is
CuPy's current stream; pools keep their memory: release threshold UINT64_MAX):

* references: raw ``cuMemAllocFromPoolAsync`` + ``cuMemFreeAsync`` on the
  device's default pool and on a memkit pool; ``MemoryPool.allocate().free()``;
* CuPy's allocators called directly: ``malloc_async`` (the default pool, in
  Cython) and its caching ``MemoryPool().malloc``;
* through CuPy's entry point ``cupy.cuda.alloc(n)`` (what CuPy's arrays call),
  with ``set_allocator`` set to: ``malloc_async``, CuPy's ``MemoryPool``, the
  memkit adaptor on the default pool, cached (``cupy_allocator()``, the
  default) and uncached (``cache=False``), the cached adaptor on a memkit pool
  (``cupy_allocator(pool)``), and the pure-Python cached floor: a free list
  keyed by (stream, size rounded to 512 B) whose memory object gives its
  block back in ``__del__`` (no checks, no ledger; not memkit);
* ``cupy.empty(256K float32)`` + drop under the same allocators;
* a CuPy workload (temporaries of elementwise arithmetic and a reduction on
  64K floats), time per iteration and allocations per second under each;
* pinned 4 KiB: CuPy's pinned pool against the memkit pinned adaptor and a
  pure-Python pinned free list.

Every cached floor also runs with memkit's exact ledger ("+ ledger": a dict
entry and the counters per allocation). Targets (the same run, each against
its floor with the ledger, as the median of the ratios within each sample):
the ``cupy.cuda.alloc`` 1 MiB pair through the
cached adaptor, ``cupy.empty(1 MiB)`` + drop and the pinned adaptor's pair
<= 1.5x. Ablation rows add to the floors what the adaptor promises ("+
promises": the current device asked, the size checked, the memory holding its
block and stream; for the pinned adaptor, a pooled ``HostBuffer``, as it
promises), then its one release path ("+ promises + path": the block taken
from and given back to a bin that calls the ledger). Each target row ends in
OK, MISS or BLOCKED: BLOCKED is a miss while the "+ promises" row is itself
above the bound (the path is memkit's own cost and never blocks). On the
simulator (no CuPy) only the memkit rows run, and the table says so.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from collections.abc import Callable
from typing import Any

from harness import (
    Loop,
    ablation_target,
    backend,
    cupy_cached_floor,
    floor_ledger,
    measure,
    paired_target,
    promised_cupy_floor,
    promised_pinned_floor,
    verdict,
)
from rmm_rows import (
    cupy_allocator,
    device_resources,
    import_rmm,
    pinned_resources,
    resource_pairs,
    restore_default_resource,
    rmm_stream,
    versions,
)

MiB = 1 << 20
U64_MAX = (1 << 64) - 1


def import_cupy(simulated: bool) -> Any:
    if simulated:
        return None
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
        return cupy
    except Exception as exc:  # absent or broken: memkit rows only
        print(f"CuPy not usable: {exc!r}", file=sys.stderr)
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quick", action="store_true", help="fewer and shorter samples")
    args = ap.parse_args()

    import cuda_memkit as cm
    from cuda_memkit import allocators

    backend_name, simulated, raw = backend()
    quick = args.quick or simulated
    from cuda.bindings import driver as cu

    samples = 5 if quick else 15
    n_pair = 300 if quick else 10000
    n_empty = 300 if quick else 5000
    n_work = 30 if quick else 1000
    cupy = import_cupy(simulated)

    s = cm.Stream()
    cus = cu.CUstream(s.handle)

    def sync() -> None:
        (err,) = raw.cuCtxSynchronize()
        if err:
            raise RuntimeError(err)

    pool = cm.MemoryPool(0, release_threshold=U64_MAX)
    default = cm.MemoryPool.default(0)
    old_threshold = default.release_threshold
    default.release_threshold = U64_MAX
    alloc_fn, free_fn = raw.cuMemAllocFromPoolAsync, raw.cuMemFreeAsync

    def raw_pairs(on: cm.MemoryPool, n: int) -> Loop:
        cupool = cu.CUmemoryPool(on.handle)

        def loop(k: int) -> None:
            for _ in range(k):
                err, ptr = alloc_fn(n, cupool, cus)
                if err:
                    raise RuntimeError(err)
                (err,) = free_fn(ptr, cus)
                if err:
                    raise RuntimeError(err)

        return loop

    allocate = pool.allocate

    def memkit_pair(k: int) -> None:
        for _ in range(k):
            allocate(MiB, stream=s).free()

    cases: dict[str, Loop | None] = {
        "raw default": raw_pairs(default, MiB), "raw pool": raw_pairs(pool, MiB),
        "memkit pool": memkit_pair}
    empty_cases: dict[str, Loop | None] = {}
    work_cases: dict[str, Loop | None] = {}
    pinned_cases: dict[str, Loop | None] = {}
    allocs_per_iter: dict[str, int] = {}
    previous = previous_pinned = None
    rmm, rmm_missing = import_rmm(simulated or cupy is None)
    if cupy is None and not simulated:
        rmm_missing = "not measured: needs CuPy"
    if cupy is not None:
        stream = cupy.cuda.ExternalStream(s.handle)
        stream.use()
        previous = cupy.cuda.get_allocator()
        cupy_pool = cupy.cuda.MemoryPool()
        adaptors = {"malloc_async": cupy.cuda.malloc_async, "cupy pool": cupy_pool.malloc,
                    "memkit default": allocators.cupy_allocator(),
                    "memkit uncached": allocators.cupy_allocator(cache=False),
                    "memkit pool": allocators.cupy_allocator(pool)}
        if rmm is not None:  # rmm_cupy_allocator over RMM's pool resource, in the same run
            rmm_pool = device_resources(rmm)["pool"]
            adaptors["rmm"] = cupy_allocator(rmm, rmm_pool)
        calloc, set_allocator = cupy.cuda.alloc, cupy.cuda.set_allocator

        def direct(fn: Callable[[int], Any]) -> Loop:
            def loop(k: int) -> None:
                for _ in range(k):
                    p = fn(MiB)
                    del p
            return loop

        def through_alloc(fn: Callable[[int], Any]) -> Loop:
            def loop(k: int) -> None:
                set_allocator(fn)
                for _ in range(k):
                    p = calloc(MiB)
                    del p
            return loop

        def empties(fn: Callable[[int], Any]) -> Loop:
            empty, f32 = cupy.empty, cupy.float32

            def loop(k: int) -> None:
                set_allocator(fn)
                for _ in range(k):
                    a = empty(MiB // 4, dtype=f32)
                    del a
            return loop

        x = cupy.arange(1 << 16, dtype=cupy.float32)

        def workload(fn: Callable[[int], Any]) -> Loop:
            def loop(k: int) -> None:
                set_allocator(fn)
                for _ in range(k):
                    y = ((x * 2.0 + 1.0) * x - x / 3.0).sum()
                    del y
            return loop

        # The least a pure-Python CuPy allocator can cost: one fixed pool and stream,
        # no device or stream lookup, no checks, no ledger; the memory object frees in
        # __del__. Not memkit: a yardstick for the adaptor's target.
        floor_pool = cu.CUmemoryPool(pool.handle)
        unowned, pointer = cupy.cuda.memory.UnownedMemory, cupy.cuda.memory.MemoryPointer

        class FloorMemory(unowned):  # type: ignore[misc, valid-type]
            __slots__ = ("d",)

            def __del__(self) -> None:
                free_fn(self.d, cus)

        def floor_allocator(size: int) -> Any:
            err, d = alloc_fn(size, floor_pool, cus)
            if err:
                raise RuntimeError(err)
            m = FloorMemory(int(d), size, None, 0)
            m.d = d
            return pointer(m, 0)

        cases["alloc: floor"] = through_alloc(floor_allocator)

        # The pure-Python cached floor (the probe; harness.cupy_cached_floor).
        cached_floor_allocator, release_floor = cupy_cached_floor(cupy, alloc_fn, free_fn,
                                                                  floor_pool)
        adaptors["floor cached"] = cached_floor_allocator
        # The same floor keeping memkit's exact ledger (a dict entry and counters per
        # allocation): the least the targets' "ledger on" can cost.
        ledger_floor_allocator, release_ledger_floor = cupy_cached_floor(
            cupy, alloc_fn, free_fn, floor_pool, floor_ledger())
        adaptors["floor cached + ledger"] = ledger_floor_allocator
        # The ablation floors (harness.py): + what the adaptor promises, + one release path.
        promised_lists: list[tuple[list[Any], Any]] = []
        for path, key in ((False, "floor + promises"), (True, "floor + promises + path")):
            promised_allocator, lists_ = promised_cupy_floor(cupy, alloc_fn, floor_pool,
                                                             floor_ledger(), one_path=path)
            adaptors[key] = promised_allocator
            promised_lists.extend(lists_)
        cases["cupy malloc_async"] = direct(cupy.cuda.malloc_async)
        cases["cupy MemoryPool"] = direct(cupy_pool.malloc)
        for name, fn in adaptors.items():
            cases[f"alloc: {name}"] = through_alloc(fn)
            empty_cases[name] = empties(fn)
            work_cases[name] = workload(fn)
        # allocations per workload iteration (counted once, not timed)
        for name, fn in adaptors.items():
            count = [0]

            def counting(n: int, _fn: Callable[[int], Any] = fn, _c: list[int] = count) -> Any:
                _c[0] += 1
                return _fn(n)

            set_allocator(counting)
            y = ((x * 2.0 + 1.0) * x - x / 3.0).sum()
            del y
            allocs_per_iter[name] = count[0]
        set_allocator(previous)

        alloc_pinned = cupy.cuda.alloc_pinned_memory
        set_pinned = cupy.cuda.set_pinned_memory_allocator
        previous_pinned = cupy.get_default_pinned_memory_pool().malloc
        memkit_pinned = allocators.cupy_pinned_allocator()

        def pinned_loop(fn: Callable[[int], Any]) -> Loop:
            def loop(k: int) -> None:
                set_pinned(fn)
                for _ in range(k):
                    p = alloc_pinned(4096)
                    del p
            return loop

        # The pure-Python pinned floor: a free list of pinned blocks per size, the
        # pointer's memory gives its block back in __del__. Not memkit.
        pinned_pointer = cupy.cuda.pinned_memory.PinnedMemoryPointer
        pinned_floor_lists: dict[int, list[Any]] = {}
        floor_hostallocs: list[int] = []

        class PinnedFloor:
            __slots__ = ("blocks", "ptr", "size")

            def __del__(self) -> None:
                self.blocks.append(self.ptr)

        pinned_ledger = floor_ledger()

        class LedgerPinnedFloor(PinnedFloor):
            __slots__ = ()

            def __del__(self) -> None:
                p = self.ptr
                pinned_ledger.current -= pinned_ledger.live.pop(p)
                self.blocks.append(p)

        def make_pinned_floor(cls: type[PinnedFloor]) -> Callable[[int], Any]:
            def pinned_floor(size: int) -> Any:
                blocks = pinned_floor_lists.get(size)
                if blocks is None:
                    blocks = pinned_floor_lists[size] = []
                b = cls()
                b.blocks = blocks
                b.size = size
                if blocks:
                    b.ptr = blocks.pop()
                else:
                    b.ptr = cupy.cuda.runtime.hostAlloc(size, 0)
                    floor_hostallocs.append(b.ptr)
                if cls is LedgerPinnedFloor:  # the ledger's work, written out
                    pinned_ledger.live[b.ptr] = size
                    c = pinned_ledger.current = pinned_ledger.current + size
                    if c > pinned_ledger.peak:
                        pinned_ledger.peak = c
                    pinned_ledger.total += 1
                return pinned_pointer(b, 0)
            return pinned_floor

        def promised_pinned(path: bool) -> Loop:
            hostallocs = [cupy.cuda.runtime.hostAlloc(4096, 0) for _ in range(4)]
            floor_hostallocs.extend(hostallocs)
            take = promised_pinned_floor(hostallocs, floor_ledger(), one_path=path)
            return pinned_loop(lambda size: pinned_pointer(take(size), 0))

        pinned_cases = {"cupy pinned pool": pinned_loop(previous_pinned),
                        "floor pinned + promises": promised_pinned(False),
                        "floor pinned + promises + path": promised_pinned(True),
                        "memkit pinned": pinned_loop(memkit_pinned),
                        "floor pinned": pinned_loop(make_pinned_floor(PinnedFloor)),
                        "floor pinned + ledger": pinned_loop(
                            make_pinned_floor(LedgerPinnedFloor)),
                        "memkit pinned uncached": pinned_loop(
                            allocators.cupy_pinned_allocator(cache=False))}
        if rmm is not None:  # RMM's pinned resource, called directly (it has no CuPy hook)
            rstream = rmm_stream(rmm, s)
            for name, mr in pinned_resources(rmm).items():
                pinned_cases[f"rmm {name}"] = resource_pairs(mr, rstream, 4096)

    # Each sample's times too: the targets are ratios paired within a sample.
    pair_s: dict[str, list[float]] = {}
    empty_s: dict[str, list[float]] = {}
    pinned_s: dict[str, list[float]] = {}
    pair = measure(cases, dict.fromkeys(cases, n_pair), samples, sync, 13, pair_s)
    empty_t = measure(empty_cases, dict.fromkeys(empty_cases, n_empty), samples, sync, 13,
                      empty_s)
    work_t = measure(work_cases, dict.fromkeys(work_cases, n_work), samples, sync, 13)
    # RMM's plain pinned resource pins pages at every call: few pairs
    pinned_t = measure(pinned_cases, {k: 20 if k == "rmm pinned" else n_pair
                                      for k in pinned_cases}, samples, sync, 13, pinned_s)
    if cupy is not None:
        cupy.cuda.set_allocator(previous)
        cupy.cuda.set_pinned_memory_allocator(previous_pinned)
        cupy.cuda.Stream.null.use()
        del x
        gc.collect()
        sync()
        release_floor()
        release_ledger_floor()
        for blocks, cus_ in promised_lists:
            while blocks:
                free_fn(blocks.pop(), cus_)
        for hp in floor_hostallocs:
            cupy.cuda.runtime.freeHost(hp)
    if rmm is not None:  # RMM's resources go with the cases holding them
        cases.clear()
        empty_cases.clear()
        work_cases.clear()
        pinned_cases.clear()
        adaptors.clear()
        restore_default_resource(rmm)
        gc.collect()
    cache_mod = sys.modules.get("cuda_memkit._pools._cache")
    if cache_mod is not None:  # the adaptors' cached blocks go back before the trim
        cache_mod.empty_all()
    sync()
    default.release_threshold = old_threshold
    default.trim()
    try:
        pool.close()
    except BufferError as exc:  # something still holds the pool's memory: say what, go on
        from cuda_memkit._core import _resource

        live = _resource.account("pool", 0, pool.handle).live
        print(f"cleanup: {exc}; memkit's ledger holds {len(live)} of them "
              f"({sum(live.values())} bytes), the rest is the floors'")
        pool.close(force=True)
    s.close()

    rows: list[dict[str, Any]] = []

    def row(case: str, value: float | None, ref: float | None, target: str,
            ok: bool | None = None, unit: str = "us/pair", floor: float | None = None
            ) -> None:
        rows.append({"case": case, "us": None if value is None else value * 1e6, "unit": unit,
                     "ratio": None if value is None or not ref else value / ref,
                     "target": target, "ok": ok,
                     "floor_us": None if floor is None else floor * 1e6})

    def ablation_rows(label: str, f: dict[str, float | None], times: dict[str, list[float]],
                      key: str, floor: str, bound: float, ref: float | None) -> None:
        """The ablation rows of a target: its floor with the promises, then the path too."""
        for name, what in ((key, "promises"), (key + " + path", "promises + path")):
            row(f"   the floor + ledger + {label}{what} (not memkit)", f.get(name), ref,
                ablation_target(times, name, floor, bound))

    raw_ref = pair["raw default"]
    row("1 MiB: raw pool pair, device default pool", raw_ref, raw_ref, "reference")
    row("1 MiB: raw pool pair, memkit pool", pair["raw pool"], raw_ref, "info")
    row("1 MiB: MemoryPool.allocate(stream=s).free()", pair["memkit pool"], raw_ref, "info")
    row("1 MiB: CuPy malloc_async (direct)", pair.get("cupy malloc_async"), raw_ref, "info")
    row("1 MiB: CuPy MemoryPool().malloc (direct)", pair.get("cupy MemoryPool"), raw_ref,
        "info")
    mc, fll = pair.get("alloc: memkit default"), pair.get("alloc: floor cached + ledger")
    row("1 MiB via cupy.cuda.alloc: memkit adaptor (cached, default)", mc, raw_ref,
        *paired_target(pair_s, "alloc: memkit default", "alloc: floor cached + ledger", 1.5,
                       "alloc: floor + promises"), floor=fll)
    row("   pure-Python cached floor + exact ledger (not memkit)", fll, raw_ref, "its floor")
    ablation_rows("", pair, pair_s, "alloc: floor + promises", "alloc: floor cached + ledger",
                  1.5, raw_ref)
    for name, label in [("malloc_async", "CuPy malloc_async"),
                        ("cupy pool", "CuPy MemoryPool"),
                        ("memkit uncached", "memkit adaptor, uncached (cache=False)"),
                        ("memkit pool", "memkit adaptor (cached) on a memkit pool"),
                        ("floor cached", "pure-Python cached floor (not memkit)"),
                        ("floor", "pure-Python uncached floor (not memkit)")]:
        row(f"1 MiB via cupy.cuda.alloc: {label}", pair.get(f"alloc: {name}"), raw_ref, "info")
    ea, me = empty_t.get("malloc_async"), empty_t.get("memkit default")
    efl = empty_t.get("floor cached + ledger")
    row("cupy.empty(1 MiB) + drop: memkit adaptor (cached)", me, ea,
        *paired_target(empty_s, "memkit default", "floor cached + ledger", 1.5,
                       "floor + promises"), floor=efl)
    row("   pure-Python cached floor + exact ledger (not memkit)", efl, ea, "its floor")
    ablation_rows("", empty_t, empty_s, "floor + promises", "floor cached + ledger", 1.5, ea)
    for name in ("malloc_async", "cupy pool", "memkit uncached", "memkit pool",
                 "floor cached"):
        row(f"cupy.empty(1 MiB) + drop: {name}", empty_t.get(name), ea,
            "info (ratio vs malloc_async)")
    wa = work_t.get("malloc_async")
    for name in ("memkit default", "floor cached + ledger", "floor + promises",
                 "floor + promises + path",
                 "malloc_async", "cupy pool", "memkit uncached", "memkit pool",
                 "floor cached"):
        v = work_t.get(name)
        row(f"workload iteration ({allocs_per_iter.get(name, '?')} allocs): {name}", v, wa,
            "info (ratio vs malloc_async)", unit="us/iter")
        if v is not None and allocs_per_iter.get(name):
            rows[-1]["allocs_per_s"] = allocs_per_iter[name] / v
    pa, pm = pinned_t.get("cupy pinned pool"), pinned_t.get("memkit pinned")
    pfl = pinned_t.get("floor pinned + ledger")
    row("4 KiB pinned: CuPy pinned pool", pa, pa, "reference")
    row("4 KiB pinned: memkit pinned adaptor (cached, default)", pm, pa,
        *paired_target(pinned_s, "memkit pinned", "floor pinned + ledger", 1.5,
                       "floor pinned + promises"), floor=pfl)
    row("4 KiB pinned: pure-Python floor + exact ledger (not memkit)", pfl, pa, "its floor")
    ablation_rows("a pooled HostBuffer's ", pinned_t, pinned_s, "floor pinned + promises",
                  "floor pinned + ledger", 1.5, pa)
    row("4 KiB pinned: memkit pinned adaptor, uncached (cache=False)",
        pinned_t.get("memkit pinned uncached"), pa, "info")
    row("4 KiB pinned: pure-Python floor (free list; not memkit)", pinned_t.get("floor pinned"),
        pa, "info")

    # RMM's rows: rmm_cupy_allocator over a PoolMemoryResource, and its pinned resource.
    for case, got, key, mine, ref, unit in (
            ("1 MiB via cupy.cuda.alloc: RMM rmm_cupy_allocator (PoolMemoryResource)", pair,
             "alloc: rmm", "alloc: memkit default", raw_ref, "us/pair"),
            ("cupy.empty(1 MiB) + drop: RMM rmm_cupy_allocator (PoolMemoryResource)", empty_t,
             "rmm", "memkit default", ea, "us/pair"),
            (f"workload iteration ({allocs_per_iter.get('rmm', '?')} allocs): RMM "
             "rmm_cupy_allocator", work_t, "rmm", "memkit default", wa, "us/iter"),
            ("4 KiB pinned: RMM PinnedHostMemoryResource.allocate + deallocate", pinned_t,
             "rmm pinned", "memkit pinned", pa, "us/pair"),
            ("4 KiB pinned: RMM PoolMemoryResource(PinnedHostMemoryResource)", pinned_t,
             "rmm pinned pool", "memkit pinned", pa, "us/pair")):
        v, m = got.get(key), got.get(mine)
        if rmm is None:
            row(case, None, None, rmm_missing, unit=unit)
        elif v is None or m is None:
            row(case, None, None, "not measured: this RMM has no such resource", unit=unit)
        else:
            row(case, v, ref, f"memkit's adaptor ahead of it (same samples: {m * 1e6:.3f} us, "
                f"{v / m:.2f}x)", ok=m <= v, unit=unit)

    note = " -- SIMULATED: memkit rows only, numbers are the CPU simulator's" if simulated else ""
    print(f"bench_frameworks on backend {backend_name} ({cm.Device(0).name}){note}")
    if cupy is None:
        print("CuPy rows need a GPU with CuPy installed: not measured here")
    else:
        print(f"CuPy {cupy.__version__}")
    print(f"median of {samples} samples; loops of {n_pair} pairs, {n_empty} cupy.empty, "
          f"{n_work} workload iterations")
    print(f"{'case':64} {'time':>10} {'unit':>8} {'ratio':>9} {'floor':>9}  target")
    for r in rows:
        value = "" if r["us"] is None else f"{r['us']:10.3f}"
        if r["us"] is None and r["unit"]:
            value = "n/a"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:8.3f}x"
        floor = "" if r.get("floor_us") is None else f"{r['floor_us']:9.3f}"
        extra = f"  ({r['allocs_per_s'] / 1e6:.2f} M allocs/s)" if r.get("allocs_per_s") else ""
        print(f"{r['case']:64} {value:>10} {r['unit']:>8} {ratio:>9} {floor:>9}  "
              f"{r['target']}{verdict(r)}{extra}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": backend_name, "simulated": simulated, "samples": samples,
                       "cupy": None if cupy is None else cupy.__version__,
                       "versions": versions(rmm), "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
