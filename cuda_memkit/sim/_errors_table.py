"""Driver descriptions of CUresult codes (``cuGetErrorString``).

Generated from the H100 probe (``tests/conformance/h100_probe.json``,
driver 580 / CUDA 13.0): the simulator returns the driver's own words.
"""

from __future__ import annotations

ERROR_STRINGS: dict[int, str] = {
    0: 'no error',  # CUDA_SUCCESS
    1: 'invalid argument',  # CUDA_ERROR_INVALID_VALUE
    2: 'out of memory',  # CUDA_ERROR_OUT_OF_MEMORY
    3: 'initialization error',  # CUDA_ERROR_NOT_INITIALIZED
    4: 'driver shutting down',  # CUDA_ERROR_DEINITIALIZED
    5: 'profiler disabled while using external profiling tool',  # CUDA_ERROR_PROFILER_DISABLED
    6: 'profiler not initialized: call cudaProfilerInitialize()',  # CUDA_ERROR_PROFILER_NOT_INITIALIZED
    7: 'profiler already started',  # CUDA_ERROR_PROFILER_ALREADY_STARTED
    8: 'profiler already stopped',  # CUDA_ERROR_PROFILER_ALREADY_STOPPED
    34: 'CUDA driver is a stub library',  # CUDA_ERROR_STUB_LIBRARY
    36: 'API call is not supported in the installed CUDA driver',  # CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER
    46: 'CUDA-capable device(s) is/are busy or unavailable',  # CUDA_ERROR_DEVICE_UNAVAILABLE
    100: 'no CUDA-capable device is detected',  # CUDA_ERROR_NO_DEVICE
    101: 'invalid device ordinal',  # CUDA_ERROR_INVALID_DEVICE
    102: "device doesn't have valid Grid license",  # CUDA_ERROR_DEVICE_NOT_LICENSED
    200: 'device kernel image is invalid',  # CUDA_ERROR_INVALID_IMAGE
    201: 'invalid device context',  # CUDA_ERROR_INVALID_CONTEXT
    202: 'context already current',  # CUDA_ERROR_CONTEXT_ALREADY_CURRENT
    205: 'mapping of buffer object failed',  # CUDA_ERROR_MAP_FAILED
    206: 'unmapping of buffer object failed',  # CUDA_ERROR_UNMAP_FAILED
    207: 'array is mapped',  # CUDA_ERROR_ARRAY_IS_MAPPED
    208: 'resource already mapped',  # CUDA_ERROR_ALREADY_MAPPED
    209: 'no kernel image is available for execution on the device',  # CUDA_ERROR_NO_BINARY_FOR_GPU
    210: 'resource already acquired',  # CUDA_ERROR_ALREADY_ACQUIRED
    211: 'resource not mapped',  # CUDA_ERROR_NOT_MAPPED
    212: 'resource not mapped as array',  # CUDA_ERROR_NOT_MAPPED_AS_ARRAY
    213: 'resource not mapped as pointer',  # CUDA_ERROR_NOT_MAPPED_AS_POINTER
    214: 'uncorrectable ECC error encountered',  # CUDA_ERROR_ECC_UNCORRECTABLE
    215: 'limit is not supported on this architecture',  # CUDA_ERROR_UNSUPPORTED_LIMIT
    216: 'exclusive-thread device already in use by a different thread',  # CUDA_ERROR_CONTEXT_ALREADY_IN_USE
    217: 'peer access is not supported between these two devices',  # CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
    218: 'a PTX JIT compilation failed',  # CUDA_ERROR_INVALID_PTX
    219: 'invalid OpenGL or DirectX context',  # CUDA_ERROR_INVALID_GRAPHICS_CONTEXT
    220: 'uncorrectable NVLink error detected during the execution',  # CUDA_ERROR_NVLINK_UNCORRECTABLE
    221: 'PTX JIT compiler library not found',  # CUDA_ERROR_JIT_COMPILER_NOT_FOUND
    222: 'the provided PTX was compiled with an unsupported toolchain.',  # CUDA_ERROR_UNSUPPORTED_PTX_VERSION
    223: 'PTX JIT compilation was disabled',  # CUDA_ERROR_JIT_COMPILATION_DISABLED
    224: 'the provided execution affinity is not supported',  # CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY
    225: 'the provided PTX contains unsupported call to cudaDeviceSynchronize',  # CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC
    226: 'Invalid access of peer GPU memory over nvlink or a hardware error',  # CUDA_ERROR_CONTAINED
    300: 'device kernel image is invalid',  # CUDA_ERROR_INVALID_SOURCE
    301: 'file not found',  # CUDA_ERROR_FILE_NOT_FOUND
    302: 'shared object symbol not found',  # CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND
    303: 'shared object initialization failed',  # CUDA_ERROR_SHARED_OBJECT_INIT_FAILED
    304: 'OS call failed or operation not supported on this OS',  # CUDA_ERROR_OPERATING_SYSTEM
    400: 'invalid resource handle',  # CUDA_ERROR_INVALID_HANDLE
    401: 'the operation cannot be performed in the present state',  # CUDA_ERROR_ILLEGAL_STATE
    402: 'attempted introspection would be semantically lossy',  # CUDA_ERROR_LOSSY_QUERY
    500: 'named symbol not found',  # CUDA_ERROR_NOT_FOUND
    600: 'device not ready',  # CUDA_ERROR_NOT_READY
    700: 'an illegal memory access was encountered',  # CUDA_ERROR_ILLEGAL_ADDRESS
    701: 'too many resources requested for launch',  # CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    702: 'the launch timed out and was terminated',  # CUDA_ERROR_LAUNCH_TIMEOUT
    703: 'launch uses incompatible texturing mode',  # CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING
    704: 'peer access is already enabled',  # CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
    705: 'peer access has not been enabled',  # CUDA_ERROR_PEER_ACCESS_NOT_ENABLED
    708: 'cannot set while device is active in this process',  # CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE
    709: 'context is destroyed',  # CUDA_ERROR_CONTEXT_IS_DESTROYED
    710: 'device-side assert triggered',  # CUDA_ERROR_ASSERT
    711: 'peer mapping resources exhausted',  # CUDA_ERROR_TOO_MANY_PEERS
    712: 'part or all of the requested memory range is already mapped',  # CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
    713: 'pointer does not correspond to a registered memory region',  # CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
    714: 'hardware stack error',  # CUDA_ERROR_HARDWARE_STACK_ERROR
    715: 'an illegal instruction was encountered',  # CUDA_ERROR_ILLEGAL_INSTRUCTION
    716: 'misaligned address',  # CUDA_ERROR_MISALIGNED_ADDRESS
    717: 'operation not supported on global/shared address space',  # CUDA_ERROR_INVALID_ADDRESS_SPACE
    718: 'invalid program counter',  # CUDA_ERROR_INVALID_PC
    719: 'unspecified launch failure',  # CUDA_ERROR_LAUNCH_FAILED
    720: 'too many blocks in cooperative launch',  # CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
    721: 'tensor memory not completely freed',  # CUDA_ERROR_TENSOR_MEMORY_LEAK
    800: 'operation not permitted',  # CUDA_ERROR_NOT_PERMITTED
    801: 'operation not supported',  # CUDA_ERROR_NOT_SUPPORTED
    802: 'system not yet initialized',  # CUDA_ERROR_SYSTEM_NOT_READY
    803: 'system has unsupported display driver / cuda driver combination',  # CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
    804: 'forward compatibility was attempted on non supported HW',  # CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE
    805: 'MPS client failed to connect to the MPS control daemon or the MPS server',  # CUDA_ERROR_MPS_CONNECTION_FAILED
    806: 'the remote procedural call between the MPS server and the MPS client failed',  # CUDA_ERROR_MPS_RPC_FAILURE
    807: 'MPS server is not ready to accept new MPS client requests',  # CUDA_ERROR_MPS_SERVER_NOT_READY
    808: 'the hardware resources required to create MPS client have been exhausted',  # CUDA_ERROR_MPS_MAX_CLIENTS_REACHED
    809: 'the hardware resources required to support device connections have been exhausted',  # CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED
    810: 'the MPS client has been terminated by the server',  # CUDA_ERROR_MPS_CLIENT_TERMINATED
    811: 'is using CUDA Dynamic Parallelism, but the current configuration, like MPS, does not support it',  # CUDA_ERROR_CDP_NOT_SUPPORTED
    812: 'unsupported interaction between different versions of CUDA Dynamic Parallelism',  # CUDA_ERROR_CDP_VERSION_MISMATCH
    900: 'operation not permitted when stream is capturing',  # CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    901: 'operation failed due to a previous error during capture',  # CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
    902: 'operation would result in a merge of separate capture sequences',  # CUDA_ERROR_STREAM_CAPTURE_MERGE
    903: 'capture was not ended in the same stream as it began',  # CUDA_ERROR_STREAM_CAPTURE_UNMATCHED
    904: 'capturing stream has unjoined work',  # CUDA_ERROR_STREAM_CAPTURE_UNJOINED
    905: 'dependency created on uncaptured work in another stream',  # CUDA_ERROR_STREAM_CAPTURE_ISOLATION
    906: 'operation would make the legacy stream depend on a capturing blocking stream',  # CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
    907: 'operation not permitted on an event last recorded in a capturing stream',  # CUDA_ERROR_CAPTURED_EVENT
    908: 'attempt to terminate a thread-local capture sequence from another thread',  # CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
    909: 'wait operation timed out',  # CUDA_ERROR_TIMEOUT
    910: 'the graph update was not performed because it included changes which violated constraints specific to instantiated graph update',  # CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE
    911: 'an async error has occured in external entity outside of CUDA',  # CUDA_ERROR_EXTERNAL_DEVICE
    912: 'a kernel launch error has occurred due to cluster misconfiguration',  # CUDA_ERROR_INVALID_CLUSTER_SIZE
    913: 'the function handle is not loaded when calling an API that requires a loaded function',  # CUDA_ERROR_FUNCTION_NOT_LOADED
    914: 'one or more resources passed in are not valid resource types for the operation',  # CUDA_ERROR_INVALID_RESOURCE_TYPE
    915: 'one or more resources are insufficient or non-applicable for the operation',  # CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION
    916: 'an error happened during the key rotation sequence',  # CUDA_ERROR_KEY_ROTATION
    999: 'unknown error',  # CUDA_ERROR_UNKNOWN
}
