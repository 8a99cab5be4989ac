"""The driver core and the internals every memory kind shares.

Errors and the driver gateway (``_errors``, ``_driver``: the only module that
calls the backend, and its reset hooks), argument checks (``_checks``), the
resource base and the allocation ledger (``_resource``), the buffer contract
(``_buffer``), devices (``_device``), primary contexts and releases
(``_context``), streams (``_stream``), memory locations (``_location``), peer
access (``_peer``), the access vocabulary of grants (``_access``), array
interop (``_interop``, ``_dlpack``), copy operands (``_operands``), copies in
flight (``_inflight``), the pinned-host registry (``_host_registry``),
pointer queries (``_pointers``) and what the OS says of the host (``_host_os``, a
leaf the simulator reads too).
"""
