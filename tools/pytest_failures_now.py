"""A pytest plugin for runs that an outer timeout may stop: each failure's report is written to a file as it
happens, not only in pytest's summary at the end (on the TPU machine a part stopped by its ``timeout`` left
only its dots: which tests failed, and why, were lost; docs/accelerator.md).

    python -m pytest -p pytest_failures_now ...   # with tools/ on sys.path; the file: $PYTEST_FAILURES_NOW

``PYTEST_FAILURES_NOW`` names the file (appended to, line-buffered); unset, the plugin does nothing.
"""

from __future__ import annotations

import os
from typing import Any

_PATH = os.environ.get("PYTEST_FAILURES_NOW")


def pytest_runtest_logreport(report: Any) -> None:
    """Append a failed or erroring phase's test id, phase and traceback to the file, at once."""
    if not _PATH or not report.failed:
        return
    with open(_PATH, "a", buffering=1) as out:
        out.write(f"FAILED {report.nodeid} ({report.when}, {report.duration:.1f} s)\n{report.longreprtext}\n\n")
