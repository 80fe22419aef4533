"""The occupancy and max pyramids of a dask volume: lazily, block by block, with the in-memory kernel inside each
block, in the manner of dask-image (dask arrays in and out, NumPy blocks in every task, so the graphs run on any
scheduler, a ``dask.distributed`` cluster included). The levels equal the in-memory ones bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from napari_gridmip.core.occupancy._shapes import mipmap_shapes

BLOCK_LEVELS = 7  # mipmap blocks of up to 2**7 = 128 voxels a side: 2 MiB of uint8, bounded memory per task


# The blocks are 2**b-aligned, so that each block's levels need that block alone; the few coarsest levels are
# reduced from level b.
def pyramid(volume: Any, levels_of: Callable, coarse: Callable, dtype: np.dtype) -> list[Any]:
    """The pyramid of a dask ``(..., D, H, W)`` volume (validated by the caller), made block by block with the
    in-memory kernel ``levels_of`` (3D block -> its levels), and the coarsest levels reduced from level ``b``
    with ``coarse`` (level -> its levels); the levels are dask arrays of ``dtype``. The kernels are handed in:
    this module imports nothing back from the public functions."""
    lead = volume.ndim - 3
    shapes = mipmap_shapes(volume.shape[-3:])
    top = len(shapes) - 1
    b = min(top, BLOCK_LEVELS)
    size = 2**b
    spatial = [_aligned_chunks(n, chunks, size) for n, chunks in zip(volume.shape[-3:], volume.chunks[-3:])]
    volume = volume.rechunk(tuple((1,) * n for n in volume.shape[:lead]) + tuple(spatial))

    packed = _packed_levels(volume, levels_of, b + 1)
    levels = [
        _unpack(packed, k, lead, [[_halved(c, k) for c in axis] for axis in spatial], dtype) for k in range(b + 1)
    ]
    if top > b:
        levels += _coarse_levels(levels[b], coarse, lead, b, top, dtype)
    return levels


def _packed_levels(volume: Any, levels_of: Callable, count: int) -> Any:
    """One task per block of ``volume``: the block's first ``count`` levels, as a list in a 1-element object block.

    Every level of a block comes from one call of the in-memory kernel; the
    levels are taken apart afterwards by :func:`_unpack`.
    """

    def block_levels(block: np.ndarray) -> np.ndarray:
        levels = levels_of(np.asarray(block).reshape(block.shape[-3:]))
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


def _unpack(packed: Any, k: int, lead: int, spatial_chunks: list[list[int]], dtype: np.dtype) -> Any:
    """Level ``k`` out of the per-block lists of levels (a block smaller than ``2**k`` has reached (1, 1, 1))."""
    chunks = tuple(packed.chunks[:lead]) + tuple(tuple(axis) for axis in spatial_chunks)

    def take(block: np.ndarray) -> np.ndarray:
        levels = block.flat[0]
        level = levels[min(k, len(levels) - 1)]
        return level.reshape((1,) * lead + level.shape)

    return packed.map_blocks(take, dtype=dtype, chunks=chunks)


def _coarse_levels(level_b: Any, coarse: Callable, lead: int, b: int, top: int, dtype: np.dtype) -> list[Any]:
    """Levels ``b + 1 .. top`` from level ``b``, which is small: one block per leading index."""
    whole = level_b.rechunk(tuple((1,) * n for n in level_b.shape[:lead]) + tuple((n,) for n in level_b.shape[lead:]))
    packed = _packed_levels(whole, coarse, top - b + 1)
    out = []
    for k in range(b + 1, top + 1):
        spatial = [[_halved(n, k - b)] for n in level_b.shape[lead:]]
        out.append(_unpack(packed, k - b, lead, spatial, dtype))
    return out
