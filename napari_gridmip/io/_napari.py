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


def read_ome_zarr(path: str) -> list[tuple]:
    """The pyramid as one multiscale image layer, placed by level 0's scale and translation."""
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Reader

    node = next(iter(Reader(parse_url(str(path)))()))
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
    if node.data[0].dtype == bool:
        meta.update(contrast_limits=(0, 1), colormap="cyan", blending="additive")
    return [(node.data, meta, "image")]


def write_mipmap_layer(path: str, data: Any, meta: dict) -> list[str]:
    """File > Save Selected Layer(s) as the layer's occupancy pyramid in OME-Zarr.

    The threshold is the layer's ``metadata["gridmip_threshold"]`` when set (0 otherwise);
    level 0's voxel size is the layer's scale.
    """
    from napari_gridmip.io import write_mipmap

    volume = data[0] if isinstance(data, list) else data
    threshold = float(meta.get("metadata", {}).get("gridmip_threshold", 0.0))
    scale = meta.get("scale")
    write_mipmap(volume, path, threshold=threshold, scale=None if scale is None else list(scale)[-3:], overwrite=True)
    return [path]
