"""Fixtures shared by the conformance tests."""

from __future__ import annotations

import pytest

from cuda_memkit._core._context import ensure_context


@pytest.fixture
def ctx() -> None:
    """A current context on device 0 (modules opt in with ``usefixtures("ctx")``)."""
    ensure_context(0)
