"""Execute notebooks top to bottom and save them with their outputs.

    python scripts/run_notebooks.py [--out DIR] [--inplace] NOTEBOOK...

Uses nbclient when nbclient and ipykernel are installed (the ``notebooks``
extra); otherwise a small in-process executor: each notebook runs in a fresh
Python process, code cells are executed in order in one namespace, stdout /
stderr become stream outputs, the value of a cell's last expression becomes
its result, and open matplotlib figures become PNG outputs. IPython magics are
not supported by the fallback (the notebooks use none). Exits non-zero if any
cell of any notebook raised.
"""

from __future__ import annotations

import argparse
import ast
import base64
import contextlib
import io
import json
import os
import pathlib
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any


def _figures() -> list[dict[str, Any]]:
    if "matplotlib.pyplot" not in sys.modules:
        return []
    import matplotlib.pyplot as plt

    outs = []
    for num in plt.get_fignums():
        buf = io.BytesIO()
        plt.figure(num).savefig(buf, format="png", dpi=90, bbox_inches="tight")
        outs.append({
            "output_type": "display_data",
            "data": {"image/png": base64.b64encode(buf.getvalue()).decode(),
                     "text/plain": ["<Figure>"]},
            "metadata": {},
        })
    plt.close("all")
    return outs


def _stream(name: str, text: str) -> dict[str, Any]:
    return {"output_type": "stream", "name": name, "text": text.splitlines(keepends=True)}


def _between_cells() -> Callable[[], object]:
    """What runs before each cell: under compute-sanitizer, letting go of frames CuPy keeps.

    There CuPy keeps finished frames alive, and the arrays in them, through a
    reference the garbage collector cannot see (``tests/_sanitizer.py`` says
    more); ``gpu-check sanitize`` sets ``CUDA_MEMKIT_SANITIZER=1``. Elsewhere: nothing.
    """
    if os.environ.get("CUDA_MEMKIT_SANITIZER") != "1":
        return lambda: None
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
    from tests._sanitizer import release

    return release


def execute_inline(path: pathlib.Path, out: pathlib.Path) -> bool:
    os.environ.setdefault("MPLBACKEND", "Agg")
    between_cells = _between_cells()
    nb = json.loads(path.read_text())
    ns: dict[str, Any] = {"__name__": "__main__"}
    ok = True
    count = 0
    os.chdir(path.parent)
    try:
        import matplotlib.pyplot as plt

        plt.show = lambda *a, **k: None  # figures are collected after each cell
    except ImportError:
        pass
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        count += 1
        between_cells()
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        outputs: list[dict[str, Any]] = []
        stdout, stderr = io.StringIO(), io.StringIO()
        result: Any = None
        try:
            tree = ast.parse(src)
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                exec(compile(tree, f"<cell {count}>", "exec"), ns)
                if last is not None:
                    result = eval(compile(last, f"<cell {count}>", "eval"), ns)
        except BaseException as exc:  # a cell's failure is recorded in the notebook
            ok = False
            outputs.append({
                "output_type": "error", "ename": type(exc).__name__, "evalue": str(exc),
                "traceback": traceback.format_exception(exc),
            })
        if stdout.getvalue():
            outputs.insert(0, _stream("stdout", stdout.getvalue()))
        if stderr.getvalue():
            outputs.insert(1 if stdout.getvalue() else 0, _stream("stderr", stderr.getvalue()))
        outputs += _figures()
        if result is not None:
            outputs.append({"output_type": "execute_result", "execution_count": count,
                            "data": {"text/plain": repr(result).splitlines(keepends=True)},
                            "metadata": {}})
        cell["outputs"] = outputs
        cell["execution_count"] = count
        if not ok:
            break
    out.write_text(json.dumps(nb, indent=1) + "\n")
    return ok


def execute_nbclient(path: pathlib.Path, out: pathlib.Path) -> bool:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
        ok = True
    except CellExecutionError:
        ok = False
    nbformat.write(nb, out)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("notebooks", nargs="+", type=pathlib.Path)
    ap.add_argument("--out", type=pathlib.Path)
    ap.add_argument("--inplace", action="store_true")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:  # child process: one notebook, inline executor
        src, dst = args.notebooks
        return 0 if execute_inline(src.resolve(), dst.resolve()) else 1
    try:
        import ipykernel  # noqa: F401
        import nbclient  # noqa: F401
        engine = "nbclient"
    except ImportError:
        engine = "inline"
    if os.environ.get("CUDA_MEMKIT_SANITIZER") == "1":
        engine = "inline"  # it steps in between cells (_between_cells); a kernel cannot
    # The kernel or child process imports cuda_memkit from this checkout.
    root = str(pathlib.Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    failed = 0
    for nb in args.notebooks:
        dst = nb if args.inplace else (args.out or nb.parent) / nb.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        if engine == "nbclient":
            ok = execute_nbclient(nb.resolve(), dst.resolve())
        else:
            ok = subprocess.run([sys.executable, __file__, "--one", str(nb), str(dst)],
                                check=False).returncode == 0
        print(f"{nb.name}: {'ok' if ok else 'FAILED'} ({time.perf_counter() - t0:.1f} s, {engine})")
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
