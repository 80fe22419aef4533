"""Sub-pixel refinement by re-evaluating the correlation between pixels.

The 3x3 fits of the integer map (Hessian step, paraboloid) are biased towards
whole pixels ("pixel locking"): the correlation peak is not a quadratic. Here
img1 is interpolated (Keys cubic convolution) at sub-pixel offsets around the
first estimate, the Pearson correlation with img2 is evaluated there, and the
estimate climbs to the peak on ever finer 3x3 stencils (steps 1/2, 1/4, 1/8
and 1/16 px), so the final quadratic fit spans a region where the peak is
quadratic to high accuracy.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from napari_gridmip.core._peak import int32_indices, subpixel_offset

STEPS = (0.5, 0.25, 0.125, 0.0625)

BAND_ROWS = 32  # output rows refined per step of the loop: bounds the (K, rows, N, 16) gathers


def _keys_weights(t: jax.Array) -> jax.Array:
    """Keys (a = -0.5) cubic convolution weights of the 4 taps at -1, 0, 1, 2 for fraction ``t``: ``(..., 4)``."""
    t2, t3 = t * t, t * t * t
    return jnp.stack(
        [
            -0.5 * t3 + t2 - 0.5 * t,
            1.5 * t3 - 2.5 * t2 + 1,
            -1.5 * t3 + 2 * t2 + 0.5 * t,
            0.5 * t3 - 0.5 * t2,
        ],
        axis=-1,
    )


def interpolate_stack(stack: jax.Array, y: jax.Array, x: jax.Array) -> jax.Array:
    """Keys-cubic values of every frame of ``stack`` ``(K, M, N)`` at positions ``(y, x)`` (any shape P).

    Taps beyond the border repeat the edge pixel. Returns ``(K, *P)``.
    """
    rows, cols = stack.shape[-2:]
    y0, x0 = jnp.floor(y), jnp.floor(x)
    wy, wx = _keys_weights(y - y0), _keys_weights(x - x0)
    iy = jnp.clip(y0.astype(jnp.int32)[..., None] + jnp.arange(-1, 3), 0, rows - 1)  # (*P, 4)
    ix = jnp.clip(x0.astype(jnp.int32)[..., None] + jnp.arange(-1, 3), 0, cols - 1)
    flat = stack.reshape(stack.shape[0], -1)
    taps = flat[:, iy[..., :, None] * cols + ix[..., None, :]]  # (K, *P, 4, 4)
    return jnp.einsum("k...ij,...i,...j->k...", taps, wy, wx)


def _pearson(v1: jax.Array, z2: jax.Array) -> jax.Array:
    """Pearson correlation along axis 0 between raw vectors ``v1`` and standardised ``z2``."""
    centred = v1 - v1.mean(axis=0)
    norm = jnp.sqrt(jnp.sum(centred * centred, axis=0))
    return jnp.where(norm > 0, jnp.sum(centred * z2, axis=0) / jnp.where(norm > 0, norm, 1), 0)


def _refine_rows(img1, z2, y, x, dy, dx):
    """Climb from ``(dy, dx)`` to the interpolated correlation peak for a block of pixels."""

    offsets = jnp.array([-1.0, 0.0, 1.0], dtype=dy.dtype)
    start_y, start_x = jnp.nan_to_num(dy), jnp.nan_to_num(dx)
    for step in STEPS:
        py = y + start_y
        px = x + start_x
        sy = py[None, None] + step * offsets[:, None, None, None]  # (3, 1, *P)
        sx = px[None, None] + step * offsets[None, :, None, None]  # (1, 3, *P)
        sy, sx = jnp.broadcast_arrays(sy, sx)
        values = _pearson(interpolate_stack(img1, sy, sx), z2[:, None, None])  # (3, 3, *P)
        hood = jnp.moveaxis(values, (0, 1), (-2, -1))
        sub_y, sub_x = subpixel_offset(hood, "hessian")
        start_y = start_y + step * jnp.clip(sub_y, -1, 1)
        start_x = start_x + step * jnp.clip(sub_x, -1, 1)
    return jnp.where(jnp.isnan(dy), dy, start_y), jnp.where(jnp.isnan(dx), dx, start_x)


@partial(jax.jit, static_argnames=("window", "block"))
def _refine_band(img1, z2, dy, dx, row0, *, window, block):
    """Refined ``(dy, dx)`` for output rows ``[row0, row0 + block)`` of every batch item: ``(B, block, No)``.

    img1 ``(B, K, M, N)`` float, z2 standardised ``(B, K, M, N)``, dy/dx ``(B, Mo, No)``.
    """
    m, n = window[0] // 2, window[1] // 2
    batch, _, out_cols = dy.shape
    x = jnp.arange(out_cols, dtype=dy.dtype)[None, :] + n
    y = (row0 + jnp.arange(block, dtype=jnp.int32)).astype(dy.dtype)[:, None] + m

    def one_item(item, carry):
        ry, rx = carry
        z2_rows = lax.dynamic_slice(z2[item], int32_indices(0, row0 + m, n), (z2.shape[1], block, out_cols))
        dy_rows = lax.dynamic_slice(dy[item], int32_indices(row0, 0), (block, out_cols))
        dx_rows = lax.dynamic_slice(dx[item], int32_indices(row0, 0), (block, out_cols))
        new_y, new_x = _refine_rows(img1[item], z2_rows, y, x, dy_rows, dx_rows)
        return ry.at[item].set(new_y), rx.at[item].set(new_x)

    empty = jnp.zeros((batch, block, out_cols), dy.dtype)
    return lax.fori_loop(0, batch, one_item, (empty, empty))


def refine_plan(out_rows: int) -> list[int]:
    """Start rows of the refinement's bands of ``BAND_ROWS`` rows; the last one ends flush with the edge."""
    block = min(BAND_ROWS, out_rows)
    return sorted({min(start, out_rows - block) for start in range(0, out_rows, block)})


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
    """Refined ``(dy, dx)`` ``(B, Mo, No)``; ``img1`` is the raw ``(B, K, M, N)`` stack on the device.

    Runs band by band (one compiled program for all bands); ``on_band(done)`` is
    called before each band and may raise to stop the refinement between bands.
    """
    img1 = img1.astype(dtype)
    out_rows = dy.shape[1]
    starts = refine_plan(out_rows)
    block = min(BAND_ROWS, out_rows)
    pieces = []
    for done, row0 in enumerate(starts):
        if on_band is not None:
            on_band(done)
        pieces.append(_refine_band(img1, z2, dy, dx, jnp.int32(row0), window=window, block=block))
        jax.block_until_ready(pieces[-1])
    # the last band may overlap the one before: keep each row once
    keep = [(starts[i + 1] - starts[i]) if i + 1 < len(starts) else block for i in range(len(starts))]
    return tuple(jnp.concatenate([p[part][:, :rows] for p, rows in zip(pieces, keep)], axis=1) for part in range(2))
