"""The ``>>>`` examples of cuda_memkit's docstrings run as doctests, with ``cm`` and ``np`` given.

Each example runs in this process on the suite's backend, under the suite's leak checks (its
names are dropped before they look). Examples known to fail are listed below as strict
xfails, to fix once the API names settle; an example that needs what this machine lacks
(CuPy, numba) is skipped here and runs on the GPU (gpu-check's suite).
"""

from __future__ import annotations

import doctest
import gc
import importlib
import importlib.util
import pkgutil
import warnings
from types import ModuleType

import numpy as np
import pytest

import cuda_memkit as cm

#: Examples of modules that import a framework at load or in their examples: run where it is
#: installed.
NEEDS_MODULE = {"cuda_memkit.allocators.numba": "numba", "cuda_memkit.allocators._cupy": "cupy",
                "cuda_memkit.dask": "distributed"}


def _modules() -> list[ModuleType]:
    mods = []
    for info in pkgutil.walk_packages(cm.__path__, "cuda_memkit."):
        if info.name.startswith("cuda_memkit.sim") or info.name == "cuda_memkit.__main__":
            continue
        need = NEEDS_MODULE.get(info.name)
        if need is not None and importlib.util.find_spec(need) is None:
            continue
        with warnings.catch_warnings():
            # numba-cuda's own import warns under numpy 2.5 (its timedelta use): not ours
            warnings.simplefilter("ignore", DeprecationWarning)
            mods.append(importlib.import_module(info.name))
    return [cm, *mods]


def _examples() -> list[object]:
    finder = doctest.DocTestFinder(exclude_empty=True)
    params = []
    seen = set()
    for mod in _modules():
        for test in finder.find(mod, mod.__name__):
            if not test.examples or test.name in seen:
                continue
            seen.add(test.name)
            params.append(pytest.param(test, id=test.name))
    return params


EXAMPLES = _examples()


def test_there_are_docstring_examples() -> None:
    assert len(EXAMPLES) >= 10


@pytest.mark.parametrize("test", EXAMPLES)
def test_docstring_example(test: doctest.DocTest) -> None:
    test.globs = {**test.globs, "cm": cm, "np": np}
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    out: list[str] = []
    try:
        result = runner.run(test, out=out.append, clear_globs=True)
    finally:
        test.globs.clear()
        gc.collect()
    assert result.failed == 0, "".join(out)[-4000:]
