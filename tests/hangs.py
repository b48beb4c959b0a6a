"""A test that hangs fails the run, with every thread's stack, instead of stalling it.

Each test gets a deadline: its ``@pytest.mark.timeout(seconds)``, else the ini value
``test_timeout`` (tests/run.sh's pytest runs use pyproject.toml's). One watchdog thread per
process, started once, checks the deadline twice a second; past it, the watchdog prints the test's
name and the stacks, and ends the process with exit status 1 (under mpiexec that ends the job).

Why not pytest-timeout's thread method, which does the same: it starts and joins a thread for
every test, and with more ranks than cores each start and join waits for a core. That cost 3 s of
the correctness matrix's 20 at 4 ranks. Setting a deadline here is one assignment.

A hang that holds the GIL (a C call that never releases it) keeps the watchdog from running, as it
keeps pytest-timeout's: tests/run.sh's ``timeout`` then kills the job.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from collections.abc import Iterator

import pytest

CHECK_EVERY = 0.5  # s: how late a hang is noticed, at most


class Watchdog:
    """Ends the process once the current test's deadline has passed."""

    def __init__(self) -> None:
        # (deadline on time.monotonic(), the test, its limit) or None between tests: one
        # attribute, so the watchdog never reads one test's deadline with another's name.
        self.current: tuple[float, pytest.Item, float] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="hpcring-test-watchdog", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        while True:
            time.sleep(CHECK_EVERY)
            current = self.current
            if current is not None and time.monotonic() > current[0]:
                _, item, limit = current
                _expire(item, limit)


def _expire(item: pytest.Item, limit: float) -> None:
    """Say which test ran over, with what it printed and every thread's stack; end the process."""
    capture = item.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:  # pytest holds the test's output (and fd 2) until the test ends
        capture.suspend_global_capture(in_=True)
        out, err = capture.read_global_capture()
        sys.stdout.write(out)
        sys.stderr.write(err)
    sys.stderr.write(f"\n+++ Timeout: {item.nodeid} ran over {limit:g} s; every thread's stack:\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(all_threads=True)
    os._exit(1)


WATCHDOG = Watchdog()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("test_timeout", "seconds a test may take before the run ends", default="300")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "timeout(seconds): this test's own deadline (tests/hangs.py)")


def _limit(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    return float(item.config.getini("test_timeout"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    limit = _limit(item)
    WATCHDOG.start()
    WATCHDOG.current = (time.monotonic() + limit, item, limit) if limit > 0 else None
    try:
        yield
    finally:
        WATCHDOG.current = None
