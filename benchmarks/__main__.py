"""``python -m benchmarks``: list the benchmarks, run some, compare their result files.

    python -m benchmarks list                              # benchmarks and probes, each with its first line
    python -m benchmarks run mipmap dic --quick            # each in turn, the options after the names to each
    python -m benchmarks compare A.json B.json             # each case's times in both, and B's over A's
    python -m benchmarks compare mipmap                    # the last two runs of a benchmark
    python -m benchmarks probe soak --iterations 3         # a probe, soak or reproducer of benchmarks/probes/
    python -m benchmarks NAME [args...]                    # one benchmark or probe, its arguments as they are

A benchmark runs as ``python benchmarks/bench_NAME.py [args...]`` would, in a child process; its JSON result goes
to ``$NAPARI_GRIDMIP_BENCH_RESULTS`` (default ``benchmarks/results/``, outside git).
"""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROBES = HERE / "probes"
HARNESS = "_harness.py"
RESULTS_ENV = "NAPARI_GRIDMIP_BENCH_RESULTS"  # as _harness.py, which this does not import (it imports NumPy)


def benchmarks() -> dict[str, Path]:
    """Every benchmark by the name ``run`` takes: ``bench_NAME.py`` as ``NAME``."""
    return {p.stem.removeprefix("bench_"): p for p in sorted(HERE.glob("bench_*.py"))}


def probes() -> dict[str, Path]:
    """Every probe, soak and reproducer of ``benchmarks/probes/`` by its own name (helpers, ``_*.py``, left out)."""
    return {p.stem: p for p in sorted(PROBES.glob("*.py")) if not p.name.startswith("_")}


def summary(path: Path) -> str:
    """The first line of the script's docstring, read without importing it (imports are the slow part)."""
    try:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    except (OSError, SyntaxError, ValueError) as error:
        return f"(unreadable: {error})"
    return doc.strip().splitlines()[0] if doc and doc.strip() else "(no docstring)"


def listing() -> str:
    named, others = benchmarks(), probes()
    width = max(map(len, [*named, *others]), default=0)
    lines = [
        f"Benchmarks in {HERE.name}/ (one harness, {HERE.name}/{HARNESS}: first call, warm best and median, peak "
        "memory, ratios, machine; one JSON file per run in "
        f"${RESULTS_ENV} or {HERE.name}/results/).",
        "Run: python -m benchmarks run NAME [NAME...] [--quick] [options]   (python -m benchmarks NAME --help: its "
        "options)",
        "Compare: python -m benchmarks compare A.json B.json | NAME   Probes: python -m benchmarks probe NAME [args]",
        "",
        "benchmarks:",
    ]
    lines += [f"  {name:<{width}}  {summary(path)}" for name, path in named.items()]
    lines += ["", f"probes, soaks and reproducers ({HERE.name}/probes/):"]
    lines += [f"  {name:<{width}}  {summary(path)}" for name, path in others.items()]
    return "\n".join(lines)


def results_folder() -> Path:
    return Path(os.environ.get(RESULTS_ENV) or HERE / "results")


def _runs_of(name: str) -> list[Path]:
    """The result files of benchmark ``name`` whose run ended without an error, oldest first (by the time each run
    started, then the file's name)."""
    runs = []
    for path in results_folder().glob(f"{name}-*.json"):
        try:
            record = _load(path)
        except (OSError, ValueError):  # a file being written, or not one of ours
            continue
        if record.get("benchmark") == name and not record.get("error"):
            runs.append((record.get("started", ""), path.name, path))
    return [path for *_, path in sorted(runs)]


