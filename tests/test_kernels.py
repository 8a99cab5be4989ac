"""The shipped kernels: PTX in step with its source; module and launch calls on both backends."""

from __future__ import annotations

import ctypes
import hashlib
import pathlib
import re
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _driver
from cuda_memkit._core._context import ensure_any_context
from cuda_memkit._transfer import _kernels

ROOT = pathlib.Path(__file__).resolve().parent.parent
KERNELS = ROOT / "cuda_memkit" / "kernels"
R = cu.CUresult
_TYPES = (ctypes.c_void_p,) * 5 + (ctypes.c_uint64,) * 3


def test_the_committed_ptx_matches_its_source() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import build_kernels
    finally:
        sys.path.pop(0)
    sources = sorted(KERNELS.glob("*.cu"))
    assert sources, "no kernel sources"
    for cu_file in sources:
        ptx = cu_file.with_suffix(".ptx")
        assert ptx.exists(), f"{ptx.name} missing: run python scripts/build_kernels.py"
        want = hashlib.sha256(cu_file.read_bytes()).hexdigest()
        assert build_kernels.recorded_sha(ptx) == want, (
            f"{ptx.name} was built from another {cu_file.name}: run python "
            "scripts/build_kernels.py")


def test_the_ptx_is_what_every_supported_driver_jits() -> None:
    text = (KERNELS / "block_copy.ptx").read_text()
    version = re.search(r"^\.version (\d+)\.(\d+)$", text, re.M)
    assert version is not None and (int(version[1]), int(version[2])) <= (9, 0)
    assert re.search(r"^\.target sm_75$", text, re.M)
    assert ".visible .entry memkit_copy_blocks(" in text
    assert text.count(".param .u64") == 8  # the launch passes 8 64-bit parameters
    assert "ld.v4.u32" in text and "st.v4.u32" in text  # 16-byte vector accesses


def test_the_package_reads_the_shipped_ptx() -> None:
    image = _kernels.ptx_image()
    assert image.endswith(b"\0") and image.count(b"\0") == 1
    assert image[:-1] == (KERNELS / "block_copy.ptx").read_bytes()


# -- the driver calls themselves (the module's own context) ----------------------------------


@pytest.fixture
def module() -> Iterator[Any]:
    ensure_any_context()
    mod = _driver.call("cuModuleLoadData", _kernels.ptx_image())
    yield mod
    _driver.call("cuModuleUnload", mod)


def _descriptors(values: list[int]) -> cm.DeviceBuffer:
    arr = np.array(values, np.uint64)
    d = cm.DeviceBuffer.empty(max(arr.nbytes, 8))
    cm.copy(d, arr, nbytes=arr.nbytes)
    return d


def test_a_raw_launch_copies_blocks(module: Any) -> None:
    fn = _driver.call("cuModuleGetFunction", module, b"memkit_copy_blocks")
    src = cm.DeviceBuffer.empty(4096)
    dst = cm.DeviceBuffer.empty(4096)
    cm.copy(src, np.arange(4096, dtype=np.uint32).astype(np.uint8))
    dst.fill(0)
    d_off = _descriptors([0, 2048])
    s_off = _descriptors([1024, 0])
    try:
        params = ((dst.ptr, src.ptr, d_off.ptr, s_off.ptr, 0, 1000, 2, 32), _TYPES)
        _driver.call("cuLaunchKernel", fn, 2, 1, 1, 256, 1, 1, 0, 0, params, 0)
        _driver.call("cuCtxSynchronize")
        got, want = dst.to_numpy(), src.to_numpy()
        assert (got[:1000] == want[1024:2024]).all() and (got[2048:3048] == want[:1000]).all()
        assert not got[1000:2048].any() and not got[3048:].any()
    finally:
        for b in (src, dst, d_off, s_off):
            b.close()


def test_an_unknown_kernel_name_is_not_found(module: Any) -> None:
    with pytest.raises(cm.CudaError) as info:
        _driver.call("cuModuleGetFunction", module, b"no_such_kernel")
    assert info.value.code == int(R.CUDA_ERROR_NOT_FOUND)


