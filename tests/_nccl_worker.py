"""One rank of the NCCL tests (``tests/test_nccl.py``): ``python -m tests._nccl_worker``.

Arguments: ``SCENARIO RANK WORLD PORT OUT``. The rank joins a
``torch.distributed`` NCCL group on ``tcp://127.0.0.1:PORT``, runs the
scenario on device ``RANK`` and writes what it saw to ``OUT.rankN`` as JSON.
Scenarios:

``collectives``  ``all_reduce``, ``all_gather_into_tensor``, ``send``/``recv`` on every
                 kind of cuda_memkit memory, through ``__cuda_array_interface__``
                 and DLPack;
``lifetime``     the documented lifetime rule, many times over: free a buffer only
                 after the collective's work was waited for (stream-ordered on the
                 stream that waited, or after that stream synchronized);
``teardown``     the process group destroyed while torch tensors still view the
                 buffers: then the buffers are read, the tensors dropped, the
                 buffers closed (twice); nothing may stay in the ledger;
``nccl4py``      NCCL user-buffer registration (nccl4py's ``register_buffer``) of
                 ``GrowableBuffer.registrable`` memory and of a DeviceBuffer.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from typing import Any

import numpy as np

import cuda_memkit as cm

N = (1 << 20) // 4  # 1 MiB of float32
KINDS = ("device", "pool", "pool_cached", "growable", "registrable", "managed")


def make(kind: str, rank: int, n: int, keep: list[Any], stream: Any) -> Any:
    """``n`` float32 of ``kind`` memory of device ``rank``; owners appended to ``keep``."""
    nbytes = 4 * n
    if kind == "device":
        buf = cm.DeviceBuffer.empty(n, np.float32, device=rank)
    elif kind in ("pool", "pool_cached"):
        pool = cm.MemoryPool(rank, cache=kind == "pool_cached")
        keep.append(pool)
        buf = pool.allocate(nbytes, stream=stream)
    elif kind == "growable":
        buf = cm.GrowableBuffer(4 * nbytes, device=rank)
        buf.resize(nbytes)
    elif kind == "registrable":
        buf = cm.GrowableBuffer.registrable(nbytes, device=rank)
    else:
        buf = cm.ManagedBuffer.empty(n, np.float32)
    keep.append(buf)
    return buf


def tensor(torch: Any, buf: Any, n: int, rank: int, via: str) -> Any:
    """A torch view of ``buf`` as ``n`` float32 (``via``: "cai" or "dlpack")."""
    view = buf.as_array(np.float32, (n,))
    if via == "dlpack":
        return torch.from_dlpack(view)
    return torch.as_tensor(view, device=f"cuda:{rank}")


def collectives(torch: Any, dist: Any, rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    stream = torch.cuda.current_stream()
    for kind in KINDS:
        for via in ("cai", "dlpack"):
            if via == "dlpack" and kind == "managed" and not _dlpack_managed(torch):
                continue
            keep: list[Any] = []
            a = make(kind, rank, N, keep, stream)
            g = make(kind, rank, N * world, keep, stream)
            r = make(kind, rank, N, keep, stream)
            ta, tg, tr = (tensor(torch, b, k, rank, via) for b, k in
                          ((a, N), (g, N * world), (r, N)))
            a.copy_from(np.full(N, rank + 1, np.float32))
            dist.all_reduce(ta)
            dist.all_gather_into_tensor(tg, ta)
            if rank == 0:
                dist.send(ta, dst=1)
            elif rank == 1:
                dist.recv(tr, src=0)
            torch.cuda.synchronize()
            total = sum(range(1, world + 1))
            ok = {"all_reduce": bool((a.to_numpy().view(np.float32) == total).all()),
                  "all_gather": bool((g.to_numpy().view(np.float32) == total).all()),
                  "recv": rank != 1 or bool((r.to_numpy().view(np.float32) == total).all())}
            del ta, tg, tr
            for obj in reversed(keep):
                obj.close()
            out[f"{kind}/{via}"] = ok
    return out


def _dlpack_managed(torch: Any) -> bool:
    """Whether torch takes DLPack's CUDA-managed device type."""
    try:
        with cm.ManagedBuffer.empty(4, np.float32) as m:
            torch.from_dlpack(m.as_array(np.float32, (4,)))
    except (BufferError, RuntimeError, TypeError, ValueError):
        return False
    return True


