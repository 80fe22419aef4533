"""``python -m benchmarks``: list the benchmarks; ``python -m benchmarks NAME [args...]``: run one.

NAME is ``bench_NAME.py``'s NAME, or another script's own name (``soak``, ``gil_probe``, ...). The script runs as
``python benchmarks/FILE.py [args...]`` would run it, in a child process of this interpreter (each script puts its
own folder and the repository on ``sys.path``, and some start children of themselves by ``__file__``); its exit
status is this one's.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
HARNESS = "_harness.py"


def scripts() -> dict[str, Path]:
    """Every runnable script by the name ``python -m benchmarks NAME`` takes: ``bench_x.py`` as ``x``, any other
    ``y.py`` as ``y`` (as ``y.py`` where a ``bench_y.py`` takes ``y``). Helpers (``_*.py``) are left out."""
    files = sorted(p for p in HERE.glob("*.py") if not p.name.startswith("_"))
    named = {p.stem.removeprefix("bench_"): p for p in files if p.stem.startswith("bench_")}
    for p in files:
        if not p.stem.startswith("bench_"):
            named[p.name if p.stem in named else p.stem] = p
    return named


def summary(path: Path) -> str:
    """The first line of the script's docstring, read without importing it (imports are the slow part)."""
    try:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    except (OSError, SyntaxError, ValueError) as error:
        return f"(unreadable: {error})"
    return doc.strip().splitlines()[0] if doc and doc.strip() else "(no docstring)"


def listing() -> str:
    named = scripts()
    width = max(map(len, named), default=0)
    lines = [
        f"Benchmarks in {HERE.name}/ (shared harness: {HERE.name}/{HARNESS}: warm-up, best of N, peak memory, "
        "ratio tables).",
        "Run one from the repository root: python -m benchmarks NAME [args...]  (NAME --help for its options),",
        f"or as a script: python {HERE.name}/FILE.py [args...]. Figures and commands: docs/benchmarks.md.",
    ]
    groups = (
        ("benchmarks (bench_*.py)", [n for n, p in named.items() if p.stem.startswith("bench_")]),
        ("probes, checks and soaks", [n for n, p in named.items() if not p.stem.startswith("bench_")]),
    )
    for title, names in groups:
        lines += ["", f"{title}:"]
        lines += [f"  {name:<{width}}  {summary(named[name])}" for name in sorted(names)]
    return "\n".join(lines)


def resolve(name: str) -> Path | None:
    named = scripts()
    if name in named:
        return named[name]
    stem = name.removesuffix(".py")  # the file's own name, bench_ prefix and all, also works
    for path in named.values():
        if path.stem == stem:
            return path
    return None


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "--list", "list"):
        print(listing())
        return 0
    name, args = argv[0], argv[1:]
    path = resolve(name)
    if path is None:
        print(f"no benchmark named {name!r}\n\n{listing()}", file=sys.stderr)
        return 2
    try:
        return subprocess.call([sys.executable, str(path), *args])
    except KeyboardInterrupt:  # the child had the same Ctrl+C and has been stopped
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
