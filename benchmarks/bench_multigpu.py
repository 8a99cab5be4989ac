"""Two GPUs: peer copies, scattered blocks between devices, NCCL on cuda_memkit memory.

    python benchmarks/bench_multigpu.py [--json PATH] [--quick] [--only SECTIONS]
                                        [--growable-chunks 32,whole,mapping]

(SECTIONS: a comma-separated subset of copies,blocks,sizes,nccl.) One table,
every row measured in this run (interleaved ABBA samples, medians; a sample
is the wall-clock time of issuing the work and waiting for it on both
devices), with an OK/MISS verdict on each target row:

* copies: 256 MiB from device 0 to device 1 with ``cm.copy`` (synchronous, as
  users call it) for ``DeviceBuffer``, ``PoolBuffer`` (the pool grants device
  0 access: ``peers=[0]``) and ``GrowableBuffer(peers=[0])``, against
  PyTorch's ``y.copy_(x)`` between the same devices and a raw
  ``cuMemcpyAsync`` with peer access (targets >= 0.95x PyTorch); both
  directions at once, ``copy_async`` on a stream of each device, against one
  direction (target >= 1.8x); for information the copy with peer access
  disabled (the driver stages it through host memory) and ``cuMemcpyPeerAsync``
  of a pool's memory that granted the other device nothing. With
  ``--growable-chunks`` (MiB, ``whole``, ``mapping``), also the copy into
  growable buffers of those chunk sizes and into one ``Mapping``, each beside
  a raw ``cuMemcpyAsync`` into the same memory (and into the default
  growable buffer), for information: whether the number of mappings or
  cuda_memkit's path costs the growable row.
* blocks: ``copy_batch`` of 65536 x 4 KiB from device 0 to device 1 (an
  expert-parallel token shuffle: both sides permuted), the kernel path on a
  stream of device 1 reading device 0's memory (target >= 0.8x one contiguous
  peer copy of the same bytes), and on device 0 writing device 1's, and the
  driver's batch, for information.
* sizes: peer bandwidth from 4 KiB to 1 GiB, ``cm.copy_async`` beside
  PyTorch's ``copy_(non_blocking=True)`` (a sample issues the same bytes in
  copies of that size, about 256 MiB or 64 copies, then waits).
* nccl: two processes (one per GPU, ``torch.distributed`` NCCL,
  ``NCCL_NVLS_ENABLE=0``): ``all_reduce`` bus bandwidth on device, pool,
  cached pool, growable, registrable and managed memory against
  ``torch.empty`` at 1 MiB and 256 MiB (targets >= 0.97x); with nccl4py
  installed, ``allreduce`` of ``GrowableBuffer.registrable`` memory registered
  (``register_buffer``) against unregistered, for information.

On the simulator the numbers are the simulator's (``--quick`` is implied:
small sizes, few repeats, no verdicts, no NCCL).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from bench_transfers import Table, interleaved
from harness import backend, check

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
Cases = dict[str, Callable[[], None]]


def torch_or_none() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() and torch.cuda.device_count() >= 2 else None


class Bench:
    """What the sections share: the modules, the table, the sizes, both devices' sync."""

    def __init__(self, cm: Any, raw: Any, table: Table, quick: bool, repeat: int) -> None:
        self.cm, self.raw, self.table, self.quick, self.repeat = cm, raw, table, quick, repeat
        self.torch = None if quick else torch_or_none()
        self.big = 4 * MiB if quick else 256 * MiB
        #: --growable-chunks: chunk sizes (bytes) and "mapping" for extra copies rows
        self.growable_chunks: list[str] = []

    def sync(self) -> None:
        for d in (0, 1):
            self.cm.Device(d).synchronize()

    def run(self, cases: Cases, rewarm: bool = False) -> dict[str, float]:
        return interleaved(cases, self.sync, self.repeat, rewarm=rewarm)

    def row(self, case: str, nbytes: int, t: float, base: float | None = None, vs: str = "",
            target: float | None = None, note: str = "") -> None:
        ratio = None if base is None else base / t
        self.table.add(case, gbps=nbytes / t / 1e9, ratio=ratio, vs=vs,
                       target=f">= {target}x {vs}" if target else "info",
                       ok=None if target is None or self.quick or ratio is None
                       else ratio >= target, note=note)


