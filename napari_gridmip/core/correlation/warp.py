"""The algebra of the inverse-compositional Gauss-Newton (IC-GN) of a first-order (affine) subset warp.

Both IC-GN kernels, the pair's (:mod:`.affine`) and the sequence's (:mod:`.series`), match a reference subset
whose pixel at offset ``(eta, zeta)`` from its centre is found in the deformed image at::

    eta'  = eta  + v + v_y eta + v_x zeta
    zeta' = zeta + u + u_y eta + u_x zeta

with the parameters ``p = (v, v_y, v_x, u, u_y, u_x)`` ``(P, 6)``. What they share lives here: the cubic
B-spline's tap weights, the warped positions, the steepest-descent images' Hessian and right-hand side (as
moments of the reference's gradients over the subset: plain matrix products), the packed Cholesky factor and
its solve (unrolled: XLA's batched LAPACK calls loop over the points on the CPU), the composition of a warp with
an increment's inverse, and the increment's largest move of the subset's corners (the convergence test); and the
rigid warp (translation and rotation, 3 parameters) as a constrained affine one: its Hessian and right-hand side
projected on the rigid directions, its increment mapped back to the affine parameters exactly.
Every function is batched over points (the leading axis) and traceable (pure ``jax.numpy``).

References
----------
B. Pan, K. Li, W. Tong, "Fast, robust and accurate digital image correlation calculation without redundant
computations", Exp. Mech. 53, 1277-1289 (2013).
M. Unser, "Splines: a perfect fit for signal and image processing", IEEE Signal Process. Mag. 16(6), 22-38
(1999).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# the Hessian's entry (i, j), i = 3 a + m: the gradient product of axes (a, b) (0: y y, 1: y x, 2: x x) ...
_PAIR = np.array([[0, 1], [1, 2]])
# ... times the moment of offsets (m, n): 0: 1, 1: eta, 2: zeta, 3: eta^2, 4: eta zeta, 5: zeta^2
_MOMENT = np.array([[0, 1, 2], [1, 3, 4], [2, 4, 5]])


def spline_weights(t: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """The cubic B-spline's weights of the taps -1, 0, 1, 2 at the fraction ``t`` (as
    :func:`napari_gridmip.core.interpolation.bspline_weights` gives them), each an array shaped as ``t``."""
    t2, u = t * t, 1 - t
    t3 = t2 * t
    return u * u * u / 6, (3 * t3 - 6 * t2 + 4) / 6, (-3 * t3 + 3 * t2 + 3 * t + 1) / 6, t3 / 6


def spline_slopes(t: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """The derivatives of :func:`spline_weights` with respect to the position."""
    t2, u = t * t, 1 - t
    return -u * u / 2, (3 * t2 - 4 * t) / 2, (-3 * t2 + 2 * t + 1) / 2, t2 / 2


def subset_offsets(subset: tuple[int, int], dtype) -> tuple[jax.Array, jax.Array]:
    """The offsets ``(eta, zeta)`` ``(S,)`` of a subset's pixels from its centre, row by row."""
    hs, hw = subset[0] // 2, subset[1] // 2
    eta, zeta = jnp.meshgrid(jnp.arange(-hs, hs + 1, dtype=dtype), jnp.arange(-hw, hw + 1, dtype=dtype),
                             indexing="ij")  # fmt: skip
    return eta.ravel(), zeta.ravel()


def moments(eta: jax.Array, zeta: jax.Array) -> jax.Array:
    """The offsets' monomials ``(1, eta, zeta, eta^2, eta zeta, zeta^2)`` ``(S, 6)``: the steepest-descent images
    are the gradients times the first three, their products the gradients' products times all six."""
    return jnp.stack([jnp.ones_like(eta), eta, zeta, eta * eta, eta * zeta, zeta * zeta], -1)


def over_subset(values: jax.Array, weights: jax.Array) -> jax.Array:
    """``sum_s values[:, s] weights[s, m]``: ``values`` ``(P, S)``, ``weights`` ``(S, m)`` -> ``(P, m)``, one
    matrix product (full precision: an accelerator's default would round the operands). One per product: a
    stack of them into one operand was a concatenation costing 3x the product on the CPU."""
    return jnp.dot(values, weights, precision=lax.Precision.HIGHEST)


