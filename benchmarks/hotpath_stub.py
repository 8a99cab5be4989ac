"""Hot paths of the allocators against their pure-Python floors, on the simulator (no GPU).

Run from the repository root: ``CUDA_MEMKIT_BACKEND=sim python benchmarks/hotpath_stub.py``;
``--against DIR`` also times the cuda_memkit of another checkout ``DIR`` (for
example the main branch's worktree), alternating the two in subprocesses, and
prints both columns (the medians of the runs' medians).

The cache-hit paths make no driver call, so the simulator measures exactly the
Python work memkit does on them; the uncached pair and its floor call the same
no-op driver functions, so their difference is memkit's own work. The floors
are those of ``bench_pool.py`` and ``bench_frameworks.py`` (same classes, same
free lists), each also with the exact ledger ("+ ledger", the row the targets
are measured against), run interleaved with memkit in this process; the
CuPy rows use a stand-in for CuPy's ``UnownedMemory`` / ``MemoryPointer``
(Python classes: the same for memkit and its floors). The table prints
medians (us per pair) and the ratio memkit / its floor with the ledger. GPU
numbers come from bench_pool and bench_frameworks; this table is the
reproducible stand-in for working on the Python side. Each case's time is the
CPU time of this thread, the least over its samples (short ones, interleaved):
on a shared development machine, the sample least disturbed by other processes.
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
import types
from collections.abc import Callable
from typing import Any

os.environ.setdefault("CUDA_MEMKIT_BACKEND", "sim")
sys.path.insert(0, os.getcwd())

import cuda_memkit as cm  # the checkout in the working directory (see --against)

# isort: split
from harness import (  # after cuda_memkit: it adds its own root
    cached_floor,
    cupy_cached_floor,
    floor_ledger,
    pinned_floor,
    promised_cupy_floor,
    promised_pinned_floor,
    promised_pool_floor,
    uncached_floor,
)

N = 2000
SAMPLES = 41
RUNS = 5  # alternating runs of each checkout with --against
MiB = 1 << 20

#: Each memkit case and the floor (with the exact ledger) it is compared with.
REFS = {
    "uncached MemoryPool.allocate().free()": "floor + ledger (1 slot)",
    "cached MemoryPool.allocate(stream=Stream).free()": "cached floor + ledger",
    "cached MemoryPool.allocate(stream=int).free()": "cached floor + ledger",
    "cached MemoryPool.allocate() + del": "cached floor + ledger",
    "HostBuffer.pooled(4096).close()": "pinned floor + ledger",
    "HostBuffer.pooled(4096) + del": "pinned floor + ledger",
    "CuPy adaptor alloc(1 MiB) + drop": "CuPy cached floor + ledger",
    "CuPy pinned adaptor alloc(4096) + drop": "CuPy pinned floor + ledger",
    "floor + ledger + promises": "floor + ledger (1 slot)",
    "  + one release path  ": "floor + ledger (1 slot)",
    "CuPy floor + ledger + promises": "CuPy cached floor + ledger",
    "CuPy floor + ledger + promises + path": "CuPy cached floor + ledger",
    "CuPy pinned floor + ledger + promises": "CuPy pinned floor + ledger",
    "CuPy pinned floor + ledger + promises + path": "CuPy pinned floor + ledger",
    "cached floor + ledger + promises": "cached floor + ledger",
    "  + one release path": "cached floor + ledger",
    "pinned floor + ledger + promises": "pinned floor + ledger",
    "  + one release path ": "pinned floor + ledger",
}


class _Stream:
    """CuPy's current stream, as the adaptor reads it (``ptr``)."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class UnownedMemory:
    """The stand-in of CuPy's ``UnownedMemory`` (its C ``__init__`` as Python)."""

    __slots__ = ("__weakref__", "_owner", "device_id", "ptr", "size")

    def __init__(self, ptr: int, size: int, owner: object, device_id: int = -1) -> None:
        self.ptr, self.size, self._owner, self.device_id = ptr, size, owner, device_id


class MemoryPointer:
    """The stand-in of CuPy's ``MemoryPointer`` and ``PinnedMemoryPointer``."""

    __slots__ = ("mem", "ptr")

    def __init__(self, mem: Any, offset: int) -> None:
        self.mem = mem
        self.ptr = mem.ptr + offset


def fake_cupy(stream: _Stream) -> Any:
    """A module with the parts of CuPy the adaptors and their floors read."""
    cuda = types.SimpleNamespace(
        memory=types.SimpleNamespace(UnownedMemory=UnownedMemory, MemoryPointer=MemoryPointer),
        pinned_memory=types.SimpleNamespace(PinnedMemoryPointer=MemoryPointer),
        runtime=types.SimpleNamespace(getDevice=lambda: 0),
        get_current_stream=lambda device=-1: stream)
    return types.SimpleNamespace(cuda=cuda, __name__="cupy")


