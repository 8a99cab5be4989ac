"""What the driver does when two registrations share a page (flags alike or not)."""
import ctypes
import mmap

from cuda.bindings import driver as d

d.cuInit(0)
_, dev = d.cuDeviceGet(0)
_, ctx = d.cuDevicePrimaryCtxRetain(dev)
d.cuCtxSetCurrent(ctx)
PAGE = mmap.PAGESIZE
buf = mmap.mmap(-1, 8 * PAGE)
base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
RO = 8  # CU_MEMHOSTREGISTER_READ_ONLY
cases = [
    ("same page, disjoint, 0 then 0", (0, 1024, 0), (2048, 1024, 0)),
    ("same page, disjoint, 0 then READ_ONLY", (0, 1024, 0), (2048, 1024, RO)),
    ("same page, disjoint, READ_ONLY then 0", (0, 1024, RO), (2048, 1024, 0)),
    ("same page, disjoint, RO then RO", (0, 1024, RO), (2048, 1024, RO)),
    ("overlapping bytes, 0 then 0", (0, 2048, 0), (1024, 2048, 0)),
    ("4 KiB spanning two pages, second on the tail page", (1024, 4096, 0), (PAGE + 2048, 100, 0)),
    ("tail page, 0 then RO", (1024, 4096, 0), (PAGE + 2048, 100, RO)),
]
for name, a, b in cases:
    ra = d.cuMemHostRegister(base + a[0], a[1], a[2])[0]
    rb = d.cuMemHostRegister(base + b[0], b[1], b[2])[0]
    ua = d.cuMemHostUnregister(base + a[0])[0] if ra == 0 else None
    ub = d.cuMemHostUnregister(base + b[0])[0] if rb == 0 else None
    print(f"{name:55s} first={ra.name if ra else 'ok'} second={int(rb)} {rb.name} "
          f"unreg={ua and ua.name} {ub and ub.name}")
