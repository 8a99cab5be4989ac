"""Real-data transfers: scattered blocks, pageable arrays, array-built prefetch plans.

    python benchmarks/bench_transfers.py [--json PATH] [--quick] [--only SECTIONS]

(SECTIONS: a comma-separated subset of scattered,blocks,pageable,prefetch.)

One table, every row measured in this run (interleaved samples, medians; each
sample is the wall-clock time of issuing the work and waiting for it), with
an OK/MISS verdict on each target row:

* Scattered pinned -> device blocks for the driver batch (4096 x 64 KiB,
  1024 x 256 KiB; block i of a pinned buffer goes to slot perm[i] of a
  device buffer): one contiguous ``cuMemcpyHtoDAsync`` of the same bytes
  (the PCIe limit), a raw loop of ``cuMemcpyHtoDAsync``, one raw
  ``cuMemcpyBatchAsync`` with its pointer lists built beforehand, the same
  prebuilt lists in the calls copy_batch splits them into, and
  ``cuda_memkit.copy_batch`` from the offset arrays (its checks, merging and
  pointer lists inside the sample); for information ``cuda.core``'s
  ``copy_batch`` (prebuilt Buffer lists).
* Small blocks, the kernel path (``small_blocks.py``): 65536 x 4 KiB and
  16384 x 16 KiB pinned <-> device scattered on both sides, 65536 x 4 KiB
  device -> device; contiguous, raw loop, copy_batch with each method,
  cuda.core, CuPy contiguous + scatter kernel.
* Both directions at once (4096 x 64 KiB each way): two raw batch calls on
  one stream, on two streams, and a ``CopyBatch`` (which forks its
  device-to-host half onto a second stream).
* A 1 GiB pageable numpy array to the device and back, in five interleaved
  rounds: the driver's pageable path (``cuMemcpyHtoD`` / ``cuMemcpyDtoH``),
  register + copy + unregister, ``cuda_memkit.copy`` (staged), torch
  ``from_numpy(a).pin_memory().to('cuda')``, ``copy_`` through a pinned
  tensor and ``copy_`` into ``from_numpy(dst)``, CuPy ``asarray`` / ``get(out=)``.
* A 4096-entry ``PrefetchPlan`` of 512 MiB of managed memory built from
  arrays (``add_ranges``) and executed, against the whole-range prefetch and
  4096 ``add()`` calls; each sample first sends the pages back to the host.

Targets: 4096 x 64 KiB copy_batch >= 2.0x the raw loop and
>= 0.95x the prebuilt raw single batch call; 1024 x 256 KiB copy_batch
>= 0.85x contiguous; copy_batch of 65536 x 4 KiB >= 0.8x
contiguous both ways and device to device, of 16384 x 16 KiB >= 0.85x;
pageable copies, both directions: memkit ahead of every torch row in every
round and >= 2.5x the driver's pageable path (median); PrefetchPlan
build+execute of 4096 entries <= 1.1x the whole range; the whole run
< 240 s on the GPU.

On the simulator the numbers are the simulator's (``--quick`` is implied:
small sizes, few repeats, no verdicts).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from harness import backend, check
from small_blocks import core_case, small_blocks

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def interleaved(cases: dict[str, Callable[[], None]], sync: Callable[[], None], repeat: int,
                before: Callable[[], None] | None = None, warmup: int = 1,
                rewarm: bool = False) -> dict[str, float]:
    """Median seconds per case; the cases take turns (ABBA) so that drift hits them alike.

    ``rewarm``: each timed call follows one untimed call of the same case, so that
    a case starts from the state its own work leaves, not from the idle GPU a slow
    host-bound case left (on the H100 a 256 MiB kernel copy after 300 ms idle took
    417 us, after an untimed call 237 us; the copy engine: 270 and 195 us).
    """
    def one(fn: Callable[[], None]) -> float:
        if before is not None:
            before()
        if rewarm:
            fn()
            sync()
        t0 = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t0

    for _ in range(warmup):
        for fn in cases.values():
            one(fn)
    samples: dict[str, list[float]] = {k: [] for k in cases}
    order = list(cases.items())
    for i in range(repeat):
        for key, fn in (order if i % 2 == 0 else order[::-1]):
            samples[key].append(one(fn))
    return {k: statistics.median(v) for k, v in samples.items()}


class Table:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, case: str, *, gbps: float | None = None, ms: float | None = None,
            ratio: float | None = None, vs: str = "", target: str = "", ok: bool | None = None,
            note: str = "") -> None:
        self.rows.append({"case": case, "gbps": gbps, "ms": ms, "ratio": ratio, "vs": vs,
                          "target": target, "ok": ok, "note": note})

    def print(self) -> None:
        print(f"{'case':72} {'result':>12} {'ratio':>16}  target")
        for r in self.rows:
            if r["gbps"] is not None:
                value = f"{r['gbps']:7.2f} GB/s"
            elif r["ms"] is not None:
                value = f"{r['ms']:9.2f} ms"
            else:
                value = "n/a"
            ratio = f"{r['ratio']:6.3f}x {r['vs']}" if r["ratio"] is not None else ""
            verdict = "" if r["ok"] is None else (" OK" if r["ok"] else " MISS")
            extra = f"  ({r['note']})" if r["note"] else ""
            print(f"{r['case']:72} {value:>12} {ratio:>16}  {r['target']}{verdict}{extra}")


# -- scattered blocks -------------------------------------------------------------------------


SHAPE_TARGETS = {
    (4096, 64 * KiB): "loop+batch",  # >= 2.0x the raw loop and >= 0.95x one raw batch call
    (1024, 256 * KiB): "contig",  # >= 0.85x one contiguous copy
}  # smaller blocks: small_blocks.py (the kernel path)


def scattered(cm: Any, raw: Any, cu: Any, table: Table, quick: bool, repeat: int) -> None:
    from cuda_memkit._transfer._copy_batch import CopyBatch, call_bounds, copy_batch

    shapes = list(SHAPE_TARGETS)
    div = 64 if quick else 1
    total = max(n * b for n, b in shapes) // div
    s = cm.Stream()
    s2 = cm.Stream()
    h = s.handle
    host = cm.HostBuffer.empty(total)
    host.array[:] = 1
    back = cm.HostBuffer.empty(total)
    dev = cm.DeviceBuffer.empty(total)
    dev_src = cm.DeviceBuffer.empty(total)
    rng = np.random.default_rng(0)

    def sync() -> None:
        check(raw.cuStreamSynchronize(h))

    copy_fn = raw.cuMemcpyHtoDAsync
    batch_fn = raw.cuMemcpyBatchAsync
    attrs = cu.CUmemcpyAttributes()
    attrs.srcAccessOrder = cu.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    P = cu.CUdeviceptr
    try:
        for (n_full, b), target in SHAPE_TARGETS.items():
            n = n_full // div
            nbytes = n * b
            perm = rng.permutation(n)
            d_off = perm * b
            s_off = np.arange(n) * b
            dps = (dev.ptr + d_off).tolist()
            hps = (host.ptr + s_off).tolist()
            dl = [P(x) for x in dps]
            hl = [P(x) for x in hps]
            szl = [b] * n
            parts = call_bounds(np.full(n, b, np.int64))

            def loop(dps: list[int] = dps, hps: list[int] = hps, b: int = b) -> None:
                for x, y in zip(dps, hps, strict=True):
                    if copy_fn(x, y, b, h)[0]:
                        raise RuntimeError("raw loop copy failed")

            def split(dl: list[Any] = dl, hl: list[Any] = hl, szl: list[int] = szl,
                      parts: list[tuple[int, int]] = parts) -> None:
                for lo, hi in parts:
                    check(batch_fn(dl[lo:hi], hl[lo:hi], szl[lo:hi], hi - lo, [attrs], [0], 1,
                                   h))

            def memkit(d_off: np.ndarray = d_off, s_off: np.ndarray = s_off, b: int = b
                       ) -> None:
                copy_batch(dev, host, dst_offsets=d_off, src_offsets=s_off, sizes=b, stream=s)

            cases: dict[str, Callable[[], None]] = {
                "contiguous": lambda nbytes=nbytes: check(copy_fn(dev.ptr, host.ptr, nbytes, h)),
                "loop": loop,
                "batch": lambda dl=dl, hl=hl, szl=szl, n=n: check(
                    batch_fn(dl, hl, szl, n, [attrs], [0], 1, h)),
                "split": split,
                "memkit": memkit,
            }
            extra_notes: dict[str, str] = {}
            core = core_case(dps, hps, b, h)
            if isinstance(core, str):
                extra_notes["cuda.core"] = core
            else:
                cases["cuda.core"] = core
            res = interleaved(cases, sync, repeat)
            bw = {k: nbytes / v / 1e9 for k, v in res.items()}
            got = dev.to_numpy()[: nbytes : max(1, nbytes // 4096)]
            if not (got == 1).all():
                raise RuntimeError("scattered copies left wrong bytes")
            tag = f"{n} x {b // KiB} KiB pinned->device"
            ref = bw["contiguous"]
            table.add(f"{tag}: raw contiguous cuMemcpyHtoDAsync", gbps=ref, ratio=1.0,
                      vs="contig", target="reference")
            table.add(f"{tag}: raw loop cuMemcpyHtoDAsync", gbps=bw["loop"],
                      ratio=bw["loop"] / ref, vs="contig", target="reference")
            table.add(f"{tag}: raw cuMemcpyBatchAsync, 1 call (prebuilt lists)",
                      gbps=bw["batch"], ratio=bw["batch"] / ref, vs="contig", target="reference")
            calls = f"{len(parts)} call{'s' if len(parts) != 1 else ''}"
            table.add(f"{tag}: raw cuMemcpyBatchAsync, {calls} as copy_batch (prebuilt)",
                      gbps=bw["split"], ratio=bw["split"] / ref, vs="contig", target="info")
            mk = bw["memkit"]
            label = f"{tag}: copy_batch from arrays"
            if target == "loop+batch":
                table.add(label, gbps=mk, ratio=mk / bw["loop"], vs="loop",
                          target=">= 2.0x loop", ok=None if quick else mk / bw["loop"] >= 2.0)
                table.add(label, gbps=mk, ratio=mk / bw["batch"], vs="batch",
                          target=">= 0.95x batch",
                          ok=None if quick else mk / bw["batch"] >= 0.95)
            elif target == "contig":
                table.add(label, gbps=mk, ratio=mk / ref, vs="contig",
                          target=">= 0.85x contig", ok=None if quick else mk / ref >= 0.85)
            for key, lab in (("cuda.core", "cuda.core copy_batch (prebuilt Buffers)"),):
                if key in bw:
                    table.add(f"{tag}: {lab}", gbps=bw[key], ratio=bw[key] / ref,
                              vs="contig", target="info")
                elif key in extra_notes:
                    table.add(f"{tag}: {lab}", target="info", note=extra_notes[key])
            if target == "loop+batch":
                _duplex(cm, raw, table, quick, repeat, (s, s2), (host, back, dev, dev_src),
                        (n, b, perm), (batch_fn, attrs, P), CopyBatch)
    finally:
        s.synchronize()
        s2.synchronize()
        for obj in (host, back, dev, dev_src, s, s2):
            obj.close()


def _duplex(cm: Any, raw: Any, table: Table, quick: bool, repeat: int, streams: Any,
            bufs: Any, shape: Any, rawfns: Any, copy_batch_cls: Any) -> None:
    """H2D and D2H at once: one raw stream, two raw streams, a CopyBatch (forks a stream)."""
    s, s2 = streams
    h, h2 = s.handle, s2.handle
    host, back, dev, dev_src = bufs
    n, b, perm = shape
    batch_fn, attrs, P = rawfns
    h = s.handle
    d_off, s_off = perm * b, np.arange(n) * b
    up = ([P(x) for x in (dev.ptr + d_off).tolist()],
          [P(x) for x in (host.ptr + s_off).tolist()])
    down = ([P(x) for x in (back.ptr + s_off).tolist()],
            [P(x) for x in (dev_src.ptr + d_off).tolist()])
    szl = [b] * n

    def two(stream_down: int) -> Callable[[], None]:
        def go() -> None:
            check(batch_fn(up[0], up[1], szl, n, [attrs], [0], 1, h))
            check(batch_fn(down[0], down[1], szl, n, [attrs], [0], 1, stream_down))
            if stream_down != h:
                check(raw.cuStreamSynchronize(stream_down))
        return go

    batch = copy_batch_cls()
    batch.add(dev, host, dst_offsets=d_off, src_offsets=s_off, sizes=b)
    batch.add(back, dev_src, dst_offsets=s_off, src_offsets=d_off, sizes=b)
    cases = {"one stream": two(h), "two streams": two(h2),
             "memkit": lambda: batch.execute(stream=s)}
    res = interleaved(cases, s.synchronize, repeat)
    moved = 2 * n * b
    bw = {k: moved / v / 1e9 for k, v in res.items()}
    tag = f"{n} x {b // KiB} KiB H2D + D2H (both directions)"
    ref = bw["one stream"]
    table.add(f"{tag}: raw 2 batch calls, 1 stream", gbps=ref, ratio=1.0, vs="1 stream",
              target="reference")
    table.add(f"{tag}: raw 2 batch calls, 2 streams", gbps=bw["two streams"],
              ratio=bw["two streams"] / ref, vs="1 stream", target="reference")
    table.add(f"{tag}: CopyBatch.execute (calls split, D2H forked)", gbps=bw["memkit"],
              ratio=bw["memkit"] / ref, vs="1 stream", target="info")


# -- pageable arrays -----------------------------------------------------------------------


ROUNDS = 5


def rounds(cases: dict[str, Callable[[], None]], sync: Callable[[], None], n: int
           ) -> dict[str, list[float]]:
    """Seconds per case in each of ``n`` rounds; every round runs each case once, in a
    rotated order, so that a slow stretch of the host hits a round's cases alike."""
    for fn in cases.values():  # warm-up: rings, caches, first-touch page faults
        fn()
        sync()
    out: dict[str, list[float]] = {k: [] for k in cases}
    names = list(cases)
    for r in range(n):
        order = names[r % len(names):] + names[:r % len(names)]
        for key in (order if r % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            cases[key]()
            sync()
            out[key].append(time.perf_counter() - t0)
    return out


def pageable(cm: Any, raw: Any, table: Table, quick: bool, repeat: int) -> None:
    """1 GiB pageable copies in five interleaved rounds: memkit staged against the peers.

    Targets, both directions: memkit staged ahead of every torch row in every
    round, and >= 2.5x the driver's pageable path (median of the rounds).
    """
    from cuda_memkit._transfer import _staging

    size = 64 * MiB if quick else GiB
    src = np.empty(size, np.uint8)
    src[:] = 7
    dst = np.empty(size, np.uint8)
    dst[:] = 0
    dev = cm.DeviceBuffer.empty(size)
    dptr = dev.ptr
    s = _staging.staging_settings()
    if quick and s.threshold > size // 2:
        _staging.configure_staging(threshold=size // 2)

    def reg(arr: np.ndarray, to_dev: bool) -> Callable[[], None]:
        def go() -> None:
            check(raw.cuMemHostRegister(arr.ctypes.data, size, 0))
            try:
                if to_dev:
                    check(raw.cuMemcpyHtoD(dptr, arr, size))
                else:
                    check(raw.cuMemcpyDtoH(arr, dptr, size))
            finally:
                check(raw.cuMemHostUnregister(arr.ctypes.data))
        return go

    h2d: dict[str, Callable[[], None]] = {
        "driver": lambda: check(raw.cuMemcpyHtoD(dptr, src, size)),
        "register": reg(src, True),
        "memkit staged": lambda: cm.copy(dev, src),
    }
    d2h: dict[str, Callable[[], None]] = {
        "driver": lambda: check(raw.cuMemcpyDtoH(dst, dptr, size)),
        "register": reg(dst, False),
        "memkit staged": lambda: cm.copy(dst, dev),
    }
    notes: dict[str, str] = {}
    _torch_cases(h2d, d2h, src, dst, size, notes)
    _cupy_cases(h2d, d2h, src, dst, size, notes)
    n = 2 if quick else ROUNDS
    if not _staging.staging_wanted(size):
        raise RuntimeError("staging is off or above this size: the staged rows would not stage")

    def sync() -> None:
        check(raw.cuCtxSynchronize())

    try:
        res_h = rounds(h2d, sync, n)
        res_d = rounds(d2h, sync, n)
        dst[:] = 0
        cm.copy(dst, dev)
        if not (dst[::4096] == 7).all():
            raise RuntimeError("pageable copies left wrong bytes")
    finally:
        _staging.release_staging()
        if quick:
            _staging.configure_staging(threshold=s.threshold)
        dev.close()
    label = f"{size // MiB} MiB pageable"
    cfg = _staging.staging_settings()
    for direction, res in (("H2D", res_h), ("D2H", res_d)):
        bw = {k: [size / t / 1e9 for t in v] for k, v in res.items()}
        med = {k: statistics.median(v) for k, v in bw.items()}
        ref = med["driver"]

        def per_round(k: str, bw: dict[str, list[float]] = bw) -> str:
            return "rounds " + " ".join(f"{x:.1f}" for x in bw[k])

        table.add(f"{label} {direction}: driver pageable path", gbps=ref, ratio=1.0,
                  vs="driver", target="reference", note=per_round("driver"))
        table.add(f"{label} {direction}: register + copy + unregister", gbps=med["register"],
                  ratio=med["register"] / ref, vs="driver", target="info",
                  note=per_round("register"))
        mk = med["memkit staged"]
        table.add(f"{label} {direction}: memkit staged copy() ({cfg.threads} threads)",
                  gbps=mk, ratio=mk / ref, vs="driver", target=">= 2.5x driver",
                  ok=None if quick else mk >= 2.5 * ref, note=per_round("memkit staged"))
        for key in [k for k in bw if k.startswith(("torch", "cupy"))]:
            peer = key.split(" ", 1)[1]
            is_target = key.startswith("torch")
            worst = min(a / b for a, b in zip(bw["memkit staged"], bw[key], strict=True))
            table.add(f"{label} {direction}: {key.split(' ', 1)[0]} {peer}", gbps=med[key],
                      ratio=worst, vs="memkit/peer, worst round",
                      target="memkit ahead every round" if is_target else "info",
                      ok=(worst > 1.0) if is_target and not quick else None,
                      note=per_round(key))
        for key, note in notes.items():
            if key.startswith(direction):
                table.add(f"{label} {key}", target="info", note=note)


def _torch_cases(h2d: dict[str, Callable[[], None]], d2h: dict[str, Callable[[], None]],
                 src: np.ndarray, dst: np.ndarray, size: int, notes: dict[str, str]) -> None:
    try:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no GPU")
    except Exception as exc:
        notes["H2D torch"] = notes["D2H torch"] = f"{type(exc).__name__}: {exc}"[:80]
        return
    tdev = torch.empty(size, dtype=torch.uint8, device="cuda")
    tsrc, tdst = torch.from_numpy(src), torch.from_numpy(dst)
    tpin = torch.empty(size, dtype=torch.uint8).pin_memory()

    def pin_to() -> None:
        x = tsrc.pin_memory().to("cuda")
        torch.cuda.synchronize()
        del x

    def via_pinned_h2d() -> None:
        tpin.copy_(tsrc)
        tdev.copy_(tpin, non_blocking=True)
        torch.cuda.synchronize()

    def via_pinned_d2h() -> None:
        tpin.copy_(tdev, non_blocking=True)
        torch.cuda.synchronize()
        tdst.copy_(tpin)

    def copy_into() -> None:
        tdst.copy_(tdev)

    h2d["torch pin_memory().to()"] = pin_to
    h2d["torch copy_ via a pinned tensor"] = via_pinned_h2d
    d2h["torch copy_ into from_numpy(dst)"] = copy_into
    d2h["torch copy_ via a pinned tensor"] = via_pinned_d2h


def _cupy_cases(h2d: dict[str, Callable[[], None]], d2h: dict[str, Callable[[], None]],
                src: np.ndarray, dst: np.ndarray, size: int, notes: dict[str, str]) -> None:
    try:
        import cupy

        cdev = cupy.empty(size, dtype=cupy.uint8)
    except Exception as exc:
        notes["H2D cupy"] = notes["D2H cupy"] = f"{type(exc).__name__}: {exc}"[:80]
        return

    def asarray() -> None:
        x = cupy.asarray(src)
        cupy.cuda.runtime.deviceSynchronize()
        del x

    h2d["cupy asarray"] = asarray
    d2h["cupy get(out=dst)"] = lambda: cdev.get(out=dst)


# -- prefetch plans from arrays ------------------------------------------------------------


def prefetch(cm: Any, raw: Any, table: Table, quick: bool, repeat: int) -> None:
    size = 64 * MiB if quick else 512 * MiB
    free, _ = cm.Device(0).mem_info()
    while size > 16 * MiB and size + 256 * MiB > free:
        size //= 2
    n = 4096
    chunk = size // n
    buf = cm.ManagedBuffer.empty(size)
    buf.array[:] = 1
    stream = cm.Stream(0)
    h = stream.handle
    to_dev = cm.Location.device(0)
    host_loc = cm.Location.host().to_cu()
    offsets = np.arange(n, dtype=np.int64) * chunk
    sizes = np.full(n, chunk, np.int64)

    def back() -> None:
        check(raw.cuMemPrefetchAsync(buf.ptr, size, host_loc, 0, h))
        check(raw.cuStreamSynchronize(h))

    def per_entry() -> None:
        plan = cm.PrefetchPlan()
        for off in offsets.tolist():
            plan.add(buf, to_dev, offset=off, nbytes=chunk)
        plan.execute(stream)

    def from_arrays() -> None:
        plan = cm.PrefetchPlan()
        plan.add_ranges(buf, to_dev, offsets, sizes)
        plan.execute(stream)

    cases: dict[str, Callable[[], None]] = {
        "whole": lambda: buf.prefetch(to_dev, stream=stream),
        "per-entry": per_entry,
        "add_ranges": from_arrays,
    }
    try:
        res = interleaved(cases, stream.synchronize, repeat, before=back)
    finally:
        back()
        stream.close()
        buf.close()
    base = res["whole"]
    tag = f"PrefetchPlan {n} x {chunk // KiB} KiB managed->device"
    table.add(f"{tag}: whole-range buf.prefetch", ms=base * 1e3, ratio=1.0, vs="whole",
              target="reference")
    table.add(f"{tag}: add() x {n} + execute", ms=res["per-entry"] * 1e3,
              ratio=res["per-entry"] / base, vs="whole", target="info")
    r = res["add_ranges"] / base
    table.add(f"{tag}: add_ranges + execute", ms=res["add_ranges"] * 1e3, ratio=r,
              vs="whole", target="<= 1.1x whole", ok=None if quick else r <= 1.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    ap.add_argument("--only", default="scattered,blocks,pageable,prefetch",
                    help="comma-separated sections to run")
    args = ap.parse_args()

    import cuda_memkit as cm

    backend_name, simulated, raw = backend()
    dev = cm.Device(0)
    quick = args.quick or simulated
    from cuda.bindings import driver as cu
    repeat = 3 if quick else 7
    table = Table()
    sections = set(args.only.split(","))
    t0 = time.perf_counter()
    if "scattered" in sections:
        scattered(cm, raw, cu, table, quick, repeat)
    if "blocks" in sections:
        small_blocks(cm, raw, table, quick, repeat, interleaved)
    if "pageable" in sections:
        pageable(cm, raw, table, quick, repeat)
    if "prefetch" in sections:
        prefetch(cm, raw, table, quick, repeat)
    note = "  [SIMULATED: CPU simulator, numbers are not GPU timings]" if simulated else ""
    took = time.perf_counter() - t0
    budget = "" if quick else f" (target < 240 s:{' OK' if took < 240 else ' MISS'})"
    print(f"bench_transfers on backend {backend_name} ({dev.name}), median of {repeat} interleaved "
          f"samples, wall clock incl. the wait; {took:.0f} s{budget}{note}")
    table.print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "bench_transfers", "backend": backend_name,
                       "simulated": simulated, "device": dev.name, "repeat": repeat,
                       "seconds": round(took, 1), "rows": table.rows}, f, indent=1)


if __name__ == "__main__":
    main()
