"""Pool allocation cost: cuda_memkit against raw cuda.bindings, CuPy, cuda.core and torch.

    python benchmarks/bench_pool.py [--json PATH] [--quick]

One table, every row measured in this run (median over interleaved samples of
the time per alloc+free pair; each sample runs a loop of pairs per case, then
synchronizes, the cases in a shuffled order):

* 1 MiB device allocations: raw ``cuMemAllocFromPoolAsync`` + ``cuMemFreeAsync``
  (the reference), ``MemoryPool.allocate(n, stream=s).free()``, CuPy
  ``cupy.cuda.malloc_async``, cuda.core ``Device.allocate`` + ``Buffer.close``
  and torch ``torch.empty(device="cuda")``. Pools release threshold UINT64_MAX.
  Yardsticks (info rows): raw and memkit on the device's default pool (the one
  CuPy, cuda.core and torch use), CuPy on memkit's pool, and the pure-Python
  floor: the thinnest wrapper with this API (an object that owns the memory,
  ``free()``, a finalizer for garbage collection; no checks at all).
* 4 KiB pinned host buffers: raw ``cuMemHostAlloc`` + ``cuMemFreeHost`` (the
  reference; microseconds here, not the ~0.7 ms it costs alone, because other
  small pinned allocations stay alive in this process), raw host-pool calls,
  ``HostBuffer.pooled(4096).close()``, ``PoolBuffer`` from a host pool, CuPy
  ``alloc_pinned_memory``, torch ``pin_memory=True`` and cuda.core
  ``PinnedMemoryResource``.

* the block cache: ``MemoryPool(cache=True)`` pairs against CuPy's caching
  ``MemoryPool().malloc`` (direct), and a pure-Python cached floor (a free
  list keyed by stream and rounded size, an object that gives its block back
  in ``free()`` or ``__del__``; no checks, no ledger).

Every floor also runs with memkit's exact ledger ("floor + ledger": a dict
entry and the counters per allocation), and, as ablation rows, with what the
buffer promises beyond it (checks, fields, the exports and stream tests, a
finalizer without class swap: "+ promises") and with the one release path on
top (a bin's take and give calling the ledger's add and remove: "+ promises
+ path"; see ``harness.py``).

Targets (all in the same run, each against its floor with the ledger; a target's
ratio is the median over samples of the ratio within each sample, where both ran):

* the cached pool pair ``MemoryPool(cache=True).allocate(1 MiB, stream=s).free()``
  and the uncached pair ``MemoryPool.allocate(1 MiB, stream=s).free()`` <= 1.5x;
* ``HostBuffer.pooled(4096).close()`` <= 2x;
* the cached pool pair <= 1.03x the same pair without its capture check
  (``MemoryPool.allocate`` compiled again from its source with the
  ``if CAPTURING:`` test left out: what asking "may a capture be under way?"
  costs an allocation that is not captured).

Each target row ends in OK, MISS or BLOCKED: BLOCKED is a miss while the
ablation row "+ promises" (the promised work alone) is itself above the bound;
the "+ promises + path" row beside it shows what the one release path adds,
which is memkit's own cost and never blocks.
Competitors that are not installed are reported as "n/a". On the simulator
the run is always --quick and the numbers are the simulator's.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from typing import Any

from harness import (
    Loop,
    ablation_target,
    backend,
    cached_floor,
    check,
    floor_ledger,
    measure,
    paired_ratio,
    paired_target,
    pinned_floor,
    promised_pinned_floor,
    promised_pool_floor,
    uncached_floor,
    verdict,
)
from rmm_rows import (
    device_buffer_pairs,
    device_resources,
    import_rmm,
    pinned_resources,
    resource_pairs,
    rmm_stream,
    versions,
)

MiB = 1 << 20
U64_MAX = (1 << 64) - 1


def without_capture_check(method: Any) -> Any:
    """``method`` (``MemoryPool.allocate``) compiled again without its ``if CAPTURING:`` test.

    The same source, its capture branch replaced by what runs when no capture
    may be under way: the ablation the capture check is measured against.
    """
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(method)))

    class Drop(ast.NodeTransformer):
        def visit_If(self, node: ast.If) -> Any:
            self.generic_visit(node)
            if isinstance(node.test, ast.Name) and node.test.id == "CAPTURING":
                return node.orelse
            return node

    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    fn.decorator_list = []
    new = ast.fix_missing_locations(Drop().visit(tree))
    assert "CAPTURING" not in ast.unparse(new), "no capture check found to leave out"
    space = dict(sys.modules[method.__module__].__dict__)
    exec(compile(new, inspect.getsourcefile(method) or "<allocate>", "exec"), space)
    return space[method.__name__]


def competitors(simulated: bool) -> dict[str, Any]:
    """Import CuPy, cuda.core and torch if they are installed (never on the simulator)."""
    mods: dict[str, Any] = {"cupy": None, "cuda.core": None, "torch": None}
    if simulated:
        return mods
    try:
        import cupy

        mods["cupy"] = cupy
    except Exception:  # an absent or broken install is "n/a"
        pass
    try:
        import cuda.core as core

        if not hasattr(core, "PinnedMemoryResource"):
            import cuda.core.experimental as core  # cuda.core 0.x
        mods["cuda.core"] = core
    except Exception:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            mods["torch"] = torch
    except Exception:
        pass
    return mods


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
    n_dev = 300 if quick else 10000
    n_pin = 300 if quick else 20000
    n_hostalloc = 5 if quick else 20
    mods = competitors(simulated)
    stride = 512
    cupy, core, torch = mods["cupy"], mods["cuda.core"], mods["torch"]

    s = cm.Stream()
    cus = cu.CUstream(s.handle)

    def sync() -> None:
        check(raw.cuCtxSynchronize())

    # -- 1 MiB device allocations ---------------------------------------------------------
    nbytes = MiB
    pool = cm.MemoryPool(0, release_threshold=U64_MAX)
    cupool = cu.CUmemoryPool(pool.handle)
    alloc, free = raw.cuMemAllocFromPoolAsync, raw.cuMemFreeAsync

    def raw_pairs(n: int, on_pool: Any) -> Loop:
        """A loop of raw cuMemAllocFromPoolAsync + cuMemFreeAsync pairs of n bytes."""

        def loop(k: int) -> None:
            for _ in range(k):
                err, ptr = alloc(n, on_pool, cus)
                if err:
                    raise RuntimeError(err)
                (err,) = free(ptr, cus)
                if err:
                    raise RuntimeError(err)

        return loop

    raw_device = raw_pairs(nbytes, cupool)

    allocate = pool.allocate

    def memkit_device(k: int) -> None:
        for _ in range(k):
            allocate(nbytes, stream=s).free()

    cached_pool = cm.MemoryPool(0, release_threshold=U64_MAX, cache=True)
    cached_allocate = cached_pool.allocate

    def memkit_cached(k: int) -> None:
        for _ in range(k):
            cached_allocate(nbytes, stream=s).free()

    unchecked_allocate = without_capture_check(cm.MemoryPool.allocate).__get__(cached_pool)

    def memkit_cached_unchecked(k: int) -> None:
        for _ in range(k):
            unchecked_allocate(nbytes, stream=s).free()

    # The least a pure-Python cache with this API can cost: a free list per (stream,
    # size rounded to 512 B) looked up in a dict, a slotted object holding its block and
    # its list, free() and __del__ give the block back; no checks, no ledger, one fixed
    # stream handle. Not memkit: the yardstick of the cached rows.
    floor_h = s.handle
    cached_floor_allocate, floor_lists = cached_floor(
        floor_h, stride, lambda r: alloc(r, cupool, cus))

    def floor_cached(k: int) -> None:
        for _ in range(k):
            cached_floor_allocate(nbytes, stream=s).free()

    # The same floor keeping memkit's exact ledger (a dict entry and counters per
    # allocation): the least the targets' "ledger on" can cost.
    ledger_floor_allocate, ledger_floor_lists = cached_floor(
        floor_h, stride, lambda r: alloc(r, cupool, cus), floor_ledger())

    def floor_cached_ledger(k: int) -> None:
        for _ in range(k):
            ledger_floor_allocate(nbytes, stream=s).free()

    default = cm.MemoryPool.default(0)
    old_threshold = default.release_threshold
    default.release_threshold = U64_MAX  # CuPy, cuda.core and torch use the default pool
    raw_default = raw_pairs(nbytes, cu.CUmemoryPool(default.handle))  # same driver cost?

    default_allocate = default.allocate

    def memkit_default(k: int) -> None:
        for _ in range(k):
            default_allocate(nbytes, stream=s).free()

    # The least any pure-Python wrapper with this API can cost: allocate() makes an
    # object that owns the memory, free() frees it, garbage collection frees it
    # otherwise; no argument checks, one slot, a fixed stream. Not memkit: a yardstick.
    floor_allocate = uncached_floor(alloc, free, cupool, cus)

    def floor_device(k: int) -> None:
        for _ in range(k):
            floor_allocate(nbytes, stream=s).free()

    ledger_floor_uncached = uncached_floor(alloc, free, cupool, cus, floor_ledger())

    def floor_device_ledger(k: int) -> None:
        for _ in range(k):
            ledger_floor_uncached(nbytes, stream=s).free()

    def pairs(make: Any) -> Loop:
        def loop(k: int) -> None:
            for _ in range(k):
                make(nbytes, stream=s).free()
        return loop

    # The ablation floors (harness.py): + what the buffer promises, + one release path.
    ablations: dict[str, Loop] = {}
    ablation_lists: list[list[Any]] = []
    for path in (False, True):
        tag = " + path" if path else ""
        for cached, key in ((False, "floor + promises"), (True, "floor cached + promises")):
            allocate_, lists_ = promised_pool_floor(alloc, free, cupool, floor_ledger(),
                                                    cm.Stream, cached, one_path=path)
            ablations[key + tag] = pairs(allocate_)
            ablation_lists.append(lists_)

    # The floor again, but a freed buffer keeps its __del__ (no class swap): what
    # PoolBuffer.free()'s swap to the plain PoolBuffer class buys, in this run.
    class KeptDelBuffer:
        __slots__ = ("ptr",)

        def free(self) -> None:
            p, self.ptr = self.ptr, None
            (err,) = free(p, cus)
            if err:
                raise RuntimeError(err)

        def __del__(self) -> None:
            if self.ptr is not None:
                free(self.ptr, cus)

    def kept_del_allocate(n: int, *, stream: object) -> KeptDelBuffer:
        err, ptr = alloc(n, cupool, cus)
        if err:
            raise RuntimeError(err)
        b = KeptDelBuffer()
        b.ptr = ptr
        return b

    def floor_kept_del(k: int) -> None:
        for _ in range(k):
            kept_del_allocate(nbytes, stream=s).free()

    cupy_device = cupy_pool_device = core_device = torch_device = cupy_caching = None
    if cupy is not None:
        from_external = getattr(cupy.cuda.Stream, "from_external", None)
        cupy_stream = (from_external(s) if from_external is not None
                       else cupy.cuda.ExternalStream(s.handle))
        malloc_async = cupy.cuda.malloc_async

        def cupy_device(k: int) -> None:
            with cupy_stream:
                for _ in range(k):
                    p = malloc_async(nbytes)
                    del p

        caching_malloc = cupy.cuda.MemoryPool().malloc  # CuPy's caching pool, direct

        def cupy_caching(k: int) -> None:
            with cupy_stream:
                for _ in range(k):
                    p = caching_malloc(nbytes)
                    del p

        try:  # CuPy on the very pool memkit and raw use
            cupy_pool_malloc = cupy.cuda.MemoryAsyncPool(pool_handles=pool.handle).malloc

            def cupy_pool_device(k: int) -> None:
                with cupy_stream:
                    for _ in range(k):
                        p = cupy_pool_malloc(nbytes)
                        del p
        except Exception as exc:
            print(f"CuPy MemoryAsyncPool(pool_handles=...): {exc!r}", file=sys.stderr)

    core_stream: Any = None
    if core is not None:
        try:
            dev = core.Device(0)
            dev.set_current()
            core_stream = dev.create_stream()
            dev_allocate = dev.allocate

            def core_device(k: int) -> None:
                for _ in range(k):
                    dev_allocate(nbytes, stream=core_stream).close(core_stream)
        except Exception as exc:  # an API this script does not know: "n/a"
            print(f"cuda.core {getattr(core, '__version__', '?')}: {exc!r}", file=sys.stderr)

    if torch is not None:
        t_empty, t_u8 = torch.empty, torch.uint8

        def torch_device(k: int) -> None:
            for _ in range(k):
                t = t_empty(nbytes, dtype=t_u8, device="cuda")
                del t

    device_times: dict[str, list[float]] = {}  # each sample's times: the paired ratios
    device = measure(
        {"raw": raw_device, "memkit": memkit_device, "cupy": cupy_device,
         "cuda.core": core_device, "torch": torch_device, "raw default": raw_default,
         "memkit default": memkit_default, "cupy pool": cupy_pool_device,
         "floor": floor_device, "floor kept del": floor_kept_del,
         "memkit cached": memkit_cached, "cupy MemoryPool": cupy_caching,
         "floor cached": floor_cached, "floor cached + ledger": floor_cached_ledger,
         "floor + ledger": floor_device_ledger, "memkit cached, no capture check":
         memkit_cached_unchecked, **ablations},
        dict.fromkeys(("raw", "memkit", "cupy", "cuda.core", "torch", "raw default",
                       "memkit default", "cupy pool", "floor", "floor kept del",
                       "memkit cached", "cupy MemoryPool", "floor cached",
                       "floor cached + ledger", "floor + ledger",
                       "memkit cached, no capture check", *ablations), n_dev),
        samples, sync, 6, device_times)
    for blocks in [*(b for lists in (floor_lists, ledger_floor_lists)
                     for sb in lists.values() for b in sb.values()),
                   *(b for lists in ablation_lists for b in lists)]:
        while blocks:
            check(free(blocks.pop(), cus))

    # -- 4 KiB pinned buffers ---------------------------------------------------------------
    small = 4096
    host_pool = cm.MemoryPool(location=cm.Location.host(), release_threshold=U64_MAX)
    host_cupool = cu.CUmemoryPool(host_pool.handle)

    def raw_hostalloc(k: int) -> None:
        for _ in range(k):
            p = check(raw.cuMemHostAlloc(small, 0))
            check(raw.cuMemFreeHost(p))

    raw_host_pool = raw_pairs(small, host_cupool)

    pooled = cm.HostBuffer.pooled

    def memkit_pooled(k: int) -> None:
        for _ in range(k):
            pooled(small).close()

    host_allocate = host_pool.allocate

    def memkit_pool_buffer(k: int) -> None:
        for _ in range(k):
            host_allocate(small, stream=s).free()

    # The least a pure-Python pinned cache with this API can cost: a free list of
    # pinned blocks, an object that holds one, close() puts it back, garbage
    # collection puts it back otherwise (class swap as in the device floor); no
    # checks, no numpy view, no ledger. Not memkit: a yardstick.
    floor_blocks = [check(raw.cuMemHostAlloc(small, 0)) for _ in range(4)]

    floor_pooled = pinned_floor(floor_blocks)

    def floor_pinned(k: int) -> None:
        for _ in range(k):
            floor_pooled(small).close()

    ledger_floor_pooled = pinned_floor(floor_blocks, floor_ledger())

    def closes(take: Any) -> Loop:
        def loop(k: int) -> None:
            for _ in range(k):
                take(small).close()
        return loop

    floor_pinned_ledger = closes(ledger_floor_pooled)
    pinned_ablations = {
        "floor + promises": closes(promised_pinned_floor(floor_blocks, floor_ledger())),
        "floor + promises + path": closes(promised_pinned_floor(floor_blocks, floor_ledger(),
                                                                one_path=True))}

    cupy_pinned = torch_pinned = core_pinned = None
    if cupy is not None:
        alloc_pinned = cupy.cuda.alloc_pinned_memory

        def cupy_pinned(k: int) -> None:
            for _ in range(k):
                p = alloc_pinned(small)
                del p

    if torch is not None:

        def torch_pinned(k: int) -> None:
            for _ in range(k):
                t = t_empty(small, dtype=t_u8, pin_memory=True)
                del t

    if core is not None and core_stream is not None:
        try:
            mr_allocate = core.PinnedMemoryResource().allocate

            def core_pinned(k: int) -> None:
                for _ in range(k):
                    mr_allocate(small, stream=core_stream).close(core_stream)
        except Exception as exc:
            print(f"cuda.core PinnedMemoryResource: {exc!r}", file=sys.stderr)

    pinned_times: dict[str, list[float]] = {}
    pinned = measure(
        {"raw": raw_hostalloc, "raw pool": raw_host_pool, "memkit": memkit_pooled,
         "memkit pool": memkit_pool_buffer, "cupy": cupy_pinned, "torch": torch_pinned,
         "cuda.core": core_pinned, "floor": floor_pinned, "floor + ledger": floor_pinned_ledger,
         **pinned_ablations},
        {"raw": n_hostalloc, "raw pool": n_pin, "memkit": n_pin, "memkit pool": n_pin,
         "cupy": n_pin, "torch": n_pin, "cuda.core": n_pin, "floor": n_pin,
         "floor + ledger": n_pin, **dict.fromkeys(pinned_ablations, n_pin)},
        samples, sync, 6, pinned_times)
    for blk in floor_blocks:
        check(raw.cuMemFreeHost(blk))

    # -- RMM, in the same run: its pool and async resources, 1 MiB and 4 KiB pinned ---------
    rmm, rmm_missing = import_rmm(simulated)
    rmm_dev: dict[str, float | None] = {}
    rmm_pin: dict[str, float | None] = {}
    if rmm is not None:
        rstream = rmm_stream(rmm, s)
        res = device_resources(rmm)
        pin_res = pinned_resources(rmm)
        rmm_cases: dict[str, Loop | None] = {"memkit cached": memkit_cached}
        for name, mr in res.items():
            rmm_cases[f"DeviceBuffer {name}"] = device_buffer_pairs(rmm, mr, rstream, nbytes)
            rmm_cases[f"mr {name}"] = resource_pairs(mr, rstream, nbytes)
        rmm_dev = measure(rmm_cases, dict.fromkeys(rmm_cases, n_dev), samples, sync, 7)
        pin_cases: dict[str, Loop | None] = {"memkit": memkit_pooled}
        for name, mr in pin_res.items():
            pin_cases[name] = resource_pairs(mr, rstream, small)
        # cudaHostAlloc per pair: as few pairs as the raw cuMemHostAlloc row
        rmm_pin = measure(pin_cases, {k: n_hostalloc if k == "pinned" else n_pin
                                      for k in pin_cases}, samples, sync, 7)
        del rmm_cases, pin_cases, res, pin_res, rstream  # RMM's pools go before the stream
        gc.collect()

    default.release_threshold = old_threshold
    sync()
    default.trim()
    host_pool.close()
    pool.close()
    cached_pool.close()
    s.close()

    # -- table -------------------------------------------------------------------------------
    rows: list[dict[str, Any]] = []

    def row(case: str, value: float | None, ref: float | None, target: str,
            ok: bool | None = None, floor: float | None = None) -> None:
        rows.append({"case": case, "us": None if value is None else value * 1e6,
                     "ratio": None if value is None or not ref else value / ref,
                     "target": target, "ok": ok,
                     "floor_us": None if floor is None else floor * 1e6})

    def ablation_rows(label: str, f: dict[str, float | None], times: dict[str, list[float]],
                      floor: str, key: str, bound: float, ref: float | None) -> None:
        """The ablation rows of a target: its floor with the promises, then the path too."""
        for name, what in ((key, "+ promises"), (key + " + path", "+ promises + path")):
            row(f"   {label} floor + ledger {what} (not memkit)", f[name], ref,
                ablation_target(times, name, floor, bound))

    d = device
    mk, mc, fl = d["memkit"], d["memkit cached"], d["floor cached"]
    fll, ufl = d["floor cached + ledger"], d["floor + ledger"]
    row("1 MiB: raw cuMemAllocFromPoolAsync + cuMemFreeAsync", d["raw"], d["raw"],
        "reference")
    row("1 MiB: MemoryPool(cache=True).allocate(stream=s).free()", mc, d["raw"],
        *paired_target(device_times, "memkit cached", "floor cached + ledger", 1.5,
                       "floor cached + promises"), floor=fll)
    row("   cached floor + exact ledger (not memkit)", fll, d["raw"], "its floor")
    nc = d["memkit cached, no capture check"]
    checked = paired_ratio(device_times, "memkit cached", "memkit cached, no capture check")
    row("1 MiB: cached pool pair, capture check", mc, nc,
        "<= 1.03x the same pair without the check"
        + ("" if checked is None else f" ({checked:.3f}x, paired)"),
        None if checked is None else checked <= 1.03)
    ablation_rows("cached", d, device_times, "floor cached + ledger", "floor cached + promises",
                  1.5, d["raw"])
    row("1 MiB: MemoryPool.allocate(stream=s).free() (uncached)", mk, d["raw"],
        *paired_target(device_times, "memkit", "floor + ledger", 1.5, "floor + promises"),
        floor=ufl)
    row("   floor + exact ledger (not memkit)", ufl, d["raw"], "its floor")
    ablation_rows("uncached", d, device_times, "floor + ledger", "floor + promises", 1.5,
                  d["raw"])
    row("1 MiB: CuPy MemoryPool().malloc (caching, direct)", d["cupy MemoryPool"], d["raw"],
        "info")
    row("1 MiB: CuPy malloc_async", d["cupy"], d["raw"], "info")
    row("1 MiB: cuda.core Device.allocate + Buffer.close", d["cuda.core"], d["raw"], "info")
    row("1 MiB: torch.empty(device='cuda')", d["torch"], d["raw"], "info")
    row("1 MiB: raw pair on the device's default pool", d["raw default"], d["raw"], "info")
    row("1 MiB: MemoryPool.default(0).allocate(stream=s).free()", d["memkit default"],
        d["raw"], "info")
    row("1 MiB: CuPy MemoryAsyncPool(pool_handles=pool).malloc", d["cupy pool"], d["raw"],
        "info")
    row("1 MiB: pure-Python cached floor (free list; not memkit)", fl, d["raw"], "info")
    row("1 MiB: pure-Python floor (1 slot, no checks; not memkit)", d["floor"], d["raw"],
        "info")
    row("1 MiB: the floor keeping __del__ after free (no class swap)", d["floor kept del"],
        d["raw"], "info")
    p = pinned
    pfl = p["floor + ledger"]
    row("4 KiB pinned: raw cuMemHostAlloc + cuMemFreeHost (other small pinned blocks alive)",
        p["raw"], p["raw"], "reference")
    row("4 KiB pinned: HostBuffer.pooled(4096).close()", p["memkit"], p["raw"],
        *paired_target(pinned_times, "memkit", "floor + ledger", 2.0, "floor + promises"),
        floor=pfl)
    row("   pinned floor + exact ledger (not memkit)", pfl, p["raw"], "its floor")
    ablation_rows("pinned", p, pinned_times, "floor + ledger", "floor + promises", 2.0,
                  p["raw"])
    row("4 KiB pinned: raw host-pool cuMemAllocFromPoolAsync pair", p["raw pool"], p["raw"],
        "info")
    row("4 KiB pinned: host MemoryPool.allocate().free()", p["memkit pool"], p["raw"], "info")
    row("4 KiB pinned: CuPy alloc_pinned_memory", p["cupy"], p["raw"], "info")
    row("4 KiB pinned: torch.empty(pin_memory=True)", p["torch"], p["raw"], "info")
    row("4 KiB pinned: cuda.core PinnedMemoryResource", p["cuda.core"], p["raw"], "info")
    row("4 KiB pinned: pure-Python floor (free list; not memkit)", p["floor"], p["raw"], "info")

    # RMM's rows: each with memkit's pair of the same sample set beside it.
    rmm_device_rows = (
        ("1 MiB: RMM DeviceBuffer, PoolMemoryResource", "DeviceBuffer pool"),
        ("1 MiB: RMM DeviceBuffer, CudaAsyncMemoryResource", "DeviceBuffer async"),
        ("1 MiB: RMM PoolMemoryResource.allocate + deallocate", "mr pool"),
        ("1 MiB: RMM CudaAsyncMemoryResource.allocate + deallocate", "mr async"))
    rmm_pinned_rows = (
        ("4 KiB pinned: RMM PinnedHostMemoryResource.allocate + deallocate", "pinned"),
        ("4 KiB pinned: RMM PoolMemoryResource(PinnedHostMemoryResource)", "pinned pool"))
    for rows_, got, mine, what in ((rmm_device_rows, rmm_dev, "memkit cached",
                                    "MemoryPool(cache=True) pair"),
                                   (rmm_pinned_rows, rmm_pin, "memkit",
                                    "HostBuffer.pooled(4096) pair")):
        for case, key in rows_:
            v, m = got.get(key), got.get(mine)
            if rmm is None:
                row(case, None, None, rmm_missing)
            elif v is None or m is None:
                row(case, None, None, "not measured: this RMM has no such resource")
            else:
                row(case, v, d["raw"] if rows_ is rmm_device_rows else p["raw"],
                    f"{what} ahead of it (same samples: {m * 1e6:.3f} us, {v / m:.2f}x)",
                    ok=m <= v)

    note = " -- SIMULATED: numbers are the CPU simulator's, not a GPU's" if simulated else ""
    print(f"bench_pool on backend {backend_name} ({cm.Device(0).name}){note}")
    print(f"median of {samples} samples; time per alloc+free pair, loops of "
          f"{n_dev} (device) / {n_pin} (pinned) pairs, {n_hostalloc} for cuMemHostAlloc")
    print(f"{'case':62} {'us/pair':>10} {'vs raw':>9} {'floor us':>9}  target")
    for r in rows:
        value = "n/a" if r["us"] is None else f"{r['us']:10.3f}"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:8.3f}x"
        floor = "" if r["floor_us"] is None else f"{r['floor_us']:9.3f}"
        print(f"{r['case']:62} {value:>10} {ratio:>9} {floor:>9}  {r['target']}{verdict(r)}")
    print("note: the raw cuMemHostAlloc pair is cheap here because other small pinned "
          "allocations are alive (CuPy's and torch's pinned caches), so the driver does not "
          "unpin its chunk at each free; alone, a 4 KiB pair costs ~0.7 ms on the H100 "
          "(bench_pinned)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": backend_name, "simulated": simulated, "samples": samples,
                       "versions": {**{k: getattr(m, "__version__", "?")
                                       for k, m in mods.items() if m is not None},
                                    **versions(rmm)},
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
