"""A CuPy-backed dask.array job on a dask-cuda cluster under three allocators.

    python benchmarks/bench_dask.py [--json PATH] [--quick] [--size N] [--chunk C]

One ``dask_cuda.LocalCUDACluster`` (one worker per GPU), started with
dask-cuda's ``rmm_pool_size`` (RMM's pool resource in every worker) and with
``MemkitPlugin(reserve=...)`` registered (a memkit pool of the same size in
every worker; its ledger on, as always). The job: a random ``N x N`` float32
matrix in ``C x C`` CuPy chunks, ``(x @ x.T + x).sum(axis=1)`` and
``((x * 2 - 1) * x + x / 3 - x * x).std(axis=0)`` (chunked matrix products,
elementwise temporaries and reductions: every task allocates its outputs and
temporaries through CuPy's current allocator), computed to two scalars. Each round computes it
once under each allocator, in a shuffled order, switching CuPy's allocator in
every worker between rounds (``client.run``):

* CuPy's default ``MemoryPool``;
* ``rmm_cupy_allocator`` over the ``rmm_pool_size`` pool (what dask-cuda's
  users run);
* the allocator ``MemkitPlugin`` installed (the memkit adaptor, cached, on the
  worker's plugin pool).

Median seconds per job; throughput (jobs per second) relative to the RMM
pool. Target: ``MemkitPlugin`` >= 1.0x the RMM pool's throughput, same run.
The per-worker peak of the plugin pool's ledger account is printed after.

On the simulator, or without CuPy and dask-cuda, ``--quick`` runs the plugin
on a ``distributed.LocalCluster`` of two processes instead (each with its own
simulated machine): a numpy ``dask.array`` whose chunks are staged through
each worker's plugin pool, with each worker's ledger; the GPU rows say
"not measured".
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import time
from typing import Any

import harness  # noqa: F401 - puts the repository root on sys.path

GiB = 1 << 30
POOL = 8 * GiB
ALLOCATORS = ("cupy pool", "rmm pool", "memkit plugin")
LABELS = {"cupy pool": "CuPy's default MemoryPool",
          "rmm pool": "rmm_cupy_allocator, dask-cuda rmm_pool_size",
          "memkit plugin": "MemkitPlugin (cupy_allocator on the worker pool)"}


# -- run in the workers (module functions: pickled by reference) -----------------------------

def _keep_allocators(dask_worker: Any) -> list[str]:
    """Keep the three allocators on the worker; MemkitPlugin's is the one installed now."""
    import cupy
    from rmm.allocators.cupy import rmm_cupy_allocator

    dask_worker._bench_allocators = {
        "cupy pool": cupy.get_default_memory_pool().malloc,
        "rmm pool": rmm_cupy_allocator,
        "memkit plugin": cupy.cuda.get_allocator()}
    return sorted(dask_worker._bench_allocators)


def _use(name: str, dask_worker: Any) -> None:
    import cupy

    cupy.cuda.set_allocator(dask_worker._bench_allocators[name])


def _forget_allocators(dask_worker: Any) -> None:
    import cupy

    cupy.cuda.set_allocator(dask_worker._bench_allocators["memkit plugin"])
    del dask_worker._bench_allocators
    cupy.get_default_memory_pool().free_all_blocks()


def _pool_peak(dask_worker: Any) -> dict[str, int]:
    import cuda_memkit as cm

    pool = dask_worker.plugins["cuda_memkit"].pool
    s = cm.memory_stats().pool(pool)
    return {"peak": s.peak, "current": s.current, "made": s.total,
            "reserved": pool.stats().reserved_current}


def _stage_through_pool(block: Any) -> Any:
    """A chunk copied into a buffer of the worker's plugin pool and back (the simulator job)."""
    from distributed import get_worker

    import cuda_memkit as cm

    pool = get_worker().plugins["cuda_memkit"].pool
    buf = pool.allocate(block.nbytes, stream=None)
    try:
        cm.copy(buf, block)
        out = buf.to_numpy(block.dtype, block.shape)
    finally:
        buf.free()
    return out * 2.0


# -- the GPU run -----------------------------------------------------------------------------

