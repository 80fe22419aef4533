"""Windowed Pearson correlation maps between two K-frame stacks, and the displacement read off their peaks.

``out[..., i, j, a, b] = pearson(img1[..., :, i + a, j + b], img2[..., :, i + m, j + n])`` over the K frames, and
``img1[y + dy, x + dx]`` matches ``img2[y, x]``: if ``img1 = scipy.ndimage.shift(img2, (1.3, -0.7))``, ``dy`` is
about 1.3 and ``dx`` about -0.7. No ``K x window x image`` array is ever built.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from napari_gridmip.core import validate
from napari_gridmip.core.correlation import subsets
from napari_gridmip.core.correlation._bands import join_bands, kept_rows
from napari_gridmip.core.correlation._checks import check_dtypes, check_pair, check_subset
from napari_gridmip.core.correlation.prefilter import check_prefilter, smooth_frames
from napari_gridmip.core.correlation.refine import refine_displacement, refine_plan
from napari_gridmip.core.options import SUBPIXEL_METHODS
from napari_gridmip.core.peak import subpixel_offset
from napari_gridmip.core.runtime import strategy
from napari_gridmip.core.runtime.executables import kept
from napari_gridmip.core.runtime.precision import is_wide, precision_scope
from napari_gridmip.core.runtime.sharding import band_devices, band_starts, run_bands, spread_rows, wait_for
from napari_gridmip.core.runtime.transfer import aligned_empty, owned_to_device, to_device

__all__ = ["find_displacement", "windowed_pearson"]

# Memory: both stacks are standardised once (two float arrays the size of the inputs; find_displacement adds a
# K-last copy of img1 for its gathers). Beyond that and the output, the peak search works in tiles of TILE_ROWS rows
# and the offsets-first map in tiles of PLANES_TILE_ROWS rows (temporaries of a few times rows * N * K values);
# the pixels-first map is one fused program that writes its output and nothing else. Measured (K=10, 900x900,
# 15x15, float32, benchmarks/bench_correlation.py): about 1x the two inputs beyond them for find_displacement, the
# output plus about 1x the inputs for windowed_pearson.

# Rows per tile of the peak search: big enough to amortise, small enough to stay in cache.
# find_displacement at K=10, 900x900, 15x15: 16 rows 0.25 s, 32 rows 0.21 s.
TILE_ROWS = 32
# Rows per tile of the offsets-first map, whose tiles are computed in one pass for all offsets: img1's
# rows and img2's tile (2 x K x T x N values) then stay in the cores' caches across the offsets.
PLANES_TILE_ROWS = 4
MAX_BANDS = 8  # Python-level calls per image: progress and cancel points, never a dispatch storm

ProgressCallback = Callable[[int, int], None]


class AffineDisplacement(NamedTuple):
    """What :func:`find_displacement` returns with ``shape="affine"``: the displacement, the correlation at the
    fitted warp and the displacement's gradients, arrays of one shape."""

    dy: Any
    """Row displacement (pixels) of the subset's centre, as :attr:`Displacement.dy`."""
    dx: Any
    """Column displacement (pixels)."""
    peak: Any
    """The ZNCC of the reference subset and img1 at the fitted affine warp, in [-1, 1]."""
    dy_y: Any
    """``d dy / dy``: the row displacement's gradient along rows (dimensionless, per pixel of img2)."""
    dy_x: Any
    """``d dy / dx``."""
    dx_y: Any
    """``d dx / dy``."""
    dx_x: Any
    """``d dx / dx``."""


class Displacement(NamedTuple):
    """What :func:`find_displacement` returns: three arrays of one shape, which unpack as ``dy, dx, peak``."""

    dy: Any
    """Row displacement (pixels): ``img1[y + dy, x + dx]`` matches ``img2[y, x]``; NaN where the peak is on
    the window's edge."""
    dx: Any
    """Column displacement (pixels), NaN where ``dy`` is."""
    peak: Any
    """The correlation at the integer peak, in [-1, 1]: a confidence."""


# -- validation -------------------------------------------------------------------


# -- pure kernels -------------------------------------------------------------------


def standardize(stack: jax.Array) -> jax.Array:
    """Centre each pixel's K-vector (axis -3) and scale it to unit norm; zero variance gives zeros.

    Subtracting the first frame before the mean makes a constant vector exactly zero
    (so its variance is exactly 0, not rounding noise), and conditions the sums.
    """
    k = stack.shape[-3]
    ones = jnp.ones((k,), stack.dtype)

    def sum_over_k(x: jax.Array) -> jax.Array:
        # a GEMV with ones: XLA's CPU reduce over a major axis is ~30x slower than this
        return jnp.expand_dims(jnp.einsum("k,...kmn->...mn", ones, x, precision=lax.Precision.HIGHEST), -3)

    centred = stack - stack[..., :1, :, :]
    centred = centred - sum_over_k(centred) / k
    norm = jnp.sqrt(sum_over_k(centred * centred))
    safe = jnp.where(norm > 0, norm, 1)
    # NaN stays NaN (it poisons only the correlations that use it); zero variance gives 0
    return jnp.where(norm > 0, centred / safe, jnp.where(jnp.isnan(norm), jnp.nan, 0))


UNROLL_FRAMES = 16  # sums over up to this many frames are unrolled; longer stacks loop over blocks of them


def _sum_over_frames(k: int, term: Callable[[Any], jax.Array]) -> jax.Array:
    """``sum(term(f) for f in range(k))``, unrolled for short stacks, a loop over blocks for long ones.

    Unrolled multiply-adds with static slices are what XLA's CPU backend fuses
    into fast vectorised loops (30x faster than a reduce), but the program, and
    its compile time, grows with K: 60 s at K=1000. Beyond
    ``UNROLL_FRAMES`` the frames go in blocks of that many through a
    ``fori_loop`` (one compiled block whatever K), plus the unrolled remainder.
    ``term`` takes a frame index (an int, or a traced int32 inside the loop).
    """
    if k <= UNROLL_FRAMES:
        acc = term(0)
        for f in range(1, k):
            acc = acc + term(f)
        return acc
    blocks, rest = divmod(k, UNROLL_FRAMES)

    def block(i, acc):
        first = i * UNROLL_FRAMES
        for f in range(UNROLL_FRAMES):
            acc = acc + term(first + f)
        return acc

    acc = lax.fori_loop(0, blocks, block, jnp.zeros_like(term(0)))
    for f in range(blocks * UNROLL_FRAMES, k):
        acc = acc + term(f)
    return acc


