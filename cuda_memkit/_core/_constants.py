"""Driver values that more than one module tests for, named once.

The numbers are the stable ABI values of ``cuda.h``; only ``_driver`` calls
``cuda.bindings``, so the modules above it compare and pass plain ints.
"""

from __future__ import annotations

__all__ = [
    "CONTEXT_IS_DESTROYED",
    "EVENT_DISABLE_TIMING",
    "INVALID_CONTEXT",
    "INVALID_VALUE",
    "LEGACY_STREAMS",
    "MEMHOSTALLOC_PORTABLE",
    "MEMHOSTREGISTER_READ_ONLY",
    "MEMHOST_DEVICEMAP",
    "PEER_ACCESS_ALREADY_ENABLED",
    "PEER_ACCESS_NOT_ENABLED",
    "PEER_ACCESS_UNSUPPORTED",
    "STREAM_LEGACY",
    "STREAM_NON_BLOCKING",
    "STREAM_PER_THREAD",
    "TOO_MANY_PEERS",
]

# -- CUresult codes --------------------------------------------------------------------

#: ``CUDA_ERROR_INVALID_VALUE``: the driver refused an argument.
INVALID_VALUE = 1
#: ``CUDA_ERROR_INVALID_CONTEXT``: the calling thread has no current context.
INVALID_CONTEXT = 201
#: ``CUDA_ERROR_CONTEXT_IS_DESTROYED``: another thread destroyed the current context.
CONTEXT_IS_DESTROYED = 709
#: ``CUDA_ERROR_PEER_ACCESS_UNSUPPORTED``: the two devices have no peer path.
PEER_ACCESS_UNSUPPORTED = 217
#: ``CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED``: enabling twice (success for cuda_memkit).
PEER_ACCESS_ALREADY_ENABLED = 704
#: ``CUDA_ERROR_PEER_ACCESS_NOT_ENABLED``: disabling what is not enabled.
PEER_ACCESS_NOT_ENABLED = 705
#: ``CUDA_ERROR_TOO_MANY_PEERS``: the device's peer mappings are used up.
TOO_MANY_PEERS = 711

# -- stream handles and flags ----------------------------------------------------------

#: ``CU_STREAM_LEGACY``: the legacy default stream handle.
STREAM_LEGACY = 0x1
#: ``CU_STREAM_PER_THREAD``: the per-thread default stream handle.
STREAM_PER_THREAD = 0x2
#: The handles that name the legacy default stream (``0`` and ``CU_STREAM_LEGACY``).
LEGACY_STREAMS = (0, STREAM_LEGACY)
#: ``CU_STREAM_NON_BLOCKING``: no implicit synchronisation with the legacy stream.
STREAM_NON_BLOCKING = 0x1
#: ``CU_EVENT_DISABLE_TIMING``: an event used only for ordering.
EVENT_DISABLE_TIMING = 0x2

# -- host allocation and registration flags --------------------------------------------

#: ``CU_MEMHOSTALLOC_PORTABLE``: pinned for every context, not only the current one.
MEMHOSTALLOC_PORTABLE = 0x1
#: ``CU_MEMHOSTALLOC_DEVICEMAP``, equal to ``CU_MEMHOSTREGISTER_DEVICEMAP``.
MEMHOST_DEVICEMAP = 0x2
#: ``CU_MEMHOSTREGISTER_READ_ONLY``.
MEMHOSTREGISTER_READ_ONLY = 0x8
