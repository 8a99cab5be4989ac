"""The Loader's torch and CuPy outputs, and the PyTorch ``DataLoader`` recipe (docs/loading.md).

On a GPU with the framework installed; skipped where it is missing (this machine's simulator
memory is not a framework's device memory either).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver

from . import _ring_workers as rw

SHAPE = (32, 16)
pytestmark = pytest.mark.framework_kernels


def _needs(name: str) -> Any:
    mod = pytest.importorskip(name, reason=f"{name} is not installed")
    if _driver.backend_name() == "sim":
        pytest.skip(f"{name} needs a real GPU: the simulator's device memory is not its")
    return mod


def test_the_loader_yields_torch_tensors() -> None:
    torch = _needs("torch")
    with cm.Loader(rw.batch_value, 6, SHAPE, np.float32, workers=2, output="torch",
                   start_method="forkserver", timeout=120) as ld:
        for k, t in enumerate(ld):
            assert t.is_cuda and tuple(t.shape) == SHAPE and t.dtype == torch.float32
            assert bool((t == k).all())  # on torch's current stream, the copy's stream
    torch.cuda.synchronize()


def test_the_loader_yields_cupy_arrays() -> None:
    cupy = _needs("cupy")
    with cm.Loader(rw.batch_value, 5, SHAPE, np.int32, workers=2, output="cupy",
                   start_method="forkserver", timeout=120) as ld:
        got = [int(a[0, 0]) for a in ld]
        assert got == [0, 1, 2, 3, 4]
    cupy.cuda.get_current_stream().synchronize()


# -- the DataLoader recipe: a dataset's workers write into the ring ------------------------


class RingBatches:
    """Items are batches of rows of ``source``; each is written into a ring slot (a ticket back).

    What docs/loading.md's recipe does, as a torch ``Dataset`` (duck-typed: map-style).
    """

    def __init__(self, source: np.ndarray[Any, Any], handle: cm.RingHandle) -> None:
        self.source = source
        self.handle = handle

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, rows: list[int]) -> tuple[int, int]:
        import torch

        info = torch.utils.data.get_worker_info()
        writer = self.handle.writer(worker=None if info is None else info.id)
        with writer.acquire() as slot:
            np.take(self.source, rows, axis=0, out=slot.array)
            return slot.ticket


def _tensors(loader: Any, ring: cm.SharedHostRing, torch: Any) -> Iterator[Any]:
    for ticket in loader:
        buf = ring.take(ticket).to_device(stream=torch.cuda.current_stream().cuda_stream)
        yield torch.from_dlpack(buf.as_array(ring.dtype, ring.shape))


def test_the_dataloader_recipe() -> None:
    torch = _needs("torch")
    from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

    rows, batch, workers, prefetch = 256, 16, 3, 2
    source = np.arange(rows * 8, dtype=np.float32).reshape(rows, 8)
    with cm.SharedHostRing((prefetch + 1) * workers + 2, (batch, 8), np.float32,
                           grants=1, timeout=120) as ring:
        loader = DataLoader(RingBatches(source, ring.handle), batch_size=None,
                            sampler=BatchSampler(SequentialSampler(range(rows)), batch, False),
                            num_workers=workers, prefetch_factor=prefetch,
                            multiprocessing_context="forkserver")
        for k, t in enumerate(_tensors(loader, ring, torch)):
            assert t.is_cuda and tuple(t.shape) == (batch, 8)
            expect = torch.from_numpy(source[k * batch:(k + 1) * batch]).cuda()
            assert torch.equal(t, expect)
        assert k == rows // batch - 1
        del loader  # its workers end
    torch.cuda.synchronize()
