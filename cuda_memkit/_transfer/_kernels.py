"""The block-copy kernel behind ``copy_batch(method="kernel")`` (and ``"auto"`` for small blocks).

* The kernel is CUDA C (``cuda_memkit/kernels/block_copy.cu``) compiled to PTX
  at development time (``scripts/build_kernels.py``); the package ships the
  PTX text and the driver's JIT compiles it at the first use in a context
  (``cuModuleLoadData``): no compiler and no binary at run time.
* :func:`copy_function` loads the module lazily, once per context, and caches
  the ``CUfunction`` (and the device's SM count, which sizes the grid); the
  module lives as long as its context.
* :func:`kernel_groups` decides which (destination, source) pairs of a batch
  the kernel copies: both sides must be reachable from the current context's
  device -- device or managed memory of that device, or pinned host memory
  through its device-mapped address (``cuMemHostGetDevicePointer``); pageable
  memory never is, and host to host is the driver's. ``"auto"`` takes pairs
  whose blocks as given average less than :data:`KERNEL_THRESHOLD` bytes
  (:data:`KERNEL_THRESHOLD_D2D` within device memory) and leaves the rest
  (and raw int addresses) to the driver batch; ``"kernel"`` refuses what the
  kernel cannot reach with ``ValueError`` before anything runs.
* :func:`launch` copies those pairs' blocks in one launch: their descriptors
  (:func:`prepare`: one pair's offsets with the operands as kernel bases, or
  absolute addresses) are written into a pooled pinned buffer, which the
  kernel reads in place (held until the stream has run it), and the
  kernel walks them (pinned host memory is read or written through its
  mapping, whatever the blocks' density: staging a dense span through one DMA
  measured slower, see docs/decisions.md). :class:`Resident` keeps a ``CopyBatch``'s
  descriptors on the device between executions.

A fault inside the kernel (an address it cannot read or write) is reported by
the driver at the next synchronisation as ``CUDA_ERROR_ILLEGAL_ADDRESS`` (a
:class:`~cuda_memkit.CudaError` naming that call), and leaves the context
unusable; the library only launches on operands whose extents and kinds it
checked, so only a raw int address with ``method="kernel"`` can get there.
"""

from __future__ import annotations

import ctypes
import threading
from importlib import resources
from typing import TYPE_CHECKING, Any

from cuda.bindings.driver import CUdevice_attribute, CUpointer_attribute, CUstream

from .._core import _capture, _driver
from .._core._checks import ADDRESS_END, one_of
from .._core._context import ensure_any_context
from .._core._errors import CudaError
from .._core._host_registry import is_pinned_host
from .._core._operands import DRIVER, HOST, PINNED, RAW
from .._core._peer import ensure_peer_access
from .._core._pointers import MEMORYTYPE_HOST, access_flags, memory_type, owning_device

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["KERNEL_THRESHOLD", "KERNEL_THRESHOLD_D2D", "METHODS", "Resident", "copy_function",
           "kernel_groups", "launch", "launch_prepared", "prepare"]

KiB, MiB = 1 << 10, 1 << 20

#: ``method="auto"`` copies a pair between host and device with the kernel when
#: its blocks as given (before any merge) average fewer bytes than this, else
#: with the driver batch, whose fixed cost per copy dominates small blocks only
#: (the H100 threshold probe: see docs/decisions.md).
KERNEL_THRESHOLD = 64 * KiB
#: The same for pairs within device memory, where the driver batch is slower still
#: (its copies are device-to-device copy-engine work): the kernel leads far longer.
KERNEL_THRESHOLD_D2D = 2 * MiB
#: Values of ``copy_batch(method=...)``.
METHODS = ("auto", "kernel", "driver")
#: Fewer blocks than the grid has CTAs, some larger than this: the blocks are cut
#: into pieces of at least this size, so that the copy uses every SM.
SPLIT_MIN = 64 * KiB
#: Threads per CTA; groups of 32..256 lanes of a CTA copy one block each.
THREADS = 256
#: CTAs per SM in the grid: enough resident warps to keep PCIe reads in flight;
#: the groups stride over the blocks beyond that.
CTAS_PER_SM = 8
#: The kernel's name in ``block_copy.ptx``.
ENTRY = b"memkit_copy_blocks"
_SM_COUNT_ATTR = CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
_MANAGED_ATTR = CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED
_PARAM_TYPES = (ctypes.c_void_p,) * 5 + (ctypes.c_uint64,) * 3

