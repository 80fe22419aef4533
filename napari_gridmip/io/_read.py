"""Lazy readers: every format comes back as a dask array."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

ZARR_SUFFIXES = (".zarr", ".ome.zarr")


def read_array(path: str | os.PathLike, *, chunks: Any = "auto") -> Any:
    """Open an array lazily, as a dask array.

    Parameters
    ----------
    path
        A ``.npy`` file (memory-mapped), a ``.tif``/``.tiff`` file (read through
        tifffile's Zarr view, page by page), or a Zarr folder: a plain array,
        or an OME-Zarr image, whose level 0 is read.
    chunks
        Chunks for ``.npy`` files (dask's ``"auto"`` by default); Zarr and TIFF
        keep their stored chunks.

    Returns
    -------
    dask.array.Array
        The array, with its stored shape and dtype; nothing is read yet.

    Raises
    ------
    ValueError
        If the path does not exist, its format is not one of these, or a
        Zarr group holds no OME-Zarr image.
    """
    import dask.array as da

    path = Path(path).absolute()  # the graph may run on a cluster's workers, in another folder
    if not path.exists():
        raise ValueError(f"{str(path)!r} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        import numpy as np

        return da.from_array(np.load(path, mmap_mode="r"), chunks=chunks)
    if suffix in (".tif", ".tiff"):
        import tifffile
        import zarr

        store = tifffile.imread(path, aszarr=True)
        array = zarr.open(store, mode="r")
        if not hasattr(array, "shape"):  # a multi-resolution TIFF: level 0
            array = array[next(iter(array.array_keys()))]
        return da.from_zarr(array)
    if path.is_dir():
        return _read_zarr(path)
    raise ValueError(f"{str(path)!r}: expected a .npy, .tif/.tiff file or a Zarr folder")


def _read_zarr(path: Path) -> Any:
    import dask.array as da
    import zarr

    try:
        node = zarr.open(str(path), mode="r")
    except Exception as error:  # noqa: BLE001 - zarr raises several kinds for "not a store"
        raise ValueError(f"{str(path)!r} is not a Zarr array or group ({error})") from None
    if hasattr(node, "shape"):
        return da.from_zarr(node)
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Reader

    location = parse_url(str(path))
    nodes = list(Reader(location)()) if location is not None else []
    if not nodes or not nodes[0].data:
        raise ValueError(f"{str(path)!r} is a Zarr group without an OME-Zarr multiscale image")
    return nodes[0].data[0]
