"""The driver core and the internals every memory kind shares.

Errors, the driver gateway (the only module that calls the backend), argument
checks, the resource base and the allocation ledger, the buffer contract
(``Buffer``, ``MemoryKind``), devices and streams, array interop
(``__cuda_array_interface__``, DLPack) and copy operands.
"""
