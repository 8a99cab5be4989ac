"""``use_with_numba``: the numba plugin for a ``with`` block, numba imported on call."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._pools._pool import MemoryPool

__all__ = ["use_with_numba"]


@contextlib.contextmanager
def use_with_numba(pool: MemoryPool | None = None, *, cache: bool = True) -> Iterator[Any]:
    """Route numba-cuda's memory through cuda_memkit inside a ``with`` block.

    Installs :class:`cuda_memkit.allocators.numba.MemkitNumbaManager` as the
    memory manager of numba's current context (and as the class numba uses for
    contexts made meanwhile), then restores both.

    Parameters
    ----------
    pool : MemoryPool, optional
        The device (or managed) pool for numba's device arrays; default: the
        pool :func:`cuda_memkit.allocators.numba.get_pool` gives (the device's
        default pool unless ``set_pool`` chose another). It must belong to
        numba's current device.
    cache : bool, default True
        Device memory from the default pools goes through the process's
        block cache in front of them (see
        :func:`cuda_memkit.allocators.numba.set_caching`); ``False``: every
        allocation and free calls the driver.

    Yields
    ------
    MemkitNumbaManager
        The manager installed.

    Raises
    ------
    TypeError, ValueError
        For a bad, closed or host pool, or one of another device, before
        numba's manager is touched.
    ModuleNotFoundError
        If numba-cuda is not installed.

    Notes
    -----
    Memory allocated inside the block stays valid after it; it is freed when
    numba drops it. For the whole process, set
    ``NUMBA_CUDA_MEMORY_MANAGER=cuda_memkit.allocators.numba`` instead.
    """
    if not isinstance(cache, bool):
        raise TypeError(f"cache must be a bool, not {type(cache).__name__}")
    if pool is not None:
        import cuda_memkit as cm

        if not isinstance(pool, cm.MemoryPool):  # before numba is imported
            raise TypeError(f"pool must be a cuda_memkit.MemoryPool or None, not "
                            f"{type(pool).__name__}")
    try:
        plugin = importlib.import_module("cuda_memkit.allocators.numba")
    except ImportError as exc:
        if exc.name is not None and exc.name.startswith("numba"):
            raise ModuleNotFoundError("cuda_memkit.allocators needs numba-cuda for this "
                                      "(pip install numba-cuda)") from exc
        raise
    with plugin.use(pool, cache) as manager:
        yield manager