_lock = threading.Lock()
#: Context handle -> (module, function, SM count); modules live as long as their context.
_loaded: dict[int, tuple[Any, Any, int]] = {}
_ptx: list[bytes] = []


def ptx_image() -> bytes:
    """The shipped PTX, NUL-terminated as ``cuModuleLoadData`` reads it (read once)."""
    if not _ptx:
        text = (resources.files("cuda_memkit") / "kernels" / "block_copy.ptx").read_bytes()
        _ptx.append(text + b"\0")
    return _ptx[0]


def forget() -> None:
    """Drop the caches without unloading (the simulated machine was replaced)."""
    with _lock:
        _loaded.clear()


_driver.reset_hooks.append(forget)


def copy_function(ctx: int | None = None) -> tuple[Any, int]:
    """``(CUfunction, SM count)`` of the block-copy kernel in the current context.

    Loads the module at the first call in a context (the driver JITs the
    PTX); later calls are a dictionary look-up. ``ctx``: the current
    context's handle, when the caller has it.

    Raises
    ------
    CudaError
        From ``cuModuleLoadData`` (for example ``CUDA_ERROR_INVALID_PTX``) or
        ``cuModuleGetFunction``; nothing stays loaded then.
    """
    if ctx is None:
        ctx = int(_driver.call("cuCtxGetCurrent"))
    hit = _loaded.get(ctx)
    if hit is not None:
        return hit[1], hit[2]
    with _lock:
        hit = _loaded.get(ctx)
        if hit is None:
            mod = _driver.call("cuModuleLoadData", ptx_image())
            try:
                fn = _driver.call("cuModuleGetFunction", mod, ENTRY)
                dev = _driver.call("cuCtxGetDevice")
                sms = int(_driver.call("cuDeviceGetAttribute", _SM_COUNT_ATTR, dev))
            except BaseException:
                _driver.call("cuModuleUnload", mod)
                raise
            hit = _loaded[ctx] = (mod, fn, max(sms, 1))
    return hit[1], hit[2]


# -- which pairs the kernel copies ---------------------------------------------------


def _reach(op: Any, role: str, device: int) -> tuple[int | None, str, bool]:
    """``(address the kernel uses on device, why not if None, host memory?)`` of an operand."""
    ptr, _nbytes, _dt, kind, arr = op
    if kind == HOST and not is_pinned_host(arr):
        return None, f"the {role} is pageable host memory, which a kernel cannot reach", True
    mt = memory_type(ptr)
    if mt is None:
        return None, (f"the {role} is memory the driver does not know (pageable host "
                      "memory)"), True
    if mt == MEMORYTYPE_HOST:
        try:
            return int(_driver.call("cuMemHostGetDevicePointer", ptr, 0)), "", True
        except CudaError as e:
            return None, (f"the {role} is pinned host memory not mapped for this context "
                          f"({e})"), True
    if int(_driver.call("cuPointerGetAttribute", _MANAGED_ATTR, ptr)):
        return ptr, "", False  # managed memory: every device of the machine reaches it
    try:
        ordinal = owning_device(ptr)
        # pool or mapped memory: the access the current device was given
        flags = access_flags(ptr, device) if ordinal is None else 3
    except CudaError as e:
        return None, f"the driver does not say which device the {role} is on ({e})", False
    if ordinal is not None and ordinal != device and not ensure_peer_access(device, ordinal):
        return None, (f"the {role} is memory of device {ordinal}, which the current "
                      f"context's device {device} has no peer access to (see "
                      "Device.enable_peer_access and configure_peer_access)"), False
    need = 3 if role == "destination" else 1
    if flags & need != need:
        return None, (f"the {role} is pool or mapped memory that the current context's "
                      f"device {device} was given no {'write' if need == 3 else 'read'} "
                      "access to (MemoryPool.set_access, GrowableBuffer.set_access or "
                      "Mapping.set_access grants it)"), False
    return ptr, "", False


def check_method(method: Any) -> str:
    """``method`` checked: one of :data:`METHODS`."""
    return one_of(method, "method", METHODS)


def threshold(group: Any) -> int:
    """The ``"auto"`` block-size threshold of a pair: by whether a side is host memory."""
    host = any(op.kind in (HOST, PINNED) for op in (group.dst_op, group.src_op))
    return KERNEL_THRESHOLD if host else KERNEL_THRESHOLD_D2D


