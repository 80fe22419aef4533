"""The public functions on dask arrays: lazily, block by block, with the in-memory kernels inside each block.

In the manner of dask-image: dask arrays in, dask arrays out, and nothing is
computed by the call itself. Each task receives NumPy blocks and returns NumPy
blocks (never JAX objects), so the graphs run on any dask scheduler, a
``dask.distributed`` cluster included. Each kernel gets the block structure it
needs:

- the mipmap reads ``2**b``-aligned blocks, so that each block's levels need
  that block alone; the few coarsest levels are reduced from level ``b``;
- correlation and displacement read row bands with the window as a halo
  (``dask.array.overlap``), all K frames and all columns in one chunk;
- the merge makes the output chunk by chunk, from the patches that touch it.

Mipmap levels, displacements and the max/overwrite merges equal the in-memory
results bit for bit. Correlation values and weighted merges (mean, gaussian,
hann) agree within 2 ulp: XLA's vectorised loops round a few values
differently with the block's shape, and a chunk's sub-grid sums its patches in
another order (tests/core/test_chunked.py states these tolerances).
"""

from __future__ import annotations

from typing import Any

import numpy as np

BLOCK_LEVELS = 7  # mipmap blocks of up to 2**7 = 128 voxels a side: 2 MiB of uint8, bounded memory per task
MERGE_CHUNK = 1024  # output chunk of a merge along each tiled axis, unless the caller gives one


# -- occupancy mipmap -------------------------------------------------------------------


def occupancy_mipmap(volume: Any, threshold: float) -> list[Any]:
    """Levels of a dask ``(..., D, H, W)`` volume as dask bool arrays (validated by the caller)."""

    from napari_gridmip.core.mipmap import mipmap_shapes

    lead = volume.ndim - 3
    shapes = mipmap_shapes(volume.shape[-3:])
    top = len(shapes) - 1
    b = min(top, BLOCK_LEVELS)
    size = 2**b
    spatial = [_aligned_chunks(n, chunks, size) for n, chunks in zip(volume.shape[-3:], volume.chunks[-3:])]
    volume = volume.rechunk(tuple((1,) * n for n in volume.shape[:lead]) + tuple(spatial))

    packed = _packed_levels(volume, threshold, b + 1)
    levels = [_unpack(packed, k, lead, [[_halved(c, k) for c in axis] for axis in spatial]) for k in range(b + 1)]
    if top > b:
        levels += _coarse_levels(levels[b], lead, b, top)
    return levels


def _packed_levels(volume: Any, threshold: float, count: int) -> Any:
    """One task per block of ``volume``: the block's first ``count`` levels, as a list in a 1-element object block.

    Every level of a block comes from one call of the in-memory kernel; the
    levels are taken apart afterwards by :func:`_unpack`.
    """

    def block_levels(block: np.ndarray) -> np.ndarray:
        from napari_gridmip.core.mipmap import occupancy_mipmap as in_memory

        levels = in_memory(np.asarray(block).reshape(block.shape[-3:]), threshold=threshold)
        packed = np.empty((1,) * block.ndim, dtype=object)
        packed.flat[0] = [np.asarray(level) for level in levels[:count]]
        return packed

    return volume.map_blocks(block_levels, dtype=object, chunks=tuple((1,) * len(c) for c in volume.chunks))


def _aligned_chunks(n: int, chunks: tuple[int, ...], size: int) -> tuple[int, ...]:
    """Chunks of ``n`` that are multiples of ``size`` (the last may be shorter), near the input's chunk size."""
    step = size * max(1, round(max(chunks) / size))
    return tuple(min(step, n - start) for start in range(0, n, step))


