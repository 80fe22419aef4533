"""Microscope mosaics with their stage positions: OME-TIFF, OME-Zarr collections, Fiji's TileConfiguration.

:func:`read_mosaic` gives the tiles lazily with each tile's origin in pixels, ready for
:func:`~napari_gridmip.register_tiles`; :func:`write_tile_configuration` writes positions back in Fiji's format.

The OME-XML of an OME-TIFF is parsed with ``ome-types`` (a maintained, typed model of the OME schema, one class per
element, with each length's unit as an enum): tifffile reads the pixels of each series and hands over the OME-XML,
but keeps no stage positions or units of its own (its series carry shapes and axes only), and the units are what a
stage position needs: ``PositionX`` may be in nm, µm or mm, ``PhysicalSizeX`` in another one.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from napari_gridmip.io._read import open_tiff

TILE_CONFIGURATIONS = ("TileConfiguration.registered.txt", "TileConfiguration.txt")  # looked for in a folder, in order
TIFF_SUFFIXES = (".tif", ".tiff", ".btf", ".tf8")
IO_EXTRA = "pip install 'napari-gridmip[io]'"

# micrometres per unit: OME's length symbols (UnitsLength) and NGFF's unit names (UDUNITS-2)
_MICROMETRES = {
    "km": 1e9, "hm": 1e8, "dam": 1e7, "m": 1e6, "dm": 1e5, "cm": 1e4, "mm": 1e3, "µm": 1.0, "μm": 1.0, "um": 1.0,
    "nm": 1e-3, "pm": 1e-6, "fm": 1e-9, "Å": 1e-4, "thou": 25.4, "in": 25400.0, "ft": 304800.0,
    "kilometer": 1e9, "hectometer": 1e8, "decameter": 1e7, "meter": 1e6, "decimeter": 1e5, "centimeter": 1e4,
    "millimeter": 1e3, "micrometer": 1.0, "micron": 1.0, "nanometer": 1e-3, "picometer": 1e-6, "femtometer": 1e-9,
    "angstrom": 1e-4, "inch": 25400.0, "foot": 304800.0, "mil": 25.4,
}  # fmt: skip
# OME's default unit of a stage position: the microscope's own frame, which Bio-Formats' readers fill in micrometres
_REFERENCE_FRAME = "reference frame"


class TileMosaic(NamedTuple):
    """What :func:`read_mosaic` returns."""

    tiles: Any
    """``(n, [C,] *shape)`` dask array, ``shape`` ``(Y, X)`` or ``(Z, Y, X)``; nothing read yet."""
    positions: np.ndarray
    """``(n, d)`` float64: each tile's origin (its pixel 0) in pixels, ``(y, x)`` or ``(z, y, x)``."""
    names: list[str]
    """Each tile's name: the OME Image name, the OME-Zarr group, or the file named in the TileConfiguration."""
    pixel_size: tuple[float, ...] | None
    """``(y, x)`` or ``(z, y, x)`` in micrometres; None when the file states none."""


