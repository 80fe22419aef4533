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
        If the path does not exist, its format is not one of these, its
        contents are not what its name says (the message names the file and
        what was expected), or a Zarr group holds no OME-Zarr image.
    """
    import dask.array as da

    path = Path(path).absolute()  # the graph may run on a cluster's workers, in another folder
    if not path.exists():
        raise ValueError(f"{str(path)!r} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        import numpy as np

        try:
            data = np.load(path, mmap_mode="r")
        except (ValueError, OSError, EOFError) as error:  # pickled data, a truncated header, another format
            raise ValueError(f"{str(path)!r}: expected a NumPy array file (its name ends in .npy; numpy.save "
                             f"writes one); numpy: {_one_line(error)}") from None  # fmt: skip
        return da.from_array(data, chunks=chunks)
    if suffix in (".tif", ".tiff"):
        import tifffile
        import zarr

        try:
            store = tifffile.imread(path, aszarr=True)
        except (ValueError, OSError, EOFError) as error:  # tifffile's TiffFileError is a ValueError
            raise not_a_tiff(path, error) from None
        array = zarr.open(store, mode="r")
        if not hasattr(array, "shape"):  # a multi-resolution TIFF: level 0
            array = array[next(iter(array.array_keys()))]
        return da.from_zarr(array)
    if path.is_dir():
        return _read_zarr(path)
    raise ValueError(f"{str(path)!r}: expected a .npy, .tif/.tiff file or a Zarr folder")


def not_a_tiff(path: str | os.PathLike, error: BaseException) -> ValueError:
    """The error for a file named as a TIFF that tifffile cannot read: the file, what was expected and why not
    (tifffile's own message names neither the file nor the format it wanted)."""
    suffix = Path(path).suffix or ".tif"
    return ValueError(f"{str(Path(path).absolute())!r}: expected a TIFF image (its name ends in {suffix}); "
                      f"tifffile: {_one_line(error)}")  # fmt: skip


def open_tiff(path: str | os.PathLike) -> Any:
    """``tifffile.TiffFile(path)``, its errors for a file that is no TIFF naming the file (:func:`not_a_tiff`)."""
    import tifffile

    try:
        return tifffile.TiffFile(path)
    except (ValueError, EOFError) as error:  # tifffile's TiffFileError is a ValueError
        raise not_a_tiff(path, error) from None


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


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
