"""Sub-pixel refinement of the dense maps: Newton's method on the correlation of img1 interpolated by Keys' cubic
convolution (R. Keys, IEEE Trans. Acoust., Speech, Signal Process. 29(6), 1153-1160, 1981), which removes the
3x3 fits' pull towards whole pixels.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from napari_gridmip.core.correlation._bands import join_bands, kept_rows
from napari_gridmip.core.correlation._normalised import normalised_derivatives
from napari_gridmip.core.interpolation import keys_weights
from napari_gridmip.core.peak import int32_indices
from napari_gridmip.core.runtime import strategy
from napari_gridmip.core.runtime.executables import kept
from napari_gridmip.core.runtime.precision import HIGHEST

ITERATIONS = 2  # from the Hessian estimate (~0.2 px off): median error 0.0065 px; 3 give 0.0058 at 1.6x the time
MAX_STEP = 0.5  # px per iteration: a step past this leaves the region the estimate came from
# Output rows refined per call (a progress and Cancel point): as many as keep a band's gathered
# 4x4 blocks of K-vectors within this many bytes, which with their derivatives then stay in
# cache. K=10, 900x900, float32: 16 rows (9 MB) refine in 0.42 s, 32 rows (18 MB) in 0.83 s.
BAND_BYTES = 9 * 2**20
MAX_BAND_ROWS = 64  # for narrow images: keeps Cancel and progress within a fraction of a second
# On accelerators (core.runtime.strategy.cache_sized_bands): bands of this many bytes of gathered blocks, and at most
# MAX_BANDS of them a call, for progress and Cancel
DEVICE_BAND_BYTES = 256 * 2**20
MAX_BANDS = 8
PAD = 2  # img1 is edge-padded by this much so that every 4x4 block lies inside


def _newton_step(blocks: jax.Array, ty: jax.Array, tx: jax.Array, z: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The Newton step ``(sy, sx)`` towards the maximum of the correlation at fractions ``(ty, tx)``.

    ``blocks`` is ``(..., 4, 4, K)`` (rows, columns, frames of img1 around the
    position), ``z`` is ``(..., K)``, img2's standardised vector. Where the
    correlation is not concave there, each axis takes its own 1D step if that
    axis is concave, else none; steps are clipped to ``MAX_STEP``.
    """
    wy, wy1, wy2 = keys_weights(ty, jnp)
    wx, wx1, wx2 = keys_weights(tx, jnp)
    rows = jnp.einsum("...i,...ijk->...jk", wy, blocks, precision=HIGHEST)
    rows_y = jnp.einsum("...i,...ijk->...jk", wy1, blocks, precision=HIGHEST)
    rows_yy = jnp.einsum("...i,...ijk->...jk", wy2, blocks, precision=HIGHEST)
    v = jnp.einsum("...j,...jk->...k", wx, rows, precision=HIGHEST)
    v_x = jnp.einsum("...j,...jk->...k", wx1, rows, precision=HIGHEST)
    v_xx = jnp.einsum("...j,...jk->...k", wx2, rows, precision=HIGHEST)
    v_y = jnp.einsum("...j,...jk->...k", wx, rows_y, precision=HIGHEST)
    v_xy = jnp.einsum("...j,...jk->...k", wx1, rows_y, precision=HIGHEST)
    v_yy = jnp.einsum("...j,...jk->...k", wx, rows_yy, precision=HIGHEST)

    def centred(a: jax.Array) -> jax.Array:
        return a - a.mean(axis=-1, keepdims=True)

    def dot(a: jax.Array, b: jax.Array) -> jax.Array:
        return jnp.sum(a * b, axis=-1)

    u, u_y, u_x, u_yy, u_xx, u_xy = (centred(a) for a in (v, v_y, v_x, v_yy, v_xx, v_xy))
    # r = N / sqrt(S): N = v.z (z has zero mean), S = |u|^2
    n, n_y, n_x, n_yy, n_xx, n_xy = (dot(a, z) for a in (v, v_y, v_x, v_yy, v_xx, v_xy))
    s = dot(u, u)
    s_y, s_x = 2 * dot(u, u_y), 2 * dot(u, u_x)
    s_yy = 2 * (dot(u_y, u_y) + dot(u, u_yy))
    s_xx = 2 * (dot(u_x, u_x) + dot(u, u_xx))
    s_xy = 2 * (dot(u_x, u_y) + dot(u, u_xy))
    ratio = normalised_derivatives((n, n_y, n_x, n_yy, n_xx, n_xy), (s, s_y, s_x, s_yy, s_xx, s_xy))
    ok, (g_y, g_x), (h_yy, h_xx, h_xy) = ratio.ok, ratio.g, ratio.h
    det = h_yy * h_xx - h_xy * h_xy
    concave = (det > 0) & (h_yy < 0)
    safe = jnp.where(concave, det, 1)
    sy = jnp.where(
        concave, -(h_xx * g_y - h_xy * g_x) / safe, jnp.where(h_yy < 0, -g_y / jnp.where(h_yy < 0, h_yy, -1), 0)
    )
    sx = jnp.where(
        concave, -(h_yy * g_x - h_xy * g_y) / safe, jnp.where(h_xx < 0, -g_x / jnp.where(h_xx < 0, h_xx, -1), 0)
    )
    zero = jnp.zeros_like(sy)
    return (
        jnp.where(ok, jnp.clip(sy, -MAX_STEP, MAX_STEP), zero),
        jnp.where(ok, jnp.clip(sx, -MAX_STEP, MAX_STEP), zero),
    )