def read_mosaic(
    path: str | os.PathLike,
    *,
    pattern: str | None = None,
    overlap: float | Sequence[float] | None = None,
    pixel_size: float | Sequence[float] | None = None,
) -> TileMosaic:
    """Read a microscope mosaic, lazily, with each tile's stage position in pixels.

    Parameters
    ----------
    path
        One of:

        - an OME-TIFF whose series (OME ``Image``) are the tiles, placed by each image's first ``Plane``
          ``PositionX/Y/Z`` (``StageLabel`` X/Y/Z where no plane has one), in their units (``PositionXUnit``;
          OME's default "reference frame" is taken as micrometres, as Bio-Formats writes it), divided by the
          ``Pixels`` ``PhysicalSizeX/Y/Z`` in theirs;
        - an OME-Zarr (NGFF 0.4 or 0.5) collection: a Zarr group whose child groups are images (e.g. the fields
          of a plate's well, or bioformats2raw's ``0``, ``1``, ...), each placed by the ``translation`` of its
          level 0 divided by its ``scale`` (the multiscale's own transforms included);
        - Fiji's ``TileConfiguration.txt`` or ``TileConfiguration.registered.txt`` (2D or 3D), or a folder holding
          one (``.registered`` first): its image files are read relative to its folder;
        - a folder of TIFF tiles named by ``pattern``, placed on their grid with ``overlap``.
    pattern
        With a folder: the tiles' file names, as for :func:`~napari_gridmip.read_tiles`; it must name the grid
        (``{row}``, ``{col}``, and ``{plane}`` in 3D), e.g. ``"tile_{row}_{col}.tif"``.
    overlap
        With ``pattern``: the nominal overlap of neighbours, a fraction of the tile (one number, or one per axis),
        as for :func:`~napari_gridmip.grid_positions`.
    pixel_size
        Micrometres per pixel, ``(y, x)``, ``(z, y, x)`` or one number for every axis: what ``pixel_size``
        reports, in place of the file's own. An OME-TIFF's stage positions are turned into pixels with it
        (needed where the file states positions but no ``PhysicalSize``); an OME-Zarr tile's position is its
        translation over its scale, whatever this says.

    Returns
    -------
    TileMosaic
        ``tiles`` ``(n, [C,] *shape)`` dask array (tile axes reordered to channel, then ``Z, Y, X``; a time axis
        must have one point), ``positions`` ``(n, d)`` float64 pixels ``(y, x)`` or ``(z, y, x)``, as in the file
        (the stage's origin kept: :func:`~napari_gridmip.register_tiles` and :func:`~napari_gridmip.fuse_tiles`
        take any origin), ``names`` and ``pixel_size`` (micrometres, or None).

    Raises
    ------
    FileNotFoundError
        If ``path``, or an image file that a TileConfiguration names, does not exist.
    ValueError
        If the format is none of these (the message says what is expected), the file holds no stage positions or
        pixel size to convert them with, the tiles differ in shape, dtype or pixel size, a TileConfiguration line
        is malformed (the message gives its number), or ``pattern`` and ``overlap`` do not go together.
    ImportError
        If ``ome-types`` (for OME-TIFF) or tifffile is not installed (``pip install 'napari-gridmip[io]'``).

    References
    ----------
    .. [1] OME data model and XML schema, 2016-06: ``Plane``, ``StageLabel``, ``Pixels``,
       https://www.openmicroscopy.org/Schemas/Documentation/Generated/OME-2016-06/ome.html
    .. [2] OME-NGFF 0.4 and 0.5, ``multiscales`` and ``coordinateTransformations``, https://ngff.openmicroscopy.org
    .. [3] Preibisch, Saalfeld and Tomancak (2009), "Globally optimal stitching of tiled 3D microscopic image
       acquisitions", Bioinformatics 25(11), 1463-1465 (Fiji's Stitching plugin and its TileConfiguration).
    """
    path = Path(path).absolute()  # the graph may run elsewhere (a cluster's workers)
    if not path.exists():
        raise FileNotFoundError(f"{str(path)!r} does not exist")
    size = _pixel_size_option(pixel_size)
    if pattern is not None or overlap is not None:
        if not path.is_dir() or pattern is None or overlap is None:
            raise ValueError(f"pattern= and overlap= go together, with a folder of TIFF tiles; got {str(path)!r}, "
                             f"pattern={pattern!r}, overlap={overlap!r}")  # fmt: skip
        return _read_pattern(path, pattern, overlap, size)
    if path.is_dir():
        if _is_zarr(path):
            return _read_ome_zarr(path, size)
        for name in TILE_CONFIGURATIONS:
            if (path / name).is_file():
                return _read_tile_configuration(path / name, pixel_size=size)
        raise ValueError(f"{str(path)!r} is a folder without {' or '.join(TILE_CONFIGURATIONS)} and not a Zarr "
                         "group: pass pattern= and overlap= for a folder of TIFF tiles")  # fmt: skip
    name = path.name.lower()
    if name.endswith(".txt"):
        return _read_tile_configuration(path, pixel_size=size)
    if name.endswith(TIFF_SUFFIXES):
        return _read_ome_tiff(path, size)
    raise ValueError(f"{str(path)!r}: expected an OME-TIFF (.ome.tif), an OME-Zarr collection, a Fiji "
                     "TileConfiguration (.txt), or a folder holding one")  # fmt: skip


# --- Fiji's TileConfiguration -------------------------------------------------------------------------------------


