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


# -- layering: no import cycles, arrows pointing one way ---------------------------------

ROOT = PKG.parent
#: Layer of each module of the package (``sim`` is the backend, below the gateway).
GATEWAY = {"_core._errors", "_core._driver"}
#: Leaves below the backend: they import nothing of the package, and the simulator reads them too.
LEAVES = {"_core._host_os"}
TOOLS = {"__init__", "__main__", "_cli", "_tour", "allocators", "dask", "pytest_plugin"}
#: The private subpackages, one concept each: a reader looking for pools finds ``_pools``.
CONCEPTS = {"_core", "_host", "_device_memory", "_managed_memory", "_virtual", "_pools",
            "_transfer", "_observability", "_loading"}


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _layer(mod: str) -> int:
    top = mod.split(".")[0]
    if mod in LEAVES:
        return -1
    if mod == "sim":  # sim.reset() and friends: a tool that reconfigures the backend
        return 4
    if top == "sim":
        return 0
    if mod in GATEWAY:
        return 1
    if top == "_core":
        return 2
    if top in TOOLS:
        return 4
    return 3  # the public resources: one subpackage per concept


def _imports(path: pathlib.Path, tree: ast.AST | None = None) -> list[tuple[str, int]]:
    """Every import of a package module from ``path``: (module, line), at any depth.

    Function-level imports and ``if TYPE_CHECKING:`` imports count too: a cycle
    through either is still a cycle for a reader and for type checkers.
    """
    tree = tree or ast.parse(path.read_text(), str(path))
    me = _module_name(path)
    pkg_parts = me.split(".")[:-1] if path.name != "__init__.py" else me.split(".")
    if me == "__init__":
        pkg_parts = []
    known = {_module_name(p) for p in PKG.rglob("*.py")}
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg_parts[: len(pkg_parts) - (node.level - 1)] if node.level > 1 \
                    else pkg_parts
                mod = ".".join([*base, node.module] if node.module else base)
            elif node.module and node.module.startswith("cuda_memkit"):
                mod = node.module[len("cuda_memkit"):].lstrip(".")
            else:
                continue
            for alias in node.names:  # "from . import _x": the submodule _x
                sub = f"{mod}.{alias.name}" if mod else alias.name
                if sub in known:
                    out.append((sub, node.lineno))
                else:
                    out.append((mod or "__init__", node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("cuda_memkit"):
                    mod = alias.name[len("cuda_memkit"):].lstrip(".") or "__init__"
                    out.append((mod, node.lineno))
    return [(m if m in known else m.rsplit(".", 1)[0], line) for m, line in out if m != me]


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PKG.rglob("*.py"):
        graph.setdefault(_module_name(path), set()).update(m for m, _ in _imports(path))
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    cycles = _cycles(_graph())
    assert not cycles, f"import cycles in cuda_memkit: {cycles}"


def test_the_cycle_check_detects_a_cycle(tmp_path: pathlib.Path) -> None:
    graph = {"_a": {"_b"}, "_b": {"_c"}, "_c": {"_a"}, "_d": {"_a"}}
    assert _cycles(graph) == [["_a", "_b", "_c"]]
    # a function-level import counts: the parser walks the whole module
    sample = PKG / "_host" / "_pinned.py"
    tree = ast.parse(sample.read_text()
                     + "\n\ndef f():\n    from .._transfer._transfers import copy\n")
    assert ("_transfer._transfers", sample.read_text().count("\n") + 4) in _imports(sample, tree)


def test_layers_point_one_way() -> None:
    """Public resources -> shared internals -> gateway -> backend, never back."""
    bad = []
    for path in PKG.rglob("*.py"):
        me = _module_name(path)
        for mod, line in _imports(path):
            if _layer(mod) > _layer(me):
                bad.append(f"{me}:{line} imports {mod} (layer {_layer(mod)} > {_layer(me)})")
    assert not bad, "imports against the layers: " + "; ".join(bad)


def test_the_leaves_import_nothing_of_the_package() -> None:
    """A leaf is below every layer, the backend's included: it reads the OS, not the library."""
    for mod in LEAVES:
        path = PKG.joinpath(*mod.split(".")).with_suffix(".py")
        assert path.exists(), mod
        assert _imports(path) == [], f"{mod} imports {_imports(path)}"


def test_modules_live_in_their_concept() -> None:
    """Every library module sits in one concept's subpackage, or is a tool at the top.

    One concept per module replaced the old line cap: a module may be long when it is
    one idea; a new idea gets a module in the subpackage of its concept.
    """
    stray = []
    for path in PKG.rglob("*.py"):
        top = _module_name(path).split(".")[0]
        if top not in CONCEPTS | TOOLS | {"sim"}:
            stray.append(str(path.relative_to(PKG)))
    assert not stray, "modules outside the concept subpackages: " + ", ".join(stray)
    for concept in CONCEPTS:
        init = PKG / concept / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{concept} says what it holds"


def test_modules_stay_readable() -> None:
    """Scripts, benchmarks and tests stay under 800 lines; library modules are one concept."""
    big = []
    for base in ("scripts", "benchmarks", "tests"):
        for path in (ROOT / base).rglob("*.py"):
            n = path.read_text().count("\n")
            if n > 800:
                big.append(f"{path.relative_to(ROOT)}: {n}")
    assert not big, "modules over 800 lines: " + ", ".join(big)


def _is_submodule(path: pathlib.Path, node: ast.ImportFrom, name: str) -> bool:
    """``from .._core import _driver``: ``name`` is a module of the package ``node`` names."""
    base = path.parent
    for _ in range(node.level - 1):
        base = base.parent
    for part in (node.module or "").split("."):
        base = base / part
    return (base / f"{name}.py").exists() or (base / name / "__init__.py").exists()


def test_private_names_stay_in_their_module() -> None:
    """A name another module uses is not underscored: no ``from ._x import _y``, no ``_x._y``."""
    bad = []
    for path in _modules():
        tree = ast.parse(path.read_text(), str(path))
        modules = set()  # names bound to package modules: "from . import _driver"
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            for a in node.names:
                private = a.name.startswith("_") and not a.name.startswith("__")
                if node.module is None or _is_submodule(path, node, a.name):
                    modules.add(a.asname or a.name)
                elif private:
                    bad.append(f"{path.name}:{node.lineno} imports {node.module}.{a.name}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in modules and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                bad.append(f"{path.name}:{node.lineno} uses {node.value.id}.{node.attr}")
    assert not bad, "private names used across modules: " + ", ".join(bad)


def test_a_backend_reset_reaches_the_library_only_through_the_gateway() -> None:
    """The simulator imports no library module but the gateway and the leaves, and only the
    gateway knows the simulator: a reset reaches the library through ``_driver.reset_hooks``,
    which the modules that keep per-machine state fill."""
    bad = []
    for path in PKG.rglob("*.py"):
        me = _module_name(path)
        if me.split(".")[0] == "sim":
            bad += [f"{me}:{line} imports {mod}" for mod, line in _imports(path)
                    if mod.split(".")[0] != "sim" and mod not in GATEWAY | LEAVES]
        elif me not in GATEWAY:
            bad += [f"{me}:{line} imports {mod}" for mod, line in _imports(path)
                    if mod.split(".")[0] == "sim"]
            if re.search(r"['\"]cuda_memkit\.sim\b", path.read_text()):
                bad.append(f"{me} names the simulator's modules")
    assert not bad, "the simulator and the library reach each other: " + "; ".join(bad)