def _patch_driver(alloc: Any, free: Any) -> Callable[[], None]:
    """Make the uncached pool path call ``alloc`` / ``free`` (this checkout's or an older one's
    module globals); returns the undo."""
    from cuda_memkit._pools import _cache, _pool, _pool_buffer

    saved = []
    for mod, name, fn in ((_cache, "ALLOC", alloc), (_cache, "FREE", free),
                          (_pool, "_ALLOC", alloc), (_pool_buffer, "FREE", free)):
        if hasattr(mod, name):
            saved.append((mod, name, getattr(mod, name)))
            setattr(mod, name, fn)

    def undo() -> None:
        for mod, name, fn in saved:
            setattr(mod, name, fn)

    return undo


def measure() -> dict[str, float]:
    """Median microseconds per pair of every case, memkit and floors interleaved."""
    s = cm.Stream()
    from cuda_memkit._core._stream import custream

    cus = custream(s.handle)
    # The uncached pair and its floor call no-op driver functions (an address from a
    # counter, success): the simulator's own bookkeeping would otherwise be most of the
    # time measured.
    addresses = itertools.count(1 << 40, 1 << 20)

    def alloc(nbytes: int, cupool: Any, cus: Any) -> tuple[int, int]:
        return 0, next(addresses)

    def free(dptr: Any, cus: Any) -> tuple[int]:
        return (0,)

    from cuda_memkit._pools._pool import allocation_handle

    pool = cm.MemoryPool(0)
    cupool = allocation_handle(pool)
    cached_pool = cm.MemoryPool(0, cache=True)
    undo = _patch_driver(alloc, free)
    allocate, cached_allocate = pool.allocate, cached_pool.allocate
    h = s.handle

    def memkit_cached(k: int) -> None:
        for _ in range(k):
            cached_allocate(MiB, stream=s).free()

    def memkit_cached_int(k: int) -> None:
        for _ in range(k):
            cached_allocate(MiB, stream=h).free()

    def memkit_cached_del(k: int) -> None:
        for _ in range(k):
            b = cached_allocate(MiB, stream=s)
            del b

    def memkit_uncached(k: int) -> None:
        for _ in range(k):
            allocate(MiB, stream=s).free()

    def pairs(make: Callable[..., Any]) -> Callable[[int], None]:
        def loop(k: int) -> None:
            for _ in range(k):
                make(MiB, stream=s).free()
        return loop

    floor_cached = pairs(cached_floor(h, 512, lambda r: alloc(r, cupool, cus))[0])
    floor_cached_ledger = pairs(cached_floor(h, 512, lambda r: alloc(r, cupool, cus),
                                             floor_ledger())[0])
    floor_device = pairs(uncached_floor(alloc, free, cupool, cus))
    floor_device_ledger = pairs(uncached_floor(alloc, free, cupool, cus, floor_ledger()))
    floor_device_promised = pairs(promised_pool_floor(alloc, free, cupool, floor_ledger(),
                                                      type(s), False)[0])
    floor_device_path = pairs(promised_pool_floor(alloc, free, cupool, floor_ledger(),
                                                  type(s), False, one_path=True)[0])

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

    def closes(take: Callable[[int], Any]) -> Callable[[int], None]:
        def loop(k: int) -> None:
            for _ in range(k):
                take(4096).close()
        return loop

    floor_pinned = closes(pinned_floor([object() for _ in range(4)]))
    floor_pinned_ledger = closes(pinned_floor([object() for _ in range(4)], floor_ledger()))
    floor_pinned_promised = closes(promised_pinned_floor([object() for _ in range(4)],
                                                         floor_ledger()))
    floor_pinned_path = closes(promised_pinned_floor([object() for _ in range(4)],
                                                     floor_ledger(), one_path=True))
    floor_cached_promised = pairs(promised_pool_floor(alloc, free, cupool, floor_ledger(),
                                                      type(s), True)[0])
    floor_cached_path = pairs(promised_pool_floor(alloc, free, cupool, floor_ledger(),
                                                  type(s), True, one_path=True)[0])

    # The CuPy adaptors on the stand-in, against bench_frameworks' floors on it.
    from cuda_memkit import allocators

    cupy = fake_cupy(_Stream(h))
    sys.modules["cupy"] = cupy
    try:
        device_adaptor = allocators.cupy_allocator()
        pinned_adaptor = allocators.cupy_pinned_allocator()
    finally:
        del sys.modules["cupy"]
    default_cupool = allocation_handle(cm.MemoryPool.default(0))
    cupy_floor, release_floor = cupy_cached_floor(cupy, alloc, free, default_cupool)
    cupy_floor_ledger, release_floor_ledger = cupy_cached_floor(cupy, alloc, free,
                                                                default_cupool, floor_ledger())
    cupy_floor_promised = promised_cupy_floor(cupy, alloc, default_cupool, floor_ledger())[0]
    cupy_floor_path = promised_cupy_floor(cupy, alloc, default_cupool, floor_ledger(),
                                          one_path=True)[0]
    pinned_promised_take = promised_pinned_floor([(1 << 40) + (k << 12) for k in range(4)],
                                                 floor_ledger())
    pinned_path_take = promised_pinned_floor([(1 << 40) + (k << 12) for k in range(4)],
                                             floor_ledger(), one_path=True)

    def drops(fn: Callable[[int], Any], n: int) -> Callable[[int], None]:
        def loop(k: int) -> None:
            for _ in range(k):
                p = fn(n)
                del p
        return loop

    pinned_lists: dict[int, list[Any]] = {4096: [(1 << 40) + (k << 12) for k in range(4)]}
    ledger = floor_ledger()

    class PinnedFloor:  # bench_frameworks' pinned floor with the ledger
        __slots__ = ("blocks", "ptr", "size")

        def __del__(self) -> None:
            p = self.ptr
            ledger.current -= ledger.live.pop(p)
            self.blocks.append(p)

    def pinned_floor_ledger(size: int) -> Any:
        blocks = pinned_lists[size]
        b = PinnedFloor()
        b.blocks = blocks
        b.size = size
        p = b.ptr = blocks.pop()
        ledger.live[p] = size
        c = ledger.current = ledger.current + size
        if c > ledger.peak:
            ledger.peak = c
        ledger.total += 1
        return MemoryPointer(b, 0)

    cases: dict[str, Callable[[int], None]] = {
        "raw pair (no-op driver)": raw,
        "uncached MemoryPool.allocate().free()": memkit_uncached,
        "floor (1 slot, no checks)": floor_device,
        "floor + ledger (1 slot)": floor_device_ledger,
        "floor + ledger + promises": floor_device_promised,
        "  + one release path  ": floor_device_path,
        "cached MemoryPool.allocate(stream=Stream).free()": memkit_cached,
        "cached MemoryPool.allocate(stream=int).free()": memkit_cached_int,
        "cached MemoryPool.allocate() + del": memkit_cached_del,
        "cached floor (free list)": floor_cached,
        "cached floor + ledger": floor_cached_ledger,
        "cached floor + ledger + promises": floor_cached_promised,
        "  + one release path": floor_cached_path,
        "HostBuffer.pooled(4096).close()": memkit_pooled,
        "HostBuffer.pooled(4096) + del": memkit_pooled_del,
        "pinned floor (free list)": floor_pinned,
        "pinned floor + ledger": floor_pinned_ledger,
        "pinned floor + ledger + promises": floor_pinned_promised,
        "  + one release path ": floor_pinned_path,
        "CuPy adaptor alloc(1 MiB) + drop": drops(device_adaptor, MiB),
        "CuPy cached floor + ledger": drops(cupy_floor_ledger, MiB),
        "CuPy cached floor": drops(cupy_floor, MiB),
        "CuPy floor + ledger + promises": drops(cupy_floor_promised, MiB),
        "CuPy floor + ledger + promises + path": drops(cupy_floor_path, MiB),
        "CuPy pinned adaptor alloc(4096) + drop": drops(pinned_adaptor, 4096),
        "CuPy pinned floor + ledger": drops(pinned_floor_ledger, 4096),
        "CuPy pinned floor + ledger + promises": drops(
            lambda n: MemoryPointer(pinned_promised_take(n), 0), 4096),
        "CuPy pinned floor + ledger + promises + path": drops(
            lambda n: MemoryPointer(pinned_path_take(n), 0), 4096),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for fn in cases.values():
        fn(200)  # warm: caches filled, code paths resolved
    gc.disable()
    for _ in range(SAMPLES):
        for name, fn in cases.items():
            t = time.thread_time()
            fn(N)
            times[name].append((time.thread_time() - t) / N * 1e6)
    gc.enable()
    # The least disturbed sample: on a shared machine the others carry other processes' time.
    med = {k: min(v) for k, v in times.items()}
    release_floor()
    release_floor_ledger()
    cached_pool.close()  # its blocks, and the adaptors' (left to the exit), have fake
    pool.close()  # addresses: given back to the no-op free
    s.close()
    undo()
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
          f"us of CPU per pair, least of {SAMPLES} samples of {N} pairs, interleaved"
          + (f"; 'against': {args[1]}, 'this': {os.getcwd()}, {RUNS} alternating runs each"
             if len(columns) > 1 else ""))
    head = "".join(f"{name + ' us':>12}{'/floor+L':>9}" for name in med)
    print(f"{'case':<50}{head}")
    for case in med["this"]:
        cells = ""
        for m in med.values():
            ref = REFS.get(case)
            cells += f"{m[case]:>12.3f}" + (f"{m[case] / m[ref]:>8.2f}x" if ref else " " * 9)
        print(f"{case:<50}{cells}")


if __name__ == "__main__":
    main()
