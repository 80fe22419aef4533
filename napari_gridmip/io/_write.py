"""Writers that never leave partial output: everything goes under a temporary name first."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

SPATIAL_AXES = ("z", "y", "x")
LEADING_AXES = ("t", "c")  # NGFF orders axes (t, c, z, y, x)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of ``path``; on success it is renamed to ``path``, on error removed.

    Raises ValueError if ``path`` exists and ``overwrite`` is false (checked
    before any work).
    """
    path = Path(path).absolute()  # workers of a cluster may run elsewhere: never a relative path
    if path.exists() and not overwrite:
        raise ValueError(f"{str(path)!r} already exists (pass overwrite=True, or --overwrite, to replace it)")
    if not path.parent.exists():
        raise ValueError(f"the folder {str(path.parent)!r} does not exist")
    temporary = path.with_name(f".{path.name}.partial-{uuid.uuid4().hex[:8]}")
    try:
        yield temporary
    except BaseException:
        _remove(temporary)
        raise
    if path.exists():
        old = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(path, old)
        os.replace(temporary, path)
        _remove(old)
    else:
        os.replace(temporary, path)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.unlink()


def mipmap_transforms(ndim: int, levels: int, scale: Sequence[float] | None = None) -> list[list[dict[str, Any]]]:
    """NGFF ``coordinateTransformations`` of each level: scale ``2**k`` and the half-block translation.

    A level-``k`` voxel covers a ``2**k`` block of level 0, so its centre sits
    ``(2**k - 1) / 2`` level-0 voxels in (the widget's placement uses the same
    rule). Leading (time, channel) axes keep scale 1 and translation 0.
    """
    spatial = np.ones(3) if scale is None else np.asarray(scale, dtype=float)
    lead = ndim - 3
    out = []
    for k in range(levels):
        factor = 2**k
        out.append(
            [
                {"type": "scale", "scale": [1.0] * lead + [float(s * factor) for s in spatial]},
                {"type": "translation", "translation": [0.0] * lead + [float(s * (factor - 1) / 2) for s in spatial]},
            ]
        )
    return out


def write_mipmap(
    volume: Any,
    path: str | os.PathLike,
    *,
    threshold: float = 0.0,
    scale: Sequence[float] | None = None,
    overwrite: bool = False,
    compute: Callable[[Any], Any] | None = None,
) -> Path:
    """Write the occupancy pyramid of ``volume`` as an OME-Zarr multiscale image.

    Parameters
    ----------
    volume
        ``(..., D, H, W)`` NumPy, JAX or dask array, up to two leading axes
        (time, channel); a dask array is read block by block, so it need not
        fit in memory.
    path
        The OME-Zarr folder to create (written under a temporary name, renamed
        when complete: a failed run leaves nothing behind).
    threshold
        As for :func:`~napari_gridmip.occupancy_mipmap`.
    scale
        Level 0's voxel size along (z, y, x); default 1.
    overwrite
        Replace an existing ``path``.
    compute
        How to run the dask graph of the writes (given a list of dask delayed
        objects); default ``dask.compute``. The command line passes one that
        shows a progress bar or runs on a ``dask.distributed`` cluster.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    ValueError
        As for :func:`~napari_gridmip.occupancy_mipmap`; if ``volume`` has more
        than 5 axes; or if ``path`` exists and ``overwrite`` is false.
    """
    import dask
    import dask.array as da
    import zarr
    from ome_zarr.writer import write_multiscale

    from napari_gridmip.core import _validate
    from napari_gridmip.core.mipmap import occupancy_mipmap

    ndim = len(_validate.shape_of(volume))
    if ndim > 5:
        raise ValueError(f"volume must have at most 5 axes (t, c, z, y, x) for OME-Zarr; got {ndim}")
    if scale is not None and len(scale) != 3:
        raise ValueError(f"scale must give the (z, y, x) voxel size; got {scale!r}")
    lazy = volume if _validate.is_dask(volume) else da.from_array(np.asarray(volume))
    levels = occupancy_mipmap(lazy, threshold=threshold)
    axes = [{"name": name, "type": "time" if name == "t" else "channel"} for name in LEADING_AXES[: ndim - 3]]
    axes += [{"name": name, "type": "space"} for name in SPATIAL_AXES]
    with atomic_path(path, overwrite=overwrite) as temporary:
        group = zarr.open_group(str(temporary), mode="w")
        with warnings.catch_warnings():
            # ome-zarr deprecates explicit transforms in favour of ones derived from the shapes; those would
            # be neither 2**k (levels round up) nor translated by the half block, so ours are given explicitly
            warnings.simplefilter("ignore", DeprecationWarning)
            delayed = write_multiscale(
                levels,
                group,
                axes=axes,
                coordinate_transformations=mipmap_transforms(ndim, len(levels), scale),
                name="occupancy",
                compute=False,
            )
        (compute or dask.compute)(delayed)
    return Path(path)


def write_array(
    array: Any, path: str | os.PathLike, *, overwrite: bool = False, compute: Callable | None = None
) -> Path:
    """Write an array to ``.npy``, ``.tif``/``.tiff`` or a Zarr folder (by the suffix), never partially.

    Zarr is written block by block from a dask array; ``.npy`` and TIFF need
    the whole array in memory.
    """
    import dask
    import dask.array as da

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".npy", ".tif", ".tiff", ".zarr"):
        raise ValueError(f"{str(path)!r}: the output must end in .npy, .tif, .tiff or .zarr")
    with atomic_path(path, overwrite=overwrite) as temporary:
        if suffix == ".zarr":
            lazy = array if hasattr(array, "dask") else da.from_array(np.asarray(array))
            (compute or dask.compute)([lazy.to_zarr(str(temporary), compute=False)])
            return path
        data = np.asarray((compute or dask.compute)([array])[0] if hasattr(array, "dask") else array)
        if suffix == ".npy":
            with open(temporary, "wb") as f:
                np.save(f, data)
        else:
            import tifffile

            tifffile.imwrite(temporary, data)
    return path
