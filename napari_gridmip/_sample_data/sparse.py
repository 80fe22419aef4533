"""The "Sparse volume (large)" sample: a uint16 volume of 2048^3 voxels, well under 2% occupied, as a chunked Zarr
written once into the per-user cache and opened from there as a multiscale layer.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import platformdirs

from napari_gridmip.core.runtime.files import OutputExistsError, atomic_path
from napari_gridmip.io.lazy import LazyLevel

SIZE = 2048
CHUNK = 64
CELL = 8  # the occupancy cells stored with the sample (the live render's skipping grid; 8 skips 3x more than 16)
COARSEST = 256  # levels are halved down to this side
VERSION = 2
DESCRIPTION = (
    "Sparse volume (large): uint16 {n}^3, {occupied:.3%} occupied: thin filaments (1 and 2 voxels wide), small "
    "blobs and three dense clusters. napari's 3D view shows the coarsest level ({coarse}^3, every {stride}th "
    "voxel): the filaments break up and vanish there. Turn on 'Full resolution in 3D' in the Occupancy mipmap "
    "widget to see them: each view is rendered from level 0, reading only the chunks its rays need."
)


def cache_folder() -> Path:
    override = os.environ.get("NAPARI_GRIDMIP_CACHE_DIR")
    if override:
        return Path(override) / "samples"
    return Path(platformdirs.user_cache_dir("napari-gridmip")) / "samples"


def sparse_voxels(size: int = SIZE, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The occupied voxels of the sample: int64 ``(m, 3)`` coordinates (unique, sorted) and uint16 values."""
    rng = np.random.default_rng(seed)
    coords, values = [], []
    scale = size / 512
    # filaments: smooth random curves across the volume, 1 or 2 voxels wide
    for i in range(max(4, int(16 * scale))):
        start, end = rng.uniform(0.05, 0.95, (2, 3)) * size
        length = np.linalg.norm(end - start)
        s = np.linspace(0, 1, int(length / 0.4) + 2)[:, None]
        wiggle = sum(
            rng.normal(0, size / 20, 3) * np.sin(np.pi * (k + 1) * s + rng.uniform(0, np.pi)) for k in range(3)
        )
        points = start + s * (end - start) + wiggle * np.sin(np.pi * s)
        points = np.clip(points, 0, size - 1)
        if i % 2:  # 2 voxels wide
            points = np.concatenate([points, np.clip(points + 0.7, 0, size - 1)])
        value = rng.integers(700, 1400) + 250 * np.sin(np.linspace(0, 6, len(points)))
        coords.append(np.floor(points).astype(np.int64))
        values.append(value)
    # small blobs
    ball = _ball_offsets(3.2)
    for _ in range(max(8, int(128 * scale))):
        center = rng.integers(4, size - 4, 3)
        coords.append(center + ball)
        values.append(rng.integers(1500, 3000) * (1 - 0.15 * np.linalg.norm(ball, axis=1) / 3.2))
    # three dense clusters: many voxels close together
    for _ in range(3):
        center = rng.uniform(0.2, 0.8, 3) * size
        radius = size / 40
        offsets = rng.normal(0, radius / 2, (int(20_000 * scale**2), 3))
        coords.append(np.clip(np.floor(center + offsets), 0, size - 1).astype(np.int64))
        values.append(rng.integers(300, 2500, len(offsets)))
    coords = np.concatenate(coords)
    values = np.clip(np.concatenate(values), 1, 65535).astype(np.uint16)
    keys = np.ravel_multi_index(tuple(coords.T), (size,) * 3)
    order = np.argsort(keys, kind="stable")
    keys, values = keys[order], values[order]
    first = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    values = np.maximum.reduceat(values, first)  # one value per voxel: the brightest
    return np.stack(np.unravel_index(keys[first], (size,) * 3), 1), values


def _ball_offsets(radius: float) -> np.ndarray:
    r = int(np.ceil(radius))
    grid = np.stack(np.meshgrid(*[np.arange(-r, r + 1)] * 3, indexing="ij"), -1).reshape(-1, 3)
    return grid[np.linalg.norm(grid, axis=1) <= radius]


