"""The command line (``python -m cuda_memkit``) and a newcomer's first error without a GPU.

In-process where the parser or the output is what is tested; in a subprocess where the
promise is about the whole program: the exit status, stderr without a traceback, a closed
pipe, a backend chosen before anything is loaded.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import cuda_memkit as cm
from cuda_memkit import _cli
from cuda_memkit._core import _driver

ROOT = Path(__file__).resolve().parents[1]


def _driver_installed() -> bool:
    """Whether libcuda can be loaded here (decides what the real-driver subprocesses expect)."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


HAVE_DRIVER = _driver_installed()


def _run(args: list[str], env_backend: str | None, *, code: str | None = None,
         stdout: int | None = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    """Run ``python -m cuda_memkit ARGS`` (or ``python -c CODE``) from this checkout."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop(_driver.ENV_VAR, None)
    if env_backend is not None:
        env[_driver.ENV_VAR] = env_backend
    cmd = [sys.executable, "-c", code] if code is not None else [
        sys.executable, "-m", "cuda_memkit", *args]
    return subprocess.run(cmd, env=env, cwd=ROOT, stdout=stdout, stderr=subprocess.PIPE,
                          text=True, timeout=120)


# -- help --------------------------------------------------------------------------------------


def test_top_level_help_lists_every_command_with_its_description(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _cli.main(["--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for name, (summary, _detail) in _cli.COMMANDS.items():
        assert f"{name} {' '.join(summary.split())}" in out


@pytest.mark.parametrize("command", sorted(_cli.COMMANDS))
def test_each_command_has_its_own_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _cli.main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m cuda_memkit {command} ")
    summary, detail = _cli.COMMANDS[command]
    flat = " ".join(out.split())
    assert summary[1:] in flat and " ".join(detail.split()) in flat
    assert ("--json" in out) == (command == "stats")
    for other in set(_cli.COMMANDS) - {command}:
        assert _cli.COMMANDS[other][0][1:] not in flat  # not the top-level help again


@pytest.mark.parametrize("argv0, prog", [
    ("/usr/lib/python3/site-packages/cuda_memkit/__main__.py", "python -m cuda_memkit"),
    ("/home/me/.venv/bin/cuda-memkit", "cuda-memkit"),
    ("cuda-memkit", "cuda-memkit"),
])
def test_usage_names_the_command_as_invoked(argv0: str, prog: str) -> None:
    code = (f"import sys; sys.argv = [{argv0!r}, '--help']\n"
            "from cuda_memkit._cli import main\nmain()")
    proc = _run([], "sim", code=code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: {prog} [-h]")
    assert f"Each command has its own help: {prog} COMMAND --help" in proc.stdout


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"cuda_memkit {cm.__version__}\n"


# -- the backend: --backend and CUDA_MEMKIT_BACKEND alike -----------------------------------------


def test_backend_flag_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_driver.ENV_VAR, "cuda")
    assert _cli._requested_backend("sim") == "sim"
    assert _cli._requested_backend(None) == "cuda"
    monkeypatch.setenv(_driver.ENV_VAR, " SIM ")  # read as the library reads it
    assert _cli._requested_backend(None) == "sim"
    monkeypatch.delenv(_driver.ENV_VAR)
    assert _cli._requested_backend(None) is None


@pytest.mark.parametrize("value", ["gpu", "", "cuda,sim"])
def test_bad_environment_value_is_a_usage_error(
        value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(_driver.ENV_VAR, value)
    with pytest.raises(SystemExit) as exc:
        _cli.main(["info"])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"error: CUDA_MEMKIT_BACKEND={value!r} is not a backend; choose one of cuda, sim" \
        in captured.err


def test_bad_flag_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--backend", "gpu", "info"], ["doctor", "--backend", "gpu"]):
        with pytest.raises(SystemExit) as exc:
            _cli.main(argv)
        assert exc.value.code == 2
        assert "argument --backend: invalid choice: 'gpu'" in capsys.readouterr().err


@pytest.mark.slow_subprocess
def test_bad_environment_value_exits_2_without_traceback() -> None:
    proc = _run(["doctor"], "gpu")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "CUDA_MEMKIT_BACKEND='gpu' is not a backend" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow_subprocess
@pytest.mark.parametrize("how", ["env", "flag"])
def test_cuda_named_is_never_replaced_by_the_simulator(how: str) -> None:
    """``CUDA_MEMKIT_BACKEND=cuda`` acts as ``--backend cuda``: the real driver or a failure."""
    if how == "env":
        proc = _run(["doctor"], "cuda")
    else:
        proc = _run(["--backend", "cuda", "doctor"], None)
    assert "Traceback" not in proc.stderr
    assert "SIMULAT" not in proc.stdout + proc.stderr
    if HAVE_DRIVER:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.rstrip().endswith("all checks passed on cuda (real driver)")
    else:
        assert proc.returncode == 1
        lines = proc.stdout.splitlines()
        assert lines[0].startswith("FAIL  driver: cuInit: CUDA_DRIVER_NOT_FOUND")
        assert "CUDA_MEMKIT_BACKEND=sim" in lines[0]
        assert lines[-1] == "1 check(s) failed on cuda (real driver)"


@pytest.mark.slow_subprocess
def test_simulator_named_in_the_environment_is_used() -> None:
    proc = _run(["info"], "sim")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("backend        : sim (CPU simulator: SIMULATED devices)\n")
    assert "No NVIDIA driver" not in proc.stdout  # chosen, not fallen back to
    # Every figure but the installed package's version comes from the simulator, and says so.
    # (In a subprocess: info makes each device's context current in turn.)
    figures = _figure_lines(proc.stdout)
    assert len(figures) > 4
    assert [line for line in figures if "[simulated]" not in line] == [
        line for line in figures if line.startswith("cuda-bindings")]


@pytest.mark.slow_subprocess
def test_no_driver_notice_is_one_short_line() -> None:
    """Without a driver and without a backend named, one line says the simulator is shown."""
    code = (_NO_LIBCUDA if HAVE_DRIVER else "") + (
        "import sys\nfrom cuda_memkit._cli import main\nsys.exit(main(['info']))")
    proc = _run([], None, code=code)
    assert proc.returncode == 0, proc.stderr
    notice, blank, first = proc.stdout.splitlines()[:3]
    assert notice == ("No NVIDIA driver here: showing the CPU simulator, every figure "
                      "[simulated].")
    assert blank == "" and first.startswith("backend        : sim")
    assert proc.stdout.lower().count("driver here") == 1
    assert "libcuda" not in proc.stdout and proc.stderr == ""


# -- output -------------------------------------------------------------------------------------


@pytest.mark.slow_subprocess
def test_closed_pipe_ends_quietly() -> None:
    """``python -m cuda_memkit info | head -3``: the reader is gone before the first line."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = _run(["info"], "sim", stdout=write_end)
    finally:
        os.close(write_end)
    assert proc.returncode == 141
    assert proc.stderr == ""


def _figure_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if any(c.isdigit() for c in line)]


