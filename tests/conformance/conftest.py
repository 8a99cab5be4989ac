"""Fixtures shared by the conformance tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cuda_memkit._core import _driver
from cuda_memkit._core._context import ensure_context

from ._helpers import Undo


@pytest.fixture
def ctx() -> None:
    """A current context on device 0 (modules opt in with ``usefixtures("ctx")``)."""
    ensure_context(0)


@pytest.fixture
def undo() -> Iterator[Undo]:
    """Driver calls a test registers to undo what it made, run at teardown after a sync."""
    ensure_context(0)
    u = Undo()
    yield u
    _driver.call("cuCtxSynchronize")
    u.run()
