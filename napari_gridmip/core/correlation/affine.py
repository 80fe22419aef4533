"""First-order (affine) subsets: the inverse-compositional Gauss-Newton (IC-GN) of DICe and ncorr.

A translation-only subset assumes the displacement is constant over the subset; under a 3% stretch and a 2
degree rotation a 31-px subset's edges move 0.5 px against its centre, and the translation found carries
0.1 px errors. Here each subset's warp is affine: a reference (img2) pixel at offset ``(eta, zeta)`` from the
subset's centre is found in img1 at::

    eta'  = eta  + v + v_y eta + v_x zeta        (v = dy, v_y = d dy / dy, v_x = d dy / dx)
    zeta' = zeta + u + u_y eta + u_x zeta        (u = dx, ...)

and the six parameters minimise the zero-normalised sum of squared differences (ZNSSD, equivalent to the
ZNCC) between the reference subset and img1 interpolated by cubic B-splines at the warped positions. IC-GN
linearises the criterion about the *reference* subset: its steepest-descent images ``J`` (the reference's
gradient times the warp's Jacobian) and the 6 x 6 Hessian ``J'J`` are computed once per point, and each
iteration only interpolates img1, solves ``H dp = -J' r`` and composes the warp with the inverse of the
increment's. The start is the translation search's position (its Hessian step: IC-GN corrects any sub-pixel
start, and the refinement would cost more than the search), with the gradients of the translation field
across neighbouring points (DICe's and ncorr's neighbour start).

References
----------
B. Pan, K. Li, W. Tong, "Fast, robust and accurate digital image correlation calculation without redundant
computations", Exp. Mech. 53, 1277-1289 (2013) (IC-GN).
J. Blaber, B. Adair, A. Antoniou, "Ncorr: open-source 2D digital image correlation Matlab software", Exp. Mech.
55, 1105-1122 (2015).
D. Z. Turner, "Digital Image Correlation Engine (DICe)", Sandia National Laboratories (2015).
M. Unser, "Splines: a perfect fit for signal and image processing", IEEE Signal Process. Mag. 16(6), 22-38
(1999) (the cubic B-spline; its weights: :func:`napari_gridmip.core._interpolation.bspline_weights`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from napari_gridmip.core._interpolation import bspline_weights
from napari_gridmip.core._peak import int32_indices
from napari_gridmip.core.correlation._bands import join_bands, kept_rows

MAX_ITERATIONS = 30  # IC-GN steps at most (from the translation's start, 3 to 6 are typical)
# px: a point whose increment moves no corner of its subset by more than this has converged, and stops (each
# point on its own, so that a result does not depend on which points share its band)
TOLERANCE = {np.dtype(np.float32): 1e-4, np.dtype(np.float64): 1e-8}
# points x subset pixels x frames interpolated per compiled call (16 taps each): about 270 subsets of 31 x 31. A
# band iterates until its slowest point has converged and its arrays (K, P, S) should stay in the cache: 2**21
# took 1.8x as long at 512^2 (7-8 iterations per band against 5-6); 2**16 pays the per-band dispatch
BAND_VALUES = 2**18
SHAPES = ("translation", "affine")


def _interpolate(coefficients: jax.Array, py: jax.Array, px: jax.Array) -> jax.Array:
    """The spline through ``coefficients`` ``(K, M + 4, N + 4)`` (edge-padded by 2) at image positions
    ``(py, px)`` (any shape, clipped to the image): ``(K, *py.shape)``."""
    k, rows, cols = coefficients.shape
    py = jnp.clip(py, 0, rows - 5)
    px = jnp.clip(px, 0, cols - 5)
    y0, x0 = jnp.floor(py), jnp.floor(px)
    # the weights only (the derivatives are dead code that jit drops)
    wy, wx = bspline_weights(py - y0, jnp)[0], bspline_weights(px - x0, jnp)[0]
    iy = y0.astype(jnp.int32) + 1  # tap -1 of the image sits at padded row y0 + 1
    ix = x0.astype(jnp.int32) + 1
    flat = coefficients.reshape(k, rows * cols)
    out = 0
    for a in range(4):
        row = jnp.zeros((k, *py.shape), coefficients.dtype)
        for b in range(4):
            taps = jnp.take(flat, ((iy + a) * cols + ix + b).ravel(), axis=1).reshape(k, *py.shape)
            row = row + wx[..., b] * taps
        out = out + wy[..., a] * row
    return out


def _compose(p: jax.Array, dp: jax.Array) -> jax.Array:
    """The warp ``W(p) o W(dp)^-1`` as parameters ``(..., 6)`` = ``(v, v_y, v_x, u, u_y, u_x)``."""

    def matrix(q):
        v, vy, vx, u, uy, ux = (q[..., i] for i in range(6))
        one, zero = jnp.ones_like(v), jnp.zeros_like(v)
        return jnp.stack(
            [jnp.stack([1 + vy, vx, v], -1), jnp.stack([uy, 1 + ux, u], -1), jnp.stack([zero, zero, one], -1)], -2
        )

    out = matrix(p) @ jnp.linalg.inv(matrix(dp))
    return jnp.stack([out[..., 0, 2], out[..., 0, 0] - 1, out[..., 0, 1], out[..., 1, 2], out[..., 1, 0],
                      out[..., 1, 1] - 1], -1)  # fmt: skip


@partial(jax.jit, static_argnames=("subset", "band", "prefilter"))
def _band(c1, f_img, fy_img, fx_img, curvature, centres_y, centres_x, initial, row0, *, subset, band, prefilter=0.0):
    """IC-GN for a band of points, the translation grid's rows ``[row0, row0 + band)`` of one batch item:
    ``(dy, dx, zncc, dy_y, dy_x, dx_y, dx_x)``, each ``(1, band, cols)`` (the pieces of :func:`.join_bands`).

    ``c1``: img1's spline coefficients ``(K, M + 4, N + 4)``; ``f_img``, ``fy_img``, ``fx_img``: img2 and its
    spline gradient ``(K, M, N)``; ``curvature``: img2's second derivatives ``(f_yy, f_xy, f_xx)`` (each
    ``(K, M, N)``; None without a prefilter); ``centres_*``: the points' img2 positions ``(P,)`` (integers,
    ``P = band cols``); ``initial``: the warp each of the item's points starts from ``(out rows, cols, 6)``
    (:func:`_initial_warp`: finite ``dy``, ``dx`` where the point is valid); ``prefilter``: the Gaussian's
    standard deviation (px) both images were smoothed by (0: none), whose mismatch under the warp is corrected
    (:func:`_blur_mismatch`).
    """
    out_cols = initial.shape[1]
    start = lax.dynamic_slice(initial, int32_indices(row0, 0, 0), (band, out_cols, 6)).reshape(-1, 6)
    start = start.astype(c1.dtype)  # (P, 6)
    hs, hw = subset[0] // 2, subset[1] // 2
    k, rows, cols = f_img.shape
    eta, zeta = jnp.meshgrid(
        jnp.arange(-hs, hs + 1, dtype=c1.dtype), jnp.arange(-hw, hw + 1, dtype=c1.dtype), indexing="ij"
    )
    eta, zeta = eta.ravel(), zeta.ravel()  # (S,)
    iy = centres_y[:, None] + eta.astype(jnp.int32)[None, :]  # (P, S)
    ix = centres_x[:, None] + zeta.astype(jnp.int32)[None, :]
    index = (iy * cols + ix).ravel()

    def gather(img):
        return jnp.take(img.reshape(k, rows * cols), index, axis=1).reshape(k, *iy.shape)  # (K, P, S)

    f, fy, fx = gather(f_img), gather(fy_img), gather(fx_img)
    curves = None if curvature is None else tuple(gather(c) for c in curvature)
    f = f - f.mean(axis=(0, 2), keepdims=True)
    norm_f = jnp.sqrt(jnp.sum(f * f, axis=(0, 2)))  # (P,)
    e, z = eta[None, None, :], zeta[None, None, :]
    # the steepest-descent images, kept as six (K, P, S) arrays: elementwise products summed over (K, S) beat a
    # batched (P, S, 6) contraction on the CPU by 4x (XLA's dot with a batch of 6-wide matrices is slow)
    jac = (fy, fy * e, fy * z, fx, fx * e, fx * z)
    upper = {(i, j): jnp.sum(jac[i] * jac[j], axis=(0, 2)) for i in range(6) for j in range(i, 6)}
    hessian = jnp.stack([jnp.stack([upper[min(i, j), max(i, j)] for j in range(6)], -1) for i in range(6)], -2)
    ok = jnp.isfinite(start[:, 0]) & jnp.isfinite(start[:, 3]) & (norm_f > 0)
    hessian = jnp.where(ok[:, None, None], hessian, jnp.eye(6, dtype=c1.dtype))
    factor = jax.scipy.linalg.cho_factor(hessian)
    corner = jnp.array([hs, hw], c1.dtype)

    def evaluate(p):
        v, vy, vx, u, uy, ux = (p[:, i : i + 1] for i in range(6))
        py = centres_y[:, None] + eta[None, :] + v + vy * eta[None, :] + vx * zeta[None, :]
        px = centres_x[:, None] + zeta[None, :] + u + uy * eta[None, :] + ux * zeta[None, :]
        g = _interpolate(c1, py, px)
        g = g - g.mean(axis=(0, 2), keepdims=True)
        norm_g = jnp.sqrt(jnp.sum(g * g, axis=(0, 2)))
        return g, norm_g

    tolerance = TOLERANCE[np.dtype(c1.dtype)]

    def reference(p):
        """The reference subset (centred) and its norm, blurred as img1's prefilter blurs it under ``p``."""
        if curves is None:
            return f, norm_f
        fp = f + _blur_mismatch(p, prefilter, curves)
        fp = fp - fp.mean(axis=(0, 2), keepdims=True)
        return fp, jnp.sqrt(jnp.sum(fp * fp, axis=(0, 2)))

    def body(state):
        p, active, count, _ = state
        g, norm_g = evaluate(p)
        fp, norm_fp = reference(p)
        # the ZNCC at this evaluation (ncorr's): at the result for a point that has stopped, and one increment
        # below the tolerance before it for one stopping now; no evaluation after the loop
        zncc = jnp.sum(fp * g, axis=(0, 2)) / (norm_fp * jnp.where(norm_g > 0, norm_g, jnp.inf))
        scale = jnp.where(norm_g > 0, norm_fp / jnp.where(norm_g > 0, norm_g, 1), 0)
        residual = fp - scale[None, :, None] * g  # (K, P, S)
        rhs = jnp.stack([jnp.sum(j * residual, axis=(0, 2)) for j in jac], -1)
        dp = -jax.scipy.linalg.cho_solve(factor, rhs[..., None])[..., 0]
        dp = jnp.where(active[:, None], dp, 0)
        p = jnp.where(active[:, None], _compose(p, dp), p)
        # the increment's largest move of the subset's corners
        move = jnp.abs(dp[:, 0]) + jnp.abs(dp[:, 1]) * corner[0] + jnp.abs(dp[:, 2]) * corner[1]
        move = jnp.maximum(move, jnp.abs(dp[:, 3]) + jnp.abs(dp[:, 4]) * corner[0] + jnp.abs(dp[:, 5]) * corner[1])
        return p, active & (move > tolerance), count + 1, zncc

    def going(state):
        _, active, count, _ = state
        return jnp.any(active) & (count < MAX_ITERATIONS)

    p0 = jnp.where(ok[:, None], jnp.where(jnp.isfinite(start), start, 0), 0)
    p, _, _, zncc = lax.while_loop(going, body, (p0, ok, jnp.int32(0), jnp.zeros_like(norm_f)))
    nan = jnp.array(jnp.nan, c1.dtype)
    p, zncc = jnp.where(ok[:, None], p, nan), jnp.where(ok, zncc, nan)
    v, vy, vx, u, uy, ux = (p[:, i].reshape(1, band, out_cols) for i in range(6))
    return v, u, zncc.reshape(1, band, out_cols), vy, vx, uy, ux