def _frame(x: jax.Array, f: Any, axis: int = 0) -> jax.Array:
    """Frame ``f`` of ``x`` along ``axis``: a static index, or a dynamic one inside the frame loop."""
    if isinstance(f, int):
        return lax.index_in_dim(x, f, axis, keepdims=False)
    return lax.dynamic_index_in_dim(x, f, axis, keepdims=False)


def _row_planes(z1_rows: jax.Array, z2c: jax.Array, wn: int) -> tuple[jax.Array, ...]:
    """Correlations at the ``wn`` column offsets of one row offset: ``wn`` planes ``(T, N - 2n)``.

    ``z1_rows`` is ``(K, T, N)`` (img1's rows shifted by the row offset), ``z2c``
    is ``(K, T, N - 2n)``. The sums over K (see :func:`_sum_over_frames`) and the
    column offsets are plain multiply-adds with static slices: XLA's CPU backend
    fuses those into vectorised loops, where ``.sum(axis=0)`` is 30x slower and
    dynamic column offsets are 3x slower. The row offsets stay a loop, which
    keeps the program small (compiling all offsets unrolled takes minutes).
    """
    cols = z2c.shape[-1]
    k = z1_rows.shape[0]
    return tuple(
        _sum_over_frames(k, lambda f, b=b: _frame(z1_rows, f)[:, b : b + cols] * _frame(z2c, f)) for b in range(wn)
    )


def _rows_of(z1: jax.Array, item: jax.Array, row: jax.Array, rows: int) -> jax.Array:
    """``z1[item, :, row : row + rows, :]`` as one dynamic slice of the whole ``(B, K, M, N)`` array.

    Slicing the batch item first and the rows later would make XLA copy the
    whole item on every tile (a 10x slowdown measured on 900x900 images).
    """
    b, k, _, n = z1.shape
    zero = jnp.int32(0)
    return lax.dynamic_slice(z1, (item, zero, row, zero), (1, k, rows, n))[0]


Planes = tuple[jax.Array, ...]


def _over_row_offsets(
    z1: jax.Array,
    item: jax.Array,
    row: jax.Array,
    rows: int,
    wm: int,
    step: Callable[[jax.Array, jax.Array, Any], Any],
    acc: Any,
) -> Any:
    """``acc = step(a, z1_rows, acc)`` for every row offset ``a`` of a tile; ``z1_rows`` is ``(K, T, N)``.

    img1's rows for offset ``a`` reach ``step`` through the loop's carry, sliced
    one step ahead: a value carried by a loop is a buffer of its own, which
    XLA's CPU backend cannot fuse into the next operation. Sliced inside the
    sums, the rows' dynamic slice was fused into every plane's sum and cost its
    vectorisation (6x slower sums; ``benchmarks/bench_correlation.py``).
    """

    def one_row_offset(a, carry):
        a = a.astype(jnp.int32)  # the loop counts in int64 when x64 is on for a float64 call
        acc, z1_rows = carry
        # the rows for the next offset; at the last one, a clamped slice never used
        return step(a, z1_rows, acc), _rows_of(z1, item, row + a + 1, rows)

    acc, _ = lax.fori_loop(0, wm, one_row_offset, (acc, _rows_of(z1, item, row, rows)))
    return acc


def _peak_tile(z1: jax.Array, item: jax.Array, z2c: jax.Array, row: jax.Array, window: tuple[int, int]):
    """The best offset of every pixel of a tile, as a running max over the offsets (no map is built).

    Returns the peak value and the flat offset index ``a * wn + b`` (first maximum in C order).
    """
    wm, wn = window
    rows, cols = z2c.shape[-2:]

    def step(a, z1_rows, carry):
        best, index = carry
        planes = _row_planes(z1_rows, z2c, wn)
        for b in range(wn):
            better = planes[b] > best
            best = jnp.where(better, planes[b], best)
            index = jnp.where(better, a * wn + b, index)
        return best, index

    empty = (jnp.full((rows, cols), -jnp.inf, z1.dtype), jnp.zeros((rows, cols), jnp.int32))
    return _over_row_offsets(z1, item, row, rows, wm, step, empty)


def _neighbourhood(
    z1k: jax.Array, item: jax.Array, z2c: jax.Array, row: jax.Array, a: jax.Array, b: jax.Array, window: tuple[int, int]
) -> jax.Array:
    """Correlations at the 3x3 offsets around each pixel's ``(a, b)``: ``(T, N - 2n, 3, 3)``.

    ``z1k`` is the whole standardised img1 with K last, ``(B, M, N, K)``; ``z2c`` is
    the tile ``(K, T, N - 2n)`` whose first output row is ``row``. One gather
    fetches each pixel's 3x3 block of K-vectors (3x faster than 9 point gathers),
    then K multiply-adds. Offsets past the window (a peak on its edge, flagged
    later) read a shifted block; their values are never used. ``a`` and ``b``
    must come out of a loop (so materialised): otherwise XLA fuses the whole peak
    search into every gathered element (measured 50x slower).
    """
    wm, wn = window
    k = z1k.shape[-1]
    rows = row + jnp.arange(z2c.shape[-2], dtype=jnp.int32)[:, None] + a - (1 if wm > 1 else 0)
    cols = jnp.arange(z2c.shape[-1], dtype=jnp.int32)[None, :] + b - (1 if wn > 1 else 0)
    size = (1, 3 if wm > 1 else 1, 3 if wn > 1 else 1, k)
    zero = jnp.int32(0)
    take = jax.vmap(jax.vmap(lambda r, c: lax.dynamic_slice(z1k, (item, r, c, zero), size)[0]))
    blocks = take(rows, cols)  # (T, N - 2n, 3 or 1, 3 or 1, K)
    z2k = jnp.moveaxis(z2c, 0, -1)
    acc = _sum_over_frames(k, lambda f: _frame(blocks, f, -1) * _frame(z2k, f, -1)[:, :, None, None])
    # an axis of size 1 has no neighbours: repeat the centre (its sub-pixel step is forced to 0 later)
    return jnp.broadcast_to(acc, acc.shape[:2] + (3, 3)) if (wm == 1 or wn == 1) else acc