def job(cupy: Any, da: Any, n: int, chunk: int) -> tuple[Any, Any]:
    """The two scalars of the job, as dask collections (CuPy chunks)."""
    rs = da.random.RandomState(RandomState=cupy.random.RandomState)
    x = rs.random_sample((n, n), chunks=(chunk, chunk)).astype(cupy.float32)
    y = (x @ x.T + x).sum(axis=1)
    # Elementwise chains: one fused task per chunk, a CuPy temporary per operation.
    z = ((x * 2 - 1) * x + x / 3 - x * x).std(axis=0)
    return y.sum(), z.sum()


def gpu_run(args: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    import cupy
    import dask
    import dask.array as da
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    from cuda_memkit.dask import MemkitPlugin, memory_stats, unregister

    rounds = args.rounds or (2 if args.quick else 7)
    n, chunk = args.size, args.chunk
    t0 = time.perf_counter()

    def progress(what: str) -> None:  # a run cut short still shows where its time went
        print(f"[{time.perf_counter() - t0:7.2f} s] {what}", flush=True)

    with LocalCUDACluster(rmm_pool_size=POOL, dashboard_address=None,
                          silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        progress("LocalCUDACluster (rmm_pool_size) started")
        client.register_plugin(MemkitPlugin(reserve=POOL, cupy=True))
        workers = sorted(client.scheduler_info()["workers"])
        client.run(_keep_allocators)
        start_s = time.perf_counter() - t0
        progress(f"MemkitPlugin registered on {len(workers)} worker(s)")
        y, z = job(cupy, da, n, chunk)
        opt_y, opt_z = dask.optimize(y, z)
        tasks = len(opt_y.__dask_graph__()) + len(opt_z.__dask_graph__())
        times: dict[str, list[float]] = {k: [] for k in ALLOCATORS}
        rng = random.Random(41)
        order = list(ALLOCATORS)
        for r in range(rounds + 1):  # round 0 warms every pool and cuBLAS up
            rng.shuffle(order)
            for name in order:
                client.run(_use, name)
                t = time.perf_counter()
                dask.compute(y, z)
                elapsed = time.perf_counter() - t
                if r:
                    times[name].append(elapsed)
                progress(f"round {r} {name}: {elapsed * 1e3:.1f} ms")
        peaks = client.run(_pool_peak)
        stats = memory_stats(client)
        client.run(_forget_allocators)
        leaks = unregister(client)
    med = {k: statistics.median(v) for k, v in times.items()}
    ref = med["rmm pool"]
    for name in ALLOCATORS:
        v = med[name]
        target, ok = "info", None
        if name == "memkit plugin":
            target, ok = ">= 1.0x the RMM pool's throughput", ref / v >= 1.0
        elif name == "rmm pool":
            target = "reference"
        rows.append({"case": f"{n}x{n} in {chunk}x{chunk} chunks: {LABELS[name]}",
                     "ms": v * 1e3, "jobs_s": 1 / v, "ratio": ref / v,
                     "vs": "throughput vs the RMM pool", "target": target, "ok": ok,
                     "samples_ms": [round(t * 1e3, 3) for t in times[name]]})
    return {"workers": len(workers), "tasks": tasks, "rounds": rounds,
            "cluster_start_s": start_s, "pool_peaks": peaks,
            "ledger_current": {w: s.current for w, s in stats.items()},
            "left_allocated": {w: (r.nbytes if r else 0) for w, r in leaks.items()},
            "versions": {"cupy": cupy.__version__, "dask": dask.__version__,
                         **_versions("distributed", "dask_cuda", "rmm")}}


def _versions(*names: str) -> dict[str, str]:
    import importlib

    return {name: getattr(importlib.import_module(name), "__version__", "?") for name in names}


# -- the simulator run -------------------------------------------------------------------------

def sim_run(args: argparse.Namespace, rows: list[dict[str, Any]], why: str) -> dict[str, Any]:
    import dask.array as da
    import numpy as np
    from distributed import Client, LocalCluster

    from cuda_memkit.dask import MemkitPlugin, memory_stats, unregister

    for name in ALLOCATORS:
        rows.append({"case": f"GPU job: {LABELS[name]}", "ms": None, "target": why,
                     "ok": None})
    n, chunk = 1024, 256
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        client.register_plugin(MemkitPlugin(reserve=64 << 20, cupy=False))
        x = da.from_array(np.random.default_rng(0).random((n, n)), chunks=(chunk, chunk))
        total = x.map_blocks(_stage_through_pool, dtype=x.dtype).sum()
        t = time.perf_counter()
        value = float(total.compute())
        elapsed = time.perf_counter() - t
        peaks = client.run(_pool_peak)
        stats = memory_stats(client)
        leaks = unregister(client)
    expected = 2.0 * float(np.random.default_rng(0).random((n, n)).sum())
    rows.append({"case": f"simulator: {n}x{n} float64 in {chunk}x{chunk} chunks staged "
                 "through each worker's plugin pool", "ms": elapsed * 1e3,
                 "target": "info (the simulator's time)",
                 "ok": None, "correct": abs(value - expected) <= 1e-6 * abs(expected)})
    return {"workers": len(peaks), "pool_peaks": peaks,
            "ledger_current": {w: s.current for w, s in stats.items()},
            "left_allocated": {w: (r.nbytes if r else 0) for w, r in leaks.items()}}


def gpu_stack(simulated: bool) -> str:
    """Why the GPU job cannot run here ("" if it can)."""
    if simulated:
        return "not measured: needs CuPy, RMM and dask-cuda on a GPU"
    try:
        import cupy  # noqa: F401
        import dask_cuda  # noqa: F401
        import rmm  # noqa: F401
    except Exception as exc:  # absent or broken: the simulator's job only
        return f"not measured: {type(exc).__name__}: {exc}"
    return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument("--size", type=int, default=16384, help="matrix side (default 16384)")
    ap.add_argument("--chunk", type=int, default=2048, help="chunk side (default 2048)")
    ap.add_argument("--rounds", type=int, default=0,
                    help="timed rounds (default 7, 2 with --quick)")
    args = ap.parse_args()

    from cuda_memkit._core import _driver

    backend_name = _driver.backend_name()
    simulated = backend_name == "sim"
    why = gpu_stack(simulated)
    rows: list[dict[str, Any]] = []
    if why and not (args.quick or simulated):
        print(f"bench_dask on backend {backend_name}: {why}")
        info: dict[str, Any] = {}
        for name in ALLOCATORS:
            rows.append({"case": f"GPU job: {LABELS[name]}", "ms": None, "target": why,
                         "ok": None})
    elif why:
        info = sim_run(args, rows, why)
    else:
        info = gpu_run(args, rows)

    note = " -- SIMULATED: the plugin on simulated workers, no GPU job" if simulated else ""
    print(f"bench_dask on backend {backend_name}{note}")
    if not why:
        print(f"{info['workers']} worker(s), {info['tasks']} tasks per job, median of "
              f"{info['rounds']} rounds (allocators interleaved), cluster start "
              f"{info['cluster_start_s']:.1f} s")
    print(f"{'case':72} {'ms/job':>10} {'vs RMM':>8}  target")
    for r in rows:
        value = "n/a" if r["ms"] is None else f"{r['ms']:10.1f}"
        ratio = "" if r.get("ratio") is None else f"{r['ratio']:7.3f}x"
        verdict = "" if r["ok"] is None else (" OK" if r["ok"] else " MISS")
        print(f"{r['case']:72} {value:>10} {ratio:>8}  {r['target']}{verdict}")
    for w, p in sorted(info.get("pool_peaks", {}).items()):
        print(f"worker {w}: plugin pool peak {p['peak'] / 2**20:.1f} MiB in the ledger, "
              f"{p['made']} allocations, {p['reserved'] / 2**20:.0f} MiB reserved; left "
              f"allocated at teardown: {info['left_allocated'].get(w, 0)} bytes")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": backend_name, "simulated": simulated,
                       "title": "Dask workers on memkit pools",
                       "about": "A CuPy-backed dask.array job on a LocalCUDACluster under "
                                "CuPy's pool, dask-cuda's RMM pool and MemkitPlugin.",
                       **{k: v for k, v in info.items() if k != "pool_peaks"},
                       "rows": rows}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