def lifetime(torch: Any, dist: Any, rank: int, world: int) -> dict[str, Any]:
    """The documented pattern, many times, with memory reused at once after each free.

    Five rounds under compute-sanitizer (``CUDA_MEMKIT_SANITIZER``), whose memcheck
    makes every NCCL kernel slow; fifty otherwise.
    """
    stream = torch.cuda.current_stream()
    pool = cm.MemoryPool(rank, cache=True)
    wrong = 0
    try:
        for i in range(5 if os.environ.get("CUDA_MEMKIT_SANITIZER") else 50):
            buf = pool.allocate(4 * N, stream=stream)
            t = tensor(torch, buf, N, rank, "cai")
            t.fill_(float(i + rank))
            work = dist.all_reduce(t, async_op=True)
            work.wait()  # the current stream now waits for the collective
            want = float(sum(i + r for r in range(world)))
            wrong += int((t != want).sum().item())
            del t
            buf.free(stream=stream)  # ordered after the collective on that stream
            dev = cm.DeviceBuffer.empty(N, np.float32, device=rank)
            t = tensor(torch, dev, N, rank, "dlpack")
            t.fill_(1.0)
            work = dist.all_reduce(t, async_op=True)
            work.wait()
            stream.synchronize()  # a DeviceBuffer frees at once: the stream must be done
            del t
            dev.close()
    finally:
        pool.close()
    return {"wrong": wrong}


def teardown(torch: Any, dist: Any, rank: int, world: int) -> dict[str, Any]:
    """The group destroyed under live views; buffers closed while DLPack views hold them.

    A DLPack view holds the buffer's memory past ``close()`` (the memory goes
    when the last view does); a ``__cuda_array_interface__`` consumer cannot be
    followed, so those views are dropped before their buffers are closed.
    """
    import gc

    stream = torch.cuda.current_stream()
    keep: list[Any] = []
    bufs = [make(kind, rank, N, keep, stream) for kind in KINDS]
    dl = _dlpack_managed(torch)
    vias = ["dlpack" if kind != "managed" or dl else "cai" for kind in KINDS]
    views = [tensor(torch, b, N, rank, via) for b, via in zip(bufs, vias, strict=True)]
    for t in views:
        t.fill_(1.0)
        dist.all_reduce(t)
    torch.cuda.synchronize()
    dist.destroy_process_group()  # with torch tensors still viewing every buffer
    sums = [float(b.to_numpy().view(np.float32).sum()) for b in bufs]
    for b, via in zip(bufs, vias, strict=True):
        if via == "dlpack":
            b.close()  # its release waits for the view
    torch.cuda.synchronize()
    after_close = [float(t.sum().item()) for t in views]  # the memory is still there
    del views
    gc.collect()
    for obj in reversed(keep):
        obj.close()  # the rest; the closed ones again: nothing happens
    stats = cm.memory_stats()
    live = {str(k): v.current for k, v in stats.by_kind.items() if v.current}
    return {"sums": sums, "after_close": after_close, "want": float(world * N), "live": live}


def nccl4py(torch: Any, dist: Any, rank: int, world: int) -> dict[str, Any]:
    try:
        import nccl.core as nccl
    except ImportError:
        return {"skipped": "nccl4py is not installed"}
    uid = [bytes(nccl.get_unique_id()) if rank == 0 else None]
    dist.broadcast_object_list(uid, src=0)
    comm = nccl.Communicator.init(nranks=world, rank=rank,
                                  unique_id=nccl.UniqueId.from_bytes(uid[0]))
    stream = cm.Stream(rank)
    out: dict[str, Any] = {}
    try:
        for kind in ("registrable", "device"):
            keep: list[Any] = []
            buf = make(kind, rank, N, keep, stream)
            view = buf.as_array(np.float32, (N,))
            handle = comm.register_buffer(view)
            try:
                buf.copy_from(np.full(N, rank + 1, np.float32))
                comm.allreduce(view, view, nccl.SUM, stream=stream)
                stream.synchronize()
                out[kind] = bool((buf.to_numpy().view(np.float32)
                                  == sum(range(1, world + 1))).all())
            finally:
                handle.close()
            del view
            for obj in reversed(keep):
                obj.close()
    finally:
        comm.destroy()
        stream.close()
    return out


SCENARIOS = {"collectives": collectives, "lifetime": lifetime, "teardown": teardown,
             "nccl4py": nccl4py}


def main(argv: list[str]) -> int:
    scenario, rank, world, port, out = argv[1], int(argv[2]), int(argv[3]), argv[4], argv[5]
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # never NVLink multicast
    warnings.simplefilter("error", cm.MemkitWarning)  # a failed release fails the rank
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    cm.Device(rank).set_current()
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=torch.device(f"cuda:{rank}"))
    try:
        result = SCENARIOS[scenario](torch, dist, rank, world)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    with open(f"{out}.rank{rank}", "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
