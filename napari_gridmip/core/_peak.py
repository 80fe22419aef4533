"""Small pieces shared by the correlation search and its refinement: sub-pixel peak fits and slice indices.

Kept apart from ``correlation`` and ``_refine`` so that neither imports the other.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def int32_indices(*values: Any) -> tuple[jax.Array, ...]:
    """Start indices for dynamic slices, all int32 (Python ints turn int64 when x64 is on)."""
    return tuple(jnp.asarray(v).astype(jnp.int32) for v in values)


def quadratic_peak(gy, gx, hyy, hxx, hxy):
    """The stationary point of a 2D quadratic with gradient (gy, gx) and Hessian [[hyy, hxy], [hxy, hxx]].

    Where the quadratic has no maximum within one pixel (not negative definite, or
    the step leaves [-1, 1]), each axis falls back to its own 1D parabola, clipped
    to [-0.5, 0.5], or to 0 where that axis is not concave either.
    """
    det = hyy * hxx - hxy * hxy
    safe_det = jnp.where(det > 0, det, 1)
    dy = -(hxx * gy - hxy * gx) / safe_det
    dx = -(hyy * gx - hxy * gy) / safe_det
    ok = (det > 0) & (hyy < 0) & (jnp.abs(dy) <= 1) & (jnp.abs(dx) <= 1)
    dy_1d = jnp.where(hyy < 0, jnp.clip(-gy / jnp.where(hyy < 0, hyy, -1), -0.5, 0.5), 0)
    dx_1d = jnp.where(hxx < 0, jnp.clip(-gx / jnp.where(hxx < 0, hxx, -1), -0.5, 0.5), 0)
    return jnp.where(ok, dy, dy_1d), jnp.where(ok, dx, dx_1d)


def subpixel_offset(c: jax.Array, method: str) -> tuple[jax.Array, jax.Array]:
    """Sub-pixel peak offset from the 3x3 neighbourhood ``c[..., 3, 3]`` of an integer peak.

    ``"hessian"``: a Newton step with central differences at the peak (as in
    speckle-tracking tools). ``"paraboloid"``: the least-squares 2D quadratic
    through all 9 values. ``"none"``: zeros.
    """
    if method == "none":
        zero = jnp.zeros(c.shape[:-2], c.dtype)
        return zero, zero
    if method == "paraboloid":
        rows, cols = c.sum(axis=-1), c.sum(axis=-2)
        gy, gx = (rows[..., 2] - rows[..., 0]) / 6, (cols[..., 2] - cols[..., 0]) / 6
        hyy = (rows[..., 0] + rows[..., 2] - 2 * rows[..., 1]) / 3
        hxx = (cols[..., 0] + cols[..., 2] - 2 * cols[..., 1]) / 3
    else:
        gy, gx = (c[..., 2, 1] - c[..., 0, 1]) / 2, (c[..., 1, 2] - c[..., 1, 0]) / 2
        hyy = c[..., 2, 1] - 2 * c[..., 1, 1] + c[..., 0, 1]
        hxx = c[..., 1, 2] - 2 * c[..., 1, 1] + c[..., 1, 0]
    hxy = (c[..., 2, 2] - c[..., 2, 0] - c[..., 0, 2] + c[..., 0, 0]) / 4
    return quadratic_peak(gy, gx, hyy, hxx, hxy)