def _write_level(group: Any, name: str, shape: tuple[int, ...], coords: np.ndarray, values: np.ndarray) -> int:
    """One level: only the chunks holding a voxel are written. Returns how many."""
    array = group.create_array(name, shape=shape, chunks=(CHUNK,) * 3, dtype=np.uint16, fill_value=0)
    grid = tuple(-(-n // CHUNK) for n in shape)
    chunk_ids = np.ravel_multi_index(tuple((coords // CHUNK).T), grid)
    order = np.argsort(chunk_ids, kind="stable")
    chunk_ids, coords, values = chunk_ids[order], coords[order], values[order]
    starts = np.flatnonzero(np.r_[True, chunk_ids[1:] != chunk_ids[:-1]])
    ends = np.r_[starts[1:], len(chunk_ids)]
    for a, b in zip(starts, ends):
        index = np.array(np.unravel_index(chunk_ids[a], grid)) * CHUNK
        region = tuple(slice(i, min(i + CHUNK, n)) for i, n in zip(index, shape))
        block = np.zeros([s.stop - s.start for s in region], np.uint16)
        local = coords[a:b] - index
        block[tuple(local.T)] = values[a:b]
        array[region] = block
    return len(starts)


def write_sparse_volume(path: os.PathLike, size: int = SIZE, *, seed: int = 0) -> dict[str, Any]:
    """Write the sample's Zarr group (levels ``"0"``, ``"1"``, ... and ``cells``) at ``path``; returns its attrs.

    Thin filaments (1 and 2 voxels wide, neurite-like curves), small blobs and a few dense clusters in zeros. The
    voxels are made as a sparse list (coordinates and values), so only the chunks that hold one are ever allocated
    and written: the Zarr store holds those chunks alone (the rest read as the fill value 0). It is written once into
    the per-user cache (``platformdirs``; ``NAPARI_GRIDMIP_CACHE_DIR`` overrides it) and opened from there as a
    multiscale layer whose coarser levels are strided (every 2nd voxel), as many pyramids are: napari's 3D view shows
    the coarsest level, in which the filaments break up and vanish. The occupancy of 8^3 cells of level 0 is stored
    beside the levels (``cells``) so that "Full resolution in 3D" needs no pass over the data.
    """
    import zarr  # 0.1 to 0.3 s to import: this module loads with every sample (the cache's folder)

    coords, values = sparse_voxels(size, seed)
    group = zarr.open_group(str(path), mode="w")
    written, shapes = [], []
    level_coords, level_values, shape = coords, values, (size,) * 3
    k = 0
    while True:
        shapes.append(shape)
        written.append(_write_level(group, str(k), shape, level_coords, level_values))
        if max(shape) <= COARSEST:
            break
        keep = np.all(level_coords % 2 == 0, axis=1)  # strided: every 2nd voxel along each axis
        level_coords, level_values = level_coords[keep] // 2, level_values[keep]
        shape = tuple(-(-n // 2) for n in shape)
        k += 1
    cells = np.zeros(tuple(-(-n // CELL) for n in (size,) * 3), bool)
    cells[tuple((coords // CELL).T)] = True
    group.create_array("cells", data=cells, chunks=tuple(min(n, 128) for n in cells.shape))
    attrs = {
        "version": VERSION,
        "size": size,
        "seed": seed,
        "occupied": len(values) / size**3,
        "chunks_written": written,
        "chunks_total": [int(np.prod([-(-n // CHUNK) for n in s])) for s in shapes],
        "cell": CELL,
        "levels": len(shapes),
    }
    group.attrs.update(attrs)
    return attrs


def open_sparse_volume(size: int = SIZE, *, seed: int = 0, folder: os.PathLike | None = None) -> tuple[list, dict]:
    """The sample's levels (Zarr arrays, finest first) and attrs, written into the cache on first use."""
    import zarr  # 0.1 to 0.3 s to import: this module loads with every sample (the cache's folder)

    folder = Path(folder) if folder is not None else cache_folder()
    path = folder / f"sparse-volume-{size}-seed{seed}-v{VERSION}.zarr"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        try:
            with atomic_path(path) as partial:  # complete or absent, never half-written
                write_sparse_volume(partial, size, seed=seed)
        except OutputExistsError:  # another process finished first
            pass
    group = zarr.open_group(str(path), mode="r")
    attrs = dict(group.attrs)
    return [group[str(k)] for k in range(attrs["levels"])], {**attrs, "cells": np.asarray(group["cells"][...])}


def sparse_volume_sample(size: int = SIZE) -> list[tuple]:
    """File > Open Sample > Sparse volume (large): the multiscale layer (written into the cache on first use).

    The levels are lazy views of the Zarr arrays (:class:`~napari_gridmip.io.lazy.LazyLevel`): napari's multiscale
    slicing takes the non-displayed axes whole before it picks the dims point, so a Zarr level read the whole depth
    of the view (all of level 1 of the 2048^3 sample, 2 GiB, held while the slice was shown; 3.3 GiB at the peak as
    the layer was added), where a lazy level reads the plane. The live view still reads the chunk files directly."""
    levels, attrs = open_sparse_volume(size)
    levels = [LazyLevel(level) for level in levels]
    stride = 2 ** (attrs["levels"] - 1)
    description = DESCRIPTION.format(n=size, occupied=attrs["occupied"], coarse=levels[-1].shape[0], stride=stride)
    metadata = {
        "description": description,
        # the occupancy of 8^3 cells of level 0 (voxels > 0): what "Full resolution in 3D" skips empty space with
        "gridmip_cells": {"cells": attrs["cells"], "cell": attrs["cell"], "threshold": 0.0},
    }
    kwargs = {
        "name": "sparse volume",
        "multiscale": True,
        "contrast_limits": (0, 2000),
        "colormap": "magma",
        "rendering": "mip",
        "metadata": metadata,
    }
    return [(levels, kwargs, "image")]
