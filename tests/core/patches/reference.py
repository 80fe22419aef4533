"""Plain-loop references for apply_tiled: windows from the definition, every tile run, every pixel merged by hand."""

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
