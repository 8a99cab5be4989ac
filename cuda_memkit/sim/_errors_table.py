"""Driver descriptions of CUresult codes (``cuGetErrorString``), as the H100's driver gives them.

Regenerated from ``tests/conformance/h100_probe.json`` when that file has them.
"""

from __future__ import annotations

ERROR_STRINGS: dict[int, str] = {
    0: "no error",
    1: "invalid argument",
    2: "out of memory",
    3: "initialization error",
    4: "driver shutting down",
    100: "no CUDA-capable device is detected",
    101: "invalid device ordinal",
    201: "invalid device context",
    208: "resource already mapped",
    211: "resource not mapped",
    400: "invalid resource handle",
    500: "named symbol not found",
    600: "device not ready",
    712: "part or all of the requested memory range is already mapped",
    713: "pointer does not correspond to a registered memory region",
    800: "operation not permitted",
    801: "operation not supported",
    999: "unknown error",
}
