#!/usr/bin/env python3
"""NCCL user-buffer registration of cuda_memkit memory, two ranks (one process per GPU).

Each rank makes VMM memory the way NCCL's registration wants it (POSIX
file-descriptor handles, a multiple of the recommended granularity, an aligned
address) and a DeviceBuffer, registers each
with ``nccl4py``'s ``Communicator.register_buffer`` and times ``allreduce`` (sum of
float32) registered against unregistered at 1 MiB and 256 MiB.  The sums are
checked.  NCCL's log lines about registration (``NCCL_DEBUG_SUBSYS=REG``) go to
``nccl_reg_<rank>.log`` beside the JSON.

Usage (two GPUs, nccl4py installed; NVLink multicast stays off)::

    NCCL_NVLS_ENABLE=0 python3 scripts/probes/nccl_register_probe.py OUT.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

SIZES = (1 << 20, 256 << 20)


def busbw(nbytes: int, seconds: float, nranks: int = 2) -> float:
    """all_reduce bus bandwidth in GB/s (the nccl-tests convention)."""
    return round(nbytes / seconds * 2 * (nranks - 1) / nranks / 1e9, 2)


def rank_main(rank: int, uid_hex: str, out: str) -> None:
    import nccl.core as nccl
    import numpy as np

    import cuda_memkit as cm

    cm.Device(rank).set_current()
    uid = nccl.UniqueId.from_bytes(bytes.fromhex(uid_hex))
    comm = nccl.Communicator.init(nranks=2, rank=rank, unique_id=uid)
    stream = cm.Stream(rank)
    rec = cm.granularity(rank, recommended=True, handle_type=cm.HandleType.POSIX_FD)
    res: dict = {"recommended_granularity": rec}
    keep: list = []
    for nbytes in SIZES:
        n = nbytes // 4
        size = -(-nbytes // rec) * rec
        phys = cm.PhysicalMemory.create(size, device=rank, handle_type=cm.HandleType.POSIX_FD)
        rng = cm.AddressRange.reserve(size, alignment=rec)
        m = rng.map(phys)
        m.set_access([rank])
        db = cm.DeviceBuffer.empty(n, np.float32, device=rank)
        arrays = {"vmm_posix_fd": m.as_array(np.float32, (n,)), "device_buffer": db}
        keep += [phys, rng, m, db]
        for kind, arr in arrays.items():
            row = {}
            for registered in (False, True):
                handle = None
                try:
                    if registered:
                        handle = comm.register_buffer(arr)
                        row["register"] = "ok"
                    buf = arr
                    cm.copy(buf, np.full(n, rank + 1, np.float32))
                    comm.allreduce(buf, buf, nccl.SUM, stream=stream)
                    stream.synchronize()
                    got = np.empty(n, np.float32)
                    cm.copy(got, buf)
                    row[f"sum_ok_{registered}"] = bool((got == 3).all())
                    reps = 20 if nbytes > 16 << 20 else 200
                    comm.allreduce(buf, buf, nccl.SUM, stream=stream)
                    stream.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        comm.allreduce(buf, buf, nccl.SUM, stream=stream)
                    stream.synchronize()
                    row[f"busbw_{'reg' if registered else 'unreg'}"] = busbw(
                        nbytes, (time.perf_counter() - t0) / reps)
                except Exception as e:  # recorded: the point of the probe
                    row[f"error_{registered}"] = f"{type(e).__name__}: {e}"[:300]
                finally:
                    if handle is not None:
                        handle.close()
            res[f"{kind} {nbytes >> 20} MiB"] = row
    comm.destroy()
    stream.close()
    for r in reversed(keep):
        close = getattr(r, "close", None)
        if close is not None:
            close()
    with open(f"{out}.rank{rank}", "w") as f:
        json.dump(res, f, indent=1)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--rank":
        rank_main(int(sys.argv[2]), sys.argv[3], sys.argv[4])
        return 0
    out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "nccl_register_probe.json")
    import nccl.core as nccl

    uid_hex = bytes(nccl.get_unique_id()).hex()
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", NCCL_DEBUG="INFO",
               NCCL_DEBUG_SUBSYS="INIT,REG")
    procs = []
    for rank in (0, 1):
        log = open(os.path.join(os.path.dirname(out), f"nccl_reg_{rank}.log"), "w")
        procs.append((subprocess.Popen([sys.executable, __file__, "--rank", str(rank), uid_hex,
                                        out], env=env, stdout=log, stderr=subprocess.STDOUT),
                      log))
    rc = 0
    for p, log in procs:
        try:
            rc |= p.wait(timeout=240)
        except subprocess.TimeoutExpired:
            p.kill()
            rc |= 124
        log.close()
    merged = {"rc": rc}
    for rank in (0, 1):
        path = f"{out}.rank{rank}"
        if os.path.exists(path):
            with open(path) as f:
                merged[f"rank{rank}"] = json.load(f)
            os.remove(path)
    with open(out, "w") as f:
        json.dump(merged, f, indent=1)
    print(json.dumps(merged, indent=1))
    return rc


if __name__ == "__main__":
    sys.exit(main())
