"""The simulated machine: devices, contexts, streams and the allocation table.

Every simulated driver function is wrapped by :func:`api`, which gives it the
bindings' return form ``(CUresult, *outputs)`` with ``None`` outputs on
failure. Inside, failures are raised as :class:`Fail`.

Memory model
------------
* Host-accessible memory (pinned, managed, registered) is real, page-aligned
  host memory; its simulated address *is* its host address, so numpy views
  over it work.
* Device-only memory gets addresses in a window above the 47-bit user address
  space (never host-dereferenceable); copies and memsets resolve them through
  the allocation table to a private backing buffer.
* Streams complete their work immediately (a valid CUDA ordering).
"""

from __future__ import annotations

import bisect
import ctypes
import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar

import numpy as np
from cuda.bindings import driver as cu

R: TypeAlias = cu.CUresult
SUCCESS = R.CUDA_SUCCESS
PAGE = 4096
#: Device-only addresses start here (above the 47-bit user address space).
DEVICE_VA_BASE = 0x0001_0000_0000_0000
DEVICE_VA_END = 0x0002_0000_0000_0000
GiB = 1 << 30
#: Handles of contexts made by ``cuCtxCreate`` start here (primary contexts:
#: ``0x7C00_0000 + ordinal * 0x1000``).
CREATED_CTX_BASE = 0x7D00_0000
#: ``Machine.ext`` key of the live ``cuCtxCreate`` contexts (handle -> device
#: ordinal), counted by the leak check like every other table.
CONTEXTS = "ctx.contexts"

# -- a destroyed context left current on a thread -----------------------------------------
# ``cuCtxDestroy`` leaves the context current on the *other* threads it was
# current to. What the H100 answers then (scripts/probes/invalid_context_probe.py,
# situation "destroyed_elsewhere"): every call that needs a
# context (``Machine.need_ctx``: cuCtxSynchronize, cuEventCreate, cuMemAlloc,
# cuMemGetInfo, cuStreamQuery of the legacy stream) fails with
# CUDA_ERROR_CONTEXT_IS_DESTROYED, and so do these release calls (below), while
# cuMemFreeAsync on a live stream, cuMemRelease, cuMemUnmap, cuMemAddressFree,
# cuMemPoolDestroy, cuStreamDestroy, cuEventDestroy, cuCtxGetDevice,
# cuMemAddressReserve and cuPointerGetAttribute succeed. cuMemFreeAsync on the
# legacy stream fails too (sim/_pool.py). With the device's primary context
# pushed, every failing release succeeds.
STALE_CONTEXT_ERROR = R.CUDA_ERROR_CONTEXT_IS_DESTROYED
STALE_CONTEXT_CHECKED = frozenset({"cuMemFree", "cuMemFreeHost", "cuMemHostUnregister"})


class Fail(Exception):
    """Raised inside a simulated call to return ``code``."""

    def __init__(self, code: cu.CUresult) -> None:
        super().__init__(code.name)
        self.code = code


class FunctionNotFoundError(RuntimeError):
    """Mimics cuda.bindings' error for a function the driver lacks."""


@dataclass
class SimDevice:
    ordinal: int
    name: str
    total_mem: int
    used: int = 0
    attrs: dict[int, int] = field(default_factory=dict)
    #: Bytes of managed pages resident on the device (whole 2 MiB blocks, ``_managed``).
    managed_used: int = 0
    #: Bytes the driver took for managed pages that have left since: kept (free memory
    #: does not rise) for the next managed pages, given back to device allocations.
    managed_cached: int = 0
    #: Its resident managed blocks ``(allocation start, block)``, least recently used first.
    lru: dict[tuple[int, int], None] = field(default_factory=dict)

    @property
    def room(self) -> int:
        """Bytes neither allocated nor holding managed pages."""
        return self.total_mem - self.used - self.managed_used - self.managed_cached


@dataclass
class Allocation:
    """One entry of the allocation table (anything with an address)."""

    start: int
    size: int
    kind: str  # "device", "pinned", "managed", "registered", "pool", "vmm", ...
    device: int  # owning device ordinal, -1 for host memory
    host: int  # real host address backing [start, start+size)
    backing: Any = None  # keeps the real memory alive
    flags: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def end(self) -> int:
        return self.start + self.size


@dataclass
class SimStream:
    handle: int
    device: int
    flags: int
    priority: int


