"""Host cost of CopyBatch.execute's pieces on the GPU, and execute vs contiguous d2d.

Driver call costs, cuLaunchKernel with a (values, types) tuple against a packed
void** address, 65536 x 4 KiB execute (d2d) and copy_batch (h2d, auto) against
one contiguous copy, and writing 1 MiB of descriptors into numpy / pooled pinned
/ cuMemHostAlloc memory. Run from the repository root on a GPU (TREE=path:
import cuda_memkit from there).
"""

import ctypes
import os
import statistics
import sys
import time

sys.path.insert(0, os.environ.get("TREE", os.getcwd()))
import numpy as np
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _driver
from cuda_memkit._transfer import _kernels

print("tree", cm.__file__)
KiB = 1024
s = cm.Stream()
h = s.handle
n, b = 65536, 4 * KiB
total = n * b
dev_src = cm.DeviceBuffer.empty(total)
dev_dst = cm.DeviceBuffer.empty(total)
rng = np.random.default_rng(23)
d_off, s_off = rng.permutation(n) * b, rng.permutation(n) * b
batch = cm.CopyBatch().add(dev_dst, dev_src, dst_offsets=d_off, src_offsets=s_off, sizes=b)
call = _driver.call


def per(fn, k=2000):
    out = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        out.append((time.perf_counter() - t0) / k * 1e6)
    return min(out)


cus = cu.CUstream(h)
micro = {
    "call cuCtxGetCurrent": lambda: call("cuCtxGetCurrent"),
    "raw cuCtxGetCurrent": lambda: cu.cuCtxGetCurrent(),
    "call cuStreamGetDevice": lambda: call("cuStreamGetDevice", h),
    "raw cuStreamGetDevice(CUstream)": lambda: cu.cuStreamGetDevice(cus),
}
ev = call("cuEventCreate", 2)
micro["cuEventQuery"] = lambda: cu.cuEventQuery(ev)


def cd():
    e = call("cuEventCreate", 2)
    call("cuEventDestroy", e)


micro["cuEventCreate+Destroy"] = cd
micro["cuEventRecord"] = lambda: call("cuEventRecord", ev, h)
for k, fn in micro.items():
    print(f"{k:34s} {per(fn):7.3f} us", flush=True)
# launch costs: tuple params vs prebuilt void**
fn, sms = _kernels.copy_function()
src_b, dst_b = dev_src.ptr, dev_dst.ptr
# zero-block launch (n=0) so the GPU does nothing: launch cost alone
vals = (dst_b, src_b, 0, 0, 0, 4096, 0, 128)
tps = _kernels._PARAM_TYPES


def launch_tuple():
    cu.cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, cus, (vals, tps), 0)


class P(ctypes.Structure):
    _fields_ = [(f"a{i}", ctypes.c_uint64) for i in range(8)]


pv = P(*vals)
arr = (ctypes.c_void_p * 8)(*[ctypes.addressof(pv) + 8 * i for i in range(8)])
addr = ctypes.addressof(arr)


def launch_int():
    cu.cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, cus, addr, 0)


def launch_call():
    call("cuLaunchKernel", fn, 1, 1, 1, 256, 1, 1, 0, h, (vals, tps), 0)


for k, f in (
    ("launch tuple params (CUstream)", launch_tuple),
    ("launch int void** (CUstream)", launch_int),
    ("launch via _driver.call, int stream", launch_call),
):
    print(f"{k:34s} {per(f, 500):7.3f} us", flush=True)
    s.synchronize()


def med(fn, k=40):
    fn()
    s.synchronize()
    out = []
    host = []
    for _ in range(k):
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        s.synchronize()
        t2 = time.perf_counter()
        out.append(t2 - t0)
        host.append(t1 - t0)
    return statistics.median(out) * 1e6, statistics.median(host) * 1e6


def compare(cases: dict, label: str, k: int) -> None:
    """Five rounds of each case (whole call and its host part), then the ratio to contig."""
    res = {key: [] for key in cases}
    for _ in range(5):
        for key, f in cases.items():
            res[key].append(med(f, k))
    for key, v in res.items():
        w = statistics.median(x[0] for x in v)
        ho = statistics.median(x[1] for x in v)
        print(f"{key:14s} whole {w:8.1f} us host {ho:6.1f} us", flush=True)
    mine, contig = (statistics.median(x[0] for x in v) for v in res.values())
    print(f"{label}/contig bandwidth ratio {contig / mine:.3f}")


compare({
    "d2d execute": lambda: batch.execute(stream=s),
    "d2d contig": lambda: call("cuMemcpyAsync", dev_dst.ptr, dev_src.ptr, total, h),
}, "execute", 40)

# -- per call h2d (auto) and prepare's write into pinned memory
host_src = cm.HostBuffer.from_array(np.full(total, 3, np.uint8))
compare({
    "h2d auto": lambda: cm.copy_batch(
        dev_dst, host_src, dst_offsets=d_off, src_offsets=s_off, sizes=b, stream=s
    ),
    "h2d contig": lambda: call("cuMemcpyAsync", dev_src.ptr, host_src.ptr, total, h),
}, "h2d auto", 15)
dd = d_off.astype(np.int64)
pooled = cm.HostBuffer.pooled(n * 16)
pa = pooled.array.view(np.uint64)
he = cm.HostBuffer.empty(n * 16)
ha = he.array.view(np.uint64)
na = np.empty(2 * n, np.uint64)
for k, arr in (("numpy", na), ("pooled pinned", pa), ("HostBuffer.empty", ha)):

    def wr(arr=arr):
        arr[:n] = dd.view(np.uint64)
        arr[n : 2 * n] = dd.view(np.uint64)

    print(f"write 2 x 512 KiB into {k:18s} {per(wr, 200):7.1f} us", flush=True)
pooled.close()
he.close()
host_src.close()

call("cuEventDestroy", ev)
s.synchronize()
batch.close()
for o in (dev_src, dev_dst, s):
    o.close()
