"""Dask twins: the merge of a patch stack and the fusion of a tile mosaic, output chunk by output chunk.

Each output chunk is made from the patches (tiles) that touch it, by the in-memory kernel.

Max and overwrite merges equal the in-memory result bit for bit; weighted
merges (mean, gaussian, hann) agree within 2 ulp, since a chunk's sub-grid sums
its patches in another order (tests/core/test_chunked.py states it).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

MERGE_CHUNK = 1024  # output chunk of a merge along each tiled axis, unless the caller gives one


def merge_patches(
    patches: Any,
    image_shape: tuple[int, ...],
    stride: tuple[int, ...],
    *,
    blend: str,
    sigma_scale: float,
    result_dtype: np.dtype,
    chunk: int = MERGE_CHUNK,
) -> Any:
    """The merged image of a dask patch stack, one task per output chunk (validated by the caller).

    Each output chunk merges only the patches that touch it, as a sub-grid
    with the same origin rule (its first patch at 0, its last one flush with
    its end when the whole grid's is), so each pixel sums the same patches
    with the same weights as the whole merge.
    """
    import dask
    import dask.array as da

    from napari_gridmip.core.patches.grid import patch_origins

    d = len(stride)
    patch_size = patches.shape[patches.ndim - d :]
    lead = image_shape[: len(image_shape) - d]
    tiled = image_shape[len(image_shape) - d :]
    origins = [patch_origins(n, p, s) for n, p, s in zip(tiled, patch_size, stride)]
    bounds = [[(start, min(start + chunk, n)) for start in range(0, n, chunk)] for n in tiled]

    def merged_block(sub_patches: np.ndarray, sub_shape: tuple[int, ...], crop: tuple[slice, ...]) -> np.ndarray:
        from napari_gridmip.core.patches.grid import merge_patches as in_memory

        out = np.asarray(in_memory(sub_patches, sub_shape, stride, blend=blend, sigma_scale=sigma_scale))
        return out[(Ellipsis, *crop)]

    def block_at(index: tuple[int, ...]) -> Any:
        grid_slices, sub_tiled, crop = [], [], []
        for axis, i in enumerate(index):
            start, stop = bounds[axis][i]
            o = origins[axis]
            first = int(np.searchsorted(o + patch_size[axis], start, side="right"))  # first patch ending past start
            last = int(np.searchsorted(o, stop, side="left")) - 1  # last patch starting before stop
            grid_slices.append(slice(first, last + 1))
            sub_tiled.append(int(o[last] + patch_size[axis] - o[first]))
            crop.append(slice(start - int(o[first]), stop - int(o[first])))
        sub = patches[tuple(grid_slices)]
        shape = tuple(stop - start for start, stop in (bounds[axis][i] for axis, i in enumerate(index)))
        task = dask.delayed(merged_block, pure=True)(sub, lead + tuple(sub_tiled), tuple(crop))
        return da.from_delayed(task, shape=lead + shape, dtype=result_dtype)

    def nest(prefix: tuple[int, ...]) -> Any:
        axis = len(prefix)
        if axis == d:
            return block_at(prefix)
        return [nest((*prefix, i)) for i in range(len(bounds[axis]))]

    # da.block joins the nested list along the last d axes
    return da.block(nest(()))


def fuse_tiles(
    tiles: Any,
    positions: np.ndarray,
    origin: np.ndarray,
    extent: tuple[int, ...],
    *,
    has_channels: bool,
    blend: str,
    interpolation: str,
    compute: np.dtype,
    result: np.dtype,
    fill: float,
    chunk: int,
) -> Any:
    """The mosaic of a dask tile stack, one task per output chunk (validated by the caller).

    Each task fuses the tiles whose footprint (plus the interpolation's taps)
    touches its chunk, in tile order, with the in-memory kernel on a window
    of the full chunk size (edge chunks cropped after): every pixel sums the
    same tiles in the same order as the in-memory mosaic. The tile count of a
    task is padded to a power of two with repeats of its first tile marked
    invalid, so that few programs are compiled.
    """
    import dask
    import dask.array as da

    from napari_gridmip.core.patches.fuse import fuse_window

    d = len(extent)
    shape = np.asarray(tiles.shape[tiles.ndim - d :])
    channels = tiles.shape[1] if has_channels else 1
    lead = (channels,) if has_channels else ()
    placed = np.round(positions) if interpolation == "nearest" else positions
    foot_lo = np.floor(placed).astype(np.int64) - 2
    foot_hi = foot_lo + shape + 4
    bounds = [[(start, min(start + chunk, n)) for start in range(0, n, chunk)] for n in extent]
    window = tuple(min(chunk, n) for n in extent)

    def fused(sub_tiles, sub_positions, valid, window_origin, crop):
        stack = sub_tiles if has_channels else sub_tiles[:, None]
        out = fuse_window(
            stack, sub_positions, window_origin, window, blend=blend, interpolation=interpolation,
            compute=compute, result=result, fill=fill, valid=valid,
        )  # fmt: skip
        out = np.asarray(out)[(slice(None), *crop)]
        return out if has_channels else out[0]

    def block_at(index):
        lo = origin + np.array([bounds[a][i][0] for a, i in enumerate(index)])
        hi = origin + np.array([bounds[a][i][1] for a, i in enumerate(index)])
        size = tuple(int(b - a) for a, b in zip(lo, hi))
        touching = np.flatnonzero(np.all((foot_hi > lo) & (foot_lo < hi), axis=1))
        if len(touching) == 0:
            return da.full(lead + size, fill, dtype=result, chunks=lead + size)
        padded = 1 << math.ceil(math.log2(len(touching)))
        chosen = np.concatenate([touching, np.full(padded - len(touching), touching[0])])
        valid = np.arange(padded) < len(touching)
        crop = tuple(slice(0, s) for s in size)
        task = dask.delayed(fused, pure=True)(tiles[chosen], positions[chosen], valid, lo, crop)
        return da.from_delayed(task, shape=lead + size, dtype=result)

    def nest(prefix):
        if len(prefix) == d:
            return block_at(prefix)
        return [nest((*prefix, i)) for i in range(len(bounds[len(prefix)]))]

    return da.block(nest(()))