# -- copies between the two devices ---------------------------------------------------------


def copies(b: Bench) -> None:
    cm, torch, n = b.cm, b.torch, b.big
    keep: list[Any] = []
    src = cm.DeviceBuffer.from_array(np.ones(n, np.uint8), device=0)
    dst = cm.DeviceBuffer.empty(n, np.uint8, device=1)
    pool1 = cm.MemoryPool(1, peers=[0])
    with cm.Device(1), cm.Stream(1) as s:
        pdst = pool1.allocate(n, stream=s)
        s.synchronize()
    gdst = cm.GrowableBuffer(n, device=1, peers=[0])
    gdst.resize(n)
    mapped = growable_variants(b, n, keep)
    back_src = cm.DeviceBuffer.from_array(np.ones(n, np.uint8), device=1)
    back_dst = cm.DeviceBuffer.empty(n, np.uint8, device=0)
    s0, s1 = cm.Stream(0), cm.Stream(1)
    keep += [s0, s1, pool1, src, dst, gdst, back_src, back_dst]
    reps = 4  # copies per sample: the wait is paid once per sample

    def memkit(d: Any) -> Callable[[], None]:
        def run() -> None:
            with cm.Device(0):
                for _ in range(reps):
                    cm.copy(d, src)
        return run

    cases: Cases = {"DeviceBuffer": memkit(dst), "PoolBuffer": memkit(pdst),
                    "GrowableBuffer": memkit(gdst)}
    cases.update({label: memkit(m) for label, m in mapped.items()})
    with cm.Device(0):
        cm.Device(0).enable_peer_access(1)
        raw_copy, h0 = b.raw.cuMemcpyAsync, s0.handle

        def raw_into(ptr: int) -> Callable[[], None]:
            def run() -> None:
                for _ in range(reps):
                    check(raw_copy(ptr, src.ptr, n, h0))
            return run
        cases["raw"] = raw_into(dst.ptr)
        if b.growable_chunks:  # the driver's own copy into the same mappings
            cases["raw GrowableBuffer"] = raw_into(gdst.ptr)
            cases.update({f"raw {label}": raw_into(m.ptr) for label, m in mapped.items()})
    if torch is not None:
        x = torch.ones(n, dtype=torch.uint8, device="cuda:0")
        y = torch.empty(n, dtype=torch.uint8, device="cuda:1")

        def torch_copy() -> None:
            for _ in range(reps):
                y.copy_(x)
        cases["torch"] = torch_copy

    def one_way() -> None:
        with cm.Device(0):
            cm.copy_async(dst, src, stream=s0)

    def both_ways() -> None:
        with cm.Device(0):
            cm.copy_async(dst, src, stream=s0)
        with cm.Device(1):
            cm.copy_async(back_dst, back_src, stream=s1)

    cases["one way"], cases["both ways"] = one_way, both_ways
    res = b.run(cases, rewarm=True)
    base = res.get("torch")
    tag = f"{n >> 20} MiB device 0 -> 1"
    if base is not None:
        b.row(f"{tag}: torch y.copy_(x)", reps * n, base)
    b.row(f"{tag}: raw cuMemcpyAsync, peer access", reps * n, res["raw"],
          base, "torch" if base else "")
    for kind in ("DeviceBuffer", "PoolBuffer", "GrowableBuffer"):
        what = {"DeviceBuffer": "", "PoolBuffer": " (pool peers=[0])",
                "GrowableBuffer": " (peers=[0])"}[kind]
        b.row(f"{tag}: cm.copy {kind}{what}", reps * n, res[kind], base,
              "torch" if base else "", 0.95 if base else None,
              note="" if base else "no torch: no verdict")
    for label in mapped:
        b.row(f"{tag}: cm.copy {label}", reps * n, res[label], base, "torch" if base else "")
    if b.growable_chunks:
        for label in ("GrowableBuffer", *mapped):
            b.row(f"{tag}: raw cuMemcpyAsync into {label}", reps * n, res[f"raw {label}"],
                  base, "torch" if base else "")
    b.row(f"{tag}: copy_async one direction", n, res["one way"])
    b.row(f"{tag}: both directions at once, two streams", 2 * n, res["both ways"] / 2,
          res["one way"], "one way", 1.8)
    staged_and_ungranted(b, src, dst, n)
    pdst.free(stream=s1)
    s1.synchronize()
    for obj in reversed(keep):
        obj.close()


