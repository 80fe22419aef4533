"""The pair kernel of :mod:`~napari_gridmip.core.patches.stitch` in NumPy/SciPy: nothing to compile.

The same computation as ``stitch._register_batch`` (band-pass by normalised
convolution, masked NCC over every integer shift by FFTs, the 3^d quadratic
peak fit, the Gauss-Newton refinement with Keys cubic resampling) on float32
batches, vectorised over the batch. Where nothing is compiled, no shape needs
sharing, so the work is cut to what the results depend on: batches of regions
of similar size, each distinct region prepared and transformed once (a pair
and its null samples share some), tiles band-passed whole, once, by FFTs, and
the integer search's regions 1 px past ``max_shift``. ``register_tiles``
takes it for small mosaics, where compiling the JAX programs (seconds, once
per process and pair shape) would cost far more than the work; the tests hold
the two to the same results.

References
----------
Padfield, "Masked object registration in the Fourier domain", IEEE TIP 2012 (masked NCC).
Keys, "Cubic convolution interpolation for digital image processing", IEEE TASSP 1981.
"""

from __future__ import annotations

import functools
from collections import OrderedDict

import numpy as np
from scipy import fft as sfft

from napari_gridmip.core.interpolation import keys_weights
from napari_gridmip.core.patches._stitch_shared import Band, band_widths, filters
from napari_gridmip.core.peak import quadratic_peak

__all__: list[str] = []

WORKERS = 2  # scipy.fft threads for a batch (the FFTs of one pair are small; a batch's are not)


def _sum(x: np.ndarray, d: int) -> np.ndarray:
    """Sum over the last ``d`` (spatial) axes."""
    return x.sum(axis=tuple(range(x.ndim - d, x.ndim)))


def _expand(x: np.ndarray, d: int) -> np.ndarray:
    """A per-pair value ``(B, ...)`` broadcast against ``(B, ..., *spatial)``."""
    return x.reshape(x.shape + (1,) * d)


def _boxes(have: np.ndarray, d: int) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """Per axis, ``(lo, hi)`` (each ``(B,)``) of the box the finite pixels fill; None if they fill no box."""
    out = []
    for axis in range(d):
        other = tuple(a for a in range(1, d + 1) if a != axis + 1)
        line = have.any(axis=other) if other else have
        lo, hi = line.argmax(axis=1), line.shape[1] - line[:, ::-1].argmax(axis=1)
        empty = ~line.any(axis=1)  # no pixel at all: the empty box [0, 0)
        out.append((np.where(empty, 0, lo), np.where(empty, 0, hi)))
    # the pixels lie inside the box their projections span: they fill it if they are as many as its pixels
    count = have.reshape(len(have), -1).sum(axis=1)
    return out if np.array_equal(count, np.prod([hi - lo for lo, hi in out], axis=0)) else None


def band_pass(raw: np.ndarray, sigma: Band, low_only: bool, d: int, box: bool = False) -> np.ndarray:
    """``stitch._band_pass`` on a batch ``(B, *raw)``: the output is each region less its halo.

    The same truncated Gaussians (radius: the halo), applied separably in real
    space (JAX's circular FFT convolution equals the linear one on the cropped
    output; separable passes are cheaper here).
    """
    from scipy import ndimage

    from napari_gridmip.core.patches._stitch_shared import filter_halo

    have = np.isfinite(raw)
    f = np.where(have, raw, np.float32(0)).astype(np.float32)
    if not filters(sigma):
        return f
    halo = filter_halo(sigma, low_only)
    shape = raw.shape[-d:]
    w = have.astype(np.float32)
    x = np.arange(-halo, halo + 1, dtype=np.float64)
    crop = (Ellipsis, *(slice(halo, n - halo) for n in shape))
    # where the data fill a box (a whole tile, NaN around it), the smoothed weights are an outer product of
    # 1D profiles: only f needs the separable passes
    boxes = _boxes(have, d) if box else None
    lows = []
    for width in band_widths(sigma, low_only):
        taps = np.exp(-0.5 * (x / width) ** 2)
        taps /= taps.sum()
        if boxes is not None:
            smooth_f = f
            for axis in range(d):
                smooth_f = ndimage.correlate1d(smooth_f, taps, axis=f.ndim - d + axis, mode="constant", cval=0.0)
            smooth_w = np.ones((len(f),) + (1,) * d, np.float32)
            for axis, (lo, hi) in enumerate(boxes):
                line = np.zeros((len(f), shape[axis]), np.float32)
                line[np.arange(shape[axis])[None, :] >= lo[:, None]] = 1
                line[np.arange(shape[axis])[None, :] >= hi[:, None]] = 0
                line = ndimage.correlate1d(line, taps, axis=1, mode="constant", cval=0.0)
                smooth_w = smooth_w * line.reshape((len(f),) + tuple(-1 if k == axis else 1 for k in range(d)))
            pair = np.stack([smooth_f, np.broadcast_to(smooth_w, f.shape)], axis=1)[crop]
        else:
            pair = np.stack([f, w], axis=1)  # (B, 2, ...): f and w smoothed alike
            for axis in range(d):
                pair = ndimage.correlate1d(pair, taps, axis=pair.ndim - d + axis, mode="constant", cval=0.0)
            pair = pair[crop]
        lows.append((pair[:, 0] / np.maximum(pair[:, 1], np.float32(1e-3)), pair[:, 1]))
    out = lows[0][0] if low_only else lows[0][0] - lows[1][0]
    return np.where(lows[0][1] > 1e-3, out, np.float32(0)).astype(np.float32)


