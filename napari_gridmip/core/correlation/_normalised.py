"""The derivatives of a normalised correlation ``r = N / sqrt(S)`` from those of ``N`` and ``S`` (a leaf).

Both sub-pixel Newton steps maximise such a ratio over an interpolated position, :mod:`.refine` from gathered
4 x 4 blocks and :mod:`._subset_newton` from a subset's tap sums: how each gets ``N`` and ``S`` differs, the
quotient rule that turns them into ``r``'s gradient and Hessian is this one function.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Normalised(NamedTuple):
    """``r = N / sqrt(S)`` and its derivatives; 0 (``r``) and meaningless elsewhere where ``S`` is not positive."""

    ok: jax.Array  # S > 0
    r: jax.Array
    g: tuple[jax.Array, jax.Array]  # (r_y, r_x)
    h: tuple[jax.Array, jax.Array, jax.Array]  # (r_yy, r_xx, r_xy)


def normalised_derivatives(n: tuple[jax.Array, ...], s: tuple[jax.Array, ...]) -> Normalised:
    """The gradient and Hessian of ``r = N / sqrt(S)`` over ``(y, x)``.

    Parameters
    ----------
    n, s
        ``(N, N_y, N_x, N_yy, N_xx, N_xy)`` and ``(S, S_y, S_x, S_yy, S_xx, S_xy)``, arrays of one shape.

    Returns
    -------
    Normalised
        ``ok`` (``S > 0``), ``r`` (0 where not ok), ``g = (r_y, r_x)`` and ``h = (r_yy, r_xx, r_xy)`` (finite where
        not ok: ``S`` is taken as 1 there). With ``a_k = S^(-k/2)``::

            r_y  = N_y a1 - N a3 S_y / 2
            r_yy = N_yy a1 - N_y a3 S_y + 3/4 N a5 S_y^2 - N a3 S_yy / 2
            r_xy = N_xy a1 - (N_y S_x + N_x S_y) a3 / 2 + 3/4 N a5 S_x S_y - N a3 S_xy / 2
    """
    n, n_y, n_x, n_yy, n_xx, n_xy = n
    s, s_y, s_x, s_yy, s_xx, s_xy = s
    ok = s > 0
    s = jnp.where(ok, s, 1)
    a1, a3, a5 = s**-0.5, s**-1.5, s**-2.5
    r = jnp.where(ok, n * a1, 0)
    g_y = n_y * a1 - 0.5 * n * a3 * s_y
    g_x = n_x * a1 - 0.5 * n * a3 * s_x
    h_yy = n_yy * a1 - n_y * a3 * s_y + 0.75 * n * a5 * s_y * s_y - 0.5 * n * a3 * s_yy
    h_xx = n_xx * a1 - n_x * a3 * s_x + 0.75 * n * a5 * s_x * s_x - 0.5 * n * a3 * s_xx
    h_xy = n_xy * a1 - 0.5 * n_y * a3 * s_x - 0.5 * n_x * a3 * s_y + 0.75 * n * a5 * s_x * s_y - 0.5 * n * a3 * s_xy
    return Normalised(ok, r, (g_y, g_x), (h_yy, h_xx, h_xy))