def _read_tile_configuration(path: str | os.PathLike, *, pixel_size: Sequence[float] | None = None) -> TileMosaic:
    """A Fiji ``TileConfiguration[.registered].txt`` and the TIFF files it names, lazily (see :func:`read_mosaic`).

    The grammar is that of Fiji's Stitching plugin (``Stitching_Grid.getLayoutFromFile``): lines starting with
    ``#`` and lines of 3 characters or fewer are skipped; ``dim = 2`` or ``dim = 3`` comes before the tiles; each
    tile is ``file; ; (x, y)`` or ``file; ; (x, y, z)``, the file relative to the configuration's folder.
    ``multiseries = true`` (tiles as series of one file, which Fiji reads through Bio-Formats) is refused.
    """
    import dask
    import dask.array as da

    tifffile = _import("tifffile")
    path = Path(path).absolute()
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r} does not exist")
    dim, names, coords = None, [], []
    for number, raw in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        line = raw.strip()
        if line.startswith("#") or len(line) <= 3:
            continue
        where = f"{path.name}, line {number}"
        if ";" not in line and "=" in line:
            key, _, value = (part.strip() for part in line.partition("="))
            if key == "dim":
                if value not in ("2", "3"):
                    raise ValueError(f"{where}: 'dim = {value}'; Fiji's TileConfiguration has dim = 2 or dim = 3")
                dim = int(value)
            elif key == "multiseries":
                if value.lower() == "true":
                    raise ValueError(f"{where}: 'multiseries = true' (tiles as series of one file, read by "
                                     "Bio-Formats) is not supported: save the tiles as one file each, or read an "
                                     "OME-TIFF's series with read_mosaic")  # fmt: skip
            else:
                raise ValueError(f"{where}: unknown setting {key!r}; expected 'dim = 2' or 'dim = 3'")
            continue
        if dim is None:
            raise ValueError(f"{where}: a tile before 'dim = 2' or 'dim = 3': {line!r}")
        entries = line.split(";")
        point = entries[-1].strip() if len(entries) == 3 else ""
        if len(entries) != 3 or not entries[0].strip() or not (point.startswith("(") and point.endswith(")")):
            raise ValueError(f"{where}: expected 'file; ; ({'x, y, z' if dim == 3 else 'x, y'})'; got {line!r}")
        try:
            values = [float(v) for v in point[1:-1].split(",")]
        except ValueError:
            raise ValueError(f"{where}: cannot read the coordinates {point!r}") from None
        if len(values) != dim or not all(math.isfinite(v) for v in values):
            raise ValueError(f"{where}: dim = {dim} needs {dim} finite coordinates; got {point!r}")
        names.append(entries[0].strip())
        coords.append(values[::-1])  # Fiji's (x, y[, z]) to (y, x) / (z, y, x)
    if not names:
        raise ValueError(f"{str(path)!r} names no tile: expected lines 'dim = 2' and 'file; ; (x, y)'")
    folder = path.parent
    arrays = []
    read = dask.delayed(tifffile.imread, pure=True)
    layout = None
    for name in names:
        file = folder / name
        if not file.is_file():
            raise FileNotFoundError(f"{str(file)!r}, which {path.name} names, does not exist")
        with open_tiff(file) as tif:
            series = tif.series[0]
            shape, dtype, axes = tuple(series.shape), np.dtype(series.dtype), series.axes
        this = (shape, dtype, axes)
        if layout is not None and this != layout:
            raise ValueError(f"tiles differ: {names[0]!r} is {layout[0]} {layout[1]}, {name!r} is {shape} {dtype}")
        layout = this
        tile = da.from_delayed(read(str(file)), shape=shape, dtype=dtype)
        arrays.append(_arrange(tile, axes, dim, name))
    return TileMosaic(da.stack(arrays), np.asarray(coords, dtype=np.float64), names, _for_axes(pixel_size, dim))