@dataclass
class SimEvent:
    handle: int
    flags: int
    time: float = 0.0
    recorded: bool = False


def _default_attrs() -> dict[int, int]:
    """Attributes of an H100 as the probe read them (unknown ones are rejected)."""
    from ._device_attrs import H100_ATTRIBUTES

    out = {}
    for name, value in H100_ATTRIBUTES.items():
        member = getattr(cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}", None)
        if member is not None:
            out[int(member)] = value
    return out


class Machine:
    """All simulator state. One instance, :data:`MACHINE`, reset by :func:`reset`."""

    def __init__(self, devices: int = 2, memory: int = 8 * GiB, host_memory: int = 64 * GiB,
                 batch_calls: bool = True) -> None:
        self.lock = threading.RLock()
        self.initialized = False
        self.driver_version = 13000
        self.devices = [
            SimDevice(i, f"cuda_memkit simulated GPU {i}", memory, 0, _default_attrs())
            for i in range(devices)
        ]
        self.host_memory = host_memory
        self.host_used = 0
        self.batch_calls = batch_calls
        self.allocs: dict[int, Allocation] = {}
        self._starts: list[int] = []
        self._next_va = DEVICE_VA_BASE
        self.primary_retain = [0] * devices
        self.tls = threading.local()  # .ctx: current context; .stack: contexts pushed below it
        self._next_ctx = CREATED_CTX_BASE
        #: Handles of contexts destroyed by cuCtxDestroy (they may still be current
        #: on other threads); never reused.
        self.stale_ctx: dict[int, int] = {}  # destroyed created contexts -> their device
        self.streams: dict[int, SimStream] = {}
        self.events: dict[int, SimEvent] = {}
        self._next_handle = 0x5100_0000
        #: Bytes of managed blocks evicted from devices (``_managed``): ``evicted`` =
        #: ``written_back`` (the only copy went back to the host) + ``dropped``
        #: (read-mostly duplicates and blocks another copy of which was valid).
        self.managed_evictions = {"evicted": 0, "written_back": 0, "dropped": 0}
        # Feature modules keep their own tables here (name -> anything).
        self.ext: dict[str, Any] = {}
        #: Injected failures: API name -> codes its next calls return (see fail_next).
        self.faults: dict[str, list[cu.CUresult]] = {}

    # -- injected failures -----------------------------------------------------
    def fail_next(self, api_name: str, code: cu.CUresult, times: int = 1) -> None:
        """Make the next ``times`` calls of ``api_name`` return ``code`` and do nothing.

        For tests of paths the real driver takes rarely (a release that fails
        in a finalizer, an allocation that fails in the middle of a multi-step
        operation). ``faults.clear()`` removes what was not used.
        """
        self.faults.setdefault(api_name, []).extend([code] * times)

    # -- handles ---------------------------------------------------------------
    def new_handle(self) -> int:
        self._next_handle += 0x10
        return self._next_handle

    # -- contexts --------------------------------------------------------------
    @staticmethod
    def ctx_handle(ordinal: int) -> int:
        return 0x7C00_0000 + ordinal * 0x1000

    def ctx_device(self, ctx: int) -> int | None:
        """The device of a live context handle (primary or created), else None."""
        created = self.ext.get(CONTEXTS)
        if created and ctx in created:
            return int(created[ctx])
        ordinal, rem = divmod(ctx - 0x7C00_0000, 0x1000)
        if rem or not 0 <= ordinal < len(self.devices):
            return None
        return ordinal

    def new_ctx(self, ordinal: int) -> int:
        """Register a new created (non-primary) context of device ``ordinal``."""
        self._next_ctx += 0x10
        h = self._next_ctx
        self.ext.setdefault(CONTEXTS, {})[h] = ordinal
        return h

    def ctx_stack(self) -> list[int]:
        """The calling thread's contexts below the current one (push/pop)."""
        stack: list[int] | None = getattr(self.tls, "stack", None)
        if stack is None:
            stack = self.tls.stack = []
        return stack

    def stale_current(self) -> bool:
        """Whether the calling thread's current context was destroyed (see STALE_CONTEXT_ERROR)."""
        return bool(self.stale_ctx) and self.current_ctx in self.stale_ctx

    @property
    def current_ctx(self) -> int:
        return int(getattr(self.tls, "ctx", 0))

    @current_ctx.setter
    def current_ctx(self, value: int) -> None:
        self.tls.ctx = value

    def need_ctx(self) -> int:
        """Return the current context's device or fail with INVALID_CONTEXT."""
        ctx = self.current_ctx
        if not ctx:
            raise Fail(R.CUDA_ERROR_INVALID_CONTEXT)
        if ctx >= CREATED_CTX_BASE:
            created = self.ext.get(CONTEXTS)
            if created and ctx in created:
                return int(created[ctx])
            if ctx in self.stale_ctx:
                raise Fail(STALE_CONTEXT_ERROR)  # as the H100 (see STALE_CONTEXT_ERROR)
            raise Fail(R.CUDA_ERROR_INVALID_CONTEXT)
        ordinal = self.ctx_device(ctx)
        if ordinal is None or self.primary_retain[ordinal] <= 0:
            raise Fail(R.CUDA_ERROR_INVALID_CONTEXT)
        return ordinal

    def device(self, ordinal: Any) -> SimDevice:
        o = int(ordinal)
        if not 0 <= o < len(self.devices):
            raise Fail(R.CUDA_ERROR_INVALID_DEVICE)
        return self.devices[o]

    # -- streams ---------------------------------------------------------------
    def stream(self, handle: Any) -> SimStream | None:
        """Resolve a stream argument; ``None`` for the default streams.

        The H100 answered ``CUDA_ERROR_INVALID_CONTEXT`` for a destroyed stream
        handle in an isolated process; in a longer-lived process using one can
        crash it (``cuMemFreeAsync`` on a stream another thread had just
        destroyed did), so cuda_memkit never does (a release holds the Stream's
        ``release_lock``) and no conformance case tries.
        """
        h = int(handle) if handle is not None else 0
        if h in (0, 1, 2):
            return None
        s = self.streams.get(h)
        if s is None:
            raise Fail(R.CUDA_ERROR_INVALID_CONTEXT)
        return s

    # -- allocation table ------------------------------------------------------
    def add(self, alloc: Allocation) -> Allocation:
        self.allocs[alloc.start] = alloc
        bisect.insort(self._starts, alloc.start)
        return alloc

    def remove(self, alloc: Allocation) -> None:
        del self.allocs[alloc.start]
        i = bisect.bisect_left(self._starts, alloc.start)
        del self._starts[i]

    def find(self, addr: int) -> Allocation | None:
        """The allocation containing ``addr`` (or starting at it, for size 0)."""
        i = bisect.bisect_right(self._starts, addr) - 1
        if i < 0:
            return None
        a = self.allocs[self._starts[i]]
        if a.start <= addr < a.end or addr == a.start:
            return a
        return None

    def reserve_va(self, size: int, align: int = 512) -> int:
        va = (self._next_va + align - 1) // align * align
        if va + size > DEVICE_VA_END:
            raise Fail(R.CUDA_ERROR_OUT_OF_MEMORY)
        self._next_va = va + size
        return va

    def host_block(self, size: int, align: int = PAGE) -> tuple[Any, int]:
        """Real, aligned host memory: (keep-alive object, address)."""
        if self.host_used + size > self.host_memory:
            raise Fail(R.CUDA_ERROR_OUT_OF_MEMORY)
        buf = np.empty(max(size, 1) + align, np.uint8)
        addr = buf.ctypes.data
        addr += (-addr) % align
        return buf, addr

    def charge(self, ordinal: int, size: int) -> None:
        """Charge ``size`` bytes of a device allocation, evicting managed pages if needed.

        Like the driver, an allocation that does not fit in what is free
        takes the memory kept for managed pages, then moves resident managed
        pages back to the host (least recently used first), rather than fail;
        it fails only if they are not enough.
        """
        dev = self.devices[ordinal]
        if size > dev.total_mem - dev.used:
            raise Fail(R.CUDA_ERROR_OUT_OF_MEMORY)
        if size > dev.room and evict_managed is not None:
            evict_managed(self, ordinal, size - dev.room)
        dev.used += size

    def device_block(self, ordinal: int, size: int) -> tuple[Any, int]:
        """Charge ``size`` bytes to a device and return (backing, real address)."""
        self.charge(ordinal, size)
        buf = np.empty(max(size, 1), np.uint8)
        return buf, buf.ctypes.data

    def uncharge(self, ordinal: int, size: int) -> None:
        self.devices[ordinal].used -= size

    def real(self, addr: int, nbytes: int) -> int:
        """Translate a simulated address range to a real host address."""
        addr = int(addr)
        if nbytes == 0:
            return 0
        if addr == 0:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        a = self.find(addr)
        if a is not None:
            if addr + nbytes > a.end or a.host == 0:
                raise Fail(R.CUDA_ERROR_INVALID_VALUE)
            return a.host + (addr - a.start)
        if DEVICE_VA_BASE <= addr < DEVICE_VA_END:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        return addr  # pageable host memory, trusted like the driver does