def spd_solve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``stitch._spd_solve`` on a batch: ``a (B, n, n)``, ``b (B, n)`` or ``(B, n, m)``; the same unrolled Cholesky
    (with its floor on the pivots, so that a singular system of padding gives finite numbers, as there)."""
    n = a.shape[1]
    tiny = np.asarray(1e-30, a.dtype)
    low = [[None] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            rest = a[:, i, j] - sum((low[i][k] * low[j][k] for k in range(j)), np.zeros((), a.dtype))
            low[i][j] = np.sqrt(np.maximum(rest, tiny)) if i == j else rest / low[j][j]

    def per(x):  # a (B,) factor against b's (B,) or (B, m) rows
        return x if b.ndim == 2 else x[:, None]

    y: list = []
    for i in range(n):
        y.append((b[:, i] - sum((per(low[i][k]) * y[k] for k in range(i)), np.zeros_like(b[:, i]))) / per(low[i][i]))
    x: list = [None] * n
    for i in reversed(range(n)):
        rest = sum((per(low[k][i]) * x[k] for k in range(i + 1, n)), np.zeros_like(b[:, i]))
        x[i] = (y[i] - rest) / per(low[i][i])
    return np.stack(x, axis=1)


def quadratic_nd(hood: np.ndarray) -> np.ndarray:
    """``stitch._quadratic_nd`` on a batch of 3^d neighbourhoods ``(B, 3, ..., 3)``: the offsets ``(B, d)``."""
    d = hood.ndim - 1
    c = (1,) * d

    def at(offsets):
        return hood[(slice(None), *(ci + o for ci, o in zip(c, offsets)))]

    centre = hood[(slice(None), *c)]
    unit = [tuple(1 if k == a else 0 for k in range(d)) for a in range(d)]
    grad = np.stack([(at(u) - at(tuple(-v for v in u))) / 2 for u in unit], axis=1)  # (B, d)
    if d == 2:  # core.peak.quadratic_peak on NumPy arrays, from the JAX engine's differences
        hyy = at((1, 0)) + at((-1, 0)) - 2 * centre
        hxx = at((0, 1)) + at((0, -1)) - 2 * centre
        hxy = (at((1, 1)) - at((1, -1)) - at((-1, 1)) + at((-1, -1))) / 4
        return np.stack(quadratic_peak(grad[:, 0], grad[:, 1], hyy, hxx, hxy, xp=np), axis=1).astype(hood.dtype)
    hess = np.zeros((len(hood), d, d), hood.dtype)
    for a in range(d):
        for b in range(d):
            if a == b:
                hess[:, a, a] = at(unit[a]) + at(tuple(-v for v in unit[a])) - 2 * centre
            else:
                pp = tuple(unit[a][k] + unit[b][k] for k in range(d))
                pm = tuple(unit[a][k] - unit[b][k] for k in range(d))
                hess[:, a, b] = (at(pp) - at(pm) - at(tuple(-v for v in pm)) + at(tuple(-v for v in pp))) / 4
    neg = -hess
    definite = neg[:, 0, 0] > 0  # Sylvester's criterion on -hess (stitch._leading_minors_positive)
    if d >= 2:
        definite &= neg[:, 0, 0] * neg[:, 1, 1] - neg[:, 0, 1] * neg[:, 1, 0] > 0
    if d >= 3:
        definite &= np.linalg.det(neg) > 0
    eye = np.broadcast_to(np.eye(d, dtype=hess.dtype), hess.shape)
    step = spd_solve(np.where(definite[:, None, None], neg, eye), grad)
    diag = np.diagonal(hess, axis1=1, axis2=2)
    ok = definite & np.all(np.abs(step) <= 1, axis=1)
    one_d = np.where(diag < 0, np.clip(-grad / np.where(diag < 0, diag, -1), -0.5, 0.5), 0.0)
    return np.where(ok[:, None], step, one_d).astype(hood.dtype)


def resample(f: np.ndarray, position: np.ndarray, out_shape: tuple[int, ...]) -> tuple[np.ndarray, list[np.ndarray]]:
    """``stitch._resample`` on a batch: ``f (B, *S)``, ``position (B, d)``: the values and the gradient.

    Separable: along each axis the 4 Keys taps weigh 4 shifted slices (no stacked copies); the value takes
    the value weights along every axis, the derivative along axis ``k`` the slope weights along ``k``.
    """
    d = len(out_shape)
    batch = len(f)
    base = np.floor(position)
    phi = (position - base).astype(f.dtype)
    start = base.astype(np.int64) - 1
    # every pair's block of out_shape + 3 samples from its start, in one gather
    windows = np.lib.stride_tricks.sliding_window_view(f, tuple(o + 3 for o in out_shape), axis=tuple(range(1, d + 1)))
    block = windows[(np.arange(batch), *(start[:, k] for k in range(d)))]
    variants = {(): block}  # key: the axes along which the slope (not the value) was taken so far
    for axis in range(d):
        value, slope, _ = keys_weights(phi[:, axis], np)  # (B, 4) each: the same operations as the JAX engine's
        n = out_shape[axis]
        weights = {False: value.astype(f.dtype), True: slope.astype(f.dtype)}
        shape = (batch,) + (1,) * d
        new = {}
        for key, x in variants.items():
            for derivative in (False, True) if len(key) == 0 else (False,):
                w = weights[derivative]
                acc = None
                for t in range(4):
                    term = w[:, t].reshape(shape) * x[(slice(None),) * (axis + 1) + (slice(t, t + n),)]
                    acc = term if acc is None else acc + term
                new[key + ((axis,) if derivative else ())] = acc
        variants = new
    return variants[()], [variants[(k,)] for k in range(d)]


def gauss_newton(f, t, mask, start, integer, reach, t_shape, iterations, max_step):
    """``stitch._gauss_newton`` on a batch: shift ``(B, d)``, information ``(B, d, d)``, failed ``(B,)``, NCC."""
    d = len(t_shape)
    batch = len(f)
    m = mask
    count = np.maximum(_sum(m, d), 1)
    t_mean = _sum(t * m, d) / count
    eye = np.eye(d + 2, dtype=t.dtype)

    def normal_equations(s):
        g, grad = resample(f, reach + s, t_shape)
        gm = _sum(g * m, d) / count
        gc = (g - _expand(gm, d)) * m
        a = _sum(gc * t, d) / np.maximum(_sum(gc * gc, d), np.float32(1e-30))
        b = t_mean - a * gm
        r = (t - _expand(a, d) * g - _expand(b, d)) * m
        columns = np.stack([_expand(a, d) * gk * m for gk in grad] + [g * m, m], axis=1).reshape(batch, d + 2, -1)
        jtj = columns @ np.swapaxes(columns, 1, 2)
        return jtj, np.einsum("bkp,bp->bk", columns, r.reshape(batch, -1)), r

    def ridge(jtj):
        return jtj + 1e-7 * np.trace(jtj, axis1=1, axis2=2)[:, None, None] * eye

    s = start.astype(t.dtype)
    jtj, r = np.zeros((batch, d + 2, d + 2), t.dtype), np.zeros_like(t)
    for _ in range(iterations):
        new_jtj, jtr, new_r = normal_equations(s)
        s = np.clip(s + spd_solve(ridge(new_jtj), jtr)[:, :d], integer - max_step, integer + max_step)
        jtj, r = new_jtj, new_r
    sigma2 = np.maximum(_sum(r * r, d) / np.maximum(count - d - 2, 1), 1e-4 * _sum(t * t, d) / count)
    a = ridge(jtj)
    with np.errstate(invalid="ignore", divide="ignore"):  # empty (padding) templates: NaN, as in JAX
        info = (a[:, :d, :d] - a[:, :d, d:] @ spd_solve(a[:, d:, d:], a[:, d:, :d])) / sigma2[:, None, None]
    failed = np.any(np.abs(s - integer) >= max_step - 1e-6, axis=1) | ~np.all(np.isfinite(s), axis=1)
    fit = t - r
    fit = (fit - _expand(_sum(fit * m, d) / count, d)) * m
    ncc = _sum(fit * t, d) / np.maximum(np.sqrt(_sum(fit * fit, d) * _sum(t * t, d)), np.float32(1e-30))
    return s, info, failed, ncc


def _box_sums(
    values: np.ndarray, lo: list[np.ndarray], hi: list[np.ndarray], d: int, rows: np.ndarray | None = None
) -> np.ndarray:
    """Sums of ``values`` ``(B, C, *S)`` over the boxes ``[lo[a], hi[a])`` along each spatial axis ``a``.

    ``lo[a]``, ``hi[a]``: ``(B, L_a)`` integer bounds (or ``(1, L_a)`` for all), one box per position; the
    result is ``(B, C, L_1, ..., L_d)``, float64. Prefix sums along one axis at a time (a summed-area table,
    axis by axis), the longest axis first: it shrinks the most. ``rows``: ``(B,)``, the row of ``values``
    (``(U, C, *S)``) that each box sums (its prefix sums taken once), else row ``b`` for box ``b``.
    """
    out = values
    batch = len(values) if rows is None else len(rows)
    for a in sorted(range(d), key=lambda a: -values.shape[2 + a]):
        axis = 2 + a
        shape = list(out.shape)
        shape[axis] += 1
        prefix = np.zeros(shape, np.float64)
        np.cumsum(out, axis=axis, dtype=np.float64, out=prefix[(slice(None),) * axis + (slice(1, None),)])
        if rows is not None:  # the shared prefix sums, one copy per box (then per box along the next axes)
            prefix, rows = prefix[rows], None
        first, last = (np.broadcast_to(x[a], (batch, np.shape(x[a])[-1])) for x in (lo, hi))
        shape[axis] = first.shape[1]
        out = _along(prefix, last, axis) - _along(prefix, first, axis)
    return out


def _along(values: np.ndarray, index: np.ndarray, axis: int) -> np.ndarray:
    """``values[b, ..., index[b, l], ...]`` along ``axis``: ``(B, ..., L, ...)`` (a per-pair gather, in one call).

    The gathered axis moved next to the batch's, so that one pair of indices picks a whole block of the other
    axes: 5 to 7 times faster than ``np.take_along_axis``, which indexes every element (the same values).
    """
    picked = np.moveaxis(values, axis, 1)[np.arange(len(index))[:, None], index]  # (B, L, ...)
    return np.moveaxis(picked, 1, axis)


def _sliding_sums(values: np.ndarray, extent: list[np.ndarray], positions: int, d: int) -> np.ndarray:
    """Sums of ``values`` ``(B, C, *S)`` over ``[s, s + extent[a])`` along each spatial axis ``a``, for ``s`` in
    ``0 .. positions - 1``: ``(B, C, positions, ...)``, float64.

    :func:`_box_sums` for windows that slide from the origin, without prefix sums of the whole axis: the sum
    of the axis, less the sums before the window and after it (each at most ``positions`` plus the spread of
    the extents long), the longest axis first.
    """
    out = values
    batch = len(values)
    for a in sorted(range(d), key=lambda a: -values.shape[2 + a]):
        axis = 2 + a
        size = out.shape[axis]
        e = np.broadcast_to(extent[a].reshape(-1), (batch,))

        def part(lo, hi, out=out, axis=axis):
            return out[(slice(None),) * axis + (slice(lo, hi),)]

        total = out.sum(axis=axis, dtype=np.float64, keepdims=True)
        shape = list(out.shape)
        shape[axis] = positions
        head = np.zeros(shape, np.float64)  # before the window: the first s values
        np.cumsum(
            part(0, positions - 1), axis=axis, dtype=np.float64, out=head[(slice(None),) * axis + (slice(1, None),)]
        )
        start = max(int(e.min()), 0)  # after the window: from s + e on, within the last size - start values
        shape[axis] = size - start + 1
        tail = np.zeros(shape, np.float64)
        tail[(slice(None),) * axis + (slice(0, size - start),)] = np.flip(
            np.cumsum(np.flip(part(start, size), axis=axis), axis=axis, dtype=np.float64), axis=axis
        )
        index = np.minimum(np.arange(positions)[None, :] + e[:, None] - start, size - start)
        out = total - head - _along(tail, index, axis)
    return out


def _masked_sums(f, t, have, mask, reach, d, si=None, ti=None, min_fraction=0.5):
    """The six maps of the masked NCC over the shifts ``0 .. 2 reach`` per axis, each ``(B, *(2 reach + 1,) * d)``.

    ``num`` (the template against the search) by FFTs; where the template's
    mask is a box from its origin and the search's data a box (tiles always
    are), the five sums of the template and the search over the pixels both
    hold at each shift by box sums (:func:`_box_sums`): three FFTs instead of
    twelve, and the sums exact. Otherwise all six by FFTs, as the JAX kernel.

    ``si``, ``ti``: ``(B,)``, item ``b`` matches search ``f[si[b]]`` against template ``t[ti[b]]`` (each
    search's and template's transform, and each search's sums over one template box, computed once); None:
    item ``b`` is ``f[b]`` against ``t[b]``. ``min_fraction``: the candidates' least share of the template on
    the data (what the transforms must reach, below).
    """
    window = (slice(None), slice(None), *(slice(0, 2 * reach + 1) for _ in range(d)))
    # FFT sizes padded to fast lengths (the search's padding holds no data: the masked NCC is unchanged)
    s_shape = tuple(sfft.next_fast_len(n, real=True) for n in f.shape[1:])
    axes = tuple(range(-d, 0))
    si = np.arange(len(f)) if si is None else np.asarray(si)
    ti = np.arange(len(t)) if ti is None else np.asarray(ti)
    batch = len(si)
    tm = t * mask
    mask_box = _boxes(mask > 0, d)
    have_box = _boxes(have > 0, d)
    boxes = mask_box is not None and have_box is not None
    if boxes and all(np.all(lo == 0) for lo, _ in mask_box):
        # a shift that keeps at most ``min_fraction`` of the template on the data is no candidate (``ok`` is False
        # there, from the exact counts: along each axis it keeps at least floor(min_fraction e) px), so the
        # transforms need not reach beyond the rest of a template past the data's end (a region cut past its
        # tile's edge: its NaN part); the candidates' products never wrap
        fft_shape = []
        for a in range(d):
            data_end, e = have_box[a][1][si], mask_box[a][1][ti]
            kept = np.floor(min_fraction * e).astype(np.int64)
            need = np.maximum(data_end, np.minimum(e + 2 * reach, data_end + e - kept + 1))
            fft_shape.append(min(sfft.next_fast_len(max(int(need.max()), 2 * reach + 1), real=True), s_shape[a]))
        fft_shape = tuple(fft_shape)
        num = sfft.irfftn(
            sfft.rfftn(f, s=fft_shape, axes=axes, workers=WORKERS)[si]
            * np.conj(sfft.rfftn(tm, s=fft_shape, axes=axes, workers=WORKERS))[ti],
            s=fft_shape, axes=axes, workers=WORKERS,
        )[window[:1] + window[2:]]  # fmt: skip
        shifts = np.arange(2 * reach + 1)[None, :]
        extent = [hi[ti][:, None] for _, hi in mask_box]  # (B, 1): the template's box, [0, extent) per axis
        have_box = [(lo[si], hi[si]) for lo, hi in have_box]
        # the search over the template's box at each shift (once per search and box); the template over the
        # part that meets the data
        combos, which = np.unique(np.stack([si, *(e[:, 0] for e in extent)], axis=1), axis=0, return_inverse=True)
        searched = _sliding_sums(
            np.stack([f, f * f], axis=1)[combos[:, 0]], [combos[:, 1 + a, None] for a in range(d)], 2 * reach + 1, d
        )[which.reshape(-1)]
        n = np.ones((batch,) + (2 * reach + 1,) * d)  # the pixels both hold: a product of 1D overlaps
        for a, ((lo, hi), e) in enumerate(zip(have_box, extent)):
            width = np.clip(np.minimum(shifts + e, hi[:, None]) - np.maximum(shifts, lo[:, None]), 0, None)
            n = n * width.reshape((batch,) + tuple(-1 if k == a else 1 for k in range(d)))
        t_lo = [np.clip(lo[:, None] - shifts, 0, e) for (lo, _), e in zip(have_box, extent)]
        t_hi = [np.clip(hi[:, None] - shifts, 0, e) for (_, hi), e in zip(have_box, extent)]
        templated = _box_sums(np.stack([tm, tm * t], axis=1), t_lo, t_hi, d, rows=ti)
        maps = [num, templated[:, 0], templated[:, 1], n, searched[:, 0], searched[:, 1]]
        return [m.astype(np.float32) for m in maps]
    f, have, t, tm, mask = f[si], have[si], t[ti], tm[ti], mask[ti]
    searched = sfft.rfftn(np.stack([f, f * f, have], axis=1), s=s_shape, axes=axes, workers=WORKERS)
    templated = np.conj(sfft.rfftn(np.stack([tm, tm * t, mask], axis=1), s=s_shape, axes=axes, workers=WORKERS))
    ff, ff2, fv = searched[:, 0], searched[:, 1], searched[:, 2]
    ft, ft2, fm = templated[:, 0], templated[:, 1], templated[:, 2]
    products = np.stack([ft * ff, ft * fv, ft2 * fv, fm * fv, fm * ff, fm * ff2], axis=1)
    maps = sfft.irfftn(products, s=s_shape, axes=axes, workers=WORKERS)[window]
    return [maps[:, q] for q in range(6)]


def register_batch(
    search,
    template,
    mask,
    *,
    max_shift: int,
    subpixel: str,
    sigma: Band,
    filtered: bool = False,
    items=None,
    margin: int | None = None,
    min_fraction: float | None = None,
):
    """``stitch._register_batch`` in NumPy: the same eight outputs for the same ``(B, ...)`` float32 batches.

    ``filtered``: the regions come band-passed already (from :class:`FilteredTiles`, without a halo).
    ``items``: ``(si, ti)``, each ``(B,)``: item ``b`` is ``search[si[b]]`` against ``template[ti[b]]`` (with
    ``mask[ti[b]]``), so that regions shared by several items (a pair and its null samples) are prepared and
    transformed once; None: item ``b`` is ``search[b]`` against ``template[b]``. ``margin``: how far the
    regions reach beyond ``max_shift`` (``MARGIN``, the JAX kernel's, unless given: the integer search needs 1,
    its peak's neighbours; the refinement ``MARGIN``). ``min_fraction``: a shift is a candidate while more than
    this share of the template meets the data (``MIN_FRACTION``, a half, unless given).
    """
    from napari_gridmip.core.patches import _stitch_shared as stitch

    search, template, mask = (np.asarray(x, np.float32) for x in (search, template, mask))
    d = mask.ndim - 1
    low_only = subpixel == "refine"
    if items is not None and low_only:  # (the refinement has no shared regions)
        search, template, mask = search[items[0]], template[items[1]], mask[items[1]]
        items = None
    si, ti = (np.arange(len(search)), np.arange(len(template))) if items is None else map(np.asarray, items)
    batch = len(si)
    sigma = 0.0 if filtered else sigma
    halo = stitch.filter_halo(sigma, low_only)
    have = np.isfinite(search)[(slice(None), *(slice(halo, n - halo) for n in search.shape[1:]))].astype(np.float32)
    search, template = band_pass(search, sigma, low_only, d), band_pass(template, sigma, low_only, d)
    margin = stitch.MARGIN if margin is None else int(margin)
    reach = max_shift + margin
    t_shape = template.shape[1:]
    count = np.maximum(_sum(mask, d), 1)
    t = np.where(mask > 0, template - _expand(_sum(template * mask, d) / count, d), np.float32(0))
    t_norm = np.sqrt(_sum(t * t, d))
    t = t / _expand(np.where(t_norm > 0, t_norm, 1), d) * _expand(np.sqrt(count), d)
    have_count = np.maximum(_sum(have, d), 1)
    f_mean = _sum(search * have, d) / have_count
    centred = search - _expand(f_mean, d)
    f_scale = np.sqrt(_sum((centred * have) ** 2, d) / have_count)
    f = np.where(have > 0, centred / _expand(np.where(f_scale > 0, f_scale, 1), d), np.float32(0))
    t, f = t.astype(np.float32), f.astype(np.float32)
    featureless = (t_norm <= 1e-6 * np.sqrt(count))[ti]
    false = np.zeros(batch, bool)
    min_fraction = stitch.MIN_FRACTION if min_fraction is None else float(min_fraction)
    if low_only:
        zero = np.zeros((batch, d), np.float32)
        shift, info, failed, ncc = gauss_newton(
            f, t, mask, zero, zero, reach, t_shape, stitch.GN_ITERATIONS, stitch.MAX_REFINE_STEP
        )
        none = (np.full(batch, np.nan, np.float32), np.zeros((batch, d), np.float32))
        return shift, np.where(featureless, np.nan, ncc), info, featureless, false, failed, *none
    num, sum_t, sum_t2, n, sum_f, sum_f2 = _masked_sums(f, t, have, mask, reach, d, si, ti, min_fraction)
    n_safe = np.maximum(n, 1)
    cov = num - sum_t * sum_f / n_safe
    var_t = np.maximum(sum_t2 - sum_t * sum_t / n_safe, 0)
    var_f = np.maximum(sum_f2 - sum_f * sum_f / n_safe, 0)
    denominator = np.sqrt(var_t * var_f)
    ok = (n > min_fraction * _expand(count[ti], d) - 0.5) & (var_t > 1e-6 * n_safe) & (var_f > 1e-6 * n_safe)
    with np.errstate(invalid="ignore", divide="ignore"):
        ncc = np.where(ok, cov / np.where(denominator > 0, denominator, 1), np.nan).astype(np.float32)
    core = ncc[(slice(None), *(slice(margin, margin + 2 * max_shift + 1) for _ in range(d)))]
    flat = np.argmax(np.where(np.isnan(core), -np.inf, core).reshape(batch, -1), axis=1)
    peak_index = np.stack(np.unravel_index(flat, core.shape[1:]), axis=1)  # (B, d)
    peak = core.reshape(batch, -1)[np.arange(batch), flat]
    featureless = featureless | ~np.isfinite(peak)
    peak = np.where(featureless, np.nan, peak)
    hoods = np.lib.stride_tricks.sliding_window_view(ncc, (3,) * d, axis=tuple(range(1, d + 1)))
    raw_hood = hoods[(np.arange(batch), *(peak_index[:, k] + margin - 1 for k in range(d)))]  # (B, 3, ..., 3)
    # next to a shift that keeps less than half the overlap: on the search's edge too (as in the JAX kernel)
    on_edge = np.any((peak_index == 0) | (peak_index == 2 * max_shift), axis=1)
    on_edge |= np.isnan(raw_hood).reshape(batch, -1).any(axis=1)
    integer = (peak_index - max_shift).astype(np.float32)
    hood = np.nan_to_num(raw_hood)
    start = integer + (quadratic_nd(hood) if subpixel != "none" else 0)
    info = np.broadcast_to(np.eye(d, dtype=np.float32), (batch, d, d)).copy()
    second, second_shift = rivals(ncc, peak_index, featureless, max_shift, margin, stitch.RIVAL_SEPARATION)
    return start.astype(np.float32), peak, info, featureless, on_edge, false, second, second_shift


def rivals(ncc, peak_index, featureless, max_shift: int, margin: int, separation: int):
    """The best rival of each pair's peak: the NCC ``(B,)`` and integer shift ``(B, d)`` of the highest local
    maximum (over its 3^d neighbourhood, NaN lower than anything) of ``ncc`` ``(B, *(2 reach + 1,) * d)`` within
    ``max_shift`` and more than ``separation`` px from ``peak_index`` along some axis (NaN and 0 where none), as
    the JAX kernel's."""
    from scipy import ndimage

    batch, d = peak_index.shape
    filled = np.where(np.isnan(ncc), -np.inf, ncc)
    hood_max = ndimage.maximum_filter(filled, size=(1,) + (3,) * d, mode="constant", cval=-np.inf)
    inner = (slice(None), *(slice(margin, margin + 2 * max_shift + 1) for _ in range(d)))
    local = ((filled >= hood_max) & np.isfinite(filled))[inner]
    core = filled[inner]
    distance = np.zeros(core.shape, np.int64)
    for a in range(d):
        along = np.arange(core.shape[1 + a]).reshape((1,) + tuple(-1 if k == a else 1 for k in range(d)))
        distance = np.maximum(distance, np.abs(along - _expand(peak_index[:, a], d)))
    candidates = np.where(local & (distance > separation), core, -np.inf).reshape(batch, -1)
    flat = np.argmax(candidates, axis=1)
    second = candidates[np.arange(batch), flat]
    second = np.where(np.isfinite(second) & ~featureless, second, np.nan).astype(np.float32)
    second_shift = (np.stack(np.unravel_index(flat, core.shape[1:]), axis=1) - max_shift).astype(np.float32)
    return second, np.where(np.isnan(second)[:, None], np.float32(0), second_shift)


def band_pass_tiles(raw: np.ndarray, sigma: Band, low_only: bool, d: int) -> np.ndarray:
    """:func:`band_pass` ``(box=True)`` on a batch of whole tiles ``(B, *raw)`` (each a box of data, NaN around
    it), by FFTs: one forward transform per tile, one inverse per Gaussian.

    The Gaussians are the same truncated kernels (radius: the halo), so the
    circular convolution of the zero-padded tile equals the linear one on
    the output (the tile less its halo, which stays clear of the wrap). Each
    tile's mean is taken out before the transforms and put back after (the
    normalised convolution passes a constant unchanged): float32 transforms
    then keep the precision of the separable passes. Tiles that are not a
    box of data (NaN inside) take :func:`band_pass`.
    """
    from napari_gridmip.core.patches._stitch_shared import filter_halo

    have = np.isfinite(raw)
    boxes = _boxes(have, d) if filters(sigma) else None
    if boxes is None:
        return band_pass(raw, sigma, low_only, d, box=True)
    halo = filter_halo(sigma, low_only)
    shape = raw.shape[-d:]
    axes = tuple(range(-d, 0))
    fast = tuple(sfft.next_fast_len(n, real=True) for n in shape)
    count = np.maximum(have.reshape(len(raw), -1).sum(axis=1), 1)
    f = np.where(have, raw, np.float32(0))
    level = (f.reshape(len(raw), -1).sum(axis=1, dtype=np.float64) / count).astype(np.float32)
    f = np.where(have, f - _expand(level, d), np.float32(0))
    spectrum = sfft.rfftn(f, s=fast, axes=axes, workers=WORKERS)
    crop = (Ellipsis, *(slice(halo, n - halo) for n in shape))
    x = np.arange(-halo, halo + 1, dtype=np.float64)
    lows = []
    for width in band_widths(sigma, low_only):
        taps = np.exp(-0.5 * (x / width) ** 2)
        taps /= taps.sum()
        smooth_f = sfft.irfftn(spectrum * _real_gaussian_spectrum(fast, float(width), halo), s=fast, axes=axes,
                               workers=WORKERS)[(Ellipsis, *(slice(0, n) for n in shape))][crop]  # fmt: skip
        smooth_w = np.ones((len(raw),) + (1,) * d, np.float32)
        for axis, (lo, hi) in enumerate(boxes):
            line = np.zeros((len(raw), shape[axis]), np.float32)
            line[np.arange(shape[axis])[None, :] >= lo[:, None]] = 1
            line[np.arange(shape[axis])[None, :] >= hi[:, None]] = 0
            line = ndimage_correlate1d(line, taps)[:, halo : shape[axis] - halo]
            smooth_w = smooth_w * line.reshape((len(raw),) + tuple(-1 if k == axis else 1 for k in range(d)))
        lows.append((smooth_f / np.maximum(smooth_w, np.float32(1e-3)), smooth_w))
    out = lows[0][0] + _expand(level, d) if low_only else lows[0][0] - lows[1][0]
    return np.where(np.broadcast_to(lows[0][1], out.shape) > 1e-3, out, np.float32(0)).astype(np.float32)


@functools.lru_cache(maxsize=16)
def _real_gaussian_spectrum(shape: tuple[int, ...], sigma: float, radius: int) -> np.ndarray:
    """``_stitch_shared._gaussian_spectrum``, real (the kernel is symmetric about pixel 0): float32, kept."""
    from napari_gridmip.core.patches._stitch_shared import _gaussian_spectrum

    return np.ascontiguousarray(_gaussian_spectrum(shape, sigma, radius).real)


def ndimage_correlate1d(lines: np.ndarray, taps: np.ndarray) -> np.ndarray:
    """``scipy.ndimage.correlate1d`` along the last axis, zeros beyond the ends (SciPy's ndimage imported here)."""
    from scipy import ndimage

    return ndimage.correlate1d(lines, taps, axis=-1, mode="constant", cval=0.0)


def whole_tiles_transform(tiles: np.ndarray, sigma: Band) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """Whole tiles ``(B, *S)`` (all finite) less their means, transformed: ``(spectrum, means, S)``, for
    :func:`whole_tiles_band_pass` (both filters: the transform is sized for the wider halo)."""
    from napari_gridmip.core.patches._stitch_shared import filter_halo

    d = tiles.ndim - 1
    shape = tiles.shape[1:]
    level = tiles.reshape(len(tiles), -1).mean(axis=1, dtype=np.float64).astype(np.float32)
    # zeros past the tile reach the far side's halo on the wrap: the linear convolution on the tile
    fast = tuple(sfft.next_fast_len(n + filter_halo(sigma), real=True) for n in shape)
    spectrum = sfft.rfftn(tiles - _expand(level, d), s=fast, axes=tuple(range(-d, 0)), workers=WORKERS)
    return spectrum, level, shape


def whole_tiles_band_pass(transform, sigma: Band, low_only: bool) -> np.ndarray:
    """:func:`band_pass` ``(box=True)`` of whole tiles (no NaN) from their :func:`whole_tiles_transform`.

    The normalised convolution of a whole tile divides by the smoothed tile footprint, the same for every
    tile (:func:`_footprint`); one inverse transform per Gaussian.
    """
    from napari_gridmip.core.patches._stitch_shared import filter_halo

    spectrum, level, shape = transform
    d = len(shape)
    halo = filter_halo(sigma, low_only)
    fast = tuple(sfft.next_fast_len(n + filter_halo(sigma), real=True) for n in shape)
    crop = (Ellipsis, *(slice(0, n) for n in shape))
    lows = []
    for width in band_widths(sigma, low_only):
        smooth = sfft.irfftn(spectrum * _real_gaussian_spectrum(fast, float(width), halo), s=fast,
                             axes=tuple(range(-d, 0)), workers=WORKERS)[crop]  # fmt: skip
        lows.append(np.divide(smooth, _footprint(shape, float(width), halo), out=smooth))  # (in place: no new pages)
    if low_only:
        return np.add(lows[0], _expand(level, d), out=lows[0])
    return np.subtract(lows[0], lows[1], out=lows[0])


@functools.lru_cache(maxsize=16)
def _footprint(shape: tuple[int, ...], sigma: float, radius: int) -> np.ndarray:
    """A whole tile's footprint (ones on the tile, zeros beyond) smoothed by the truncated Gaussian: float32,
    kept. An outer product of 1D profiles; at least about a quarter (a corner), so never the 1e-3 floor."""
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    taps = np.exp(-0.5 * (x / sigma) ** 2)
    taps /= taps.sum()
    out = np.ones((1,) * len(shape), np.float32)
    for axis, n in enumerate(shape):
        line = ndimage_correlate1d(np.ones((1, n), np.float32), taps)[0]
        out = out * line.reshape(tuple(-1 if k == axis else 1 for k in range(len(shape))))
    return np.maximum(out, np.float32(1e-3))


STACK_CHUNK_BYTES = 2**20  # tiles band-passed per FFT batch: about this much raw data


class FilteredTiles:
    """Regions of band-passed tiles (NaN beyond the tile), each tile filtered once as a whole.

    The JAX kernel band-passes every region it is given (with a halo, by
    normalised convolution over the tile's pixels); each output pixel sees
    only its own tile's pixels within the halo, so filtering the whole tile
    once and cutting the regions out gives the same values, and a tile's many
    regions (its pairs and the null samples) cost one filter.

    Where all tiles fit in ``CACHE_BYTES`` (with a border of ``pad`` px of
    NaN around each), they are filtered together by FFTs, a few at a time,
    into one padded stack, and :meth:`gather` cuts many regions at once from
    it without a copy per region; otherwise tiles are filtered one by one
    when asked for and the least recently used dropped.
    """

    halo = 0

    def __init__(self, reader, sigma: Band, low_only: bool, pad: int = 0, spectra: dict | None = None):
        self.reader, self.sigma, self.low_only = reader, sigma, low_only
        self.shape = reader.shape
        self.pad = int(pad)
        self.tiles: OrderedDict[int, np.ndarray] = OrderedDict()  # least recently used first
        self.stack: np.ndarray | None = None
        self.spectra = spectra  # the stack's tiles' transforms, shared between the two filters' readers

    def clear(self) -> None:
        self.tiles.clear()
        self.stack = None

    def _filtered(self, indices, keep: bool = False) -> np.ndarray:
        from napari_gridmip.core.patches._stitch_shared import filter_halo

        d = len(self.shape)
        key = tuple(indices)
        if filters(self.sigma) and self.spectra is not None and key in self.spectra:  # (the last filter to need it)
            transform = self.spectra.pop(key) if self.low_only else self.spectra[key]
            return whole_tiles_band_pass(transform, self.sigma, self.low_only)
        if filters(self.sigma):
            data = np.stack([self.reader.read(i, (0,) * d, self.shape, halo=0) for i in indices])
            if np.isfinite(data).all():  # (tiles always are; NaN inside a tile takes the general filter)
                transform = whole_tiles_transform(data, self.sigma)
                if keep and self.spectra is not None:
                    self.spectra[key] = transform
                return whole_tiles_band_pass(transform, self.sigma, self.low_only)
        halo = filter_halo(self.sigma, self.low_only)
        raw = np.stack([self.reader.read(i, (0,) * d, self.shape, halo=halo) for i in indices])  # NaN around
        return band_pass_tiles(raw, self.sigma, self.low_only, d)

    def _fill_stack(self) -> bool:
        """Filter every tile into the padded stack if they fit in ``CACHE_BYTES``; whether they did."""
        from napari_gridmip.core.patches._stitch_shared import CACHE_BYTES

        if self.stack is not None:
            return True
        n = int(self.reader.tiles.shape[0])
        padded = tuple(s + 2 * self.pad for s in self.shape)
        if n * int(np.prod(padded)) * 4 > CACHE_BYTES:
            return False
        keep = 2 * n * int(np.prod(padded)) * 4 <= CACHE_BYTES  # the transforms too (about the stack's size)
        stack = np.full((n, *padded), np.nan, np.float32)
        inside = tuple(slice(self.pad, self.pad + s) for s in self.shape)
        per = max(1, STACK_CHUNK_BYTES // (int(np.prod(self.shape)) * 4))
        for first in range(0, n, per):
            chunk = range(first, min(first + per, n))
            stack[(slice(chunk.start, chunk.stop), *inside)] = self._filtered(list(chunk), keep)
        self.stack = stack
        return True

    def tile(self, index: int) -> np.ndarray:
        from napari_gridmip.core.patches._stitch_shared import CACHE_BYTES

        if self._fill_stack():
            return self.stack[(int(index), *(slice(self.pad, self.pad + s) for s in self.shape))]
        if index in self.tiles:
            self.tiles.move_to_end(index)
            return self.tiles[index]
        filtered = self._filtered([index])[0]
        self.tiles[index] = filtered
        while len(self.tiles) > max(1, CACHE_BYTES // max(filtered.nbytes, 1)):
            self.tiles.popitem(last=False)
        return filtered

    def region(self, index: int, start, extent) -> np.ndarray:
        """Tile ``index``'s filtered pixels ``[start, start + extent)``, float32, NaN beyond the tile."""
        tile = self.tile(int(index))
        out = np.full(tuple(int(e) for e in extent), np.nan, np.float32)
        lo = [max(int(s), 0) for s in start]
        hi = [min(int(s) + int(e), n) for s, e, n in zip(start, extent, self.shape)]
        if all(b > a for a, b in zip(lo, hi)):
            out[tuple(slice(a - int(s), b - int(s)) for a, b, s in zip(lo, hi, start))] = tile[
                tuple(slice(a, b) for a, b in zip(lo, hi))
            ]
        return out

    def gather(self, requests, out: np.ndarray) -> bool:
        """Write regions into the corners of ``out[slot]`` (NaN there already); False (nothing written) when the
        stack is not there or a region leaves its border (the caller then cuts them one by one).

        ``requests``: per slot ``(tile, start, order, cut, flips)``: the region ``[start, start + cut)`` along the
        tile's axes ``order`` (``cut`` in that order), its axes ``order`` first, flipped along ``flips``.
        """
        if not self._fill_stack():
            return False
        d = len(self.shape)
        size = self.stack.shape[1:]
        views: dict = {}
        cuts = []
        pad = self.pad
        for slot, (tile, start, order, cut, flips) in enumerate(requests):
            key = (tuple(order), tuple(flips) if flips is not None else (False,) * d)
            view = views.get(key)
            if view is None:
                view = self.stack.transpose(0, *(1 + np.asarray(order)))
                view = view[(slice(None), *(slice(None, None, -1) if f else slice(None) for f in key[1]))]
                views[key] = view
            window = [int(tile)]
            for a in range(d):
                o, c = order[a], cut[a]
                first = start[o] + pad
                if key[1][a]:  # flipped: the view counts from the far end
                    first = size[o] - first - c
                if first < 0 or first + c > size[o]:
                    return False
                window.append(slice(first, first + c))
            cuts.append(((slot, *(slice(0, c) for c in cut)), view, tuple(window)))
        for place, view, window in cuts:
            out[place] = view[window]
        return True
