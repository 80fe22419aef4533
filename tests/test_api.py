"""The public API's conventions, enforced (in the manner of dm-pix's api_test.py).

- ``napari_gridmip.__all__`` is the API: every name in it is documented and
  resolves; no core module exports anything else.
- The data arguments come first and may be positional; every option after them
  is keyword-only.
- Each function's docstring states its parameters, what it returns and what it raises.
- The few public types (enums the functions return) are in ``__all__`` too, each documented, each member too.
- The option lists of ``napari_gridmip.core.options`` are public: tuples of strings, each documented.
"""

import ast
import enum
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import napari_gridmip
from napari_gridmip import core

# The positional (data) parameters of each public function; everything else is keyword-only.
DATA_ARGUMENTS = {
    "occupancy_mipmap": ("volume",),
    "mipmap_shapes": ("shape",),
    "max_mipmap": ("volume",),
    "threshold_mipmap": ("max_levels",),
    "occupied_bbox": ("levels",),
    "is_empty": ("levels", "lo", "hi"),
    "occupied_chunks": ("levels", "chunks"),
    "pack_occupancy": ("level",),
    "unpack_occupancy": ("bits", "shape"),
    "traverse_occupied": ("levels", "origins", "directions"),
    "orthographic_rays": ("center", "view", "up", "image_shape"),
    "render_volume": ("volume", "levels", "origins", "directions"),
    "camera_rays": ("center", "view", "up", "canvas_size"),
    "render_view": ("volume", "cells", "origins", "directions"),
    "colorize_view": ("values",),
    "extract_patches": ("image", "patch_size", "stride"),
    "merge_patches": ("patches", "image_shape", "stride"),
    "apply_tiled": ("fn", "image", "tile"),
    "windowed_pearson": ("img1", "img2", "window"),
    "find_displacement": ("img1", "img2", "window"),
    "correlate_series": ("frames",),
    "correlate_volumes": ("reference", "deformed"),
    "correlate_volume_series": ("volumes",),
    "volume_strain": ("result",),
    "displacement_vectors": ("dy", "dx"),
    "filter_tiled": ("image", "tile"),
    "grid_positions": ("grid_shape", "tile_shape", "overlap"),
    "register_tiles": ("tiles", "positions"),
    "fuse_tiles": ("tiles", "positions"),
    "integrate_gradient": ("gy", "gx"),
    "phase_from_displacement": ("dy", "dx"),
    "strain_field": ("dy", "dx"),
    "local_correlation_image": ("movie",),
    "track_speckles": ("sample", "reference", "window"),
    "compute_on": ("where",),  # a context manager: where the kernels called in its block run
    "read_array": ("path",),
    "read_tiles": ("folder", "pattern"),
    "write_mipmap": ("volume", "path"),
    "read_mosaic": ("path",),
    "write_ome_zarr": ("image", "path"),
    "write_tile_configuration": ("names", "positions", "path"),
    "write_series_csv": ("series", "folder"),
}

# The public types: enums that the functions' results hold (a DIC series' per-point status)
TYPES = ("Status",)

FUNCTIONS = sorted(name for name in napari_gridmip.__all__ if name not in ("__version__", *TYPES))


def test_the_api_is_exactly_these_functions_and_types():
    assert FUNCTIONS == sorted(DATA_ARGUMENTS)
    assert sorted(core.__all__) == sorted([f for f in FUNCTIONS if f not in napari_gridmip._IO] + list(TYPES))


def documented_assignments(path: Path, names: set[str] | None = None) -> dict[str, bool]:
    """Each simple assignment at the top of ``path``'s module (or of its class ``names``' bodies), and whether a
    string (its docstring) follows it."""
    tree = ast.parse(path.read_text())
    bodies = [tree.body] if names is None else [n.body for n in tree.body if getattr(n, "name", None) in names]
    found = {}
    for body in bodies:
        for statement, after in zip(body, [*body[1:], None]):
            if isinstance(statement, ast.Assign) and isinstance(statement.targets[0], ast.Name):
                found[statement.targets[0].id] = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
    return found


@pytest.mark.parametrize("name", TYPES)
def test_public_types_are_documented_enums(name):
    kind = getattr(napari_gridmip, name)
    assert issubclass(kind, enum.Enum) and kind.__module__.startswith("napari_gridmip.core.")
    assert inspect.getdoc(kind)
    members = documented_assignments(Path(inspect.getfile(kind)), {name})
    assert sorted(members) == sorted(kind.__members__)
    undocumented = [m for m, documented in members.items() if not documented and m != "ok"]  # ok: the class says
    assert undocumented == [], f"{name}: members without a docstring: {undocumented}"


def test_option_lists_are_public_tuples_of_words_each_documented():
    from napari_gridmip.core import options

    lists = {name: value for name, value in vars(options).items() if name.isupper()}
    assert len(lists) > 10
    for name, value in lists.items():
        assert isinstance(value, tuple) and value and all(isinstance(v, str) for v in value), name
    documented = documented_assignments(Path(options.__file__))
    assert {name for name in lists if not documented.get(name)} == set()


@pytest.mark.parametrize("name", FUNCTIONS)
def test_options_are_keyword_only(name):
    signature = inspect.signature(getattr(napari_gridmip, name))
    positional = [
        p.name
        for p in signature.parameters.values()
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    assert tuple(positional) == DATA_ARGUMENTS[name]
    assert not any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in signature.parameters.values())


@pytest.mark.parametrize("name", FUNCTIONS)
def test_documented(name):
    function = getattr(napari_gridmip, name)
    doc = inspect.getdoc(function) or ""
    assert function.__module__.startswith(("napari_gridmip.core.", "napari_gridmip.io."))
    if name != "mipmap_shapes":  # a one-line helper with a doctest
        for section in ("Parameters", "Returns", "Raises"):
            assert f"\n{section}\n" in doc, f"{name}: no {section} section"
        for parameter in inspect.signature(function).parameters:
            assert parameter in doc, f"{name}: parameter {parameter!r} undocumented"


def test_core_modules_export_only_the_api():
    for info in pkgutil.walk_packages(core.__path__, prefix="napari_gridmip.core."):
        module = importlib.import_module(info.name)
        exported = set(getattr(module, "__all__", ()))
        leaf = info.name.rsplit(".", 1)[-1]
        if info.ispkg:
            assert not exported, info.name  # subpackages export nothing: the API is flat
        elif leaf.startswith("_"):
            assert not exported & {*FUNCTIONS, *TYPES}, info.name
        else:
            assert exported <= {*FUNCTIONS, *TYPES}, (info.name, exported - {*FUNCTIONS, *TYPES})


def test_no_import_cycle_between_correlation_and_refine():
    import ast
    from pathlib import Path

    folder = Path(core.__file__).parent
    refine_imports = {
        node.module
        for node in ast.walk(ast.parse((folder / "correlation" / "refine.py").read_text()))
        if isinstance(node, ast.ImportFrom)
    }
    assert "napari_gridmip.core.correlation.maps" not in refine_imports
