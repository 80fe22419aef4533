"""napari's reader and writer contributions (see napari.yaml): OME-Zarr occupancy pyramids, and mosaics (Fiji's
TileConfiguration, OME-TIFF series, OME-Zarr collections) as tile stacks carrying their stage positions."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def get_reader(path: str | list[str]) -> Callable | None:
    """A reader for an OME-Zarr multiscale image folder (as :func:`write_mipmap` writes), or a collection of them
    (tiles placed by their translations, read as :func:`read_mosaic_layer`), else None."""
    if isinstance(path, list) or not Path(path).is_dir():
        return None
    from ome_zarr.io import parse_url

    location = parse_url(str(path))
    if location is None:
        return None
    if "multiscales" not in location.root_attrs:
        from napari_gridmip.io._mosaic import collection_images

        return read_mosaic_layer if collection_images(path) else None
    return read_ome_zarr


MOSAIC_KEY = "gridmip_mosaic"  # the layer.metadata entry the Stitch tiles widget reads (stage_positions, in pixels)


def get_mosaic_reader(path: str | list[str]) -> Callable | None:
    """A reader for Fiji's ``TileConfiguration*.txt`` and for OME-TIFF files of several series (the tiles), else None.

    An OME-TIFF of one series is left to napari's other readers (one image, not a mosaic).
    """
    if isinstance(path, list):
        return None
    file = Path(path)
    name = file.name.lower()
    if not file.is_file():
        return None
    if name.endswith(".txt"):
        return read_mosaic_layer if "tileconfiguration" in name else None
    if not name.endswith((".ome.tif", ".ome.tiff")):
        return None
    try:
        import tifffile

        with tifffile.TiffFile(file) as tif:
            several = tif.is_ome and len(tif.series) > 1
    except Exception:  # noqa: BLE001 - not a TIFF tifffile can read: another reader's file
        return None
    return read_mosaic_layer if several else None


def read_mosaic_layer(path: str) -> list[tuple]:
    """The mosaic as one tile stack layer ``(n, [C,] *tile)``, lazily, placed by nothing yet.

    ``metadata["gridmip_mosaic"]`` holds ``stage_positions`` (``(n, d)`` pixels, ``(y, x)`` or ``(z, y, x)``), the
    tiles' ``names``, ``pixel_size`` (micrometres or None) and the ``source`` path: the Stitch tiles widget takes
    the positions from there. The layer's scale is the pixel size where the file states one, its tile axes in
    micrometres (napari's scale bar reads them; the stitched mosaic gets the same units).
    """
    from napari_gridmip.io._mosaic import read_mosaic

    mosaic = read_mosaic(path)
    d = mosaic.positions.shape[1]
    meta: dict[str, Any] = {
        "name": Path(path).stem if Path(path).is_file() else Path(path).name,
        "metadata": {
            MOSAIC_KEY: {
                "stage_positions": mosaic.positions,
                "names": list(mosaic.names),
                "pixel_size": mosaic.pixel_size,
                "source": str(path),
            }
        },
    }
    if mosaic.pixel_size is not None:  # tiles and channel keep a unit step
        meta["scale"] = [1.0] * (mosaic.tiles.ndim - d) + list(mosaic.pixel_size)
        meta["units"] = ["pixel"] * (mosaic.tiles.ndim - d) + ["micrometer"] * d
    return [(mosaic.tiles, meta, "image")]


# napari shows a multiscale layer's coarsest level in 3D: the layer's levels stop at the first whose longest side is
# at most this (the "Sparse volume (large)" sample's coarsest), so that a pyramid reduced down to (1, 1, 1), as
# write_mipmap's is, is not shown as one voxel; the levels beyond stay in the file
COARSEST_SIDE = 256
CELL_LEVEL = 3  # level 3 of an occupancy pyramid is the occupancy of 8^3 cells of level 0


def read_ome_zarr(path: str) -> list[tuple]:
    """The pyramid as one multiscale image layer, placed by level 0's scale and translation.

    The layer's levels stop at the first whose longest spatial side is at most :data:`COARSEST_SIDE` (napari's 3D
    view shows the coarsest). Each is a :class:`~napari_gridmip.io.lazy.LazyLevel` of its Zarr array (read at
    ``np.asarray``, only what napari shows), or ome-zarr's dask array where no Zarr array stands behind it
    chunk for chunk. An occupancy pyramid (bool, as :func:`write_mipmap` writes) of a 3D volume carries
    its level 3, lazily, as the occupancy of 8^3 cells of level 0 in ``metadata["gridmip_cells"]``: "Full
    resolution in 3D" then skips empty space without a pass over level 0.
    """
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Reader

    from napari_gridmip.core.occupancy.chunk_files import zarr_behind
    from napari_gridmip.io.lazy import LazyLevel

    node = next(iter(Reader(parse_url(str(path)))()))
    # lazy views of the Zarr arrays behind ome-zarr's dask levels, not the dask arrays: napari keeps a dask layer's
    # chunks in its own cache (66 MiB more at every switch to 3D of the sparse sample given as dask, docs/occupancy.md)
    levels = [LazyLevel(stored) if (stored := zarr_behind(level)) is not level else level for level in node.data]
    shown = next((k for k, level in enumerate(levels) if max(level.shape[-3:]) <= COARSEST_SIDE), len(levels) - 1)
    multiscale = node.metadata.get("coordinateTransformations", [[]])
    scale = translate = None
    for transform in multiscale[0] if multiscale else []:
        if transform.get("type") == "scale":
            scale = transform["scale"]
        elif transform.get("type") == "translation":
            translate = transform["translation"]
    meta: dict[str, Any] = {"name": node.metadata.get("name") or Path(path).stem, "multiscale": True}
    if scale is not None:
        meta["scale"] = scale
    if translate is not None:
        meta["translate"] = translate
    if levels[0].dtype == bool:
        meta.update(contrast_limits=(0, 1), colormap="cyan", blending="additive")
        if _has_cells(node.metadata.get("name"), levels):
            # the live view's cells: voxels > 0 of level 0, any() over 8^3 blocks (edge blocks clipped)
            meta["metadata"] = {"gridmip_cells": {"cells": levels[CELL_LEVEL], "cell": 2**CELL_LEVEL, "threshold": 0.0}}
    return [(levels[: shown + 1], meta, "image")]


def _has_cells(name: Any, levels: list) -> bool:
    """Whether level 3 is the occupancy of 8^3 cells of level 0: a 3D bool pyramid that write_mipmap named."""
    if name != "occupancy" or levels[0].dtype != bool or levels[0].ndim != 3 or len(levels) <= CELL_LEVEL:
        return False
    cell = 2**CELL_LEVEL
    return tuple(levels[CELL_LEVEL].shape) == tuple(-(-n // cell) for n in levels[0].shape)


def write_mipmap_layer(path: str, data: Any, meta: dict) -> list[str]:
    """File > Save Selected Layer(s) as the layer's occupancy pyramid in OME-Zarr.

    The threshold is the layer's ``metadata["gridmip_threshold"]`` when set (0 otherwise);
    level 0's voxel size is the layer's scale.
    """
    from collections.abc import Sequence

    from napari_gridmip.core import validate
    from napari_gridmip.io import write_mipmap
    from napari_gridmip.io.lazy import as_dask, is_lazy

    # a multiscale layer's data (napari's MultiScaleData, a Sequence whose np.asarray is its coarsest level): level 0
    volume = data[0] if isinstance(data, Sequence) and not hasattr(data, "dtype") or meta.get("multiscale") else data
    if is_lazy(volume) and not validate.is_dask(volume):  # a Zarr array or a LazyLevel: written block by block too
        volume = as_dask(volume)
    threshold = float(meta.get("metadata", {}).get("gridmip_threshold", 0.0))
    scale = meta.get("scale")
    write_mipmap(volume, path, threshold=threshold, scale=None if scale is None else list(scale)[-3:], overwrite=True)
    return [path]