@partial(jax.jit, static_argnames=("coefficients", "step", "curvature"))
def _item_images(x1, x2, dy, dx, item, *, coefficients, step, curvature):
    """Batch item ``item``'s inputs for :func:`_band` (one program: the eager indexing and pads compiled one
    each on a first call): img1's spline coefficients edge-padded by 2, img2's values and its spline's
    gradient, its second derivatives (``curvature``; else None) and the warp each point starts from
    (:func:`_initial_warp`)."""
    one = [lax.dynamic_index_in_dim(x, item, keepdims=False) for x in (x1, x2, dy, dx)]
    c1, c2 = (jnp.pad(coefficients(x), ((0, 0), (2, 2), (2, 2)), mode="edge") for x in one[:2])
    if curvature:
        f_img, fy_img, fx_img, curves = _spline_gradients(c2, curvature=True)
    else:
        (f_img, fy_img, fx_img), curves = _spline_gradients(c2), None
    return c1, f_img, fy_img, fx_img, curves, _initial_warp(one[2], one[3], step=step)


@partial(jax.jit, static_argnames=("step",))
def _initial_warp(dy: jax.Array, dx: jax.Array, *, step: int) -> jax.Array:
    """IC-GN's start at every point ``(rows, cols, 6)``: the translation ``(dy, dx)`` and its gradients across
    the neighbouring points (central differences over ``step`` px, one-sided at the grid's edges; 0 where a
    neighbour is missing or the grid is one point wide)."""

    def slope(a, axis):
        if a.shape[axis] < 2:
            return jnp.zeros_like(a)
        out = jnp.gradient(a, float(step), axis=axis)
        return jnp.where(jnp.isfinite(out), out, 0)

    return jnp.stack([dy, slope(dy, 0), slope(dy, 1), dx, slope(dx, 0), slope(dx, 1)], -1)


