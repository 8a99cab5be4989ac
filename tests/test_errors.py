from __future__ import annotations

import pickle

import pytest
from cuda.bindings.driver import CUresult

import cuda_memkit as cm
from cuda_memkit._core import _driver
from cuda_memkit._core._errors import error_class


def test_every_cuResult_maps_to_a_cuda_error_class() -> None:
    for code in CUresult:
        if code == CUresult.CUDA_SUCCESS:
            continue
        cls = error_class(int(code))
        assert issubclass(cls, cm.CudaError)


@pytest.mark.parametrize(
    ("code", "cls", "also"),
    [
        (CUresult.CUDA_ERROR_OUT_OF_MEMORY, cm.CudaOutOfMemoryError, MemoryError),
        (CUresult.CUDA_ERROR_INVALID_VALUE, cm.CudaInvalidValueError, ValueError),
        (CUresult.CUDA_ERROR_NOT_SUPPORTED, cm.CudaNotSupportedError, RuntimeError),
        (CUresult.CUDA_ERROR_NOT_INITIALIZED, cm.CudaNotInitializedError, RuntimeError),
        (CUresult.CUDA_ERROR_NO_DEVICE, cm.CudaNoDeviceError, RuntimeError),
        (CUresult.CUDA_ERROR_INVALID_DEVICE, cm.CudaInvalidDeviceError, ValueError),
        (CUresult.CUDA_ERROR_INVALID_CONTEXT, cm.CudaInvalidContextError, RuntimeError),
        (CUresult.CUDA_ERROR_INVALID_HANDLE, cm.CudaInvalidHandleError, ValueError),
        (CUresult.CUDA_ERROR_NOT_PERMITTED, cm.CudaNotPermittedError, RuntimeError),
        (CUresult.CUDA_ERROR_ALREADY_MAPPED, cm.CudaAlreadyMappedError, RuntimeError),
        (CUresult.CUDA_ERROR_NOT_MAPPED, cm.CudaNotMappedError, RuntimeError),
        (CUresult.CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
         cm.CudaHostMemoryAlreadyRegisteredError, RuntimeError),
        (CUresult.CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
         cm.CudaHostMemoryNotRegisteredError, RuntimeError),
    ],
)
def test_table(code: CUresult, cls: type, also: type) -> None:
    assert error_class(int(code)) is cls
    assert issubclass(cls, also)
    assert issubclass(cls, cm.CudaError)


def test_unmapped_code_is_plain_cuda_error() -> None:
    assert error_class(int(CUresult.CUDA_ERROR_LAUNCH_FAILED)) is cm.CudaError
    assert error_class(123456) is cm.CudaError


def test_attributes_message_and_pickle() -> None:
    err = cm.CudaOutOfMemoryError(2, "cuMemAlloc", "CUDA_ERROR_OUT_OF_MEMORY", "out of memory")
    assert err.code == 2
    assert err.api == "cuMemAlloc"
    assert err.name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert str(err) == "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cm.CudaOutOfMemoryError
    assert (back.code, back.api, back.name, back.description) == (
        2, "cuMemAlloc", "CUDA_ERROR_OUT_OF_MEMORY", "out of memory")
    assert str(back) == str(err)


def test_driver_error_carries_api_name_and_description() -> None:
    with pytest.raises(cm.CudaInvalidDeviceError) as info:
        _driver.call("cuDeviceGet", 10_000)
    err = info.value
    assert err.api == "cuDeviceGet"
    assert err.name == "CUDA_ERROR_INVALID_DEVICE"
    assert err.code == int(CUresult.CUDA_ERROR_INVALID_DEVICE)
    assert err.description  # from cuGetErrorString
    assert err.description in str(err)


def test_driver_not_found_error() -> None:
    err = cm.CudaDriverNotFoundError(-1, "cuInit", description="install the driver")
    assert err.name == "CUDA_DRIVER_NOT_FOUND"
    assert isinstance(err, cm.CudaError)
    assert "install the driver" in str(err)
    assert pickle.loads(pickle.dumps(err)).name == "CUDA_DRIVER_NOT_FOUND"


def test_closed_error_is_value_error_and_warning_is_runtime_warning() -> None:
    assert issubclass(cm.ClosedError, ValueError)
    assert issubclass(cm.MemkitWarning, RuntimeWarning)
