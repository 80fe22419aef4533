"""Obviously-right NumPy references for the occupancy job: loops over the definitions, no cleverness.

Imported by the occupancy tests (never one test file from another).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from tests.helpers import reference_levels  # noqa: F401 - the any-pyramid reference, re-exported


def block_max(block: np.ndarray):
    """Maximum of a block with NaN ignored; NaN if every value is NaN (loops, Python comparisons)."""
    values = [v for v in block.ravel().tolist() if not (isinstance(v, float) and math.isnan(v))]
    if not values:
        return np.nan
    best = values[0]
    for v in values[1:]:
        if v > best:
            best = v
    return best


def max_levels(volume: np.ndarray) -> list[np.ndarray]:
    """Max pyramid: level 0 the volume, each coarser voxel the NaN-ignoring max of its clipped 2x2x2 block."""
    volume = np.asarray(volume)
    # floats through float64 (exact widening), so that tolist() gives Python floats for bfloat16 too
    level = volume.astype(np.float64) if is_float(volume.dtype) else volume
    levels = [volume]
    while any(n > 1 for n in level.shape):
        shape = tuple((n + 1) // 2 for n in level.shape)
        coarse = np.zeros(shape, dtype=level.dtype)
        for z, y, x in itertools.product(*map(range, shape)):
            coarse[z, y, x] = block_max(level[2 * z : 2 * z + 2, 2 * y : 2 * y + 2, 2 * x : 2 * x + 2])
        levels.append(coarse.astype(volume.dtype))  # exact: each value is one of the volume's
        level = coarse
    return levels


def is_float(dtype) -> bool:
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype.name == "bfloat16"


def occupied(volume: np.ndarray, threshold: float) -> np.ndarray:
    """``volume > threshold`` compared as real numbers (Python objects: no rounding of the threshold)."""
    volume = np.asarray(volume)
    if is_float(volume.dtype):
        return volume.astype(np.float64) > float(threshold)  # float64 holds every narrower float exactly
    return (volume.astype(object) > threshold).astype(bool)


def bbox(level0: np.ndarray):
    """(lo, hi) of the occupied voxels by a scan of level 0, or None."""
    found = np.argwhere(np.asarray(level0))
    if len(found) == 0:
        return None
    return tuple(int(v) for v in found.min(axis=0)), tuple(int(v) for v in found.max(axis=0) + 1)


def box_is_empty(level0: np.ndarray, lo, hi) -> bool:
    lo = [max(int(v), 0) for v in lo]
    hi = [min(int(v), n) for v, n in zip(hi, level0.shape)]
    if any(h <= low for low, h in zip(lo, hi)):
        return True
    return not np.asarray(level0)[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]].any()


def straddling_occupied_cells(levels, lo, hi) -> int:
    """Occupied cells of every level that meet the box ``[lo, hi)`` without lying inside it (loops)."""
    shape = levels[0].shape
    lo = [max(int(v), 0) for v in lo]
    hi = [min(int(v), n) for v, n in zip(hi, shape)]
    count = 0
    for k, level in enumerate(levels):
        level = np.asarray(level)
        for cell in itertools.product(*map(range, level.shape)):
            if not level[cell]:
                continue
            start = [c << k for c in cell]
            end = [min((c + 1) << k, n) for c, n in zip(cell, shape)]
            meets = all(s < h and e > low for s, e, low, h in zip(start, end, lo, hi))
            inside = all(s >= low and e <= h for s, e, low, h in zip(start, end, lo, hi))
            count += meets and not inside
    return count


def chunk_occupancy(level0: np.ndarray, bounds) -> np.ndarray:
    """Loop over the chunks given by per-axis boundaries ``[0, b1, ..., n]``."""
    level0 = np.asarray(level0)
    out = np.zeros([len(b) - 1 for b in bounds], dtype=bool)
    for index in itertools.product(*[range(len(b) - 1) for b in bounds]):
        region = tuple(slice(b[i], b[i + 1]) for b, i in zip(bounds, index))
        out[index] = level0[region].any()
    return out


def morton3d(x: int, y: int, z: int) -> int:
    """instant-ngp's morton3D: the bits of x, y, z interleaved, x lowest."""
    code = 0
    for i in range(21):
        code |= ((x >> i) & 1) << (3 * i) | ((y >> i) & 1) << (3 * i + 1) | ((z >> i) & 1) << (3 * i + 2)
    return code


