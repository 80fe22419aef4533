"""The subsets' sub-pixel step: img1 interpolated between its 5 x 5 integer offsets, the correlation of the
interpolated vector with img2's and its derivatives in closed form, the Newton step towards its maximum, and
the displacement's uncertainty from its curvature.

The sweep (:mod:`.subsets`) hands each output pixel the sums over its 5 x 5 tap block (img1's cross sums with
img2's vector, img1's box sums and the Gram matrix of img1's tap vectors, :class:`TapSums`); everything here is
a function of those sums and the position, with no subset loop. The weights are
:mod:`napari_gridmip.core.interpolation`'s (Keys' cubic convolution on img1, or the cubic B-spline on its
coefficients). A leaf below :mod:`.subsets`: of the correlation package it imports only :mod:`._normalised` (the
quotient rule of ``r = N / sqrt(S)``, shared with :mod:`.refine`).

References
----------
R. Keys, "Cubic convolution interpolation for digital image processing", IEEE Trans. Acoust., Speech, Signal
Process. 29(6), 1153-1160 (1981).
M. Unser, "Splines: a perfect fit for signal and image processing", IEEE Signal Process. Mag. 16(6), 22-38
(1999).
B. Pan, H. Xie, Z. Wang, "Equivalence of digital image correlation criteria for pattern matching",
Appl. Opt. 49(28), 5501-5509 (2010).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from napari_gridmip.core.correlation._normalised import normalised_derivatives
from napari_gridmip.core.interpolation import bspline_weights, keys_weights

MAX_STEP = 0.5  # px per Newton step
UPHILL_STEP = 0.1  # px: the step along an axis where the correlation is not concave (towards its gradient)
GRAM_ROWS = 5  # the Gram block: offsets (0..4, -4..4) of img1 against itself
GRAM_COLS = 9


def five_taps(position: jax.Array, centre: jax.Array, kind: str) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Interpolation weights (and derivatives) of ``position`` on the 5 taps ``centre - 2 .. centre + 2``
    (one of the two outer taps gets 0); ``position`` lies within 1 of ``centre``. Three ``(Ns, 5)`` arrays."""
    floor = jnp.clip(jnp.floor(position), centre - 1, centre)
    shift = (floor - centre + 1).astype(jnp.int32)  # 0: taps 0..3 of the five, 1: taps 1..4
    out = []
    for w in (bspline_weights if kind == "bspline" else keys_weights)(position - floor, jnp):
        zero = jnp.zeros_like(w[..., :1])
        low, high = jnp.concatenate([w, zero], -1), jnp.concatenate([zero, w], -1)
        out.append(jnp.where((shift == 0)[..., None], low, high))
    return tuple(out)


def _gram_index() -> np.ndarray:
    """Where each entry of the 25 x 25 Gram matrix of a 5 x 5 tap block sits in the gathered ``(5, 5, 5, 9)``
    block of planes (tap row, tap column, row offset, column offset + 4): flat indices ``(625,)``."""
    index = np.zeros((25, 25), np.int64)
    for p, q, p2, q2 in np.ndindex(5, 5, 5, 5):
        dp, dq = p2 - p, q2 - q
        if dp > 0 or (dp == 0 and dq >= 0):
            at = (p, q, dp, dq + 4)
        else:
            at = (p2, q2, -dp, -dq + 4)
        index[p * 5 + q, p2 * 5 + q2] = np.ravel_multi_index(at, (5, 5, GRAM_ROWS, GRAM_COLS))
    return index.ravel()


GRAM_INDEX = _gram_index()


class Interpolated(NamedTuple):
    r: jax.Array  # correlation at the position
    g: tuple[jax.Array, jax.Array]  # its gradient (y, x)
    h: tuple[jax.Array, jax.Array, jax.Array]  # its Hessian (yy, xx, xy)
    sums: tuple[
        jax.Array, jax.Array, jax.Array
    ]  # sum of the interpolated vector, of its square, of its product with img2's