def _displacement_from_peak(peak, flat, neighbourhood, window, method):
    """(dy, dx) from the integer peak offsets and their 3x3 neighbourhoods; NaN where the peak is on the edge."""
    wm, wn = window
    a, b = flat // wn, flat % wn
    sub_y, sub_x = subpixel_offset(neighbourhood, "hessian" if method == "refine" else method)
    if wm == 1:  # no search along an axis of size 1: no offset, never an edge
        sub_y = jnp.zeros_like(sub_y)
    if wn == 1:
        sub_x = jnp.zeros_like(sub_x)
    on_edge = ((wm > 1) & ((a == 0) | (a == wm - 1))) | ((wn > 1) & ((b == 0) | (b == wn - 1)))
    on_edge = on_edge | ~jnp.isfinite(peak)  # every offset NaN: no peak at all
    nan = jnp.array(jnp.nan, peak.dtype)
    dy = jnp.where(on_edge, nan, (a - wm // 2).astype(peak.dtype) + sub_y)
    dx = jnp.where(on_edge, nan, (b - wn // 2).astype(peak.dtype) + sub_x)
    return dy, dx


# -- banded drivers -----------------------------------------------------------------


def _row_plan(out_rows: int, tile: int = TILE_ROWS, max_bands: int = MAX_BANDS) -> tuple[int, int, list[int]]:
    """(tile rows, band rows, band starts): bands of whole tiles; the last band ends flush with the edge."""
    tile = min(tile, out_rows)
    tiles = math.ceil(out_rows / tile)
    band = min(math.ceil(tiles / max_bands) * tile, out_rows)
    starts = sorted({min(b * band, out_rows - band) for b in range(math.ceil(out_rows / band))})
    return tile, band, starts


def _tiles_of_band(z1, z2, row0, *, window, tile, band, update, outputs):
    """Run ``outputs = update(outputs, item, z2c, row, start)`` over every batch item and tile of a band.

    ``z1``/``z2``: standardised ``(B, K, M, N)``; the band starts at output row
    ``row0``. ``z2c`` is the tile of ``z2`` offset by ``(m, n)``: ``(K, T, N - 2n)``;
    ``row`` the tile's first output row in the image and ``start`` in the band.
    The last tile of a band ends flush with it (recomputing a few rows rather
    than changing shape). One loop over (item, tile): no vmap, whose batched
    updates cost an extra pass over each tile.
    """
    m, n = window[0] // 2, window[1] // 2
    cols = z2.shape[-1] - 2 * n
    tiles = math.ceil(band / tile)
    zero = jnp.int32(0)

    def body(step, outs):
        # int32 start indices throughout, also when x64 is on for a float64 call
        item = (step // tiles).astype(jnp.int32)
        start = jnp.minimum((step % tiles) * tile, band - tile).astype(jnp.int32)
        row = row0.astype(jnp.int32) + start
        z2c = lax.dynamic_slice(z2, (item, zero, row + m, jnp.int32(n)), (1, z2.shape[1], tile, cols))[0]
        return update(outs, item, z2c, row, start)

    return lax.fori_loop(0, z1.shape[0] * tiles, body, outputs)


def _put(out: jax.Array, value: jax.Array, at: tuple) -> jax.Array:
    """``out`` with ``value`` written in place from ``at`` (start indices of the leading axes; 0 for the rest)."""
    zero = jnp.int32(0)
    return lax.dynamic_update_slice(out, value, tuple(at) + (zero,) * (out.ndim - len(at)))


def _window_values(x: jax.Array, window: tuple[int, int], out_rows: int) -> jax.Array:
    """Every window offset's view of one frame: ``out[a, b, ..., i, j] = x[..., i + a, j + b]``.

    ``x`` is ``(..., M', N)`` (leading axes: a batch, or none); the result is
    ``(wm, wn, ..., out_rows, N - wn + 1)`` with ``out_rows = M' - wm + 1``, and is
    meant to be fused into its consumer, never materialised. The image is
    flattened, so each offset is one start index ``a * N + b`` into it and its
    values one contiguous run: a gather of ``wm * wn`` long slices whose start
    indices come from an iota. XLA's CPU backend fuses it into the sums over K
    and vectorises along the columns. (With a constant table of ``(a, b)``
    pairs it loaded both indices for every element, unvectorised: 1.7x slower
    for the float64 map, 900x900, 15x15, K=10.) The slice ends ``wn - 1`` values
    short of ``out_rows * N`` so that it stays inside the image; the pad
    restores the shape, and the padded columns are the ones sliced off.
    """
    wm, wn = window
    lead, cols = x.shape[:-2], x.shape[-1]
    span = (out_rows - 1) * cols + cols - wn + 1
    flat = x.reshape((math.prod(lead), -1))
    starts = lax.broadcasted_iota(jnp.int32, (wm, wn, 1), 0) * cols + lax.broadcasted_iota(jnp.int32, (wm, wn, 1), 1)
    numbers = lax.GatherDimensionNumbers(offset_dims=(2, 3), collapsed_slice_dims=(), start_index_map=(1,))
    runs = lax.gather(
        flat, starts, numbers, (flat.shape[0], span), mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS
    )  # (wm, wn, lead, span): in bounds, since (wm - 1) * N + wn - 1 + span = M' * N
    runs = jnp.pad(runs, ((0, 0), (0, 0), (0, 0), (0, wn - 1)))
    return runs.reshape((wm, wn) + lead + (out_rows, cols))[..., : cols - wn + 1]


@partial(jax.jit, static_argnames=("window",))
def _pixels_first_map(z1: jax.Array, z2: jax.Array, *, window: tuple[int, int]) -> jax.Array:
    """The whole pixels-first map ``(B, M - 2m, N - 2n, wm, wn)`` of standardised ``(B, K, M, N)`` stacks.

    One fused program: every output value is written once, where it is
    computed, by one loop over the output that XLA's CPU backend splits across
    cores (no zero-filled buffer, no tiles written in place, no transposes; the
    offsets come last because the output is iterated in that order, img1's
    values along a row of offsets being contiguous in the flattened image).
    Stacks of more than ``UNROLL_FRAMES`` frames add blocks of them to the map in
    a loop (each block one more pass over the map, negligible next to the sums).
    Measured against the tiled version it replaced (K=10, 900x900, 15x15, one
    process, CPU time): float64 1.1 s against 2.8 s, float32 0.65 s against 1.55 s.
    """
    wm, wn = window
    m, n = wm // 2, wn // 2
    k, rows = z1.shape[1], z1.shape[2] - 2 * m
    z2c = z2[:, :, m : m + rows, n : z2.shape[3] - n]  # (B, K, rows, cols)

    def term(f):
        shifted = _window_values(_frame(z1, f, axis=1), window, rows)  # (wm, wn, B, rows, cols)
        return jnp.moveaxis(shifted, (0, 1), (3, 4)) * _frame(z2c, f, axis=1)[..., None, None]

    return _sum_over_frames(k, term)


def _plane_block(rows1: jax.Array, z2t: jax.Array, window: tuple[int, int]) -> jax.Array:
    """The offsets-first map of one tile, ``(wm, wn, T, N - 2n)``: one fused pass over the tile for all offsets.

    ``rows1`` is ``(K, T + wm - 1, N)``, img1's rows that the tile's windows
    cover; ``z2t`` is ``(K, T, N - 2n)``, img2's tile already offset by ``(m, n)``.
    """
    tile = z2t.shape[1]
    return _sum_over_frames(rows1.shape[0], lambda f: _window_values(_frame(rows1, f), window, tile) * _frame(z2t, f))


def _apart(always: jax.Array, compute: Callable[[], Any]) -> Any:
    """``compute()``, as a buffer of its own that XLA can fuse neither into its consumers nor with its inputs.

    ``always`` must be true at run time but unknown to the compiler (it depends
    on a traced argument): the result comes out of a conditional, whose
    branches are compiled apart. Carrying values through a loop separates them
    too, but then XLA copies each carried buffer in and out of every iteration
    (two copies of each tile of map, and of its inputs, one core each).
    """
    return lax.cond(always, compute, lambda: jax.tree_util.tree_map(jnp.zeros_like, jax.eval_shape(compute)))


@partial(jax.jit, static_argnames=("window", "tile", "band"), donate_argnums=(0,))
def _planes_band(out, z1, z2, row0, *, window, tile, band):
    """Write rows ``[row0, row0 + band)`` of the offsets-first map ``(B, wm, wn, M - 2m, N - 2n)`` into ``out``.

    ``out`` is donated (updated in place). Tile by tile, over every batch item:
    img1's rows and img2's tile are sliced, each tile's ``wm * wn`` planes come
    from one fused pass over them (:func:`_plane_block`), and the in-place
    write copies them into ``out``; the three are kept apart
    (:func:`_apart`): fused into the in-place write, the sums ran on one core,
    unvectorised (8x slower), and the dynamic slices fused into the
    sums cost their vectorisation (6x). The last tile of a band ends flush
    with it (recomputing a few rows rather than compiling a second shape).
    """
    wm, wn = window
    m, n = wm // 2, wn // 2
    batch, k, _, cols_in = z1.shape
    cols = cols_in - 2 * n
    tiles = math.ceil(band / tile)
    zero = jnp.int32(0)
    row0 = row0.astype(jnp.int32)  # int32 start indices throughout, also when x64 is on for a float64 call
    always = row0 >= 0

    def body(step, out):
        step = step.astype(jnp.int32)
        item, row = step // tiles, row0 + jnp.minimum((step % tiles) * tile, band - tile)
        rows1, z2t = _apart(
            always,
            lambda: (
                lax.dynamic_slice(z1, (item, zero, row, zero), (1, k, tile + wm - 1, cols_in))[0],
                lax.dynamic_slice(z2, (item, zero, row + m, jnp.int32(n)), (1, k, tile, cols))[0],
            ),
        )
        planes = _apart(always, lambda: _plane_block(rows1, z2t, window))
        return _put(out, planes[None], (item, zero, zero, row))

    return lax.fori_loop(0, batch * tiles, body, out)


@kept(static_argnames=("window", "tile", "band", "method"))
def _displacement_band(z1, z1k, z2, row0, *, window, tile, band, method):
    """(dy, dx, peak) ``(B, band, N - 2n)`` for output rows ``[row0, row0 + band)``, tile by tile."""
    batch, cols = z1.shape[0], z2.shape[-1] - 2 * (window[1] // 2)
    wn = window[1]

    def update(outs, item, z2c, row, start):
        peak, flat = _peak_tile(z1, item, z2c, row, window)
        hood = _neighbourhood(z1k, item, z2c, row, flat // wn, flat % wn, window)
        dy, dx = _displacement_from_peak(peak, flat, hood, window, method)
        results = (dy, dx, jnp.where(jnp.isfinite(peak), peak, jnp.nan))
        return tuple(_put(o, r[None], (item, start)) for o, r in zip(outs, results))

    empty = jnp.zeros((batch, band, cols), z1.dtype)
    return _tiles_of_band(z1, z2, row0, window=window, tile=tile, band=band, update=update, outputs=(empty,) * 3)


# -- offset sweeps (accelerators; core.runtime.strategy.offset_sweeps) -------------------------

# Bytes of img1's rows (all batch items and frames) a band of the sweeps reads per offset: a band is as tall as
# fits, so that an accelerator's steps are whole-image operations, and bounded, so that the temporaries of a
# band (a few planes of its size) stay a small part of the device's memory.
SWEEP_BAND_BYTES = 64 * 2**20


def _sweep_plan(shape: tuple[int, ...], window: tuple[int, int], itemsize: int, *, devices: int = 1
                ) -> tuple[int, list[int]]:  # fmt: skip
    """(band rows, band starts) of the sweeps over stacks of ``shape = (B, K, M, N)``, at least one band per
    device of ``devices`` (:func:`napari_gridmip.core.runtime.sharding.spread_rows`); the last band ends flush."""
    batch, k, rows, cols = shape
    out_rows = rows - 2 * (window[0] // 2)
    band = max(8, SWEEP_BAND_BYTES // max(1, batch * k * cols * itemsize))
    band = min(out_rows, max(band, math.ceil(out_rows / MAX_BANDS)))
    band = spread_rows(band, out_rows, devices)
    return band, band_starts(band, out_rows)


def _sweep(z1, z2, row0, *, window, band, visit, carry):
    """``carry = visit(carry, a, b, plane)`` for every offset of the window, row offsets in a loop, column
    offsets unrolled; ``plane`` ``(B, band, N - 2n)`` is the correlation at offset ``(a, b)`` of output rows
    ``[row0, row0 + band)``. Each row offset slices img1's band once (rows: the cheap axis to offset on an
    accelerator); each column offset is a static slice of it, summed over the frames in the same fusion."""
    wm, wn = window
    m, n = wm // 2, wn // 2
    batch, k, _, cols_in = z1.shape
    cols = cols_in - 2 * n
    zero = jnp.int32(0)
    row0 = row0.astype(jnp.int32)
    z2c = lax.dynamic_slice(z2, (zero, zero, row0 + m, jnp.int32(n)), (batch, k, band, cols))

    def one_row_offset(a, carry):
        a = a.astype(jnp.int32)
        rows = lax.dynamic_slice(z1, (zero, zero, row0 + a, zero), (batch, k, band, cols_in))
        for b in range(wn):
            carry = visit(carry, a, b, jnp.sum(rows[..., b : b + cols] * z2c, axis=1))
        return carry

    return lax.fori_loop(0, wm, one_row_offset, carry)


@kept(static_argnames=("window", "band", "method"))
def _swept_displacement_band(z1, z2, row0, *, window, band, method):
    """:func:`_displacement_band` by two sweeps: the peak (first maximum in C order, as the tiles find it), then
    its 3x3 neighbourhood, each plane selected where it is one of the peak's neighbours."""
    wm, wn = window
    batch, cols = z1.shape[0], z2.shape[-1] - 2 * (wn // 2)
    out = (batch, band, cols)

    def peak_of(carry, a, b, plane):
        best, index = carry
        better = plane > best
        return jnp.where(better, plane, best), jnp.where(better, a * wn + b, index)

    start = (jnp.full(out, -jnp.inf, z1.dtype), jnp.zeros(out, jnp.int32))
    peak, flat = _sweep(z1, z2, row0, window=window, band=band, visit=peak_of, carry=start)
    # an axis of size 1 has no neighbours: its three rows (or columns) all take the centre's
    rel_a = flat // wn - (1 if wm > 1 else 0)
    rel_b = flat % wn - (1 if wn > 1 else 0)

    def neighbours_of(hood, a, b, plane):
        di, dj = a - rel_a, b - rel_b
        hood = list(hood)
        for i in range(3):
            for j in range(3):
                here = (di == (i if wm > 1 else 0)) & (dj == (j if wn > 1 else 0))
                hood[3 * i + j] = jnp.where(here, plane, hood[3 * i + j])
        return tuple(hood)

    hood = _sweep(z1, z2, row0, window=window, band=band, visit=neighbours_of, carry=(jnp.zeros(out, z1.dtype),) * 9)
    neighbourhood = jnp.stack(hood, axis=-1).reshape(out + (3, 3))
    dy, dx = _displacement_from_peak(peak, flat, neighbourhood, window, method)
    return dy, dx, jnp.where(jnp.isfinite(peak), peak, jnp.nan)


@partial(jax.jit, static_argnames=("window", "band"), donate_argnums=(0,))
def _swept_planes_band(out, z1, z2, row0, *, window, band):
    """:func:`_planes_band` by a sweep: each offset's plane written in place into ``out``."""
    zero = jnp.int32(0)
    row0 = row0.astype(jnp.int32)

    def write(out, a, b, plane):
        return _put(out, plane[:, None, None], (zero, a, jnp.int32(b), row0))

    return _sweep(z1, z2, row0, window=window, band=band, visit=write, carry=out)


@partial(jax.jit, static_argnames=("dtype", "k_last"))
def _standardize_pair(img1, img2, *, dtype, k_last=False):
    """Both stacks as ``(B, K, M, N)`` standardised ``dtype`` arrays (batch axes flattened), and with ``k_last``
    also img1's as ``(B, M, N, K)``, materialised: each pixel's K-vector contiguous for gathers (in the same
    program: one less to compile on a first call)."""
    k, rows, cols = img1.shape[-3:]
    z1, z2 = (standardize(img.astype(dtype).reshape(-1, k, rows, cols)) for img in (img1, img2))
    return (z1, z2, jnp.moveaxis(z1, 1, -1)) if k_last else (z1, z2)


def _on_device(img: Any, dtype: np.dtype) -> jax.Array:
    """A stack on the device, ready to be cast to the compute ``dtype`` without losing its variations.

    Data wider than ``dtype`` (float64 computed in float32) has each pixel's
    first frame subtracted in its own precision, in the same pass as the cast:
    a Pearson correlation over K ignores a constant per pixel, and offset data
    (1e4 plus noise of 1e-2) then keeps its noise instead of rounding it away
    (``tests/core/correlation/test_maps.py``). 64-bit integers are converted
    by NumPy: JAX would narrow int64 to int32 (wrapping values above 2**31)
    before any float conversion; those that reach here fit float32 exactly.
    """
    source = validate.dtype_of(img)
    if is_wide(source) and dtype == np.float32:
        if isinstance(img, jax.Array):  # made under x64: work while x64 is on, so nothing is narrowed
            with precision_scope(img.dtype):
                if validate.is_float(source):
                    return _minus_first_frame(img)
                return img.astype(np.float32)
        host = np.asarray(img)
        buffer = aligned_empty(host.shape, np.float32)
        if validate.is_float(source):
            # computed in float64 (the inputs' loop), rounded once into the float32 buffer
            np.subtract(host, host[..., :1, :, :], out=buffer, casting="unsafe")
        else:
            np.copyto(buffer, host, casting="unsafe")
        return owned_to_device(buffer)
    return to_device(img)


@jax.jit
def _minus_first_frame(img: jax.Array) -> jax.Array:
    return (img - img[..., :1, :, :]).astype(jnp.float32)


def _prepare(img1, img2, dtype, *, k_last=False):
    """Flatten batch axes and standardise both stacks (float ``dtype``) on the device: ``(batch, z1, z2)``, and
    with ``k_last`` also img1's with K last (see :func:`_standardize_pair`)."""
    batch = validate.shape_of(img1)[:-3]
    pair = (_on_device(img1, dtype), _on_device(img2, dtype))
    return (batch, *_standardize_pair(*pair, dtype=np.dtype(dtype).name, k_last=k_last))


@partial(jax.jit, static_argnums=(1,), donate_argnums=(0,))
def _reshape_in_place(array: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Unflatten the batch axes without copying the (large) map: an eager reshape would copy it."""
    return array.reshape(shape)


def _report(progress: ProgressCallback | None, done: int, total: int) -> None:
    if progress is not None:
        progress(done, total)


# -- public API ---------------------------------------------------------------------


def windowed_pearson(
    img1: Any,
    img2: Any,
    window: Sequence[int],
    *,
    subset: Sequence[int] = (1, 1),
    step: int = 1,
    dtype: Any = None,
    offsets_first: bool = False,
    progress: ProgressCallback | None = None,
) -> jax.Array:
    """The full windowed Pearson correlation map.

    Parameters
    ----------
    img1, img2
        Stacks of shape ``(..., K, M, N)`` (any leading batch axes), ``K >= 2``,
        no zero-length axis; bool, any integer or real float (float16 and
        bfloat16 included). Integers are converted to ``dtype`` exactly: values
        beyond its exact range (2**24 for float32, 2**53 for float64) are refused.
    window
        ``(wm, wn)``, odd full window sizes, at most ``(M, N)``.
    subset
        ``(sh, sw) = (2hs + 1, 2hw + 1)``, odd, default ``(1, 1)``: each pixel's
        vector is its K values over the ``sh x sw`` subset centred on it
        (``K sh sw`` values, mean and norm over the whole vector: zero-normalised
        cross-correlation, as in digital image correlation). ``K = 1`` is
        accepted when the subset has more than one pixel. Computed with box sums
        (cost per value independent of the subset's area; see
        ``core/correlation/subsets.py``).
    step
        Results on every ``step``-th output pixel only (DIC's grid of points):
        the dense output subsampled, ``out[..., ::step, ::step, ...]``, computed
        without evaluating the pixels between.
    dtype
        ``float32`` (default) or ``float64``. float64 computes in float64 (JAX's
        x64 switch is enabled for this call only).
    offsets_first
        If True, the offsets come before the pixels: ``(..., wm, wn, M - 2m, N - 2n)``,
        each offset's correlations one contiguous image. About 1.5x faster (the
        planes are written where they are computed, with no transpose) and what
        an image viewer wants: a slider over the offsets.
    progress
        Optional ``progress(done, total)``, called between row bands; it may raise
        to stop the computation early.

    Returns
    -------
    jax.Array, or dask.array.Array for dask inputs
        Shape ``(..., M - 2m, N - 2n, wm, wn)``, ``dtype``, values in [-1, 1];
        ``out[..., i, j, a, b] = pearson(img1[..., :, i + a, j + b], img2[..., :, i + m, j + n])``,
        0 where either vector has zero variance. With a subset and a step, output
        pixel ``(i, j)`` is img2's pixel ``(y, x) = (i step + m + hs, j step + n + hw)``
        and the shape is ``(..., ceil(Mo / step), ceil(No / step), wm, wn)`` with
        ``Mo = M - 2m - 2hs``, ``No = N - 2n - 2hw`` (the same margin on both
        sides, grown by the subset's half-size): ``out[..., i, j, a, b]`` correlates
        ``img2[..., :, y - hs : y + hs + 1, x - hw : x + hw + 1]`` with img1's subset
        around ``(y + a - m, x + b - n)``. Each image's global mean is subtracted
        first (subsets mix pixels, so no per-pixel reference can be), which bounds
        the accuracy: about ``eps * (max|x - mean| / std(subset))**2`` (``eps`` the
        dtype's, 1.2e-7 for float32), fine for speckle and camera data (8 bits:
        ~1e-6), not for faint subsets far from the mean (a background varying by
        10 beside signal at 5e4 in float32: pass ``dtype=np.float64``, or subtract
        the background first). A subset whose variance is
        below about ``2**-17`` (float32; ``2**-40`` float64) of its mean square (about
        that mean) counts as constant; a non-finite value makes NaN of exactly the
        correlations whose vectors hold it. With ``offsets_first``, shape
        ``(..., wm, wn, M - 2m, N - 2n)`` and ``out[..., a, b, i, j]`` the same
        value, computed the same way. Dask stacks give a lazy dask
        array (nothing is computed by the call), each block read with the
        window's half-size as a halo and all K frames in one chunk; it equals
        the in-memory map exactly.

    Raises
    ------
    ValueError
        If the shapes differ or hold a zero-length axis, a window or subset size
        is even, the window (plus the subset, less one) is larger than the image,
        a vector holds fewer than 2 values (fewer than 2 frames with a 1-pixel
        subset), ``step`` is below 1, a dtype is not real, or integers exceed
        ``dtype``'s exact range (the message says to pass ``dtype=np.float64``).
    TypeError
        If ``step`` is not an integer, or ``offsets_first`` not a bool.
    """
    img1, img2 = validate.as_array("img1", img1), validate.as_array("img2", img2)
    subset, step = check_subset(subset, step)
    if subset != (1, 1) or step != 1:
        return subsets.subset_map(
            img1, img2, window, subset, step, dtype=dtype, offsets_first=offsets_first, progress=progress
        )
    shape, window = check_pair(img1, img2, window)
    dtype = check_dtypes({"img1": img1, "img2": img2}, dtype)
    offsets_first = validate.check_bool("offsets_first", offsets_first)
    if validate.is_dask(img1) or validate.is_dask(img2):
        from napari_gridmip.core.correlation import _chunked  # the dask twin: dask.array takes 0.5 s to import

        kernel = partial(_pearson, window=window, dtype=dtype, offsets_first=offsets_first)
        return _chunked.windowed_pearson(img1, img2, window, dtype, kernel, offsets_first=offsets_first)
    return _pearson(img1, img2, window=window, dtype=dtype, offsets_first=offsets_first, progress=progress)


def _pearson(img1, img2, *, window, dtype, offsets_first, progress=None) -> jax.Array:
    """:func:`windowed_pearson`'s in-memory kernel, for arguments already checked (the dask twin runs it on
    every block)."""
    shape = validate.shape_of(img1)
    with precision_scope(dtype):
        batch, z1, z2 = _prepare(img1, img2, dtype)
        pixels = (shape[-2] - 2 * (window[0] // 2), shape[-1] - 2 * (window[1] // 2))
        if not offsets_first:  # one program: no cancel point inside it
            _report(progress, 0, 1)
            out = _pixels_first_map(z1, z2, window=window)
            wait_for(out)
            _report(progress, 1, 1)
            return _reshape_in_place(out, batch + out.shape[1:])
        sweeps = strategy.offset_sweeps()
        if sweeps:
            band, starts = _sweep_plan(z1.shape, window, z1.dtype.itemsize)
        else:
            tile, band, starts = _row_plan(pixels[0], PLANES_TILE_ROWS)
        out = jnp.zeros((z1.shape[0],) + window + pixels, dtype)
        for done, row0 in enumerate(starts):
            _report(progress, done, len(starts))
            if sweeps:
                out = _swept_planes_band(out, z1, z2, np.int32(row0), window=window, band=band)
            else:
                out = _planes_band(out, z1, z2, np.int32(row0), window=window, tile=tile, band=band)
            wait_for(out)  # so that progress means something, and cancel can stop between bands
        _report(progress, len(starts), len(starts))
        return _reshape_in_place(out, batch + out.shape[1:])


def find_displacement(
    img1: Any,
    img2: Any,
    window: Sequence[int],
    *,
    subset: Sequence[int] = (1, 1),
    step: int = 1,
    subpixel: str = "hessian",
    prefilter: float | str | None = "auto",
    shape: str = "translation",
    dtype: Any = None,
    progress: ProgressCallback | None = None,
) -> Displacement | AffineDisplacement:
    """The displacement field at the peak of every pixel's correlation map, without building the map.

    Parameters
    ----------
    img1, img2, window, subset, step, dtype, progress
        As for :func:`windowed_pearson`.
    subpixel
        ``"hessian"`` (default): a Newton step on the 3x3 neighbourhood of the
        integer peak. ``"paraboloid"``: a least-squares 2D quadratic on it.
        ``"none"``: integer peaks. ``"refine"``: after the Hessian step,
        maximise the correlation between pixels (img1 interpolated by Keys
        cubic convolution) with Newton steps: the most accurate (0.0065 px
        median error on the speckle sample against 0.17 px), about 3x the
        time of the Hessian step. With a subset (or a step), the interpolated vector
        spans the subset and img1 is interpolated by cubic B-splines instead: on
        8-bit DIC speckle, Keys' convolution leaves a systematic error of up to
        0.02 px, the spline 0.002 px (``benchmarks/bench_dic.py``; Schreier,
        Braasch and Sutton, Opt. Eng. 39, 2915 (2000)). It is computed from box sums
        too (img1's spline coefficients correlated at the 5 x 5 offsets around the
        peak, and a Gram matrix of their vectors there), iterates Newton's method to
        convergence, and stays within one pixel of the integer peak.
    prefilter
        The standard deviation (px) of a Gaussian that smooths every frame of both stacks before the search,
        or ``None`` (none). ``"auto"`` (default): 0.8 px where a subset or step is given and
        ``subpixel="refine"``, else none. Interpolating only img1 averages its noise differently at every
        fractional position, and the refinement then prefers half pixels: on 8-bit speckle with noise of 3%
        of the range a 0.1 px field comes out 50% too large and rigid shifts up to 0.06 px off; prefiltered,
        the bias is below 0.002 px at every shift (``benchmarks/bench_dic.py``, bias section; B. Pan,
        Opt. Lasers Eng. 51, 1161 (2013)). A translation commutes with the filter, so it is measured
        unchanged; the Hessian step's pixel locking is not helped by it. Borders are mirrored, as
        ``scipy.ndimage.gaussian_filter`` does.
    shape
        The subset's shape function. ``"translation"`` (default): each subset moves rigidly. ``"affine"``
        (first-order subsets, DICe's and ncorr's default; needs a subset and ``subpixel="refine"``): each
        subset also stretches, shears and rotates, fitted by the inverse-compositional Gauss-Newton method
        (IC-GN) from the translation's result, with img1 interpolated by cubic B-splines. Under a 3% stretch
        and a 2 degree rotation a 31-px translation subset errs by 0.1 px; the affine one by under 0.01 px,
        with gradients to 2e-4 (``tests/core/correlation/test_affine.py``). Returns an
        :class:`AffineDisplacement`, which also carries the gradients (pass them to :func:`strain_field` as
        ``gradients=``).

    Returns
    -------
    Displacement
        A named tuple ``(dy, dx, peak)`` of jax.Arrays (dask arrays for dask
        inputs), which unpacks as three arrays. Each ``(..., M - 2m, N - 2n)``, ``dtype``; dask stacks give lazy dask
        arrays computed block by block with a halo, equal to the in-memory ones. ``img1[y + dy, x + dx]``
        matches ``img2[y, x]`` for ``y = i + m``, ``x = j + n``. With a subset and a step:
        ``(..., ceil(Mo / step), ceil(No / step))`` and ``y = i step + m + hs``,
        ``x = j step + n + hw``, as for :func:`windowed_pearson`. ``peak`` is the
        correlation at the integer peak (a confidence in [-1, 1]). Where the
        peak lies on the window's edge the true peak may lie outside: ``dy``
        and ``dx`` are NaN there, never clipped.

    Raises
    ------
    ValueError
        As for :func:`windowed_pearson`, and if ``subpixel`` is not one of
        ``"hessian"``, ``"paraboloid"``, ``"refine"`` or ``"none"``, ``prefilter`` is
        another text than ``"auto"`` or a negative or non-finite number, ``shape`` is not
        ``"translation"`` or ``"affine"``, or ``"affine"`` comes without a subset or with
        another ``subpixel`` than ``"refine"``.
    TypeError
        If ``step`` is not an integer, ``prefilter`` is neither text, None nor a number, or
        ``shape`` is not text.

    Examples
    --------
    >>> import numpy as np, scipy.ndimage as ndi
    >>> rng = np.random.default_rng(0)
    >>> img2 = ndi.gaussian_filter(rng.random((12, 64, 64)), (0, 1.5, 1.5))
    >>> img1 = ndi.shift(img2, (0, 1.3, -0.7), order=3)
    >>> dy, dx, peak = find_displacement(img1, img2, (7, 7))
    >>> round(float(np.nanmedian(dy)), 1), round(float(np.nanmedian(dx)), 1)
    (1.3, -0.7)
    """
    img1, img2 = validate.as_array("img1", img1), validate.as_array("img2", img2)
    subset, step = check_subset(subset, step)
    if subset != (1, 1) or step != 1 or shape != "translation":
        kind = AffineDisplacement if shape == "affine" else Displacement
        return kind(
            *subsets.subset_displacement(
                img1,
                img2,
                window,
                subset,
                step,
                subpixel=subpixel,
                dtype=dtype,
                progress=progress,
                prefilter=prefilter,
                shape=shape,
            )  # fmt: skip
        )
    shape, window = check_pair(img1, img2, window)
    subpixel = validate.check_choice("subpixel", subpixel, SUBPIXEL_METHODS)
    sigma = check_prefilter(prefilter, default=0.0)
    dtype = check_dtypes({"img1": img1, "img2": img2}, dtype)
    if validate.is_dask(img1) or validate.is_dask(img2):
        from napari_gridmip.core.correlation import _chunked  # the dask twin: dask.array takes 0.5 s to import

        if sigma > 0:
            img1, img2 = (_chunked.prefiltered(img, sigma, dtype) for img in (img1, img2))
        # the blocks are prefiltered already (with a halo of the filter's reach): the kernel smooths nothing
        kernel = partial(_displacement, window=window, subpixel=subpixel, sigma=0.0, dtype=dtype)
        return Displacement(*_chunked.find_displacement(img1, img2, window, dtype, kernel))
    return _displacement(img1, img2, window=window, subpixel=subpixel, sigma=sigma, dtype=dtype, progress=progress)


def _displacement(img1, img2, *, window, subpixel, sigma, dtype, progress=None) -> Displacement:
    """:func:`find_displacement`'s in-memory kernel without a subset or step, for arguments already checked (the
    dask twin runs it on every block)."""
    shape = validate.shape_of(img1)
    with precision_scope(dtype):
        if sigma > 0:  # on the device copy: a per-pixel constant that _on_device subtracts is smoothed away too
            img1, img2 = (smooth_frames(_on_device(img, dtype).astype(dtype), sigma=sigma) for img in (img1, img2))
        sweeps = strategy.offset_sweeps()
        batch, z1, z2, *z1k = _prepare(img1, img2, dtype, k_last=not sweeps)
        out_rows = shape[-2] - 2 * (window[0] // 2)
        devices = band_devices()  # every local device of the call's platform (core.runtime.sharding)
        if sweeps:
            band, starts = _sweep_plan(z1.shape, window, z1.dtype.itemsize, devices=len(devices))
        else:
            tile, band, starts = _row_plan(out_rows, max_bands=max(MAX_BANDS, len(devices)))
        out_shape = (out_rows, shape[-1] - 2 * (window[1] // 2))
        refine_bands = len(refine_plan(out_shape, shape[-3], dtype)[1]) if subpixel == "refine" else 0
        total = len(starts) + refine_bands  # the search's bands, then the refinement's
        if sweeps:
            program, args, options = _swept_displacement_band, (z1, z2), dict(window=window, band=band)
        else:
            program, args, options = _displacement_band, (z1, z1k[0], z2), dict(window=window, tile=tile, band=band)
        pieces = run_bands(
            program, args, starts, row_arg=len(args), static=dict(options, method=subpixel), devices=devices,
            progress=lambda done: _report(progress, done, total),
        )  # fmt: skip
        keep = kept_rows(starts, band)
        if subpixel != "refine":
            dy, dx, peak = join_bands(pieces, keep=keep, batch=batch)
            _report(progress, total, total)
            return Displacement(dy, dx, peak)
        dy, dx, peak = join_bands(pieces, keep=keep)
        dy, dx = refine_displacement(
            _on_device(img1, dtype), z2, window, dy, dx, dtype=dtype,
            on_band=lambda done: _report(progress, len(starts) + done, total),
        )  # fmt: skip
        _report(progress, total, total)
        return Displacement(*join_bands([(dy, dx, peak)], keep=(dy.shape[1],), batch=batch))