def test_the_same_name_gives_the_same_function(module: Any) -> None:
    a = _driver.call("cuModuleGetFunction", module, b"memkit_copy_blocks")
    b = _driver.call("cuModuleGetFunction", module, b"memkit_copy_blocks")
    assert int(a) == int(b)


@pytest.mark.parametrize(("grid", "block"), [((0, 1, 1), (256, 1, 1)),
                                              ((1, 1, 1), (0, 1, 1)),
                                              ((1, 1, 1), (2048, 1, 1)),
                                              ((1, 1, 1), (512, 4, 1))])
def test_bad_launch_dimensions_are_invalid_value(module: Any, grid: tuple[int, ...],
                                                 block: tuple[int, ...]) -> None:
    fn = _driver.call("cuModuleGetFunction", module, b"memkit_copy_blocks")
    params = ((0, 0, 0, 0, 0, 0, 0, 32), _TYPES)  # no blocks: nothing would be touched
    with pytest.raises(cm.CudaError) as info:
        _driver.call("cuLaunchKernel", fn, *grid, *block, 0, 0, params, 0)
    assert info.value.code == int(R.CUDA_ERROR_INVALID_VALUE)


# -- simulator answers no GPU run has confirmed, and images a GPU must not be given ----------


@pytest.mark.sim_only
@pytest.mark.provisional
@pytest.mark.parametrize(("image", "code"), [
    (b"this is not PTX\0", R.CUDA_ERROR_INVALID_IMAGE),
    (b".version 9.0\n.address_size 64\n\0", R.CUDA_ERROR_INVALID_PTX),
    (b".version 9.9\n.target sm_75\n.visible .entry k()\n{\nret;\n}\n\0",
     R.CUDA_ERROR_UNSUPPORTED_PTX_VERSION),
])
def test_bad_images(image: bytes, code: R) -> None:
    ensure_any_context()
    with pytest.raises(cm.CudaError) as info:
        _driver.call("cuModuleLoadData", image)
    assert info.value.code == int(code)


@pytest.mark.sim_only
@pytest.mark.provisional
def test_unknown_handles_are_invalid_handle(module: Any) -> None:
    with pytest.raises(cm.CudaError) as info:
        _driver.call("cuModuleGetFunction", cu.CUmodule(12345), b"memkit_copy_blocks")
    assert info.value.code == int(R.CUDA_ERROR_INVALID_HANDLE)
    with pytest.raises(cm.CudaError) as info:
        _driver.call("cuLaunchKernel", cu.CUfunction(12345), 1, 1, 1, 32, 1, 1, 0, 0,
                     ((0,) * 8, _TYPES), 0)
    assert info.value.code == int(R.CUDA_ERROR_INVALID_HANDLE)


@pytest.mark.sim_only
def test_the_bindings_argument_checks(module: Any) -> None:
    fn = _driver.call("cuModuleGetFunction", module, b"memkit_copy_blocks")
    with pytest.raises(TypeError, match="different length"):
        _driver.call("cuLaunchKernel", fn, 1, 1, 1, 32, 1, 1, 0, 0, ((0,) * 8, _TYPES[:7]), 0)
    with pytest.raises(TypeError, match="an integer is required"):
        _driver.call("cuLaunchKernel", fn, 1, 1, 1, 32, 1, 1, 0, 0, ((0,) * 8, _TYPES), None)
    with pytest.raises(TypeError, match="not a valid type"):
        _driver.call("cuLaunchKernel", fn, 1, 1, 1, 32, 1, 1, 0, 0, [0] * 8, 0)


@pytest.mark.sim_only
def test_pageable_memory_faults_in_the_simulated_kernel(module: Any) -> None:
    fn = _driver.call("cuModuleGetFunction", module, b"memkit_copy_blocks")
    page = np.zeros(4096, np.uint8)
    dst = cm.DeviceBuffer.empty(4096)
    offs = _descriptors([0])
    try:
        params = ((dst.ptr, page.ctypes.data, offs.ptr, offs.ptr, 0, 64, 1, 32), _TYPES)
        with pytest.raises(cm.CudaError) as info:
            _driver.call("cuLaunchKernel", fn, 1, 1, 1, 256, 1, 1, 0, 0, params, 0)
        assert info.value.code == int(R.CUDA_ERROR_ILLEGAL_ADDRESS)
    finally:
        dst.close()
        offs.close()