def morton_pack(level: np.ndarray) -> np.ndarray:
    """One byte per 2x2x2 block (cell (z, y, x) of it bit 4z + 2y + x), blocks sorted by morton3d(bx, by, bz)."""
    level = np.asarray(level)
    blocks = [(n + 1) // 2 for n in level.shape]
    entries = []
    for bz, by, bx in itertools.product(*map(range, blocks)):
        byte = 0
        for dz, dy, dx in itertools.product(range(2), repeat=3):
            z, y, x = 2 * bz + dz, 2 * by + dy, 2 * bx + dx
            if z < level.shape[0] and y < level.shape[1] and x < level.shape[2] and level[z, y, x]:
                byte |= 1 << (4 * dz + 2 * dy + dx)
        entries.append((morton3d(bx, by, bz), byte))
    return np.array([byte for _, byte in sorted(entries)], dtype=np.uint8)


def c_pack(level: np.ndarray) -> np.ndarray:
    """Cell i of level.ravel() is bit i % 8 of byte i // 8 (loops)."""
    flat = np.asarray(level).ravel()
    out = np.zeros((flat.size + 7) // 8, dtype=np.uint8)
    for i, bit in enumerate(flat):
        if bit:
            out[i // 8] |= 1 << (i % 8)
    return out


def flush(x, dtype):
    """XLA's flush of subnormal results to zero, applied after each operation of the crossing-time formula."""
    x = np.asarray(x, dtype)
    return np.where(np.abs(x) < np.finfo(dtype).tiny, np.zeros_like(x), x)


def crossing_times(o: float, d: float, planes: np.ndarray, dtype) -> np.ndarray:
    """T(b) = (b - o) * (1 / d) in ``dtype``, as the traversal computes it (inf where d == 0)."""
    if d == 0:
        return np.full(len(planes), np.inf, dtype)
    inverse = flush(dtype(1) / dtype(d), dtype)
    return flush(flush(np.asarray(planes).astype(dtype) - dtype(o), dtype) * inverse, dtype)


def ray_voxels(level0, origin, direction, t_near=0.0, t_far=np.inf, dtype=np.float32):
    """Every occupied voxel a ray crosses, from the sorted crossing times of all planes of the grid.

    The voxel along an axis during ``[s, e)`` is given by how many of that
    axis's plane crossings lie at or before ``s``. Returns [(voxel, s, e)].
    """
    level0 = np.asarray(level0)
    shape = level0.shape
    o = flush(np.asarray(origin, dtype), dtype)
    d = flush(np.asarray(direction, dtype), dtype)
    t_near, t_far = flush(t_near, dtype)[()], flush(t_far, dtype)[()]
    times = [crossing_times(o[a], d[a], np.arange(shape[a] + 1), dtype) for a in range(3)]
    entry, leave = [], []
    for a in range(3):
        if d[a] != 0:
            entry.append(min(times[a][0], times[a][-1]))
            leave.append(max(times[a][0], times[a][-1]))
        elif 0 <= o[a] < shape[a]:
            entry.append(-np.inf)
            leave.append(np.inf)
        else:
            return []
    t0, t1 = max(max(entry), t_near), min(min(leave), t_far)
    if not t0 < t1:
        return []
    inner = [t for a in range(3) if d[a] != 0 for t in times[a] if t0 < t < t1]
    breaks = sorted(set([t0, t1] + inner))
    out = []
    for s, e in zip(breaks[:-1], breaks[1:]):
        voxel = []
        for a in range(3):
            if d[a] > 0:
                voxel.append(int(np.sum(times[a] <= s)) - 1)
            elif d[a] < 0:
                voxel.append(shape[a] - int(np.sum(times[a] <= s)))
            else:
                voxel.append(int(np.floor(o[a])))
        if all(0 <= v < n for v, n in zip(voxel, shape)) and level0[tuple(voxel)]:
            out.append((tuple(voxel), s, e))
    return out


def sampled_occupancy(level0, origin, direction, ts):
    """Occupied(floor(o + t d)) at each sample ``t``, in float64 (an independent check of the intervals)."""
    level0 = np.asarray(level0)
    points = np.floor(np.asarray(origin, np.float64) + np.asarray(ts)[:, None] * np.asarray(direction, np.float64))
    inside = np.all((points >= 0) & (points < np.array(level0.shape)), axis=1)
    index = np.where(inside[:, None], points, 0).astype(int)
    return inside & level0[index[:, 0], index[:, 1], index[:, 2]]


def dense_mip(volume, origin, direction, t_near=-np.inf, t_far=np.inf, dtype=np.float32):
    """The maximum over every voxel the ray crosses (occupied or not), or None if it crosses none."""
    volume = np.asarray(volume)
    crossed = ray_voxels(np.ones(volume.shape, bool), origin, direction, t_near, t_far, dtype)
    if not crossed:
        return None
    return max(volume[v].astype(np.float64) for v, _, _ in crossed)
