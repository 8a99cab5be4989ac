"""A CuPy training step under CuPy's allocators, memkit's adaptor and the floors.

    python benchmarks/bench_workload.py [--json PATH] [--quick]

A two-layer MLP in CuPy, forward and backward by hand with an SGD update
(``relu(x @ W1 + b1) @ W2``, squared loss; every step makes temporaries, and
cuBLAS asks for its workspace), at three sizes, time per iteration (median
over interleaved samples; each sample runs a loop of iterations, then
synchronizes). CuPy's allocator is set to, in turn:

* ``malloc_async`` (CuPy's stream-ordered allocator on the default pool);
* CuPy's default caching ``MemoryPool``;
* the memkit adaptor uncached (``cupy_allocator(cache=False)``);
* the memkit adaptor cached (``cupy_allocator()``, the default);
* the pure-Python cached floor (a free list per stream and rounded size;
  not memkit), and the same floor keeping memkit's exact ledger (a dict entry
  and the counters per allocation);
* the ablation floors (not memkit): that floor with what the adaptor promises
  (the current device and stream asked, the size checked, a memory object that
  knows its bin and stream), and with the one release path on top.

Target (small and medium): the cached adaptor <= 1.05x the floor with the
exact ledger of the same size, CuPy's pool beside it. Ratios against that
floor are medians of the ratios within each sample (both ran in it, so the
machine's drift between samples cancels); the ratios in the column before the
target are against ``malloc_async`` of the same size in the same run. Needs
CuPy and a GPU: on the simulator it prints that and exits 0.
"""

from __future__ import annotations

import argparse
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
    paired_ratio,
    paired_target,
    promised_cupy_floor,
    verdict,
)
from rmm_rows import (
    cupy_allocator,
    device_resources,
    import_rmm,
    restore_default_resource,
    versions,
)

SIZES = {"small": (64, 256, 512), "medium": (256, 1024, 2048), "large": (1024, 4096, 4096)}


