"""Structural rules of the package, checked on the source."""

from __future__ import annotations

import ast
import pathlib
import re

PKG = pathlib.Path(__file__).resolve().parent.parent / "cuda_memkit"
FUNC = re.compile(r"^cu[A-Z]")
BINDINGS = ("cuda.bindings.driver", "cuda.bindings.runtime", "cuda.bindings.nvrtc")


def _modules() -> list[pathlib.Path]:
    return [p for p in PKG.rglob("*.py") if "sim" not in p.relative_to(PKG).parts]


def _violations(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    aliases: set[str] = set()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in BINDINGS:
                    aliases.add(a.asname or a.name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full in BINDINGS:
                    aliases.add(a.asname or a.name)
                elif node.module in BINDINGS and FUNC.match(a.name):
                    found.append(f"{path.name}:{node.lineno} imports {a.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and FUNC.match(node.attr)
                and isinstance(node.value, ast.Name) and node.value.id in aliases):
            found.append(f"{path.name}:{node.lineno} uses {node.value.id}.{node.attr}")
    return found


def test_only_the_gateway_calls_backend_functions() -> None:
    bad = []
    for path in _modules():
        if path.name == "_driver.py":
            continue
        bad += _violations(path)
    assert not bad, "backend functions used outside _driver.py: " + ", ".join(bad)


def test_the_rule_detects_a_violation(tmp_path: pathlib.Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("from cuda.bindings import driver as d\nd.cuMemAlloc(1)\n"
                      "from cuda.bindings.driver import cuMemFree, CUresult\n")
    assert len(_violations(sample)) == 2


def test_no_module_level_numpy_import_outside_sim() -> None:
    bad = []
    for path in _modules():
        tree = ast.parse(path.read_text())
        for node in tree.body:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "numpy" or n.startswith("numpy.") for n in names):
                bad.append(f"{path.name}:{node.lineno}")
    assert not bad, "module-level numpy imports: " + ", ".join(bad)


def test_public_names_are_published_under_the_package() -> None:
    import cuda_memkit as cm

    for name in cm.__all__:
        obj = getattr(cm, name)
        mod = getattr(obj, "__module__", None)
        if isinstance(obj, type):
            assert mod == "cuda_memkit", f"{name} shows module {mod}"
