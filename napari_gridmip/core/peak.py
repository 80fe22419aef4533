"""Sub-pixel peak fits and slice indices, shared by the correlation search, its refinement and the stitching's
two pair engines: documented internal API of the core, apart from ``correlation`` and ``refine`` so that neither
imports the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jax


def int32_indices(*values: Any) -> tuple[jax.Array, ...]:
    """Start indices for dynamic slices, all int32 (Python ints turn int64 when x64 is on)."""
    import jax.numpy as jnp  # not at the top: the stitching's NumPy engine imports this module without JAX

    return tuple(jnp.asarray(v).astype(jnp.int32) for v in values)


def quadratic_peak(gy, gx, hyy, hxx, hxy, *, xp):
    """The stationary point of a 2D quadratic with gradient (gy, gx) and Hessian [[hyy, hxy], [hxy, hxx]].

    Where the quadratic has no maximum within one pixel (not negative definite, or
    the step leaves [-1, 1]), each axis falls back to its own 1D parabola, clipped
    to [-0.5, 0.5], or to 0 where that axis is not concave either. ``xp``: the
    array namespace, ``jax.numpy`` or ``numpy`` (the same operations on both).
    """
    det = hyy * hxx - hxy * hxy
    safe_det = xp.where(det > 0, det, 1)
    dy = -(hxx * gy - hxy * gx) / safe_det
    dx = -(hyy * gx - hxy * gy) / safe_det
    ok = (det > 0) & (hyy < 0) & (xp.abs(dy) <= 1) & (xp.abs(dx) <= 1)
    dy_1d = xp.where(hyy < 0, xp.clip(-gy / xp.where(hyy < 0, hyy, -1), -0.5, 0.5), 0)
    dx_1d = xp.where(hxx < 0, xp.clip(-gx / xp.where(hxx < 0, hxx, -1), -0.5, 0.5), 0)
    return xp.where(ok, dy, dy_1d), xp.where(ok, dx, dx_1d)


def subpixel_offset(c: jax.Array, method: str) -> tuple[jax.Array, jax.Array]:
    """Sub-pixel peak offset from the 3x3 neighbourhood ``c[..., 3, 3]`` of an integer peak.

    ``"hessian"``: a Newton step with central differences at the peak (as in
    speckle-tracking tools). ``"paraboloid"``: the least-squares 2D quadratic
    through all 9 values. ``"none"``: zeros.
    """
    import jax.numpy as jnp  # not at the top: the stitching's NumPy engine imports this module without JAX

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
    return quadratic_peak(gy, gx, hyy, hxx, hxy, xp=jnp)
