#!/usr/bin/env python3
"""Where copy_batch's kernel path beats the driver batch: bandwidth against block size.

For block sizes 1 KiB .. 1 MiB and each direction (pinned->device and
device->pinned scattered on both sides, device->device), the same bytes
(``--total`` MiB, blocks a permutation of the whole buffer on each side)
are copied by

* one raw contiguous ``cuMemcpyAsync`` (the reference, 1.0),
* ``copy_batch(method="driver")`` (``cuMemcpyBatchAsync`` calls),
* ``copy_batch(method="kernel")`` (the block-copy kernel),

interleaved, median of ``--repeat`` samples, each the wall-clock time of
issuing the copy and waiting for it. It prints one table and the threshold
the numbers suggest for ``cuda_memkit._transfer._kernels.KERNEL_THRESHOLD``:
the smallest block size from which the driver batch is at least as fast as
the kernel in every direction, at that size and every larger one. Then it
records what the driver answers to the misuse the simulator models
(``cuda_memkit/sim/_kernels.py``; cases that could crash are left out).

Usage::

    python scripts/probes/kernel_threshold_probe.py [--total 128] [--repeat 5] [--json PATH]
    CUDA_MEMKIT_BACKEND=sim python scripts/probes/kernel_threshold_probe.py --quick

On the H100 it takes about a minute (the 1 KiB driver rows dominate).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import cuda_memkit as cm  # noqa: E402
from cuda_memkit._core import _driver  # noqa: E402
from cuda_memkit._transfer import _kernels  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
SIZES = [KiB << i for i in range(11)]  # 1 KiB .. 1 MiB
DIRS = ("h2d", "d2h", "d2d")
METHODS = ("contiguous", "driver", "kernel")


def median_times(cases: dict[str, Callable[[], None]], sync: Callable[[], None],
                 repeat: int) -> dict[str, float]:
    def one(fn: Callable[[], None]) -> float:
        t0 = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t0

    for fn in cases.values():
        one(fn)  # warm-up: module load, pools
    samples: dict[str, list[float]] = {k: [] for k in cases}
    order = list(cases.items())
    for i in range(repeat):
        for key, fn in (order if i % 2 == 0 else order[::-1]):
            samples[key].append(one(fn))
    return {k: statistics.median(v) for k, v in samples.items()}


def measure(total: int, repeat: int, sizes: list[int]) -> list[dict[str, Any]]:
    raw = _raw()
    s = cm.Stream()
    h = s.handle
    host_src = cm.HostBuffer.from_array(np.full(total, 3, np.uint8))
    host_dst = cm.HostBuffer.zeros(total)
    dev_src = cm.DeviceBuffer.empty(total)
    dev_dst = cm.DeviceBuffer.empty(total)
    cm.copy(dev_src, host_src)
    rng = np.random.default_rng(5)
    rows = []
    try:
        for size in sizes:
            n = total // size
            for direction in DIRS:
                dst, src = {"h2d": (dev_dst, host_src), "d2h": (host_dst, dev_src),
                            "d2d": (dev_dst, dev_src)}[direction]
                d_off = rng.permutation(n) * size
                s_off = rng.permutation(n) * size
                nbytes = n * size

                def batch(method: str, dst: Any = dst, src: Any = src, d_off: Any = d_off,
                          s_off: Any = s_off, size: int = size) -> Callable[[], None]:
                    return lambda: cm.copy_batch(dst, src, dst_offsets=d_off,
                                                 src_offsets=s_off, sizes=size, stream=s,
                                                 method=method)

                def contiguous(dst: Any = dst, src: Any = src, nbytes: int = nbytes) -> None:
                    res = raw.cuMemcpyAsync(dst.ptr, src.ptr, nbytes, h)
                    if int(res[0]):
                        raise RuntimeError(f"cuMemcpyAsync: {res[0]!r}")

                t = median_times({"contiguous": contiguous, "driver": batch("driver"),
                                  "kernel": batch("kernel")}, s.synchronize, repeat)
                row: dict[str, Any] = {"block": size, "blocks": n, "direction": direction}
                row.update({k: nbytes / v / 1e9 for k, v in t.items()})
                rows.append(row)
                print(f"  {direction} {size // KiB:5d} KiB x {n:6d}: " + "  ".join(
                    f"{k} {row[k]:6.2f}" for k in METHODS) + " GB/s", flush=True)
    finally:
        s.synchronize()
        for obj in (host_src, host_dst, dev_src, dev_dst, s):
            obj.close()
    return rows


def suggest(rows: list[dict[str, Any]], sizes: list[int]) -> int | None:
    """Smallest block size from which the driver batch keeps up with the kernel everywhere.

    "Keeps up": within 2 % (noise), in every direction, at that size and every larger one.
    """
    driver_ok = {size: all(r["driver"] >= 0.98 * r["kernel"] for r in rows
                           if r["block"] == size) for size in sizes}
    for i, size in enumerate(sizes):
        if all(driver_ok[x] for x in sizes[i:]):
            return size
    return None


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'block':>8} {'dir':>4} {'blocks':>7} {'contig GB/s':>12} {'driver GB/s':>12} "
          f"{'kernel GB/s':>12} {'driver/c':>9} {'kernel/c':>9}  faster")
    for r in rows:
        c = r["contiguous"]
        faster = "kernel" if r["kernel"] > r["driver"] else "driver"
        print(f"{r['block'] // KiB:>5} KiB {r['direction']:>4} {r['blocks']:>7} {c:12.2f} "
              f"{r['driver']:12.2f} {r['kernel']:12.2f} {r['driver'] / c:9.3f} "
              f"{r['kernel'] / c:9.3f}  {faster}")


# -- what the driver answers to misuse (the simulator's PROVISIONAL codes) -------------------


def _raw() -> Any:
    if _driver.backend_name() == "sim":
        from cuda_memkit.sim import driver as raw
    else:
        from cuda.bindings import driver as raw
    return raw


def codes() -> dict[str, str]:
    """CUresult names of module and launch misuse that cannot crash the process."""
    raw = _raw()
    out: dict[str, str] = {}

    def name(res: Any) -> str:
        code = res[0] if isinstance(res, tuple) else res
        return str(getattr(code, "name", code))

    for key, image in (("load: not PTX", b"this is not PTX\0"),
                       ("load: PTX without target or entry", b".version 9.0\n.address_size 64\n\0"),
                       ("load: PTX ISA 9.9",
                        b".version 9.9\n.target sm_75\n.address_size 64\n"
                        b".visible .entry k()\n{\nret;\n}\n\0")):
        res = raw.cuModuleLoadData(image)
        out[key] = name(res)
        if not int(res[0]):
            raw.cuModuleUnload(res[1])
    res = raw.cuModuleLoadData(_kernels.ptx_image())
    out["load: shipped PTX"] = name(res)
    if int(res[0]):
        return out
    mod = res[1]
    try:
        out["get function: unknown name"] = name(raw.cuModuleGetFunction(mod, b"nope"))
        fn = raw.cuModuleGetFunction(mod, _kernels.ENTRY)[1]
        types = (ctypes.c_void_p,) * 5 + (ctypes.c_uint64,) * 3
        none = ((0, 0, 0, 0, 0, 0, 0, 32), types)  # zero blocks: touches nothing
        for key, grid, block, shared in (("launch: grid 0", (0, 1, 1), (256, 1, 1), 0),
                                         ("launch: block 0", (1, 1, 1), (0, 1, 1), 0),
                                         ("launch: block 2048", (1, 1, 1), (2048, 1, 1), 0),
                                         ("launch: 512x4 threads", (1, 1, 1), (512, 4, 1), 0),
                                         ("launch: grid y 65536", (1, 65536, 1), (32, 1, 1), 0),
                                         ("launch: 64 KiB shared", (1, 1, 1), (32, 1, 1),
                                          64 * KiB),
                                         ("launch: zero blocks (ok)", (1, 1, 1), (256, 1, 1), 0)):
            out[key] = name(raw.cuLaunchKernel(fn, *grid, *block, shared, 0, none, 0))
        out["sync after the launches"] = name(raw.cuCtxSynchronize())
    finally:
        raw.cuModuleUnload(mod)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--total", type=int, default=128, help="MiB copied per case")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="4 MiB, 2 repeats, up to 256 KiB")
    ap.add_argument("--json", help="write the rows and codes here")
    args = ap.parse_args()
    total, repeat, sizes = args.total * MiB, args.repeat, SIZES
    if args.quick:
        total, repeat, sizes = 4 * MiB, 2, SIZES[:9]
    cm.Device(0).set_current()
    print(f"kernel_threshold_probe on {_driver.backend_name()} ({cm.Device(0).name}): "
          f"{total // MiB} MiB per case, median of {repeat}; KERNEL_THRESHOLD now "
          f"{_kernels.KERNEL_THRESHOLD // KiB} KiB", flush=True)
    rows = measure(total, repeat, sizes)
    print_table(rows)
    best = suggest(rows, sizes)
    if best is None:
        lead = [r["direction"] for r in rows
                if r["block"] == sizes[-1] and r["driver"] < 0.98 * r["kernel"]]
        print(f"\nsuggested KERNEL_THRESHOLD: above {sizes[-1] // KiB} KiB (the kernel still "
              f"leads at {sizes[-1] // KiB} KiB in {', '.join(lead)})")
    else:
        print(f"\nsuggested KERNEL_THRESHOLD = {best // KiB} * KiB (the driver batch keeps up "
              "with the kernel from there on, in every direction)")
    answers = codes()
    print("\ndriver answers (compare cuda_memkit/sim/_kernels.py):")
    for key, value in answers.items():
        print(f"  {key:40} {value}")
    out = args.json or (os.path.join(os.environ["OUT"], "kernel_threshold_probe.json")
                        if os.environ.get("OUT") else None)
    if out:
        with open(out, "w") as f:
            json.dump({"device": cm.Device(0).name, "backend": _driver.backend_name(),
                       "total": total, "repeat": repeat, "rows": rows,
                       "suggested_threshold": best, "codes": answers}, f, indent=1)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
