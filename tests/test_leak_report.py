"""Leak reports: CUDA_MEMKIT_LEAK_REPORT=1 at exit, and the pytest plugin (--memkit-leaks).

Both run in child processes (a report at interpreter exit, a pytest session
of its own), on the active backend.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest

from cuda_memkit._core import _driver

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_MEMKIT_LEAK_REPORT", "PYTEST_ADDOPTS")}
    env["CUDA_MEMKIT_BACKEND"] = _driver.backend_name()
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _run(args: list[str], cwd: pathlib.Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=_env(**extra),
                          capture_output=True, text=True, timeout=120, check=False)


LEAKY = textwrap.dedent("""\
    import cuda_memkit as cm

    def make():
        return cm.DeviceBuffer.empty(3 << 20)

    kept = make()
    pinned = cm.HostBuffer.empty(5000)
    cm.HostBuffer.empty(100).close()
    with cm.DeviceBuffer.empty(1000):
        pass
    print("done")
""")


def test_leak_report_at_exit_names_every_allocation(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "leaky.py"
    script.write_text(LEAKY)
    proc = _run([str(script)], tmp_path, CUDA_MEMKIT_LEAK_REPORT="1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done"
    err = proc.stderr
    assert "cuda_memkit leak report at exit: 2 allocation(s) still own memory" in err, err
    assert "3.00 MiB (3145728 bytes) of device on device 0" in err
    assert "4.88 KiB (5000 bytes) of pinned on host" in err
    # the stacks: make() called from module level, most recent call last
    lines = err.splitlines()
    i = next(n for n, line in enumerate(lines) if "3145728 bytes" in line)
    assert f'File "{script}", line 6, in <module>' in lines[i + 1]
    assert f'File "{script}", line 4, in make' in lines[i + 2]
    assert f'File "{script}", line 7, in <module>' in err
    assert "1000 bytes" not in err and "100 bytes" not in err  # freed


def test_leak_report_without_leaks_and_when_off(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "clean.py"
    script.write_text("import cuda_memkit as cm\ncm.DeviceBuffer.empty(10).close()\n")
    on = _run([str(script)], tmp_path, CUDA_MEMKIT_LEAK_REPORT="1")
    assert on.returncode == 0 and "cuda_memkit leak report: no memory left at exit" in on.stderr
    leaky = tmp_path / "leaky.py"
    leaky.write_text(LEAKY)
    for value in (None, "0"):
        extra = {} if value is None else {"CUDA_MEMKIT_LEAK_REPORT": value}
        off = _run([str(leaky)], tmp_path, **extra)
        assert off.returncode == 0 and "leak report" not in off.stderr, (value, off.stderr)


TESTS = textwrap.dedent("""\
    import pytest
    import cuda_memkit as cm

    KEEP = []

    def test_leaks_a_pool_buffer():
        KEEP.append(cm.MemoryPool.default(0).allocate(4096, stream=None))

    def test_clean():
        with cm.DeviceBuffer.empty(100):
            cm.HostBuffer.pooled(64).close()

    def test_garbage_is_collected_first():
        a = [cm.DeviceBuffer.empty(100)]
        a.append(a)  # a cycle: freed by the check's gc.collect()

    @pytest.mark.memkit_allow_leaks
    def test_allowed():
        KEEP.append(cm.HostBuffer.pooled(128))

    @pytest.fixture(scope="module")
    def module_buffer():
        return cm.DeviceBuffer.empty(2048)

    def test_wider_fixtures_are_not_leaks(module_buffer):
        assert module_buffer.nbytes == 2048

    GROW = cm.GrowableBuffer(64 << 20, chunk=cm.granularity(0))  # made before any test

    def test_grows_a_buffer_from_before():
        GROW.resize(cm.granularity(0))
""")


@pytest.fixture
def project(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "test_mem.py").write_text(TESTS)
    return tmp_path


def _pytest(project: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *args],
                project)


def test_plugin_fails_the_leaking_test_and_names_the_site(project: pathlib.Path) -> None:
    proc = _pytest(project, "-p", "cuda_memkit.pytest_plugin", "--memkit-leaks")
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "6 passed, 2 errors" in out, out  # the leaking tests passed, their teardowns failed
    assert "ERROR at teardown of test_leaks_a_pool_buffer" in out
    assert ("cuda_memkit: test_mem.py::test_leaks_a_pool_buffer leaked: 1 allocation(s) "
            "still own memory (4.00 KiB)") in out
    assert "4.00 KiB (4096 bytes) of pool on device 0" in out
    assert f'File "{project / "test_mem.py"}", line 7, in test_leaks_a_pool_buffer' in out
    assert "_pytest" not in out.split("leaked:")[1].split("short test summary")[0]
    assert "ERROR at teardown of test_grows_a_buffer_from_before" in out
    assert "growable on device 0 holds 2.00 MiB (2097152 bytes) more with no new allocation" in out


def test_plugin_is_inert_without_the_option(project: pathlib.Path) -> None:
    proc = _pytest(project, "-p", "cuda_memkit.pytest_plugin")
    assert proc.returncode == 0 and "6 passed" in proc.stdout, proc.stdout + proc.stderr
    assert "leak check" not in proc.stdout
    code = ("import sys, cuda_memkit.pytest_plugin\n"
            "print('cuda_memkit._observability._tracking' in sys.modules,"
            " 'cuda_memkit._observability._leak_report' in sys.modules)")
    assert _run(["-c", code], project).stdout.split() == ["False", "False"]


def test_plugin_entry_point(project: pathlib.Path) -> None:
    eps = [ep for ep in entry_points(group="pytest11") if ep.value == "cuda_memkit.pytest_plugin"]
    if not eps:
        pytest.skip("cuda_memkit is not installed (no entry points): the plugin loads with -p")
    assert eps[0].name == "cuda_memkit.pytest_plugin"
    # the entry point alone (with -p as well: the test above, same name, registered once)
    proc = _pytest(project, "--memkit-leaks")
    assert "6 passed, 2 errors" in proc.stdout, proc.stdout + proc.stderr
    assert "test_mem.py\", line 7, in test_leaks_a_pool_buffer" in proc.stdout