def mlp(cupy: Any, batch: int, dim: int, hidden: int) -> Callable[[], None]:
    """One training step of a 2-layer MLP (its arrays made now, with CuPy's allocator then)."""
    rng = cupy.random.default_rng(0)
    x = rng.standard_normal((batch, dim), dtype=cupy.float32)
    t = rng.standard_normal((batch, dim), dtype=cupy.float32)
    w1 = rng.standard_normal((dim, hidden), dtype=cupy.float32) * 0.01
    b1 = cupy.zeros(hidden, dtype=cupy.float32)
    w2 = rng.standard_normal((hidden, dim), dtype=cupy.float32) * 0.01
    lr = cupy.float32(1e-3)

    def step() -> None:
        pre = x @ w1 + b1
        h = cupy.maximum(pre, 0)
        y = h @ w2
        diff = y - t
        loss = (diff * diff).mean()
        dy = diff * (2.0 / diff.size)
        dw2 = h.T @ dy
        dh = (dy @ w2.T) * (pre > 0)
        dw1 = x.T @ dh
        db1 = dh.sum(axis=0)
        w1[...] -= lr * dw1
        b1[...] -= lr * db1
        w2[...] -= lr * dw2
        del loss

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quick", action="store_true", help="fewer and shorter samples")
    args = ap.parse_args()

    import cuda_memkit as cm
    from cuda_memkit import allocators

    backend_name, simulated, raw = backend()

    def not_measured(why: str) -> None:
        print(f"bench_workload on backend {backend_name}: {why}; not measured")
        if args.json:  # the summary still finds the benchmark, with the reason
            with open(args.json, "w") as f:
                json.dump({"backend": backend_name, "rows": [], "not_measured": why}, f)

    if simulated:
        not_measured("needs CuPy on a GPU")
        return
    try:
        import cupy
    except Exception as exc:  # absent or broken: nothing to measure
        not_measured(f"CuPy not usable: {exc!r}")
        return
    from cuda.bindings import driver as cu

    samples = 5 if args.quick else 31  # GPU-bound steps vary by a few percent: more samples
    iters = {"small": 20 if args.quick else 300, "medium": 10 if args.quick else 100,
             "large": 5 if args.quick else 20}

    def sync() -> None:
        (err,) = raw.cuCtxSynchronize()
        if err:
            raise RuntimeError(err)

    s = cm.Stream()
    stream = cupy.cuda.ExternalStream(s.handle)
    stream.use()
    default = cm.MemoryPool.default(0)
    old_threshold = default.release_threshold
    default.release_threshold = (1 << 64) - 1
    previous = cupy.cuda.get_allocator()
    cupy_pool = cupy.cuda.MemoryPool()

    # The pure-Python cached floor (not memkit): harness.cupy_cached_floor.
    floor_allocator, release_floor = cupy_cached_floor(
        cupy, raw.cuMemAllocFromPoolAsync, raw.cuMemFreeAsync, cu.CUmemoryPool(default.handle))
    ledger_allocator, release_ledger_floor = cupy_cached_floor(
        cupy, raw.cuMemAllocFromPoolAsync, raw.cuMemFreeAsync, cu.CUmemoryPool(default.handle),
        floor_ledger())

    floor_pool = cu.CUmemoryPool(default.handle)
    promised_lists: list[tuple[list[Any], Any]] = []
    promised: dict[str, Callable[[int], Any]] = {}
    for path, key in ((False, "floor + promises"), (True, "floor + promises + path")):
        promised[key], lists_ = promised_cupy_floor(cupy, raw.cuMemAllocFromPoolAsync,
                                                    floor_pool, floor_ledger(), one_path=path)
        promised_lists.extend(lists_)

    allocs: dict[str, Callable[[int], Any]] = {
        "malloc_async": cupy.cuda.malloc_async, "cupy pool": cupy_pool.malloc,
        "memkit uncached": allocators.cupy_allocator(cache=False),
        "memkit cached": allocators.cupy_allocator(),
        "floor cached": floor_allocator, "floor cached + ledger": ledger_allocator,
        **promised}
    rmm, rmm_missing = import_rmm(simulated)
    if rmm is not None:  # rmm_cupy_allocator over RMM's pool resource, in the same run
        allocs["rmm"] = cupy_allocator(rmm, device_resources(rmm)["pool"])

    results: dict[str, dict[str, float | None]] = {}
    sample_times: dict[str, dict[str, list[float]]] = {}
    for size, (batch, dim, hidden) in SIZES.items():
        step = mlp(cupy, batch, dim, hidden)

        def under(fn: Callable[[int], Any], step: Callable[[], None] = step) -> Loop:
            def loop(k: int) -> None:
                cupy.cuda.set_allocator(fn)
                for _ in range(k):
                    step()
            return loop

        try:
            cases: dict[str, Loop | None] = {name: under(fn) for name, fn in allocs.items()}
            sample_times[size] = {}
            results[size] = measure(cases, dict.fromkeys(cases, iters[size]), samples, sync, 22,
                                    sample_times[size])
        finally:
            cupy.cuda.set_allocator(previous)
        del step

    cupy.cuda.set_allocator(previous)
    cupy.cuda.Stream.null.use()
    sync()
    if rmm is not None:  # RMM's pool goes with the allocator holding it
        del allocs["rmm"]
        restore_default_resource(rmm)
    release_floor()
    release_ledger_floor()
    for blocks, cus_ in promised_lists:
        while blocks:
            raw.cuMemFreeAsync(blocks.pop(), cus_)
    cache_mod = sys.modules.get("cuda_memkit._pools._cache")
    if cache_mod is not None:
        cache_mod.empty_all()
    cupy_pool.free_all_blocks()
    sync()
    default.release_threshold = old_threshold
    default.trim()
    s.close()

    rows: list[dict[str, Any]] = []
    print(f"bench_workload on backend {backend_name} ({cm.Device(0).name}), CuPy "
          f"{cupy.__version__}")
    print(f"median of {samples} samples; a 2-layer MLP forward+backward+SGD step per iteration")
    print(f"{'case':56} {'us/iter':>10} {'vs malloc_async':>16}  target")
    for size, res in results.items():
        batch, dim, hidden = SIZES[size]
        ref, fll = res["malloc_async"], res["floor cached + ledger"]
        for name in [*allocs, "rmm"]:
            if name == "rmm" and rmm is None:
                rows.append({"case": f"{size} ({batch}x{dim}, hidden {hidden}): rmm",
                             "us": None, "ratio": None, "target": rmm_missing, "ok": None})
                print(f"{rows[-1]['case']:56} {'n/a':>10} {'':>16}  {rmm_missing}")
                continue
            v = res[name]
            ratio = None if v is None or not ref else v / ref
            target, ok = "info", None
            if name == "memkit cached" and size != "large":
                target, ok = paired_target(sample_times[size], name, "floor cached + ledger",
                                           1.05, "floor + promises")
            elif name == "floor cached + ledger":
                target = "its floor"
            elif name.startswith("floor + promises"):
                target = ablation_target(sample_times[size], name, "floor cached + ledger", 1.05)
            elif name == "rmm" and v is not None and res["memkit cached"] is not None:
                mk = res["memkit cached"]
                target, ok = (f"memkit cached ahead of it (same samples: {mk * 1e6:.1f} us, "
                              f"{v / mk:.2f}x)"), mk <= v
            elif name == "cupy pool" and (
                    vs := paired_ratio(sample_times[size], name, "floor cached + ledger")):
                target = f"info: {vs:.2f}x the floor + ledger"
            rows.append({"case": f"{size} ({batch}x{dim}, hidden {hidden}): {name}",
                         "us": None if v is None else v * 1e6, "ratio": ratio,
                         "target": target, "ok": ok,
                         "floor_us": None if fll is None else fll * 1e6})
            r = rows[-1]
            value = "n/a" if r["us"] is None else f"{r['us']:10.1f}"
            rt = "" if ratio is None else f"{ratio:15.3f}x"
            print(f"{r['case']:56} {value:>10} {rt:>16}  {target}{verdict(r)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": backend_name, "cupy": cupy.__version__, "samples": samples,
                       "versions": versions(rmm),
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
