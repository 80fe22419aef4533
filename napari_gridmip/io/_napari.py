"""napari's reader and writer contributions for OME-Zarr occupancy pyramids (see napari.yaml)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def get_reader(path: str | list[str]) -> Callable | None:
    """A reader for an OME-Zarr multiscale image folder (as :func:`write_mipmap` writes), else None."""
    if isinstance(path, list) or not Path(path).is_dir():
        return None
    from ome_zarr.io import parse_url

    location = parse_url(str(path))
    if location is None or "multiscales" not in location.root_attrs:
        return None
    return read_ome_zarr


# napari shows a multiscale layer's coarsest level in 3D: the layer's levels stop at the first whose longest side is
# at most this (the "Sparse volume (large)" sample's coarsest), so that a pyramid reduced down to (1, 1, 1), as
# write_mipmap's is, is not shown as one voxel; the levels beyond stay in the file
COARSEST_SIDE = 256
CELL_LEVEL = 3  # level 3 of an occupancy pyramid is the occupancy of 8^3 cells of level 0


def read_ome_zarr(path: str) -> list[tuple]:
    """The pyramid as one multiscale image layer, placed by level 0's scale and translation.

    The layer's levels stop at the first whose longest spatial side is at most :data:`COARSEST_SIDE` (napari's 3D
    view shows the coarsest). Each is a :class:`~napari_gridmip.io._lazy.LazyLevel` of its Zarr array (read at
    ``np.asarray``, only what napari shows), or ome-zarr's dask array where no Zarr array stands behind it
    chunk for chunk. An occupancy pyramid (bool, as :func:`write_mipmap` writes) of a 3D volume carries
    its level 3, lazily, as the occupancy of 8^3 cells of level 0 in ``metadata["gridmip_cells"]``: "Full
    resolution in 3D" then skips empty space without a pass over level 0.
    """
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Reader

    from napari_gridmip.core.occupancy._chunk_files import zarr_behind
    from napari_gridmip.io._lazy import LazyLevel

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

    from napari_gridmip._jobs import as_dask, is_lazy
    from napari_gridmip.core import _validate
    from napari_gridmip.io import write_mipmap

    # a multiscale layer's data (napari's MultiScaleData, a Sequence whose np.asarray is its coarsest level): level 0
    volume = data[0] if isinstance(data, Sequence) and not hasattr(data, "dtype") or meta.get("multiscale") else data
    if is_lazy(volume) and not _validate.is_dask(volume):  # a Zarr array or a LazyLevel: written block by block too
        volume = as_dask(volume)
    threshold = float(meta.get("metadata", {}).get("gridmip_threshold", 0.0))
    scale = meta.get("scale")
    write_mipmap(volume, path, threshold=threshold, scale=None if scale is None else list(scale)[-3:], overwrite=True)
    return [path]