def _load(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _call(path: Path, args: list[str]) -> int:
    try:
        return subprocess.call([sys.executable, str(path), *args])
    except KeyboardInterrupt:  # the child had the same Ctrl+C and has been stopped
        return 130


def run(argv: list[str]) -> int:
    """``run NAME [NAME...] [options]``: each benchmark in turn with the options; the files each one wrote."""
    names = []
    while argv and not argv[0].startswith("-"):
        names.append(argv.pop(0))
    known = benchmarks()
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        print(f"no benchmark named {', '.join(map(repr, unknown)) or '(none given)'}\n\n{listing()}", file=sys.stderr)
        return 2
    statuses = {}
    for name in names:
        before = set(results_folder().glob(f"{name}-*.json"))
        print(f"== {name}: python {known[name].relative_to(HERE.parent)} {' '.join(argv)}", flush=True)
        statuses[name] = _call(known[name], argv)
        for path in sorted(set(results_folder().glob(f"{name}-*.json")) - before):
            print(f"== {name}: exit status {statuses[name]}, results {path}", flush=True)
    failed = {n: s for n, s in statuses.items() if s}
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
    return max(failed.values(), default=0)


def _ms(seconds: float | None) -> str:
    return "" if seconds is None or not math.isfinite(seconds) else f"{1e3 * seconds:.1f}"


def _s(seconds: float | None) -> str:
    return "" if seconds is None or not math.isfinite(seconds) else f"{seconds:.3g}"


def _x(value: float | None) -> str:
    return "" if value is None or not math.isfinite(value) else f"{value:.2f}"


def comparison(a: dict[str, Any], b: dict[str, Any], a_name: str = "A", b_name: str = "B") -> str:
    """A Markdown table of each case of either run: first call, best warm time, the ratio B/A of the best
    times, and each run's ratio against its group's reference case."""

    def cases(run: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
        return {(c.get("group", ""), c["name"]): c for c in run.get("cases", [])}

    ca, cb = cases(a), cases(b)
    keys = list(ca) + [k for k in cb if k not in ca]

    def heading(name: str, run: dict[str, Any]) -> str:
        device = run.get("machine", {}).get("device", {})
        where = f"{device.get('platform', '?')}" + (f" ({device['kind']})" if device.get("kind") else "")
        return f"- {name}: {run.get('benchmark')} {run.get('started', '')}, {where}, quick={run.get('quick')}"

    lines = [
        heading(a_name, a),
        heading(b_name, b),
        "",
        f"| group | case | {a_name} first s | {b_name} first s | {a_name} best ms | {b_name} best ms "
        f"| {b_name}/{a_name} | {a_name} x ref | {b_name} x ref |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key in keys:
        x, y = ca.get(key, {}), cb.get(key, {})
        bx, by = x.get("best_s"), y.get("best_s")
        change = by / bx if bx and by and math.isfinite(bx) and math.isfinite(by) and bx > 0 else None
        lines.append(
            f"| {key[0]} | {key[1]} | {_s(x.get('first_s'))} | {_s(y.get('first_s'))} | {_ms(bx)} | {_ms(by)} "
            f"| {_x(change)} | {_x(x.get('ratio'))} | {_x(y.get('ratio'))} |"
        )
    return "\n".join(lines)


def compare(argv: list[str]) -> int:
    """``compare A.json B.json``, or ``compare NAME``: the last two runs of benchmark NAME that ended without an
    error."""
    if len(argv) == 1 and not argv[0].endswith(".json"):
        runs = _runs_of(argv[0])
        if len(runs) < 2:
            print(f"fewer than two runs of {argv[0]!r} without an error in {results_folder()}", file=sys.stderr)
            return 2
        argv = [str(runs[-2]), str(runs[-1])]
    if len(argv) != 2:
        print("usage: python -m benchmarks compare A.json B.json | NAME", file=sys.stderr)
        return 2
    try:
        a, b = (_load(Path(p)) for p in argv)
    except (OSError, ValueError) as error:
        print(f"cannot read a result file: {error}", file=sys.stderr)
        return 2
    print(f"A = {argv[0]}\nB = {argv[1]}")
    print(comparison(a, b))
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "--list", "list"):
        print(listing())
        return 0
    command, rest = argv[0], argv[1:]
    if command == "run":
        return run(rest)
    if command == "compare":
        return compare(rest)
    if command == "probe":
        if not rest or rest[0] not in probes():
            print(f"no probe named {rest[0] if rest else '(none given)'!r}\n\n{listing()}", file=sys.stderr)
            return 2
        return _call(probes()[rest[0]], rest[1:])
    path = benchmarks().get(command.removeprefix("bench_").removesuffix(".py")) or probes().get(command)
    if path is None:
        print(f"no benchmark named {command!r}\n\n{listing()}", file=sys.stderr)
        return 2
    return _call(path, rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
