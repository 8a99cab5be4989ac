"""The bad-input table of tests/test_bad_input.py: the case record and its registry."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

KiB = 1 << 10
N = 4 * KiB


@dataclass(frozen=True)
class Case:
    id: str
    call: Callable[[SimpleNamespace], Any]
    exc: type[BaseException]
    match: str
    driver: bool = False  # the answer comes from the driver (a CudaError is fine)


CASES: list[Case] = []


def case(id: str, call: Callable[[SimpleNamespace], Any], exc: type[BaseException],
         match: str, *, driver: bool = False) -> None:
    CASES.append(Case(id, call, exc, match, driver))


def closed_fd() -> int:
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    return r
