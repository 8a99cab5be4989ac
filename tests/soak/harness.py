"""Leak soak: allocate/free cycles of every kind of memory, with before/after accounting.

Each kind runs ``cycles`` allocate/free cycles, split between the main thread
(device 0's context current), a thread with no current context, a thread with
another device's primary context current (two devices or more) and a thread
with a context of its own (``cuCtxCreate``). Cycles release their memory in
rotation by ``close()``, a ``with`` block, dropping the last reference, and a
reference cycle left to the garbage collector (collected every
:data:`GC_EVERY` cycles).

Before and after each kind (after synchronizing, collecting and trimming the
pools) the harness records device free memory (``cuMemGetInfo``), the
simulator's exact ledger (allocation table, streams, events, feature tables,
bytes charged), the pools' statistics and the process RSS. A kind passes
when no device byte is lost and (on the simulator) the ledger is unchanged.

Run it as a script for the full soak (``scripts/gpu-check soak`` does)::

    python -m tests.soak.harness --cycles 100000 --budget 540 --json $OUT/soak.json

or through pytest (``tests/soak/test_soak.py``, marker ``soak``), where
``CUDA_MEMKIT_SOAK_CYCLES`` sets the cycles per kind (short by default).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

import cuda_memkit as cm
from cuda_memkit._core import _context, _driver

from .._nothing import ledger

KiB, MiB = 1 << 10, 1 << 20
GC_EVERY = 32
#: Most managed memory alive at once (including garbage waiting for a collection).
MANAGED_LIVE_LIMIT = 64 * MiB
#: Free device memory two reads may differ by with nothing allocated (the driver's
#: own bookkeeping; the leak check of the suite uses 4 MiB).
GPU_SLACK = 4 * MiB
#: The H100 keeps device pages of freed managed memory for a while (see tests/_leaks.py).
GPU_MANAGED_SLACK = 160 * MiB

RELEASES = ("close", "with", "drop", "cycle")


class _Node:
    """A reference cycle holding an object: only the garbage collector frees it."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.me = self


class Releaser:
    """Releases objects by the i-th rule and collects cycles every GC_EVERY cycles."""

    def __init__(self) -> None:
        self.pending = 0

    def release(self, i: int, obj: Any) -> None:
        how = RELEASES[i % len(RELEASES)]
        if how == "close":
            for o in obj if isinstance(obj, list) else [obj]:
                o.close()
        elif how == "cycle":
            _Node(obj)
            self.pending += 1
        # "drop": the caller's reference was the last one; "with" is done by the caller
        if (i + 1) % GC_EVERY == 0 and self.pending:
            gc.collect(1)
            self.pending = 0

    def finish(self) -> None:
        gc.collect()
        self.pending = 0


# -- the kinds ---------------------------------------------------------------------------


class Kind:
    """One kind of memory: ``cycle(i)`` allocates, uses and releases once."""

    name = ""
    managed = False

    def __init__(self, rel: Releaser) -> None:
        self.rel = rel

    def setup(self) -> None:  # per thread
        pass

    def teardown(self) -> None:  # per thread
        pass

    def cycle(self, i: int) -> None:
        raise NotImplementedError


def _with_or_release(k: Kind, i: int, make: Callable[[], Any],
                     use: Callable[[Any], None]) -> None:
    if RELEASES[i % len(RELEASES)] == "with":
        with make() as obj:
            use(obj)
        k.rel.release(i, None)
        return
    obj = make()
    use(obj)
    k.rel.release(i, obj)


class HostBufferKind(Kind):
    name = "HostBuffer"
    sizes = (4 * KiB, 64 * KiB, MiB)

    def setup(self) -> None:
        # One small pinned buffer stays alive: on the H100 a cuMemHostAlloc pair costs
        # ~0.7 ms when it is the only pinned allocation and ~3 us otherwise.
        self.anchor = cm.HostBuffer.empty(4 * KiB)

    def teardown(self) -> None:
        self.anchor.close()

    def cycle(self, i: int) -> None:
        n = self.sizes[i % 3]
        _with_or_release(self, i, lambda: cm.HostBuffer.empty(n),
                         lambda h: h.array.__setitem__(0, i & 0xFF))


