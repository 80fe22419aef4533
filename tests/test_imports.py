"""Dispatch without circles: no module of the package imports, even inside a function, a module that imports it
back (directly or round a longer loop). Each public function validates once and hands its kernel to the dask twin,
which imports nothing back; shared pieces sit in leaf modules below both."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "napari_gridmip"

# Circles being taken apart elsewhere; each entry is one strongly connected group of modules, exactly as it
# stands. Everything else must be circle-free. Empty: none is left (test_no_known_circles_left keeps it so).
KNOWN: list[set[str]] = []


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Each module's imports of the package's own modules, from every import statement in it (functions too)."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in files else base)  # a module, or a name in one
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_walk_sees_the_dispatch():
    graph = imports()
    assert "napari_gridmip.core.occupancy._chunked" in graph["napari_gridmip.core.occupancy.pyramid"]
    assert "napari_gridmip.core.patches._merge" in graph["napari_gridmip.core.patches._chunked"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_import_circles():
    found = cycles(imports())
    unknown = [sorted(group) for group in found if group not in KNOWN]
    assert unknown == [], f"import circles: {unknown}"


def test_no_known_circles_left():
    assert cycles(imports()) == []