def write_tile_configuration(
    names: Sequence[str], positions: Any, path: str | os.PathLike, *, overwrite: bool = False
) -> Path:
    """Write tiles' positions as Fiji's ``TileConfiguration.txt``, which Fiji's Stitching and BigStitcher import.

    Parameters
    ----------
    names
        Each tile's image file, relative to the configuration's folder (as Fiji resolves it).
    positions
        ``(n, 2)`` ``(y, x)`` or ``(n, 3)`` ``(z, y, x)`` origins in pixels (e.g. ``register_tiles(...).positions``);
        written ``x`` first, as Fiji reads them, with every digit of the float64 (no exponent), so that
        :func:`read_mosaic` gives them back exactly (Fiji keeps a float32 of each: 0.01 px up to 100,000 px).
    path
        The file to write (``TileConfiguration.registered.txt`` for positions after registration, by Fiji's
        naming); written under a temporary name, then renamed.
    overwrite
        Replace an existing ``path``.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    ValueError
        If ``positions`` is not ``(n, 2)`` or ``(n, 3)`` finite numbers, ``names`` does not give one non-empty
        name per tile, a name holds ``;`` or a line break (Fiji's separators), or ``path`` exists and
        ``overwrite`` is false.

    References
    ----------
    .. [1] Preibisch, Saalfeld and Tomancak (2009), Bioinformatics 25(11), 1463-1465; the format is that of Fiji's
       ``Stitching_Grid.writeTileConfiguration``.
    """
    from napari_gridmip.core.runtime.files import atomic_path

    positions = np.asarray(positions, dtype=np.float64)
    if positions.ndim != 2 or positions.shape[1] not in (2, 3) or not np.isfinite(positions).all():
        raise ValueError(f"positions must be (n, 2) (y, x) or (n, 3) (z, y, x) finite pixels; got shape "
                         f"{positions.shape}")  # fmt: skip
    names = [str(name) for name in names]
    if len(names) != len(positions):
        raise ValueError(f"{len(names)} names for {len(positions)} positions")
    for name in names:
        if not name.strip() or any(c in name for c in ";\r\n") or name != name.strip():
            raise ValueError(f"tile name {name!r}: Fiji's TileConfiguration cannot hold an empty name, a name with "
                             "';' or a line break, or spaces around it")  # fmt: skip
    dim = positions.shape[1]
    lines = [
        "# Define the number of dimensions we are working on",
        f"dim = {dim}",
        "",
        "# Define the image coordinates",
    ]
    for name, position in zip(names, positions):
        # positional notation (Java's Float.parseFloat reads it), the shortest that gives the float64 back
        coords = ", ".join(np.format_float_positional(v, trim="0") for v in position[::-1])  # x first
        lines.append(f"{name}; ; ({coords})")
    with atomic_path(path, overwrite=overwrite) as temporary:
        temporary.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return Path(path)


# --- OME-TIFF ----------------------------------------------------------------------------------------------------


def _read_ome_tiff(path: Path, pixel_size: tuple[float, ...] | None) -> TileMosaic:
    import dask
    import dask.array as da

    tifffile = _import("tifffile")
    ome_types = _import("ome_types", "ome-types")
    with open_tiff(path) as tif:
        xml = tif.ome_metadata
        layouts = [(tuple(s.shape), np.dtype(s.dtype), s.axes) for s in tif.series]
    if not xml:
        raise ValueError(f"{str(path)!r} is a TIFF without OME-XML: expected an OME-TIFF whose series are the tiles "
                         "(or name its tiles in a Fiji TileConfiguration.txt)")  # fmt: skip
    images = ome_types.from_xml(xml).images
    if len(images) != len(layouts):
        raise ValueError(f"{str(path)!r}: its OME-XML describes {len(images)} images but tifffile finds "
                         f"{len(layouts)} series")  # fmt: skip
    read = dask.delayed(tifffile.imread, pure=True)
    arrays, positions, names, sizes = [], [], [], []
    for index, (image, (shape, dtype, axes)) in enumerate(zip(images, layouts)):
        name = image.name or f"{path.name} series {index}"
        if (shape, dtype, axes) != layouts[0]:
            raise ValueError(f"tiles differ: {names[0]!r} is {layouts[0][0]} {layouts[0][1]}, {name!r} is "
                             f"{shape} {dtype}")  # fmt: skip
        tile = _arrange(da.from_delayed(read(str(path), series=index), shape=shape, dtype=dtype), axes, None, name)
        d = 3 if "Z" in axes and shape[axes.index("Z")] > 1 else 2
        size = _for_axes(pixel_size, d) or _ome_pixel_size(image.pixels, d)
        position = _ome_position(image, d, name)
        positions.append(_to_pixels(position, size, name, path))
        arrays.append(tile)
        names.append(name)
        sizes.append(size)
    if any(not _same_size(size, sizes[0]) for size in sizes):
        raise ValueError(f"{str(path)!r}: the tiles' pixel sizes differ ({sizes[0]} and another); they must share one")
    size = sizes[0]
    reported = None if size is None else tuple(float(s) for s in size)
    return TileMosaic(da.stack(arrays), np.asarray(positions, dtype=np.float64), names, reported)


