"""The pair kernel of :mod:`~napari_gridmip.core.patches.stitch` in JAX: one compiled program per pair shape.

Imported only when a mosaic is large enough for the compiled programs to pay
for their compile (``stitch._engine``), so that small mosaics never import
JAX; ``_stitch_numpy`` computes the same on small ones. ``stitch`` forwards
these names (``stitch._register_batch`` ...) for the tests and the references.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from napari_gridmip.core.interpolation import keys_weights
from napari_gridmip.core.patches._stitch_shared import (
    GN_ITERATIONS,
    MARGIN,
    MAX_REFINE_STEP,
    MIN_FRACTION,
    RIVAL_SEPARATION,
    Band,
    _gaussian_spectrum,
    band_widths,
    filter_halo,
    filters,
)
from napari_gridmip.core.peak import quadratic_peak
from napari_gridmip.core.runtime import compile_cache
from napari_gridmip.core.runtime.precision import HIGHEST

__all__: list[str] = []

compile_cache.enable()  # the JAX engine's programs outlive the process (core.__init__ left it to this module)


# -- the pair kernel (JAX) ----------------------------------------------------------------


def _resample(f: jax.Array, position: jax.Array, out_shape: tuple[int, ...]) -> tuple[jax.Array, list[jax.Array]]:
    """``g[x] = f(x + position)`` over ``out_shape`` by separable Keys cubic convolution, and its gradient.

    ``position`` (d,) is real; ``f`` must hold the taps (checked by the caller's margins).
    Each axis is one pass: its 4 taps stacked, contracted with the value and
    slope kernels at once, so that value and gradient share the passes.
    """
    d = len(out_shape)
    base = jnp.floor(position)
    phi = position - base
    start = tuple((base.astype(jnp.int32) - 1)[k] for k in range(d))
    block = lax.dynamic_slice(f, start, tuple(o + 3 for o in out_shape))
    # out[v] for v in 0..d: v = 0 the value, v = k + 1 the derivative along axis k
    out = block[None]
    for axis in range(d):
        value, slope, _ = keys_weights(phi[axis], jnp)  # the taps -1 .. 2 around base
        kernels = jnp.stack([slope, value])  # (2, 4)
        # which kernel each output variant takes along this axis: the slope for the derivative along it
        pick = jnp.asarray([0 if v == axis + 1 else 1 for v in range(d + 1)])
        taps = jnp.stack([lax.slice_in_dim(out, t, t + out_shape[axis], axis=axis + 1) for t in range(4)], axis=1)
        weights = kernels[pick]  # (d + 1, 4)
        if out.shape[0] == 1:
            taps = jnp.broadcast_to(taps, (d + 1, *taps.shape[1:]))
        out = jnp.einsum("vt,vt...->v...", weights, taps, precision=HIGHEST)
    return out[0], [out[k + 1] for k in range(d)]


def _spd_solve(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a^-1 b`` for a small symmetric positive definite ``a`` (n <= 5), by an unrolled Cholesky factorisation.

    XLA's batched LU and inverse take seconds to compile for 4x4 systems; this
    is a few dozen scalar operations. ``b`` is ``(n,)`` or ``(n, m)``.
    """
    n = a.shape[0]
    tiny = jnp.asarray(1e-30, a.dtype)
    low = [[None] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            rest = a[i, j] - sum((low[i][k] * low[j][k] for k in range(j)), jnp.zeros((), a.dtype))
            low[i][j] = jnp.sqrt(jnp.maximum(rest, tiny)) if i == j else rest / low[j][j]
    y: list[Any] = []
    for i in range(n):
        y.append((b[i] - sum((low[i][k] * y[k] for k in range(i)), jnp.zeros_like(b[i]))) / low[i][i])
    x: list[Any] = [None] * n
    for i in reversed(range(n)):
        x[i] = (y[i] - sum((low[k][i] * x[k] for k in range(i + 1, n)), jnp.zeros_like(b[i]))) / low[i][i]
    return jnp.stack(x)


def _leading_minors_positive(a: jax.Array) -> jax.Array:
    """Sylvester's criterion for a symmetric ``a`` of size 1 to 3: positive definite."""
    n = a.shape[0]
    ok = a[0, 0] > 0
    if n >= 2:
        ok &= a[0, 0] * a[1, 1] - a[0, 1] * a[1, 0] > 0
    if n >= 3:
        ok &= jnp.linalg.det(a) > 0
    return ok


def _quadratic_nd(hood: jax.Array) -> jax.Array:
    """The sub-pixel offset (d,) of the peak of a 3^d neighbourhood (centre = the integer peak)."""
    d = hood.ndim
    c = (1,) * d

    def at(offsets):
        return hood[tuple(ci + o for ci, o in zip(c, offsets))]

    unit = [tuple(1 if k == a else 0 for k in range(d)) for a in range(d)]
    grad = jnp.stack([(at(u) - at(tuple(-v for v in u))) / 2 for u in unit])
    if d == 2:
        # core.peak's 2D fit (Newton step, 1D fallbacks), the solve shared. The differences are this
        # function's, written for any d: they are subpixel_offset(hood, "hessian")'s but for the order of the
        # Hessian's diagonal sums, (c+ + c-) - 2 c0 here, (c+ - 2 c0) + c- there (an ulp apart), which keeps
        # this engine's peaks as they were and equal to the NumPy engine's (_stitch_numpy.quadratic_nd)
        hyy = at((1, 0)) + at((-1, 0)) - 2 * hood[c]
        hxx = at((0, 1)) + at((0, -1)) - 2 * hood[c]
        hxy = (at((1, 1)) - at((1, -1)) - at((-1, 1)) + at((-1, -1))) / 4
        return jnp.stack(quadratic_peak(grad[0], grad[1], hyy, hxx, hxy, xp=jnp))
    hess = []
    for a in range(d):
        row = []
        for b in range(d):
            if a == b:
                row.append(at(unit[a]) + at(tuple(-v for v in unit[a])) - 2 * hood[c])
            else:
                pp = tuple(unit[a][k] + unit[b][k] for k in range(d))
                pm = tuple(unit[a][k] - unit[b][k] for k in range(d))
                row.append((at(pp) - at(pm) - at(tuple(-v for v in pm)) + at(tuple(-v for v in pp))) / 4)
        hess.append(jnp.stack(row))
    hess = jnp.stack(hess)
    definite = _leading_minors_positive(-hess)  # the Hessian is negative definite: a maximum
    step = _spd_solve(jnp.where(definite, -hess, jnp.eye(d, dtype=hess.dtype)), grad)
    diag = jnp.diagonal(hess)
    # a maximum within one pixel, else per-axis parabolas
    ok = definite & jnp.all(jnp.abs(step) <= 1)
    one_d = jnp.where(diag < 0, jnp.clip(-grad / jnp.where(diag < 0, diag, -1), -0.5, 0.5), 0.0)
    return jnp.where(ok, step, one_d)


def _band_pass(raw: jax.Array, sigma: Band, low_only: bool = False) -> jax.Array:
    """``G_sigma * f - G_2sigma * f`` by normalised convolution, 'valid' (the output is ``raw`` less its halo).

    ``low_only``: ``G_sigma * f`` alone (the refinement's filter: it keeps the
    coarse structure, which carries most of the signal, and removes the
    finest detail, which cubic interpolation would resample worst).

    NaN in ``raw`` marks pixels without data (beyond the tile): each Gaussian
    averages the pixels that exist (``G * (f w) / G * w``), so a tile's border
    gets no artificial structure. ``sigma = 0``: no filter, NaN read as 0.
    The convolutions go through FFTs of the region (circular, but the halo
    that is cropped holds all the wrapped pixels).
    """
    have = jnp.isfinite(raw)
    f = jnp.where(have, raw, 0)
    if not filters(sigma):
        return f
    halo = filter_halo(sigma, low_only)
    w = have.astype(raw.dtype)
    axes = tuple(range(1, raw.ndim + 1))  # the stacked f and w are not transformed along the stack
    spectra = jnp.fft.rfftn(jnp.stack([f, w]), axes=axes)
    crop = tuple(slice(halo, n - halo) for n in raw.shape)

    widths = band_widths(sigma, low_only)
    kernels = np.stack([_gaussian_spectrum(raw.shape, width, halo) for width in widths])[:, None]
    # one inverse FFT for both Gaussians and both of f and w: (widths, 2, *raw)
    smooth = jnp.fft.irfftn(spectra[None] * kernels, s=raw.shape, axes=tuple(a + 1 for a in axes))
    smooth = smooth[(slice(None), slice(None), *crop)]
    low = smooth[:, 0] / jnp.maximum(smooth[:, 1], 1e-3)
    out = low[0] if low_only else low[0] - low[1]
    return jnp.where(smooth[0, 1] > 1e-3, out, 0)


def _pair_kernel(
    search, template, mask, *, max_shift: int, subpixel: str, sigma: Band, min_fraction: float = MIN_FRACTION
):
    """Register one pair: the NCC map over integer shifts within ``max_shift``, its peak, and the refinement.

    ``search`` and ``template`` come with a halo of :func:`filter_halo` pixels
    (NaN where there is no data: beyond the tile, or padding) and are
    band-passed first. Then ``search`` is ``template.shape + 2 * (max_shift +
    MARGIN)``; the template's valid pixels (``mask``) at shift ``s`` meet
    ``search[x + max_shift + MARGIN + s]``, where ``search`` has data.
    Returns the shift (d,), the NCC at the integer peak, an inverse covariance
    (d, d), flags (featureless, on the edge, refinement failed), and the NCC
    and integer shift (d,) of its best *rival*: the highest local maximum of
    the NCC (over its 3^d neighbourhood) more than ``RIVAL_SEPARATION`` px
    from the peak along some axis (NaN and 0 where there is none, and in the
    refinement). A shift is a candidate while more than ``min_fraction`` of
    the template's pixels meet the search's data.
    """
    low_only = subpixel == "refine"  # the refinement pass: low-pass only (see _band_pass)
    halo = filter_halo(sigma, low_only)
    have = jnp.isfinite(search)[tuple(slice(halo, n - halo) for n in search.shape)].astype(search.dtype)
    search, template = _band_pass(search, sigma, low_only), _band_pass(template, sigma, low_only)
    d = template.ndim
    reach = max_shift + MARGIN
    t_shape = template.shape
    count = jnp.maximum(mask.sum(), 1)
    t = jnp.where(mask > 0, template - (template * mask).sum() / count, 0)
    t_norm = jnp.sqrt((t * t).sum())
    t = t / jnp.where(t_norm > 0, t_norm, 1) * jnp.sqrt(count)  # unit variance: sums stay O(count) in float32
    have_count = jnp.maximum(have.sum(), 1)
    f_mean = (search * have).sum() / have_count
    f_scale = jnp.sqrt((((search - f_mean) * have) ** 2).sum() / have_count)
    f = jnp.where(have > 0, (search - f_mean) / jnp.where(f_scale > 0, f_scale, 1), 0)
    featureless = t_norm <= 1e-6 * jnp.sqrt(count)
    if subpixel == "refine":  # the second pass: Gauss-Newton from the coarse offset, no map
        zero = jnp.zeros(d, f.dtype)
        shift, info, failed, ncc = _gauss_newton(f, t, mask, zero, zero, reach, t_shape)
        none = (jnp.asarray(jnp.nan, f.dtype), jnp.zeros(d, f.dtype))
        return shift, jnp.where(featureless, jnp.nan, ncc), info, featureless, jnp.asarray(False), failed, *none
    # NCC over the pixels that both regions hold at each shift (masked NCC, Padfield 2012): the template may
    # reach beyond tile i at some shifts, so that it can span the whole nominal overlap
    s_shape = f.shape
    stacked = tuple(a + 1 for a in range(d))  # FFTs of stacks: one call for several arrays
    searched = jnp.fft.rfftn(jnp.stack([f, f * f, have]), axes=stacked)
    pad = [(0, 0)] + [(0, s - n) for s, n in zip(s_shape, t_shape)]
    tm = t * mask
    templated = jnp.conj(jnp.fft.rfftn(jnp.pad(jnp.stack([tm, tm * t, mask]), pad), axes=stacked))
    ff, ff2, fv = searched
    ft, ft2, fm = templated
    products = jnp.stack([ft * ff, ft * fv, ft2 * fv, fm * fv, fm * ff, fm * ff2])
    window = (slice(None), *(slice(0, 2 * reach + 1) for _ in range(d)))
    num, sum_t, sum_t2, n, sum_f, sum_f2 = jnp.fft.irfftn(products, s=s_shape, axes=stacked)[window]
    n_safe = jnp.maximum(n, 1)
    cov = num - sum_t * sum_f / n_safe
    var_t = jnp.maximum(sum_t2 - sum_t * sum_t / n_safe, 0)
    var_f = jnp.maximum(sum_f2 - sum_f * sum_f / n_safe, 0)
    denominator = jnp.sqrt(var_t * var_f)
    # at least min_fraction of the template must overlap; a variance at rounding level (1e-6) is as flat as none
    ok = (n > min_fraction * count - 0.5) & (var_t > 1e-6 * n_safe) & (var_f > 1e-6 * n_safe)
    ncc = jnp.where(ok, cov / jnp.where(denominator > 0, denominator, 1), jnp.nan)
    inner = tuple(slice(MARGIN, MARGIN + 2 * max_shift + 1) for _ in range(d))
    core = ncc[inner]
    flat = jnp.argmax(jnp.where(jnp.isnan(core), -jnp.inf, core))
    peak_index = jnp.stack(jnp.unravel_index(flat, core.shape)).astype(jnp.int32)
    peak = core.reshape(-1)[flat]
    featureless = featureless | ~jnp.isfinite(peak)
    peak = jnp.where(featureless, jnp.nan, peak)
    raw_hood = lax.dynamic_slice(ncc, tuple(peak_index[k] + MARGIN - 1 for k in range(d)), (3,) * d)
    # a peak next to a shift that keeps less than half the overlap is on the search's edge too: the true one
    # may lie beyond (a stage error that eats most of the nominal overlap)
    on_edge = jnp.any((peak_index == 0) | (peak_index == 2 * max_shift)) | jnp.any(jnp.isnan(raw_hood))
    integer = peak_index - max_shift  # the shift s at the integer peak
    hood = jnp.nan_to_num(raw_hood)
    quadratic = _quadratic_nd(hood)
    start = integer.astype(f.dtype) + (quadratic if subpixel != "none" else 0)
    # the best rival: a local maximum (NaN: lower than anything) away from the peak
    filled = jnp.where(jnp.isnan(ncc), -jnp.inf, ncc)
    hood_max = lax.reduce_window(filled, -jnp.inf, lax.max, (3,) * d, (1,) * d, "SAME")
    local = ((filled >= hood_max) & jnp.isfinite(filled))[inner]
    index = jnp.stack(jnp.meshgrid(*(jnp.arange(n) for n in core.shape), indexing="ij"))
    far = jnp.max(jnp.abs(index - peak_index.reshape((d,) + (1,) * d)), axis=0) > RIVAL_SEPARATION
    rivals = jnp.where(local & far, core, -jnp.inf)
    flat2 = jnp.argmax(rivals)
    second = rivals.reshape(-1)[flat2]
    second = jnp.where(jnp.isfinite(second) & ~featureless, second, jnp.nan)
    second_shift = (jnp.stack(jnp.unravel_index(flat2, core.shape)) - max_shift).astype(f.dtype)
    second_shift = jnp.where(jnp.isnan(second), 0, second_shift)
    return start, peak, jnp.eye(d, dtype=f.dtype), featureless, on_edge, jnp.asarray(False), second, second_shift


def _gauss_newton(f, t, mask, start, integer, reach, t_shape):
    """Minimise ``sum(mask * (t - a f(x + reach + s) - b)**2)`` over ``(s, a, b)`` from ``s = start``.

    Returns the shift, its inverse covariance (the inverse of the shift block of
    ``sigma^2 (J^T J)^-1``: the nuisance gain and offset profiled out), whether
    the refinement reached ``MAX_REFINE_STEP`` from ``integer``, and the NCC at the shift.
    """
    d = len(t_shape)
    m = mask
    count = jnp.maximum(m.sum(), 1)
    t_mean = (t * m).sum() / count

    def normal_equations(s):
        g, grad = _resample(f, reach + s, t_shape)
        gm = (g * m).sum() / count
        gc = (g - gm) * m
        a = (gc * t).sum() / jnp.maximum((gc * gc).sum(), 1e-30)
        b = t_mean - a * gm
        r = (t - a * g - b) * m
        columns = jnp.stack([a * gk * m for gk in grad] + [g * m, m]).reshape(d + 2, -1)
        jtj = jnp.matmul(columns, columns.T, precision=HIGHEST)
        return jtj, jnp.matmul(columns, r.reshape(-1), precision=HIGHEST), r

    def ridge(jtj):
        return jtj + 1e-7 * jnp.trace(jtj) * jnp.eye(d + 2, dtype=jtj.dtype)

    def step(_, carry):
        s, _, _ = carry
        jtj, jtr, r = normal_equations(s)
        s = s + _spd_solve(ridge(jtj), jtr)[:d]
        return jnp.clip(s, integer - MAX_REFINE_STEP, integer + MAX_REFINE_STEP), jtj, r

    # the information comes from the last step's normal equations (the step before it is below 1e-3 px)
    empty = (jnp.zeros((d + 2, d + 2), t.dtype), jnp.zeros_like(t))
    s, jtj, r = lax.fori_loop(0, GN_ITERATIONS, step, (start, *empty))
    # the residual variance, floored at 1e-4 of the template's (noise-free synthetic data would weigh infinitely)
    sigma2 = jnp.maximum((r * r).sum() / jnp.maximum(count - d - 2, 1), 1e-4 * (t * t).sum() / count)
    # the shift's information with gain and offset profiled out: the Schur complement of their block
    a = ridge(jtj)
    info = (a[:d, :d] - jnp.matmul(a[:d, d:], _spd_solve(a[d:, d:], a[d:, :d]), precision=HIGHEST)) / sigma2
    failed = jnp.any(jnp.abs(s - integer) >= MAX_REFINE_STEP - 1e-6) | ~jnp.all(jnp.isfinite(s))
    fit = t - r  # a g + b over the mask: its correlation with t is the NCC at s
    fit = (fit - (fit * m).sum() / count) * m
    ncc = (fit * t).sum() / jnp.maximum(jnp.sqrt((fit * fit).sum() * (t * t).sum()), 1e-30)
    return s, info, failed, ncc


@partial(jax.jit, static_argnames=("max_shift", "subpixel", "sigma", "min_fraction"))
def _register_batch(search, template, mask, *, max_shift, subpixel, sigma, min_fraction=MIN_FRACTION):
    kernel = partial(_pair_kernel, max_shift=max_shift, subpixel=subpixel, sigma=sigma, min_fraction=min_fraction)
    return jax.vmap(kernel)(search, template, mask)
