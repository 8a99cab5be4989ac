"""RMM in the benchmarks: its resources and its CuPy allocator as timed loops.

Used by ``bench_pool.py``, ``bench_frameworks.py`` and ``bench_workload.py``.
RMM (``rmm-cu13``) is an optional benchmark dependency: where it does not
import (or on the simulator), every RMM row is written with no value and the
reason in its ``target`` ("not measured: ..."), never a number.

The resources keep their memory as the memkit pools of the same tables do:
``PoolMemoryResource`` over ``CudaMemoryResource`` with an initial pool, and
``CudaAsyncMemoryResource`` with a release threshold of UINT64_MAX.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from harness import Loop

MiB = 1 << 20
U64_MAX = (1 << 64) - 1
#: The initial size of RMM's pool resources here: room for every loop's blocks.
POOL_SIZE = 256 * MiB


def import_rmm(simulated: bool) -> tuple[Any, str]:
    """``(rmm, "")`` where RMM imports on a GPU, else ``(None, why it is not measured)``."""
    if simulated:
        return None, "not measured: RMM needs a GPU"
    try:
        import rmm
        import rmm.mr
    except Exception as exc:  # absent or broken: "not measured", never a number
        print(f"RMM not usable: {exc!r}", file=sys.stderr)
        return None, "not measured: RMM is not installed"
    return rmm, ""


def rmm_stream(rmm: Any, stream: Any) -> Any:
    """An RMM ``Stream`` over ``stream`` (an object with ``__cuda_stream__``)."""
    from rmm.pylibrmm.stream import Stream

    return Stream(obj=stream)


def device_resources(rmm: Any) -> dict[str, Any]:
    """RMM's pool and async resources on the current device, keeping their memory."""
    mr = rmm.mr
    return {"pool": mr.PoolMemoryResource(mr.CudaMemoryResource(), initial_pool_size=POOL_SIZE),
            "async": mr.CudaAsyncMemoryResource(initial_pool_size=POOL_SIZE,
                                                release_threshold=U64_MAX)}


def device_buffer_pairs(rmm: Any, resource: Any, stream: Any, nbytes: int) -> Loop:
    """A loop of ``rmm.DeviceBuffer(size=nbytes, stream=, mr=)`` made and dropped."""
    make = rmm.DeviceBuffer

    def loop(k: int) -> None:
        for _ in range(k):
            b = make(size=nbytes, stream=stream, mr=resource)
            del b

    return loop


def resource_pairs(resource: Any, stream: Any, nbytes: int) -> Loop:
    """A loop of ``resource.allocate(nbytes, stream)`` + ``deallocate(ptr, nbytes, stream)``."""
    allocate, deallocate = resource.allocate, resource.deallocate

    def loop(k: int) -> None:
        for _ in range(k):
            deallocate(allocate(nbytes, stream), nbytes, stream)

    return loop


def pinned_resources(rmm: Any) -> dict[str, Any]:
    """RMM's pinned host resource, alone and under a pool resource."""
    mr = rmm.mr
    out: dict[str, Any] = {"pinned": mr.PinnedHostMemoryResource()}
    try:
        out["pinned pool"] = mr.PoolMemoryResource(mr.PinnedHostMemoryResource(),
                                                   initial_pool_size=64 * MiB)
    except Exception as exc:  # a pool over pinned memory this RMM refuses: that row is n/a
        print(f"RMM PoolMemoryResource(PinnedHostMemoryResource()): {exc!r}", file=sys.stderr)
    return out


def cupy_allocator(rmm: Any, resource: Any) -> Callable[[int], Any]:
    """``rmm_cupy_allocator`` with ``resource`` as the current device resource when it runs.

    ``rmm_cupy_allocator`` allocates from the current device resource; the
    resource is set once here, which the other cases never use.
    """
    from rmm.allocators.cupy import rmm_cupy_allocator

    rmm.mr.set_current_device_resource(resource)
    allocator: Callable[[int], Any] = rmm_cupy_allocator
    return allocator


def restore_default_resource(rmm: Any) -> None:
    """Back to RMM's default device resource (its resources then go with their objects)."""
    rmm.mr.set_current_device_resource(rmm.mr.CudaMemoryResource())


def versions(rmm: Any) -> dict[str, str]:
    """RMM's version for the results' ``versions``."""
    return {} if rmm is None else {"rmm": getattr(rmm, "__version__", "?")}