class TapSums(NamedTuple):
    """What the interpolated correlation needs at a pixel's 5 x 5 taps, independent of the position."""

    cross: jax.Array  # (Ns, 25) raw cross sums with img2's vector
    mean: jax.Array  # (Ns, 25) img1's box sums
    gram: jax.Array  # (Ns, 25, 25) Gram matrix of img1's tap vectors
    centred: jax.Array  # cross - mean * sum2 / count
    gram_c: jax.Array  # gram - mean mean' / count
    inv2: jax.Array  # img2's inverse norm
    sum2: jax.Array  # img2's box sum
    count: int  # values per vector


def tap_sums(cross, mean, gram, inv2, sum2, count) -> TapSums:
    centred = cross - mean * (sum2 / count)[:, None]
    gram_c = gram - mean[:, :, None] * mean[:, None, :] / count
    return TapSums(cross, mean, gram, centred, gram_c, inv2, sum2, count)


def interpolated(taps: TapSums, py, px, a0, b0, *, sums: bool, kind: str) -> Interpolated:
    """The correlation of img1's interpolated vector at ``(py, px)`` with img2's, and its derivatives.

    With ``w`` the 25 tap weights (around ``(a0, b0)``), ``N = w . centred`` and ``S = w' gram_c w``:
    ``r = N / sqrt(S) * inv2``. ``sums``: also the sums the model's fit needs (else zeros). ``kind``: ``"bspline"``
    (the taps are img1's spline coefficients) or ``"keys"`` (img1 itself).
    """
    wy, wy1, wy2 = five_taps(py, a0, kind)
    wx, wx1, wx2 = five_taps(px, b0, kind)

    def outer(u, v):
        return (u[:, :, None] * v[:, None, :]).reshape(u.shape[0], 25)

    w, w_y, w_x = outer(wy, wx), outer(wy1, wx), outer(wy, wx1)
    w_yy, w_xx, w_xy = outer(wy2, wx), outer(wy, wx2), outer(wy1, wx1)
    centred, inv2 = taps.centred, taps.inv2

    def dot(u, v):
        return jnp.sum(u * v, axis=-1)

    def mv(u, matrix=taps.gram_c):
        return jnp.einsum("jab,jb->ja", matrix, u, precision=lax.Precision.HIGHEST)

    g, g_y, g_x = mv(w), mv(w_y), mv(w_x)
    n, n_y, n_x = dot(w, centred), dot(w_y, centred), dot(w_x, centred)
    n_yy, n_xx, n_xy = dot(w_yy, centred), dot(w_xx, centred), dot(w_xy, centred)
    s = dot(w, g)
    if sums:  # w' gram w = w' gram_c w + (w . mean)^2 / count: no second product with the raw Gram matrix
        sum_r = dot(w, taps.mean)
        fit = (sum_r, s + sum_r * sum_r / taps.count, dot(w, taps.cross))
    s_y, s_x = 2 * dot(w_y, g), 2 * dot(w_x, g)
    s_yy = 2 * (dot(w_yy, g) + dot(w_y, g_y))
    s_xx = 2 * (dot(w_xx, g) + dot(w_x, g_x))
    s_xy = 2 * (dot(w_xy, g) + dot(w_x, g_y))
    ratio = normalised_derivatives((n, n_y, n_x, n_yy, n_xx, n_xy), (s, s_y, s_x, s_yy, s_xx, s_xy))
    r, (gy, gx), (hyy, hxx, hxy) = (ratio.r * inv2, tuple(a * inv2 for a in ratio.g), tuple(a * inv2 for a in ratio.h))
    if not sums:
        fit = (jnp.zeros_like(r),) * 3
    return Interpolated(r, (gy, gx), (hyy, hxx, hxy), fit)


def nothing(like: jax.Array) -> Interpolated:
    """An :class:`Interpolated` of zeros shaped like ``like`` (a loop's initial carry)."""
    zero = jnp.zeros_like(like)
    return Interpolated(zero, (zero, zero), (zero, zero, zero), (zero, zero, zero))


