"""The package's import graph: no circles, and private modules and names stay inside their package.

No module imports, even inside a function, a module that imports it back (directly or round a longer loop): each
public function validates once and hands its kernel to the dask twin, which imports nothing back; shared pieces sit
in leaf modules below both. What one package uses of another is that package's internal API, named without an
underscore; a leading underscore means "this package's own".
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "napari_gridmip"

# Circles being taken apart elsewhere; each entry is one strongly connected group of modules, exactly as it
# stands. Everything else must be circle-free. Empty: none is left (test_no_known_circles_left keeps it so).
KNOWN: list[set[str]] = []


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def files() -> dict[str, Path]:
    """Every module of the package, by its dotted name."""
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported_names(path: Path) -> list[tuple[str, int]]:
    """The dotted names of the package's modules and names that ``path`` imports (functions too), with their lines."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return [(target, line) for target, line in found if target.split(".")[0] == PACKAGE.name]


def imports() -> dict[str, set[str]]:
    """Each module's imports of the package's own modules, from every import statement in it (functions too)."""
    modules = files()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        # a module, or a name in one
        targets = {t if t in modules else t.rpartition(".")[0] for t, _ in imported_names(path)}
        graph[name] = {t for t in targets if t in modules and t != name}
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


# The top package's own private rooms: the app's machinery, imported by name from anywhere in the package.
APP_ROOMS = {"_jobs", "_widgets", "_sample_data", "_version"}
MOST_PRIVATE_IMPORTS = 15  # the cross-package imports of private names still being made public elsewhere


def private_owner(target: str, modules: dict[str, Path]) -> str | None:
    """The package that directly contains the first private component of ``target`` (a module or a name starting
    with one underscore, the app rooms aside), or None where it has none."""
    parts = target.split(".")
    for i, part in enumerate(parts[1:], start=1):
        if not part.startswith("_") or part.startswith("__") or (i == 1 and part in APP_ROOMS):
            continue
        prefix = ".".join(parts[:i])
        return prefix if prefix in modules and modules[prefix].name == "__init__.py" else prefix.rpartition(".")[0]
    return None


def private_imports() -> list[str]:
    """``module:line -> target`` for each import of a private component from outside the package containing it."""
    modules = files()
    found = []
    for name, path in sorted(modules.items()):
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for target, line in imported_names(path):
            owner = private_owner(target, modules)
            if owner is not None and owner != package:
                found.append(f"{name}:{line} -> {target}")
    return found


def test_the_private_rule():
    modules = files()
    assert private_owner("napari_gridmip.core.occupancy._chunked.pyramid", modules) == "napari_gridmip.core.occupancy"
    assert private_owner("napari_gridmip.core.occupancy.raycast._box_entry", modules) == (
        "napari_gridmip.core.occupancy"
    )
    assert private_owner("napari_gridmip._jobs.plan.Call", modules) is None  # an app room
    assert private_owner("napari_gridmip.core.peak.quadratic_peak", modules) is None
    assert private_owner("napari_gridmip.__version__", modules) is None


def test_private_imports_stay_inside_their_package():
    found = private_imports()
    assert len(found) <= MOST_PRIVATE_IMPORTS, "private imports across packages:\n" + "\n".join(found)
