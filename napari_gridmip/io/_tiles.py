"""A folder of tile images named by a pattern, read lazily as one tile stack."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from napari_gridmip.io._read import open_tiff

FIELDS = ("plane", "row", "col", "index")  # grid fields slowest first; or one acquisition index
_FIELD = re.compile(r"\{(\w+)(?::0?(\d+))?\}")


class TileFolder(NamedTuple):
    """What :func:`read_tiles` returns."""

    tiles: Any
    """``(n, *tile)`` dask array: one tile per file, in grid (row-major) or index order; nothing read yet."""
    grid_index: np.ndarray | None
    """``(n, d)`` int: each tile's (row, col) or (plane, row, col), from 0; None for an ``{index}`` pattern."""
    index: np.ndarray | None
    """``(n,)`` int: each tile's ``{index}`` as in its name; None for a grid pattern."""
    paths: list[Path]
    """The file of each tile."""


def pattern_regex(pattern: str) -> tuple[re.Pattern, list[str]]:
    """A regex for ``pattern`` and its fields in order; ``{row:03}`` means exactly 3 digits, ``{row}`` any."""
    fields: list[str] = []
    parts, last = [], 0
    for match in _FIELD.finditer(pattern):
        name, width = match.group(1), match.group(2)
        if name not in FIELDS:
            raise ValueError(f"pattern {pattern!r}: unknown field {{{name}}}; use {{row}} and {{col}} (and {{plane}}), "
                             "or {index}")  # fmt: skip
        if name in fields:
            raise ValueError(f"pattern {pattern!r} names {{{name}}} twice")
        fields.append(name)
        parts.append(re.escape(pattern[last : match.start()]))
        parts.append(f"(?P<{name}>\\d{{{int(width)}}})" if width else f"(?P<{name}>\\d+)")
        last = match.end()
    parts.append(re.escape(pattern[last:]))
    if not fields:
        raise ValueError(f"pattern {pattern!r} has no field: name tiles like 'tile_{{row}}_{{col}}.tif' or "
                         "'img_{index:03}.tif'")  # fmt: skip
    if "index" in fields and len(fields) > 1:
        raise ValueError(f"pattern {pattern!r}: {{index}} cannot be combined with grid fields")
    if "index" not in fields and not {"row", "col"} <= set(fields):
        raise ValueError(f"pattern {pattern!r}: a grid pattern needs both {{row}} and {{col}}")
    return re.compile("".join(parts) + r"\Z"), fields


def read_tiles(folder: str | os.PathLike, pattern: str) -> TileFolder:
    """Read a folder of TIFF tiles whose names follow ``pattern``, lazily, as one stack.

    Parameters
    ----------
    folder
        The folder holding the tiles (other files are ignored).
    pattern
        The tiles' file name with fields: ``{row}`` and ``{col}`` (and
        ``{plane}`` for a 3D grid), e.g. ``"tile_{row}_{col}.tif"``, or one
        acquisition ``{index}``, e.g. ``"img_{index:03}.tif"``. ``{name:03}``
        matches exactly 3 digits, ``{name}`` any number of them. Numbering
        may start anywhere (0 or 1); it must have no gaps.

    Returns
    -------
    TileFolder
        ``tiles`` ``(n, *tile)`` dask array (one chunk per tile), in row-major
        grid order or index order, with ``grid_index`` (grid patterns, from 0)
        or ``index`` (index patterns), and the ``paths``.

    Raises
    ------
    ValueError
        If the folder does not exist, the pattern is malformed, no file
        matches, tiles are missing (the message names them), two files claim
        the same tile, or the tiles' shapes or dtypes differ (naming a file of
        each).
    """
    import dask
    import dask.array as da
    import tifffile

    folder = Path(folder).absolute()
    if not folder.is_dir():
        raise ValueError(f"{str(folder)!r} is not a folder")
    regex, fields = pattern_regex(pattern)
    found: dict[tuple[int, ...], Path] = {}
    for path in sorted(folder.iterdir()):
        match = regex.match(path.name)
        if match is None:
            continue
        key = tuple(int(match.group(f)) for f in fields)
        if key in found:
            raise ValueError(f"{found[key].name!r} and {path.name!r} are the same tile ({', '.join(fields)} {key})")
        found[key] = path
    if not found:
        raise ValueError(f"no file in {str(folder)!r} matches the pattern {pattern!r}")
    if fields == ["index"]:
        keys = sorted(found)
        first, last = keys[0][0], keys[-1][0]
        missing = sorted(set(range(first, last + 1)) - {k[0] for k in keys})
        if missing:
            raise ValueError(f"{len(missing)} tile(s) missing between index {first} and {last}: "
                             f"{_examples(pattern, 'index', missing)}")  # fmt: skip
        index, grid = np.array([k[0] for k in keys]), None
    else:
        order = [f for f in FIELDS if f in fields]  # plane, row, col: slowest first
        keys_in_order = {tuple(k[fields.index(f)] for f in order): p for k, p in found.items()}
        lows = [min(k[a] for k in keys_in_order) for a in range(len(order))]
        sizes = [max(k[a] for k in keys_in_order) - lows[a] + 1 for a in range(len(order))]
        expected = list(np.ndindex(*sizes))

        def named(e):
            return tuple(int(v) + low for v, low in zip(e, lows))

        missing = [named(e) for e in expected if named(e) not in keys_in_order]
        if missing:
            named = [pattern.format(**dict(zip(order, m))) for m in missing[:5]]
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise ValueError(f"{len(missing)} tile(s) missing from the {'x'.join(map(str, sizes))} grid: "
                             f"{', '.join(named)}{more}")  # fmt: skip
        keys = [named(e) for e in expected]
        found = keys_in_order
        grid, index = np.array(expected, dtype=np.int64), None
    paths = [found[k] for k in keys]
    shape = dtype = None
    first_path = paths[0]
    for path in paths:
        with open_tiff(path) as tif:
            series = tif.series[0]
            this_shape, this_dtype = tuple(series.shape), np.dtype(series.dtype)
        if shape is None:
            shape, dtype = this_shape, this_dtype
        elif (this_shape, this_dtype) != (shape, dtype):
            raise ValueError(f"tiles differ: {first_path.name!r} is {shape} {dtype}, {path.name!r} is "
                             f"{this_shape} {this_dtype}")  # fmt: skip
    read = dask.delayed(tifffile.imread, pure=True)
    tiles = da.stack([da.from_delayed(read(str(p)), shape=shape, dtype=dtype) for p in paths])
    return TileFolder(tiles, grid, index, paths)


def _examples(pattern: str, field: str, values: list[int]) -> str:
    named = [pattern.format(**{field: v}) for v in values[:5]]
    return ", ".join(named) + (f" and {len(values) - 5} more" if len(values) > 5 else "")
