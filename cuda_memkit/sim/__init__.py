"""CPU simulator of the CUDA driver, for machines without a GPU.

``cuda_memkit.sim.driver`` has the call forms and return tuples of
``cuda.bindings.driver``; :func:`reset` rebuilds the simulated machine (for
tests: number of devices, memory per device, whether batch calls exist).

For tests of failure paths, ``machine().fail_next(api, code, times=1)`` makes
the next calls of ``api`` return ``code`` without doing anything, and
``cuCtxCreate`` / ``cuCtxDestroy`` / ``cuCtxPushCurrent`` / ``cuCtxPopCurrent``
make other contexts current, or leave a destroyed one current on a thread
(``_contexts``; what calls answer then is the H100's, see
``_state.STALE_CONTEXT_ERROR``, and the conformance suite checks it).

Managed memory migrates between the host and the devices in 2 MiB blocks and
devices fill up (``_managed``): :func:`resident_bytes` says where a managed
range is now, :func:`host_access` stands for a host access the simulator
cannot see (loads and stores through numpy views), and
``machine().managed_evictions`` counts the bytes evicted from devices.
"""

from __future__ import annotations

from ._managed import host_access, resident_bytes
from ._state import GiB, Machine, machine

__all__ = ["GiB", "Machine", "host_access", "machine", "reset", "resident_bytes"]


def reset(
    devices: int = 2,
    memory: int = 8 * GiB,
    host_memory: int = 64 * GiB,
    batch_calls: bool = True,
) -> Machine:
    """Replace the simulated machine with a fresh one and return it.

    Every allocation, stream and context of the old machine is forgotten, and
    cuda_memkit's cached contexts are dropped. The new machine is already
    initialised if the old one was.

    Parameters
    ----------
    devices : int
        Number of simulated devices.
    memory : int
        Bytes of memory per device.
    host_memory : int
        Bytes of host memory pinned/managed allocations may use.
    batch_calls : bool
        Whether the batch calls exist: prefetch/discard (CUDA >= 13.0) and
        ``cuMemcpyBatchAsync``.
    """
    from .._core import _driver
    from . import _state

    was_initialized = _state.MACHINE.initialized
    m = _state.reset(devices, memory, host_memory, batch_calls)
    m.initialized = was_initialized
    _driver.machine_replaced()  # the library forgets what it kept of the old machine
    return m