def likely(group: Any, size: int, method: str | None) -> bool:
    """Whether the kernel will most likely copy a pair of blocks all ``size`` bytes.

    Asked before the pair's merge test, from what is known without a driver
    query: the method, the operands' kinds and the size against
    :func:`threshold`. A pair it names that the kernel then refuses (memory
    it cannot reach) goes to the driver unmerged, which is correct, only
    slower.
    """
    if method == "kernel":
        return True
    if method != "auto":
        return False
    kinds = (DRIVER, PINNED)
    return (group.dst_op.kind in kinds and group.src_op.kind in kinds
            and size < threshold(group))


def kernel_groups(groups: Sequence[Any], method: str, stream: int
                  ) -> list[tuple[Any, int, int]]:
    """``(group, destination address, source address)`` of the pairs the kernel copies.

    ``groups`` are ``copy_batch``'s checked pairs (``nbytes``, ``given``, ``z``,
    ``dst_op``, ``src_op``), ``stream`` the handle the batch is issued on
    (the kernel runs in the current context, so the stream must be of its
    device). Makes only queries (pointer attributes, mapped addresses, the
    stream's device), no copy and no allocation.

    Raises
    ------
    ValueError
        With ``method="kernel"``: a side the kernel cannot reach (pageable
        host memory, memory of another device without peer access or a
        grant, unmapped pinned memory), host to host, a stream of another
        device.
    """
    live = [g for g in groups if g.nbytes]
    if method == "driver" or not live:
        return []
    if method == "auto":
        live = [g for g in live if g.dst_op.kind != RAW and g.src_op.kind != RAW
                and g.nbytes < threshold(g) * g.given]
        if not live:
            return []
    ensure_any_context()
    device = int(_driver.call("cuCtxGetDevice"))
    if _capture.active and _capture.capture_id(CUstream(stream)):
        on = device  # the driver refuses cuStreamGetDevice on a capturing stream
    else:
        on = int(_driver.call("cuStreamGetDevice", stream))
    if on != device:
        if method == "kernel":
            raise ValueError(
                f"copy_batch(method='kernel'): the stream is on device {on}, but the current "
                f"context's device is {device}; make device {on} current first")
        return []
    out = []
    for g in live:
        d, why, d_host = _reach(g.dst_op, "destination", device)
        s, why_s, s_host = _reach(g.src_op, "source", device) if d is not None else (
            None, "", False)
        if d is not None and s is not None and d_host and s_host:
            d, why = None, ("both operands are host memory: the kernel would carry every "
                            "byte over PCIe twice")
        if d is None or s is None:
            if method == "kernel":
                raise ValueError(
                    f"copy_batch(method='kernel'): {why or why_s}; use method='auto' or "
                    "'driver', or copy from a HostBuffer / register_host() memory")
            continue
        for base, need, role in ((d, g.dst_need, "destination"), (s, g.src_need, "source")):
            if base + need > ADDRESS_END:  # a mapped address of pinned memory: the kernel's
                raise ValueError(   # own base, checked like the operand's
                    f"copy_batch: the {role}'s device address 0x{base:x} + the blocks' "
                    f"{need} bytes pass 2**64")
        out.append((g, d, s))
    return out


# -- launching -----------------------------------------------------------------------------


