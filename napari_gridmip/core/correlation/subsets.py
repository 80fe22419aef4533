"""Subset correlation (digital image correlation, speckle tracking): each pixel's vector is its K frames over a
``sh x sw`` subset, compared by zero-normalised cross-correlation (ZNCC), with box sums instead of subset loops.

This module holds the plan, the sweep, each band's program and the drivers (:func:`run`, whose notes give the
method, and the dense functions with a subset or a step); :mod:`._subset_newton` the sub-pixel step, :mod:`._bands`
the join of the bands, :mod:`._checks` the option checks, :mod:`.tracking` the public ``track_speckles``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from napari_gridmip.core import validate
from napari_gridmip.core.correlation._bands import compile_ahead_once, join_bands, kept_rows
from napari_gridmip.core.correlation._checks import check_dtypes, check_pair
from napari_gridmip.core.correlation._subset_newton import (
    GRAM_COLS,
    GRAM_INDEX,
    GRAM_ROWS,
    interpolated,
    newton_step,
    nothing,
    tap_sums,
    uncertainty,
)
from napari_gridmip.core.correlation.affine import affine_plan, affine_refine, check_shape, compile_ahead
from napari_gridmip.core.correlation.prefilter import (
    DEFAULT_SIGMA,
    check_prefilter,
    fir_along,
    noise_gain,
    smooth_frames,
)
from napari_gridmip.core.options import SUBPIXEL_METHODS
from napari_gridmip.core.peak import subpixel_offset
from napari_gridmip.core.runtime import strategy as _backend
from napari_gridmip.core.runtime.executables import kept
from napari_gridmip.core.runtime.precision import is_wide, precision_scope
from napari_gridmip.core.runtime.sharding import band_devices, band_starts, run_bands, spread_rows
from napari_gridmip.core.runtime.transfer import aligned_empty, owned_to_device

__all__: list[str] = []

ZERO_VARIANCE = {np.dtype(np.float32): 2.0**-17, np.dtype(np.float64): 2.0**-40}
"""A subset whose variance is below this fraction of its mean square counts as constant (correlates as 0).

