"""Obviously right NumPy references for the patches job: plain loops over the definitions (apply_tiled's
windows, tiles and merges; the stitching's pair registration, placement and fusion)."""

from __future__ import annotations

import itertools

import numpy as np

from napari_gridmip.core.patches.grid import blend_window


def reference_axis(n, window, halo, overlap):
    """[(start, valid_start, valid_stop)] along one axis, from the definition."""
    if window >= n:
        return [(0, 0, n)]
    stride = window - 2 * halo - overlap
    starts = list(range(0, n - window + 1, stride))
    if starts[-1] + window < n:
        starts.append(n - window)
    out = []
    for i, s in enumerate(starts):
        lo = 0 if i == 0 else s + halo
        hi = n if i == len(starts) - 1 else s + window - halo
        out.append((s, lo, hi))
    return out


def reference_owner(axis):
    """Per pixel of the axis, the index of the window that owns it (seams midway through shared valid pixels)."""
    n = axis[-1][2]
    seams = [(axis[k + 1][1] + axis[k][2]) // 2 for k in range(len(axis) - 1)]
    owner = np.zeros(n, int)
    for x in range(n):
        owner[x] = sum(x >= s for s in seams)
    return owner


def reference_tiled(fn, image, tile, halo, overlap, blend="crop", sigma_scale=0.125):
    """Run fn on every window; crop: copy each pixel from its owner; else weighted mean in float64.

    ``halo`` and ``overlap`` are pixels per axis; the tile is clipped to short axes.
    """
    d = len(tile)
    tiled = image.shape[image.ndim - d :]
    window = [min(t, n) for t, n in zip(tile, tiled)]
    axes = [reference_axis(n, w, h, o) for n, w, h, o in zip(tiled, window, halo, overlap)]
    owners = [reference_owner(a) for a in axes]
    out = acc = total = None
    for index in itertools.product(*(range(len(a)) for a in axes)):
        read = tuple(slice(a[i][0], a[i][0] + w) for a, i, w in zip(axes, index, window))
        y = np.asarray(fn(image[(Ellipsis, *read)]))
        lead = y.shape[: y.ndim - d]
        if out is None:
            out = np.zeros(lead + tuple(tiled), y.dtype)
            acc = np.zeros(lead + tuple(tiled))
            total = np.zeros(tuple(tiled))
        for pixel in itertools.product(*(range(a[i][1], a[i][2]) for a, i in zip(axes, index))):
            local = tuple(p - a[i][0] for p, a, i in zip(pixel, axes, index))
            if blend == "crop":
                if all(o[p] == i for o, p, i in zip(owners, pixel, index)):
                    out[(Ellipsis, *pixel)] = y[(Ellipsis, *local)]
            else:
                weight = 1.0
                for a, i, p, w, h in zip(axes, index, pixel, window, halo):
                    core = w - 2 * h if len(a) > 1 else w
                    h = h if len(a) > 1 else 0
                    profile = np.ones(core) if blend == "mean" else blend_window(core, blend, sigma_scale=sigma_scale)
                    weight *= profile[min(max(p - a[i][0] - h, 0), core - 1)]
                acc[(Ellipsis, *pixel)] += weight * y[(Ellipsis, *local)]
                total[pixel] += weight
    return out if blend == "crop" else acc / total


def same_partition(a, b):
    """Whether two label images split the pixels the same way (background 0 the same, a bijection of the rest)."""
    a, b = np.asarray(a).ravel(), np.asarray(b).ravel()
    if not np.array_equal(a == 0, b == 0):
        return False
    pairs = np.unique(np.stack([a, b], axis=1), axis=0)
    return len(pairs) == len(np.unique(a)) == len(np.unique(b))


def blobs(shape, density, smooth, seed):
    """Random blobs: smoothed noise above a level that makes about ``density`` of the pixels foreground."""
    from scipy import ndimage

    noise = np.random.default_rng(seed).random(shape)
    field = ndimage.gaussian_filter(noise, smooth, mode="wrap")
    return field > np.quantile(field, 1 - density)


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
