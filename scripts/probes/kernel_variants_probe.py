#!/usr/bin/env python3
"""Device-side speed of the block-copy kernel: launch geometry and source variants.

Run on the GPU from the repository root::

    python scripts/probes/kernel_variants_probe.py [--repeat 7]

For 65536 x 4 KiB device->device, pinned->device and device->pinned and
16384 x 16 KiB pinned->device (blocks a random permutation of the whole
buffer on both sides), it times the kernel alone (descriptors already on the
device, CUDA events around the launch, median of ``--repeat``) for

* source variants of ``cuda_memkit/kernels/block_copy.cu`` compiled here with
  NVRTC (``UNROLL`` 2, 4 and 8; needs ``cuda.bindings.nvrtc`` and libnvrtc,
  else only the shipped PTX runs),
* lanes per block (32 .. 256) and CTAs per SM (4 .. 32),

against one contiguous ``cuMemcpyAsync`` of the same bytes, and prints one
line per variant with GB/s and the ratio to contiguous, plus the registers
per thread and resident CTAs per SM the driver reports. It uses only
``cuda.bindings`` (no cuda_memkit code), so the numbers are the kernel's own.
"""

from __future__ import annotations

import argparse
import ctypes
import pathlib
import re
import statistics
import sys

import numpy as np
from cuda.bindings import driver as d

ROOT = pathlib.Path(__file__).resolve().parents[2]
CU = ROOT / "cuda_memkit" / "kernels" / "block_copy.cu"
PTX = ROOT / "cuda_memkit" / "kernels" / "block_copy.ptx"
THREADS = 256


def ok(res):
    tup = res if isinstance(res, tuple) else (res,)
    if int(tup[0]) != 0:
        raise RuntimeError(f"driver error {tup[0]}")
    return tup[1] if len(tup) == 2 else (tup[1:] or None)