About 64 rounding units of the compute dtype: rounding alone leaves a constant subset's variance a few units
of its mean square away from 0, and a genuine variance that small could not be resolved anyway."""
MAX_ITERATIONS = 10  # Newton steps from the 3x3 estimate, at most (a row stops once all its steps are tiny)
TOLERANCE = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-10}  # px: a step this small has converged
REACH = 1.0  # the refined position stays within this many pixels of the integer peak (its 5 x 5 tap block)
SPLINE_REACH = 24  # taps each side of the B-spline prefilter (|z|**25 = 5e-15 of the first left out)
MAX_BANDS = 8  # Python-level calls per image: progress and cancel points
GRAM_BAND_BYTES = 32 * 2**20  # a band's Gram planes stay within this (rows per band are cut to fit)
DEVICE_GRAM_BAND_BYTES = 512 * 2**20  # the same where all rows are summed at once (Plan.at_once): fewer bands
ROW_BATCH = 64  # output rows computed together from their sums where all rows are summed at once
ROW_VIEW_BYTES = 512 * 2**20  # what a batch of those rows reads of the planes (_RowView) stays within this
MAP_BAND_BYTES = 256 * 2**20  # a band's share of a full map (pixels first) before it is written out
# rows a dask block borrows from its neighbours: the 5 x 5 taps' ring, the Gram block and the spline prefilter
DASK_REACH = 2 + GRAM_ROWS + SPLINE_REACH
DISPLACEMENT = ("dy", "dx", "peak")  # the search's outputs without tracking, in this order


class Plan(NamedTuple):
    """Everything static about one call: shapes, window, subset, step and what the row consumer computes."""

    frames: int
    shape: tuple[int, int]  # (M, N)
    window: tuple[int, int]
    subset: tuple[int, int]
    step: int
    ring: tuple[int, int]  # extra offsets searched around the window per axis (for the 5 x 5 tap block)
    gram: bool  # Gram planes for the interpolated correlation (refine, tracking)
    method: str  # "map", or a sub-pixel method
    track: tuple[str, ...]  # the tracking outputs wanted, in their order (empty: the search's DISPLACEMENT only)
    has_bad: bool  # some value is not finite
    interpolation: str = "bspline"  # of img1 between pixels, where ``gram``: "bspline" or "keys"
    noise_gain: float = 1.0  # the variance a prefilter leaves of white noise (1: no prefilter)
    row_sums: str = "running"  # how the sums go down the image (core.runtime.strategy.subset_row_sums)
    # each pixel's 5 x 5 blocks read by gathers, else by selects (core.runtime.strategy.per_pixel_gathers)
    gathers: bool = True

    @property
    def spline(self) -> bool:
        """The sweep runs on img1's cubic B-spline coefficients (the integer map recovered from them)."""
        return self.gram and self.interpolation == "bspline"

    @property
    def count(self) -> int:
        return self.frames * self.subset[0] * self.subset[1]

    @property
    def dense(self) -> tuple[int, int]:
        (wm, wn), (sh, sw) = self.window, self.subset
        return self.shape[0] - (wm - 1) - (sh - 1), self.shape[1] - (wn - 1) - (sw - 1)

    @property
    def out(self) -> tuple[int, int]:
        return tuple(-(-d // self.step) for d in self.dense)

    @property
    def extended(self) -> tuple[int, int]:
        return self.window[0] + 2 * self.ring[0], self.window[1] + 2 * self.ring[1]

    @property
    def pad(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """img1's padding (edge values) ``((before rows, before cols), (after rows, after cols))``: the ring,
        the Gram planes' reach, and room for the column compaction of a large step."""
        extra = GRAM_ROWS - 1 if self.gram else 0
        (ry, rx), s = self.ring, self.step
        return (ry, rx), (ry + extra + s, rx + extra + s)

    @property
    def compact(self) -> bool:
        """A step at least the subset's width: the sums skip the columns between subsets."""
        return self.step >= self.subset[1]

    @property
    def running(self) -> bool:
        """Running sums down the image (each output row adds and removes ``s`` rows) unless a fresh sum of
        ``sh`` rows is as cheap."""
        return self.row_sums == "running" and 2 * self.step < self.subset[0]

    @property
    def at_once(self) -> bool:
        """Every output row of a band summed at once, one offset at a time (the accelerators' way)."""
        return self.row_sums == "at_once"


# -- small pieces -------------------------------------------------------------------


def _box(x: jax.Array, size: tuple[int, int]) -> jax.Array:
    """Sums over every ``size`` box of the last two axes (valid positions), as two 1D ``reduce_window`` sums:
    exact to rounding (no differences of prefix sums), NaN only in the boxes that hold one."""
    lead = (1,) * (x.ndim - 2)
    zero = jnp.zeros((), x.dtype)
    rows = lax.reduce_window(x, zero, lax.add, lead + (size[0], 1), (1,) * x.ndim, "VALID")
    return lax.reduce_window(rows, zero, lax.add, lead + (1, size[1]), (1,) * x.ndim, "VALID")


def _sum_frames(x: jax.Array) -> jax.Array:
    """Sum over axis 0 (the frames) as unrolled adds (XLA's CPU reduce over a major axis is much slower)."""
    acc = x[0]
    for f in range(1, x.shape[0]):
        acc = acc + x[f]
    return acc


def _inverse_norm(box: jax.Array, box_sq: jax.Array, bad: jax.Array | None, count: int) -> jax.Array:
    """``1 / sqrt(variance sum)`` of each subset vector; 0 for a constant one, NaN where a value is not finite."""
    var = box_sq - box * box / count
    ok = var > ZERO_VARIANCE[np.dtype(box.dtype)] * box_sq
    inv = jnp.where(ok, lax.rsqrt(jnp.where(ok, var, 1)), 0)
    return inv if bad is None else jnp.where(bad > 0, jnp.nan, inv)


def _columns(row: jax.Array, start: int | jax.Array, plan: Plan, width: int) -> jax.Array:
    """The columns of ``row`` (last axis) that the output columns' subsets use, from ``start`` (static, or
    traced in the accelerators' loop over offsets).

    Contiguous when the step is smaller than the subset (``width`` columns); with a larger step, only each
    output column's ``sw`` columns, side by side (``Ns * sw`` of them).
    """
    ns, axis = plan.out[1], row.ndim - 1

    def cut(size: int) -> jax.Array:
        if isinstance(start, int):
            return lax.slice_in_dim(row, start, start + size, axis=axis)
        return lax.dynamic_slice_in_dim(row, start, size, axis=axis)

    if not plan.compact:
        return cut(width)
    s, sw = plan.step, plan.subset[1]
    block = cut(ns * s)
    block = block.reshape(row.shape[:-1] + (ns, s))[..., :sw]
    return block.reshape(row.shape[:-1] + (ns * sw,))


def _column_width(plan: Plan) -> int:
    ns, s, sw = plan.out[1], plan.step, plan.subset[1]
    return ns * sw if plan.compact else (ns - 1) * s + sw


def _row_box(v: jax.Array, plan: Plan) -> jax.Array:
    """Sum each output column's ``sw`` columns of the sums ``v`` (last axis, from :func:`_columns`).

    A ``reduce_window`` (with the step as its stride): XLA's CPU backend never fuses one into its
    consumers, so each row's box sums are computed once and read by the peak search, the neighbourhood
    gathers and the map alike. Written as shifted slices, they were fused into (and recomputed by) every
    consumer: 8x slower.
    """
    sw = plan.subset[1]
    stride = sw if plan.compact else plan.step
    ones = (1,) * (v.ndim - 1)
    return lax.reduce_window(v, jnp.zeros((), v.dtype), lax.add, ones + (sw,), ones + (stride,), "VALID")


def _strided(x: jax.Array, start: int, count: int, step: int, axis: int) -> jax.Array:
    return lax.slice_in_dim(x, start, start + (count - 1) * step + 1, stride=step, axis=axis)


# -- the sweep: running box sums of products, one output row at a time -------------------------------


def _sweep_layout(plan: Plan, step: int | None, cols: int | None) -> tuple[Plan, int]:
    """The plan a sweep runs (its own ``step``, or every column of a band) and the width of its column sums."""
    sub = plan if step is None else plan._replace(step=step)
    if cols is not None:  # a sweep over every column of a band (the Gram planes)
        sub = sub._replace(shape=(plan.shape[0], cols + (sub.window[1] - 1) + (sub.subset[1] - 1)))
    return sub, _column_width(sub)


def _sums_at_once(xa, xb, *, rows, offsets, origin, plan: Plan, step=None, cols=None) -> jax.Array:
    """:func:`_sweep`'s sums for every output row at once: ``(wa, wb, rows, Ns)``, ``[a, b, t]`` being ``H[b][a]``
    at output row ``t``.

    The accelerators' way for tall subsets (``core.runtime.strategy.subset_row_sums``): one offset at a time in a loop
    of ``wa wb`` iterations, each over the whole band (its products summed down the image by a strided
    ``reduce_window``, along it by :func:`_row_box`). The row-at-a-time sweep is a loop of ``rows sh`` small
    iterations, where an accelerator waits on each: DIC 2048^2 (subset 31, step 4, refine) took 1.93 s on a TPU
    v5e with it, 2.2x its 13-core host, and 0.86 s at once (docs/accelerator.md).
    """
    wa, wb = offsets
    sub, width = _sweep_layout(plan, step, cols)
    sh, s = sub.subset[0], sub.step
    span = (rows - 1) * s + sh  # image rows the output rows' subsets cover
    k, zero = xa.shape[0], jnp.int32(0)
    below = _columns(lax.slice_in_dim(xb, origin[0], origin[0] + span, axis=1), origin[1], sub, width)

    def one(ab: jax.Array) -> jax.Array:
        a, b = ab // wb, ab % wb
        slab = lax.dynamic_slice(xa, (zero, a, zero), (k, span, xa.shape[2]))
        products = _sum_frames(_columns(slab, b, sub, width) * below)  # (span, width)
        down = lax.reduce_window(products, jnp.zeros((), xa.dtype), lax.add, (sh, 1), (s, 1), "VALID")
        return _row_box(down, sub)  # (rows, Ns)

    return lax.map(one, jnp.arange(wa * wb, dtype=jnp.int32)).reshape(wa, wb, rows, -1)


def _sweep(xa, xb, *, rows, offsets, origin, plan: Plan, consume, carry, step=None, cols=None):
    """Run ``carry = consume(t, H, carry)`` for every output row ``t < rows``, in order, where ``H`` is a tuple
    over column offsets ``b < wb`` of ``(wa, cols)`` arrays::

        H[b][a, j] = sum over k, u < sh, v < sw of  xa[k, t s + a + u, j s + b + v] * xb[k, t s + o + u, j s + p + v]

    for ``(wa, wb) = offsets`` and ``(o, p) = origin``. ``xa`` and ``xb`` are one item's ``(K, rows, cols)``
    arrays. The sums down the image are carried by the loop (running sums when ``plan.running``), the sums
    along a row are direct (:func:`_row_box`). The image rows of each product reach it through a loop carry,
    sliced one step ahead: a dynamic slice fused into the products costs their vectorisation
    (``benchmarks/bench_correlation.py``).
    """
    wa, wb = offsets
    sh = plan.subset[0]
    sub, width = _sweep_layout(plan, step, cols)
    s = sub.step
    k = xa.shape[0]
    zero = jnp.int32(0)

    def slab_a(y):
        return lax.dynamic_slice(xa, (zero, y, zero), (k, wa, xa.shape[2]))

    def row_b(y):
        return _columns(
            lax.dynamic_slice(xb, (zero, y + origin[0], zero), (k, 1, xb.shape[2]))[:, 0], origin[1], sub, width
        )

    def products(slab, row):
        out = []
        for b in range(wb):
            cols_b = _columns(slab, b, sub, width)  # (K, wa, width)
            p = cols_b[0] * row[0][None]
            for f in range(1, k):
                p = p + cols_b[f] * row[f][None]
            out.append(p)
        return tuple(out)

    def add_rows(v, first, count, leave, keep=None):
        """``v`` plus the products of ``count`` rows from ``first``, minus ``keep`` times those of the rows
        from ``leave`` unless ``leave`` is None (``count`` and ``keep`` may be traced). The rows' slices reach
        the products through the inner loop's carry, sliced one step ahead."""

        def one(u, c):
            v, sa, rb, la, lb = c
            pa = products(sa, rb)
            if leave is None:
                v = tuple(x + p for x, p in zip(v, pa))
            else:
                pl = products(la, lb)
                v = tuple(x + (p - keep * q) for x, p, q in zip(v, pa, pl))
            nxt = first + u.astype(jnp.int32) + 1
            back = (first if leave is None else leave) + u.astype(jnp.int32) + 1
            return v, slab_a(nxt), row_b(nxt), slab_a(back), row_b(back)

        back = first if leave is None else leave
        return lax.fori_loop(0, count, one, (v, slab_a(first), row_b(first), slab_a(back), row_b(back)))[0]

    zeros = tuple(jnp.zeros((wa, width), xa.dtype) for _ in range(wb))

    def body(t, c):
        v, user = c
        t = t.astype(jnp.int32)
        # bring the sums to row t (at t = 0: the first sh rows, from zero), then box and consume them: the
        # old sums are read once, by their update, which XLA then does in place
        if sub.running:
            y = jnp.maximum(t - 1, 0) * s
            first = jnp.where(t > 0, y + sh, 0)
            v = add_rows(v, first, jnp.where(t > 0, s, sh), y, keep=(t > 0).astype(xa.dtype))
        else:
            v = add_rows(zeros, t * s, sh, None)
        user = consume(t, tuple(_row_box(x, sub) for x in v), user)
        return v, user

    _, carry = lax.fori_loop(0, rows, body, (zeros, carry))
    return carry


# -- what each output row becomes ------------------------------------------------------------


def _argmax(r: Sequence[jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array]:
    """First maximum (C order over ``(a, b)``) of ``r[b][a, j]``: value, ``a`` and ``b``, each ``(Ns,)``.
    NaN entries are skipped (a NaN never compares greater); all NaN gives ``-inf`` at (0, 0)."""
    wn = len(r)
    # one variadic reduce over the stacked offsets: a chain of selects per offset made the two largest
    # kernels of the DIC program, 0.33 s of its LLVM time (bench_first_run.py)
    stacked = jnp.stack(r, axis=1)  # (wm, wn, Ns)
    flat = stacked.reshape((-1,) + stacked.shape[2:])
    flat = jnp.where(jnp.isnan(flat), -jnp.inf, flat)
    index = jnp.argmax(flat, axis=0).astype(jnp.int32)
    value = jnp.max(flat, axis=0)
    row, column = index // wn, index % wn
    return value, row, column


def _take_rows(x: jax.Array, rows: jax.Array) -> jax.Array:
    """``x[rows[..., j], j]`` for ``x`` of shape ``(R, J)`` and integer ``rows`` of shape ``(..., J)``."""
    rows = jnp.clip(rows, 0, x.shape[0] - 1)
    return jnp.take_along_axis(x, rows.reshape(-1, x.shape[1]), axis=0).reshape(rows.shape)


def _block(h: Sequence[jax.Array], a0: jax.Array, b0: jax.Array, reach: int) -> jax.Array:
    """``h[b0 + q - reach][a0 + p - reach, j]`` for ``p, q < 2 reach + 1``: ``(2 reach + 1, 2 reach + 1, Ns)``."""
    span = 2 * reach + 1
    offs = jnp.arange(span, dtype=jnp.int32)[:, None] - reach
    rows = a0[None, :] + offs  # (span, Ns)
    per_b = jnp.stack([_take_rows(x, rows) for x in h])  # (wb, span, Ns)
    cols = jnp.clip(b0[None, :] + offs, 0, len(h) - 1)  # (span, Ns)
    # per_b[cols[q, j], p, j] -> (p, q, j)
    picked = jnp.take_along_axis(per_b, cols[:, None, :].repeat(span, axis=1).reshape(span, span, -1), axis=0)
    return jnp.swapaxes(picked, 0, 1)


def _by_phase(x: jax.Array, step: int, width: int, count: int) -> jax.Array:
    """Planes ``x`` ``(k, R, C)`` with their columns split by phase modulo ``step``, the phase first and the planes
    beside the columns: ``(step, R, k, Q)``, where ``[c % step, r, i, c // step + j]`` is ``x[i, r, c + j step]``
    (zeros past ``C``), for ``c < width``, ``j < count``.

    Made once a band, so that each pixel's column ``c + j step`` is then a contiguous slice (:func:`_at_phase`)
    rather than a strided one: a TPU's strided slice along its lanes (the last axis) ran at 5 GB/s, 0.75 of DIC
    2048^2's 0.98 s at step 4 (benchmarks/probes/accelerator_profile.py). The phase and the rows lead, above the two
    axes a
    TPU tiles (its sublanes and lanes), so that the batches' windows (:func:`_windows`) and a phase are cut along
    untiled axes. Measured against the phase among the tiled axes, ``(k, R, s, Q)``: the same, 0.269 against
    0.268 s for DIC 2048^2, the fusion that picks the columns still 0.095 s of it (docs/accelerator.md)."""
    q = count + (width - 1) // step + 1
    x = jnp.pad(x, ((0, 0), (0, 0), (0, max(0, q * step - x.shape[-1]))))[..., : q * step]
    return jnp.transpose(x.reshape(*x.shape[:-1], q, step), (3, 1, 0, 2))


def _at_phase(x: jax.Array, c: int, step: int, count: int) -> jax.Array:
    """Columns ``c + j step``, ``j < count``, of a :func:`_by_phase` array: ``(R, k, count)``."""
    return x[c % step, ..., c // step : c // step + count]


def _windows(x: jax.Array, start: jax.Array, count: int, step: int, height: int, axis: int) -> jax.Array:
    """``x``'s slices ``[start + i step, start + i step + height)`` along ``axis``, for ``i < count``: ``(count,
    *x.shape[:axis], height, *x.shape[axis + 1:])``.

    One dynamic slice, then static ones: the slice is padded to ``(count + u) step`` positions (``u`` the height in
    steps, rounded up) and split into ``(count + u, step)``, where window ``i``'s position ``r`` is ``[i + r // step,
    r % step]``. Under ``vmap``, a dynamic slice per window would be a gather, which a TPU runs slowly: the rows'
    bands of Gram planes gathered so were 0.25 of DIC 2048^2's 0.33 s there
    (benchmarks/probes/accelerator_profile.py)."""
    length = (count - 1) * step + height
    block = lax.dynamic_slice_in_dim(x, start, length, axis)
    if count == 1:
        return block[None]
    u = -(-height // step)
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, (count + u) * step - length)
    block = jnp.pad(block, widths).reshape(x.shape[:axis] + (count + u, step) + x.shape[axis + 1 :])
    parts = [
        lax.index_in_dim(lax.slice_in_dim(block, r // step, r // step + count, axis=axis), r % step, axis + 1, False)
        for r in range(height)
    ]
    return jnp.moveaxis(jnp.stack(parts, axis=axis + 1), axis, 0)


def _take_first(x: jax.Array, index: jax.Array, span: int, pixel_axis: int) -> jax.Array:
    """``x[index[j] + p, ..., j, ...]`` for ``p < span``, without a gather: ``(span, *x.shape[1:])``.

    ``x``'s first axis is the one indexed, ``pixel_axis`` holds the pixels ``j`` (``index`` is ``(Ns,)``, each
    ``index[j] + p`` within the first axis). Every position of the first axis is compared with each pixel's and
    the one kept is summed with zeros: exact, whatever the others hold (NaN and infinities included). The
    accelerators' form (:func:`napari_gridmip.core.runtime.strategy.per_pixel_gathers`)."""
    positions = jnp.arange(x.shape[0], dtype=jnp.int32)
    wanted = index.astype(jnp.int32)[None, :] + jnp.arange(span, dtype=jnp.int32)[:, None]  # (span, Ns)
    shape = [1] * (x.ndim + 1)
    shape[0], shape[1], shape[pixel_axis + 1] = span, x.shape[0], x.shape[pixel_axis]
    mask = (positions[None, :, None] == wanted[:, None, :]).reshape(shape)
    return jnp.sum(jnp.where(mask, x[None], jnp.zeros((), x.dtype)), axis=1)


def _take_block(x: jax.Array, a0: jax.Array, b0: jax.Array, span: int) -> jax.Array:
    """``x[a0[j] + p, b0[j] + q, ..., j]`` for ``p, q < span`` of ``x`` ``(A, B, ..., Ns)``, without a gather:
    ``(span, span, ..., Ns)``."""
    last = x.ndim - 1
    rows = _take_first(x, a0, span, last)  # (span, B, ..., Ns)
    both = _take_first(jnp.moveaxis(rows, 1, 0), b0, span, last)  # (span q, span p, ..., Ns)
    return jnp.swapaxes(both, 0, 1)


def _gram_matrix(block: jax.Array) -> jax.Array:
    """The 25 x 25 Gram matrices of the taps from their blocks of planes ``(5, 5, GRAM_ROWS, GRAM_COLS, Ns)``
    (tap row, tap column, row offset, column offset + 4), from static slices: ``(Ns, 25, 25)``, each entry from
    the same plane and position as ``GRAM_INDEX`` takes it (the one of a row offset > 0, or of 0 and a column
    offset >= 0), so the same values bit for bit."""
    upper = {}  # (p, p2) for p2 >= p: entries (q, q2) = block[p, q, p2 - p, q2 - q + 4]
    for p in range(5):
        for p2 in range(p, 5):
            upper[p, p2] = jnp.stack([block[p, q, p2 - p, 4 - q : 9 - q] for q in range(5)])  # (5, 5, Ns)
    triu = np.triu(np.ones((5, 5), bool))[:, :, None]
    rows = []
    for p in range(5):
        row = []
        for p2 in range(5):
            if p2 > p:
                row.append(upper[p, p2])
            elif p2 < p:
                row.append(jnp.swapaxes(upper[p2, p], 0, 1))
            else:  # (q, q2) with q2 < q from (q2, q)
                row.append(jnp.where(triu, upper[p, p], jnp.swapaxes(upper[p, p], 0, 1)))
        rows.append(jnp.concatenate(row, axis=1))
    return jnp.moveaxis(jnp.concatenate(rows, axis=0), -1, 0)


# -- one band ----------------------------------------------------------------------------------------


class _Stats(NamedTuple):
    box1: jax.Array  # img1's box sums at every subset position of the band (padded coordinates)
    inv1: jax.Array
    box2: jax.Array  # img2's at the output pixels (compact)
    inv2: jax.Array
    sq2: jax.Array  # img2's box sums of squares (compact)
    box_taps: jax.Array  # box sums of what the taps interpolate (img1, or its B-spline coefficients)


def _stats(x1, x2, bad1, bad2, plan: Plan, rows: int, c1=None) -> _Stats:
    sub, count, s = plan.subset, plan.count, plan.step
    box1, sq1 = _box(_sum_frames(x1), sub), _box(_sum_frames(x1 * x1), sub)
    inv1 = _inverse_norm(box1, sq1, None if bad1 is None else _box(bad1, sub), count)
    box2, sq2 = _box(_sum_frames(x2), sub), _box(_sum_frames(x2 * x2), sub)
    nb2 = None if bad2 is None else _box(bad2, sub)
    n = plan.window[1] // 2
    ns = plan.out[1]

    def compact(plane):
        return _strided(_strided(plane, 0, rows, s, 0), n, ns, s, 1)

    box2, sq2 = compact(box2), compact(sq2)
    inv2 = _inverse_norm(box2, sq2, None if nb2 is None else compact(nb2), count)
    return _Stats(box1, inv1, box2, inv2, sq2, box1 if c1 is None else _box(_sum_frames(c1), sub))


def _gram_planes(x1, plan: Plan, rows: int) -> jax.Array:
    """Box sums of img1 times itself shifted by ``(dp, dq)``, ``dp < 5``, ``|dq| <= 4``, at every subset
    position the band's 5 x 5 tap blocks use: ``(R, C, 5, 9)``."""
    wa, wb = plan.extended
    out_rows = (rows - 1) * plan.step + wa
    out_cols = (plan.out[1] - 1) * plan.step + wb
    shifted = jnp.pad(x1, ((0, 0), (0, 0), (GRAM_COLS // 2, 0)))
    sub = plan._replace(window=(GRAM_ROWS, GRAM_COLS), ring=(0, 0))
    if plan.at_once:
        sums = _sums_at_once(
            shifted, x1, rows=out_rows, offsets=(GRAM_ROWS, GRAM_COLS), origin=(0, 0), plan=sub, step=1, cols=out_cols
        )  # fmt: skip
        return jnp.transpose(sums, (2, 3, 0, 1))  # (R, C, 5, 9)

    def store(t, h, planes):
        row = jnp.stack(h, axis=-1)  # (5, C, 9)
        return lax.dynamic_update_slice(
            planes, jnp.moveaxis(row, 0, 1)[None], (t, jnp.int32(0), jnp.int32(0), jnp.int32(0))
        )

    planes = jnp.zeros((out_rows, out_cols, GRAM_ROWS, GRAM_COLS), x1.dtype)
    return _sweep(
        shifted, x1, rows=out_rows, offsets=(GRAM_ROWS, GRAM_COLS), origin=(0, 0), plan=sub, consume=store,
        carry=planes, step=1, cols=out_cols,
    )  # fmt: skip


def _outputs_of(plan: Plan) -> tuple[str, ...]:
    if plan.method == "map":
        return ("map",)
    return plan.track or DISPLACEMENT


class _RowView(NamedTuple):
    """What output row ``t`` reads of its band's planes. For a batch of rows (:func:`_band_rows`' ``views``), each
    field gains a leading axis of the rows, cut by :func:`_windows` rather than by a dynamic slice under ``vmap``."""

    box1: jax.Array  # img1's box sums, rows ``t s`` to ``t s + wa``: (wa, C)
    inv1: jax.Array  # their inverse norms: (wa, C)
    box2: jax.Array  # img2's at the row's output pixels: (Ns,)
    inv2: jax.Array
    sq2: jax.Array
    near: jax.Array | None  # the selects' padded planes (box1, inv1, box_taps) by phase: (s, wa + 2 reach, k, Q)
    planes: jax.Array | None  # the selects' padded Gram planes by phase: (s, wa + 4, 45, Q')


def _band_rows(plan: Plan, stats: _Stats, planes: jax.Array | None, centres: jax.Array):
    """``(row, views)`` for the main sweep. ``row(t, H, view)``: output row ``t`` from its sums ``H`` and what it
    reads of the planes, ``view``, a tuple of ``(Ns, ...)`` arrays: the map row, or the displacement row and the
    rest (:func:`_outputs_of`). ``views(t0, count)``: the :class:`_RowView` of rows ``t0`` to ``t0 + count``, each
    field with a leading axis of the rows."""
    (wm, wn), (ring_y, ring_x), s, count = plan.window, plan.ring, plan.step, plan.count
    wa, wb = plan.extended
    ns = plan.out[1]
    search = (wm > 1, wn > 1)
    dtype = stats.box1.dtype
    zero = jnp.int32(0)

    def normalise(h, view):
        """Correlations ``r[b][a, j]`` of the window's offsets (the ring left out) at the view's output row."""
        b1, i1, b2, i2 = view.box1, view.inv1, view.box2 / count, view.inv2
        out = []
        for b in range(ring_x, ring_x + wn):
            cb1 = _strided(b1[ring_y : ring_y + wm], b, ns, s, 1)
            ci1 = _strided(i1[ring_y : ring_y + wm], b, ns, s, 1)
            if plan.spline:  # img1's cross sums from its B-spline coefficients': (1, 4, 1) / 6 both ways
                hb = (h[b - 1] + 4 * h[b] + h[b + 1]) / 6
                cross = (hb[ring_y - 1 : ring_y - 1 + wm] + 4 * hb[ring_y : ring_y + wm]
                         + hb[ring_y + 1 : ring_y + 1 + wm]) / 6  # fmt: skip
            else:
                cross = h[b][ring_y : ring_y + wm]
            out.append((cross - cb1 * b2) * ci1 * i2)
        return out

    reach = 2 if plan.gram else 1
    span = 2 * reach + 1
    near = padded_planes = None
    if not plan.gathers and plan.method != "map":  # made once a band: the planes the blocks come from
        # the image's columns last, everywhere below: a TPU lays an array's last axis along its 128 lanes, and a
        # last axis of 3 (the planes side by side) or 9 (the Gram planes' column offsets) left most of them
        # empty: DIC 2048^2 took 0.98 s so, 0.86 s with the gathers (benchmarks/probes/accelerator_profile.py)
        # edge-padded by the reach: a position off the plane reads its edge, as the gathers' clipped index does
        stacked = jnp.stack([stats.box1, stats.inv1] + ([stats.box_taps] if plan.gram else []))
        near = jnp.pad(stacked, ((0, 0), (reach, reach), (reach, reach)), mode="edge")  # (k, R + 2r, C + 2r)
        near = _by_phase(near, s, wb + 2 * reach, ns)  # (s, R + 2r, k, Q)
        # zeros, never read: each Gram block's start is clipped into the planes; (s, R + 4, 45, Q')
        if plan.gram:
            padded_planes = jnp.pad(jnp.transpose(planes, (2, 3, 0, 1)), ((0, 0), (0, 0), (2, 2), (2, 2)))
            padded_planes = _by_phase(padded_planes.reshape(GRAM_ROWS * GRAM_COLS, *padded_planes.shape[2:]), s,
                                      wb + 4, ns)  # fmt: skip

    def views(t0, n):
        """The :class:`_RowView` of output rows ``t0`` to ``t0 + n``, each field ``(n, ...)``."""
        return _RowView(
            _windows(stats.box1, t0 * s, n, s, wa, 0),
            _windows(stats.inv1, t0 * s, n, s, wa, 0),
            *(lax.dynamic_slice_in_dim(x, t0, n, axis=0) for x in (stats.box2, stats.inv2, stats.sq2)),
            None if near is None else _windows(near, t0 * s, n, s, wa + 2 * reach, 1),  # (n, s, wa + 2r, k, Q)
            None if padded_planes is None else _windows(padded_planes, t0 * s, n, s, wa + 4, 1),
        )

    if plan.method == "map":

        def map_row(t, h, view):
            r = jnp.stack(normalise(h, view))  # (wn, wm, Ns)
            return (jnp.transpose(r, (2, 1, 0)),)  # (Ns, wm, wn)

        return map_row, views

    columns = jnp.arange(ns, dtype=jnp.int32) * s  # each output pixel's first column

    def blocks_at(t, h, ae, be, view):
        """Each pixel's ``span x span`` block around its extended offset ``(ae, be)``: of the raw cross sums, of
        img1's box sums and inverse norms, and (``plan.gram``) of the box sums of what the taps interpolate."""
        if plan.gathers:
            offs = jnp.arange(span, dtype=jnp.int32) - reach
            rows = jnp.clip(t * s + ae[None, None, :] + offs[:, None, None], 0, stats.box1.shape[0] - 1)
            cols = jnp.clip(columns[None, None, :] + be[None, None, :] + offs[None, :, None], 0,
                            stats.box1.shape[1] - 1)  # fmt: skip
            taps = stats.box_taps[rows, cols] if plan.gram else None
            return _block(h, ae, be, reach), stats.box1[rows, cols], stats.inv1[rows, cols], taps
        cross = jnp.pad(jnp.stack(h, axis=1), ((reach, reach), (reach, reach), (0, 0)), mode="edge")
        band = view.near  # (s, wa + 2r, k, Q)
        # the pixels' neighbourhoods: (wa + 2r, wb + 2r, k, Ns), one static slice per column offset
        hood = jnp.stack([_at_phase(band, c, s, ns) for c in range(wb + 2 * reach)], axis=1)
        picked = _take_block(hood, ae, be, span)  # (span, span, k, Ns)
        return (_take_block(cross, ae, be, span), picked[:, :, 0], picked[:, :, 1],
                picked[:, :, 2] if plan.gram else None)  # fmt: skip

    def gram_at(t, ae, be, view):
        """Each pixel's 25 x 25 Gram matrix of its tap block around ``(ae, be)``: ``(Ns, 25, 25)``."""
        # each pixel's block of Gram planes: rows and columns of its tap (0, 0), clipped into the planes
        top = jnp.clip(t * s + ae - 2, 0, planes.shape[0] - 5)
        left = jnp.clip(columns + be - 2, 0, planes.shape[1] - 5)
        if plan.gathers:
            take = jax.vmap(
                lambda r0, c0: lax.dynamic_slice(planes, (r0, c0, zero, zero), (5, 5, GRAM_ROWS, GRAM_COLS))
            )
            blocks = take(top, left).reshape(ns, -1)
            return jnp.take(blocks, jnp.asarray(GRAM_INDEX), axis=1).reshape(ns, 25, 25)
        # the rows of each pixel's block from a band of padded planes, one column offset at a time (the whole
        # neighbourhood of every pixel at once would be (wa + 4) (wb + 4) 45 values a pixel)
        a0, b0 = top - t * s + 2, left - columns + 2  # in the band, from the padded planes' first row and column
        band = view.planes  # (s, wa + 4, 45, Q')
        block = jnp.zeros((5, 5, GRAM_ROWS * GRAM_COLS, ns), dtype)
        for c in range(wb + 4):
            rows = _take_first(_at_phase(band, c, s, ns), a0, 5, 2)  # (5, 45, Ns)
            hit = (b0[None, :] + jnp.arange(5, dtype=jnp.int32)[:, None]) == c  # (5, Ns): tap column q is here
            block = block + jnp.where(hit[None, :, None, :], rows[:, None], jnp.zeros((), dtype))
        return _gram_matrix(block.reshape(5, 5, GRAM_ROWS, GRAM_COLS, ns))

    def row(t, h, view):
        r = normalise(h, view)
        peak, a0, b0 = _argmax(r)
        edge = ~jnp.isfinite(peak)
        if wm > 1:
            edge = edge | (a0 == 0) | (a0 == wm - 1)
        if wn > 1:
            edge = edge | (b0 == 0) | (b0 == wn - 1)
        ae, be = a0 + ring_y, b0 + ring_x  # extended offsets
        cross, mean1, inv1, mean_taps = blocks_at(t, h, ae, be, view)  # (span, span, Ns) each
        b2, i2 = view.box2, view.inv2
        centre = slice(reach - 1, reach + 2)
        if plan.spline:  # the integer map's 3x3 from the coefficients' 5x5
            one = jnp.asarray([1.0, 4.0, 1.0], dtype) / 6
            rows3 = sum(one[d] * cross[d : d + 3] for d in range(3))
            cross3 = sum(one[d] * rows3[:, d : d + 3] for d in range(3))
        else:
            cross3 = cross[centre, centre]
        r3 = (cross3 - mean1[centre, centre] * b2 / count) * inv1[centre, centre] * i2
        method = "hessian" if plan.method == "refine" else plan.method
        sub_y, sub_x = subpixel_offset(jnp.moveaxis(r3, -1, 0), method)
        if not search[0]:
            sub_y = jnp.zeros_like(sub_y)
        if not search[1]:
            sub_x = jnp.zeros_like(sub_x)
        results = {"peak": jnp.where(jnp.isfinite(peak), peak, jnp.nan)}
        if plan.gram:
            py = ae.astype(dtype) + jnp.clip(sub_y, -REACH, REACH)
            px = be.astype(dtype) + jnp.clip(sub_x, -REACH, REACH)
            gram = gram_at(t, ae, be, view)
            cross25 = jnp.moveaxis(cross, -1, 0).reshape(ns, 25)
            mean25 = jnp.moveaxis(mean_taps, -1, 0).reshape(ns, 25)
            aef, bef = ae.astype(dtype), be.astype(dtype)

            taps = tap_sums(cross25, mean25, gram, i2, b2, count)

            def at(py, px):
                return interpolated(taps, py, px, aef, bef, sums=bool(plan.track), kind=plan.interpolation)

            tolerance = TOLERANCE[np.dtype(dtype)]

            def keep_going(c):
                k, _, _, _, moved = c
                return (k < MAX_ITERATIONS) & moved

            def newton(c):
                k, py, px, _, _ = c
                f = at(py, px)
                sy, sx = newton_step(f, search)
                moved = jnp.max(jnp.maximum(jnp.abs(sy), jnp.abs(sx))) >= tolerance
                # converged: stay where ``f`` was evaluated, so that the fit below uses it as it is
                py = jnp.where(moved, jnp.clip(py + sy, aef - REACH, aef + REACH), py)
                px = jnp.where(moved, jnp.clip(px + sx, bef - REACH, bef + REACH), px)
                return k + 1, py, px, f, moved

            # one copy of the interpolation's code in the program: Newton steps until the row's largest is
            # below ``tolerance`` (at most MAX_ITERATIONS), or for the other methods a single evaluation there
            start = (jnp.int32(0), py, px, nothing(py), jnp.array(True))
            if plan.method == "refine":
                _, py, px, f, _ = lax.while_loop(keep_going, newton, start)
            elif plan.track:
                f = at(py, px)
            sub_y, sub_x = py - aef, px - bef
            if plan.track:
                sum_r, sum_rr, sum_sr = f.sums
                sum_s, sum_ss = b2, view.sq2
                var_r = sum_rr - sum_r * sum_r / count
                cov = sum_sr - sum_r * sum_s / count
                var_s = sum_ss - sum_s * sum_s / count
                ok = var_r > ZERO_VARIANCE[np.dtype(dtype)] * sum_rr
                beta = jnp.where(ok, cov / jnp.where(ok, var_r, 1), jnp.nan)
                intercept = (sum_s - beta * sum_r) / count
                mean_ref, mean_sample = centres[0], centres[1]
                transmission = (intercept + mean_sample) / mean_ref
                rss = jnp.maximum(var_s - beta * cov, 0)
                sigma_y, sigma_x = uncertainty(f, count, search, plan.noise_gain)
                nan = jnp.nan
                results["transmission"] = jnp.where(edge, nan, transmission)
                results["dark_field"] = jnp.where(edge, nan, beta / transmission)
                results["residual"] = jnp.where(edge, nan, jnp.sqrt(rss / count))
                results["sigma_dy"] = jnp.where(edge, nan, sigma_y)
                results["sigma_dx"] = jnp.where(edge, nan, sigma_x)
        nan = jnp.array(jnp.nan, dtype)
        results["dy"] = jnp.where(edge, nan, (a0 - wm // 2).astype(dtype) + sub_y)
        results["dx"] = jnp.where(edge, nan, (b0 - wn // 2).astype(dtype) + sub_x)
        return tuple(results[name].astype(dtype) for name in _outputs_of(plan))

    return row, views


@kept(static_argnames=("plan", "rows"))
def _band(x1, x2, bad1, bad2, centres, start, c1=None, *, plan: Plan, rows: int):
    """Output rows ``[start, start + rows)`` (compact) of every item: a tuple of ``(B, rows, Ns, ...)`` arrays.

    ``x1``: img1 centred and edge-padded by ``plan.pad``, ``(B, K, M + ..., N + ...)``; ``x2``: img2 centred,
    ``(B, K, M, N + s)``; ``bad1``/``bad2``: counts of non-finite values per pixel (or None); ``centres``:
    ``(B, 2)`` the means subtracted from img1 and img2; ``c1``: img1's B-spline coefficients, laid out as
    ``x1`` (``plan.spline``).
    """
    (wm, wn), sh, s = plan.window, plan.subset[0], plan.step
    wa, wb = plan.extended
    m, n = wm // 2, wn // 2
    ns = plan.out[1]
    rows1 = (rows - 1) * s + wa + sh - 1 + (GRAM_ROWS - 1 if plan.gram else 0)
    rows2 = (rows - 1) * s + sh
    batch = x1.shape[0]
    zero = jnp.int32(0)
    y0 = start * s
    names = _outputs_of(plan)
    if plan.method == "map":
        empty = (jnp.zeros((batch, rows, ns, wm, wn), x1.dtype),)
    else:
        empty = tuple(jnp.zeros((batch, rows, ns), x1.dtype) for _ in names)

    def one_item(item, outs):
        item = item.astype(jnp.int32)
        a = lax.dynamic_slice(x1, (item, zero, y0, zero), (1,) + (x1.shape[1], rows1, x1.shape[3]))[0]
        b = lax.dynamic_slice(x2, (item, zero, y0 + m, zero), (1,) + (x2.shape[1], rows2, x2.shape[3]))[0]
        ba = None if bad1 is None else lax.dynamic_slice(bad1, (item, y0, zero), (1, rows1, bad1.shape[2]))[0]
        bb = None if bad2 is None else lax.dynamic_slice(bad2, (item, y0 + m, zero), (1, rows2, bad2.shape[2]))[0]
        coeffs = None
        if plan.spline:
            coeffs = lax.dynamic_slice(c1, (item, zero, y0, zero), (1,) + (c1.shape[1], rows1, c1.shape[3]))[0]
        stats = _stats(a, b, ba, bb, plan, rows, coeffs)
        swept = a if coeffs is None else coeffs  # what the taps interpolate
        planes = _gram_planes(swept, plan, rows) if plan.gram else None
        row, views = _band_rows(plan, stats, planes, centres[item])
        if plan.at_once:
            sums = _sums_at_once(swept, b, rows=rows, offsets=(wa, wb), origin=(0, n), plan=plan)
            sums = jnp.moveaxis(sums, 2, 0)  # (rows, wa, wb, Ns)
            # in batches of rows: each row's intermediates (its 5 x 5 Gram blocks: 2.3 MB at 512 output
            # columns) and what it reads of the planes, times the batch, stay far within the device's memory
            one_view = jax.eval_shape(lambda t0: views(t0, 1), jnp.int32(0))  # its shapes, not a computation
            per_row = sum(v.size * np.dtype(v.dtype).itemsize for v in jax.tree.leaves(one_view))
            most = max(1, min(rows, ROW_BATCH, ROW_VIEW_BYTES // per_row))
            size = -(-rows // -(-rows // most))  # balanced: 65 rows in 2 batches of 33, not 64 and 64 (1 row again)
            # the last batch ends at the last row (its first rows computed twice, the same values): static shapes
            starts = np.minimum(np.arange(0, rows, size), rows - size).astype(np.int32)

            def one_batch(t0):
                rows_h = lax.dynamic_slice_in_dim(sums, t0, size, axis=0)
                return jax.vmap(lambda t, h, view: row(t, tuple(h[:, q] for q in range(wb)), view))(
                    t0 + jnp.arange(size, dtype=jnp.int32), rows_h, views(t0, size)
                )

            batches = lax.map(one_batch, jnp.asarray(starts))  # each (batches, size, ...)
            new = rows - (len(starts) - 1) * size  # rows of the last batch that the others did not compute
            result = tuple(
                jnp.concatenate([r[:-1].reshape(-1, *r.shape[2:]), r[-1, size - new :]]) if len(starts) > 1 else r[0]
                for r in batches
            )
        else:
            shape = (rows, ns, wm, wn) if plan.method == "map" else (rows, ns)
            carry = tuple(jnp.zeros(shape, x1.dtype) for _ in names)

            def consume(t, h, out):
                return tuple(
                    lax.dynamic_update_slice(o, r[None], (t,) + (zero,) * (o.ndim - 1))
                    for o, r in zip(out, row(t, h, jax.tree.map(lambda v: v[0], views(t, 1))))
                )

            result = _sweep(
                swept, b, rows=rows, offsets=(wa, wb), origin=(0, n), plan=plan, consume=consume, carry=carry
            )  # fmt: skip
        return tuple(
            lax.dynamic_update_slice(o, r[None], (item,) + (zero,) * (o.ndim - 1)) for o, r in zip(outs, result)
        )

    return lax.fori_loop(0, batch, one_item, empty)


# -- preparation and drivers -------------------------------------------------------------------------


def subset_map(img1, img2, window, subset, step, *, dtype, offsets_first, progress):
    """:func:`windowed_pearson` with a subset or a step (checked and dispatched here)."""
    shape, window = check_pair(img1, img2, window, subset)
    dtype = check_dtypes({"img1": img1, "img2": img2}, dtype)
    offsets_first = validate.check_bool("offsets_first", offsets_first)
    if validate.is_dask(img1) or validate.is_dask(img2):
        from napari_gridmip.core.correlation import _chunked  # the dask twin: dask.array takes 0.5 s to import

        kernel = partial(run, window=window, subset=subset, step=step, method="map", track=(), dtype=dtype)
        return _chunked.subset_map(img1, img2, window, subset, step, dtype, kernel, offsets_first=offsets_first)
    (out,) = run(img1, img2, window, subset, step, method="map", track=(), dtype=dtype, progress=progress)
    if not offsets_first:
        return out
    # in the call's precision and on its device: outside the scope, a float64 map would be moved to the default
    # device with x64 off, and narrowed to float32 (a TPU, where float64 calls run on the host)
    with precision_scope(dtype):
        return _offsets_first(out)


@jax.jit
def _offsets_first(full_map: jax.Array) -> jax.Array:
    return jnp.moveaxis(full_map, (-2, -1), (-4, -3))


def subset_displacement(img1, img2, window, subset, step, *, subpixel, dtype, progress, prefilter, shape):
    """:func:`find_displacement` with a subset or a step: ``(dy, dx, peak)``, or with ``shape="affine"`` also
    the four gradients. ``prefilter``: the option as given (``"auto"``:
    :data:`~napari_gridmip.core.correlation.prefilter.DEFAULT_SIGMA` for ``"refine"`` and ``"affine"``)."""
    _, window = check_pair(img1, img2, window, subset)
    subpixel = validate.check_choice("subpixel", subpixel, SUBPIXEL_METHODS)
    shape = check_shape(shape)
    if shape == "affine":
        if subset == (1, 1):
            raise ValueError("shape='affine' needs a subset larger than (1, 1): a subset's warp is what it fits")
        if subpixel != "refine":
            raise ValueError(
                f"shape='affine' starts from subpixel='refine' (its only sub-pixel method); got {subpixel!r}"
            )
    sigma = check_prefilter(prefilter, default=DEFAULT_SIGMA if subpixel == "refine" else 0.0)
    dtype = check_dtypes({"img1": img1, "img2": img2}, dtype)
    if validate.is_dask(img1) or validate.is_dask(img2):
        from napari_gridmip.core.correlation import _chunked  # the dask twin: dask.array takes 0.5 s to import

        kernel = partial(
            run, window=window, subset=subset, step=step, method=subpixel, track=(), dtype=dtype,
            prefilter=sigma, subset_shape=shape,
        )  # fmt: skip
        return _chunked.subset_displacement(
            img1, img2, window, subset, step, subpixel, dtype, kernel, prefilter=sigma, shape=shape,
            reach=DASK_REACH,
        )  # fmt: skip
    return run(
        img1, img2, window, subset, step, method=subpixel, track=(), dtype=dtype, progress=progress,
        prefilter=sigma, subset_shape=shape,
    )  # fmt: skip


def _is_traced(img: Any) -> bool:
    return isinstance(img, jax.core.Tracer)


def _centre_of(img: Any) -> Any:
    """Each batch item's mean over its finite values (K, M and N): ``(B,)``.

    NumPy data: float64 (exact enough whatever the data). A JAX array: in its own float precision (float32
    unless x64 is on), on the device, so that a caller's ``jax.jit`` can trace it; the mean is only the
    reference subtracted before the sums, and the same value is used wherever it enters (the transmission).
    """
    shape = validate.shape_of(img)
    lead = (-1,) + tuple(shape[-3:])
    if isinstance(img, jax.Array):
        flat = img.reshape(lead)
        x = flat if validate.is_float(np.dtype(flat.dtype)) else flat.astype(jnp.result_type(float))
        x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
        return jnp.nanmean(jnp.where(jnp.isfinite(x), x, jnp.nan), axis=(1, 2, 3))
    flat = np.asarray(img).reshape(lead)
    if validate.is_float(flat.dtype):
        finite = np.isfinite(flat)
        total = np.where(finite, flat, 0).sum(axis=(1, 2, 3), dtype=np.float64)
        return total / np.maximum(finite.sum(axis=(1, 2, 3)), 1)
    return flat.mean(axis=(1, 2, 3), dtype=np.float64)


def _centred(img: Any, centre: Any, dtype: np.dtype) -> jax.Array:
    """``img - centre`` (per batch item) as a ``(B, K, M, N)`` ``dtype`` array on the device.

    The subtraction runs in the input's own precision when that is at least ``dtype``'s (float64 data
    computed in float32 keeps its variations), else in ``dtype``.
    """
    source = validate.dtype_of(img)
    shape = validate.shape_of(img)
    wide_enough = source in (np.dtype(np.float32), np.dtype(np.float64)) and source.itemsize >= dtype.itemsize
    work = source if wide_enough else dtype
    lead = (-1,) + tuple(shape[-3:])
    if isinstance(img, jax.Array):
        with precision_scope(work):
            x = img.reshape(lead).astype(work) - jnp.asarray(centre).astype(work)[:, None, None, None]
            return x.astype(dtype)
    host = np.asarray(img).reshape(lead)
    buffer = aligned_empty(host.shape, dtype)
    centre = np.asarray(centre, np.float64).astype(work)[:, None, None, None]
    np.subtract(host.astype(work, copy=False), centre, out=buffer, casting="unsafe")
    return owned_to_device(buffer)


def _spline_filter_axis(x: jax.Array, axis: int) -> jax.Array:
    """The cubic B-spline prefilter along ``axis``, as the FIR ``sqrt(3) z**|k|``, ``z = sqrt(3) - 2``,
    ``|k| <= SPLINE_REACH`` (its impulse response, exact to 5e-15), on ``x`` extended by edge values."""
    z = math.sqrt(3) - 2
    taps = [math.sqrt(3) * z ** abs(k) for k in range(-SPLINE_REACH, SPLINE_REACH + 1)]
    return fir_along(x, taps, axis, mode="edge")


@jax.jit
def _spline_coefficients(x: jax.Array) -> jax.Array:
    """Cubic B-spline coefficients ``c`` of every frame of ``x`` (last two axes): ``x`` is their sum with
    weights (1, 4, 1) / 6 along each axis, so the spline through ``c`` interpolates ``x``. Beyond the edges
    ``x`` is extended by its edge values (as the search pads img1)."""
    return _spline_filter_axis(_spline_filter_axis(x, x.ndim - 2), x.ndim - 1)


@kept(static_argnames=("sigma", "pad1", "pad2", "bad", "spline", "unpadded"))
def _prepared(x1, x2, *, sigma, pad1, pad2, bad, spline, unpadded):
    """The band program's inputs from both centred stacks, in one program (one compile on a first call where
    the prefilter, the padding and the spline coefficients were three, about 0.1 s each: bench_first_run.py):
    ``(smoothed stacks or None, (x1, bad1, x2, bad2) as :func:`_finish` gives them, img1's B-spline
    coefficients or None)``. ``sigma``: the Gaussian prefilter's (0: none); ``unpadded``: return the smoothed,
    unpadded stacks too (the affine IC-GN starts from them)."""
    if sigma > 0:
        x1, x2 = smooth_frames(x1, sigma=sigma), smooth_frames(x2, sigma=sigma)
    padded = _finish(x1, x2, pad1=pad1, pad2=pad2, bad=bad)
    coefficients = _spline_coefficients(padded[0]) if spline else None
    return ((x1, x2) if unpadded else None), padded, coefficients


def _finish(x1, x2, *, pad1, pad2, bad):
    """Zero the non-finite values (counting them per pixel if ``bad``), and edge-pad img1 and img2 (a step of
    :func:`_prepared`'s program)."""
    out = []
    for x, (before, after) in ((x1, pad1), (x2, pad2)):
        widths = ((0, 0), (0, 0), (before[0], after[0]), (before[1], after[1]))
        if bad:
            finite = jnp.isfinite(x)
            count = jnp.pad(jnp.sum(~finite, axis=1, dtype=x.dtype), widths[:1] + widths[2:], mode="edge")
            x = jnp.where(finite, x, 0)
        out.append(jnp.pad(x, widths, mode="edge"))
        out.append(count if bad else None)
    return tuple(out)


def _compile_band_ahead(prepare: Any, x1: Any, x2: Any, centres: Any, *, plan: Plan, rows: int, dtype: Any
                        ) -> threading.Thread | None:  # fmt: skip
    """Compile the band program (:func:`_band`) for the inputs ``prepare`` (:func:`_prepared`, its options
    bound) will make of ``x1``, ``x2``, in a thread, while the caller compiles and runs ``prepare``: a first
    call then waits for the longer of the two compiles, not their sum (XLA's compile releases the GIL; JAX's
    ahead-of-time compile fills the cache the band's own call reads). Once per process and program; None where
    nothing is started: traced inputs, 64-bit work (its scope is the caller's thread's), or a program already
    made. The thread lowers on the caller's default device."""
    if is_wide(dtype) or any(_is_traced(a) for a in (x1, x2, centres)):
        return None
    # the inputs and options decide the band program: known before any tracing (a next call traces nothing)
    inputs = tuple((tuple(a.shape), np.dtype(a.dtype)) for a in (x1, x2))
    key = ("subsets", plan, rows, tuple(sorted(prepare.keywords.items())), inputs, jax.typeof(centres))

    def shapes() -> Any:  # the band's inputs' shapes, in this thread; the band traced and compiled in the other
        # from _prepared's kept executable where there is one (a later process: nothing traced), else traced
        kept_shapes = _prepared.out_info(x1, x2, **prepare.keywords)
        _, (a1, b1, a2, b2), coefficients = kept_shapes or jax.eval_shape(prepare, x1, x2)
        start = jax.ShapeDtypeStruct((), np.int32)
        band = (a1, a2, b1, b2, centres, start, coefficients)

        def compile_band() -> None:  # the kept executable loaded, or compiled and kept; else JAX's AOT compile
            if _band.executable(*band, plan=plan, rows=rows) is None:
                _band.lower(*band, plan=plan, rows=rows).compile()

        return (compile_band,)

    return compile_ahead_once(key, shapes, name="napari-gridmip band program compile")


def _has_nonfinite(img: Any) -> bool:
    """Whether a float stack holds NaN or infinity (a traced one is assumed to: that path is always right)."""
    dtype = validate.dtype_of(img)
    if not validate.is_float(dtype):
        return False
    if _is_traced(img):
        return True
    if isinstance(img, jax.Array):
        return not bool(jnp.isfinite(img).all())
    return not bool(np.isfinite(np.asarray(img)).all())


def _band_plan(plan: Plan, dtype: np.dtype, *, devices: int = 1) -> tuple[int, list[int]]:
    """(rows per band, band starts): at most ``MAX_BANDS`` bands, fewer rows where the Gram planes or the map
    would be large, or where ``devices`` devices would otherwise have fewer bands than devices
    (:func:`napari_gridmip.core.runtime.sharding.spread_rows`); the last band ends flush with the output."""
    out_rows, out_cols = plan.out
    rows = -(-out_rows // MAX_BANDS)
    itemsize = np.dtype(dtype).itemsize
    if plan.gram:
        cols = (out_cols - 1) * plan.step + plan.extended[1]
        per_row = cols * GRAM_ROWS * GRAM_COLS * itemsize * plan.step
        rows = min(rows, max(1, (DEVICE_GRAM_BAND_BYTES if plan.at_once else GRAM_BAND_BYTES) // per_row))
    if plan.method == "map":
        per_row = out_cols * plan.window[0] * plan.window[1] * itemsize
        rows = min(rows, max(1, MAP_BAND_BYTES // per_row))
    rows = max(1, min(spread_rows(rows, out_rows, devices), out_rows))
    return rows, band_starts(rows, out_rows)


def run(img1, img2, window, subset, step, *, method, track, dtype, progress=None, centres=None,
        interpolation="bspline", prefilter=0.0, subset_shape="translation", negate=()):  # fmt: skip
    """Run the subset kernel on in-memory stacks; a tuple of ``(..., rows, cols[, wm, wn])`` arrays
    (see :func:`_outputs_of`). ``track``: the tracking outputs to return, by name and in that order (the caller's
    result type, :data:`.tracking.TRACK_OUTPUTS`, holds the list); empty: the ``"map"``, or the search's
    :data:`DISPLACEMENT`. ``centres``: the ``(B, 2)`` means to subtract (default: each item's own);
    ``interpolation``: of img1 for the refinement and the fit, ``"bspline"`` or (for comparison) ``"keys"``;
    ``prefilter``: the standard deviation (px) of the Gaussian both stacks are smoothed by first (0: none);
    ``subset_shape="affine"``: then IC-GN from the translation's result (:mod:`.affine`), giving ``(dy, dx, zncc, dy_y,
    dy_x, dx_y, dx_x)``; ``negate``: the outputs (by position) to return negated; ``progress(done, total)``: called
    before each band (the search's, then with ``"affine"`` the IC-GN's, ``total`` counting both) and once at the
    end, and may raise to stop the call between bands.

    Notes
    -----
    For stacks ``img1``, ``img2`` of shape ``(..., K, M, N)``, an odd window ``(wm, wn) = (2m + 1, 2n + 1)``, an
    odd subset ``(sh, sw) = (2hs + 1, 2hw + 1)`` and a step ``s``, output pixel ``(i, j)`` is img2's pixel
    ``(y, x) = (i s + m + hs, j s + n + hw)``; its vector is ``img2[..., :, y - hs : y + hs + 1, x - hw : x + hw + 1]``
    (``K sh sw`` values), correlated with img1's vector around ``(y + a - m, x + b - n)`` for every offset
    ``(a, b)`` of the window. ``img1[y + dy, x + dx]`` matches ``img2[y, x]``, as for the dense correlation.
    The output has ``ceil(Mo / s)`` rows, ``Mo = M - 2m - 2hs`` (and the same for the columns): the same margin on
    both sides, grown by the subset's half-size; with a step it is the dense output subsampled, ``[::s, ::s]``.

    How (fast normalised cross-correlation): per offset, the K-summed product of the two images is box-summed
    over the subset. The box sums run down the image as running sums carried by a loop over output rows (each
    row adds the ``s`` rows entering the subsets and removes the ``s`` leaving them: O(1) per value and offset,
    whatever the subset), and along a row as a direct sum of ``sw`` shifted slices. The means and norms come from
    box sums of each image and its square. No ``K x subset x window`` array is built: the loop holds one output
    row's sums for every offset (``wm wn`` rows of ``N`` values). Each image has its global mean (over its
    finite values, computed in float64) subtracted in its own precision first, so that the raw sums do not
    cancel catastrophically; a subset whose variance falls below ``ZERO_VARIANCE`` of its mean square (about
    the global mean) counts as constant and correlates as 0. A non-finite value is set to 0 for the sums and
    poisons, through a box count of non-finite values, exactly the correlations whose vectors hold it.

    Sub-pixel refinement without subset loops: img1's cubic B-spline interpolation at a fractional offset is a
    weighted sum of the 16 integer-offset vectors of its spline coefficients around it, so its correlation with
    img2's vector needs only the coefficients' cross sums with img2 (the sweep runs on the coefficients, and
    img1's own integer map is recovered from them exactly: img1 is their (1, 4, 1) / 6 sum along each axis),
    their box sums, and the Gram matrix of their vectors over a 5 x 5 block of offsets: box sums of the
    coefficients times themselves shifted by up to 4 pixels (45 planes, computed once per band by the same
    running sums). Newton's method then maximises the interpolated correlation in closed form, and the same
    sums give UMPA's transmission and dark-field fit and the displacement's uncertainty. (Keys' cubic
    convolution, which the dense refinement uses, works the same way on img1 itself, but leaves a systematic
    error of up to 0.02 px on DIC speckle against 0.002 px for the spline: ``benchmarks/bench_dic.py``.)

    References
    ----------
    J. P. Lewis, "Fast normalized cross-correlation", Vision Interface (1995).
    B. Pan, H. Xie, Z. Wang, "Equivalence of digital image correlation criteria for pattern matching",
    Appl. Opt. 49(28), 5501-5509 (2010).
    M.-C. Zdora et al., "X-ray phase-contrast imaging and metrology through unified modulated pattern analysis",
    Phys. Rev. Lett. 118, 203903 (2017).
    H. W. Schreier, J. R. Braasch, M. A. Sutton, "Systematic errors in digital image correlation caused by
    intensity interpolation", Opt. Eng. 39(11), 2915-2921 (2000).
    M. Unser, "Splines: a perfect fit for signal and image processing", IEEE Signal Process. Mag. 16(6), 22-38
    (1999).
    """
    shape = validate.shape_of(img1)
    batch = shape[:-3]
    k, rows, cols = shape[-3:]
    track = tuple(track)
    if subset_shape == "affine" and not track:
        # IC-GN corrects any sub-pixel start: the Hessian step's search costs 0.3 s at 1024^2 (subset 31, step
        # 4), the refinement 0.8 s, for the same IC-GN iterations
        method = "hessian"
    gram = bool(track) or method == "refine"
    has_bad = _has_nonfinite(img1) or _has_nonfinite(img2)
    # a 5 x 5 tap block around every non-edge peak: one more offset each side (two along a 1-wide window)
    ring = tuple((2 if w == 1 else 1) if gram else 0 for w in window)
    with precision_scope(dtype):
        # inside the scope: a float64 call on a TPU runs on the host, with the CPU's strategy
        # (core.runtime.strategy.on_cpu)
        plan = Plan(
            k, (rows, cols), window, subset, step, ring, gram, method, track, has_bad, interpolation,
            noise_gain(prefilter), _backend.subset_row_sums(subset[0]), _backend.per_pixel_gathers(),
        )  # fmt: skip
        if centres is None:
            centres = [_centre_of(img1), _centre_of(img2)]
        else:
            centres = np.asarray(centres, np.float64).reshape(-1, 2).T
        x1, x2 = _centred(img1, centres[0], dtype), _centred(img2, centres[1], dtype)
        devices = band_devices()  # every local device of the call's platform (core.runtime.sharding)
        band, starts = _band_plan(plan, dtype, devices=len(devices))
        if any(isinstance(c, jax.Array) for c in centres):
            device_centres = jnp.stack([jnp.asarray(c).astype(dtype) for c in centres], axis=1)
        else:  # on the host: three eager device ops were three more programs to compile on a first call
            device_centres = jnp.asarray(np.stack([np.asarray(c, np.float64) for c in centres], axis=1).astype(dtype))
        # the prefilter after centring: the filter's sums then see small values (its weights sum to 1)
        prepare = partial(_prepared, sigma=float(prefilter), pad1=plan.pad, pad2=((0, 0), (0, step)), bad=has_bad,
                          spline=plan.spline, unpadded=subset_shape == "affine")  # fmt: skip
        ahead = None  # on several devices the band program runs inside the sharded one, compiled with it
        if len(devices) == 1:
            ahead = _compile_band_ahead(prepare, x1, x2, device_centres, plan=plan, rows=band, dtype=dtype)
        ic_gn_ahead = None
        if subset_shape == "affine":  # the IC-GN's stacks are the centred ones, smoothed, not padded: their shapes
            ic_gn_ahead = compile_ahead(x1, x2, plan.out, dtype, window=window, subset=subset, step=step,
                                        prefilter=prefilter, coefficients=_spline_coefficients)  # fmt: skip
        unpadded, (x1, bad1, x2, bad2), coefficients = prepare(x1, x2)
        if ahead is not None:  # the band program made beside the inputs' (not compiled twice at once)
            ahead.join()
        affine_bands = 0
        if subset_shape == "affine":
            affine_bands = unpadded[0].shape[0] * len(affine_plan(plan.out, subset, k)[1])
        total = len(starts) + affine_bands  # the search's bands, then (affine) the IC-GN's
        pieces = run_bands(
            _band, (x1, x2, bad1, bad2, device_centres, coefficients), starts, row_arg=5,
            static=dict(plan=plan, rows=band), devices=devices,
            progress=None if progress is None else lambda done: progress(done, total),
        )  # fmt: skip
        keep = kept_rows(starts, band)
        if subset_shape != "affine":
            if progress is not None:
                progress(total, total)
            return join_bands(pieces, keep=keep, batch=batch, negate=negate)
        parts = join_bands(pieces, keep=keep)

        def on_band(done: int) -> None:
            if progress is not None:
                progress(len(starts) + done, total)

        if ic_gn_ahead is not None:  # its programs made beside the search's (not compiled twice at once)
            ic_gn_ahead.join()
        parts = affine_refine(
            *unpadded, _spline_coefficients, parts[0], parts[1], window=window, subset=subset, step=step,
            batch=batch, prefilter=prefilter, on_band=on_band,
        )  # fmt: skip
        if progress is not None:
            progress(total, total)
        return parts
