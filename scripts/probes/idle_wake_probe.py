"""Does idle time before a CopyBatch.execute (d2d) slow it? And the h2d per-call host phases.

Run from the repository root on a GPU (TREE=path: import cuda_memkit from there).
"""

import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.environ.get("TREE", os.getcwd()))
sys.path.insert(0, os.path.join(os.getcwd(), "scripts", "probes"))
import numpy as np

import cuda_memkit as cm
from cuda_memkit._core import _driver

print("tree", cm.__file__, flush=True)
KiB = 1024
s = cm.Stream()
h = s.handle
n, b = 65536, 4 * KiB
total = n * b
dev_src = cm.DeviceBuffer.empty(total)
dev_dst = cm.DeviceBuffer.empty(total)
host_src = cm.HostBuffer.from_array(np.full(total, 3, np.uint8))
rng = np.random.default_rng(23)
d_off, s_off = rng.permutation(n) * b, rng.permutation(n) * b
batch = cm.CopyBatch().add(dev_dst, dev_src, dst_offsets=d_off, src_offsets=s_off, sizes=b)
call = _driver.call
def ex() -> None:
    batch.execute(stream=s)


def contig() -> None:
    call("cuMemcpyAsync", dev_dst.ptr, dev_src.ptr, total, h)




def timed(fn):
    t0 = time.perf_counter()
    fn()
    s.synchronize()
    return (time.perf_counter() - t0) * 1e6


def smclk():
    return subprocess.run(
        ["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()


for label, pre in (
    ("back-to-back", None),
    ("after 300 ms idle", lambda: time.sleep(0.3)),
    ("after 30 ms idle", lambda: time.sleep(0.03)),
    ("after 300 ms idle + 1 untimed call", "warm"),
):
    for fn_name, fn in (("execute", ex), ("contig", contig)):
        out = []
        for _ in range(9):
            if pre == "warm":
                time.sleep(0.3)
                fn()
                s.synchronize()
            elif pre is not None:
                pre()
            out.append(timed(fn))
        print(
            f"{label:36s} {fn_name:8s} median {statistics.median(out):7.1f} us  "
            f"min {min(out):7.1f}",
            flush=True,
        )
print("sm clock idle now:", smclk())
# h2d per-call host phases
import kernel_host_probe as khp  # noqa: E402

t, _prep, _picked = khp.host_phases(dev_dst, host_src, d_off, s_off, b, h, 9)
print("h2d host phases us:", {k: round(v * 1e6, 1) for k, v in t.items()})
from cuda_memkit._transfer import _copy_batch  # noqa: E402


def grp():
    _copy_batch._Group(dev_dst, host_src, d_off, s_off, b, None, None, None, "auto")


try:
    grp()
    out = []
    for _ in range(9):
        t0 = time.perf_counter()
        grp()
        out.append((time.perf_counter() - t0) * 1e6)
    print("group(method=auto) us", round(statistics.median(out), 1))
except TypeError as e:
    print("no method arg:", e)
s.synchronize()
batch.close()
for o in (host_src, dev_src, dev_dst, s):
    o.close()
