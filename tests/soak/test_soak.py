"""The leak soak through pytest: every kind, a short run by default (marker ``soak``).

``CUDA_MEMKIT_SOAK_CYCLES`` sets the cycles per kind (default 10 000 on the
simulator, 2000 on a GPU; the full 100 000 run is ``scripts/gpu-check soak``).
Deselect with ``-m "not soak"``.
"""

from __future__ import annotations

import os

import pytest

from cuda_memkit._core import _driver

from . import harness

pytestmark = [pytest.mark.soak, pytest.mark.usefixtures("default_pinned")]

CYCLES = int(os.environ.get("CUDA_MEMKIT_SOAK_CYCLES",
                            "10000" if _driver.backend_name() == "sim" else "2000"))


@pytest.mark.parametrize("kind", [
    pytest.param(k, marks=pytest.mark.uses_managed_memory) if k == "ManagedBuffer" else k
    for k in harness.KIND_NAMES])
def test_soak(kind: str) -> None:
    r = harness.run_kind(kind, CYCLES)
    assert not r.errors, r.errors
    assert r.cycles_run == CYCLES
    assert set(r.per_variant) == set(harness.variants())
    assert all(r.per_variant.values()), r.per_variant
    assert r.ledger_changes == [], r.ledger_changes
    assert r.device_bytes_lost == 0
    assert r.pool_stats_after["used_current"] == 0, r.pool_stats_after
    assert r.ok
