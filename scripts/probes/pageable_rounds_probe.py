#!/usr/bin/env python3
"""Why do staged pageable copies vary between runs? Five interleaved rounds, 1 GiB.

Each round runs every case once per direction, in a shuffled order, and records
the host's own memcpy ceiling (1 and 8 threads) in the same round, so that a
slow round of memkit can be told apart from a slow host. Cases: the driver's
pageable path, register+copy+unregister, torch (``pin_memory().to()``, copy
through a pinned tensor), CuPy, and memkit's staged path under several
settings (threads, chunk, buffers, blocking-sync events).

    python3 scripts/probes/pageable_rounds_probe.py [--rounds 5] [--size-mib 1024]
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from cuda.bindings import driver as d

import cuda_memkit as cm
from cuda_memkit._transfer import _staging

MiB = 1 << 20
ROUNDS = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 5
SIZE = (int(sys.argv[sys.argv.index("--size-mib") + 1]) if "--size-mib" in sys.argv
        else 1024) * MiB


def check(res):
    if int(res[0]) != 0:
        raise RuntimeError(res)
    return res[1:] if len(res) > 2 else (res[1] if len(res) == 2 else None)


def host_info() -> None:
    for cmd in (["nproc"], ["lscpu"], ["numactl", "--hardware"],
                ["cat", "/sys/kernel/mm/transparent_hugepage/enabled"]):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
            lines = [ln for ln in out.splitlines() if cmd[0] != "lscpu" or any(
                k in ln for k in ("Model name", "Socket", "NUMA", "Core", "Thread", "MHz",
                                  "L3"))]
            print("$", " ".join(cmd))
            print("\n".join(lines[:20]))
        except Exception as exc:  # a missing tool is information, not a failure
            print("$", " ".join(cmd), "->", type(exc).__name__)


def main() -> None:
    host_info()
    print("sched_getaffinity:", len(os.sched_getaffinity(0)))
    src = np.empty(SIZE, np.uint8)
    src[:] = 7
    dst = np.empty(SIZE, np.uint8)
    dst[:] = 1
    scratch = np.empty(SIZE, np.uint8)
    scratch[:] = 3
    dev = cm.DeviceBuffer.empty(SIZE)
    dptr = dev.ptr
    base = _staging.staging_settings()
    print("default staging settings:", base)

    def memcpy(threads: int):
        def go():
            if threads == 1:
                np.copyto(scratch, src)
                return
            step = SIZE // threads
            with ThreadPoolExecutor(threads) as ex:
                list(ex.map(lambda i: np.copyto(scratch[i * step:(i + 1) * step],
                                                src[i * step:(i + 1) * step]), range(threads)))
        return go

    variants = {
        "staged default": {},
        "staged t4": {"threads": 4},
        "staged t12": {"threads": 12, "buffers": 14},
        "staged t16": {"threads": 16, "buffers": 18},
        "staged c4": {"chunk": 4 * MiB, "buffers": 16},
        "staged c16": {"chunk": 16 * MiB, "buffers": 10},
        "staged blocksync": {"_blocksync": True},
    }

    current = [None]

    def setup(cfg: dict) -> None:
        """Make the ring for ``cfg`` (untimed): a variant is measured in its steady state."""
        if current[0] == repr(cfg):
            return
        cfg2 = dict(cfg)
        block = cfg2.pop("_blocksync", False)
        _staging.release_staging()
        _staging._EVENT_DISABLE_TIMING = 0x3 if block else 0x2
        _staging.configure_staging(**{**{k: getattr(base, k) for k in
                                         ("chunk", "buffers", "threads", "streams")}, **cfg2})
        assert _staging.staged_copy(dptr, src[: 64 * MiB])
        current[0] = repr(cfg)

    def staged(to_dev: bool, cfg: dict):
        def go():
            done = _staging.staged_copy(dptr, src) if to_dev else _staging.staged_copy(dst, dptr)
            assert done
        go.cfg = cfg
        return go

    cases: dict[str, dict] = {"H2D": {}, "D2H": {}}
    cases["H2D"]["driver"] = lambda: check(d.cuMemcpyHtoD(dptr, src, SIZE))
    cases["D2H"]["driver"] = lambda: check(d.cuMemcpyDtoH(dst, dptr, SIZE))

    def reg(arr, to_dev):
        def go():
            check(d.cuMemHostRegister(arr.ctypes.data, SIZE, 0))
            try:
                if to_dev:
                    check(d.cuMemcpyHtoD(dptr, arr, SIZE))
                else:
                    check(d.cuMemcpyDtoH(arr, dptr, SIZE))
            finally:
                check(d.cuMemHostUnregister(arr.ctypes.data))
        return go
    cases["H2D"]["register"] = reg(src, True)
    cases["D2H"]["register"] = reg(dst, False)
    for name, cfg in variants.items():
        cases["H2D"][name] = staged(True, cfg)
        cases["D2H"][name] = staged(False, cfg)
    try:
        import torch
        tdev = torch.empty(SIZE, dtype=torch.uint8, device="cuda")
        tsrc, tdst = torch.from_numpy(src), torch.from_numpy(dst)
        tpin = torch.empty(SIZE, dtype=torch.uint8).pin_memory()

        def pin_to():
            x = tsrc.pin_memory().to("cuda")
            torch.cuda.synchronize()
            del x

        def via_pinned_h2d():
            tpin.copy_(tsrc)
            tdev.copy_(tpin, non_blocking=True)
            torch.cuda.synchronize()

        def via_pinned_d2h():
            tpin.copy_(tdev, non_blocking=True)
            torch.cuda.synchronize()
            tdst.copy_(tpin)

        def direct_d2h():
            tdst.copy_(tdev)
            torch.cuda.synchronize()
        cases["H2D"]["torch pin_memory().to()"] = pin_to
        cases["H2D"]["torch via pinned tensor"] = via_pinned_h2d
        cases["D2H"]["torch copy_ into from_numpy"] = direct_d2h
        cases["D2H"]["torch via pinned tensor"] = via_pinned_d2h
    except Exception as exc:
        print("torch:", type(exc).__name__, exc)
    try:
        import cupy
        cdev = cupy.empty(SIZE, dtype=cupy.uint8)

        def cp_h2d():
            x = cupy.asarray(src)
            cupy.cuda.runtime.deviceSynchronize()
            del x
        cases["H2D"]["cupy asarray"] = cp_h2d
        cases["D2H"]["cupy get(out=)"] = lambda: cdev.get(out=dst)
    except Exception as exc:
        print("cupy:", type(exc).__name__, exc)
    for k in (1, 8):
        cases["H2D"][f"host memcpy {k}t"] = memcpy(k)

    results: dict[str, dict[str, list[float]]] = {dir_: {k: [] for k in c}
                                                  for dir_, c in cases.items()}
    # warm-up: one pass of everything
    for c in cases.values():
        for fn in c.values():
            if hasattr(fn, "cfg"):
                setup(fn.cfg)
            fn()
    check(d.cuCtxSynchronize())
    for r in range(ROUNDS):
        for dir_, c in cases.items():
            names = list(c)
            random.Random(r).shuffle(names)
            for name in names:
                if hasattr(c[name], "cfg"):
                    setup(c[name].cfg)
                check(d.cuCtxSynchronize())
                t0 = time.perf_counter()
                c[name]()
                check(d.cuCtxSynchronize())
                t = time.perf_counter() - t0
                results[dir_][name].append(SIZE / t / 1e9)
    _staging._EVENT_DISABLE_TIMING = 0x2
    _staging.configure_staging(**{k: getattr(base, k) for k in
                                  ("chunk", "buffers", "threads", "streams")})
    _staging.release_staging()
    dev.close()
    for dir_, res in results.items():
        print(f"\n{dir_} {SIZE // MiB} MiB, GB/s per round (median last)")
        for name, v in res.items():
            print(f"  {name:32s} " + " ".join(f"{x:6.1f}" for x in v)
                  + f"   | {statistics.median(v):6.1f}")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "pageable_rounds.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