def _block_slices(img1k: jax.Array, item: jax.Array) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """The 4x4 blocks of K-vectors at padded rows and columns ``(rows, cols)``: ``(..., 4, 4, K)``, each block a
    slice of ``img1k`` (the CPU's gather: a band's blocks stay in its caches)."""
    k, zero = img1k.shape[-1], jnp.int32(0)
    return jax.vmap(jax.vmap(lambda r, c: lax.dynamic_slice(img1k, (item, r, c, zero), (1, 4, 4, k))[0]))


def _block_table(
    img1k: jax.Array, item: jax.Array, row0: jax.Array, block: int, m: int
) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """The same blocks looked up in a table of every block the band's pixels can reach, one block a row of
    ``16 K`` values (padded to a multiple of 128 lanes), gathered as an embedding lookup.

    A TPU gathers rows of a table fast and small slices slowly: on a TPU v5e (1024^2, K=10, bands of 256 rows) a
    band's Newton steps took 1.77 s with the slices and 0.013 s with the table. The band's
    pixels start at most ``m + 1`` rows from their own (the integer peak within the window, the Hessian step within 1
    px) and move at
    most ``ITERATIONS * MAX_STEP`` = 1 row, so their blocks' top rows lie in ``[row0 - 1, row0 + block + 2m + 2]``
    (padded rows): the table holds those, ``16`` times the band's slab of img1 (at most 544 MB for a 256-row band of
    a 2048-wide K=10 image).
    """
    _, padded_rows, padded_cols, k = img1k.shape
    slab_rows = min(block + 2 * m + 7, padded_rows)  # block top rows [row0 - 1, row0 + block + 2m + 2], 4 rows each
    first = jnp.clip(row0 - 1, 0, padded_rows - slab_rows)  # dynamic_slice would clamp the same way
    slab = lax.dynamic_slice(img1k[item], int32_indices(first, 0, 0), (slab_rows, padded_cols, k))
    rows, cols = slab_rows - 3, padded_cols - 3
    table = jnp.stack([slab[i : i + rows, j : j + cols] for i in range(4) for j in range(4)], axis=2)
    table = table.reshape(rows * cols, 16 * k)
    lanes = -table.shape[1] % 128
    table = jnp.pad(table, ((0, 0), (0, lanes))) if lanes else table

    def take(r: jax.Array, c: jax.Array) -> jax.Array:
        index = jnp.clip(r - first, 0, rows - 1) * cols + c
        found = jnp.take(table, index.reshape(-1), axis=0, mode="clip")[:, : 16 * k]
        return found.reshape(r.shape + (4, 4, k))

    return take


@kept(static_argnames=("window", "block", "table"))
def _refine_band(img1k, z2, dy, dx, row0, *, window, block, table):
    """Refined ``(dy, dx)`` for output rows ``[row0, row0 + block)`` of every batch item: ``(B, block, No)``.

    ``img1k``: raw img1, K last and edge-padded by ``PAD``: ``(B, M + 4, N + 4, K)``;
    ``z2``: standardised img2 ``(B, K, M, N)``; ``dy``/``dx``: ``(B, Mo, No)``. ``table``: each pixel's 4x4 blocks
    looked up in a table of the band's blocks (accelerators), else sliced from ``img1k`` (the CPU).
    """
    m, n = window[0] // 2, window[1] // 2
    batch, _, out_cols = dy.shape
    rows, cols = z2.shape[-2:]
    k = z2.shape[1]
    row0 = row0.astype(jnp.int32)
    x = jnp.arange(out_cols, dtype=dy.dtype)[None, :] + n
    y = (row0 + jnp.arange(block, dtype=jnp.int32)).astype(dy.dtype)[:, None] + m

    def one_item(item, carry):
        item = item.astype(jnp.int32)  # the loop counts in int64 when x64 is on for a float64 call
        ry, rx = carry
        z = lax.dynamic_slice(z2[item], int32_indices(0, row0 + m, n), (k, block, out_cols))
        z = jnp.moveaxis(z, 0, -1)  # (block, No, K)
        start_y = lax.dynamic_slice(dy[item], int32_indices(row0, 0), (block, out_cols))
        start_x = lax.dynamic_slice(dx[item], int32_indices(row0, 0), (block, out_cols))
        py = jnp.clip(y + jnp.nan_to_num(start_y), 0, rows - 1)
        px = jnp.clip(x + jnp.nan_to_num(start_x), 0, cols - 1)
        take = _block_table(img1k, item, row0, block, m) if table else _block_slices(img1k, item)

        def newton(_, position):
            py, px = position
            y0, x0 = jnp.floor(py), jnp.floor(px)
            # taps y0 - 1 .. y0 + 2 sit at padded rows y0 - 1 + PAD ..
            blocks = take((y0.astype(jnp.int32) - 1 + PAD), (x0.astype(jnp.int32) - 1 + PAD))
            sy, sx = _newton_step(blocks, py - y0, px - x0, z)
            return jnp.clip(py + sy, 0, rows - 1), jnp.clip(px + sx, 0, cols - 1)

        # a loop, not unrolled: one copy of the step in the program (half the compile of two copies)
        py, px = lax.fori_loop(0, ITERATIONS, newton, (py, px))
        new_y = jnp.where(jnp.isnan(start_y), start_y, py - y)
        new_x = jnp.where(jnp.isnan(start_x), start_x, px - x)
        return ry.at[item].set(new_y), rx.at[item].set(new_x)

    empty = jnp.zeros((batch, block, out_cols), dy.dtype)
    return lax.fori_loop(0, batch, one_item, (empty, empty))


