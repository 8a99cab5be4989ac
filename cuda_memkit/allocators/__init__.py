"""Plug cuda_memkit pools into CuPy and numba; the torch path.

Nothing here imports CuPy, numba or torch until a function that needs one is
called, and ``import cuda_memkit`` does not import this package.

CuPy
    :func:`cupy_allocator` (for ``cupy.cuda.set_allocator``) and
    :func:`cupy_pinned_allocator` (for ``cupy.cuda.set_pinned_memory_allocator``);
    :func:`use_with_cupy` installs them for a ``with`` block and restores
    what was there.
numba-cuda
    The External Memory Management plugin lives in
    :mod:`cuda_memkit.allocators.numba`: select it with
    ``NUMBA_CUDA_MEMORY_MANAGER=cuda_memkit.allocators.numba`` or
    ``numba.cuda.set_memory_manager(cuda_memkit.allocators.numba.MemkitNumbaManager)``;
    :func:`use_with_numba` installs it for a ``with`` block.
torch
    torch takes a custom allocator only as a compiled library
    (``torch.cuda.memory.CUDAPluggableAllocator``), which a pure-Python
    package cannot provide. Exchange memory with torch through DLPack and
    ``__cuda_array_interface__``, pass torch streams as ``stream=``, and use
    pinned :class:`~cuda_memkit.HostBuffer` memory as the source of
    ``non_blocking`` copies (see the "Frameworks" guide).
"""

from __future__ import annotations

from ._cupy import cupy_allocator, cupy_pinned_allocator, use_with_cupy
from ._numba_use import use_with_numba

__all__ = ["cupy_allocator", "cupy_pinned_allocator", "use_with_cupy", "use_with_numba"]
