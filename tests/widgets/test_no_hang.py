"""Issue 33: napari never hangs on our work. A session that froze napari for good (our jobs filled Qt's global
thread pool, and the GUI thread then waited on it while holding the GIL) runs as a process of its own under
this watchdog, which kills it if it has not finished in time."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
WATCHDOG_S = 60  # the session takes 10 to 20 s on a 2-core machine; a deadlock never ends


def _installed(binding: str) -> bool:
    return importlib.util.find_spec({"pyqt5": "PyQt5", "pyqt6": "PyQt6", "pyside6": "PySide6"}[binding]) is not None


# Qt 5.15 splits large image scaling and conversion into tasks of the global pool (Qt 6 has a private pool for
# them), so PyQt5 is the binding that froze; the session runs under each binding installed
@pytest.mark.parametrize("binding", ["pyqt5", "pyqt6"])
@pytest.mark.parametrize("pool", [1, 2])
def test_session_with_a_busy_global_pool_never_hangs(pool, binding):
    if not _installed(binding):
        pytest.skip(f"{binding} is not installed (.ci/run installs both PyQt5 and PyQt6)")
    # the child's own binding: qtpy in this process may have set QT_API to the one pytest-qt loaded
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "QT_API": binding}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.widgets.hang_session", "--pool", str(pool)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=WATCHDOG_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired as expired:
        out = (expired.stdout or b"").decode(errors="replace") if isinstance(expired.stdout, bytes) else expired.stdout
        pytest.fail(f"napari hung: the session had not finished after {WATCHDOG_S} s\n{out or ''}")
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stdout + done.stderr[-3000:]
