"""The cubic interpolation weights, written once: Keys' cubic convolution (a = -0.5) and the cubic B-spline.

Documented internal API of the core (subset refinement, dense refinement, affine subsets, stitching, fusion).
``xp`` is ``jax.numpy`` or ``numpy``: the same operations in the same order on both, so that the stitching's NumPy
engine and its JAX one weigh alike. It imports neither, and nothing of the package.
"""

from __future__ import annotations

from typing import Any

TAPS = (-1, 0, 1, 2)
"""The offsets of the 4 taps from ``floor(position)``, in the order of the weights' last axis."""


# Polynomials in t, no |x| branches: the derivatives come out exact and continuous, and a position's weights need
# no distances t - tap (which would round t again). The sample at q + t reads pixels q - 1 .. q + 2.
def keys_weights(t: Any, xp: Any) -> tuple[Any, Any, Any]:
    """Keys' cubic convolution weights (a = -0.5) of the taps at -1, 0, 1, 2 for the fraction ``t``.

    Parameters
    ----------
    t
        Fractions in ``[0, 1)``, any shape (an array of ``xp``, or a scalar of its dtype).
    xp
        The array namespace: ``jax.numpy`` or ``numpy``.

    Returns
    -------
    tuple
        ``(w, d1, d2)``: the weights and their first and second derivatives in ``t``, each ``(*t.shape, 4)``
        in ``t``'s dtype. The weights sum to 1 and reproduce quadratics; ``t = 0`` gives exactly
        ``(0, 1, 0, 0)`` (an integer position copies its pixel). ``d1`` is the kernel's slope
        ``K'(t - tap)``, the derivative of the interpolated value with respect to the position.

    References
    ----------
    R. Keys, IEEE Trans. Acoust., Speech, Signal Process. 29(6), 1153-1160 (1981), eq. (15) with a = -0.5.
    """
    t2, t3 = t * t, t * t * t
    one = xp.ones_like(t)
    w = xp.stack(
        [-0.5 * t3 + t2 - 0.5 * t, 1.5 * t3 - 2.5 * t2 + 1, -1.5 * t3 + 2 * t2 + 0.5 * t, 0.5 * t3 - 0.5 * t2], -1
    )
    d1 = xp.stack([-1.5 * t2 + 2 * t - 0.5, 4.5 * t2 - 5 * t, -4.5 * t2 + 4 * t + 0.5, 1.5 * t2 - t], -1)
    d2 = xp.stack([-3 * t + 2 * one, 9 * t - 5 * one, -9 * t + 4 * one, 3 * t - one], -1)
    return w, d1, d2


def bspline_weights(t: Any, xp: Any) -> tuple[Any, Any, Any]:
    """Cubic B-spline weights of the coefficients at -1, 0, 1, 2 for the fraction ``t``.

    They weigh spline *coefficients* (the image prefiltered so that the spline interpolates it), not pixels.
    ``t`` and ``xp`` as for :func:`keys_weights`; returns ``(w, d1, d2)`` as it does (``t = 0`` gives
    ``(1, 4, 1, 0) / 6``).

    References
    ----------
    M. Unser, IEEE Signal Process. Mag. 16(6), 22-38 (1999), the cubic B-spline ``beta^3``.
    """
    t2, t3, u = t * t, t * t * t, 1 - t
    w = xp.stack([u * u * u / 6, (3 * t3 - 6 * t2 + 4) / 6, (-3 * t3 + 3 * t2 + 3 * t + 1) / 6, t3 / 6], -1)
    d1 = xp.stack([-0.5 * u * u, 1.5 * t2 - 2 * t, -1.5 * t2 + t + 0.5, 0.5 * t2], -1)
    d2 = xp.stack([u, 3 * t - 2, 1 - 3 * t, t], -1)
    return w, d1, d2
