"""DIC of a whole experiment: a reference frame and a sequence of frames, large motion, a region of interest,
and points that say why they were lost.

Each point of a grid on the reference is followed through the frames (DIC's Lagrangian description): its
subset is matched in every frame by the inverse-compositional Gauss-Newton (IC-GN) of a first-order (affine)
warp, the criterion a zero-normalised sum of squared differences over the subset's pixels inside the region of
interest only (masked ZNSSD: a pixel outside the ROI never enters a sum; a subset is *conformal*: whatever of its
window the ROI holds, kept where that carries texture enough). No search window is needed; each
point starts from a guess:

1. the point's own warp in the previous frame, carried over the whole image's motion between the two frames
   (:func:`._global_motion.estimate_motion`: rotation and scale by Fourier-Mellin, translation by the masked
   NCC over every shift), so that a frame may turn by any angle or move by half the image;
2. for a point lost in the previous frame, the affine map fitted to the points found there, carried the same
   way: a point that comes back into view is found again;
3. for a point still not found, the converged warp of a neighbour, carried over the grid step by that
   neighbour's own gradients (ncorr's seed propagation), repeated while it finds new points.

A point's result is kept only if the warp converged, the subset stayed in view, the ZNCC reaches ``min_zncc``
and the point agrees with its found neighbours (each predicts it through its own gradients); otherwise it is
NaN with its :class:`Status`.

The reference of each point (its *key frame*) follows ``reference``: ``"accumulated"`` keeps frame 0 (no drift, but
large strain lowers the match), ``"incremental"`` moves it to every frame the point is found in (any deformation),
``"auto"`` moves it when the ZNCC against the current key falls under ``refresh_zncc``; both match a point against
frame 0 again from what its key found, and keep that where its ZNCC reaches ``refresh_zncc`` (the increments'
errors add up only while frame 0 no longer matches), and try a point its key lost against frame 0. A key frame's
subset is sampled around the point's position there, axis-aligned in that frame, and its pixels are those inside
the ROI carried by the point's own warp; the displacements are composed through the points themselves, with no
interpolation of a field.

A sequence runs as a few compiled programs of its frames' shape and grid, whatever its length: the key
subsets (their values, gradients and the Cholesky factor of their Hessian, :mod:`.warp`'s algebra) are made
once per key frame, so that a frame against frame 0 only interpolates itself; each pass over a frame (its
guesses, then its neighbours' guesses) is one call over the whole grid in which only the points still going
take steps, so that a frame costs about the sum of its points' steps.

References
----------
B. Pan, K. Li, W. Tong, "Fast, robust and accurate digital image correlation calculation without redundant
computations", Exp. Mech. 53, 1277-1289 (2013) (IC-GN).
J. Blaber, B. Adair, A. Antoniou, "Ncorr: open-source 2D digital image correlation Matlab software", Exp. Mech.
55, 1105-1122 (2015) (seeds, propagation, reference updates).
D. Z. Turner, "Digital Image Correlation Engine (DICe)", Sandia National Laboratories (2015) (sequences, status
flags).
J. Westerweel, F. Scarano, "Universal outlier detection for PIV data", Exp. Fluids 39, 1096-1100 (2005).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from scipy import ndimage

from napari_gridmip.core import validate
from napari_gridmip.core.correlation import warp
from napari_gridmip.core.correlation._checks import check_subset
from napari_gridmip.core.correlation._global_motion import estimate_motion
from napari_gridmip.core.correlation.prefilter import DEFAULT_SIGMA, check_prefilter, noise_gain, radius, smooth_frames
from napari_gridmip.core.correlation.status import Status
from napari_gridmip.core.correlation.subsets import _spline_coefficients
from napari_gridmip.core.runtime import sharding, strategy

REFERENCES = ("accumulated", "incremental", "auto")
SHAPES = ("affine", "rigid")
MAX_ITERATIONS = 40  # IC-GN steps at most; from a guess within a few px, 4 to 10 are typical
# px: an increment that moves no corner of the subset by more than this along either axis has converged
# (:func:`.warp.corner_move`; half of 1e-3 px on the sum of both axes' moves)
TOLERANCE = 5e-4
# points of a batch of IC-GN steps (:func:`_bucket`): a sixteenth of the grid, within these bounds
MIN_BUCKET, MAX_BUCKET = 64, 256
# on an accelerator (:func:`.runtime.strategy.spline_windows`) a batch is this many points (or the grid): each step is
# a few launches whatever its size, and its matrix products fill the chip better in large batches
WINDOW_BUCKET = 512
# on an accelerator each point reads one square window of the spline's coefficients (:func:`_windowed_spline`): its
# subset turned by any angle and stretched by this much, plus the spline's 4 taps, rounded up to 8 rows
WINDOW_STRETCH = 1.06
# the first pass of a frame, from the previous frame's field carried by the last frame-to-frame motion: its steps at
# most (from such a guess 2 to 5 are typical; a point still going is retried from its neighbours), and the share of
# the points it tried that it must find for the whole-image estimate to be skipped
PREDICTED_STEPS = 10
PREDICTED_SHARE = 0.8
PROPAGATION_ROUNDS = 8  # neighbour-propagation passes per frame at most (each one reaches one grid step further)
MIN_GLOBAL_SCORE = 0.2  # a whole-image motion whose masked NCC is below this is no guess
MIN_FIT_POINTS = 6  # points found in a frame for an affine fit of the whole field
SPLINE_TAPS = 2  # px: a cubic spline's value at a position reads the coefficients up to 2 px away
# the fewest pixels a (conformal) subset may use: pixels inside the ROI less its edge band, and inside a later key
# frame; whether they are enough is the texture's to say (``max_sigma``), this only keeps the fit overdetermined
MIN_PIXELS = 36
MAX_SIGMA = 0.1  # px: the default ``max_sigma``, the largest predicted standard deviation of a kept point


class Series(NamedTuple):
    """What :func:`correlate_series` returns. ``T`` frames, a grid of ``R`` x ``C`` points on the reference."""

    dy: np.ndarray
    """``(T, R, C)`` float32: each point's row displacement (px) in each frame from its reference position,
    ``frames[t][y + dy, x + dx]`` matches ``frames[0][y, x]``; 0 in frame 0, NaN where ``status`` is not ok."""
    dx: np.ndarray
    """``(T, R, C)`` float32: the column displacement (px)."""
    y: np.ndarray
    """``(R,)`` float64: the reference row of each grid row."""
    x: np.ndarray
    """``(C,)`` float64: the reference column of each grid column."""
    zncc: np.ndarray
    """``(T, R, C)`` float32: the ZNCC of the subset with its key frame at the converged warp (1 in frame 0);
    NaN where the warp was not run or did not converge."""
    sigma_dy: np.ndarray
    """``(T, R, C)`` float32: the predicted standard deviation of ``dy`` (px): the residual's variance times
    the inverse Gauss-Newton Hessian (so it grows with noise and with what the affine warp cannot follow);
    NaN where ``dy`` is."""
    sigma_dx: np.ndarray
    """``(T, R, C)`` float32: the same for ``dx``."""
    status: np.ndarray
    """``(T, R, C)`` uint8: a :class:`Status` per point and frame."""
    dy_y: np.ndarray
    """``(T, R, C)`` float32: ``d dy / dy`` in reference coordinates (the warp's own gradient), NaN as ``dy``."""
    dy_x: np.ndarray
    """``(T, R, C)`` float32: ``d dy / dx``."""
    dx_y: np.ndarray
    """``(T, R, C)`` float32: ``d dx / dy``."""
    dx_x: np.ndarray
    """``(T, R, C)`` float32: ``d dx / dx``."""
    key_frame: np.ndarray
    """``(T, R, C)`` int32: the frame each point was matched against (-1 where it was not run)."""
    motion: np.ndarray
    """``(T, 2, 3)`` float64: the whole-image affine map from the reference to each frame (fitted to the points
    found, else carried by the frame-to-frame estimate; NaN where neither), ``(y, x, 1)`` -> ``(y', x')``."""


# -- the IC-GN kernel ------------------------------------------------------------------------------------------


def _spline(padded: jax.Array, py: jax.Array, px: jax.Array, along: int | None = None) -> jax.Array:
    """The spline through ``padded`` (coefficients extended by 2, ``(M + 4, N + 4)``) at ``(py, px)`` (any shape;
    clipped to the frame): its values, or with ``along`` 0 (1) its derivative along y (x).

    One array per call, and one per program where it is speed that counts: XLA on the CPU fuses the 16 gathers of
    the taps into the loop that computes one array, but gathers them apart for two arrays made from the same
    taps, 20 times slower (the values and both derivatives in one program took 115 ms for 841 subsets of 31 x 31,
    three programs 12 ms)."""
    rows, cols = padded.shape[-2:]
    py = jnp.clip(py, 0, rows - 5)
    px = jnp.clip(px, 0, cols - 5)
    y0, x0 = jnp.floor(py), jnp.floor(px)
    wy = (warp.spline_slopes if along == 0 else warp.spline_weights)(py - y0)
    wx = (warp.spline_slopes if along == 1 else warp.spline_weights)(px - x0)
    base = (y0.astype(jnp.int32) + 1) * cols + x0.astype(jnp.int32) + 1
    flat = padded.ravel()
    value = 0
    for a in range(4):
        row = 0
        for b in range(4):
            row = row + wx[b] * jnp.take(flat, base + (a * cols + b), mode="clip")
        value = value + wy[a] * row
    return value


def _sample(padded: jax.Array, py: jax.Array, px: jax.Array, *, gradient: bool):
    """:func:`_spline`'s values at ``(py, px)``, and with ``gradient`` its derivatives along y and x."""
    if gradient:
        return tuple(_spline(padded, py, px, along) for along in (None, 0, 1))
    return _spline(padded, py, px)


def _window_side(subset: tuple[int, int], frame_shape: tuple[int, int]) -> int:
    """The side of each point's window of coefficients in :func:`_windowed_spline` for ``subset``: its diagonal
    stretched by ``WINDOW_STRETCH`` plus the spline's 4 taps, a multiple of 8; 0 (gathers) on a backend that
    gathers well (:func:`.runtime.strategy.spline_windows`) or where the frame's padded coefficients are smaller
    than a window."""
    if not strategy.spline_windows():
        return 0
    side = int(np.ceil(np.hypot(subset[0] - 1, subset[1] - 1) * WINDOW_STRETCH)) + 4
    side = -(-side // 8) * 8
    return side if side <= min(frame_shape) + 4 else 0


def _cubic_bspline(t: jax.Array, derivative: bool) -> jax.Array:
    """The centred cubic B-spline at ``t`` (or its derivative): 0 from ``|t| >= 2`` on, exactly."""
    a = jnp.abs(t)
    if derivative:
        near, far = (1.5 * a - 2) * t, -jnp.sign(t) * (2 - a) ** 2 / 2
    else:
        near, far = 2 / 3 - a * a + a * a * a / 2, (2 - a) ** 3 / 6
    return jnp.where(a < 1, near, jnp.where(a < 2, far, 0))


def _windowed_spline(padded: jax.Array, py: jax.Array, px: jax.Array, along: int | None = None, *, side: int
                     ) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """:func:`_spline` at ``(py, px)`` ``(B, S)`` (each row one point's pixels) from one ``side`` x ``side`` window of
    the coefficients per point, and whether each point's pixels fit in its window ``(B,)`` (their lower knots at
    most ``side - 4`` rows and columns apart; where not, its values are wrong and the caller takes the gathers).

    The value is ``sum_{r, c} w_y[s, r] window[r, c] w_x[s, c]`` with the B-spline's weights of every window row
    and column (0 beyond its 4 taps): a batched matrix product and a product summed along rows, in full
    precision. An accelerator's way: on a TPU an element gather is its slow path (0.3 GB/s,
    :func:`.runtime.strategy.spline_windows`), where a slice of rows and a matrix product run at its full speed.
    A point with a NaN position is NaN at its NaN pixels, as with the gathers."""
    rows, cols = padded.shape
    lost = jnp.isnan(py) | jnp.isnan(px)
    # clipped as :func:`_spline` clips; a NaN pixel takes no part in its point's window
    qy = jnp.clip(jnp.where(lost, 0, py), 0, rows - 5)
    qx = jnp.clip(jnp.where(lost, 0, px), 0, cols - 5)
    ky, kx = jnp.floor(qy), jnp.floor(qx)
    low_y, low_x = (jnp.min(jnp.where(lost, jnp.inf, k), 1) for k in (ky, kx))
    high_y, high_x = (jnp.max(jnp.where(lost, -jnp.inf, k), 1) for k in (ky, kx))
    served = ((high_y - low_y <= side - 4) & (high_x - low_x <= side - 4)) | jnp.all(lost, 1)
    # the window's first row in the padded coefficients (the frame's row 0 is their row 2): the lowest knot's first
    # tap; past the end it slides back (the taps stay inside)
    top = jnp.clip(jnp.where(jnp.isfinite(low_y), low_y, 0).astype(jnp.int32) + 1, 0, rows - side)
    left = jnp.clip(jnp.where(jnp.isfinite(low_x), low_x, 0).astype(jnp.int32) + 1, 0, cols - side)
    window = jax.vmap(lambda y, x: lax.dynamic_slice(padded, (y, x), (side, side)))(top, left)  # (B, side, side)
    # each window row's frame position (an integer: the positions' differences from it are exact)
    offsets = jnp.arange(side, dtype=py.dtype) - 2
    wy = _cubic_bspline(qy[..., None] - (top[:, None, None] + offsets), along == 0)  # (B, S, side)
    wx = _cubic_bspline(qx[..., None] - (left[:, None, None] + offsets), along == 1)
    along_rows = jnp.einsum("bsr,brc->bsc", wy, window, precision=lax.Precision.HIGHEST)
    return jnp.where(lost, jnp.nan, jnp.sum(along_rows * wx, -1)), served


@partial(jax.jit, static_argnames=("subset", "along", "window"))
def _key_subsets(key: jax.Array, centre: jax.Array, *, subset: tuple[int, int], along: int | None,
                 window: int = 0) -> jax.Array:  # fmt: skip
    """The spline of the key frame ``key`` (or its derivative ``along`` an axis, :func:`_spline`) at the pixels of
    the subsets centred at ``centre`` ``(P, 2)``, axis-aligned: ``(P, S)``. A program per array
    (:func:`_spline`). ``window``: the side of :func:`_windowed_spline`'s windows (an accelerator's way; an
    axis-aligned subset always fits), 0 for the gathers."""
    eta, zeta = warp.subset_offsets(subset, key.dtype)
    points = centre.shape[0]
    bucket = _bucket(points, windows=window > 0)
    if window:
        batches = -(-points // bucket)
        padded = jnp.pad(centre, ((0, batches * bucket - points), (0, 0)))

        def batch(c):
            return _windowed_spline(key, c[:, :1] + eta, c[:, 1:] + zeta, along, side=window)[0]

        return lax.map(batch, padded.reshape(batches, bucket, 2)).reshape(batches * bucket, -1)[:points]

    def one(c):
        return _spline(key, c[0] + eta, c[1] + zeta, along)

    # a batch of points at a time, as the steps take them (:func:`_bucket`: the whole grid at once left the caches)
    return lax.map(one, centre, batch_size=bucket)


class _Reference(NamedTuple):
    """Each point's subset in its key frame, what IC-GN linearises about: computed once per key frame (the
    inverse-compositional scheme's point: the frames matched against a key reuse it), ``(P, ...)``."""

    centre: jax.Array  # (P, 2): the point's position in its key frame
    f: jax.Array  # (P, S): the key subset's values less their mean, 0 outside the used pixels
    fy: jax.Array  # (P, S): its spline's gradient along y, 0 outside
    fx: jax.Array  # (P, S): along x
    used: jax.Array  # (P, S): 1 where the pixel is used (inside the ROI and the key frame), else 0
    count: jax.Array  # (P,): used pixels (at least 7)
    norm: jax.Array  # (P,): the norm of f
    factor: jax.Array  # (P, 21): the Hessian's packed Cholesky factor (warp.cholesky)
    enough: jax.Array  # (P,) bool: the subset may be matched: MIN_PIXELS pixels used, and ``textured``
    textured: jax.Array  # (P,) bool: its texture predicts a sigma within ``max_sigma`` (False: flat or too thin)


def _reference(key, roi, centre, origin, inverse, moved, old, limits, *, subset, shape="affine", window=0,
               whole=False):  # fmt: skip
    """The :class:`_Reference` of the points ``moved`` ``(P,)`` from the key frame ``key`` (its spline coefficients
    as :func:`_prepared_frame` makes them), ``old``'s elsewhere. ``roi`` ``(M, N)`` float (1 inside) on the
    reference; ``centre`` ``(P, 2)``: each point's position in the key frame; ``origin`` ``(P, 2)``: its reference
    position; ``inverse`` ``(P, 2, 2)``: the map of an offset in the key frame back to the reference (the inverse
    of the point's gradient there); ``limits`` ``(3,)`` float32: the fewest pixels used, the variance of a
    residual's pixel (twice the prefiltered frames' noise) and ``max_sigma`` (traced: no program per value). Four
    programs for every key frame of a sequence. ``window``: :func:`_windowed_spline`'s side (0: gathers);
    ``whole``: the ROI holds every pixel (its pixels are not looked up)."""
    centre = jnp.asarray(centre)
    f, fy, fx = (_key_subsets(key, centre, subset=subset, along=along, window=window) for along in (None, 0, 1))
    return _key_reference(key, roi, centre, origin, inverse, moved, old, limits, f, fy, fx, subset=subset, shape=shape,
                          whole=whole)  # fmt: skip


@partial(jax.jit, static_argnames=("subset", "shape", "whole"))
def _key_reference(key, roi, centre, origin, inverse, moved, old, limits, f, fy, fx, *, subset, shape, whole=False):
    """:func:`_reference` from the key subsets' values ``f`` and gradients ``fy``, ``fx`` ``(P, S)``."""
    dtype = key.dtype
    eta, zeta = warp.subset_offsets(subset, dtype)
    key_shape = (key.shape[0] - 4, key.shape[1] - 4)
    ky = centre[:, :1] + eta  # (P, S): the key frame's subset pixels
    kx = centre[:, 1:] + zeta
    in_key = (ky >= 0) & (ky <= key_shape[0] - 1) & (kx >= 0) & (kx <= key_shape[1] - 1)
    # the same pixels on the reference, through the point's inverse gradient: which of them the ROI holds
    ry = origin[:, :1] + inverse[:, 0, :1] * eta + inverse[:, 0, 1:] * zeta
    rx = origin[:, 1:] + inverse[:, 1, :1] * eta + inverse[:, 1, 1:] * zeta
    iy, ix = jnp.round(ry).astype(jnp.int32), jnp.round(rx).astype(jnp.int32)
    on_roi = (iy >= 0) & (iy < roi.shape[0]) & (ix >= 0) & (ix < roi.shape[1])
    at = jnp.clip(iy, 0, roi.shape[0] - 1) * roi.shape[1] + jnp.clip(ix, 0, roi.shape[1] - 1)
    # a ROI of every pixel is not looked up: an element gather of every subset pixel, an accelerator's slow path
    inside = 1 if whole else jnp.take(roi.ravel(), at, mode="clip")
    m = jnp.where(in_key & on_roi, inside, 0).astype(dtype)
    count = jnp.sum(m, axis=1)
    n = jnp.maximum(count, 7)
    fc = (f - jnp.sum(m * f, 1, keepdims=True) / n[:, None]) * m
    fy, fx = fy * m, fx * m
    monomials = warp.moments(eta, zeta)
    h = warp.hessian(fy * fy, fy * fx, fx * fx, monomials)
    factor = warp.cholesky(warp.constrained(h) if shape == "rigid" else h)
    # the conformal subset's own precision: the residual's variance (the noise of both frames) times the inverse
    # Hessian's diagonal of the shifts (what its texture and its shape allow; NaN or huge where it is flat or thin)
    inv_v, inv_u = _shift_variances(factor, shape)
    predicted = jnp.sqrt(limits[1] * jnp.maximum(inv_v, inv_u))
    textured = jnp.isfinite(predicted) & (inv_v > 0) & (inv_u > 0) & (predicted <= limits[2])
    enough = (count >= limits[0]) & textured
    new = _Reference(centre.astype(dtype), fc, fy, fx, m, n, jnp.sqrt(jnp.sum(fc * fc, 1)), factor, enough,
                     textured)  # fmt: skip
    return jax.tree.map(lambda a, b: jnp.where(moved.reshape(-1, *(1,) * (a.ndim - 1)), a, b), new, old)


def _shift_variances(factor: jax.Array, shape: str) -> tuple[jax.Array, jax.Array]:
    """The inverse Hessian's diagonal entries ``(P,)`` of the shifts ``v`` and ``u`` from its packed Cholesky
    factor (:func:`.warp.cholesky`) of the warp ``shape``'s parameters."""
    size, (iv, iu) = (3, warp.RIGID_SHIFTS) if shape == "rigid" else (6, (0, 3))
    unit = jnp.eye(size, dtype=factor.dtype)
    inv_v = warp.cholesky_solve(factor, jnp.broadcast_to(unit[iv], (factor.shape[0], size)))[:, iv]
    inv_u = warp.cholesky_solve(factor, jnp.broadcast_to(unit[iu], (factor.shape[0], size)))[:, iu]
    return inv_v, inv_u


def _no_reference(points: int, subset: tuple[int, int], dtype, shape: str = "affine") -> _Reference:
    """A :class:`_Reference` of ``points`` with nothing in it (the first :func:`_reference`'s ``old``)."""
    s, n = subset[0] * subset[1], (6 if shape == "rigid" else 21)
    zeros = [np.zeros((points, *dims), dtype) for dims in ((2,), (s,), (s,), (s,), (s,), (), (), (n,))]
    return _Reference(*zeros, np.zeros(points, bool), np.zeros(points, bool))


@partial(jax.jit, static_argnames=("subset", "bucket", "shape", "window"))
def _icgn(ref: _Reference, target, start, which, max_steps, *, subset, bucket, shape="affine", window=0):
    """IC-GN of the points ``which`` ``(P,)`` from ``start`` ``(P, 6)`` (the warp ``(v, v_y, v_x, u, u_y, u_x)``
    from each point's key subset, :class:`_Reference`, to the frame; ``target``: the frame's spline coefficients
    ``(M + 4, N + 4)``, as :func:`_prepared_frame` makes them), ``max_steps`` steps at most (a traced int).

    Only the points still going take a step: they are gathered ``bucket`` at a time into a batch of fixed size for
    each step, and scattered back. A frame then costs about the sum of its points' steps, not its slowest point's
    times the grid, and a pass over a few points (a neighbour's guess) costs their own steps: one program, of fixed
    shapes, for every pass of every frame. A point whose guess takes its subset out of the frame
    does not step (from there the warp never came back into view: its steps read the frame's clipped edge until
    the last one allowed). The ZNCC and the residual's variance are those at the warp before the last increment
    (ncorr's, as :mod:`.affine`'s: it moved no corner by more than the tolerance), which spares a pass.

    ``window``: where not 0, a step reads each point's frame values from one window of the coefficients of this
    side (:func:`_windowed_spline`, an accelerator's way), a batch whose points do not all fit in theirs by the
    gathers.

    Returns the warp ``(P, 6)``, the ZNCC, ``sigma`` ``(P, 2)``, whether it converged, whether the warped subset
    lies in the frame at the end and at the start, whether enough of the subset is inside the ROI and the key
    frame, and each point's steps ``(P,)`` int32; only the values of the points ``which`` mean anything.
    """
    hs, hw = subset[0] // 2, subset[1] // 2
    dtype = target.dtype
    points = start.shape[0]
    eta, zeta = warp.subset_offsets(subset, dtype)
    monomials = warp.moments(eta, zeta)
    frame_shape = (target.shape[0] - 4, target.shape[1] - 4)
    corner = (float(max(hs, hw)),) * 2  # the metric's corner: the longer half side on both axes

    def in_view(r, py, px):  # every used pixel within the frame's pixels' own footprint (the spline's edge padding)
        view = (py >= -0.5) & (py <= frame_shape[0] - 0.5) & (px >= -0.5) & (px <= frame_shape[1] - 0.5)
        return jnp.all(view | (r.used == 0), 1)

    def take(tree, at):
        return jax.tree.map(lambda a: jnp.take(a, at, axis=0, mode="clip"), tree)

    def batches(body, todo, carry):
        """``body(at, safe, carry)`` over the points ``todo``, ``bucket`` at a time (``at``: their indices, ``points``
        in an empty slot; ``safe``: the same clipped); returns the carry."""

        def one(state):
            todo, carry = state
            at = jnp.nonzero(todo, size=bucket, fill_value=points)[0]
            return todo.at[at].set(False, mode="drop"), body(at, jnp.minimum(at, points - 1), carry)

        return lax.while_loop(lambda s: jnp.any(s[0]), one, (todo, carry))[1]

    def started(at, safe, view):
        r = take(ref, safe)
        py, px = warp.positions(r.centre[:, 0], r.centre[:, 1], eta, zeta, start[safe])
        return view.at[at].set(in_view(r, py, px), mode="drop")

    def step(r, p, active, steps):
        """One step of the points ``active`` among those of ``r``: the new warps, which go on, their steps, and the
        ZNCC, the residual's variance and whether the subset is in view at ``p``."""
        py, px = warp.positions(r.centre[:, 0], r.centre[:, 1], eta, zeta, p)
        if window:
            windowed, served = _windowed_spline(target, py, px, side=window)
            g = lax.cond(jnp.all(served | ~active), lambda: windowed, lambda: _spline(target, py, px))
        else:
            g = _sample(target, py, px, gradient=False)
        gc = (g - jnp.sum(r.used * g, 1, keepdims=True) / r.count[:, None]) * r.used
        dg = jnp.sqrt(jnp.sum(gc * gc, 1))
        scale = r.norm / jnp.where(dg > 0, dg, 1)
        res = r.f - scale[:, None] * gc
        b = warp.steepest_descent(r.fy * res, r.fx * res, monomials)
        if shape == "rigid":  # the increment along the rigid directions, mapped back exactly (warp.rigid_warp)
            dp = warp.rigid_warp(-warp.cholesky_solve(r.factor, warp.rigid_rhs(b)))
        else:
            dp = -warp.cholesky_solve(r.factor, b)
        new = warp.compose_inverse(p, dp)
        good = jnp.all(jnp.isfinite(new), 1) & (dg > 0)
        zncc = jnp.sum(r.f * gc, 1) / (r.norm * jnp.where(dg > 0, dg, jnp.nan))
        variance = jnp.sum(res * res, 1) / jnp.maximum(r.count - 6, 1)
        p = jnp.where((active & good)[:, None], new, p)
        going = active & good & (warp.corner_move(dp, corner) > TOLERANCE)
        return p, going, steps + active, zncc, variance, in_view(r, py, px)

    def running(state):  # a point still going that has steps left (one at the limit stays active: not converged)
        _, active, steps, *_ = state
        return active & (steps < max_steps)

    def some(state):
        at = jnp.nonzero(running(state), size=bucket, fill_value=points)[0]  # points: an empty slot
        safe = jnp.minimum(at, points - 1)
        new = step(take(ref, safe), state[0][safe], at < points, state[2][safe])
        return tuple(a.at[at].set(b, mode="drop") for a, b in zip(state, new))

    start = start.astype(dtype)
    if shape == "rigid":  # a guess from an affine field (a neighbour's, the whole image's): its rotation
        start = warp.to_rigid(start)
    started_in_view = batches(started, which, jnp.zeros(points, bool))
    live = which & ref.enough & jnp.all(jnp.isfinite(start), 1) & jnp.all(jnp.isfinite(ref.factor), 1)
    live = live & started_in_view
    nan = jnp.full(points, jnp.nan, dtype)
    state = (start, live, jnp.zeros(points, jnp.int32), nan, nan, started_in_view)  # a point not run keeps its start
    p, active, steps, zncc, variance, view = lax.while_loop(lambda s: jnp.any(running(s)), some, state)
    # the covariance's diagonal of v and u: variance times (H^-1)_00 and (H^-1)_33
    inv_v, inv_u = _shift_variances(ref.factor, shape)
    sigma = jnp.sqrt(jnp.stack([variance * inv_v, variance * inv_u], -1))
    converged = live & ~active & jnp.all(jnp.isfinite(p), 1) & jnp.isfinite(zncc)
    return p, zncc, sigma, converged, view, started_in_view, ref.enough, steps


@partial(jax.jit, static_argnames=("sigma",))
def _prepared_frame(frame: jax.Array, *, sigma: float) -> jax.Array:
    """The spline coefficients of a frame, after the prefilter, extended by 2 px each side ``(M + 4, N + 4)``: those
    of the frame edge-padded by 2 (so that the spline still interpolates the border pixels; padding the
    coefficients instead misses the corner pixel by 3 grey levels). One program per frame shape."""
    smoothed = smooth_frames(frame[None], sigma=sigma) if sigma > 0 else frame[None]
    return _spline_coefficients(jnp.pad(smoothed[0], 2, mode="edge"))


# -- the host side: guesses, statuses, the frames' loop ---------------------------------------------------------


class _Points(NamedTuple):
    """Every grid point's state after a frame, flat ``(P, ...)``, float64."""

    position: np.ndarray  # (P, 2) in the frame
    gradient: np.ndarray  # (P, 2, 2): d position / d reference position
    found: np.ndarray  # (P,) bool


def _bucket(points: int, *, windows: bool = False) -> int:
    """The batch of points of :func:`_icgn` that take a step together: a sixteenth of the grid, from ``MIN_BUCKET``
    to ``MAX_BUCKET`` (the grid's size fixes it, so one program serves every pass of every frame). Small enough for
    a step's arrays to stay in the CPU's caches: the 512^2 grid of 3721 subsets of 31 x 31 took 75 to 80 ms in
    batches of 117 to 466 points, 190 to 240 ms where all of them stepped together until a quarter were left."""
    if windows:  # an accelerator: large batches (WINDOW_BUCKET)
        return int(min(points, WINDOW_BUCKET))
    return int(min(points, max(MIN_BUCKET, min(MAX_BUCKET, -(-points // 16)))))


def _local_start(guess_position, guess_gradient, key_position, key_gradient) -> np.ndarray:
    """The IC-GN start ``(P, 6)`` in a key frame's local coordinates for a guess of the point's position and
    gradient in the frame."""
    v, u = (guess_position - key_position).T
    local = np.matmul(guess_gradient, np.linalg.inv(key_gradient)) - np.eye(2)  # host NumPy, float64
    return np.stack([v, local[:, 0, 0], local[:, 0, 1], u, local[:, 1, 0], local[:, 1, 1]], -1)


def _affine_fit(origin: np.ndarray, position: np.ndarray) -> np.ndarray | None:
    """The least-squares ``(2, 3)`` affine map ``origin`` -> ``position`` (``(n, 2)`` each), None if too few."""
    if len(origin) < MIN_FIT_POINTS:
        return None
    design = np.concatenate([origin, np.ones((len(origin), 1))], 1)
    solution, *_ = np.linalg.lstsq(design, position, rcond=None)
    return solution.T


def _carried(step_map: np.ndarray, state: _Points) -> tuple[np.ndarray, np.ndarray]:
    """The guesses ``(position (P, 2), gradient (P, 2, 2))`` of the points found in the previous frame, carried by
    the ``(2, 3)`` map from that frame to this one (NaN for the others)."""
    carried = np.einsum("ij,pj->pi", step_map[:, :2], state.position) + step_map[:, 2]
    return np.where(state.found[:, None], carried, np.nan), np.einsum("ij,pjk->pik", step_map[:, :2], state.gradient)


def _inverse_affine(matrix: np.ndarray) -> np.ndarray:
    """The inverse of a ``(2, 3)`` map."""
    linear = np.linalg.inv(matrix[:, :2])
    return np.concatenate([linear, -np.matmul(linear, matrix[:, 2])[:, None]], 1)


def _compose_affine(outer: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """``outer o inner`` of two ``(2, 3)`` maps."""
    linear, shift = np.matmul(outer[:, :2], inner[:, :2]), np.matmul(outer[:, :2], inner[:, 2]) + outer[:, 2]
    return np.concatenate([linear, shift[:, None]], 1)


def _neighbour_guesses(grid: tuple[int, int], origin, position, gradient, found, zncc):
    """For every point, the guess carried from its best found 8-neighbour (highest ZNCC) through that
    neighbour's gradient: ``(position (P, 2), gradient (P, 2, 2), has (P,))``."""
    points = grid[0] * grid[1]
    best = np.full(points, -np.inf)
    out_position = np.full((points, 2), np.nan)
    out_gradient = np.full((points, 2, 2), np.nan)
    score = np.where(found, np.nan_to_num(zncc, nan=-1.0), -np.inf)
    for here, there in _neighbour_pairs(grid):
        better = score[there] > best[here]
        h, t = here[better], there[better]
        best[h] = score[t]
        out_position[h] = position[t] + np.einsum("pij,pj->pi", gradient[t], origin[h] - origin[t])
        out_gradient[h] = gradient[t]
    return out_position, out_gradient, np.isfinite(best)


def _neighbour_pairs(grid: tuple[int, int]):
    """For each of the 8 directions, the flat indices ``(here, there)`` of every grid point with a neighbour that
    way and of that neighbour."""
    rows, cols = grid
    index = np.arange(rows * cols).reshape(rows, cols)
    for dr in (-1, 0, 1):
        for dc in (-1, 0, 1):
            if dr == dc == 0:
                continue
            here = index[max(0, -dr) : rows - max(0, dr), max(0, -dc) : cols - max(0, dc)].ravel()
            there = index[max(0, dr) : rows - max(0, -dr), max(0, dc) : cols - max(0, -dc)].ravel()
            yield here, there


def _disagreement(grid, origin, position, gradient, found) -> np.ndarray:
    """Each found point's median distance (px) from the positions its found 8-neighbours predict for it through
    their own gradients; NaN with fewer than 3 found neighbours."""
    points = grid[0] * grid[1]
    distances = np.full((8, points), np.nan)
    for k, (here, there) in enumerate(_neighbour_pairs(grid)):
        both = found[here] & found[there]
        h, t = here[both], there[both]
        predicted = position[t] + np.einsum("pij,pj->pi", gradient[t], origin[h] - origin[t])
        distances[k, h] = np.linalg.norm(position[h] - predicted, axis=1)
    enough = np.sum(np.isfinite(distances), 0) >= 3
    median = np.full(points, np.nan)
    median[enough] = np.nanmedian(distances[:, enough], 0)
    return median


def _check_frames(frames: Any) -> tuple[Any, tuple[int, int, int]]:
    frames = validate.as_array("frames", frames)
    validate.check_real("frames", frames)
    shape = validate.check_ndim("frames", frames, ndim=3)
    validate.check_nonempty("frames", shape)
    return frames, shape


def _check_roi(roi: Any, shape: tuple[int, int]) -> np.ndarray:
    if roi is None:
        return np.ones(shape, np.float32)
    roi = np.asarray(roi)
    if roi.shape != shape:
        raise ValueError(f"roi must be a mask of the reference's shape {shape}; got shape {roi.shape}")
    if roi.dtype != bool and not np.issubdtype(roi.dtype, np.integer):
        raise TypeError(f"roi must be a bool (or integer label) mask; got dtype {roi.dtype}")
    return (roi != 0).astype(np.float32)


def _unit_interval(name: str, value: Any) -> float:
    value = validate.check_finite_scalar(name, value)
    if not 0 <= value <= 1:
        raise ValueError(f"{name} must be in [0, 1]; got {value}")
    return value


def correlate_series(
    frames: Any,
    *,
    subset: int | tuple[int, int] = 31,
    step: int = 8,
    roi: Any = None,
    reference: str = "accumulated",
    shape: str = "affine",
    min_zncc: float = 0.9,
    refresh_zncc: float = 0.95,
    min_inside: float = 0.0,
    max_sigma: float = MAX_SIGMA,
    max_disagreement: float = 1.0,
    prefilter: float | str | None = "auto",
    rotation: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> Series:
    """Follow a grid of reference points through a sequence of frames (DIC of a whole experiment).

    Parameters
    ----------
    frames
        ``(T, M, N)``, any real dtype; NumPy, dask or Zarr (read one frame at a time). Frame 0 is the reference.
        Non-finite pixels are not allowed.
    subset
        The subset's odd sizes ``(sh, sw)`` (one number for both); default 31.
    step
        The grid's spacing in px; default 8. The grid's first point is ``(sh // 2, sw // 2)`` from the corner, so
        every reference subset is inside the frame.
    roi
        ``(M, N)`` bool (or integer labels, nonzero inside) mask of the reference: the region of interest.
        Subsets are conformal (DICe's): a point's subset is the pixels of its window inside the ROI, less a band
        along the ROI's edge as wide as the prefilter's and the spline's reach (``round(4 sigma) + 2`` px, 5 px
        by default), so that no value from outside enters a match; every sum of the match (the masked ZNCC's
        means and norms, the gradients' Hessian, the right-hand side) runs over those pixels only. A point whose
        centre is outside, with less than ``min_inside`` of its window inside the ROI, or with fewer than
        ``MIN_PIXELS`` (36) pixels left, is ``outside_roi``; one whose clipped subset has too little texture for
        ``max_sigma`` is ``not_significant``. Separate parts (labels) are followed apart, down to small ones
        (a 20 x 20 px part at subset 21) where their texture allows. Default: the whole frame.
    reference
        ``"accumulated"`` (default): every frame is matched against frame 0, each started from the previous
        frame's field. ``"incremental"``: each point against the last frame it was found in, its position and
        its warp's full affine part (the gradient) composed point by point (the key subset is sampled around the
        point's position there, its pixels those of the ROI carried by its warp), then matched against frame 0
        from there and kept on frame 0 where that ZNCC reaches ``refresh_zncc``, so that the increments' errors
        add up only while frame 0 no longer matches. ``"auto"``: a point's reference moves to the current frame
        when its ZNCC against the old one falls under ``refresh_zncc``, and back to frame 0 where frame 0
        matches it that well again; a point its key loses is tried against frame 0 (from its found neighbours'
        guess), so that it keeps every point ``"accumulated"`` would.
    shape
        The subset's warp: ``"affine"`` (default; first order, 6 parameters) or ``"rigid"`` (translation and
        rotation, 3 parameters: for parts that move rigidly, fewer parameters to fit and so less noise, and no
        strain to fit where there is none), both by the same IC-GN (:mod:`.warp`'s rigid warp: the affine
        Hessian projected on the rigid directions, each increment an exact rotation). The gradients then
        hold the rotation's: ``dy_y = dx_x = cos - 1``, ``dx_y = -dy_x = sin``.
    min_zncc
        The least ZNCC of a kept match; default 0.9.
    refresh_zncc
        The ZNCC with a point's key frame under which ``"auto"`` moves the key to the current frame, and the
        ZNCC with frame 0 at which ``"incremental"`` and ``"auto"`` take frame 0's match instead of the key's;
        default 0.95 (1: never back to frame 0, the increments alone).
    min_inside
        The least share of a point's square window inside the ROI; default 0 (the texture decides,
        ``max_sigma``).
    max_sigma
        px: the largest predicted standard deviation of a kept point's displacement, from its clipped key subset
        alone: ``sqrt(2 s^2 max((H^-1)_vv, (H^-1)_uu))`` with ``H`` the Gauss-Newton Hessian of its pixels'
        gradients and ``s`` the reference's noise after the prefilter (Immerkaer's estimate inside the ROI, at
        least the integer frames' rounding). It says whether a clipped subset carries texture enough (a flat or
        too thin one predicts a large sigma, or none); default 0.1.
    max_disagreement
        px: a found point farther than this from where its found neighbours put it (the median of their
        predictions, each through its own gradient; 3 neighbours at least) is ``ambiguous``; default 1.
    prefilter
        The Gaussian both frames are smoothed by before the match, as in
        :func:`~napari_gridmip.find_displacement`: ``"auto"`` (0.8 px, the default), None, or a standard
        deviation in px.
    rotation
        Look for a whole-image rotation and scale between frames (Fourier-Mellin); False: translation only.
    progress
        Called as ``progress(done, total)`` after each frame; it may raise to stop the run.

    Returns
    -------
    Series
        ``dy``, ``dx``, ``zncc``, ``sigma_dy``, ``sigma_dx``, ``dy_y``, ``dy_x``, ``dx_y``, ``dx_x`` ``(T, R, C)``
        float32 (NaN where ``status`` is not ok), ``status`` ``(T, R, C)`` uint8, ``key_frame`` ``(T, R, C)``
        int32, ``y`` ``(R,)`` and ``x`` ``(C,)`` float64 (the grid in reference pixels) and ``motion``
        ``(T, 2, 3)``.

    Raises
    ------
    ValueError
        If ``frames`` is not 3D or empty, ``roi`` has another shape, the subset does not fit the frames, or an
        option is out of its range.
    TypeError
        If ``frames`` is not real, or ``roi`` not a mask.

    References
    ----------
    B. Pan, K. Li, W. Tong, Exp. Mech. 53, 1277-1289 (2013); J. Blaber, B. Adair, A. Antoniou, Exp. Mech. 55,
    1105-1122 (2015); D. Z. Turner, DICe (2015), and DICe's conformal subsets (D. Z. Turner et al., Sandia
    Report SAND2015-10606); D. Padfield, IEEE Trans. Image Process. 21, 2706-2718 (2012); J. Immerkaer, "Fast
    noise variance estimation", Comput. Vis. Image Underst. 64, 300-302 (1996).
    """
    place = strategy.on_host() if strategy.series_on_host() else contextlib.nullcontext()
    with place:
        return _correlate_series(frames, subset=subset, step=step, roi=roi, reference=reference, shape=shape,
                                 min_zncc=min_zncc,
                                 refresh_zncc=refresh_zncc, min_inside=min_inside, max_sigma=max_sigma,
                                 max_disagreement=max_disagreement, prefilter=prefilter, rotation=rotation,
                                 progress=progress)  # fmt: skip


def _correlate_series(frames, *, subset, step, roi, reference, shape, min_zncc, refresh_zncc, min_inside, max_sigma,
                      max_disagreement, prefilter, rotation, progress) -> Series:  # fmt: skip
    frames, (count, rows, cols) = _check_frames(frames)
    subset = validate.int_tuple("subset", subset, 2)
    subset, step = check_subset(subset, step)
    if subset[0] > rows or subset[1] > cols:
        raise ValueError(f"subset {subset} is larger than the frames' (M, N) = ({rows}, {cols})")
    reference = validate.check_choice("reference", reference, REFERENCES)
    shape = validate.check_choice("shape", shape, SHAPES)
    mask = _check_roi(roi, (rows, cols))
    min_zncc = _unit_interval("min_zncc", min_zncc)
    refresh_zncc = _unit_interval("refresh_zncc", refresh_zncc)
    min_inside = _unit_interval("min_inside", min_inside)
    max_sigma = validate.check_finite_scalar("max_sigma", max_sigma)
    if max_sigma <= 0:
        raise ValueError(f"max_sigma must be positive (px); got {max_sigma}")
    max_disagreement = validate.check_finite_scalar("max_disagreement", max_disagreement)
    if max_disagreement <= 0:
        raise ValueError(f"max_disagreement must be positive (px); got {max_disagreement}")
    sigma = check_prefilter(prefilter, default=DEFAULT_SIGMA)
    rotation = validate.check_bool("rotation", rotation)

    # the pixels a subset may use: the ROI less the reach of the prefilter and of the spline's taps around its
    # edge, so that no value outside the ROI enters a match (the frame's own border is no edge: it is edge-padded)
    reach = radius(sigma) + SPLINE_TAPS
    usable_mask = ndimage.binary_erosion(mask > 0, iterations=reach, border_value=1) if roi is not None else mask > 0
    weights = usable_mask.astype(np.float32)
    hs, hw = subset[0] // 2, subset[1] // 2
    grid_y = np.arange(hs, rows - hs, step, dtype=np.float64)
    grid_x = np.arange(hw, cols - hw, step, dtype=np.float64)
    grid = (len(grid_y), len(grid_x))
    origin = np.stack(np.meshgrid(grid_y, grid_x, indexing="ij"), -1).reshape(-1, 2)
    points = len(origin)

    def read(t: int) -> np.ndarray:
        frame = np.asarray(frames[t])
        if frame.dtype.kind == "f" and not np.all(np.isfinite(frame)):
            raise ValueError(f"frames[{t}] has non-finite pixels; fill them (and leave them out with roi)")
        return frame

    def coefficients(frame: np.ndarray) -> jax.Array:
        return _prepared_frame(np.asarray(frame, np.float32), sigma=sigma)

    shape3 = (count, *grid)
    out = {name: np.full(shape3, np.nan, np.float32) for name in
           ("dy", "dx", "zncc", "sigma_dy", "sigma_dx", "dy_y", "dy_x", "dx_y", "dx_x")}  # fmt: skip
    status = np.zeros(shape3, np.uint8)
    key_frame = np.full(shape3, -1, np.int32)
    motion = np.zeros((count, 2, 3))
    motion[0] = np.eye(2, 3)

    # conformal subsets: a point whose centre is in the ROI uses its window's pixels inside the (trimmed) ROI, and
    # is kept where they carry texture enough for ``max_sigma`` (DICe's conformal subsets), whatever their share
    in_roi = mask[origin[:, 0].astype(int), origin[:, 1].astype(int)] > 0
    in_roi &= _inside_share(mask, origin, subset) >= min_inside
    previous = read(0)
    noise_variance = 2 * _noise(previous, usable_mask) ** 2 * noise_gain(sigma)  # the residual's, both frames'
    limits = np.array([MIN_PIXELS, noise_variance, max_sigma], np.float32)
    roi_device = jnp.asarray(weights)
    whole_roi = bool(weights.all())  # no ROI, or one of every pixel
    window = _window_side(subset, (rows, cols))
    # every point's key subset (frame 0 to start with), computed once per key frame
    spread = _Spread(points)
    ref = spread.reference(coefficients(previous), roi_device, origin.astype(np.float32), origin.astype(np.float32),
                           np.broadcast_to(np.eye(2, dtype=np.float32), (points, 2, 2)), np.ones(points, bool),
                           _no_reference(spread.padded, subset, np.float32, shape), limits, subset=subset,
                           shape=shape, window=window, whole=whole_roi)  # fmt: skip
    ref0 = ref  # frame 0's key subsets: the policies other than "accumulated" match against them again
    enough, textured, used = (np.asarray(a)[:points] for a in (ref.enough, ref.textured, ref.count))
    usable = in_roi & enough
    flat = {name: out[name].reshape(count, -1) for name in out}
    flat_status = status.reshape(count, -1)
    flat_key = key_frame.reshape(count, -1)
    # why a point is never matched: its subset is (mostly) outside the ROI, or what is inside it is flat
    unused = np.where(in_roi & (used >= MIN_PIXELS) & ~textured, Status.not_significant, Status.outside_roi)
    flat_status[:, ~usable] = unused[~usable]
    for name in ("dy", "dx", "dy_y", "dy_x", "dx_y", "dx_x", "sigma_dy", "sigma_dx"):
        flat[name][0, usable] = 0.0
    flat["zncc"][0, usable] = 1.0
    flat_key[0, usable] = 0

    # each point's key frame: its index, position and gradient there
    key_index = np.zeros(points, np.int64)
    key_position, key_gradient = origin.copy(), np.broadcast_to(np.eye(2), (points, 2, 2)).copy()
    state = _Points(origin.copy(), key_gradient.copy(), usable.copy())
    whole = np.eye(2, 3)  # reference -> previous frame (the last one in which points were found)
    pace = np.eye(2, 3)  # previous frame -> the frame: the motion between the two frames before
    if progress is not None:
        progress(1, count)
    for t in range(1, count):
        current = read(t)
        target = coefficients(current)
        result = _Frame(points)
        # first the points found in the previous frame, each from its warp there carried by the last frame-to-frame
        # motion: in a smooth sequence that finds them, and the whole-image estimate is not needed
        tried = usable & state.found
        guess_position, guess_gradient = _carried(pace, state)
        _run(tried, guess_position, guess_gradient, result, key_position, key_gradient, ref, target, subset, min_zncc,
             max_steps=PREDICTED_STEPS, shape=shape, spread=spread)  # fmt: skip
        accepted = result.accepted(min_zncc)
        position, _ = result.positions(key_position, key_gradient)
        fitted = _affine_fit(origin[accepted], position[accepted])
        if fitted is not None and accepted.sum() >= PREDICTED_SHARE * tried.sum():
            trusted, whole_guess = True, fitted
            lost = usable & ~state.found
            guess_position[lost] = np.matmul(origin[lost], fitted[:, :2].T) + fitted[:, 2]
            guess_gradient[lost] = fitted[:, :2]
            has_guess = tried | lost
            _run(lost, guess_position, guess_gradient, result, key_position, key_gradient, ref, target, subset,
                 min_zncc, shape=shape, spread=spread)  # fmt: skip
        else:  # a jump: every point from the whole-image motion between the two frames
            estimate = estimate_motion(previous, current, rotation=rotation)
            trusted = estimate.score >= MIN_GLOBAL_SCORE
            step_map = estimate.matrix if trusted else np.eye(2, 3)
            guess_position, guess_gradient = _carried(step_map, state)
            whole_guess = _compose_affine(step_map, whole)
            lost = ~state.found
            guess_position[lost] = np.matmul(origin[lost], whole_guess[:, :2].T) + whole_guess[:, 2]
            guess_gradient[lost] = whole_guess[:, :2]
            has_guess = usable & np.all(np.isfinite(guess_position), 1)
            if not trusted:
                has_guess &= state.found  # a lost point's only guess was the whole-image motion
            result.forget(~accepted)  # what the carried guess did not find is the estimate's to say
            _run(has_guess & ~accepted, guess_position, guess_gradient, result, key_position, key_gradient, ref, target,
                 subset, min_zncc, shape=shape, spread=spread)  # fmt: skip
            has_guess |= tried
        accepted = result.accepted(min_zncc)
        for _ in range(PROPAGATION_ROUNDS):
            position, gradient = result.positions(key_position, key_gradient)
            nb_position, nb_gradient, has = _neighbour_guesses(grid, origin, position, gradient, accepted,
                                                               result.zncc)  # fmt: skip
            retry = usable & ~accepted & has & ~result.tried_from_neighbours & ~result.out_of_view_only()
            if not retry.any():
                break
            result.tried_from_neighbours |= retry
            _run(retry, nb_position, nb_gradient, result, key_position, key_gradient, ref, target, subset, min_zncc,
                 shape=shape, spread=spread)  # fmt: skip
            has_guess |= retry
            accepted = result.accepted(min_zncc)

        # this frame's key of each point: its key frame's, or frame 0's where the pass below matched it there
        frame_index, frame_position, frame_gradient = key_index.copy(), key_position.copy(), key_gradient.copy()
        on_reference = np.zeros(points, bool)
        if reference != "accumulated":
            on_reference = _back_to_reference(result, accepted, usable & (key_index != 0), state, pace, grid, origin,
                                              key_position, key_gradient, ref0, target, subset, min_zncc, refresh_zncc,
                                              shape, spread)  # fmt: skip
            frame_index[on_reference], frame_position[on_reference] = 0, origin[on_reference]
            frame_gradient[on_reference] = np.eye(2)
            accepted = result.accepted(min_zncc)
        position, gradient = result.positions(frame_position, frame_gradient)
        disagreement = _disagreement(grid, origin, position, gradient, accepted)
        ambiguous = accepted & (disagreement > max_disagreement)
        found = accepted & ~ambiguous

        codes = np.full(points, Status.not_significant, np.uint8)
        codes[~has_guess] = Status.no_guess
        codes[result.ran & ~result.in_view] = Status.out_of_view
        codes[result.ran & result.in_view & ~result.enough] = Status.outside_roi
        codes[result.ran & result.in_view & ~result.enough & ~result.textured] = Status.not_significant
        codes[ambiguous] = Status.ambiguous
        codes[found] = Status.ok
        codes[~usable] = unused[~usable]
        flat_status[t] = codes
        flat_key[t] = np.where(result.ran, frame_index, -1)
        displacement = position - origin
        jacobian = gradient - np.eye(2)
        values = {
            "dy": displacement[:, 0], "dx": displacement[:, 1], "zncc": result.zncc,
            "sigma_dy": result.sigma[:, 0], "sigma_dx": result.sigma[:, 1],
            "dy_y": jacobian[:, 0, 0], "dy_x": jacobian[:, 0, 1], "dx_y": jacobian[:, 1, 0], "dx_x": jacobian[:, 1, 1],
        }  # fmt: skip
        for name, value in values.items():
            flat[name][t] = np.where(found, value, np.nan)
        flat["zncc"][t] = np.where(result.ran & result.converged, result.zncc, np.nan)

        fitted = _affine_fit(origin[found], position[found])
        motion[t] = fitted if fitted is not None else (whole_guess if trusted else np.nan)
        if found.any():  # the next frame starts from this one; a frame where nothing was found is passed over
            now = motion[t] if fitted is not None else whole_guess
            pace = _compose_affine(now, _inverse_affine(whole))  # the last frame-to-frame motion
            whole = now
            state = _Points(np.where(found[:, None], position, np.nan),
                            np.where(found[:, None, None], gradient, np.nan), found)  # fmt: skip
            previous = current
        # key frames for the next frame
        if reference != "accumulated":
            # a point that frame 0 matched again well enough goes back to it ("auto": no error added for it)
            back = found & on_reference & (key_index != 0) & (reference == "auto")
            if back.any():
                key_index[back], key_position[back], key_gradient[back] = 0, origin[back], np.eye(2)
                ref = _chosen(spread.pad(back), ref0, ref)
            move = found & ((reference == "incremental") | (result.zncc < refresh_zncc))
            if move.any():
                key_index[move] = t
                key_position[move] = position[move]
                key_gradient[move] = gradient[move]
                ref = spread.reference(target, roi_device, key_position.astype(np.float32),
                                       origin.astype(np.float32), np.linalg.inv(key_gradient).astype(np.float32),
                                       move, ref, limits, subset=subset, shape=shape, window=window,
                                       whole=whole_roi)  # fmt: skip
        if progress is not None:
            progress(t + 1, count)
    return Series(y=grid_y, x=grid_x, status=status, key_frame=key_frame, motion=motion, **out)


@jax.jit
def _chosen(which, new: _Reference, old: _Reference) -> _Reference:
    """``new``'s key subsets for the points ``which`` ``(P,)``, ``old``'s elsewhere."""
    return jax.tree.map(lambda a, b: jnp.where(which.reshape(-1, *(1,) * (a.ndim - 1)), a, b), new, old)


def _back_to_reference(result: _Frame, accepted, keyed, state: _Points, pace, grid, origin, key_position, key_gradient,
                       ref0: _Reference, target, subset, min_zncc, refresh_zncc, shape, spread: _Spread
                       ) -> np.ndarray:  # fmt: skip
    """The points ``keyed`` (whose key frame is not frame 0) matched against frame 0 too, in one pass: a found one
    from its found warp, kept where its ZNCC with frame 0 reaches ``refresh_zncc`` (so that the increments'
    errors do not add up while frame 0 still matches: Pan et al.'s reference update the other way round); a lost
    one from its found neighbours' or its carried guess, kept where it is a match (a point the accumulated policy
    keeps is not lost to a later key). ``result`` is overwritten where frame 0 is kept; returns those points."""
    points = len(origin)
    identity = np.broadcast_to(np.eye(2), (points, 2, 2))
    position, gradient = result.positions(key_position, key_gradient)
    found = accepted & keyed
    lost = keyed & ~accepted
    guess_position, guess_gradient = (
        np.where(found[:, None], position, np.nan),
        np.where(found[:, None, None], gradient, np.nan),
    )
    if lost.any():
        nb_position, nb_gradient, has = _neighbour_guesses(grid, origin, position, gradient, accepted, result.zncc)
        carried_position, carried_gradient = _carried(pace, state)
        use = lost & has
        guess_position[use], guess_gradient[use] = nb_position[use], nb_gradient[use]
        use = lost & ~has
        guess_position[use], guess_gradient[use] = carried_position[use], carried_gradient[use]
    which = (found | lost) & np.all(np.isfinite(guess_position), 1)
    if not which.any():
        return np.zeros(points, bool)
    back = _Frame(points)
    _run(which, guess_position, guess_gradient, back, origin, identity, ref0, target, subset, min_zncc, shape=shape,
         spread=spread)  # fmt: skip
    good = back.accepted(min_zncc)
    take = which & good & (lost | (np.nan_to_num(back.zncc) >= refresh_zncc))
    for name in ("warp", "zncc", "sigma", "converged", "in_view", "enough", "textured", "ran"):
        getattr(result, name)[take] = getattr(back, name)[take]
    return take


def _noise(frame: np.ndarray, inside: np.ndarray) -> float:
    """The standard deviation of the frame's noise inside ``inside`` (Immerkaer's Laplacian-difference estimate),
    at least a thousandth of its intensities' spread and half a grey level's rounding for integer frames (a
    noise-free frame would otherwise call any texture enough)."""
    frame = np.asarray(frame, np.float64)
    kernel = np.array([[1, -2, 1], [-2, 4, -2], [1, -2, 1]], np.float64)
    response = np.abs(ndimage.convolve(frame, kernel, mode="nearest"))
    where = ndimage.binary_erosion(inside, iterations=1, border_value=0) if inside.any() else inside
    values = frame[inside] if inside.any() else frame.ravel()
    estimate = np.sqrt(np.pi / 2) / 6 * float(np.mean(response[where])) if where.any() else 0.0
    spread = float(np.percentile(values, 99) - np.percentile(values, 1)) if values.size else 0.0
    floor = max(1e-3 * spread, 0.5 / np.sqrt(3) if np.issubdtype(np.asarray(frame).dtype, np.integer) else 0.0)
    return max(estimate, floor, np.finfo(np.float32).tiny)


def _inside_share(mask: np.ndarray, origin: np.ndarray, subset: tuple[int, int]) -> np.ndarray:
    """The share of each reference subset's pixels inside the ROI (box sums of the mask)."""
    hs, hw = subset[0] // 2, subset[1] // 2
    table = np.pad(np.cumsum(np.cumsum(mask, 0, dtype=np.float64), 1), ((1, 0), (1, 0)))
    y, x = origin[:, 0].astype(int), origin[:, 1].astype(int)
    total = (
        table[y + hs + 1, x + hw + 1] - table[y - hs, x + hw + 1] - table[y + hs + 1, x - hw] + table[y - hs, x - hw]
    )
    return total / (subset[0] * subset[1])


class _Frame:
    """One frame's IC-GN results for every point, filled by passes over some of them."""

    def __init__(self, points: int):
        self.warp = np.full((points, 6), np.nan)
        self.zncc = np.full(points, np.nan)
        self.sigma = np.full((points, 2), np.nan)
        self.converged = np.zeros(points, bool)
        self.in_view = np.ones(points, bool)
        self.enough = np.ones(points, bool)
        self.textured = np.ones(points, bool)
        self.ran = np.zeros(points, bool)
        self.tried_from_neighbours = np.zeros(points, bool)

    def forget(self, which: np.ndarray) -> None:
        """Drop the results of the points ``which``: a later pass's stand whatever their scores."""
        fresh = _Frame(int(which.sum()))
        for name, value in vars(fresh).items():
            getattr(self, name)[which] = value

    def accepted(self, min_zncc: float) -> np.ndarray:
        return self.ran & self.converged & self.in_view & self.enough & (np.nan_to_num(self.zncc) >= min_zncc)

    def out_of_view_only(self) -> np.ndarray:
        """Points whose last try converged but left the frame: a neighbour's guess will not bring them back."""
        return self.ran & self.converged & ~self.in_view

    def positions(self, key_position, key_gradient) -> tuple[np.ndarray, np.ndarray]:
        """Each point's position ``(P, 2)`` and gradient ``(P, 2, 2)`` in the frame, from its warp."""
        w = self.warp
        position = key_position + w[:, (0, 3)]
        local = np.stack([np.stack([1 + w[:, 1], w[:, 2]], -1), np.stack([w[:, 4], 1 + w[:, 5]], -1)], 1)
        return position, np.matmul(local, key_gradient)


class _Spread:
    """The grid's points over the local devices of the call's platform (:func:`.runtime.sharding.band_devices`):
    each device holds an equal part of every point's key subset and runs its own points' IC-GN (its own batches,
    its own loop), as one program over all of them (``jax.shard_map``); on one device, the programs themselves.
    The device arrays are padded to a multiple of the devices' count (points that never run); what comes back
    to the host is cut to the grid's ``points``."""

    def __init__(self, points: int):
        self.devices = sharding.band_devices()
        self.points = points
        self.padded = -(-points // len(self.devices)) * len(self.devices)

    def pad(self, array: np.ndarray) -> np.ndarray:
        """``array`` ``(points, ...)`` padded along its first axis to the devices' share (zeros, False)."""
        array = np.asarray(array)
        return np.pad(array, [(0, self.padded - self.points)] + [(0, 0)] * (array.ndim - 1))

    def reference(self, key, roi, centre, origin, inverse, moved, old, limits, **static) -> _Reference:
        """:func:`_reference` of the grid (``old`` already padded)."""
        centre, origin, inverse, moved = (self.pad(a) for a in (centre, origin, inverse, moved))
        if len(self.devices) == 1:
            return _reference(key, roi, centre, origin, inverse, moved, old, limits, **static)
        grid = sharding.mesh(self.devices)
        program = _spread_program("reference", grid, tuple(sorted(static.items())))
        # the first key frame's ``old`` (host arrays) placed as a later one's (the program's own output): one program
        old = jax.device_put(old, sharding.split(grid, axis=0))
        return program(key, roi, centre, origin, inverse, moved, old, limits)

    def icgn(self, ref, target, start, which, max_steps, *, window: int, **static) -> tuple[np.ndarray, ...]:
        """:func:`_icgn` of the grid's points ``which``, its outputs on the host, ``(points, ...)`` each."""
        start, which = self.pad(start), self.pad(which)
        bucket = _bucket(self.padded // len(self.devices), windows=window > 0)
        static = dict(static, bucket=bucket, window=window)
        if len(self.devices) == 1:
            out = _icgn(ref, target, start, which, max_steps, **static)
        else:
            program = _spread_program("icgn", sharding.mesh(self.devices), tuple(sorted(static.items())))
            out = program(ref, target, start, which, max_steps)
        return tuple(a[: self.points] for a in jax.device_get(out))


@functools.lru_cache(maxsize=16)
def _spread_program(kind: str, grid: Any, static: tuple[tuple[str, Any], ...]) -> Callable[..., Any]:
    """:func:`_reference` (``kind`` ``"reference"``) or :func:`_icgn` (``"icgn"``) over the devices of ``grid``:
    each device its part of the points' arrays, the frame and the options whole; the outputs joined along the
    points. Each device's loop runs on its own (no collective inside), so the answers are one device's."""
    options = dict(static)
    part, whole = sharding.split(grid, axis=0).spec, sharding.split(grid, axis=None).spec
    if kind == "reference":
        specs = (whole, whole, part, part, part, part, part, whole)

        def body(*args):
            return _reference(*args, **options)
    else:
        specs = (part, whole, part, part, whole)

        def body(*args):
            return _icgn(*args, **options)

    return jax.jit(jax.shard_map(body, mesh=grid, in_specs=specs, out_specs=part, check_vma=False))


def _run(which, guess_position, guess_gradient, result: _Frame, key_position, key_gradient, reference: _Reference,
         target, subset, min_zncc, *, max_steps: int = MAX_ITERATIONS, shape: str = "affine",
         spread: _Spread) -> None:  # fmt: skip
    """IC-GN of the points ``which`` from their guesses (one call of the grid's program, whatever their number);
    the results written into ``result`` where they are better than what it holds (a first try, or a higher
    ZNCC)."""
    chosen = np.flatnonzero(which)
    if not len(chosen):
        return
    with np.errstate(invalid="ignore"):
        start = _local_start(guess_position, guess_gradient, key_position, key_gradient)
    window = _window_side(subset, (target.shape[0] - 4, target.shape[1] - 4))
    out = spread.icgn(reference, target, start.astype(np.float32), np.asarray(which), np.int32(max_steps),
                      subset=subset, shape=shape, window=window)  # fmt: skip
    p, zncc, sigma, converged, in_view, started_in_view, enough, _ = (a[chosen] for a in out)
    p, zncc = np.asarray(p, np.float64), np.asarray(zncc, np.float64)
    # out of view: where the guess put it, or where a match good enough to keep put it (a warp that wandered off
    # from a guess in view found nothing: not significant)
    leaves = ~started_in_view | (~in_view & converged & (np.nan_to_num(zncc) >= min_zncc))
    in_view = in_view | ~leaves
    score = np.where(converged & in_view, np.nan_to_num(zncc, nan=-2.0), -3.0)
    old = np.where(result.converged[chosen] & result.in_view[chosen], np.nan_to_num(result.zncc[chosen], nan=-2),
                   np.where(result.ran[chosen], -3.0, -4.0))  # fmt: skip
    better = score > old
    where = chosen[better]
    result.warp[where] = p[better]
    result.zncc[where] = zncc[better]
    result.sigma[where] = sigma[better]
    result.converged[where] = converged[better]
    result.in_view[where] = in_view[better]
    result.enough[where] = enough[better]
    result.textured[where] = np.asarray(reference.textured)[where]
    result.ran[where] = True
