"""Obviously right NumPy references for the stitching tests: loops over the definitions."""

from __future__ import annotations

import itertools

import numpy as np


def fuse_reference(tiles: np.ndarray, positions: np.ndarray, blend: str, fill: float = 0.0):
    """Integer positions only: paste every tile (n, C, *S) in index order into float64 accumulators."""
    n, channels = tiles.shape[:2]
    size = np.array(tiles.shape[2:])
    positions = np.asarray(positions).astype(np.int64)
    lo = positions.min(axis=0)
    hi = (positions + size).max(axis=0)
    acc = np.zeros((channels, *(hi - lo)))
    weight = np.zeros(tuple(hi - lo))
    covered = np.zeros(tuple(hi - lo), bool)
    biggest = np.full_like(acc, -np.inf)
    for tile, p in zip(tiles.astype(np.float64), positions):
        box = tuple(slice(int(o), int(o) + int(s)) for o, s in zip(p - lo, size))
        ramps = [np.minimum(np.arange(s) + 1, s - np.arange(s)).astype(float) for s in size]
        w = np.ones(tuple(size))
        if blend == "linear":
            for axis, ramp in enumerate(ramps):
                w = w * ramp.reshape([-1 if k == axis else 1 for k in range(len(size))])
        if blend in ("linear", "mean"):
            acc[(slice(None), *box)] += tile * w
            weight[box] += w
        elif blend == "max":
            biggest[(slice(None), *box)] = np.maximum(biggest[(slice(None), *box)], tile)
        else:
            acc[(slice(None), *box)] = tile
        covered[box] = True
    if blend in ("linear", "mean"):
        out = acc / np.where(weight > 0, weight, 1)
    else:
        out = biggest if blend == "max" else acc
    return np.where(covered, out, fill), lo


def ncc_reference(template: np.ndarray, search: np.ndarray, reach: int) -> np.ndarray:
    """NCC of ``template`` against ``search[s : s + T]`` for every ``s`` in ``[0, 2 reach]^d``, by loops."""
    d = template.ndim
    t = template.astype(np.float64).ravel()
    t = t - t.mean()
    out = np.full((2 * reach + 1,) * d, np.nan)
    for s in itertools.product(range(2 * reach + 1), repeat=d):
        window = search[tuple(slice(a, a + n) for a, n in zip(s, template.shape))].astype(np.float64).ravel()
        window = window - window.mean()
        denominator = np.linalg.norm(t) * np.linalg.norm(window)
        if denominator > 0:
            out[s] = t @ window / denominator
    return out


def band_pass_reference(raw: np.ndarray, sigma: float, halo: int) -> np.ndarray:
    """``G_sigma - G_2sigma`` by normalised convolution (NaN = no data), cropped by ``halo``, by direct sums."""
    have = np.isfinite(raw)
    f = np.where(have, raw, 0.0)
    x = np.arange(-halo, halo + 1)

    def taps(width):
        g = np.exp(-0.5 * (x / width) ** 2)
        return g / g.sum()

    out_shape = tuple(n - 2 * halo for n in raw.shape)
    result = np.zeros(out_shape)
    for index in itertools.product(*(range(n) for n in out_shape)):
        values = []
        for width in (sigma, 2 * sigma):
            g = taps(width)
            kernel = np.ones((1,) * raw.ndim)
            for axis in range(raw.ndim):
                kernel = kernel * g.reshape([-1 if k == axis else 1 for k in range(raw.ndim)])
            box = tuple(slice(i, i + 2 * halo + 1) for i in index)
            values.append((kernel * f[box]).sum() / (kernel * have[box]).sum())
        result[index] = values[0] - values[1]
    return result


def chain_positions(pairs: np.ndarray, offsets: np.ndarray, n: int, order: list[tuple[int, int]]) -> np.ndarray:
    """Positions from chaining pair offsets along the tree edges ``order`` (each ``(known, new)``), tile 0 at 0."""
    lookup = {}
    for (i, j), o in zip(pairs, offsets):
        lookup[(i, j)] = o
        lookup[(j, i)] = -o
    positions = np.full((n, offsets.shape[1]), np.nan)
    positions[order[0][0]] = 0
    for known, new in order:
        positions[new] = positions[known] + lookup[(known, new)]
    return positions
