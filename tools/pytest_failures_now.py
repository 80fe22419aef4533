"""A pytest plugin for runs that an outer timeout may stop: each failure's report is written to a file as it
happens, not only in pytest's summary at the end (on the TPU machine a part stopped by its ``timeout`` left
only its dots: which tests failed, and why, were lost; docs/accelerator.md).

    python -m pytest -p pytest_failures_now ...   # with tools/ on sys.path; the file: $PYTEST_FAILURES_NOW

``PYTEST_FAILURES_NOW`` names the file, emptied as the run starts and then written line by line: each test
phase that fails or errors, and each collection error. Unset, the plugin does nothing; a file it cannot
write is reported once and the run goes on.
"""

from __future__ import annotations

import os
import sys
from typing import Any

_PATH = os.path.abspath(os.environ["PYTEST_FAILURES_NOW"]) if os.environ.get("PYTEST_FAILURES_NOW") else None
_broken = False


def _write(text: str, mode: str = "a") -> None:
    global _broken
    if _PATH is None or _broken:
        return
    try:
        with open(_PATH, mode, buffering=1) as out:
            out.write(text)
    except OSError as error:  # the tests matter more than this log
        _broken = True
        print(f"pytest_failures_now: cannot write {_PATH}: {error}", file=sys.stderr)


def pytest_sessionstart(session: Any) -> None:
    """Empty the file: it holds this run's failures only."""
    _write("", mode="w")


def pytest_collectreport(report: Any) -> None:
    """A collection error, at once."""
    if report.failed:
        _write(f"ERROR collecting {report.nodeid}\n{report.longreprtext}\n\n")


def pytest_runtest_logreport(report: Any) -> None:
    """A failed or erroring phase's test id, phase and traceback, at once."""
    if report.failed:
        _write(f"FAILED {report.nodeid} ({report.when}, {report.duration:.1f} s)\n{report.longreprtext}\n\n")
