"""Allocation floors (no bookkeeping, counters only, the exact ledger) against memkit and CuPy.

The CuPy allocator pair, cupy.empty + drop and the bench_frameworks workload under
memkit's adaptor, CuPy's pool, malloc_async and three cached floors (nothing; the
byte counters; the ledger's dict entry and counters), then the MemoryPool(cache=True)
pair against CuPy MemoryPool direct and the same floors. Run from the repository root
on a GPU with CuPy: python scripts/probes/ledger_floor_probe.py
"""

import gc
import os
import sys

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import cupy
from cuda.bindings import driver as cu
from harness import backend, cached_floor, cupy_cached_floor, floor_ledger, measure

import cuda_memkit as cm
from cuda_memkit import allocators

name, sim, raw = backend()
MiB = 1 << 20
s = cm.Stream()
cus = cu.CUstream(s.handle)
stream = cupy.cuda.ExternalStream(s.handle)
stream.use()
default = cm.MemoryPool.default(0)
default.release_threshold = (1 << 64) - 1
cupool = cu.CUmemoryPool(default.handle)
alloc_fn, free_fn = raw.cuMemAllocFromPoolAsync, raw.cuMemFreeAsync
unowned, pointer = cupy.cuda.memory.UnownedMemory, cupy.cuda.memory.MemoryPointer
get_stream = cupy.cuda.get_current_stream


class Counters:
    __slots__ = ("current", "peak", "total")

    def __init__(self):
        self.current = self.peak = self.total = 0


cnt = Counters()


def counters_floor():
    lists = {}
    custreams = {}

    class M(unowned):
        __slots__ = ("blocks", "d")

        def __del__(self):
            cnt.current -= self.size
            self.blocks.append(self.d)

    def allocator(size):
        st = get_stream()
        h = st.ptr
        r = (size + 511) & -512
        sb = lists.get(h)
        if sb is None:
            sb = lists[h] = {}
            custreams[h] = cu.CUstream(h)
        blocks = sb.get(r)
        if blocks is None:
            blocks = sb[r] = []
        if blocks:
            d = blocks.pop()
        else:
            _err, d = alloc_fn(r, cupool, custreams[h])
        m = M(int(d), size, st, 0)
        m.d = d
        m.blocks = blocks
        c = cnt.current = cnt.current + size
        if c > cnt.peak:
            cnt.peak = c
        cnt.total += 1
        return pointer(m, 0)

    def release():
        for h, sb in lists.items():
            for bl in sb.values():
                while bl:
                    free_fn(bl.pop(), custreams[h])

    return allocator, release


fa, fr = cupy_cached_floor(cupy, alloc_fn, free_fn, cupool)
la, lr = cupy_cached_floor(cupy, alloc_fn, free_fn, cupool, floor_ledger())
ca, cr = counters_floor()
variants = {
    "memkit": allocators.cupy_allocator(),
    "cupy pool": cupy.cuda.MemoryPool().malloc,
    "malloc_async": cupy.cuda.malloc_async,
    "floor": fa,
    "floor+counters": ca,
    "floor+ledger": la,
}
x = cupy.arange(1 << 16, dtype=cupy.float32)
calloc, set_allocator, empty, f32 = (
    cupy.cuda.alloc,
    cupy.cuda.set_allocator,
    cupy.empty,
    cupy.float32,
)


def pair(fn):
    def loop(k):
        set_allocator(fn)
        for _ in range(k):
            p = calloc(MiB)
            del p

    return loop


def emp(fn):
    def loop(k):
        set_allocator(fn)
        for _ in range(k):
            a = empty(MiB // 4, dtype=f32)
            del a

    return loop


def work(fn):
    def loop(k):
        set_allocator(fn)
        for _ in range(k):
            y = ((x * 2.0 + 1.0) * x - x / 3.0).sum()
            del y

    return loop


def sync():
    raw.cuCtxSynchronize()


for label, mk, n in (
    ("cupy.cuda.alloc pair", pair, 10000),
    ("cupy.empty", emp, 5000),
    ("workload", work, 1000),
):
    res = measure({k: mk(v) for k, v in variants.items()}, dict.fromkeys(variants, n), 15, sync, 5)
    print(f"== {label} (us; ratio to cupy pool; to malloc_async)")
    for k, v in res.items():
        print(
            f"  {k:16s} {v * 1e6:9.3f}  {v / res['cupy pool']:6.3f}x  "
            f"{v / res['malloc_async']:6.3f}x",
            flush=True,
        )
cupy.cuda.set_allocator(cupy.cuda.MemoryPool().malloc)


# the MemoryPool(cache=True) pair's floors (no CuPy in the loop)
class CFloor:
    __slots__ = ("blocks", "d", "n")

    def free(self):
        d, self.d = self.d, None
        cnt.current -= self.n
        self.blocks.append(d)

    def __del__(self):
        if self.d is not None:
            cnt.current -= self.n
            self.blocks.append(self.d)


clists = {}


def counters_alloc(n, *, stream=None):
    r = (n + 511) & -512
    sb = clists.get(1)
    if sb is None:
        sb = clists[1] = {}
    blocks = sb.get(r)
    if blocks is None:
        blocks = sb[r] = []
    b = CFloor()
    b.blocks = blocks
    b.n = n
    if blocks:
        b.d = blocks.pop()
    else:
        _err, b.d = alloc_fn(r, cupool, cus)
    c = cnt.current = cnt.current + n
    if c > cnt.peak:
        cnt.peak = c
    cnt.total += 1
    return b


pf, pfl = cached_floor(1, 512, lambda r: alloc_fn(r, cupool, cus))
pl, pll = cached_floor(1, 512, lambda r: alloc_fn(r, cupool, cus), floor_ledger())
cpool = cm.MemoryPool(0, release_threshold=(1 << 64) - 1, cache=True)
cmalloc = cupy.cuda.MemoryPool().malloc


def loop_of(fn):
    def loop(k):
        for _ in range(k):
            fn(MiB, stream=s).free()

    return loop


def cupy_direct(k):
    for _ in range(k):
        p = cmalloc(MiB)
        del p


cases = {
    "memkit cached": loop_of(cpool.allocate),
    "cupy MemoryPool direct": cupy_direct,
    "floor": loop_of(pf),
    "floor+counters": loop_of(counters_alloc),
    "floor+ledger": loop_of(pl),
}
res = measure(cases, dict.fromkeys(cases, 10000), 15, sync, 7)
print("== MemoryPool(cache=True) 1 MiB pair (us; ratio to CuPy MemoryPool direct)")
for k, v in res.items():
    print(f"  {k:24s} {v * 1e6:8.3f}  {v / res['cupy MemoryPool direct']:6.3f}x", flush=True)
gc.collect()
sync()
for r in (fr, lr, cr):
    r()
for lists in (clists, pfl, pll):
    for sb in lists.values():
        for bl in sb.values():
            while bl:
                free_fn(bl.pop(), cus)
sys.modules["cuda_memkit._pools._cache"].empty_all()
sync()
cpool.close()
cupy.cuda.Stream.null.use()
s.close()
