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
across neighbouring points (DICe's and ncorr's neighbour start); from the second row of points on, a point
whose neighbour above converged starts from that one's warp instead, carried down by its gradients (ncorr's
seed propagation, row by row). Each point stops on its own: after the steps every point of a row takes, the
points still going are gathered into small batches of a fixed size, so that a row costs the sum of its
points' iterations, not its slowest point's times the row (static shapes, one program).
The warp algebra (the composition, the Hessian and its Cholesky solve, the convergence test) is
:mod:`.warp`'s, shared with the sequence's IC-GN (:mod:`.series`).

References
----------
B. Pan, K. Li, W. Tong, "Fast, robust and accurate digital image correlation calculation without redundant
computations", Exp. Mech. 53, 1277-1289 (2013) (IC-GN).
J. Blaber, B. Adair, A. Antoniou, "Ncorr: open-source 2D digital image correlation Matlab software", Exp. Mech.
55, 1105-1122 (2015).
D. Z. Turner, "Digital Image Correlation Engine (DICe)", Sandia National Laboratories (2015).
M. Unser, "Splines: a perfect fit for signal and image processing", IEEE Signal Process. Mag. 16(6), 22-38
(1999) (the cubic B-spline; its weights: :func:`napari_gridmip.core.interpolation.bspline_weights`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from napari_gridmip.core.correlation import warp
from napari_gridmip.core.correlation._bands import compile_ahead_once, join_bands, kept_rows
from napari_gridmip.core.runtime import strategy
from napari_gridmip.core.runtime.executables import kept
from napari_gridmip.core.runtime.sharding import wait_for

MAX_ITERATIONS = 30  # IC-GN steps at most (from the translation's start, 3 to 6 are typical)
# px: a point whose increment moves no corner of its subset by more than this has converged, and stops (each
# point on its own, so that a result does not depend on which points share its band)
TOLERANCE = {np.dtype(np.float32): 1e-4, np.dtype(np.float64): 1e-8}
# points x subset pixels x frames per compiled call: about 1100 subsets of 31 x 31. Its rows run one after the
# other, each row's arrays (K, P, S) in the cache; at 1024^2 (subset 31, step 4) bands of 2**20 took 0.88x the
# time of 2**18 or 2**21 (fewer calls and waits, and progress still every 4 rows)
BAND_VALUES = 2**20
# the same where a band's rows run together (core._backend.ic_gn_rows_together): each band is a launch and its
# slowest point's steps, so few and large ones (about 8 at 1024^2, subset 31, step 4)
TOGETHER_BAND_VALUES = 2**23
FULL_ITERATIONS = 3  # steps every point of a row takes together (from the search's start, 3 was the mode)
# then the points still going take each step in batches of this share of the row (1/16 and 1/4: the same time)
BUCKET = 0.125
# a point starts from the converged warp of the point above it (carried down by its gradients) where that one's ZNCC
# is at least this and it agrees with the point's own start (the translation search's) within this many px
PROPAGATE_ZNCC = 0.9
PROPAGATE_PX = 1.0
SHAPES = ("translation", "affine")


def _interpolate(coefficients: jax.Array, py: jax.Array, px: jax.Array) -> jax.Array:
    """The spline through ``coefficients`` ``(K, M + 4, N + 4)`` (edge-padded by 2) at image positions
    ``(py, px)`` (any shape, clipped to the image): ``(K, *py.shape)``."""
    k, rows, cols = coefficients.shape
    py = jnp.clip(py, 0, rows - 5)
    px = jnp.clip(px, 0, cols - 5)
    y0, x0 = jnp.floor(py), jnp.floor(px)
    # the weights as separate arrays, and one flat index plus a constant per tap: 20% faster than the
    # stacked weights of bspline_weights and an index per tap (XLA on the CPU)
    wy, wx = warp.spline_weights(py - y0), warp.spline_weights(px - x0)
    base = (
        (y0.astype(jnp.int32) + 1) * cols + x0.astype(jnp.int32) + 1
    ).ravel()  # tap (-1, -1): padded (y0 + 1, x0 + 1)
    flat = coefficients.reshape(k, rows * cols)
    out = 0
    for a in range(4):
        row = 0
        for b in range(4):
            taps = jnp.take(flat, base + (a * cols + b), axis=1, mode="clip").reshape(k, *py.shape)
            row = row + wx[b] * taps
        out = out + wy[a] * row
    return out


# taps per axis beyond the spline's 4 on each side that a subset's warped pixels may spread over in
# :func:`_interpolate_windows`: their lower knots may lie up to ``2 SPLINE_MARGIN`` rows (columns) apart beyond
# the subset's own extent, a gradient part of the warp up to about 2 / (subset - 1) (6.7% at subset 31)
SPLINE_MARGIN = 2
# with the windows (a TPU), read the reference subsets of a band's grid of points by rows and columns
# (:func:`_grid_subsets`) rather than one window per point; TILE_WINDOWS implies it. Alone it took a band of the
# 1024^2 affine DIC on a TPU v5e from 0.180 to 0.072 s, the tiles too to 0.037 s
# (a profile of the band program; docs/accelerator.md)
GRID_SUBSETS = False
# with the windows, pick each step's windows out of tiles of img1's coefficients read once per band by rows and
# columns (:func:`_tile_windows`), reaching the translation search's reach plus TILE_SLACK px past a point's grid
# position (a point that goes further takes the gathers' band); the reference subsets then by the grid too. On:
# the 1024^2 affine DIC 0.315 s warm on a TPU v5e against 1.44 s without, its host CPU 1.92 s
# (benchmarks/bench_accelerator.py --cases dic_affine)
TILE_WINDOWS = True
TILE_SLACK = 2
# compile the IC-GN's programs in a thread beside the translation search's (compile_ahead): None, where the
# backend decides (:func:`.core._backend.ic_gn_compile_ahead`: not on the CPU); True or False forces it
COMPILE_AHEAD: bool | None = None


def _subset_windows(img: jax.Array, top: jax.Array, left: jax.Array, subset: tuple[int, int]) -> jax.Array:
    """The ``subset`` ``(sh, sw)`` window of ``img`` ``(K, M, N)`` from ``(top, left)`` ``(n,)`` (int32, inside the
    image) of each point: ``(K, n, sh sw)``, rows first. One slice per point: an accelerator reads rows of pixels
    where a gather of each pixel is its slow path (:func:`.core._backend.spline_windows`)."""
    k = img.shape[0]
    # the frame index typed as the others (a Python 0 is int64 with 64-bit types on)
    one = jax.vmap(lambda y, x: lax.dynamic_slice(img, (jnp.zeros_like(y), y, x), (k, *subset)), out_axes=1)
    return one(top, left).reshape(k, top.shape[0], subset[0] * subset[1])


def _grid_subsets(images: tuple[jax.Array, ...], top: jax.Array, left: jax.Array, subset: tuple[int, int], *,
                  grid: tuple[int, int, int]) -> tuple[jax.Array, ...]:  # fmt: skip
    """:func:`_subset_windows` of each of ``images`` (each ``(K, M, N)``, the same shape) for the points of a grid,
    ``grid = (rows, cols, step)``: ``rows`` x ``cols`` points (rows first) ``step`` px apart, the first one's
    subset from ``(top, left)`` (int32 scalars; every subset in the image): each ``(K, rows cols, sh sw)``.

    One slice of the grid's region of each image, the regions read together; then each axis unfolded by
    blocks: the region's rows cut into blocks of ``step``, and ``ceil(sh / step)`` slices of ``rows`` blocks,
    one per block a subset's rows span (row ``a`` of point row ``r`` is block ``r + a // step``, phase
    ``a % step``); the columns the same. No read per point, where XLA on a TPU makes a loop of one slice per point
    of :func:`_subset_windows` (8,610 points, about 2 us each; 61% of a band of the 1024^2 affine DIC in a
    profile of the band program). Why blocks and one read for all
    images: with a slice per subset row and column (62 at subset 31) for each of 6 images, the TPU v5e compiled the
    band program in 33 s against 11 s for the windows' form (the same profile)."""
    k = images[0].shape[0]
    (sh, sw), (rows, cols, step) = subset, grid
    height, width = (rows - 1) * step + sh, (cols - 1) * step + sw
    corner = (jnp.zeros_like(top), top, left)
    region = jnp.concatenate([lax.dynamic_slice(img, corner, (k, height, width)) for img in images])
    n = region.shape[0]
    by_rows, by_cols = -(-sh // step), -(-sw // step)  # the blocks a subset's rows (columns) span
    region = jnp.pad(region, ((0, 0), (0, (rows - 1 + by_rows) * step - height),
                              (0, (cols - 1 + by_cols) * step - width)))  # fmt: skip
    blocks = region.reshape(n, rows - 1 + by_rows, step, -1)
    out = jnp.stack([blocks[:, q : q + rows] for q in range(by_rows)], 2)  # (n, rows, by_rows, step, W)
    out = out.reshape(n, rows, by_rows * step, -1)[:, :, :sh]  # (n, rows, sh, W)
    blocks = out.reshape(n, rows, sh, cols - 1 + by_cols, step)
    out = jnp.stack([blocks[:, :, :, q : q + cols] for q in range(by_cols)], 4)  # (n, rows, sh, cols, by, step)
    out = out.reshape(n, rows, sh, cols, by_cols * step)[..., :sw]  # (n, rows, sh, cols, sw)
    out = out.transpose(0, 1, 3, 2, 4).reshape(n, rows * cols, sh * sw)
    return tuple(out[i * k : (i + 1) * k] for i in range(len(images)))


def _interpolate_windows(coefficients: jax.Array, py: jax.Array, px: jax.Array, *, subset: tuple[int, int],
                         tiles: tuple[jax.Array, jax.Array, jax.Array] | None = None,
                         active: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """:func:`_interpolate`'s values where ``py``, ``px`` ``(n, sh sw)`` are each point's subset pixels warped
    (rows first), read from one window of the coefficients per point instead of 16 gathers a pixel, and which
    points they serve ``(n,)``: all of them, or none.

    Each point's window spans its pixels' lower knots plus the spline's taps and ``2 SPLINE_MARGIN`` more rows
    and columns; each pixel's taps are then the window's slices at 4 of ``2 SPLINE_MARGIN + 4`` static offsets
    per axis, each weighted by the spline's weight there, the others masked out (a selected zero: a value
    that is not one of the pixel's taps, NaN included, adds nothing). The sum is :func:`_interpolate`'s, term
    by term in its order. The coefficients are padded by ``2 SPLINE_MARGIN`` past their end for the windows
    (never a tap). Where a point's pixels spread further (a warp's gradient part over about ``2 SPLINE_MARGIN
    / (subset - 1)``) or its window starts before the image (:func:`_windows_fit`), the call serves no point
    (zeros), and the IC-GN takes its band's gathers for the points it did not serve (:func:`affine_refine`).
    Where the subset's window is larger than the image, the gathers give every value. A point with a NaN
    position is NaN at every pixel (the gathers: at its NaN pixels; only a diverged warp has one) and does
    not count.

    Why a ``lax.cond`` whose other branch is zeros: on a TPU v5e the 1024^2 affine DIC's band program compiled in 40
    s with the gathers as that branch, in 19 s with no branch, in 11 s with this one, and one band ran 0.175, 0.241
    and 0.178 s (the three variants of the band program: cond, no barrier, cheap cond). The windowed values are
    kept whole (an optimization barrier): in the form with no
    ``lax.cond``, XLA on the CPU recomputed the 64-slice sum in its consumers without it (0.78 s against 1.29 s a
    band at 384^2); inside the ``cond`` its effect is not measured apart.

    With ``tiles`` = ``(block, tile_top, tile_left)``, each point's window is picked out of its tile of the
    coefficients ``block`` ``(K, n, th, tw)`` (``th``, ``tw`` the window's sides plus ``2^m - 1``,
    :func:`_tile_room`; padded as the windows are, past the end) whose corner is ``(tile_top, tile_left)``
    ``(n,)``, by a shift of selects (:func:`_tile_windows`), not by one slice per point, which XLA on a TPU
    makes a loop of one step per point; a point whose window leaves its tile is not served either.
    ``active`` ``(n,)``: the points whose values count (None: all); one that does not cannot make the call
    serve none.

    The points are the last axis inside (an accelerator's lanes; the slices move along its rows)."""
    k, rows, cols = coefficients.shape
    sh, sw = subset
    n = py.shape[0]
    taps = 2 * SPLINE_MARGIN + 4
    height, width = sh + taps - 1, sw + taps - 1
    if height > rows + 2 * SPLINE_MARGIN or width > cols + 2 * SPLINE_MARGIN:  # an image smaller than a window
        return _interpolate(coefficients, py, px), jnp.ones(n, bool)

    def spread(fraction, offset):
        # the 4 taps' weights at their offsets among the window's, and where each offset is one of the taps
        weights = warp.spline_weights(fraction)
        placed = jnp.stack([sum((jnp.where(offset + t == a, weights[t], 0) for t in range(4)),
                                jnp.zeros_like(fraction)) for a in range(taps)])  # fmt: skip
        chosen = jnp.stack([(offset <= a) & (a < offset + 4) for a in range(taps)])
        return placed, chosen

    def windowed(coefficients, py, px):
        lost, ((ty, oy, top), (tx, ox, left)) = _window_knots(py, px, (rows, cols), subset)
        if tiles is None:
            padded = jnp.pad(coefficients, ((0, 0), (0, 2 * SPLINE_MARGIN), (0, 2 * SPLINE_MARGIN)))
            window = jax.vmap(lambda y, x: lax.dynamic_slice(padded, (jnp.zeros_like(y), y, x), (k, height, width)),
                              out_axes=-1)(top, left)  # (K, height, width, n)  # fmt: skip
        else:
            block, tile_top, tile_left = tiles
            window = _tile_windows(block, top - tile_top, left - tile_left, (height, width))
        (along_y, on_y), (along_x, on_x) = spread(ty, oy), spread(tx, ox)
        out = 0
        for a in range(taps):
            row = 0
            for b in range(taps):
                row = row + jnp.where(on_x[b], along_x[b] * window[:, a : a + sh, b : b + sw], 0)
            out = out + jnp.where(on_y[a], along_y[a] * row, 0)
        out = jnp.swapaxes(out.reshape(k, sh * sw, n), 1, 2)
        return lax.optimization_barrier(jnp.where(lost[None, :, None], jnp.nan, out))

    def none(coefficients, py, px):
        return jnp.zeros((k, *py.shape), coefficients.dtype)

    # the branch takes the positions, not arrays made from them outside: XLA on the CPU then fuses the weights
    # into the products (made outside, the branch ran 5x slower)
    lost, axes = _window_knots(py, px, (rows, cols), subset)
    served = _knots_fit(lost, axes)
    if tiles is not None:
        block, tile_top, tile_left = tiles
        (_, _, top), (_, _, left) = axes
        rooms = (block.shape[2] - height, block.shape[3] - width)
        for start, corner, room in ((top, tile_top, rooms[0]), (left, tile_left, rooms[1])):
            served = served & (lost | ((start >= corner) & (start - corner <= room)))
    served = jnp.all(served if active is None else served | ~active)
    return lax.cond(served, windowed, none, coefficients, py, px), jnp.broadcast_to(served, (n,))


def _tile_windows(block: jax.Array, oy: jax.Array, ox: jax.Array, size: tuple[int, int]) -> jax.Array:
    """Each point's window ``size`` ``(height, width)`` at offset ``(oy, ox)`` ``(n,)`` in its tile ``block``
    ``(K, n, th, tw)``, for offsets from 0 to ``th - height`` (``tw - width``): ``(K, height, width, n)``,
    points last. Each axis is shifted as a barrel shifter does it, one select of two static slices per bit
    of the offset (4 selects for offsets up to 15, where a select per offset took 15): exact, NaN included
    (one slice kept); ``th - height`` and ``tw - width`` are ``2^m - 1`` (:func:`_tile_room`)."""
    out = jnp.moveaxis(block, 1, -1)  # (K, th, tw, n)
    for axis, offset, side in ((1, oy, size[0]), (2, ox, size[1])):
        room = out.shape[axis] - side
        if room < 0 or room & (room + 1):
            raise ValueError(f"a tile leaves room for 2^m - 1 offsets of its window; got a side of "
                             f"{out.shape[axis]} for a window of {side}")  # fmt: skip
        bit = (room + 1) // 2
        while bit:
            length = out.shape[axis] - bit
            kept = lax.slice_in_dim(out, bit, bit + length, axis=axis)
            out = jnp.where((offset & bit) > 0, kept, lax.slice_in_dim(out, 0, length, axis=axis))
            bit //= 2
    return out


def _tile_room(margin: int) -> int:
    """The offsets a tile leaves a window for a ``margin`` on each side: ``2 margin`` rounded up to ``2^m - 1``
    (:func:`_tile_windows`' shifts)."""
    return (1 << (2 * margin).bit_length()) - 1


def _window_knots(py: jax.Array, px: jax.Array, shape: tuple[int, int], subset: tuple[int, int]
                  ) -> tuple[jax.Array, tuple[tuple[jax.Array, jax.Array, jax.Array], ...]]:  # fmt: skip
    """For :func:`_interpolate_windows` (``shape``: the padded coefficients' rows and columns): which points have
    a NaN position ``(n,)``, and per axis the pixels' fractions ``(sh, sw, n)`` (clipped as :func:`_interpolate`
    clips), each point's window start (padded: tap -1 of its smallest knot less the pixel's own offset; 0 for a
    point with a NaN position) and the pixels' knots' offsets from it (0 ... 2 SPLINE_MARGIN where the window
    holds their taps)."""
    sh, sw = subset
    n = py.shape[0]
    lost = jnp.any(jnp.isnan(py) | jnp.isnan(px), axis=1)
    out = []
    for q, size, across in ((py, shape[0], jnp.arange(sh)[:, None]), (px, shape[1], jnp.arange(sw)[None, :])):
        q = jnp.clip(jnp.where(jnp.isnan(q), 0, q), 0, size - 5).T.reshape(sh, sw, n)
        low = jnp.floor(q)
        relative = low.astype(jnp.int32) - across.astype(jnp.int32)[..., None]  # the knot less the pixel's own
        first = jnp.where(lost, -1, jnp.min(relative, axis=(0, 1)))  # (n,)
        out.append((q - low, relative - first, first + 1))
    return lost, tuple(out)


def _windows_fit(py: jax.Array, px: jax.Array, shape: tuple[int, int], subset: tuple[int, int]) -> jax.Array:
    """Whether each point's pixels of :func:`_interpolate_windows` lie in its window ``(n,)``: their knots spread
    over at most ``2 SPLINE_MARGIN`` more rows (columns) than the subset's own, and the window starts in the
    image (it ends in the padded coefficients then). True for a point with a NaN position."""
    return _knots_fit(*_window_knots(py, px, shape, subset))


def _knots_fit(lost: jax.Array, axes: tuple[tuple[jax.Array, jax.Array, jax.Array], ...]) -> jax.Array:
    """:func:`_windows_fit` from :func:`_window_knots`' outputs."""
    fit = jnp.ones_like(lost)
    for _, offset, start in axes:
        fit = fit & (start >= 0) & (jnp.max(offset, axis=(0, 1)) <= 2 * SPLINE_MARGIN)
    return lost | fit


# kept (core._executables): a later process loads its executable without tracing or lowering it. On a TPU v5e,
# after `napari-gridmip --prepare`, the affine DIC sample's first Run was 4.0 s with this program traced, lowered
# and read from JAX's persistent cache (1.4 s tracing and lowering, 1.8 s reading; docs/accelerator.md)
@kept(static_argnames=("subset", "band", "windows", "together", "grid"))
def _band(c1, f_img, fy_img, fx_img, curvature, centres_y, centres_x, initial, row0, previous, above, spacing,
          prefilter, *, subset, band, windows=False, together=False, grid=None):  # fmt: skip
    """IC-GN for a band of points, the translation grid's rows ``[row0, row0 + band)`` of one batch item:
    ``(dy, dx, zncc, dy_y, dy_x, dx_y, dx_x)``, each ``(1, band, cols)`` (the pieces of :func:`.join_bands`),
    and which points the windows did not serve ``(1, band, cols)`` (bool; none without ``windows``): their
    outputs are not the IC-GN's (:func:`_row`).

    ``c1``: img1's spline coefficients ``(K, M + 4, N + 4)``; ``f_img``, ``fy_img``, ``fx_img``: img2 and its
    spline gradient ``(K, M, N)``; ``curvature``: img2's second derivatives ``(f_yy, f_xy, f_xx)`` (each
    ``(K, M, N)``; None without a prefilter); ``centres_*``: the points' img2 positions ``(P,)`` (integers,
    ``P = band cols``); ``initial``: the warp each of the item's points starts from ``(out rows, cols, 6)``
    (:func:`_initial_warp`: finite ``dy``, ``dx`` where the point is valid); ``previous``: the outputs of the
    band before (NaN for the first), whose row ``above`` lies just above ``row0``; ``spacing``: the step (px);
    ``prefilter``: the Gaussian's standard deviation (px) both images were smoothed by (a traced scalar: one
    program for every width), whose mismatch under the warp is corrected (:func:`_blur_mismatch`; only with
    ``curvature``).

    The rows run one after the other (:func:`_row`), each starting from the row above where that one is trusted
    (ncorr's seed propagation, row by row whatever the bands: a result does not depend on how the rows are cut
    into bands). With ``together`` (:func:`.core._backend.ic_gn_rows_together`), the band's rows run as one
    row of points, each from its own start (no propagation: the fields move by at most 3.5e-5 px on a 512^2
    pair, docs/accelerator.md). ``windows``: :func:`.core._backend.spline_windows`; with them and without
    ``together`` (no backend's default), a point below one the windows did not serve starts from its own
    start, but at a band's first row from that point's gathers' result: there the result depends on the cut,
    within the IC-GN's tolerance. ``grid``: with ``windows``, ``(step, margin)`` where the points are the
    grid's rows and all its columns ``step`` px apart: their reference subsets are then read by
    :func:`_grid_subsets`, and with a ``margin`` (px, > 0) each step's windows are picked from tiles read once,
    reaching that far past a point's window at its grid position (:func:`_tile_windows`); None: one slice per
    point (:func:`_subset_windows`).
    """
    cols = initial.shape[1]
    if together:
        start = lax.dynamic_slice_in_dim(initial, row0, band, 0).reshape(band * cols, 6)
        nowhere = (jnp.full(band * cols, jnp.nan, c1.dtype),) * 7  # no row above: every point from its own start
        out, unserved = _row(c1, f_img, fy_img, fx_img, curvature, centres_y, centres_x, start, nowhere, spacing,
                             prefilter, subset=subset, windows=windows,
                             grid=(band, cols, *grid) if grid else None)  # fmt: skip
        return tuple(a.reshape(1, band, cols) for a in out), unserved.reshape(1, band, cols)
    first = tuple(lax.dynamic_index_in_dim(a[0], above, 0, keepdims=False) for a in previous)  # (cols,) each

    def one(above_row, xs):
        cy, cx, i = xs
        start = lax.dynamic_index_in_dim(initial, row0 + i, 0, keepdims=False)
        out, unserved = _row(c1, f_img, fy_img, fx_img, curvature, cy, cx, start, above_row, spacing, prefilter,
                             subset=subset, windows=windows, grid=(1, cols, *grid) if grid else None)  # fmt: skip
        v, u, zncc, *gradients = out  # the row below never starts from a point the windows did not serve
        return (v, u, jnp.where(unserved, jnp.nan, zncc), *gradients), (out, unserved)

    rows = (centres_y.reshape(band, cols), centres_x.reshape(band, cols), jnp.arange(band, dtype=jnp.int32))
    out, unserved = lax.scan(one, first, rows)[1]
    return tuple(a[None] for a in out), unserved[None]


def _row(c1, f_img, fy_img, fx_img, curvature, centres_y, centres_x, start, above, spacing, prefilter, *,
         subset, windows=False, grid=None):  # fmt: skip
    """IC-GN for one row of points (the arguments of :func:`_band`; ``centres_*`` ``(cols,)``, ``start``: the
    points' starts ``(cols, 6)`` from :func:`_initial_warp`, ``above``: the outputs of the row above, each
    ``(cols,)``, NaN for none): ``(dy, dx, zncc, dy_y, dy_x, dx_y, dx_x)``, each ``(cols,)``, and which points
    the windows did not serve ``(cols,)`` (bool): the points of a step in which some point's warp took its
    pixels out of its window stop there, their outputs not the IC-GN's (:func:`_interpolate_windows`;
    :func:`affine_refine` runs the gathers for them).

    A point starts from the translation search's result and the gradients across its neighbours
    (:func:`_initial_warp`), or from the converged warp of the point above, carried down by its own gradients,
    where that one's ZNCC is at least ``PROPAGATE_ZNCC`` and the two starts agree within ``PROPAGATE_PX`` (ncorr's
    seed propagation: one IC-GN step fewer for most points; the result moves within the tolerance).

    Every point takes ``FULL_ITERATIONS`` steps together (most have converged by then); then the points still
    going are gathered, :func:`_bucket` at a time, into a batch of fixed size for each further step, and
    scattered back: each point stops on its own, and the row costs about the sum of its points' iterations
    rather than its slowest point's times the row (on an accelerator, whose rows run together, a batch is an
    eighth of a band: the 1024^2 affine DIC took 1.52 s warm on a TPU v5e with them against 2.27 s with the
    whole band stepping until its last point stops, ``benchmarks/bench_accelerator.py``). With ``windows``
    (:func:`.runtime.strategy.spline_windows`), the subsets and the interpolation read one window per point
    (:func:`_subset_windows`, :func:`_interpolate_windows`) instead of gathering each pixel: the same values
    where they serve. ``grid``: ``(rows, cols, step, margin)`` where the points are such a grid
    (:func:`_grid_subsets`; a ``margin``: each step's windows from tiles, :func:`_tile_windows`).
    """
    start = _propagated(start.astype(c1.dtype), above, spacing)  # (P, 6)
    hs, hw = subset[0] // 2, subset[1] // 2
    k, rows, cols = f_img.shape
    eta, zeta = warp.subset_offsets(subset, c1.dtype)  # (S,)

    def gather(img):  # (K, P, S)
        if windows:
            return _subset_windows(img, centres_y - hs, centres_x - hw, subset)
        iy = centres_y[:, None] + eta.astype(jnp.int32)[None, :]  # (P, S)
        ix = centres_x[:, None] + zeta.astype(jnp.int32)[None, :]
        index = (iy * cols + ix).ravel()
        return jnp.take(img.reshape(k, rows * cols), index, axis=1, mode="clip").reshape(k, *iy.shape)

    sources = (f_img, fy_img, fx_img, *(curvature or ()))
    if windows and grid:  # one read of the grid for every image
        f, fy, fx, *curves = _grid_subsets(sources, centres_y[0] - hs, centres_x[0] - hw, subset, grid=grid[:3])
    else:
        f, fy, fx, *curves = (gather(img) for img in sources)
    curves = tuple(curves) if curvature is not None else None
    f = f - f.mean(axis=(0, 2), keepdims=True)
    norm_f = jnp.sqrt(jnp.sum(f * f, axis=(0, 2)))  # (P,)
    monomials = warp.moments(eta, zeta)  # (S, 6)
    hessian = warp.hessian(*(jnp.sum(a * b, 0) for a, b in ((fy, fy), (fy, fx), (fx, fx))), monomials)
    ok = jnp.isfinite(start[:, 0]) & jnp.isfinite(start[:, 3]) & (norm_f > 0)
    hessian = jnp.where(ok[:, None, None], hessian, jnp.eye(6, dtype=c1.dtype))
    factor = warp.cholesky(hessian)  # (P, 21)
    corner = jnp.array([hs, hw], c1.dtype)
    tolerance = TOLERANCE[np.dtype(c1.dtype)]
    # what a step needs of each point, its point axis first or second (the subsets' (K, P, S))
    points = {"f": f, "fy": fy, "fx": fx, "curves": curves, "factor": factor, "cy": centres_y, "cx": centres_x}
    axis = {"f": 1, "fy": 1, "fx": 1, "curves": 1, "factor": 0, "cy": 0, "cx": 0}
    if windows and grid and grid[3]:  # each point's tile of img1's coefficients, read once for every step
        margin, taps = grid[3], 2 * SPLINE_MARGIN + 4
        room = _tile_room(margin)
        side = (subset[0] + taps - 1 + room, subset[1] + taps - 1 + room)
        after = room - margin + 2 * SPLINE_MARGIN
        wide = jnp.pad(c1, ((0, 0), (margin, after), (margin, after)))
        # a window's start at the grid (no warp) is the padded coefficients' row of tap -1: centre - hs + 1
        (block,) = _grid_subsets((wide,), centres_y[0] - hs + 1, centres_x[0] - hw + 1, side, grid=grid[:3])
        points.update(block=block.reshape(k, -1, *side), tile_top=centres_y - hs + 1 - margin,
                      tile_left=centres_x - hw + 1 - margin)  # fmt: skip
        axis.update(block=1, tile_top=0, tile_left=0)

    def step(d, p, active):
        """One IC-GN step of the points ``d`` from ``p`` ``(n, 6)``: the new warp (``p`` where not ``active``),
        whether each point goes on (its increment moved a corner by more than the tolerance) and the ZNCC at
        ``p`` (ncorr's: one increment below the tolerance before the result, for a point stopping now)."""
        py, px = warp.positions(d["cy"], d["cx"], eta, zeta, p)
        if windows:
            tiles = (d["block"], d["tile_top"], d["tile_left"]) if "block" in d else None
            g, served = _interpolate_windows(c1, py, px, subset=subset, tiles=tiles, active=active)
        else:
            g, served = _interpolate(c1, py, px), jnp.ones(p.shape[0], bool)
        g = g - g.mean(axis=(0, 2), keepdims=True)
        norm_g = jnp.sqrt(jnp.sum(g * g, axis=(0, 2)))
        fp = d["f"]
        if d["curves"] is not None:  # the reference blurred as img1's prefilter blurs it under p
            fp = fp + _blur_mismatch(p, prefilter, d["curves"])
            fp = fp - fp.mean(axis=(0, 2), keepdims=True)
        norm_fp = jnp.sqrt(jnp.sum(fp * fp, axis=(0, 2)))
        zncc = jnp.sum(fp * g, axis=(0, 2)) / (norm_fp * jnp.where(norm_g > 0, norm_g, jnp.inf))
        scale = jnp.where(norm_g > 0, norm_fp / jnp.where(norm_g > 0, norm_g, 1), 0)
        residual = fp - scale[None, :, None] * g  # (K, n, S)
        rhs = warp.steepest_descent(*(jnp.sum(d[a] * residual, 0) for a in ("fy", "fx")), monomials)
        dp = -warp.cholesky_solve(d["factor"], rhs)
        dp = jnp.where(active[:, None], dp, 0)
        going = active & (warp.corner_move(dp, corner) > tolerance) & served
        return jnp.where(active[:, None], warp.compose_inverse(p, dp), p), going, zncc, active & ~served

    def together(_, state):
        p, active, count, zncc, unserved = state
        p, going, new_zncc, missed = step(points, p, active)
        count = count + active
        return p, going & (count < MAX_ITERATIONS), count, jnp.where(active, new_zncc, zncc), unserved | missed

    n = f.shape[1]
    bucket = _bucket(n)

    def some(state):
        p, active, count, zncc, unserved = state
        at = jnp.nonzero(active, size=bucket, fill_value=n)[0]  # (bucket,), n: an empty slot
        safe = jnp.minimum(at, n - 1)
        d = {key: _take(value, safe, axis[key]) for key, value in points.items()}
        q, going, new_zncc, missed = step(d, p[safe], at < n)
        counted = count[safe] + 1
        going = going & (counted < MAX_ITERATIONS)
        return (p.at[at].set(q, mode="drop"), active.at[at].set(going, mode="drop"),
                count.at[at].set(counted, mode="drop"), zncc.at[at].set(new_zncc, mode="drop"),
                unserved.at[at].set(unserved[safe] | missed, mode="drop"))  # fmt: skip

    p0 = jnp.where(ok[:, None], jnp.where(jnp.isfinite(start), start, 0), 0)
    state = (p0, ok, jnp.zeros(n, jnp.int32), jnp.zeros_like(norm_f), jnp.zeros(n, bool))
    state = lax.fori_loop(0, min(FULL_ITERATIONS, MAX_ITERATIONS), together, state)
    p, _, _, zncc, unserved = lax.while_loop(lambda s: jnp.any(s[1]), some, state)
    nan = jnp.array(jnp.nan, c1.dtype)
    p, zncc = jnp.where(ok[:, None], p, nan), jnp.where(ok, zncc, nan)
    v, vy, vx, u, uy, ux = (p[:, i] for i in range(6))
    return (v, u, zncc, vy, vx, uy, ux), unserved


def _propagated(start: jax.Array, above: tuple[jax.Array, ...], spacing: jax.Array) -> jax.Array:
    """The start ``(P, 6)`` of a row's points, with the converged warps of the row above (``above``: its outputs)
    carried down by their own gradients where they are trusted (see :func:`_row`)."""
    v, u, zncc, vy, vx, uy, ux = above
    carried = jnp.stack([v + vy * spacing, vy, vx, u + uy * spacing, uy, ux], -1).astype(start.dtype)
    near = jnp.maximum(jnp.abs(carried[:, 0] - start[:, 0]), jnp.abs(carried[:, 3] - start[:, 3])) <= PROPAGATE_PX
    use = (zncc >= PROPAGATE_ZNCC) & near & jnp.all(jnp.isfinite(carried), -1)  # NaN compares False: none above
    return jnp.where(use[:, None], carried, start)


def _take(tree: Any, where: jax.Array, axis: int) -> Any:
    """Each array of ``tree`` (None: none) at indices ``where`` along ``axis``."""
    return jax.tree.map(lambda a: jnp.take(a, where, axis=axis, mode="clip"), tree)


def _bucket(points: int) -> int:
    """The batch of points that take a step together once ``FULL_ITERATIONS`` are done: ``BUCKET`` of the row
    (at least 1)."""
    return max(1, min(points, int(round(points * BUCKET))))


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


def _blur_mismatch(p: jax.Array, sigma: float | jax.Array, curves: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
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
    values = TOGETHER_BAND_VALUES if strategy.ic_gn_rows_together() else BAND_VALUES
    band = int(max(1, min(out_rows, values // max(per_row, 1))))
    return band, sorted({min(s, out_rows - band) for s in range(0, out_rows, band)})


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
    all, and one to join them: :func:`.join_bands`), on the device of its inputs (or JAX's default); on an
    accelerator with a band's rows together and one window read per point (:func:`.core._backend.spline_windows`,
    :func:`.core._backend.ic_gn_rows_together`). ``on_band(done)`` is called before each band with the bands
    done so far, and may raise to stop the refinement between bands.
    """
    items, k = x1.shape[:2]
    (wm, wn), (sh, sw) = window, subset
    out_rows, out_cols = dy.shape[1:]
    grid_y = np.arange(out_rows) * step + wm // 2 + sh // 2
    grid_x = np.arange(out_cols) * step + wn // 2 + sw // 2
    band, starts = affine_plan((out_rows, out_cols), subset, k)
    options = _band_options(band, window=window, subset=subset, step=step)
    windows = options["windows"]
    sigma = np.asarray(prefilter, x1.dtype)  # traced: one program for every prefilter width
    spacing = np.asarray(step, x1.dtype)
    none = (np.full((1, band, out_cols), np.nan, x1.dtype),) * 7  # the first band's "previous": no row above
    gathers = {**options, "windows": False, "grid": None}
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
            images = (c1, f_img, fy_img, fx_img, curvature)
            previous, above = (pieces[-1], start - 1 - starts[done - 1]) if done else (none, 0)
            where = (cy, cx, initial, np.int32(start), previous, np.int32(above), spacing)
            out, unserved = _band(*images, *where, sigma, **options)
            if windows:
                out = _gathers_where_unserved(out, unserved, partial(_band, *images, *where, sigma, **gathers))
            pieces.append(out)
            wait_for(pieces[-1])
    return join_bands(pieces, keep=kept_rows(starts, band), batch=batch)


def _band_options(band: int, *, window: tuple[int, int], subset: tuple[int, int], step: int) -> dict[str, Any]:
    """:func:`_band`'s static options on this backend: the windows and rows together where it takes them, and
    the band's grid of points read by rows and columns (with a margin, the steps' windows from tiles too)."""
    windows = strategy.spline_windows()
    margin = max(window) // 2 + TILE_SLACK if TILE_WINDOWS else 0
    grid = (step, margin) if windows and (GRID_SUBSETS or TILE_WINDOWS) else None
    return dict(subset=subset, band=band, windows=windows, together=strategy.ic_gn_rows_together(), grid=grid)


def compile_ahead(x1: Any, x2: Any, out_shape: tuple[int, int], dtype: Any, *, window: tuple[int, int],
                  subset: tuple[int, int], step: int, prefilter: float,
                  coefficients: Callable[[jax.Array], jax.Array]) -> threading.Thread | None:  # fmt: skip
    """Compile :func:`affine_refine`'s programs (:func:`_item_images` and, beside it, :func:`_band` for its bands)
    in a thread, for stacks shaped as ``x1``, ``x2`` (arrays or ``jax.ShapeDtypeStruct``, ``(B, K, M, N)``) and a
    translation grid ``out_shape`` of ``dtype``, while the caller compiles and runs the translation search: a
    first call then waits for the longer, not the sum (JAX's ahead-of-time compile fills the cache the calls
    read; the caller joins the thread before the IC-GN). Where ``COMPILE_AHEAD`` is on, or None and the backend
    is not the CPU (:func:`.core._backend.ic_gn_compile_ahead`: 40.6 s against 48.6 s for the 1024^2 pair's
    first call on a TPU v5e; nothing gained on this 2-core CPU). Once per process and program; None where
    nothing is started: off, traced or 64-bit stacks, or stacks placed on a device by the caller (committed:
    their calls would key on that placement, not the compile's). The thread lowers on the caller's default
    device."""
    ahead = strategy.ic_gn_compile_ahead() if COMPILE_AHEAD is None else COMPILE_AHEAD
    if not ahead or np.dtype(dtype).itemsize > 4:
        return None
    if any(isinstance(a, jax.core.Tracer) or (isinstance(a, jax.Array) and a.committed) for a in (x1, x2)):
        return None
    (items, k), dtype = tuple(x1.shape[:2]), np.dtype(dtype)
    band = affine_plan(out_shape, subset, k)[0]
    options = _band_options(band, window=window, subset=subset, step=step)
    key = ("affine", tuple(x1.shape), tuple(x2.shape), out_shape, dtype, window, subset, step, prefilter > 0,
           coefficients, tuple(sorted(options.items())))  # fmt: skip

    def struct(shape, kind=dtype):
        return jax.ShapeDtypeStruct(shape, kind)

    def programs() -> tuple[Callable[[], object], Callable[[], object]]:
        """The two compiles, run side by side: on a TPU v5e the band program's (28.5 s at 1024^2) is the first
        call's longest, and _item_images' (5.8 s) need not precede it (side by side not measured on the chip
        yet). The band's input shapes are found in its own thread."""
        grid = struct((items, *out_shape))
        images_args = (struct(x1.shape, x1.dtype), struct(x2.shape, x2.dtype), grid, grid, struct((), np.int32))
        images_options = dict(coefficients=coefficients, step=step, curvature=prefilter > 0)

        def compile_band() -> None:
            *images, initial = jax.eval_shape(partial(_item_images, **images_options), *images_args)
            centres = struct((band * out_shape[1],), np.int32)
            previous = (struct((1, band, out_shape[1])),) * 7
            scalar, index = struct(()), struct((), np.int32)
            band_args = (*images, centres, centres, initial, index, previous, index, scalar, scalar)
            if _band.executable(*band_args, **options) is None:  # loaded or compiled and kept; else JAX's AOT
                _band.lower(*band_args, **options).compile()

        return compile_band, lambda: _item_images.lower(*images_args, **images_options).compile()

    return compile_ahead_once(key, programs, name="napari-gridmip IC-GN compile")


def _gathers_where_unserved(out: tuple[jax.Array, ...], unserved: jax.Array,
                            gathers: Callable[[], tuple[Any, jax.Array]]) -> tuple[jax.Array, ...]:  # fmt: skip
    """A windowed band's outputs ``out``, with those of the points the windows did not serve ``unserved`` taken
    from the same band's IC-GN by gathers (``gathers()``: :func:`_band`'s outputs), which runs only where there
    are some: eagerly, its program compiles only then (on a TPU v5e the band program with the gathers inside
    it compiled in 40 s, without them in 11 s, :func:`_interpolate_windows`). Decided on the host for concrete
    outputs (one bool read), by a ``lax.cond`` for traced ones (whose program then holds the gathers' band).
    With the band's rows together (:func:`.core._backend.ic_gn_rows_together`), each point's outputs are then
    the gathers' IC-GN's."""
    if isinstance(unserved, jax.core.Tracer):
        return lax.cond(jnp.any(unserved), lambda: _merged(out, unserved, gathers()[0]), lambda: tuple(out))
    if not bool(_any(unserved)):
        return out
    return _merged(out, unserved, gathers()[0])


@jax.jit
def _any(a: jax.Array) -> jax.Array:
    return jnp.any(a)


@jax.jit
def _merged(out: tuple[jax.Array, ...], unserved: jax.Array, gathered: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
    """``out`` with ``gathered`` where ``unserved``."""
    return tuple(jnp.where(unserved, g, o) for o, g in zip(out, gathered))


def check_shape(shape: Any) -> str:
    """The ``shape`` option: ``"translation"`` or ``"affine"``."""
    if not isinstance(shape, str):
        raise TypeError(f"shape must be one of {SHAPES}; got {shape!r} ({type(shape).__name__})")
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}; got {shape!r}")
    return shape
