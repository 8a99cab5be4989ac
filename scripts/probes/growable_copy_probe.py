#!/usr/bin/env python3
"""Does a growable buffer's chunking cost a copy on one GPU? (the peer row's question, halved)

``cm.copy`` of a ``GrowableBuffer`` between two GPUs ran at 0.92x PyTorch's
``copy_`` where a ``DeviceBuffer`` ran at 0.97x. Its default chunk is the 2 MiB
granularity, so 256 MiB are 128 physical allocations behind one range. This
probe asks the half of the question one GPU can answer: on a single device,
device-to-device and pinned-host-to-device copies of ``--mib`` MiB into a
``DeviceBuffer``, growable buffers of several chunk sizes and one ``Mapping``,
each through ``cm.copy`` and through a raw ``cuMemcpyAsync`` into the same
memory. Interleaved (ABBA) samples, medians, GB/s and the ratio to the raw copy
into the ``DeviceBuffer``; also a raw ``cuMemcpy`` followed by a wait (what ``cm.copy``
issues) and a raw ``cuMemcpyAsync`` on the legacy stream followed by a wait (the same
order through the asynchronous call).

If every destination copies alike here, the peer row's gap is in the peer path
(the other device's page tables over NVLink), which only two GPUs can measure.

    python3 scripts/probes/growable_copy_probe.py [--mib 256] [--chunks 2,32,whole,mapping]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_transfers import interleaved
from harness import backend, check

import cuda_memkit as cm


def destinations(n: int, chunks: list[str], keep: list[Any]) -> dict[str, Any]:
    """Device 0's memory to copy into: a DeviceBuffer, growable buffers, one Mapping."""
    out: dict[str, Any] = {"DeviceBuffer": cm.DeviceBuffer.empty(n, np.uint8, device=0)}
    for spec in chunks:
        if spec == "mapping":
            phys = cm.PhysicalMemory.create(n, device=0)
            rng = cm.AddressRange.reserve(n)
            m = rng.map(phys)
            m.set_access([0])
            keep += [phys, rng, m]
            out["Mapping (one)"] = m
            continue
        chunk = n if spec == "whole" else int(spec) << 20
        g = cm.GrowableBuffer(n, device=0, chunk=chunk)
        g.resize(n)
        out[f"Growable {chunk >> 20} MiB ({-(-n // chunk)} maps)"] = g
    keep += list(out.values())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--chunks", default="2,32,whole,mapping")
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    n, reps = args.mib << 20, 4
    _, _, raw = backend()
    keep: list[Any] = []
    with cm.Device(0), cm.Stream(0) as s:
        dsrc = cm.DeviceBuffer.from_array(np.ones(n, np.uint8), device=0)
        hsrc = cm.HostBuffer.from_array(np.ones(n, np.uint8))
        dst = destinations(n, args.chunks.split(","), keep)
        h = s.handle
        cases: dict[str, Callable[[], None]] = {}
        for src_name, src in (("d2d", dsrc), ("h2d", hsrc)):
            for label, d in dst.items():
                def memkit(d: Any = d, src: Any = src) -> None:
                    for _ in range(reps):
                        cm.copy(d, src)

                def raw_copy(ptr: int = d.ptr, sptr: int = src.ptr) -> None:
                    for _ in range(reps):
                        check(raw.cuMemcpyAsync(ptr, sptr, n, h))

                def raw_sync(ptr: int = d.ptr, sptr: int = src.ptr) -> None:
                    for _ in range(reps):  # what cm.copy issues: cuMemcpy, then a wait
                        check(raw.cuMemcpy(ptr, sptr, n))
                        check(raw.cuStreamSynchronize(0))

                def raw_legacy(ptr: int = d.ptr, sptr: int = src.ptr) -> None:
                    for _ in range(reps):  # the same order, through the asynchronous call
                        check(raw.cuMemcpyAsync(ptr, sptr, n, 0))
                        check(raw.cuStreamSynchronize(0))
                cases[f"{src_name} cm.copy -> {label}"] = memkit
                cases[f"{src_name} raw -> {label}"] = raw_copy
                cases[f"{src_name} raw cuMemcpy+wait -> {label}"] = raw_sync
                cases[f"{src_name} raw async(0)+wait -> {label}"] = raw_legacy
        res = interleaved(cases, s.synchronize, args.repeat, rewarm=True)
        print(f"{args.mib} MiB on {cm.Device(0).name}, median of {args.repeat} interleaved "
              f"samples of {reps} copies")
        print(f"{'case':60s} {'GB/s':>8s}  vs raw -> DeviceBuffer")
        for src_name in ("d2d", "h2d"):
            base = res[f"{src_name} raw -> DeviceBuffer"]
            for key, t in res.items():
                if key.startswith(src_name):
                    print(f"{key:60s} {reps * n / t / 1e9:8.1f}  {base / t:6.3f}x")
        for obj in reversed(keep):
            obj.close()
        dsrc.close()
        hsrc.close()


if __name__ == "__main__":
    main()