def _blur_mismatch(p: jax.Array, sigma: float, curves: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
    """What the reference subset lacks of the blur that img1's prefilter gives it under the warp ``p`` ``(P, 6)``,
    to first order: ``(D_yy f_yy + 2 D_xy f_xy + D_xx f_xx) / 2`` ``(K, P, S)``, ``D = sigma^2 ((F'F)^-1 - I)``.

    Both images are smoothed by a Gaussian of ``sigma`` in their own pixels. Where img1 is img2 warped by ``x' =
    F x + t``, img1's blur, seen on img2's grid, is a Gaussian of covariance ``sigma^2 (F'F)^-1``, not the
    ``sigma^2 I`` img2 got: a translation or a rotation commutes with the filter, a stretch does not, and the
    difference (3% of the blur's variance along a 3% stretch) pulls each point's gradients by up to 3e-4 on a
    noise-free pair. A Gaussian's change with its covariance is half the image's second derivatives (the heat
    equation), so the reference subset blurred as img1 is ``f + (D : grad grad f) / 2``; ``curves`` = ``(f_yy,
    f_xy, f_xx)`` of the prefiltered img2 at the subset's pixels."""
    f_yy, f_xy, f_xx = curves
    a, b = 1 + p[:, 1], p[:, 2]  # F = [[1 + v_y, v_x], [u_y, 1 + u_x]] in (y, x) order
    c, d = p[:, 4], 1 + p[:, 5]
    # (F'F)^-1 = inv([[a^2 + c^2, a b + c d], [a b + c d, b^2 + d^2]])
    m_yy, m_xy, m_xx = a * a + c * c, a * b + c * d, b * b + d * d
    det = m_yy * m_xx - m_xy * m_xy
    d_yy = sigma**2 * (m_xx / det - 1)
    d_xy = sigma**2 * (-m_xy / det)
    d_xx = sigma**2 * (m_yy / det - 1)
    return 0.5 * (d_yy[None, :, None] * f_yy + 2 * d_xy[None, :, None] * f_xy + d_xx[None, :, None] * f_xx)


@partial(jax.jit, static_argnames=("curvature",))
def _spline_gradients(c2: jax.Array, *, curvature: bool = False) -> tuple[jax.Array, ...]:
    """img2's values and its spline's gradient at the knots, from its coefficients ``(K, M + 4, N + 4)``
    (edge-padded by 2): ``B(0) = 4/6, B(+-1) = 1/6``, ``B'(+-1) = -+1/2``; with ``curvature`` also the second
    derivatives ``f_yy, f_xy, f_xx`` (``B''(0) = -2, B''(+-1) = 1``)."""
    centre = c2[:, 1:-1, 1:-1]  # padded by 1 now
    smooth_y = (centre[:, :-2] + 4 * centre[:, 1:-1] + centre[:, 2:]) / 6  # (K, M, N + 2)
    smooth_x = (centre[:, :, :-2] + 4 * centre[:, :, 1:-1] + centre[:, :, 2:]) / 6  # (K, M + 2, N)
    value = (smooth_y[:, :, :-2] + 4 * smooth_y[:, :, 1:-1] + smooth_y[:, :, 2:]) / 6
    grad_y = (smooth_x[:, 2:] - smooth_x[:, :-2]) / 2
    grad_x = (smooth_y[:, :, 2:] - smooth_y[:, :, :-2]) / 2
    if not curvature:
        return value, grad_y, grad_x
    curve_yy = smooth_x[:, :-2] - 2 * smooth_x[:, 1:-1] + smooth_x[:, 2:]
    curve_xx = smooth_y[:, :, :-2] - 2 * smooth_y[:, :, 1:-1] + smooth_y[:, :, 2:]
    slope_x = (centre[:, :, 2:] - centre[:, :, :-2]) / 2  # (K, M + 2, N)
    curve_xy = (slope_x[:, 2:] - slope_x[:, :-2]) / 2
    return value, grad_y, grad_x, (curve_yy, curve_xy, curve_xx)


def affine_plan(out_shape: tuple[int, int], subset: tuple[int, int], frames: int) -> tuple[int, list[int]]:
    """The bands of an IC-GN over an ``out_shape = (rows, cols)`` grid of points, per batch item.

    Parameters
    ----------
    out_shape
        The translation grid's ``(rows, cols)``.
    subset
        The subset ``(sh, sw)``.
    frames
        The frames ``K`` of each stack.

    Returns
    -------
    tuple of int and list of int
        (rows per band, band start rows): each band interpolates at most about ``BAND_VALUES`` values; the
        last band ends flush with the grid (it may overlap the one before).
    """
    out_rows, out_cols = out_shape
    per_row = out_cols * subset[0] * subset[1] * frames
    band = int(max(1, min(out_rows, BAND_VALUES // max(per_row, 1))))
    return band, sorted({min(s, out_rows - band) for s in range(0, out_rows, band)})


def _wait(result: Any) -> None:
    """Wait for a band's result (not for a traced one): progress then means something, and a stop between
    bands stops the work."""
    if not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(result)):
        jax.block_until_ready(result)


def affine_refine(
    x1: jax.Array,
    x2: jax.Array,
    coefficients: Callable[[jax.Array], jax.Array],
    dy: jax.Array,
    dx: jax.Array,
    *,
    window: tuple[int, int],
    subset: tuple[int, int],
    step: int,
    batch: tuple[int, ...] | None = None,
    prefilter: float = 0.0,
    on_band: Callable[[int], None] | None = None,
) -> tuple[jax.Array, ...]:
    """IC-GN from the translation ``(dy, dx)`` ``(B, rows, cols)`` for centred (and prefiltered) stacks ``x1``,
    ``x2`` ``(B, K, M, N)`` (``coefficients``: a frame stack's cubic B-spline coefficients, a jitted function):
    ``(dy, dx, zncc, dy_y, dy_x, dx_y, dx_x)``, each ``(*batch, rows, cols)`` (``batch`` None: ``(B, rows,
    cols)``). The points are the translation grid's: img2's pixel ``(i step + m + hs, j step + n + hw)``.
    ``prefilter``: the standard deviation (px) of the Gaussian both
    stacks were smoothed by (0: none); the reference subsets are then blurred as the warp blurs img1
    (:func:`_blur_mismatch`).

    Runs band by band, item by item (``B`` times the bands of :func:`affine_plan`, one compiled program for
    all, and one to join them: :func:`.join_bands`); ``on_band(done)`` is called before each band with the bands
    done so far, and may raise to stop the refinement between bands.
    """
    items, k = x1.shape[:2]
    (wm, wn), (sh, sw) = window, subset
    out_rows, out_cols = dy.shape[1:]
    grid_y = np.arange(out_rows) * step + wm // 2 + sh // 2
    grid_x = np.arange(out_cols) * step + wn // 2 + sw // 2
    band, starts = affine_plan((out_rows, out_cols), subset, k)
    pieces = []
    for item in range(items):
        c1, f_img, fy_img, fx_img, curvature, initial = _item_images(
            x1, x2, dy, dx, np.int32(item), coefficients=coefficients, step=step, curvature=prefilter > 0
        )
        for done, start in enumerate(starts):
            if on_band is not None:
                on_band(item * len(starts) + done)
            centres = np.meshgrid(grid_y[start : start + band], grid_x, indexing="ij")
            cy, cx = (c.ravel().astype(np.int32) for c in centres)  # NumPy into the program: jnp.asarray compiled one
            pieces.append(
                _band(
                    c1,
                    f_img,
                    fy_img,
                    fx_img,
                    curvature,
                    cy,
                    cx,
                    initial,
                    np.int32(start),
                    subset=subset,
                    band=band,
                    prefilter=float(prefilter),
                )  # fmt: skip
            )
            _wait(pieces[-1])
    return join_bands(pieces, keep=kept_rows(starts, band), batch=batch)


def check_shape(shape: Any) -> str:
    """The ``shape`` option: ``"translation"`` or ``"affine"``."""
    if not isinstance(shape, str):
        raise TypeError(f"shape must be one of {SHAPES}; got {shape!r} ({type(shape).__name__})")
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}; got {shape!r}")
    return shape
