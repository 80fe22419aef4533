"""``python -m benchmarks``, the benchmarks' one entry point: it lists every script and runs one by name."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args], capture_output=True, text=True, timeout=300, cwd=ROOT
    )


def test_the_listing_names_every_benchmark_with_its_docstring():
    done = run()
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("  ")}
    assert "_harness.py" in done.stdout  # the shared harness, named in the header
    scripts = [p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")]
    assert sum(p.name.startswith("bench_") for p in scripts) >= 20
    for path in scripts:
        name = path.stem.removeprefix("bench_")
        assert name in listed, path.name
        first_line = ast.get_docstring(ast.parse(path.read_text())).splitlines()[0]
        assert first_line in listed[name], path.name
    assert not [name for name in listed if name.startswith("_")]  # helpers are not benchmarks


def test_a_benchmark_runs_by_name_with_its_arguments():
    done = run("series", "--help")
    assert done.returncode == 0, done.stderr
    assert "bench_series.py" in done.stdout and "--quick" in done.stdout


def test_an_unknown_name_fails_with_the_listing():
    done = run("no_such_benchmark")
    assert done.returncode == 2
    assert "no_such_benchmark" in done.stderr and "series" in done.stderr