def variants() -> dict[str, bytes]:
    out = {"shipped": PTX.read_bytes() + b"\0"}
    pre = ROOT / "kv_ptx"  # variants compiled elsewhere (a GPU machine without NVRTC)
    if pre.is_dir():
        for f in sorted(pre.glob("*.ptx")):
            out[f.stem] = f.read_bytes() + b"\0"
        return out
    try:
        sys.path.insert(0, str(ROOT / "scripts"))
        import build_kernels as bk
        from cuda.bindings import nvrtc  # noqa: F401
    except Exception as e:
        print(f"(no NVRTC here: {e}; only the shipped PTX)")
        return out
    src = CU.read_text()
    tmp = pathlib.Path("/tmp/kv")
    tmp.mkdir(exist_ok=True)
    for u in (2, 4, 8):
        f = tmp / f"u{u}.cu"
        f.write_text(re.sub(r"#define UNROLL \d+", f"#define UNROLL {u}", src))
        try:
            out[f"unroll{u}"] = bk.compile_ptx(f).encode() + b"\0"
        except SystemExit as e:
            print(f"(unroll {u}: {e})")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    ptxs = variants()
    ok(d.cuInit(0))
    dev = ok(d.cuDeviceGet(0))
    ctx = ok(d.cuDevicePrimaryCtxRetain(dev))
    ok(d.cuCtxSetCurrent(ctx))
    sms = ok(d.cuDeviceGetAttribute(
        d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
    name = ok(d.cuDeviceGetName(64, dev)).split(b"\0")[0].decode()
    print(f"{name}, {sms} SMs")
    stream = ok(d.cuStreamCreate(1))
    e0, e1 = ok(d.cuEventCreate(0)), ok(d.cuEventCreate(0))
    total = 256 << 20
    dev_a, dev_b = ok(d.cuMemAlloc(total)), ok(d.cuMemAlloc(total))
    host = ok(d.cuMemHostAlloc(total, d.CU_MEMHOSTALLOC_DEVICEMAP | d.CU_MEMHOSTALLOC_PORTABLE))
    hdev = int(ok(d.cuMemHostGetDevicePointer(host, 0)))
    ok(d.cuMemsetD8(dev_a, 1, total))
    ok(d.cuMemsetD8(dev_b, 2, total))
    ctypes.memset(int(host), 3, total)
    rng = np.random.default_rng(0)

    def timed(fn) -> float:
        fn()
        ok(d.cuStreamSynchronize(stream))
        ts = []
        for _ in range(args.repeat):
            ok(d.cuEventRecord(e0, stream))
            fn()
            ok(d.cuEventRecord(e1, stream))
            ok(d.cuEventSynchronize(e1))
            ts.append(ok(d.cuEventElapsedTime(e0, e1)) / 1e3)
        return statistics.median(ts)

    cases = [("D2D 65536x4K", int(dev_b), int(dev_a), 4096, "d2d"),
             ("H2D 65536x4K", int(dev_a), hdev, 4096, "h2d"),
             ("D2H 65536x4K", hdev, int(dev_a), 4096, "d2h"),
             ("H2D 16384x16K", int(dev_a), hdev, 16384, "h2d")]
    mods = {}
    for vname, img in ptxs.items():
        mod = ok(d.cuModuleLoadData(img))
        fn = ok(d.cuModuleGetFunction(mod, b"memkit_copy_blocks"))
        regs = ok(d.cuFuncGetAttribute(d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, fn))
        occ = ok(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, THREADS, 0))
        print(f"variant {vname}: {regs} registers/thread, {occ} CTAs of {THREADS} resident per SM")
        mods[vname] = fn
    for cname, dst, src, size, kind in cases:
        n = total // size
        doff = (rng.permutation(n).astype(np.uint64) * np.uint64(size))
        soff = (rng.permutation(n).astype(np.uint64) * np.uint64(size))
        desc = np.concatenate([doff, soff])
        ddesc = ok(d.cuMemAlloc(desc.nbytes))
        ok(d.cuMemcpyHtoD(ddesc, desc.ctypes.data, desc.nbytes))
        c_dst = int(dev_b) if kind == "d2d" else (int(dev_a) if kind == "h2d" else int(host))
        c_src = int(dev_a) if kind != "h2d" else int(host)
        contig = timed(lambda c_dst=c_dst, c_src=c_src: ok(d.cuMemcpyAsync(c_dst, c_src, total,
                                                                          stream)))
        print(f"\n{cname}: contiguous {total / contig / 1e9:.1f} GB/s")
        rows = []
        for vname, fn in mods.items():
            for lanes in (32, 64, 128, 256):
                for cps in (4, 8, 16, 32):
                    grid = max(1, min(-(-n // (THREADS // lanes)), sms * cps))
                    vals = (ctypes.c_uint64(dst), ctypes.c_uint64(src),
                            ctypes.c_uint64(int(ddesc)), ctypes.c_uint64(int(ddesc) + 8 * n),
                            ctypes.c_uint64(0), ctypes.c_uint64(size), ctypes.c_uint64(n),
                            ctypes.c_uint64(lanes))
                    ptrs = (ctypes.c_void_p * 8)(*[ctypes.addressof(v) for v in vals])

                    def launch(fn=fn, grid=grid, ptrs=ptrs) -> None:
                        ok(d.cuLaunchKernel(fn, grid, 1, 1, THREADS, 1, 1, 0, stream,
                                            ctypes.addressof(ptrs), 0))
                    t = timed(launch)
                    rows.append((contig / t, vname, lanes, cps, total / t / 1e9))
        rows.sort(reverse=True)
        for r, vname, lanes, cps, gbs in rows[:8]:
            print(f"  {vname:9s} lanes {lanes:3d} ctas/sm {cps:2d}: {gbs:7.1f} GB/s {r:.3f}x")
        shipped = [x for x in rows if x[1] == "shipped" and x[3] == 8]
        for r, _v, lanes, _c, gbs in shipped:
            print(f"  (shipped, lanes {lanes}, ctas/sm 8: {gbs:.1f} GB/s {r:.3f}x)")
        ok(d.cuMemFree(ddesc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