def growable_variants(b: Bench, n: int, keep: list[Any]) -> dict[str, Any]:
    """Device 1's memory for ``--growable-chunks``: growable buffers of other chunk sizes, and
    ``mapping`` (one ``Mapping`` of the whole copy: one physical allocation, one mapping)."""
    cm, out = b.cm, {}
    for spec in b.growable_chunks:
        if spec == "mapping":
            phys = cm.PhysicalMemory.create(n, device=1)
            rng = cm.AddressRange.reserve(n)
            m = rng.map(phys)
            m.set_access([1, 0])
            keep += [phys, rng, m]
            out["Mapping (one mapping)"] = m
            continue
        chunk = int(spec)
        g = cm.GrowableBuffer(n, device=1, peers=[0], chunk=chunk)
        g.resize(n)
        keep.append(g)
        out[f"GrowableBuffer chunk={chunk >> 20} MiB ({-(-n // chunk)} mappings)"] = g
    return out


def staged_and_ungranted(b: Bench, src: Any, dst: Any, n: int) -> None:
    """Information rows: the copy without peer access, and a pool that granted nothing."""
    cm = b.cm
    pool = cm.MemoryPool(1)
    try:
        with cm.Device(1), cm.Stream(1) as s:
            ungranted = pool.allocate(n, stream=s)
            s.synchronize()
        ctx0 = check(b.raw.cuDevicePrimaryCtxRetain(0))
        ctx1 = check(b.raw.cuDevicePrimaryCtxRetain(1))
        with cm.Device(0), cm.Stream(0) as s0:
            peer_fn, h = b.raw.cuMemcpyPeerAsync, s0.handle
            res = b.run({"ungranted": lambda: check(peer_fn(ungranted.ptr, ctx1, src.ptr, ctx0,
                                                            n, h))})
        b.row(f"{n >> 20} MiB: raw cuMemcpyPeerAsync into a pool granting nothing", n,
              res["ungranted"])
        for d in (0, 1):
            check(b.raw.cuDevicePrimaryCtxRelease(d))
        ungranted.close()
        before = cm.peer_access_settings().auto
        cm.configure_peer_access(auto=False)
        cm.Device(0).disable_peer_access(1)
        cm.Device(1).disable_peer_access(0)
        try:
            def staged() -> None:
                with cm.Device(0):
                    cm.copy(dst, src)
            res = b.run({"staged": staged})
            b.row(f"{n >> 20} MiB: cm.copy without peer access (staged by the driver)", n,
                  res["staged"])
        finally:
            cm.configure_peer_access(auto=before)
            cm.Device(0).enable_peer_access(1)  # PyTorch's rows after this use it too
            cm.Device(1).enable_peer_access(0)
    finally:
        pool.close()


# -- scattered blocks between the devices ---------------------------------------------------


