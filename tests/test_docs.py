"""Docs that cannot rot: the docstring examples run in the default suite (pyproject's --doctest-modules over the
package), every module imports without a display, and the README's "From Python" block runs."""

import ast
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import napari_gridmip

ROOT = Path(__file__).resolve().parents[1]


def readme_block() -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"## From Python\n\n```python\n(.*?)```", text, re.S)
    assert match, "the README has no 'From Python' block"
    return match.group(1)


def test_the_default_run_includes_the_docstring_examples():
    text = (ROOT / "pyproject.toml").read_text()  # (tomllib is Python 3.11+)
    section = text.split("[tool.pytest.ini_options]")[1].split("\n[")[0]
    addopts = re.search(r'^addopts = "(.*)"$', section, re.M).group(1)
    testpaths = re.search(r"^testpaths = \[(.*)\]$", section, re.M).group(1)
    assert "--doctest-modules" in addopts.split() and '"napari_gridmip"' in testpaths


def test_every_module_imports_without_a_display():
    """What --doctest-modules does to each module, in a process with no display (a headless CI machine)."""
    code = (
        "import importlib, pkgutil, napari_gridmip\n"
        "names = [m.name for m in pkgutil.walk_packages(napari_gridmip.__path__, 'napari_gridmip.')]\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "print(len(names))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) > 50


def test_the_readme_block_calls_the_api_as_it_is():
    """Fast: every ``gm.name(...)`` of the block is public and takes the keywords the block gives it."""
    tree = ast.parse(readme_block())
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)]
    used = [c for c in calls if isinstance(c.func.value, ast.Name) and c.func.value.id == "gm"]
    assert len(used) > 15
    for call in used:
        name = call.func.attr
        assert name in napari_gridmip.__all__, name
        parameters = inspect.signature(getattr(napari_gridmip, name)).parameters
        for keyword in call.keywords:
            assert keyword.arg in parameters, f"{name}({keyword.arg}=...)"


@pytest.mark.slow  # about 80 s on a shared 2-core machine, most of it compiling; the test above is its fast check
def test_the_readme_block_runs():
    namespace: dict = {}
    code = readme_block()
    exec(compile(code, "README.md", "exec"), namespace)
    claimed = re.search(r"\[level.shape for level in levels\]\n# (\[.*\])", code).group(1)
    first = napari_gridmip.occupancy_mipmap(namespace["np"].random.rand(100, 70, 33), threshold=0.99)
    assert str([level.shape for level in first]) == claimed
