"""What the benchmark scripts share: the backend, raw driver results, interleaved timing.

Imported by the ``bench_*.py`` scripts (run as ``python benchmarks/bench_x.py``,
so this folder is on ``sys.path``); it puts the repository root on the path
too, for ``import cuda_memkit`` from a checkout.

Results: every script's ``--json PATH`` writes one object with ``backend``
(``"cuda"`` or ``"sim"``), ``simulated`` and ``rows``, a list of dicts, one per
printed row: ``case`` (``"group: case"`` puts rows in one table of the report;
a case starting with spaces continues the row above), the measured values under
keys naming their unit (``us`` with ``unit`` such as ``"us/pair"``, ``gbps``,
``ms``, ...), and where they apply ``ratio`` with ``vs`` (what it is against),
``target`` with ``ok`` (``None`` for information rows) and ``note``. Optional
top-level ``title`` and ``about`` name a new script's section of the report.
A row that compares libraries also carries ``compare`` (the question, the same
for each of its rows), ``library`` (``"cuda_memkit"``, ``"CuPy"``,
``"cuda.core"``, ``"PyTorch"``, ``"RMM"`` or ``"raw driver"``) and ``label``
(what was called, in Markdown). ``scripts/bench_report.py`` turns the results of
a GPU run into ``docs/benchmarks.md``, its plots and the why page's numbers.
"""

from __future__ import annotations

import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

#: A timed loop: ``fn(n)`` runs ``n`` iterations (pairs, copies, ...).
Loop = Callable[[int], None]


def backend() -> tuple[str, bool, Any]:
    """Make device 0 current; return ``(backend name, simulated, raw driver module)``.

    The raw module is ``cuda.bindings.driver`` on a GPU and the simulator's
    twin (the same call forms) on the simulator.
    """
    import cuda_memkit as cm
    from cuda_memkit._core import _driver

    cm.Device(0).set_current()
    name = _driver.backend_name()
    if name == "sim":
        from cuda_memkit.sim import driver as raw
    else:
        from cuda.bindings import driver as raw
    return name, name == "sim", raw


def check(res: Any) -> Any:
    """Payload of a raw ``(CUresult, ...)`` tuple; raise on failure."""
    if int(res[0]):
        raise RuntimeError(f"driver call failed: {res[0]!r}")
    return res[1] if len(res) == 2 else res[1:] if len(res) > 2 else None