def newton_step(f: Interpolated, search: tuple[bool, bool]) -> tuple[jax.Array, jax.Array]:
    """A Newton step towards the maximum; an axis whose window is 1 wide does not move. Where the 2D
    quadratic is not concave, each axis takes its own 1D Newton step if it is concave there, else a step of
    ``UPHILL_STEP`` along its gradient (a Newton step there would go downhill, none would stall)."""
    gy, gx = f.g
    hyy, hxx, hxy = f.h
    zero = jnp.zeros_like(gy)
    concave_y, concave_x = hyy < 0, hxx < 0
    step_y = jnp.where(concave_y, -gy / jnp.where(concave_y, hyy, -1), UPHILL_STEP * jnp.sign(gy))
    step_x = jnp.where(concave_x, -gx / jnp.where(concave_x, hxx, -1), UPHILL_STEP * jnp.sign(gx))
    if search[0] and search[1]:
        det = hyy * hxx - hxy * hxy
        both = (det > 0) & concave_y
        safe = jnp.where(both, det, 1)
        step_y = jnp.where(both, -(hxx * gy - hxy * gx) / safe, step_y)
        step_x = jnp.where(both, -(hyy * gx - hxy * gy) / safe, step_x)
    if not search[0]:
        step_y = zero
    if not search[1]:
        step_x = zero
    finite = jnp.isfinite(step_y) & jnp.isfinite(step_x)
    return (
        jnp.where(finite, jnp.clip(step_y, -MAX_STEP, MAX_STEP), zero),
        jnp.where(finite, jnp.clip(step_x, -MAX_STEP, MAX_STEP), zero),
    )


def uncertainty(
    f: Interpolated, count: int, search: tuple[bool, bool], noise_gain: float = 1.0
) -> tuple[jax.Array, jax.Array]:
    """Standard deviations of the displacement (px): ``sqrt(2 (1 - r) / (n - 4) / g * inv(-H))`` on the diagonal.

    For a vector ``s + e`` matched to ``s' + e'`` (white noise of the same level in both), the normalised
    difference ``eta`` has per-value variance ``sigma^2 = 2 (1 - r) / (n - 4)`` (``1 - r = |eta_perp|^2 / 2``
    spread over the ``n - 4`` directions left by centring, scaling and the two shifts), and the least-squares
    shift has covariance ``sigma^2 inv(J'J)`` with ``J'J = -H``, the Hessian of ``r`` at the peak.

    A Gaussian prefilter leaves ``g = noise_gain`` of the noise's variance, which is what ``1 - r`` then
    measures, but correlates it over its reach, and the shift (a sum over the smooth gradients ``J``) averages
    the correlated noise no better than the unfiltered: its variance follows ``sigma^2 / g``. That holds where
    ``J`` varies slowly over the filter's reach; on speckle of 4-5 px it errs on the large side, by at most
    1.25 at 0.5% to 3% noise (``benchmarks/bench_dic.py``, uncertainty column).
    """
    hyy, hxx, hxy = f.h
    noise = 2 * jnp.maximum(1 - f.r, 0) / max(count - 4, 1) / noise_gain
    nan = jnp.full_like(hyy, jnp.nan)
    if search[0] and search[1]:
        det = hyy * hxx - hxy * hxy
        ok = (det > 0) & (hyy < 0)
        safe = jnp.where(ok, det, 1)
        var_y, var_x = jnp.where(ok, -hxx / safe, nan), jnp.where(ok, -hyy / safe, nan)
    else:
        var_y = jnp.where(hyy < 0, -1 / jnp.where(hyy < 0, hyy, -1), nan) if search[0] else nan
        var_x = jnp.where(hxx < 0, -1 / jnp.where(hxx < 0, hxx, -1), nan) if search[1] else nan
    if count <= 4:
        return nan, nan
    return jnp.sqrt(noise * var_y), jnp.sqrt(noise * var_x)