def _ome_pixel_size(pixels: Any, d: int) -> tuple[float, ...] | None:
    """``Pixels``' PhysicalSize (z,) y, x in micrometres; None if any is missing."""
    axes = "zyx"[3 - d :]
    sizes = []
    for axis in axes:
        value = getattr(pixels, f"physical_size_{axis}")
        if value is None:
            return None
        sizes.append(value * _micrometres(getattr(pixels, f"physical_size_{axis}_unit"), f"PhysicalSize{axis.upper()}"))
    return tuple(sizes)


def _ome_position(image: Any, d: int, name: str) -> list[tuple[float, Any]]:
    """The (z,) y, x stage position of an OME Image as (value, unit) pairs: its first plane's, else its StageLabel."""
    planes = [p for p in image.pixels.planes if p.position_x is not None and p.position_y is not None]
    if planes:
        first = min(planes, key=lambda p: (p.the_t, p.the_z, p.the_c))  # the top of the stack at the first time
        place = {a: (getattr(first, f"position_{a}"), getattr(first, f"position_{a}_unit")) for a in "zyx"}
    elif image.stage_label is not None and image.stage_label.x is not None and image.stage_label.y is not None:
        label = image.stage_label
        place = {a: (getattr(label, a), getattr(label, f"{a}_unit")) for a in "zyx"}
    else:
        raise ValueError(f"image {name!r} has no stage position: no Plane with PositionX and PositionY, and no "
                         "StageLabel X and Y")  # fmt: skip
    if place["z"][0] is None:
        place["z"] = (0.0, place["x"][1])  # a 3D tile without PositionZ starts at z = 0
    return [place[a] for a in "zyx"[3 - d :]]


def _to_pixels(position: list[tuple[float, Any]], size: tuple[float, ...] | None, name: str, path: Path) -> list:
    out = []
    for axis, (value, unit), k in zip("zyx"[3 - len(position) :], position, range(len(position))):
        symbol = getattr(unit, "value", unit)
        if symbol == "pixel":
            out.append(float(value))
            continue
        if size is None:
            raise ValueError(f"{str(path)!r}: image {name!r} states stage positions in {symbol} but no PhysicalSize "
                             "to turn them into pixels: pass pixel_size= (micrometres)")  # fmt: skip
        out.append(float(value) * _micrometres(unit, f"Position{axis.upper()}") / size[k])
    return out


# --- OME-Zarr collections -----------------------------------------------------------------------------------------


def _is_zarr(path: Path) -> bool:
    return any((path / name).is_file() for name in ("zarr.json", ".zgroup", ".zattrs", ".zarray"))


def _ome_attrs(node: Any) -> dict:
    """The NGFF attributes of a group: 0.5 keeps them under ``"ome"``, 0.4 at the top."""
    attrs = dict(node.attrs)
    return dict(attrs["ome"]) if isinstance(attrs.get("ome"), dict) else attrs