def host_address(obj: Any) -> int:
    """Address of a host-pointer argument (int or buffer-protocol object)."""
    if isinstance(obj, (int, np.integer)):
        return unsigned(obj)  # the bindings refuse a wider int before the call
    if isinstance(obj, np.ndarray):
        return int(obj.ctypes.data)
    iface = getattr(obj, "__array_interface__", None)
    if iface is not None:
        return int(iface["data"][0])
    mv = memoryview(obj)
    return int(np.frombuffer(mv, np.uint8).ctypes.data) if mv.nbytes else 0


def unsigned(value: Any, bits: int = 64, ctype: str | None = None) -> int:
    """An unsigned argument, refused as the bindings' C conversion refuses it.

    ``ctype`` names the C type of a typed argument (the memset values), whose
    conversion words its errors so; without it the value is a ``size_t`` or
    ``unsigned int`` that Python's int conversion reads.
    """
    v = int(value)
    if v < 0:
        raise OverflowError(f"can't convert negative value to {ctype}" if ctype
                            else f"can't convert negative int to unsigned ({bits} bits)")
    if v >= 1 << bits:
        raise OverflowError(f"value too large to convert to {ctype}" if ctype
                            else f"int too big to convert to a {bits}-bit unsigned")
    return v


def memmove(dst: int, src: int, nbytes: int) -> None:
    if nbytes:
        ctypes.memmove(dst, src, nbytes)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