def hessian(yy: jax.Array, yx: jax.Array, xx: jax.Array, monomials: jax.Array) -> jax.Array:
    """The Gauss-Newton Hessian ``J'J`` ``(P, 6, 6)`` of the steepest-descent images ``J = (f_y, f_x) (1, eta,
    zeta)`` from the reference gradients' products at each pixel ``f_y f_y``, ``f_y f_x``, ``f_x f_x`` ``(P, S)``
    (summed over frames and masked by the caller) and :func:`moments` ``(S, 6)``: three matrix products (a
    batched ``(P, S, 6)`` contraction, or 21 sums of products, cost 4x and 10x as much on the CPU)."""
    sums = [over_subset(a, monomials) for a in (yy, yx, xx)]  # (P, 6) each
    return jnp.stack([jnp.stack([sums[_PAIR[i // 3, j // 3]][:, _MOMENT[i % 3, j % 3]] for j in range(6)], -1)
                      for i in range(6)], -2)  # fmt: skip


def steepest_descent(ry: jax.Array, rx: jax.Array, monomials: jax.Array) -> jax.Array:
    """``J' r`` ``(P, 6)`` from the products of the residual with the reference gradients ``f_y r``, ``f_x r``
    ``(P, S)`` (summed over frames by the caller) and :func:`moments`."""
    return jnp.concatenate([over_subset(ry, monomials[:, :3]), over_subset(rx, monomials[:, :3])], -1)


def cholesky(h: jax.Array) -> jax.Array:
    """The lower Cholesky factors of a batch of symmetric positive definite ``h`` ``(n, 6, 6)``, packed by rows
    ``(n, 21)`` with the diagonal inverted (``L[i, j]``, ``j < i``, at ``i (i + 1) / 2 + j``; ``1 / L[i, i]`` at
    ``i (i + 1) / 2 + i``). Unrolled over the entries: XLA's batched factorisation and triangular solves on
    the CPU are LAPACK calls looping over the points, milliseconds per band (NaN where ``h`` is not positive
    definite, as LAPACK's)."""
    size = h.shape[-1]
    low: dict[tuple[int, int], jax.Array] = {}
    for j in range(size):
        low[j, j] = lax.rsqrt(h[:, j, j] - sum((low[j, m] ** 2 for m in range(j)), jnp.zeros_like(h[:, 0, 0])))
        for i in range(j + 1, size):
            low[i, j] = (h[:, i, j] - sum((low[i, m] * low[j, m] for m in range(j)), 0)) * low[j, j]
    return jnp.stack([low[i, j] for i in range(size) for j in range(i + 1)], -1)


def cholesky_solve(factor: jax.Array, b: jax.Array) -> jax.Array:
    """``x`` with ``L L' x = b`` for the packed factors of :func:`cholesky` ``(n, 21)`` and ``b`` ``(n, 6)``."""
    size = b.shape[-1]

    def at(i, j):
        return factor[:, i * (i + 1) // 2 + j]

    y: list[jax.Array] = []
    for i in range(size):
        y.append((b[:, i] - sum((at(i, m) * y[m] for m in range(i)), 0)) * at(i, i))
    x: list[jax.Array] = [jnp.zeros_like(b[:, 0])] * size
    for i in reversed(range(size)):
        x[i] = (y[i] - sum((at(m, i) * x[m] for m in range(i + 1, size)), 0)) * at(i, i)
    return jnp.stack(x, -1)


def positions(cy: jax.Array, cx: jax.Array, eta: jax.Array, zeta: jax.Array, p: jax.Array):
    """The warped positions ``(py, px)`` ``(P, S)`` of the subsets centred at ``(cy, cx)`` ``(P,)`` under the
    warps ``p`` ``(P, 6)``, for the offsets ``(eta, zeta)`` ``(S,)``."""
    v, vy, vx, u, uy, ux = (p[:, i : i + 1] for i in range(6))
    py = cy[:, None] + eta[None, :] + v + vy * eta[None, :] + vx * zeta[None, :]
    px = cx[:, None] + zeta[None, :] + u + uy * eta[None, :] + ux * zeta[None, :]
    return py, px


def compose_inverse(p: jax.Array, dp: jax.Array) -> jax.Array:
    """The warp ``W(p) o W(dp)^-1`` as parameters ``(n, 6)`` = ``(v, v_y, v_x, u, u_y, u_x)``: IC-GN's update.

    In closed form (``jnp.linalg.inv`` of a batch of 3 x 3 matrices is a LAPACK call per band, several times
    the rest of a step on the CPU): with ``W(q) = [[A(q), t(q)], [0, 1]]``, the result is ``A(p) A(dp)^-1`` and
    ``t(p) - A(p) A(dp)^-1 t(dp)``; its gradient part ``A(p) A(dp)^-1 - I = (A(p) - A(dp)) A(dp)^-1`` is formed
    from the differences of the gradients, with no ``1 + small - 1`` rounding."""
    v, vy, vx, u, uy, ux = (p[:, i] for i in range(6))
    dv, dvy, dvx, du, duy, dux = (dp[:, i] for i in range(6))
    det = (1 + dvy) * (1 + dux) - dvx * duy
    # A(dp)^-1 = [[1 + dux, -dvx], [-duy, 1 + dvy]] / det
    i00, i01, i10, i11 = (1 + dux) / det, -dvx / det, -duy / det, (1 + dvy) / det
    e00, e01, e10, e11 = vy - dvy, vx - dvx, uy - duy, ux - dux  # A(p) - A(dp)
    g00, g01 = e00 * i00 + e01 * i10, e00 * i01 + e01 * i11  # (A(p) - A(dp)) A(dp)^-1 = A(p) A(dp)^-1 - I
    g10, g11 = e10 * i00 + e11 * i10, e10 * i01 + e11 * i11
    return jnp.stack([v - (1 + g00) * dv - g01 * du, g00, g01, u - g10 * dv - (1 + g11) * du, g10, g11], -1)


def corner_move(dp: jax.Array, corner: tuple[float, float] | jax.Array) -> jax.Array:
    """The largest move (px) of a subset's corners under the increment ``dp`` ``(n, 6)``, along either axis:
    ``max(|dv| + |dv_y| hs + |dv_x| hw, |du| + |du_y| hs + |du_x| hw)`` for ``corner = (hs, hw)``, the subset's
    half sizes. A point whose increment moves no corner by more than the tolerance has converged."""
    move_y = jnp.abs(dp[:, 0]) + jnp.abs(dp[:, 1]) * corner[0] + jnp.abs(dp[:, 2]) * corner[1]
    return jnp.maximum(move_y, jnp.abs(dp[:, 3]) + jnp.abs(dp[:, 4]) * corner[0] + jnp.abs(dp[:, 5]) * corner[1])


# the rigid warp's parameters q = (v, theta, u) as a direction in p's: a small turn theta moves eta by -theta zeta
# and zeta by theta eta (p's v_x = -sin theta, u_y = sin theta)
RIGID_BASIS = np.array([[1, 0, 0], [0, 0, 0], [0, -1, 0], [0, 0, 1], [0, 1, 0], [0, 0, 0]], np.float64)
RIGID_SHIFTS = (0, 2)  # the indices of v and u among q's


def constrained(h: jax.Array) -> jax.Array:
    """The Hessian ``C' h C`` ``(n, 3, 3)`` of the rigid warp ``(v, theta, u)`` from the affine one's ``h``
    ``(n, 6, 6)``, ``C`` = :data:`RIGID_BASIS` (the chain rule at ``theta = 0``, where IC-GN linearises: the rigid
    steepest-descent images are combinations of the affine ones)."""
    basis = jnp.asarray(RIGID_BASIS, h.dtype)
    return jnp.einsum("ai,nab,bj->nij", basis, h, basis, precision=lax.Precision.HIGHEST)


def rigid_rhs(b: jax.Array) -> jax.Array:
    """The right-hand side ``b C`` ``(n, 3)`` of the rigid warp from the affine one's ``b`` ``(n, 6)``: ``v``,
    ``u_y - v_x`` (the turn), ``u``."""
    return jnp.stack([b[:, 0], b[:, 4] - b[:, 2], b[:, 3]], -1)


def rigid_warp(q: jax.Array) -> jax.Array:
    """The affine parameters ``(n, 6)`` of the rigid warps ``q = (v, theta, u)`` ``(n, 3)`` (theta in radians):
    ``A = [[cos, -sin], [sin, cos]]``, exact, so that IC-GN's composition of rigid warps stays rigid."""
    s = jnp.sin(q[:, 1])
    cm1 = -2 * jnp.sin(q[:, 1] / 2) ** 2  # cos - 1 with no rounding of 1 - small
    return jnp.stack([q[:, 0], cm1, -s, q[:, 2], s, cm1], -1)


def to_rigid(p: jax.Array) -> jax.Array:
    """The rigid warp nearest an affine one ``p`` ``(n, 6)`` (its linear part's rotation, the polar
    decomposition's angle for 2 x 2: ``atan2(A10 - A01, A00 + A11)``), as affine parameters ``(n, 6)``."""
    theta = jnp.arctan2(p[:, 4] - p[:, 2], 2 + p[:, 1] + p[:, 5])
    return rigid_warp(jnp.stack([p[:, 0], theta, p[:, 3]], -1))