def _natural(key: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", key)]


def collection_images(path: str | os.PathLike) -> list[str]:
    """The child groups of a Zarr group that are OME-Zarr images (multiscales), in natural order; [] otherwise."""
    import zarr

    try:
        group = zarr.open_group(str(path), mode="r")
    except Exception:  # noqa: BLE001 - zarr raises several kinds for "not a group"
        return []
    return sorted((k for k, child in group.groups() if "multiscales" in _ome_attrs(child)), key=_natural)


def _read_ome_zarr(path: Path, pixel_size: tuple[float, ...] | None) -> TileMosaic:
    import dask.array as da
    import zarr

    try:
        group = zarr.open_group(str(path), mode="r")
    except Exception as error:  # noqa: BLE001 - zarr raises several kinds for "not a group"
        raise ValueError(f"{str(path)!r} is not a Zarr group ({error})") from None
    attrs = _ome_attrs(group)
    if "multiscales" in attrs:
        raise ValueError(f"{str(path)!r} is one OME-Zarr image, not a collection of tiles: expected a group whose "
                         "child groups are the tiles' images")  # fmt: skip
    if "plate" in attrs:
        raise ValueError(f"{str(path)!r} is an HCS plate: read one well (e.g. {str(path / 'A' / '1')!r}), whose "
                         "fields are the tiles")  # fmt: skip
    keys = collection_images(path)
    if not keys:
        raise ValueError(f"{str(path)!r}: no child group is an OME-Zarr image (multiscales); expected a collection "
                         "of tiles, each an image with a translation")  # fmt: skip
    arrays, positions, sizes, units = [], [], [], []
    layout = None
    for key in keys:
        child = group[key]
        multiscale = _ome_attrs(child)["multiscales"][0]
        axes = [a if isinstance(a, dict) else {"name": a} for a in multiscale.get("axes", [])]
        dataset = multiscale["datasets"][0]
        array = child[dataset["path"]]
        if not axes:  # NGFF 0.1/0.2: (t, c, z, y, x) implied
            axes = [{"name": n} for n in "tczyx"[5 - array.ndim :]]
        scale, translation = _combined_transform(dataset, multiscale, len(axes))
        letters = "".join(_axis_letter(a) for a in axes)
        tile = _arrange(da.from_zarr(array), letters, None, key)
        spatial = [k for k, letter in enumerate(letters) if letter in "ZYX"]
        if letters[spatial[0]] == "Z" and array.shape[spatial[0]] == 1:
            spatial = spatial[1:]  # a 2D tile in a 3D image
        this = (tile.shape, tile.dtype)
        if layout is not None and this != layout:
            raise ValueError(f"tiles differ: {keys[0]!r} is {layout[0]} {layout[1]}, {key!r} is {this[0]} {this[1]}")
        layout = this
        step = np.array([scale[k] for k in spatial])
        positions.append(np.array([translation[k] for k in spatial]) / step)
        unit = [axes[k].get("unit") for k in spatial]
        units.append(unit)
        factors = [_micrometres(u, "an axis unit") if u else None for u in unit]
        sizes.append(None if None in factors else tuple(float(s * f) for s, f in zip(step, factors)))
        arrays.append(tile)
    if pixel_size is None and any(not _same_size(size, sizes[0]) for size in sizes):
        raise ValueError(f"{str(path)!r}: the tiles' pixel sizes differ ({sizes[0]} and another)")
    size = _for_axes(pixel_size, len(spatial)) or sizes[0]
    return TileMosaic(da.stack(arrays), np.asarray(positions, dtype=np.float64), keys, size)


def _combined_transform(dataset: dict, multiscale: dict, ndim: int) -> tuple[np.ndarray, np.ndarray]:
    """Level 0's scale and translation, the multiscale's own applied after them (NGFF: dataset, then multiscale)."""
    scale, translation = np.ones(ndim), np.zeros(ndim)
    for transforms in (dataset.get("coordinateTransformations", []), multiscale.get("coordinateTransformations", [])):
        for transform in transforms:
            if transform.get("type") == "scale":
                factor = np.asarray(transform["scale"], dtype=float)
                scale, translation = scale * factor, translation * factor
            elif transform.get("type") == "translation":
                translation = translation + np.asarray(transform["translation"], dtype=float)
    return scale, translation


def _axis_letter(axis: dict) -> str:
    name, kind = str(axis.get("name", "")).lower(), axis.get("type")
    if kind == "channel" or name == "c":
        return "C"
    if kind == "time" or name == "t":
        return "T"
    return name.upper() if name in ("z", "y", "x") else "Q"


# --- a folder pattern ---------------------------------------------------------------------------------------------


def _read_pattern(folder: Path, pattern: str, overlap: Any, pixel_size: tuple[float, ...] | None) -> TileMosaic:
    from napari_gridmip.io._tiles import read_tiles

    found = read_tiles(folder, pattern)
    if found.grid_index is None:
        raise ValueError(f"pattern {pattern!r} numbers the tiles by acquisition ({{index}}), which places none: "
                         "name the grid ({row}, {col}), or place them with grid_positions or a "
                         "TileConfiguration")  # fmt: skip
    d = found.grid_index.shape[1]
    fraction = np.broadcast_to(np.asarray(overlap, dtype=float), (d,))
    if not ((fraction >= 0) & (fraction < 1)).all():
        raise ValueError(f"overlap must lie in [0, 1) (a fraction of the tile); got {overlap!r}")
    step = np.asarray(found.tiles.shape[-d:], dtype=float) * (1 - fraction)
    positions = found.grid_index * step
    names = [p.name for p in found.paths]
    return TileMosaic(found.tiles, positions.astype(np.float64), names, _for_axes(pixel_size, d))


# --- shared -------------------------------------------------------------------------------------------------------


def _arrange(tile: Any, axes: str, dim: int | None, name: str) -> Any:
    """A tile's axes (tifffile's or NGFF's letters) reordered to ``([C,] [Z,] Y, X)``, lone axes dropped.

    ``dim`` (a TileConfiguration's 2 or 3) makes an axis of unknown meaning (tifffile's ``Q``, ``I``) the ``Z`` of a
    3D tile that has none; otherwise such an axis is the channel axis. ``S`` (RGB samples) is a channel axis.
    """
    axes = axes.upper()
    if len(axes) != tile.ndim or "Y" not in axes or "X" not in axes:
        raise ValueError(f"tile {name!r}: axes {axes!r} do not name Y and X of its {tile.ndim} axes")
    keep, channel, depth = [], [], []
    for k, (letter, n) in enumerate(zip(axes, tile.shape)):
        if letter in "YX":
            continue
        if n == 1 and not (letter == "Z" and dim == 3):
            continue  # a lone time point, channel or plane
        if letter == "T":
            raise ValueError(f"tile {name!r} has {n} time points; a mosaic's tiles hold one")
        if letter == "Z" or (dim == 3 and not depth and "Z" not in axes and letter not in "CS"):
            depth.append(k)
        else:
            channel.append(k)
    if len(channel) > 1 or (dim == 2 and depth):
        what = "a 2D TileConfiguration" if dim == 2 else "a mosaic"
        raise ValueError(f"tile {name!r} of axes {axes!r}, shape {tuple(tile.shape)}: too many axes for {what}; "
                         "expected ([C,] [Z,] Y, X)")  # fmt: skip
    if dim == 3 and not depth:
        raise ValueError(f"tile {name!r} of shape {tuple(tile.shape)} has no Z axis for a 3D TileConfiguration")
    keep = channel + depth + [axes.index("Y"), axes.index("X")]
    index = tuple(slice(None) if k in keep else 0 for k in range(tile.ndim))
    remaining = [k for k in range(tile.ndim) if k in keep]  # the kept axes in their stored order
    return tile[index].transpose([remaining.index(k) for k in keep])


def _micrometres(unit: Any, what: str) -> float:
    symbol = getattr(unit, "value", unit)
    if symbol is None or symbol == _REFERENCE_FRAME:
        return 1.0
    factor = _MICROMETRES.get(symbol, _MICROMETRES.get(str(symbol).lower()))
    if factor is None:
        raise ValueError(f"{what} in {symbol!r}: not a unit of length this reader knows")
    return factor


def _pixel_size_option(pixel_size: Any) -> tuple[float, ...] | None:
    if pixel_size is None:
        return None
    values = np.atleast_1d(np.asarray(pixel_size, dtype=float))
    if values.ndim != 1 or len(values) not in (1, 2, 3) or not (np.isfinite(values) & (values > 0)).all():
        raise ValueError(f"pixel_size must be one positive number or one per axis, (y, x) or (z, y, x); got "
                         f"{pixel_size!r}")  # fmt: skip
    return tuple(float(v) for v in values)


def _for_axes(size: tuple[float, ...] | None, d: int) -> tuple[float, ...] | None:
    """The ``pixel_size`` option for ``d`` axes: one number for all, or the last ``d`` of (z, y, x)."""
    if size is None:
        return None
    if len(size) == 1:
        return size * d
    if len(size) < d:
        raise ValueError(f"pixel_size {size} gives {len(size)} axes; the tiles have {d}: give (z, y, x)")
    return size[-d:]


def _same_size(a: tuple | None, b: tuple | None) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and np.allclose(a, b, rtol=1e-6, atol=0)


def _import(module: str, package: str | None = None) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"reading mosaics needs {package or module}: {IO_EXTRA}") from None