def _halved(n: int, k: int) -> int:
    return -(-n // 2**k)


def _unpack(packed: Any, k: int, lead: int, spatial_chunks: list[list[int]]) -> Any:
    """Level ``k`` out of the per-block lists of levels (a block smaller than ``2**k`` has reached (1, 1, 1))."""
    chunks = tuple(packed.chunks[:lead]) + tuple(tuple(axis) for axis in spatial_chunks)

    def take(block: np.ndarray) -> np.ndarray:
        levels = block.flat[0]
        level = levels[min(k, len(levels) - 1)]
        return level.reshape((1,) * lead + level.shape)

    return packed.map_blocks(take, dtype=bool, chunks=chunks)


def _coarse_levels(level_b: Any, lead: int, b: int, top: int) -> list[Any]:
    """Levels ``b + 1 .. top`` from level ``b``, which is small: one block per leading index."""
    whole = level_b.rechunk(tuple((1,) * n for n in level_b.shape[:lead]) + tuple((n,) for n in level_b.shape[lead:]))
    packed = _packed_levels(whole, 0.5, top - b + 1)  # a bool level with threshold 0.5 is its own level 0
    out = []
    for k in range(b + 1, top + 1):
        spatial = [[_halved(n, k - b)] for n in level_b.shape[lead:]]
        out.append(_unpack(packed, k - b, lead, spatial))
    return out


# -- correlation ------------------------------------------------------------------------


def _halo_blocks(img1: Any, img2: Any, window: tuple[int, int]) -> tuple[Any, Any, list[tuple[int, ...]]]:
    """Both stacks in row bands (K and the columns whole), the same chunks, and a halo of the window's half-size.

    Returns the overlapped stacks and the output chunks along M and N: the
    outer blocks lose the half-window that has no neighbour.
    """
    import dask.array as da

    m, n = window[0] // 2, window[1] // 2
    k_axis = img1.ndim - 3
    chunks = list(img1.chunks)
    chunks[k_axis] = (img1.shape[k_axis],)
    chunks[-2] = _at_least(img1.shape[-2], chunks[-2], 2 * m + 1)
    # whole rows: XLA vectorises along the columns, and narrower blocks round more values differently
    # (2 ulp against 1 ulp for row bands, measured on a 70x53 stack)
    chunks[-1] = (img1.shape[-1],)
    img1, img2 = da.asarray(img1).rechunk(tuple(chunks)), da.asarray(img2).rechunk(tuple(chunks))
    depth = {img1.ndim - 2: m, img1.ndim - 1: n}
    ov1 = da.overlap.overlap(img1, depth=depth, boundary="none")
    ov2 = da.overlap.overlap(img2, depth=depth, boundary="none")
    out = []
    for axis, half in ((img1.ndim - 2, m), (img1.ndim - 1, n)):
        sizes = list(img1.chunks[axis])
        sizes[0] -= half
        sizes[-1] -= half
        out.append(tuple(sizes))
    return ov1, ov2, out


def _at_least(n: int, chunks: tuple[int, ...], minimum: int) -> tuple[int, ...]:
    """Chunks of ``n`` none smaller than ``minimum`` (merging small ones), as close to the input's as can be."""
    if min(chunks) >= minimum or len(chunks) == 1:
        return chunks
    step = max(max(chunks), minimum)
    out = [min(step, n - start) for start in range(0, n, step)]
    if len(out) > 1 and out[-1] < minimum:
        out[-2] += out.pop()
    return tuple(out)


def windowed_pearson(
    img1: Any, img2: Any, window: tuple[int, int], dtype: np.dtype, *, offsets_first: bool = False
) -> Any:
    """The full map of dask stacks as a dask array ``(..., M - 2m, N - 2n, wm, wn)``
    (``(..., wm, wn, M - 2m, N - 2n)`` with ``offsets_first``)."""
    import dask.array as da

    ov1, ov2, (rows, cols) = _halo_blocks(img1, img2, window)
    lead = ov1.ndim - 3

    def block(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        from napari_gridmip.core.correlation import windowed_pearson as in_memory

        return np.asarray(in_memory(a, b, window, dtype=dtype, offsets_first=offsets_first))

    offsets = ((window[0],), (window[1],))
    if offsets_first:
        chunks, new_axis = (*ov1.chunks[:lead], *offsets, rows, cols), [lead, lead + 1]
    else:
        chunks, new_axis = (*ov1.chunks[:lead], rows, cols, *offsets), [lead + 2, lead + 3]
    return da.map_blocks(block, ov1, ov2, dtype=dtype, chunks=chunks, drop_axis=[lead], new_axis=new_axis)


def find_displacement(img1: Any, img2: Any, window: tuple[int, int], subpixel: str, dtype: np.dtype) -> tuple:
    """``(dy, dx, peak)`` of dask stacks, each a dask array ``(..., M - 2m, N - 2n)`` computed block by block."""
    import dask.array as da

    ov1, ov2, (rows, cols) = _halo_blocks(img1, img2, window)
    lead = ov1.ndim - 3

    def block(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        from napari_gridmip.core.correlation import find_displacement as in_memory

        return np.stack([np.asarray(r) for r in in_memory(a, b, window, subpixel=subpixel, dtype=dtype)])

    chunks = ((3,), *ov1.chunks[:lead], rows, cols)
    # one task per block computes all three; each output is a view of the stacked block
    stacked = da.map_blocks(block, ov1, ov2, dtype=dtype, chunks=chunks, drop_axis=[lead], new_axis=[0])
    return stacked[0], stacked[1], stacked[2]


# -- merge --------------------------------------------------------------------------------


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

    from napari_gridmip.core.patches import patch_origins

    d = len(stride)
    patch_size = patches.shape[patches.ndim - d :]
    lead = image_shape[: len(image_shape) - d]
    tiled = image_shape[len(image_shape) - d :]
    origins = [patch_origins(n, p, s) for n, p, s in zip(tiled, patch_size, stride)]
    bounds = [[(start, min(start + chunk, n)) for start in range(0, n, chunk)] for n in tiled]

    def merged_block(sub_patches: np.ndarray, sub_shape: tuple[int, ...], crop: tuple[slice, ...]) -> np.ndarray:
        from napari_gridmip.core.patches import merge_patches as in_memory

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