@pytest.mark.skipif(_driver.backend_name() != "sim", reason="labels the simulator's figures")
def test_simulated_figures_are_labelled(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli.main(["tour"]) == 0
    out = capsys.readouterr().out
    steps = [line for line in out.splitlines() if line.startswith("   ")]
    assert len(steps) >= 10
    assert all(line.endswith("  [simulated]") for line in steps), steps
    assert all(line.endswith("  [simulated]") for line in _figure_lines(out)[1:])
    with cm.DeviceBuffer.empty(4096):
        assert _cli.main(["stats"]) == 0
        table = capsys.readouterr().out.splitlines()
    rows = [line for line in table if line.startswith("device ")]
    assert rows and all(line.endswith("  [simulated]") for line in rows)


#: What the README's feature list sells, and a word of the tour's output that shows each.
SOLD = {"block cache": "MemoryPool(cache=True)", "pool statistics": "reserved",
        "copy_batch": "copy_batch: 1024 blocks", "staged pageable copy": "pageable numpy array",
        "memory_stats": "memory_stats()", "leak report": "as a leak report lists them",
        "Loader": "a Loader: 2 worker processes", "peer copy": "from device 0 to device 1",
        "CuPy": "CuPy", "pinned": "pinned", "managed": "managed", "virtual": "growable"}


@pytest.mark.uses_managed_memory  # the tour's managed step: the driver keeps its pages a while
def test_the_tour_shows_what_the_readme_sells(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli.main(["tour"]) == 0
    out = capsys.readouterr().out
    missing = [feature for feature, word in SOLD.items() if word not in out]
    if cm.device_count() < 2:  # a peer copy needs two GPUs: the tour says why it shows none
        assert "one device here: copies between GPUs need two" in out, out
        missing.remove("peer copy")
    assert missing == [], out
    assert "DIFFERENT" not in out and "WRONG" not in out, out
    if _driver.backend_name() == "sim":
        # Timings on the simulator would measure Python, not a GPU.
        assert re.search(r"\d\s?(?:us|ms|GB/s)\b", out) is None, out


def test_tour_help_says_what_it_shows(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _cli.main(["tour", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for word in ("block cache", "copy_batch", "pageable", "memory_stats", "leak report",
                 "Loader", "peer copy", "CuPy", "[simulated]"):
        assert word in text, word


@pytest.mark.skipif(_driver.backend_name() != "cuda", reason="the real driver's figures")
def test_real_figures_are_not_labelled(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli.main(["info"]) == 0
    assert "[simulated]" not in capsys.readouterr().out


# -- a newcomer's first call without a GPU ------------------------------------------------------

_FIRST_CALL = """
import cuda_memkit as cm
{patch}
cm.DeviceBuffer.empty(16)
"""

# On a machine with a driver, the loader is made to fail as it does where there is none.
_NO_LIBCUDA = """
from cuda.bindings import driver
from cuda.pathfinder import DynamicLibNotFoundError
def _missing(flags):
    raise DynamicLibNotFoundError('"cuda" is an NVIDIA driver library and can only be '
                                  'found via system search. Ensure the NVIDIA display '
                                  'driver is installed.')
driver.cuInit = _missing
"""


@pytest.mark.slow_subprocess
def test_no_driver_is_one_clean_error_saying_how_to_use_the_simulator() -> None:
    proc = _run([], None, code=_FIRST_CALL.format(patch=_NO_LIBCUDA if HAVE_DRIVER else ""))
    assert proc.returncode == 1
    err = proc.stderr
    assert err.count("Traceback") == 1, err
    assert "During handling" not in err and "direct cause" not in err, err
    assert "KeyError" not in err and "pathfinder" not in err, err
    last = err.rstrip().splitlines()[-1]
    assert last.startswith("cuda_memkit.CudaDriverNotFoundError: cuInit: CUDA_DRIVER_NOT_FOUND")
    assert "CUDA_MEMKIT_BACKEND=sim" in last and "cuda_memkit.use_backend('sim')" in last


@pytest.mark.slow_subprocess
def test_no_driver_does_not_switch_to_the_simulator() -> None:
    code = _FIRST_CALL.format(patch=_NO_LIBCUDA if HAVE_DRIVER else "").replace(
        "cm.DeviceBuffer.empty(16)",
        "try:\n    cm.DeviceBuffer.empty(16)\nexcept cm.CudaDriverNotFoundError:\n"
        "    print(cm.backend_name(), cm._core._driver.is_loaded())")
    proc = _run([], None, code=code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "cuda False\n"