@partial(jax.jit, static_argnames=("dtype",))
def _padded_k_last(img1: jax.Array, *, dtype: str) -> jax.Array:
    """``(..., K, M, N)`` -> ``(B, M + 2 PAD, N + 2 PAD, K)`` ``dtype``, edges repeated: each pixel's taps
    contiguous (the batch axes flattened and the cast in this program: eager ones compiled their own)."""
    img1 = img1.reshape((-1,) + img1.shape[-3:]).astype(dtype)
    return jnp.pad(jnp.moveaxis(img1, 1, -1), ((0, 0), (PAD, PAD), (PAD, PAD), (0, 0)), mode="edge")


def refine_plan(out_shape: tuple[int, int], frames: int, dtype: Any) -> tuple[int, list[int]]:
    """(rows per band, band start rows) for an ``out_shape = (Mo, No)`` refinement; the last band ends flush."""
    out_rows, out_cols = out_shape
    per_row = out_cols * 16 * frames * np.dtype(dtype).itemsize  # one row's gathered blocks
    if strategy.cache_sized_bands():
        block = max(1, min(BAND_BYTES // per_row, MAX_BAND_ROWS, out_rows))
    else:
        block = max(1, min(max(DEVICE_BAND_BYTES // per_row, math.ceil(out_rows / MAX_BANDS)), out_rows))
    return block, sorted({min(start, out_rows - block) for start in range(0, out_rows, block)})


def refine_displacement(
    img1: Any,
    z2: jax.Array,
    window: tuple[int, int],
    dy: jax.Array,
    dx: jax.Array,
    *,
    dtype: np.dtype,
    on_band: Callable[[int], None] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Refined ``(dy, dx)`` ``(B, Mo, No)``; ``img1`` is the raw ``(..., K, M, N)`` stack on the device (its batch
    axes flattened to ``B`` here).

    Runs band by band (one compiled program for all bands); ``on_band(done)`` is
    called before each band and may raise to stop the refinement between bands.

    The 3x3 fits of the integer map (Hessian step, paraboloid) are biased towards whole pixels ("pixel locking"):
    the correlation peak is not a quadratic. Here img1 is interpolated between pixels (Keys cubic convolution), and
    the Pearson correlation ``r(y, x)`` between the interpolated K-vector and img2's is maximised by Newton's method
    from the Hessian estimate, with the gradient and Hessian of ``r`` in closed form: one gather of each pixel's 4x4
    block of K-vectors per iteration gives the interpolated vector and its first and second derivatives, and
    ``r = (v . z) / |v - mean(v)|`` (``z`` standardised) is differentiated by hand: 16 taps a pixel per iteration,
    for ``ITERATIONS`` iterations (ever finer 3x3 stencils of interpolated values took 44x the Hessian step's time).
    """
    img1k = _padded_k_last(img1, dtype=np.dtype(dtype).name)
    block, starts = refine_plan(dy.shape[1:], img1.shape[-3], dtype)
    table = not strategy.cache_sized_bands()  # an accelerator's large bands look their blocks up in a table
    pieces = []
    for done, row0 in enumerate(starts):
        if on_band is not None:
            on_band(done)
        pieces.append(_refine_band(img1k, z2, dy, dx, np.int32(row0), window=window, block=block, table=table))
        jax.block_until_ready(pieces[-1])
    return join_bands(pieces, keep=kept_rows(starts, block))
