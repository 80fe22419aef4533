"""``python -m benchmarks``, the benchmarks' one entry point: it lists them, runs some at their ``--quick`` sizes into
JSON result files, and compares two such files."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
# Two of the cheapest benchmarks at their --quick sizes (seconds each), with JAX on the host CPU.
CHEAP = ("fields", "mipmap")


def run(*args: str, results: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    if results is not None:
        env["NAPARI_GRIDMIP_BENCH_RESULTS"] = str(results)
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env
    )


def test_the_listing_names_every_benchmark_and_probe_with_its_docstring():
    done = run("list")
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("  ")}
    scripts = sorted(BENCHMARKS.glob("bench_*.py")) + sorted(BENCHMARKS.glob("probes/[!_]*.py"))
    assert sum(p.name.startswith("bench_") for p in scripts) >= 20
    assert any(p.parent.name == "probes" for p in scripts)
    for path in scripts:
        name = path.stem.removeprefix("bench_")
        assert name in listed, path.name
        first_line = ast.get_docstring(ast.parse(path.read_text())).splitlines()[0]
        assert first_line in listed[name], path.name
    assert not [name for name in listed if name.startswith("_")]  # helpers are not benchmarks


def test_every_benchmark_uses_the_harness_and_has_a_quick_size():
    for path in BENCHMARKS.glob("bench_*.py"):
        text = path.read_text()
        assert "start_run(" in text and "_harness" in text, path.name
        assert 'add_argument("--quick"' in text, path.name


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory) -> Path:
    """One --quick run of each cheap benchmark, then a second of the first, into a folder of their own."""
    results = tmp_path_factory.mktemp("results")
    done = run("run", *CHEAP, "--quick", "--repeats", "1", results=results)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    again = run("run", CHEAP[0], "--quick", "--repeats", "1", results=results)
    assert again.returncode == 0, again.stderr[-3000:]
    return results


def test_a_quick_run_writes_one_json_file_per_benchmark_with_positive_times(quick_results):
    for name in CHEAP:
        files = sorted(quick_results.glob(f"{name}-*.json"))
        assert len(files) == (2 if name == CHEAP[0] else 1), files
        run_record = json.loads(files[0].read_text())
        assert run_record["benchmark"] == name and run_record["quick"] is True and run_record["error"] is None
        machine = run_record["machine"]
        assert machine["cores"] >= 1 and machine["device"]["platform"] == "cpu" and machine["device"]["kind"]
        assert {"python", "jax", "numpy", "napari-gridmip"} <= set(machine["versions"])
        cases = run_record["cases"]
        assert len(cases) >= 4
        for case in cases:
            assert case["first_s"] > 0 and case["best_s"] > 0 and case["median_s"] >= case["best_s"], case
            assert case["times_s"] and min(case["times_s"]) == case["best_s"], case
            assert case["peak_mb"] is not None, case
        references = [c for c in cases if c["name"] == c["reference"]]
        assert references and all(c["ratio"] == 1.0 for c in references)
        assert all(c["ratio"] > 0 for c in cases if c["reference"])


def test_compare_two_files_and_the_last_two_runs_of_a_benchmark(quick_results):
    a, b = sorted(quick_results.glob(f"{CHEAP[0]}-*.json"))
    done = run("compare", str(a), str(b), results=quick_results)
    assert done.returncode == 0, done.stderr
    first_case = json.loads(a.read_text())["cases"][0]["name"]
    row = next(line for line in done.stdout.splitlines() if f"| {first_case} |" in line)
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert len(cells) == 9 and float(cells[6]) > 0  # B's best time over A's
    by_name = run("compare", CHEAP[0], results=quick_results)
    assert by_name.returncode == 0, by_name.stderr
    assert str(a) in by_name.stdout and str(b) in by_name.stdout
    assert run("compare", CHEAP[1], results=quick_results).returncode == 2  # a single run: nothing to compare


def test_compare_by_name_leaves_out_a_run_that_failed(quick_results, tmp_path):
    a, b = sorted(quick_results.glob(f"{CHEAP[0]}-*.json"))
    for path in (a, b):
        (tmp_path / path.name).write_text(path.read_text())
    failed = {**json.loads(b.read_text()), "started": "9999-01-01T00:00:00+00:00", "error": "RuntimeError: stopped"}
    (tmp_path / f"{CHEAP[0]}-99990101T000000Z-1.json").write_text(json.dumps(failed))
    done = run("compare", CHEAP[0], results=tmp_path)
    assert done.returncode == 0, done.stderr
    assert a.name in done.stdout and b.name in done.stdout and "9999" not in done.stdout


def test_a_benchmark_runs_by_name_with_its_arguments_and_unknown_names_fail():
    done = run("series", "--help")
    assert done.returncode == 0, done.stderr
    assert "bench_series.py" in done.stdout and "--quick" in done.stdout
    missing = run("run", "no_such_benchmark")
    assert missing.returncode == 2
    assert "no_such_benchmark" in missing.stderr and "series" in missing.stderr
