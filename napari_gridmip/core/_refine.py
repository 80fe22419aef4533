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

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

STEPS = (0.5, 0.25, 0.125, 0.0625)
from napari_gridmip.core.correlation import int32_indices, subpixel_offset  # noqa: E402

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


@partial(jax.jit, static_argnames=("window",))
def _refine(img1, z2, dy, dx, *, window):
    """img1 ``(B, K, M, N)`` float, z2 standardised ``(B, K, M, N)``, dy/dx ``(B, Mo, No)``."""
    m, n = window[0] // 2, window[1] // 2
    batch, out_rows, out_cols = dy.shape
    block = min(BAND_ROWS, out_rows)
    blocks = -(-out_rows // block)
    x = jnp.arange(out_cols, dtype=dy.dtype)[None, :] + n

    def body(step, carry):
        ry, rx = carry
        item = step // blocks
        start = jnp.minimum((step % blocks) * block, out_rows - block).astype(jnp.int32)
        y = (start + jnp.arange(block, dtype=jnp.int32)).astype(dy.dtype)[:, None] + m
        z2_rows = lax.dynamic_slice(z2[item], int32_indices(0, start + m, n), (z2.shape[1], block, out_cols))
        dy_rows = lax.dynamic_slice(dy[item], int32_indices(start, 0), (block, out_cols))
        dx_rows = lax.dynamic_slice(dx[item], int32_indices(start, 0), (block, out_cols))
        new_y, new_x = _refine_rows(img1[item], z2_rows, y, x, dy_rows, dx_rows)
        ry = lax.dynamic_update_slice(ry, new_y[None], int32_indices(item, start, 0))
        rx = lax.dynamic_update_slice(rx, new_x[None], int32_indices(item, start, 0))
        return ry, rx

    return lax.fori_loop(0, batch * blocks, body, (dy, dx))


def refine_displacement(
    img1: Any, z2: jax.Array, window: tuple[int, int], dy: jax.Array, dx: jax.Array, *, dtype: np.dtype
) -> tuple[jax.Array, jax.Array]:
    """Refined ``(dy, dx)`` ``(B, Mo, No)``; ``img1`` is the raw ``(B, K, M, N)`` stack on the device."""
    return _refine(img1.astype(dtype), z2, dy, dx, window=window)
