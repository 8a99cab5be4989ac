"""pytest plugin: fail a test that leaves cuda_memkit memory of any kind behind.

Enable it with ``--memkit-leaks``::

    pytest -p cuda_memkit.pytest_plugin --memkit-leaks

(installing cuda_memkit also registers it as the ``pytest11`` entry point
``cuda_memkit.pytest_plugin``, so ``pytest --memkit-leaks`` is enough there).
Without the option it does nothing: it adds the option and returns.

With it, allocation stacks are recorded for the whole session, and around
every test the allocation ledger is compared before setup and after teardown
(after a ``gc.collect()`` if anything is left): an allocation made during the
test that is still alive fails the test at teardown, and the message names
each allocation's kind, size, address and stack. An account holding more
bytes with no new allocation (a buffer from before the test that grew, or a
miscount) fails it too. Mark a test ``@pytest.mark.memkit_allow_leaks``
to skip the check for it.

Memory held by fixtures of a wider scope (module, session) is made before
the test's snapshot and is not a leak of the test.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["pytest_addoption", "pytest_configure", "pytest_unconfigure"]

_PLUGIN_NAME = "cuda_memkit-leak-check"
#: Frames from these directories are left out of a leak's stack.
_SKIP = ("/_pytest/", "/pluggy/", "<frozen runpy>", "/cuda_memkit/pytest_plugin.py")


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--memkit-leaks``."""
    group = parser.getgroup("cuda_memkit", "cuda_memkit memory checks")
    group.addoption("--memkit-leaks", action="store_true", default=False,
                    help="fail tests that leave cuda_memkit memory of any kind allocated, "
                         "naming the allocation sites (records allocation stacks)")


def pytest_configure(config: pytest.Config) -> None:
    """With ``--memkit-leaks``: start recording stacks and register the check."""
    config.addinivalue_line("markers", "memkit_allow_leaks: skip cuda_memkit's leak check "
                                       "(--memkit-leaks) for this test")
    if config.getoption("memkit_leaks", False) and not config.pluginmanager.has_plugin(
            _PLUGIN_NAME):
        config.pluginmanager.register(LeakCheck(), _PLUGIN_NAME)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the check's recording."""
    check = config.pluginmanager.get_plugin(_PLUGIN_NAME)
    if check is not None:
        check.close()
        config.pluginmanager.unregister(check)


def _new_since(before: dict[Any, int], after: dict[Any, int]) -> list[tuple[Any, object, int]]:
    return [(acct, key, n) for (acct, key), n in after.items() if (acct, key) not in before]


def _reap_finished_copies() -> None:
    """Let go of the operands of asynchronous copies that have finished.

    ``copy_async`` holds its operands until its stream has done the copy and
    lets go at the next copy or allocation; a test that ends right after one
    would otherwise see them as leaks.
    """
    operands = sys.modules.get("cuda_memkit._core._inflight")
    if operands is not None and operands.pending_operands:
        operands.reap_pending()


def _wait_for_copies() -> None:
    """Wait for the asynchronous copies whose operands are still held, then let go of them.

    Memory a copy still uses is freed when the copy ends; under compute-sanitizer the
    copies run long enough for a test to end first.
    """
    operands = sys.modules.get("cuda_memkit._core._inflight")
    if operands is not None and operands.pending_operands:
        operands.wait_pending()


class LeakCheck:
    """The per-test check: ledger before setup vs. after teardown."""

    def __init__(self) -> None:
        from cuda_memkit._observability import _leak_report

        self._report = _leak_report
        self._tracker = _leak_report.recorder()

    def close(self) -> None:
        """Stop recording stacks (unless ``CUDA_MEMKIT_LEAK_REPORT`` needs them until exit)."""
        self._report.release()

    @pytest.fixture(autouse=True)
    def _memkit_leak_check(self, request: pytest.FixtureRequest) -> Iterator[None]:
        if request.node.get_closest_marker("memkit_allow_leaks") is not None:
            yield
            return
        rep = self._report
        before, before_bytes = rep.live_now(), rep.account_bytes()
        yield
        new = _new_since(before, rep.live_now())
        grown = rep.grown_without_allocation(before_bytes, new)
        if new or grown:  # garbage may still hold some: collect (only then: it costs ms)
            _reap_finished_copies()
            gc.collect()
            new = _new_since(before, rep.live_now())
            grown = rep.grown_without_allocation(before_bytes, new)
        if new or grown:  # copies still running (slow under compute-sanitizer): wait for them
            _wait_for_copies()
            gc.collect()
            new = _new_since(before, rep.live_now())
            grown = rep.grown_without_allocation(before_bytes, new)
        if new or grown:
            title = f"cuda_memkit: {request.node.nodeid} leaked"
            lines = [rep.format_leaks(title, new, limit=8, skip=_SKIP)] if new else [title + ":"]
            lines += ["  " + g for g in grown]
            pytest.fail("\n".join(lines), pytrace=False)

    def pytest_report_header(self, config: pytest.Config) -> Any:
        return "cuda_memkit leak check: on (--memkit-leaks; allocation stacks recorded)"