def blocks(b: Bench) -> None:
    cm = b.cm
    count, size = (1024, 4 * KiB) if b.quick else (65536, 4 * KiB)
    n = count * size
    rng = np.random.default_rng(1)
    d_off, s_off = rng.permutation(count) * size, rng.permutation(count) * size
    src = cm.DeviceBuffer.from_array(rng.integers(0, 256, n, dtype=np.uint8), device=0)
    dst = cm.DeviceBuffer.empty(n, np.uint8, device=1)
    s0, s1 = cm.Stream(0), cm.Stream(1)
    pull, push = cm.CopyBatch(), cm.CopyBatch()
    for batch in (pull, push):
        batch.add(dst, src, dst_offsets=d_off, src_offsets=s_off, sizes=size)
    try:
        def on(device: int, fn: Callable[[], None]) -> Callable[[], None]:
            def run() -> None:
                with cm.Device(device):
                    fn()
            return run

        contiguous = on(1, lambda: cm.copy_async(dst, src, stream=s1))
        cases: Cases = {
            "contiguous": contiguous,
            "kernel on 1": on(1, lambda: cm.copy_batch(dst, src, dst_offsets=d_off,
                                                       src_offsets=s_off, sizes=size,
                                                       stream=s1, method="kernel")),
            "CopyBatch on 1": on(1, lambda: pull.execute(s1, method="kernel")),
            "CopyBatch on 0": on(0, lambda: push.execute(s0, method="kernel")),
            "driver on 1": on(1, lambda: cm.copy_batch(dst, src, dst_offsets=d_off,
                                                       src_offsets=s_off, sizes=size,
                                                       stream=s1, method="driver")),
        }
        res = b.run(cases, rewarm=True)
        want = src.to_numpy().reshape(count, size)[s_off // size]
        got = dst.to_numpy().reshape(count, size)[d_off // size]
        assert (got == want).all(), "the blocks did not arrive"
        tag = f"{count} x {size >> 10} KiB device 0 -> 1"
        base = res["contiguous"]
        b.row(f"{tag}: one contiguous peer copy of the same bytes", n, base)
        b.row(f"{tag}: CopyBatch kernel, stream of device 1 (reads peer memory)", n,
              res["CopyBatch on 1"], base, "contiguous", 0.8)
        b.row(f"{tag}: copy_batch kernel, stream of device 1 (checks included)", n,
              res["kernel on 1"], base, "contiguous")
        b.row(f"{tag}: CopyBatch kernel, stream of device 0 (writes peer memory)", n,
              res["CopyBatch on 0"], base, "contiguous")
        b.row(f"{tag}: copy_batch driver batch", n, res["driver on 1"], base, "contiguous")
    finally:
        for obj in (pull, push, s0, s1, src, dst):
            obj.close()


# -- peer bandwidth by copy size ------------------------------------------------------------


def sizes(b: Bench) -> None:
    cm, torch = b.cm, b.torch
    top = 16 * MiB if b.quick else GiB
    src = cm.DeviceBuffer.from_array(np.ones(top, np.uint8), device=0)
    dst = cm.DeviceBuffer.empty(top, np.uint8, device=1)
    s0 = cm.Stream(0)
    x = y = None
    if torch is not None:
        x = torch.ones(top, dtype=torch.uint8, device="cuda:0")
        y = torch.empty(top, dtype=torch.uint8, device="cuda:1")
    try:
        size = 4 * KiB
        while size <= top:
            count = max(1, min(64, (256 * MiB) // size)) if not b.quick else 4
            def memkit(size: int = size, count: int = count) -> None:
                with cm.Device(0):  # the stream's device, as a program issuing there has
                    for _ in range(count):
                        cm.copy_async(dst, src, stream=s0, nbytes=size)

            cases: Cases = {"memkit": memkit}
            if x is not None and y is not None:
                xs, ys = x[:size], y[:size]

                def torch_copy(xs: Any = xs, ys: Any = ys, count: int = count) -> None:
                    for _ in range(count):
                        ys.copy_(xs, non_blocking=True)
                cases["torch"] = torch_copy
            res = b.run(cases)
            label = f"{size >> 20} MiB" if size >= MiB else f"{size >> 10} KiB"
            base = res.get("torch")
            if base is not None:
                b.row(f"peer copies of {label}: torch copy_ (x{count})", size * count, base)
            b.row(f"peer copies of {label}: cm.copy_async (x{count})", size * count,
                  res["memkit"], base, "torch" if base else "")
            size *= 16 if size < 256 * MiB else 4
    finally:
        for obj in (s0, src, dst):
            obj.close()


# -- NCCL: two processes --------------------------------------------------------------------


NCCL_KINDS = ("torch.empty", "device", "pool", "pool_cached", "growable", "registrable",
              "managed")


def busbw(nbytes: int, seconds: float, world: int = 2) -> float:
    """all_reduce bus bandwidth, GB/s (the nccl-tests convention)."""
    return nbytes / seconds * 2 * (world - 1) / world / 1e9


def rank_main(rank: int, port: str, out: str, repeat: int) -> None:
    """One rank of the NCCL section: every kind at 1 MiB and 256 MiB, interleaved."""
    import torch
    import torch.distributed as dist

    import cuda_memkit as cm

    torch.cuda.set_device(rank)
    cm.Device(rank).set_current()
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, device_id=torch.device(f"cuda:{rank}"))
    stream = torch.cuda.current_stream()
    result: dict[str, Any] = {}
    keep: list[Any] = []
    try:
        for nbytes in (MiB, 256 * MiB):
            n = nbytes // 4
            tensors = {}
            for kind in NCCL_KINDS:
                if kind == "torch.empty":
                    tensors[kind] = torch.empty(n, dtype=torch.float32, device=f"cuda:{rank}")
                    continue
                buf = nccl_buffer(cm, kind, rank, nbytes, stream, keep)
                tensors[kind] = torch.as_tensor(buf.as_array(np.float32, (n,)),
                                                device=f"cuda:{rank}")
            reps = 200 if nbytes == MiB else 20
            times: dict[str, list[float]] = {k: [] for k in tensors}
            order = list(tensors)
            for i in range(repeat + 1):  # the first round warms up
                for kind in (order if i % 2 == 0 else order[::-1]):
                    t = tensors[kind]
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        dist.all_reduce(t)
                    torch.cuda.synchronize()
                    if i:
                        times[kind].append((time.perf_counter() - t0) / reps)
            result[str(nbytes)] = {k: busbw(nbytes, statistics.median(v))
                                   for k, v in times.items()}
            del tensors
        result["registration"] = registration(cm, dist, rank, repeat)
    finally:
        dist.destroy_process_group()
        for obj in reversed(keep):
            obj.close()
    with open(f"{out}.rank{rank}", "w") as f:
        json.dump(result, f)


def nccl_buffer(cm: Any, kind: str, rank: int, nbytes: int, stream: Any, keep: list[Any]
                ) -> Any:
    if kind == "device":
        buf = cm.DeviceBuffer.empty(nbytes, np.uint8, device=rank)
    elif kind in ("pool", "pool_cached"):
        pool = cm.MemoryPool(rank, cache=kind == "pool_cached")
        keep.append(pool)
        buf = pool.allocate(nbytes, stream=stream)
    elif kind == "growable":
        buf = cm.GrowableBuffer(nbytes, device=rank)
        buf.resize(nbytes)
    elif kind == "registrable":
        buf = cm.GrowableBuffer.registrable(nbytes, device=rank)
    else:
        buf = cm.ManagedBuffer.empty(nbytes, np.uint8)
    keep.append(buf)
    return buf


def registration(cm: Any, dist: Any, rank: int, repeat: int) -> dict[str, Any]:
    """nccl4py allreduce of registrable memory, registered against not (both ranks alike)."""
    try:
        import nccl.core as nccl
    except ImportError:
        return {"skipped": "nccl4py is not installed"}
    uid = [bytes(nccl.get_unique_id()) if rank == 0 else None]
    dist.broadcast_object_list(uid, src=0)
    comm = nccl.Communicator.init(nranks=2, rank=rank,
                                  unique_id=nccl.UniqueId.from_bytes(uid[0]))
    stream = cm.Stream(rank)
    out: dict[str, Any] = {}
    try:
        for nbytes in (MiB, 256 * MiB):
            n = nbytes // 4
            bufs = {k: cm.GrowableBuffer.registrable(nbytes, device=rank)
                    for k in ("unregistered", "registered")}
            views = {k: v.as_array(np.float32, (n,)) for k, v in bufs.items()}
            handle = comm.register_buffer(views["registered"])
            reps = 200 if nbytes == MiB else 20
            times: dict[str, list[float]] = {k: [] for k in views}
            for i in range(repeat + 1):
                for k in (list(views) if i % 2 == 0 else list(views)[::-1]):
                    stream.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        comm.allreduce(views[k], views[k], nccl.SUM, stream=stream)
                    stream.synchronize()
                    if i:
                        times[k].append((time.perf_counter() - t0) / reps)
            out[str(nbytes)] = {k: busbw(nbytes, statistics.median(v)) for k, v in times.items()}
            handle.close()
            del views
            for buf in bufs.values():
                buf.close()
    finally:
        comm.destroy()
        stream.close()
    return out


def nccl_section(b: Bench) -> None:
    if b.torch is None:
        b.table.add("nccl: all_reduce on cuda_memkit memory", target="info",
                    note="needs torch with NCCL and two GPUs: not run")
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"bench_multigpu_{os.getpid()}")
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               NVSHMEM_DISABLE_NVLS="1")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(r),
                               port, out, str(b.repeat)], env=env) for r in (0, 1)]
    for p in procs:
        try:
            p.wait(timeout=400)
        except subprocess.TimeoutExpired:
            p.kill()
    if any(p.returncode for p in procs):
        b.table.add("nccl: all_reduce on cuda_memkit memory", target="info",
                    note=f"a rank failed (exit codes {[p.returncode for p in procs]})")
        return
    with open(f"{out}.rank0") as f:
        res = json.load(f)
    for r in (0, 1):
        os.remove(f"{out}.rank{r}")
    for nbytes in (MiB, 256 * MiB):
        row = res[str(nbytes)]
        base = row["torch.empty"]
        tag = f"all_reduce {nbytes >> 20} MiB, 2 ranks, bus bandwidth"
        b.table.add(f"{tag}: torch.empty", gbps=base, target="info")
        for kind in NCCL_KINDS[1:]:
            ratio = row[kind] / base
            b.table.add(f"{tag}: {kind}", gbps=row[kind], ratio=ratio, vs="torch.empty",
                        target=">= 0.97x torch.empty", ok=ratio >= 0.97)
    reg = res["registration"]
    if "skipped" in reg:
        b.table.add("nccl4py register_buffer", target="info", note=reg["skipped"])
        return
    for nbytes in (MiB, 256 * MiB):
        row = reg[str(nbytes)]
        tag = f"nccl4py allreduce {nbytes >> 20} MiB, registrable memory"
        b.table.add(f"{tag}: unregistered", gbps=row["unregistered"], target="info")
        b.table.add(f"{tag}: registered", gbps=row["registered"],
                    ratio=row["registered"] / row["unregistered"], vs="unregistered",
                    target="info")


