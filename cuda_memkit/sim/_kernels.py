"""Simulated modules and kernel launches.

``cuModuleLoadData``, ``cuModuleGetFunction``, ``cuModuleUnload`` and ``cuLaunchKernel``.
The simulator runs the kernels cuda_memkit ships (``cuda_memkit/kernels/*.ptx``)
with numpy over its allocation table, as their CUDA C does; a module may
declare other kernels, which load but cannot be launched here.

Loading: the image is PTX text (the only form cuda_memkit uses). Its
``.version`` must not exceed what the machine's driver JITs
(:data:`PTX_ISA_OF_DRIVER`: CUDA 13.0 -> 9.0; newer gives
``CUDA_ERROR_UNSUPPORTED_PTX_VERSION``); text without ``.version`` is
``CUDA_ERROR_INVALID_IMAGE``, PTX without a ``.target`` line or an entry
``CUDA_ERROR_INVALID_PTX``. Modules belong to the context current at the load
and live in ``MACHINE.ext["kernel.modules"]`` until ``cuModuleUnload``.

Launching checks the bindings' argument forms (``kernelParams`` is ``None``,
an int address of a ``void*`` array, or the ``((values...), (ctypes types...))``
pair, converted as cuda-bindings 13 converts it; ``extra`` must be an int),
then the driver's rules: an unknown function handle, or a function of a
module loaded in another context, is ``CUDA_ERROR_INVALID_HANDLE``; grid or
block dimensions of 0 or beyond the H100's limits, more than 48 KiB of
dynamic shared memory, or missing parameters are ``CUDA_ERROR_INVALID_VALUE``.
``scripts/probes/kernel_threshold_probe.py`` records the GPU's answers to the
cases that cannot crash a process (bad images, unknown names, bad
dimensions); the tests of the others are marked ``provisional``.

Execution is immediate (simulated streams complete at once). An access the
GPU would fault on -- an address in no allocation (pageable or freed memory),
a range past its allocation's end, memory of another device, a write into a
READ_ONLY registration, a VMM mapping without access, or a pinned pool's
memory on a device the pool gave no access -- makes the launch return
``CUDA_ERROR_ILLEGAL_ADDRESS`` and copies nothing. On the GPU the launch
itself succeeds and the fault is reported by the next synchronising call
(with the same code), the context is unusable afterwards, and which blocks
landed before the fault is unknown; the simulator reports it at the launch
and leaves the machine usable.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable
from typing import Any

import numpy as np
from cuda.bindings import driver as cu

from . import _state as S
from ._peer import reaches
from ._state import Allocation, Fail, R, api, memmove

__all__ = ["cuLaunchKernel", "cuModuleGetFunction", "cuModuleLoadData", "cuModuleUnload"]

MODULES = "kernel.modules"
#: Newest PTX ISA (major, minor) the simulated driver's JIT takes, by driver version.
PTX_ISA_OF_DRIVER = {13000: (9, 0), 13010: (9, 1), 13020: (9, 2)}
#: H100 launch limits (cuDeviceGetAttribute MAX_GRID_DIM_*, MAX_BLOCK_DIM_*, ...).
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS = 1024
MAX_SHARED = 48 * 1024
_HOST_KINDS = ("pinned", "registered", "host_pool")
_READ_ONLY = 0x8
_PARAM_BYTES = {"u64": 8, "s64": 8, "b64": 8, "f64": 8, "u32": 4, "s32": 4, "b32": 4,
                "f32": 4, "u16": 2, "s16": 2, "b16": 2, "u8": 1, "s8": 1, "b8": 1}
_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\(([^)]*)\)", re.S)
_PARAM = re.compile(r"\.param\s+\.(\w+)\s+\w+")
_SUPPORTED = (ctypes.c_bool, ctypes.c_char, ctypes.c_wchar, ctypes.c_byte, ctypes.c_ubyte,
              ctypes.c_short, ctypes.c_ushort, ctypes.c_int, ctypes.c_uint, ctypes.c_long,
              ctypes.c_ulong, ctypes.c_longlong, ctypes.c_ulonglong, ctypes.c_size_t,
              ctypes.c_float, ctypes.c_double)


def _table() -> dict[int, dict[str, Any]]:
    tab: dict[int, dict[str, Any]] = S.MACHINE.ext.setdefault(MODULES, {})
    return tab


def _image_text(image: Any) -> str:
    if isinstance(image, int):
        raw = ctypes.string_at(image) if image else b""
    else:
        raw = bytes(memoryview(image))
    return raw.split(b"\0", 1)[0].decode("latin-1")


def _uint(value: Any, bits: int = 32) -> int:
    if not isinstance(value, int):
        raise TypeError("an integer is required")
    if value < 0:
        raise OverflowError("can't convert negative value to unsigned int")
    if value >= 1 << bits:
        raise OverflowError("value too large to convert to unsigned int")
    return value


# -- modules ---------------------------------------------------------------------------


@api(1)
def cuModuleLoadData(image: Any) -> cu.CUmodule:
    m = S.MACHINE
    m.need_ctx()
    text = _image_text(image)
    ver = re.search(r"^\s*\.version\s+(\d+)\.(\d+)", text, re.M)
    if ver is None:
        raise Fail(R.CUDA_ERROR_INVALID_IMAGE)
    newest = PTX_ISA_OF_DRIVER.get(m.driver_version, max(PTX_ISA_OF_DRIVER.values()))
    if (int(ver.group(1)), int(ver.group(2))) > newest:
        raise Fail(R.CUDA_ERROR_UNSUPPORTED_PTX_VERSION)
    entries = {name: [_PARAM_BYTES.get(t, 8) for t in _PARAM.findall(params)]
               for name, params in _ENTRY.findall(text)}
    if not re.search(r"^\s*\.target\s+\w+", text, re.M) or not entries:
        raise Fail(R.CUDA_ERROR_INVALID_PTX)
    h = m.new_handle()
    _table()[h] = {"ctx": m.current_ctx, "entries": entries, "functions": {}}
    return cu.CUmodule(h)


def _module(hmod: Any) -> dict[str, Any]:
    rec = _table().get(int(hmod) if hmod is not None else 0)
    if rec is None:
        raise Fail(R.CUDA_ERROR_INVALID_HANDLE)
    return rec


@api(1)
def cuModuleGetFunction(hmod: Any, name: Any) -> cu.CUfunction:
    m = S.MACHINE
    m.need_ctx()
    rec = _module(hmod)
    key = name.decode() if isinstance(name, bytes) else str(name)
    if key not in rec["entries"]:
        raise Fail(R.CUDA_ERROR_NOT_FOUND)
    for fh, fname in rec["functions"].items():
        if fname == key:
            return cu.CUfunction(fh)
    fh = m.new_handle()
    rec["functions"][fh] = key
    return cu.CUfunction(fh)


@api(0)
def cuModuleUnload(hmod: Any) -> None:
    _module(hmod)
    del _table()[int(hmod)]


# -- kernel parameters, as cuda-bindings 13 packs them ------------------------------------


def _pack(value: Any, ctype: Any) -> bytes:
    """One element of the ``((values), (types))`` form, as the bindings pack it."""
    if ctype is None:
        if callable(getattr(value, "getPtr", None)):
            return ctypes.string_at(int(value.getPtr()), 8)
        raise TypeError(f"Provided argument is of type {type(value)} but expected Type "
                        "ctypes.Structure, ctypes.c_void_p or CUDA Binding structure with "
                        "getPtr() attribute")
    if ctype is ctypes.c_void_p:
        if isinstance(value, ctypes.c_void_p):
            value = value.value or 0
        elif callable(getattr(value, "getPtr", None)):
            value = int(value.getPtr())
        elif not isinstance(value, int):
            raise TypeError(f"Provided argument is of type {type(value)} but expected Type "
                            "int, ctypes.c_void_p or CUDA Binding structure with getPtr()")
        return int(value).to_bytes(8, "little")
    if ctype not in _SUPPORTED:
        raise TypeError("Unsupported type: " + str(type(ctype)))
    c = value if isinstance(value, ctype) else ctype(value)
    return ctypes.string_at(ctypes.addressof(c), ctypes.sizeof(ctype))


def _params(kernel_params: Any, sizes: list[int]) -> list[bytes] | None:
    """The parameter bytes of a launch (None: no parameters given)."""
    if kernel_params is None:
        return None
    if isinstance(kernel_params, int):
        ptrs = (ctypes.c_void_p * len(sizes)).from_address(kernel_params)
        return [ctypes.string_at(p or 0, k) for p, k in zip(ptrs, sizes, strict=True)]
    if (isinstance(kernel_params, tuple) and len(kernel_params) == 2
            and isinstance(kernel_params[0], tuple) and isinstance(kernel_params[1], tuple)):
        values, types = kernel_params
        if len(values) != len(types):
            raise TypeError("Argument 'kernelParams' has tuples with different length")
        return [_pack(v, t) for v, t in zip(values, types, strict=True)]
    raise TypeError("Argument 'kernelParams' is not a valid type: tuple[tuple[Any, ...], "
                    "tuple[Any, ...]] or PyObject implimenting Buffer Protocol or Int")


# -- what a kernel may touch ---------------------------------------------------------------


def _fault() -> Fail:
    return Fail(R.CUDA_ERROR_ILLEGAL_ADDRESS)


def _reachable(addr: int, n: int, write: bool, device: int) -> list[tuple[int, int]]:
    """Real (address, length) runs of ``[addr, addr+n)`` as a kernel on ``device`` sees it."""
    from ._vmm import real_runs

    a: Allocation | None = S.MACHINE.find(addr)
    if a is None or not a.start <= addr < a.end:
        raise _fault()  # pageable, freed or never allocated
    if (a.kind not in _HOST_KINDS and a.kind not in ("managed", "vmm")
            and a.device not in (-1, device)
            and not (a.kind == "pool" and pool_grants(a, device, write))
            and not (a.kind == "device" and reaches(device, a.device))):
        # another device's memory (a device pool's: unless it granted access; context
        # memory: unless this device has peer access to it; a mapping's: the access it
        # gives this device, checked by real_runs below)
        raise _fault()
    if a.kind == "host_pool" and not pool_grants(a, device, write):
        raise _fault()  # a pinned pool's memory is mapped only on devices given access
    if write and a.kind == "registered" and a.flags & _READ_ONLY:
        raise _fault()
    try:
        return real_runs(addr, n, write)
    except Fail:
        raise _fault() from None


def pool_grants(a: Allocation, device: int, write: bool) -> bool:
    """Whether ``device`` may read (``write``: and write) pool allocation ``a``.

    The H100 gives a device no access to a ``Location.host()`` pool's memory
    until ``cuMemPoolSetAccess`` (h100_probe: host_pool_access_dev0 0, then 3),
    nor to another device's pool's memory (conformance
    test_peer_access_default_none).
    """
    from ._pool import _PROT_RW, _lookup

    pool = _lookup(int(a.extra.get("pool", 0)))
    flags = 0 if pool is None else pool.access.get(device, 0)
    return flags == _PROT_RW or (not write and bool(flags & 1))


def _read_u64(addr: int, n: int, device: int) -> np.ndarray[Any, Any]:
    if n == 0:
        return np.zeros(0, np.uint64)
    runs = _reachable(addr, 8 * n, False, device)
    out = np.empty(n, np.uint64)
    pos = out.ctypes.data
    for real, k in runs:
        memmove(pos, real, k)
        pos += k
    return out


def _copy_blocks(device: int, block: int, args: list[bytes]) -> None:
    """``memkit_copy_blocks`` (cuda_memkit/kernels/block_copy.cu)."""
    from ._vmm import move_runs

    dst_base, src_base, dst_off, src_off, sizes, size, n, lanes = (
        int.from_bytes(a, "little") for a in args)
    if lanes == 0 or lanes & (lanes - 1) or block % lanes:
        raise RuntimeError(f"memkit_copy_blocks: lanes={lanes} does not divide the CTA of "
                           f"{block} threads; the kernel would not terminate")
    d = _read_u64(dst_off, n, device)
    s = _read_u64(src_off, n, device)
    z = _read_u64(sizes, n, device) if sizes else np.full(n, size, np.uint64)
    mask = (1 << 64) - 1
    plan = []
    for i in range(n):
        k = int(z[i])
        if not k:
            continue
        dr = _reachable((dst_base + int(d[i])) & mask, k, True, device)
        sr = _reachable((src_base + int(s[i])) & mask, k, False, device)
        plan.append((dr, sr, k))
    for dr, sr, k in plan:  # every access checked first: a fault copies nothing here
        if len(dr) == 1 and len(sr) == 1:
            memmove(dr[0][0], sr[0][0], k)
        else:
            move_runs(dr, sr, k)


#: Kernels the simulator can run: name -> fn(device, threads per CTA, parameter bytes).
KERNELS: dict[str, Callable[[int, int, list[bytes]], None]] = {
    "memkit_copy_blocks": _copy_blocks,
}


def _function(f: Any) -> tuple[dict[str, Any], str]:
    h = int(f) if f is not None else 0
    for rec in _table().values():
        name = rec["functions"].get(h)
        if name is not None:
            return rec, name
    raise Fail(R.CUDA_ERROR_INVALID_HANDLE)


def _launch(f: Any, grid: tuple[int, int, int], block: tuple[int, int, int], shared: int,
            h: int, kernel_params: Any, extra: int) -> None:
    m = S.MACHINE
    device = m.need_ctx()
    m.stream(h)
    rec, name = _function(f)
    if rec["ctx"] != m.current_ctx:
        raise Fail(R.CUDA_ERROR_INVALID_HANDLE)
    if any(not 0 < g <= lim for g, lim in zip(grid, MAX_GRID, strict=True)):
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if any(not 0 < b <= lim for b, lim in zip(block, MAX_BLOCK, strict=True)):
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    threads = block[0] * block[1] * block[2]
    if threads > MAX_THREADS or shared > MAX_SHARED:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    sizes = rec["entries"][name]
    args = _params(kernel_params, sizes)
    if extra and args is not None:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if args is None:
        if sizes:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        args = []
    if len(args) != len(sizes) or any(len(a) < k for a, k in zip(args, sizes, strict=True)):
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    run = KERNELS.get(name)
    if run is None:
        raise NotImplementedError(f"the simulator cannot run kernel {name!r}")
    params = [a[:k] for a, k in zip(args, sizes, strict=True)]
    recorder = S.capture_recorder
    if m.capturing and recorder is not None and recorder(h, lambda: run(device, threads, params)):
        return  # recorded into the capture of stream h
    run(device, threads, params)


_launch.__name__ = "cuLaunchKernel"  # so that fail_next("cuLaunchKernel") reaches it
_launch_api = api(0)(_launch)


def cuLaunchKernel(f: Any, gridDimX: Any, gridDimY: Any, gridDimZ: Any, blockDimX: Any,
                   blockDimY: Any, blockDimZ: Any, sharedMemBytes: Any, hStream: Any,
                   kernelParams: Any, extra: Any) -> Any:
    """Simulated ``cuLaunchKernel`` (see the module docstring)."""
    grid = (_uint(gridDimX), _uint(gridDimY), _uint(gridDimZ))
    block = (_uint(blockDimX), _uint(blockDimY), _uint(blockDimZ))
    shared = _uint(sharedMemBytes)
    h = 0 if hStream is None else int(hStream)
    if not isinstance(extra, int):
        raise TypeError("an integer is required")
    if not isinstance(f, (cu.CUfunction, cu.CUkernel, int)):
        raise TypeError(f"Argument 'f' is not instance of type (expected <class 'int'>, "
                        f"CUfunction or CUkernel, found {type(f)})")
    return _launch_api(f, grid, block, shared, h, kernelParams, extra)