class PooledHostBufferKind(Kind):
    name = "HostBuffer.pooled"
    sizes = (64, 4 * KiB, 64 * KiB, MiB)

    def cycle(self, i: int) -> None:
        n = self.sizes[(i // 4) % 4]
        _with_or_release(self, i, lambda: cm.HostBuffer.pooled(n),
                         lambda h: h.array.__setitem__(0, i & 0xFF))


class RegisteredHostKind(Kind):
    name = "register_host"

    def setup(self) -> None:
        # A ring of arrays: one left registered in a reference cycle is collected (and
        # unregistered) by the time the ring comes back to it.
        self.arrays = [np.zeros(64 * KiB if k % 2 else MiB, np.uint8) for k in range(GC_EVERY)]

    def cycle(self, i: int) -> None:
        a = self.arrays[i % GC_EVERY]
        _with_or_release(self, i, lambda: cm.register_host(a), lambda r: None)


class DeviceBufferKind(Kind):
    name = "DeviceBuffer"
    sizes = (KiB, 64 * KiB, MiB, 16 * MiB)

    def cycle(self, i: int) -> None:
        n = self.sizes[(i // 4) % 4]
        _with_or_release(self, i, lambda: cm.DeviceBuffer.empty(n), lambda d: None)


class ManagedBufferKind(Kind):
    name = "ManagedBuffer"
    managed = True
    sizes = (4 * KiB, 64 * KiB, MiB)

    def setup(self) -> None:
        self.garbage_bytes = 0
        self.peak = 0

    def cycle(self, i: int) -> None:
        n = self.sizes[(i // 4) % 3]
        live = self.garbage_bytes + n
        self.peak = max(self.peak, live)
        if live > MANAGED_LIVE_LIMIT:  # never more than 64 MiB of managed memory alive
            raise AssertionError(f"{live} bytes of managed memory would be alive")
        _with_or_release(self, i, lambda: cm.ManagedBuffer.empty(n),
                         lambda m: m.array.__setitem__(0, 1))
        if RELEASES[i % len(RELEASES)] == "cycle":
            self.garbage_bytes += n
        if self.rel.pending == 0:
            self.garbage_bytes = 0


class VmmKind(Kind):
    name = "VMM map/unmap"

    def setup(self) -> None:
        self.g = cm.granularity(0)
        self.dev = _current_device()
        self.vr = cm.AddressRange.reserve(4 * self.g)

    def teardown(self) -> None:
        self.vr.close()

    def cycle(self, i: int) -> None:
        g, how = self.g, RELEASES[i % len(RELEASES)]
        if how == "with":
            with cm.PhysicalMemory.create(g, device=self.dev) as pm, \
                    self.vr.map(pm, offset=(i // 4 % 4) * g) as m:
                m.set_access(self.dev)
            self.rel.release(i, None)
        elif how == "cycle":  # range, memory and mapping die together in the collector
            vr = cm.AddressRange.reserve(g)
            m = vr.map(cm.PhysicalMemory.create(g, device=self.dev))
            m.set_access(self.dev)
            self.rel.release(i, [m, vr])
        else:
            pm = cm.PhysicalMemory.create(g, device=self.dev)
            m = self.vr.map(pm, offset=(i // 4 % 4) * g)
            m.set_access(self.dev)
            self.rel.release(i, [m, pm] if how == "close" else None)


class GrowableKind(Kind):
    name = "GrowableBuffer"

    def setup(self) -> None:
        self.g = cm.granularity(0)
        self.dev = _current_device()
        self.buf: cm.GrowableBuffer | None = None

    def teardown(self) -> None:
        if self.buf is not None:
            self.buf.close()

    def cycle(self, i: int) -> None:
        g = self.g
        if self.buf is None:
            self.buf = cm.GrowableBuffer(4 * g, device=self.dev, chunk=g)
        self.buf.resize((i % 4 + 1) * g)  # grow ...
        self.buf.resize((i % 3) * g // 2)  # ... and shrink
        if i % 16 == 15:  # a new buffer now and then, released by the rotation
            buf, self.buf = self.buf, None
            if RELEASES[(i // 16) % 4] == "with":
                with buf:
                    pass
                self.rel.release(i // 16, None)
            else:
                self.rel.release(i // 16, buf)
            del buf


class StreamKind(Kind):
    """A kind whose cycles run on a stream of the thread's current context, if it has one."""

    def setup(self) -> None:
        # a stream of the current context (kept current) where there is one; the
        # legacy stream otherwise
        self.stream = cm.Stream() if _has_context() else None

    def teardown(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()
            self.stream.close()


class PoolBufferKind(StreamKind):
    name = "PoolBuffer"
    sizes = (512, 64 * KiB, MiB, 8 * MiB)

    def __init__(self, rel: Releaser, pool: cm.MemoryPool) -> None:
        super().__init__(rel)
        self.pool = pool

    def cycle(self, i: int) -> None:
        n = self.sizes[(i // 4) % 4]
        how = RELEASES[i % len(RELEASES)]
        # Every third allocation names its stream by handle: its blocks are found by handle.
        stream = self.stream.handle if self.stream is not None and i % 3 == 2 else self.stream
        buf = self.pool.allocate(n, stream=stream)
        if how == "close" and i % 8 < 4:
            buf.free()  # free() and close() alternate for the explicit release
            self.rel.release(i + 1, None)  # (the "with" slot: nothing left to do)
            return
        if how == "with":
            with buf:
                pass
            self.rel.release(i, None)
            return
        self.rel.release(i, buf)


class CachedPoolBufferKind(PoolBufferKind):
    """PoolBuffers of a ``MemoryPool(cache=True)``: blocks through the block cache."""

    name = "PoolBuffer.cached"


class _CupyStandIn(types.ModuleType):
    """The parts of CuPy the adaptors read: memory classes, the current device and stream.

    The device is the thread's current one; the stream, the kind's. The memory is
    real (the adaptors allocate it from the driver), whatever CuPy is installed.
    """

    def __init__(self, handle: int) -> None:
        from .. import _fake_frameworks as fake

        super().__init__("cupy")
        current = types.SimpleNamespace(ptr=handle)
        self.cuda = types.SimpleNamespace(
            memory=types.SimpleNamespace(UnownedMemory=fake.UnownedMemory,
                                         MemoryPointer=fake.MemoryPointer),
            pinned_memory=types.SimpleNamespace(PinnedMemoryPointer=fake.PinnedMemoryPointer),
            runtime=types.SimpleNamespace(getDevice=_current_device),
            get_current_stream=lambda device=-1: current)


class CupyAdaptorKind(StreamKind):
    """The CuPy adaptors (device memory through the default pools' caches, pinned memory).

    CuPy drops its memory objects: every cycle drops them, or leaves them in a
    reference cycle for the collector.
    """

    name = "CuPy.adaptor"
    sizes = (512, 64 * KiB, MiB, 8 * MiB)

    def setup(self) -> None:
        from cuda_memkit import allocators

        super().setup()
        saved = sys.modules.get("cupy")
        sys.modules["cupy"] = _CupyStandIn(self.stream.handle if self.stream else 0)
        try:
            self.device = allocators.cupy_allocator()
            self.pinned = allocators.cupy_pinned_allocator()
        finally:
            if saved is None:
                del sys.modules["cupy"]
            else:
                sys.modules["cupy"] = saved

    def cycle(self, i: int) -> None:
        n = self.sizes[(i // 4) % 4]
        objs = [self.device(n), self.pinned(min(n, MiB))]
        if RELEASES[i % len(RELEASES)] == "cycle":
            self.rel.release(i, objs)


# The slowest kind (cuMemHostRegister pins every page) runs last: each kind gets an
# equal share of what is left of the budget, so it inherits what the others left.
KIND_NAMES = ("HostBuffer", "HostBuffer.pooled", "DeviceBuffer", "ManagedBuffer",
              "VMM map/unmap", "GrowableBuffer", "PoolBuffer", "PoolBuffer.cached",
              "CuPy.adaptor", "register_host")


def _has_context() -> bool:
    return bool(int(_driver.call("cuCtxGetCurrent")))


def _current_device() -> int:
    return int(_driver.call("cuCtxGetDevice")) if _has_context() else 0


# -- where the cycles run ------------------------------------------------------------------


@contextlib.contextmanager
def _main() -> Iterator[None]:
    _context.ensure_context(0)
    yield


@contextlib.contextmanager
def _no_context() -> Iterator[None]:
    yield  # a fresh thread has none


@contextlib.contextmanager
def _other_device() -> Iterator[None]:
    _context.ensure_context(1)
    yield


@contextlib.contextmanager
def _created_context() -> Iterator[None]:
    from cuda.bindings import driver as cu

    ctx = _driver.call("cuCtxCreate", None, 0, cu.CUdevice(0))
    try:
        yield
    finally:
        _driver.call("cuCtxDestroy", ctx)


def variants() -> dict[str, Callable[[], Any]]:
    """Where cycles run: name -> context manager entered on that (fresh) thread."""
    out: dict[str, Callable[[], Any]] = {"main thread": _main, "no-context thread": _no_context}
    if cm.device_count() > 1:
        out["other-device thread"] = _other_device
    out["created-context thread"] = _created_context
    return out


# -- accounting -----------------------------------------------------------------------------


def rss() -> int:
    """Resident set size of this process in bytes (Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _device_free() -> dict[int, int]:
    out = {}
    prev = _driver.call("cuCtxGetCurrent")
    for d in range(cm.device_count()):
        _context.ensure_context(d)
        _driver.call("cuCtxSynchronize")
        out[d] = int(_driver.call("cuMemGetInfo")[0])
    _driver.call("cuCtxSetCurrent", prev)
    return out


def _settle(pool: cm.MemoryPool | None) -> None:
    gc.collect()
    _driver.call("cuCtxSynchronize")
    cm.MemoryPool.default_pinned().trim()
    for d in range(cm.device_count()):  # the process's caches of the default pools too
        cm.MemoryPool.default(d).trim()
    if pool is not None:
        pool.trim()


@dataclass
class Result:
    kind: str
    cycles_requested: int
    cycles_run: int = 0
    seconds: float = 0.0
    cycles_per_s: float = 0.0
    per_variant: dict[str, int] = field(default_factory=dict)
    device_bytes_lost: int = 0
    ledger_changes: list[str] = field(default_factory=list)
    pool_stats_before: dict[str, int] = field(default_factory=dict)
    pool_stats_after: dict[str, int] = field(default_factory=dict)
    rss_before: int = 0
    rss_after: int = 0
    capped: bool = False
    errors: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def ok(self) -> bool:
        return (not self.errors and not self.ledger_changes and self.device_bytes_lost == 0
                and self.pool_stats_after.get("used_current", 0) == 0)


def _pool_stats(pool: cm.MemoryPool | None) -> dict[str, int]:
    if pool is None:
        return dict(cm.MemoryPool.default_pinned().stats()._asdict())
    return dict(pool.stats()._asdict())


def run_kind(name: str, cycles: int, time_cap: float | None = None) -> Result:
    """Run ``cycles`` cycles of kind ``name`` (stopping at ``time_cap`` seconds)."""
    res = Result(name, cycles)
    pool = (cm.MemoryPool(0) if name == "PoolBuffer" else
            cm.MemoryPool(0, cache=True) if name == "PoolBuffer.cached" else None)
    where = variants()
    share = [cycles // len(where) + (1 if k < cycles % len(where) else 0)
             for k in range(len(where))]
    _settle(pool)
    before_ledger, before_free = ledger(), _device_free()
    res.pool_stats_before = _pool_stats(pool)
    res.rss_before = rss()
    start = time.monotonic()
    t0 = time.perf_counter()
    for k, ((label, enter), n) in enumerate(zip(where.items(), share, strict=True)):
        # each setting gets its share of the time cap, so a slow kind still runs in all
        deadline = None if time_cap is None else start + time_cap * (k + 1) / len(where)
        done = [0]
        errors: list[BaseException] = []

        def body(enter: Callable[[], Any] = enter, n: int = n, deadline: float | None = deadline,
                 done: list[int] = done, errors: list[BaseException] = errors) -> None:
            rel = Releaser()
            kind = (_KINDS[name](rel, pool) if pool is not None  # type: ignore[call-arg]
                    else _KINDS[name](rel))
            try:
                with enter():
                    kind.setup()
                    try:
                        for i in range(n):
                            if deadline is not None and i % 64 == 0 \
                                    and time.monotonic() > deadline:
                                break
                            kind.cycle(i)
                            done[0] = i + 1
                        rel.finish()
                    finally:
                        kind.teardown()
                        rel.finish()
            except BaseException as exc:  # reported in the result
                errors.append(exc)

        t = threading.Thread(target=body, name=f"soak {name} {label}")
        t.start()
        t.join()
        res.per_variant[label] = done[0]
        res.cycles_run += done[0]
        res.errors.extend(f"{label}: {e!r}" for e in errors)
    res.seconds = time.perf_counter() - t0
    res.cycles_per_s = res.cycles_run / res.seconds if res.seconds else 0.0
    res.capped = res.cycles_run < cycles and not res.errors
    _settle(pool)
    after_ledger, after_free = ledger(), _device_free()
    res.pool_stats_after = _pool_stats(pool)
    res.rss_after = rss()
    if pool is not None:
        pool.close()
    res.ledger_changes = before_ledger.differences(after_ledger) if _driver.backend_name() == \
        "sim" else []
    slack = 0 if _driver.backend_name() == "sim" else (
        GPU_MANAGED_SLACK if _KINDS[name].managed else GPU_SLACK)
    lost = sum(max(0, before_free[d] - after_free.get(d, before_free[d])) for d in before_free)
    res.device_bytes_lost = lost if lost > slack else 0
    if lost and lost <= slack:
        res.note = f"free memory {lost} bytes lower, within the driver's {slack >> 20} MiB slack"
    if name == "HostBuffer":
        res.note = (res.note + "; " if res.note else "") + "one 4 KiB pinned buffer kept alive"
    return res


_KINDS: dict[str, type[Kind]] = {k.name: k for k in (
    HostBufferKind, PooledHostBufferKind, DeviceBufferKind, ManagedBufferKind, VmmKind,
    GrowableKind, PoolBufferKind, CachedPoolBufferKind, CupyAdaptorKind, RegisteredHostKind)}


# -- the script -----------------------------------------------------------------------------


def table(results: list[Result]) -> str:
    head = (f"{'kind':<18} {'cycles':>9} {'of':>9} {'seconds':>8} {'cycles/s':>10} "
            f"{'dev bytes lost':>14} {'RSS delta MiB':>13}  status")
    lines = [head, "-" * len(head)]
    for r in results:
        status = "ok" if r.ok and not r.capped else ("capped" if r.ok else "FAIL")
        lines.append(
            f"{r.kind:<18} {r.cycles_run:>9} {r.cycles_requested:>9} {r.seconds:>8.1f} "
            f"{r.cycles_per_s:>10.0f} {r.device_bytes_lost:>14} "
            f"{(r.rss_after - r.rss_before) / MiB:>13.1f}  {status}"
            + (f"  ({'; '.join(r.errors + r.ledger_changes)[:200]})"
               if r.errors or r.ledger_changes else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=100_000, help="cycles per kind")
    ap.add_argument("--kinds", default=",".join(KIND_NAMES))
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for all kinds; each gets an equal share of what is left")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in _KINDS]
    if unknown:
        ap.error(f"unknown kinds {unknown}; choose from {list(KIND_NAMES)}")
    cm.MemoryPool.default_pinned()
    cm.HostBuffer.pooled(1).close()
    start = time.monotonic()
    results = []
    for j, k in enumerate(kinds):
        cap = None
        if args.budget is not None:
            cap = max((args.budget - (time.monotonic() - start)) / (len(kinds) - j), 1.0)
        results.append(run_kind(k, args.cycles, cap))
        print(f"{k}: {results[-1].cycles_run} cycles, {results[-1].cycles_per_s:.0f}/s",
              file=sys.stderr, flush=True)
    print(table(results))
    lost = sum(r.device_bytes_lost for r in results)
    total = sum(r.cycles_run for r in results)
    print(f"\n{total} cycles run in {time.monotonic() - start:.0f} s; device bytes lost: {lost}; "
          f"kinds failing: {sum(not r.ok for r in results)}; "
          f"capped by the time budget: {sum(r.capped for r in results)}")
    if args.json:
        meta = {"backend": _driver.backend_name(), "devices": cm.device_count(),
                "device_name": cm.Device(0).name, "python": platform.python_version(),
                "cycles_per_kind": args.cycles, "budget_s": args.budget, "gc_every": GC_EVERY,
                "variants": list(variants())}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": [dict(asdict(r), ok=r.ok) for r in results]},
                      f, indent=1)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    os.environ.setdefault("CUDA_MEMKIT_BACKEND", "cuda")
    sys.exit(main())