SECTIONS = {"copies": copies, "blocks": blocks, "sizes": sizes, "nccl": nccl_section}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        os.environ["NCCL_NVLS_ENABLE"] = "0"
        rank_main(int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    ap.add_argument("--growable-chunks", default="",
                    help="copies section: also copy into GrowableBuffers of these chunk sizes "
                         "(MiB, comma-separated; 'whole' = one chunk for the whole copy) and "
                         "'mapping' (one Mapping), each beside the driver's own copy into it")
    args = ap.parse_args()

    import cuda_memkit as cm

    backend_name, simulated, raw = backend()
    if cm.device_count() < 2:
        print(f"bench_multigpu on backend {backend_name}: needs two devices")
        return
    quick = args.quick or simulated
    repeat = 3 if quick else 9
    table = Table()
    bench = Bench(cm, raw, table, quick, repeat)
    for spec in filter(None, args.growable_chunks.split(",")):
        spec = spec.strip()
        if spec == "mapping":
            bench.growable_chunks.append(spec)
        elif spec == "whole":
            bench.growable_chunks.append(str(bench.big))
        else:
            bench.growable_chunks.append(str(max(2, int(spec)) * MiB))
    t0 = time.perf_counter()
    for name in args.only.split(","):
        SECTIONS[name](bench)
    took = time.perf_counter() - t0
    note = "  [SIMULATED: CPU simulator, numbers are not GPU timings]" if simulated else ""
    print(f"bench_multigpu on backend {backend_name} ({cm.Device(0).name} x2), median of "
          f"{repeat} interleaved samples, wall clock incl. the wait; {took:.0f} s{note}")
    table.print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "bench_multigpu", "backend": backend_name,
                       "simulated": simulated, "device": cm.Device(0).name, "repeat": repeat,
                       "seconds": round(took, 1), "rows": table.rows}, f, indent=1)


if __name__ == "__main__":
    main()