def lanes_for(max_block: int) -> int:
    """Threads that copy one block: 128 bytes per lane, a power of two from 32 to THREADS.

    Eight 16-byte vectors per lane rather than one: small blocks copied by
    one warp each ran faster than by 256 lanes each, which wait together on
    each block's descriptor (docs/decisions.md).
    """
    want = max(1, -(-max_block // 128))
    return min(THREADS, max(32, 1 << (want - 1).bit_length()))


class Prepared:
    """One launch's descriptors, built on the host: see :func:`prepare`."""

    __slots__ = ("bases", "desc", "grid", "lanes", "n", "size")

    def __init__(self, desc: Any, n: int, size: int, lanes: int, grid: int,
                 bases: tuple[int, int]) -> None:
        #: ``[dst offsets | src offsets | sizes unless uniform]`` (uint64).
        self.desc = desc
        self.n, self.size, self.lanes, self.grid, self.bases = n, size, lanes, grid, bases

    def params(self, base: int) -> tuple[tuple[int, ...], tuple[Any, ...]]:
        """``cuLaunchKernel``'s parameters with the descriptors at device address ``base``."""
        n = self.n
        sizes = 0 if self.size else base + 16 * n
        return ((self.bases[0], self.bases[1], base, base + 8 * n, sizes, self.size, n,
                 self.lanes), _PARAM_TYPES)


def prepare(picked: Sequence[tuple[Any, int, int]], sms: int,
            alloc: Callable[[int], Any] | None = None) -> Prepared:
    """The descriptors of ``picked`` (from :func:`kernel_groups`) and the launch geometry.

    One pair (the common case) gives its offsets as they are, with the two
    operand addresses as the kernel's bases; several pairs give absolute
    addresses (bases 0). Equal sizes are one kernel parameter, not an array.
    ``alloc(words)`` gives the uint64 array the descriptors are written to
    (default: a new numpy array), also for the pieces of blocks cut up.
    """
    import numpy as np

    u = np.uint64
    z = picked[0][0].z if len(picked) == 1 else np.concatenate([g.z for g, _, _ in picked])
    n = len(z)
    first = int(z[0])
    # a pair of one block size (unmerged) says so: no pass over the sizes
    uniform = (len(picked) == 1 and getattr(picked[0][0], "size", 0) == first) or bool(
        (z == first).all())
    desc = np.empty((2 if uniform else 3) * n, u) if alloc is None else alloc(
        (2 if uniform else 3) * n)
    if len(picked) == 1:
        g, d, s = picked[0]
        desc[:n] = g.d.view(u)  # offsets are >= 0: the view is exact
        desc[n:2 * n] = g.s.view(u)
        bases = (d, s)
    else:
        at = 0
        for g, d, s in picked:
            k = len(g.z)
            np.add(g.d.view(u), u(d), out=desc[at:at + k])
            np.add(g.s.view(u), u(s), out=desc[n + at:n + at + k])
            at += k
        bases = (0, 0)
    if not uniform:
        desc[2 * n:] = z
    if n < sms * CTAS_PER_SM and int(z.max()) > SPLIT_MIN:
        desc, z = _split(desc, z, n, uniform, sms, alloc)
        n = len(z)
        first = int(z[0])
        uniform = bool((z == first).all())
    lanes = lanes_for(first if uniform else int(z.max()))
    grid = max(1, min(-(-n // (THREADS // lanes)), sms * CTAS_PER_SM))
    return Prepared(desc, n, first if uniform else 0, lanes, grid, bases)


def _split(desc: Any, z: Any, n: int, uniform: bool, sms: int,
           alloc: Callable[[int], Any] | None = None) -> tuple[Any, Any]:
    """Few large blocks cut into pieces, so that every CTA of the grid has work.

    Pieces are a multiple of 16 bytes (each keeps its block's alignment
    modulo 16, so the kernel still moves 16-byte vectors) and at least
    :data:`SPLIT_MIN`; about two per CTA. Returns the new descriptors (from
    ``alloc`` when given; sizes only where they differ) and the sizes.
    """
    import numpy as np

    u = np.uint64
    z = z.astype(u)
    want = 2 * sms * CTAS_PER_SM
    piece = max(SPLIT_MIN, -(-int(z.sum()) // want))
    piece = -(-piece // 16) * 16
    k = (z + u(piece - 1)) // u(piece)  # pieces per block
    idx = np.repeat(np.arange(n), k.astype(np.int64))
    first = np.concatenate(([0], np.cumsum(k)[:-1])).astype(np.int64)
    off = (np.arange(len(idx)) - np.repeat(first, k.astype(np.int64))).astype(u) * u(piece)
    m = len(idx)
    zz = np.minimum(u(piece), z[idx] - off)
    out = np.empty(3 * m, u) if alloc is None else alloc(3 * m)
    out[:m] = desc[:n][idx] + off
    out[m:2 * m] = desc[n:2 * n][idx] + off
    out[2 * m:] = zz
    if bool((zz == zz[0]).all()):
        out = out[:2 * m]  # one size: a parameter, the sizes part unused
    return out, zz


def launch_prepared(prep: Prepared, base: int, stream: int, ctx: int | None = None,
                    params: Any = None) -> None:
    """Launch the kernel on ``stream`` over descriptors already at device address ``base``.

    ``params``: the parameters already packed (a :class:`PackedParams` of
    ``prep.params(base)``); ``ctx``: the current context's handle, if known.
    """
    fn, _sms = copy_function(ctx)
    _driver.call("cuLaunchKernel", fn, prep.grid, 1, 1, THREADS, 1, 1, 0, stream,
                 prep.params(base) if params is None else params.address, 0)


class PackedParams:
    """``cuLaunchKernel``'s parameter array (``void**``) built once, for repeated launches.

    The bindings pack a ``(values, types)`` tuple into a fresh C array at every
    launch; a prebuilt batch passes the address of this one instead.
    """

    __slots__ = ("address", "key", "pointers", "values")

    def __init__(self, prep: Prepared, base: int) -> None:
        values, types = prep.params(base)
        self.key = (base, prep.bases)
        self.values = [t(v) for v, t in zip(values, types, strict=True)]
        self.pointers = (ctypes.c_void_p * len(values))(
            *[ctypes.addressof(v) for v in self.values])
        self.address = ctypes.addressof(self.pointers)


def launch(picked: Sequence[tuple[Any, int, int]], stream: int, held: list[Any]) -> None:
    """Copy the blocks of ``picked`` (from :func:`kernel_groups`) in one launch on ``stream``.

    The descriptors are written into a pooled pinned buffer, appended to
    ``held`` before the launch, which the kernel reads in place (pool memory
    of ``Location.host()`` has one address on the host and every device): the
    caller holds it until the stream has run the kernel. No device copy of
    them is made: the stream would wait for its allocation and upload longer
    than the kernel spends reading them over PCIe (docs/decisions.md).

    Raises
    ------
    CudaError
        The failing call's error: loading the module, the pinned buffer, or
        ``cuLaunchKernel``. A fault inside the kernel surfaces at the next
        synchronisation instead.
    """
    if not picked:
        return
    import numpy as np

    from .._host._pinned import HostBuffer

    _fn, sms = copy_function()

    def pinned(words: int) -> Any:
        buf = HostBuffer.pooled(words * 8)
        held.append(buf)
        return buf.array.view(np.uint64)

    prep = prepare(picked, sms, pinned)
    if _capture.active:  # a captured launch reads them at every launch of its graph
        _capture.keep_for_graph(stream, list(held))
    launch_prepared(prep, int(prep.desc.ctypes.data), stream)


class Resident:
    """A :class:`~cuda_memkit.CopyBatch`'s descriptors kept on the device between executions.

    Built at the first kernel execution (one synchronous upload into a
    :class:`~cuda_memkit.DeviceBuffer`, which carries the ledger entry and the
    finalizer), reused while the same pairs go to the kernel at the same
    addresses in the same context, rebuilt when that changes. The descriptors
    are never rewritten in place: a rebuild uploads into a new buffer, and a
    buffer a stream may still read is held by that stream's pending operands.
    """

    __slots__ = ("buf", "held", "key", "params", "prep")

    def __init__(self) -> None:
        self.key: tuple[Any, ...] | None = None
        self.prep: Prepared | None = None
        self.buf: Any = None
        self.params: PackedParams | None = None
        #: Whether a stream may still read ``buf`` (an execution not waited for).
        self.held = False

    def launch(self, picked: Sequence[tuple[Any, int, int]], stream: int, sync: bool,
               ctx: int) -> Any:
        """Launch over the resident descriptors (built or rebuilt first); returns their buffer.

        ``ctx`` is the current context's handle. Unless ``sync`` (the caller
        waits for the stream), the caller holds the returned buffer until the
        stream has run the launch (:func:`~cuda_memkit._core._inflight.keep_alive`).
        """
        from .._device_memory._device_buffer import DeviceBuffer

        single = len(picked) == 1  # one pair's descriptors are offsets: any address will do
        key = (ctx, tuple((id(g), 0 if single else d, 0 if single else s)
                          for g, d, s in picked))
        if key != self.key or self.buf is None or self.prep is None:
            self.release()
            _fn, sms = copy_function(ctx)
            prep = prepare(picked, sms)
            self.buf = DeviceBuffer.from_array(prep.desc.view("uint8"))
            self.prep, self.key = prep, key
        prep = self.prep
        if single:  # the bases may have moved (a remapped buffer): they are parameters
            prep.bases = (picked[0][1], picked[0][2])
        base = self.buf.ptr
        params = self.params
        if params is None or params.key != (base, prep.bases):
            params = self.params = PackedParams(prep, base)
        launch_prepared(prep, base, stream, ctx, params)
        self.held = self.held or not sync
        return self.buf

    def release(self) -> None:
        """Give the descriptors up: freed now, or once no stream may read them.

        After an execution not waited for, the stream's pending operands hold
        the buffer; its finalizer frees it when they are dropped.
        """
        buf, held = self.buf, self.held
        self.buf, self.prep, self.key, self.held, self.params = None, None, None, False, None
        if buf is not None and not held:
            buf.close()

    @property
    def nbytes(self) -> int:
        """Device bytes the descriptors hold (0 before the first kernel execution)."""
        return 0 if self.buf is None else int(self.buf.nbytes)