def measure(cases: dict[str, Loop | None], counts: dict[str, int], samples: int,
            sync: Callable[[], None], seed: int,
            times_out: dict[str, list[float]] | None = None) -> dict[str, float | None]:
    """Median seconds per iteration of each case (``None`` for a case given as ``None``).

    Each sample runs every case once, ``counts[case]`` iterations, in an order
    shuffled per sample (``seed`` fixed), so that drift hits the cases alike
    and no case always follows the same one; garbage a case left behind is
    collected before the next one's timing starts. A warm-up round first
    (pools grow, caches fill). ``times_out``, if given, receives each case's
    seconds per iteration, sample by sample (for :func:`paired_ratio`).
    """
    live = {k: fn for k, fn in cases.items() if fn is not None}
    for key, fn in live.items():
        fn(max(counts[key] // 10, 2))
        sync()
    times: dict[str, list[float]] = {k: [] for k in live}
    order = list(live)
    rng = random.Random(seed)
    for _ in range(samples):
        rng.shuffle(order)
        for key in order:
            fn, n = live[key], counts[key]
            gc.collect()
            t0 = time.perf_counter()
            fn(n)
            sync()
            times[key].append((time.perf_counter() - t0) / n)
    if times_out is not None:
        times_out.update(times)
    return {k: (statistics.median(times[k]) if k in times else None) for k in cases}


def paired_ratio(times: dict[str, list[float]], case: str, against: str) -> float | None:
    """Median over the samples of ``case``'s time / ``against``'s time in the same sample.

    Both ran in every sample of :func:`measure`, so a drift of the machine between
    samples (clocks, other tenants) cancels in each ratio; a ratio of two medians
    keeps it when the two medians come from different samples.
    """
    a, b = times.get(case), times.get(against)
    if not a or not b or len(a) != len(b):
        return None
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def floor_target(value: float | None, floor: float | None, bound: float,
                 promised: float | None = None, path: float | None = None
                 ) -> tuple[str, bool | None]:
    """A target row's column: ``value`` <= ``bound`` x ``floor`` (its floor with the ledger).

    Returns ``(text, ok)``. ``promised`` is the floor with the promised work only
    ("+ promises", the same run), ``path`` the same with the one release path on
    top ("+ promises + path"). A miss whose promised work alone is above the bound
    says BLOCKED in the text (the bound is below what the promises cost); any other
    miss is memkit's own, and its text says what the promises and the path cost.
    """
    if value is None or not floor:
        return f"<= {bound:g}x its floor + ledger (n/a)", None
    ratio = value / floor
    text = f"<= {bound:g}x its floor + ledger ({ratio:.2f}x)"
    if ratio > bound and promised is not None:
        text += (f"; BLOCKED: the promised work alone is {promised / floor:.2f}x"
                 if promised / floor > bound else
                 f"; the promised work alone is {promised / floor:.2f}x")
        if path is not None:
            text += f", with the one release path {path / floor:.2f}x"
    return text, ratio <= bound


def paired_target(times: dict[str, list[float]], case: str, floor: str, bound: float,
                  promised: str | None = None) -> tuple[str, bool | None]:
    """:func:`floor_target` on ratios paired within each sample (:func:`paired_ratio`).

    ``case``, ``floor`` and the ablation floors are keys of ``times`` (from
    :func:`measure`'s ``times_out``); the path's floor is ``promised + " + path"``.
    """
    def vs(key: str | None) -> float | None:
        return None if key is None else paired_ratio(times, key, floor)

    return floor_target(vs(case), 1.0, bound, vs(promised),
                        vs(None if promised is None else promised + " + path"))


def ablation_target(times: dict[str, list[float]], case: str, floor: str, bound: float) -> str:
    """An ablation row's target column: its paired ratio to ``floor`` against ``bound``."""
    r = paired_ratio(times, case, floor)
    if r is None:
        return "ablation"
    return f"ablation: {r:.2f}x, {'within' if r <= bound else 'ABOVE'} the {bound:g}x bound"


def verdict(row: dict[str, Any]) -> str:
    """The verdict printed after a row's target column: OK, MISS, BLOCKED or nothing.

    BLOCKED is a miss whose target text says the promised work alone is above the
    bound (:func:`floor_target`); the row's ``ok`` is false either way.
    """
    if row.get("ok") is None:
        return ""
    if row["ok"]:
        return "  -> OK"
    return "  -> BLOCKED" if "BLOCKED" in str(row.get("target")) else "  -> MISS"


# -- the pure-Python floors: the least an allocator with memkit's API can cost ---------------


def uncached_floor(alloc: Any, free: Any, cupool: Any, cus: Any, ledger: Any = None
                   ) -> Callable[..., Any]:
    """The uncached floor: ``allocate(n, stream=...)`` makes a one-slot object owning
    ``alloc(n, cupool, cus)``; ``free()`` frees it on ``cus``, collection frees it otherwise
    (``free()`` swaps the class so that no finalizer is left). No checks, a fixed stream;
    no ledger unless ``ledger`` (from :func:`floor_ledger`) is given.
    Not memkit: the yardstick of the uncached rows. The driver calls are made directly,
    as an allocator would, so the floor pays nothing a wrapper would not.
    """

    class FloorBuffer:
        __slots__ = ("ptr",)

        def free(self) -> None:
            p = self.ptr
            if ledger is not None:
                ledger.current -= ledger.live.pop(p)
            (err,) = free(p, cus)
            if err:
                raise RuntimeError(err)
            self.__class__ = FloorBuffer  # freed: no finalizer left

    class LiveFloorBuffer(FloorBuffer):
        __slots__ = ()

        def __del__(self) -> None:
            p = self.ptr
            if ledger is not None:
                ledger.current -= ledger.live.pop(p)
            free(p, cus)

    def allocate(n: int, *, stream: object = None) -> FloorBuffer:
        err, ptr = alloc(n, cupool, cus)
        if err:
            raise RuntimeError(err)
        b = LiveFloorBuffer()
        b.ptr = ptr
        if ledger is not None:  # the ledger's work, written out as the least it costs
            ledger.live[ptr] = n
            c = ledger.current = ledger.current + n
            if c > ledger.peak:
                ledger.peak = c
            ledger.total += 1
        return b

    return allocate


class CachedFloor:
    """A block lent by :func:`cached_floor`: ``free()`` and collection give it back."""

    __slots__ = ("blocks", "d")

    def free(self) -> None:
        d, self.d = self.d, None
        self.blocks.append(d)

    def __del__(self) -> None:
        if self.d is not None:
            self.blocks.append(self.d)


class LedgerCachedFloor:
    """:class:`CachedFloor` keeping the exact ledger: a dict entry per live block, counters."""

    __slots__ = ("blocks", "d")
    ledger: Any

    def free(self) -> None:
        d, self.d = self.d, None
        acct = self.ledger
        acct.current -= acct.live.pop(d)
        self.blocks.append(d)

    def __del__(self) -> None:
        d = self.d
        if d is not None:
            acct = self.ledger
            acct.current -= acct.live.pop(d)
            self.blocks.append(d)


def floor_ledger() -> Any:
    """An account like memkit's (``live`` dict, ``current``/``peak``/``total``), unregistered.

    The "floor + ledger" rows add to a floor only what exact statistics cost per
    allocation as memkit keeps them: a dict entry per live block and three counters.
    """
    from cuda_memkit._core._resource import Account

    return Account("pool", None)


def cached_floor(handle: int, stride: int, alloc: Callable[[int], tuple[Any, Any]],
                 ledger: Any = None
                 ) -> tuple[Callable[..., Any], dict[int, dict[int, list[Any]]]]:
    """A cache floor: a free list per (stream, size rounded to ``stride``), one fixed stream.

    ``alloc(rounded)`` returns ``(err, block)`` on a miss. Returns the allocate function
    (``allocate(n, stream=...)``; the stream is ignored) and the free lists, for cleanup.
    Not memkit: the yardstick of the cached rows (no checks; no ledger unless ``ledger``,
    an account from :func:`floor_ledger`, is given).
    """
    lists: dict[int, dict[int, list[Any]]] = {}
    cls: Any = CachedFloor
    if ledger is not None:
        cls = type("LedgerFloor", (LedgerCachedFloor,), {"__slots__": (), "ledger": ledger})

    def allocate(n: int, *, stream: object = None) -> Any:
        r = (n + stride - 1) & -stride
        sb = lists.get(handle)
        if sb is None:
            sb = lists[handle] = {}
        blocks = sb.get(r)
        if blocks is None:
            blocks = sb[r] = []
        b = cls()
        b.blocks = blocks
        if blocks:
            d = b.d = blocks.pop()
        else:
            err, d = alloc(r)
            if err:
                raise RuntimeError(err)
            b.d = d
        if ledger is not None:  # the ledger's work, written out as the least it costs
            ledger.live[d] = n
            c = ledger.current = ledger.current + n
            if c > ledger.peak:
                ledger.peak = c
            ledger.total += 1
        return b

    return allocate, lists


def cupy_cached_floor(cupy: Any, alloc: Any, free: Any, cupool: Any, ledger: Any = None
                      ) -> tuple[Callable[[int], Any], Callable[[], None]]:
    """The pure-Python cached floor of a CuPy allocator (the issue's probe).

    Free lists keyed by the current stream and the size rounded to 512 B; the memory
    object gives its block back in ``__del__``; one fixed device, no checks, no ledger
    (unless ``ledger``, an account from :func:`floor_ledger`, is given).
    Not memkit: the yardstick of the cached adaptor rows. Returns the allocator
    (``cupy.cuda.set_allocator``) and a call that frees every cached block on its stream.
    """
    from cuda.bindings import driver as cu

    unowned, pointer = cupy.cuda.memory.UnownedMemory, cupy.cuda.memory.MemoryPointer
    get_stream = cupy.cuda.get_current_stream
    lists: dict[int, dict[int, list[Any]]] = {}
    custreams: dict[int, Any] = {}

    class FloorMemory(unowned):  # type: ignore[misc, valid-type]
        __slots__ = ("blocks", "d")

        def __del__(self) -> None:
            self.blocks.append(self.d)

    class LedgerFloorMemory(unowned):  # type: ignore[misc, valid-type]
        __slots__ = ("blocks", "d")

        def __del__(self) -> None:
            d = self.d
            ledger.current -= ledger.live.pop(d)
            self.blocks.append(d)

    cls = FloorMemory if ledger is None else LedgerFloorMemory

    def allocator(size: int) -> Any:
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
            err, d = alloc(r, cupool, custreams[h])
            if err:
                raise RuntimeError(err)
        m = cls(int(d), size, st, 0)
        m.d = d
        m.blocks = blocks
        if ledger is not None:  # the ledger's work, written out as the least it costs
            ledger.live[d] = size
            c = ledger.current = ledger.current + size
            if c > ledger.peak:
                ledger.peak = c
            ledger.total += 1
        return pointer(m, 0)

    def release() -> None:
        for h, sb in lists.items():
            for blocks in sb.values():
                while blocks:
                    free(blocks.pop(), custreams[h])

    return allocator, release


def pinned_floor(blocks: list[Any], ledger: Any = None) -> Callable[[int], Any]:
    """A pinned-cache floor over ``blocks``: an object holding one, ``close()`` or collection
    puts it back (``close()`` swaps the class so that ``__del__`` does not run twice).
    ``ledger`` (from :func:`floor_ledger`): also keep the exact ledger."""

    class FloorHost:
        __slots__ = ("ptr",)

        def close(self) -> None:
            p = self.ptr
            if ledger is not None:
                ledger.current -= ledger.live.pop(p)
            blocks.append(p)
            self.__class__ = FloorHost

    class LiveFloorHost(FloorHost):
        __slots__ = ()

        def __del__(self) -> None:
            p = self.ptr
            if ledger is not None:
                ledger.current -= ledger.live.pop(p)
            blocks.append(p)

    def take(n: int) -> FloorHost:
        b = LiveFloorHost()
        p = b.ptr = blocks.pop()
        if ledger is not None:  # the ledger's work, written out as the least it costs
            ledger.live[p] = n
            c = ledger.current = ledger.current + n
            if c > ledger.peak:
                ledger.peak = c
            ledger.total += 1
        return b

    return take


# -- ablation floors: the floors with the ledger and what a buffer promises -----------------
#
# What a memkit buffer promises beyond the ledger, written out in the caller's frame, with
# no call a floor would not make (no helper frames: those are structure, not promises):
# the argument checks, the buffer's fields (what its properties answer), free()/close()
# refusing or deferring while exports or copies live, the stream tests of a free on the
# driver (closed, or destroyed by its collection), the cache's byte counters with its limit
# and peak, and a finalizer that gives back the block of a buffer collected unfreed (no
# class swap: a freed buffer's __del__ runs and returns). These rows ("+ promises") are the
# ones a target is BLOCKED on. With ``one_path`` ("+ promises + path"), the block is
# instead taken and given back as memkit does it, through a bin's take() and give() that
# call the ledger's add() and remove() (an Account's): the cost of the one release path,
# shown beside them. Not memkit: the ablation rows of the promises and of the structure.


class _FloorBin:
    """A free list of one rounded size and a cache's counters; take() / give() as memkit's."""

    __slots__ = ("blocks", "cache", "ledger", "size")

    def __init__(self, size: int, cache: Any, ledger: Any, blocks: list[Any]) -> None:
        self.blocks, self.cache, self.ledger, self.size = blocks, cache, ledger, size

    def take(self, nbytes: int, cus: Any = None) -> Any:
        block = self.blocks.pop()
        self.cache.cached -= self.size
        self.ledger.add(block, nbytes, cus)
        return block

    def give(self, block: Any, sref: Any = None) -> None:
        self.ledger.remove(block)  # (the floor never gives a block back twice)
        cache = self.cache
        c = cache.cached + self.size
        if c <= cache.limit:
            self.blocks.append(block)
            cache.cached = c
            if c > cache.peak:
                cache.peak = c


class _FloorCache:
    __slots__ = ("cached", "limit", "peak")

    def __init__(self) -> None:
        self.cached = self.peak = 0
        self.limit = 1 << 30


def promised_pool_floor(alloc: Any, free: Any, cupool: Any, ledger: Any, stream_type: type,
                        cached: bool, one_path: bool = False
                        ) -> tuple[Callable[..., Any], list[list[Any]]]:
    """A pool floor with the exact ledger and a PoolBuffer's promises (see above).

    ``allocate(n, stream=s)`` takes ``s`` of ``stream_type`` (its ``_custream``: ``None``
    once closed, refused; ``_handle``, its lists); ``alloc(n, cupool, cus)`` and
    ``free(d, cus)`` are the driver's. ``cached``: blocks go back to free lists per stream
    and rounded size, with a cache's counters; else to the driver, on the buffer's stream
    read under its ``release_lock`` (a close on another thread waits) and not once its
    finalizer ran (``_finalizer.alive``: collected with the buffer). Returns the allocator
    and its free lists (for the cleanup).
    """
    cache = _FloorCache()
    lanes: dict[int, dict[int, Any]] = {}
    free_lists: list[list[Any]] = []

    class DriverBin:  # the one release path of a pool without a cache
        __slots__ = ()

        def take(self, nbytes: int, cus: Any) -> Any:
            err, d = alloc(nbytes, cupool, cus)
            if err:
                raise RuntimeError(err)
            ledger.add(d, nbytes, cus)
            return d

        def give(self, d: Any, sref: Any) -> None:
            ledger.remove(d)
            with sref.release_lock:
                cus = sref._custream
                fin = sref._finalizer
                if cus is None or (fin is not None and not fin.alive):
                    raise AssertionError("the floor's stream stays open")
                (err,) = free(d, cus)
            if err:
                raise RuntimeError(err)

    driver_bin = DriverBin()

    class Buffer:
        __slots__ = ("__weakref__", "_bin", "_deferred", "_dptr", "_nbytes", "_pool", "_sref",
                     "_views")

        def free(self, stream: object = None) -> None:
            d = self._dptr
            if d is None:
                return
            views = self._views
            if views is not None and views() is not None:
                raise BufferError("exports are alive")
            sref = self._sref
            if stream is not None or sref._custream is None:
                raise ValueError("the floor frees on its allocation stream only")
            self._dptr = None
            b = self._bin
            if one_path:
                b.give(d, sref)
                return
            ledger.current -= ledger.live.pop(d)
            if cached:
                c = cache.cached + b.size
                if c <= cache.limit:
                    b.blocks.append(d)
                    cache.cached = c
                    if c > cache.peak:
                        cache.peak = c
                return
            with sref.release_lock:
                cus = sref._custream
                fin = sref._finalizer
                if cus is None or (fin is not None and not fin.alive):
                    raise AssertionError("the floor's stream stays open")
                (err,) = free(d, cus)
            if err:
                raise RuntimeError(err)

        def __del__(self) -> None:  # (not timed: the pairs free their buffers)
            d = self._dptr
            if d is None:
                d = self._deferred
                if d is None:
                    return
            self._bin.give(d, self._sref)

    def allocate(n: int, *, stream: Any) -> Buffer:
        if type(n) is not int or n <= 0:
            raise TypeError("n")
        if type(stream) is not stream_type or stream._custream is None:
            raise TypeError("the floor takes an open stream of its type only")
        cus = stream._custream
        b: Any = driver_bin
        if cached:
            r = (n + 511) & -512 if n <= 1048576 else n
            lane = lanes.get(stream._handle)
            b = lane.get(r) if lane is not None else None
            if b is None:
                b = lanes.setdefault(stream._handle, {}).setdefault(
                    r, _FloorBin(r, cache, ledger, []))
                free_lists.append(b.blocks)
            if not b.blocks:
                err, block = alloc(r, cupool, cus)
                if err:
                    raise RuntimeError(err)
                b.blocks.append(block)
                cache.cached += r
        if one_path:
            d = b.take(n, cus)
        else:
            if cached:
                d = b.blocks.pop()
                cache.cached -= b.size
            else:
                err, d = alloc(n, cupool, cus)
                if err:
                    raise RuntimeError(err)
            ledger.live[d] = n
            c = ledger.current = ledger.current + n
            if c > ledger.peak:
                ledger.peak = c
            ledger.total += 1
        buf = object.__new__(Buffer)
        buf._dptr, buf._nbytes, buf._sref = d, n, stream
        buf._pool, buf._bin = cupool, b
        buf._views = buf._deferred = None
        return buf

    return allocate, free_lists


def promised_pinned_floor(blocks: list[Any], ledger: Any, one_path: bool = False
                          ) -> Callable[..., Any]:
    """The pinned floor with the exact ledger and a pooled HostBuffer's promises (see above).

    ``take(shape, dtype="uint8", *, pool=None)`` lends a block of ``blocks`` (its size
    rounded to 512 B, its bin looked up); ``close()`` defers while exports or copies in
    flight (a list, empty here) hold it, else gives the block back itself; collection
    gives back the block of a buffer never closed.
    """
    cache = _FloorCache()
    bins: dict[int, _FloorBin] = {}
    in_flight: list[Any] = []
    open_, closed = "open", "closed"

    class Host:
        __slots__ = ("__weakref__", "_block", "_nbytes", "_ptr", "_state", "_views")

        @property
        def ptr(self) -> int:  # what CuPy's PinnedMemoryPointer reads, as a HostBuffer's
            if self._state is not open_:
                raise ValueError("closed")
            return int(self._ptr)

        @property
        def size(self) -> int:
            return int(self._nbytes)

        def close(self) -> None:
            if self._state is closed:
                return
            self._state = closed
            views = self._views
            if views is not None and views() is not None:
                return
            if in_flight and self in in_flight:
                return
            b = self._block  # set while open: only a deferred close or collection clears it
            self._block = None
            p = self._ptr
            if one_path:
                b.give(p)
                return
            ledger.current -= ledger.live.pop(p)
            c = cache.cached + b.size
            if c <= cache.limit:
                b.blocks.append(p)
                cache.cached = c
                if c > cache.peak:
                    cache.peak = c

        def __del__(self) -> None:  # a closed buffer's finalizer finds nothing to give back
            b = self._block
            if b is not None:
                self._block = None
                b.give(self._ptr)

    def take(shape: Any, dtype: Any = "uint8", *, pool: object = None) -> Host:
        if not (type(shape) is int and 0 < shape <= 1048576 and pool is None
                and (dtype == "uint8")):
            raise TypeError("the floor takes small byte buffers only")
        r = (shape + 511) & -512
        b = bins.get(r)
        if b is None:
            b = bins[r] = _FloorBin(r, cache, ledger, blocks)
        if one_path:
            p = b.take(shape)
        else:
            p = b.blocks.pop()
            cache.cached -= r
            ledger.live[p] = shape
            c = ledger.current = ledger.current + shape
            if c > ledger.peak:
                ledger.peak = c
            ledger.total += 1
        h = object.__new__(Host)
        h._ptr, h._nbytes, h._views = p, shape, None
        h._block, h._state = b, open_
        return h

    return take


def promised_cupy_floor(cupy: Any, alloc: Any, cupool: Any, ledger: Any, one_path: bool = False
                        ) -> tuple[Callable[[int], Any], list[tuple[list[Any], Any]]]:
    """The CuPy cached floor with the exact ledger and the adaptor's promises (see above).

    Beyond :func:`cupy_cached_floor`: the current device asked per allocation (the
    pools of every device), the size checked, the memory holding its bin, block and
    stream, a finalizer that does nothing at interpreter exit. ``one_path``: the block
    is taken from and given back to a bin (take / give calling the ledger's add /
    remove). Returns the allocator and its (free list, CUstream) pairs.
    """
    from cuda.bindings import driver as cu

    unowned, pointer = cupy.cuda.memory.UnownedMemory, cupy.cuda.memory.MemoryPointer
    get_stream, get_device = cupy.cuda.get_current_stream, cupy.cuda.runtime.getDevice
    cache = _FloorCache()
    lanes: dict[int, dict[int, _FloorBin]] = {}
    custreams: dict[int, Any] = {}
    lists: list[tuple[list[Any], Any]] = []

    class Memory(unowned):  # type: ignore[misc, valid-type]
        __slots__ = ("_bin", "_d", "_pool", "_sref")

        def __del__(self, _exiting: list[bool] = [False]) -> None:  # noqa: B006
            if _exiting[0]:
                return
            b, d = self._bin, self._d
            if one_path:
                b.give(d)
                return
            ledger.current -= ledger.live.pop(d)
            c = cache.cached + b.size
            if c <= cache.limit:
                b.blocks.append(d)
                cache.cached = c
                if c > cache.peak:
                    cache.peak = c

    def allocator(size: int) -> Any:
        dev = get_device()
        if type(size) is not int or size <= 0:
            raise TypeError("the floor takes sizes > 0 only")
        st = get_stream(dev)
        h = st.ptr
        cus = custreams.get(h)
        if cus is None:
            cus = custreams[h] = cu.CUstream(h)
        r = (size + 511) & -512
        lane = lanes.get(h)
        b = lane.get(r) if lane is not None else None
        if b is None:
            b = lanes.setdefault(h, {}).setdefault(r, _FloorBin(r, cache, ledger, []))
            lists.append((b.blocks, cus))
        blocks = b.blocks
        if not blocks:
            err, d = alloc(r, cupool, cus)
            if err:
                raise RuntimeError(err)
            blocks.append(d)
            cache.cached += r
        if one_path:
            d = b.take(size)
        else:
            d = blocks.pop()
            cache.cached -= r
            ledger.live[d] = size
            c = ledger.current = ledger.current + size
            if c > ledger.peak:
                ledger.peak = c
            ledger.total += 1
        m = Memory(int(d), size, st, dev)
        m._bin, m._d = b, d
        m._pool, m._sref = None, cus
        return pointer(m, 0)

    return allocator, lists
