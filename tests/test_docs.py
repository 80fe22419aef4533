"""Docs that cannot rot: the docstring examples run in the default suite (pyproject's --doctest-modules over the
package), every module imports without a display, the README's "From Python" block runs, and the reference pages
stay short, free of history (sessions, dates, issue numbers: git keeps those) and of links to missing files."""

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


# The reference docs: short enough to read, no diary, no dead links.
README_MAX_LINES = 250
DOCS_PAGE_MAX_LINES = 600
HISTORY_PATTERNS = {
    "a session's name": r"\b(third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth"
    r"|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|\d+(st|nd|rd|th))\s+session\b"
    r"|\bsession\s+\d+\b",
    "an issue number": r"\bissues?\s+#?\d+",
    "a development round or stop": r"\bround\s+r\d+\b|\b(first|second|third|fourth|fifth|sixth)\s+stop\b",
    "an ISO date": r"\b\d{4}-\d{2}-\d{2}\b",
}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def reference_pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "sample_data" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def test_the_readme_is_a_five_minute_read():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


def test_every_docs_page_stays_readable():
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert len(pages) >= 8
    long = {p.name: n for p in pages if (n := p.read_text().count("\n")) > DOCS_PAGE_MAX_LINES}
    assert not long, f"pages over {DOCS_PAGE_MAX_LINES} lines: {long}"


def test_raw_run_logs_are_not_kept_in_the_docs():
    assert not (ROOT / "docs" / "accelerator-runs").exists()


@pytest.mark.parametrize("page", reference_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_docs_carry_no_history(page):
    """Sessions, dates and issue numbers belong in git's history, not in a reference page."""
    found = [
        f"line {number}: {what}: {match.group(0)!r}"
        for number, line in enumerate(page.read_text().splitlines(), 1)
        for what, pattern in HISTORY_PATTERNS.items()
        if (match := re.search(pattern, line, re.I))
    ]
    assert not found, "\n".join(found)


def test_the_changelog_dates_only_its_versions():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(r"^## \[?Unreleased\]?", text, re.M) and re.search(r"^## \[?\d+\.\d+\.\d+\]?", text, re.M)
    found = [
        f"line {number}: {what}: {match.group(0)!r}"
        for number, line in enumerate(text.splitlines(), 1)
        for what, pattern in HISTORY_PATTERNS.items()
        if (match := re.search(pattern, line, re.I)) and not (what == "an ISO date" and line.startswith("## "))
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("page", [*reference_pages(), ROOT / "CHANGELOG.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file(page):
    targets = LINK.findall(without_code_blocks(page.read_text()))
    relative = [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I) and not t.startswith("#")]
    missing = [t for t in relative if not (page.parent / t.split("#")[0]).exists()]
    assert not missing, f"{page.name} links to missing files: {missing}"


def test_the_checks_see_what_they_look_for():
    """The link and history tests above would pass vacuously if their patterns found nothing."""
    targets = LINK.findall(without_code_blocks((ROOT / "README.md").read_text()))
    assert "docs/images/mipmap_3d.png" in targets and "docs/accelerator.md" in targets
    assert re.search(HISTORY_PATTERNS["a session's name"], "Fourteenth session (GIL)", re.I)
    assert not re.search(HISTORY_PATTERNS["a session's name"], "a user's first session, then the next session", re.I)
    assert re.search(HISTORY_PATTERNS["an ISO date"], "run on 2026-12-07")
    assert re.search(HISTORY_PATTERNS["an issue number"], "(issue 53, item 2)", re.I)