#: Gives device memory held for managed pages back: ``(machine, ordinal, bytes needed)``.
#: Set by ``_managed`` when it loads (before it, no managed memory exists).
evict_managed: Callable[[Machine, int, int], None] | None = None

MACHINE = Machine(
    devices=_env_int("CUDA_MEMKIT_SIM_DEVICES", 2),
    memory=_env_int("CUDA_MEMKIT_SIM_MEMORY", 8 * GiB),
)

F = TypeVar("F", bound=Callable[..., Any])

#: Functions that work before cuInit.
NO_INIT = {"cuInit", "cuDriverGetVersion", "cuGetErrorString", "cuGetErrorName"}


def api(nout: int) -> Callable[[F], F]:
    """Give a simulated function the bindings' ``(CUresult, *outputs)`` return form."""

    def deco(fn: F) -> F:
        none = (None,) * nout
        name = fn.__name__
        needs_init = name not in NO_INIT
        stale_checked = name in STALE_CONTEXT_CHECKED

        @functools.wraps(fn)
        def wrapper(*args: Any) -> Any:
            m = MACHINE
            with m.lock:
                if needs_init and not m.initialized:
                    return (R.CUDA_ERROR_NOT_INITIALIZED, *none)
                if stale_checked and m.stale_ctx and m.current_ctx in m.stale_ctx:
                    return (STALE_CONTEXT_ERROR, *none)  # as the H100 (STALE_CONTEXT_CHECKED)
                if m.faults:
                    queued = m.faults.get(name)
                    if queued:
                        return (queued.pop(0), *none)
                try:
                    out = fn(*args)
                except Fail as f:
                    return (f.code, *none)
            if nout == 0:
                return (SUCCESS,)
            if nout == 1:
                return (SUCCESS, out)
            return (SUCCESS, *out)

        return wrapper  # type: ignore[return-value]

    return deco


def reset(devices: int = 2, memory: int = 8 * GiB, host_memory: int = 64 * GiB,
          batch_calls: bool = True) -> Machine:
    """Replace the simulated machine with a fresh one (all state is dropped)."""
    global MACHINE
    MACHINE = Machine(devices, memory, host_memory, batch_calls)
    return MACHINE


def machine() -> Machine:
    """The current simulated machine."""
    return MACHINE
