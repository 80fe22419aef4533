"""The Gaussian prefilter that removes the noise-induced bias of sub-pixel refinement (:func:`smooth_frames` says
why), and the checks of its option.
"""

from __future__ import annotations

import numbers
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

DEFAULT_SIGMA = 0.8  # px; Pan (2013)'s choice. bench_dic.py's bias table: 0.8 and 1.0 px leave the same bias
TRUNCATE = 4.0  # standard deviations each side, as scipy.ndimage.gaussian_filter


def check_prefilter(prefilter: Any, *, default: float) -> float:
    """The prefilter's standard deviation in px (0: none) from the ``prefilter`` option: ``"auto"`` (``default``),
    ``None`` (none) or a number >= 0."""
    if isinstance(prefilter, str):
        if prefilter != "auto":
            raise ValueError(f"prefilter must be 'auto', None or a standard deviation >= 0 (px); got {prefilter!r}")
        return float(default)
    if prefilter is None:
        return 0.0
    if isinstance(prefilter, (bool, np.bool_)) or not isinstance(prefilter, numbers.Real):
        raise TypeError(
            f"prefilter must be 'auto', None or a standard deviation >= 0 (px); got {prefilter!r} "
            f"({type(prefilter).__name__})"
        )
    sigma = float(prefilter)
    if not np.isfinite(sigma) or sigma < 0:
        raise ValueError(f"prefilter must be 'auto', None or a standard deviation >= 0 (px); got {prefilter!r}")
    return sigma


def radius(sigma: float) -> int:
    """The filter's reach in px each side (scipy.ndimage's ``int(truncate * sigma + 0.5)``); 0 for no filter."""
    return int(TRUNCATE * sigma + 0.5) if sigma > 0 else 0


def taps(sigma: float) -> np.ndarray:
    """The normalised 1D Gaussian taps ``(2 radius + 1,)``, float64, as scipy.ndimage computes them."""
    reach = radius(sigma)
    x = np.arange(-reach, reach + 1, dtype=np.float64)
    weights = np.exp(-0.5 * (x / sigma) ** 2)
    return weights / weights.sum()


def noise_gain(sigma: float) -> float:
    """The fraction of white noise's variance the filter leaves over a frame: ``(sum of taps**2)**2``; 1 for
    no filter."""
    return float(np.sum(taps(sigma) ** 2) ** 2) if sigma > 0 else 1.0


def fir_along(x: jax.Array, weights: Any, axis: int, *, mode: str) -> jax.Array:
    """``x`` filtered along ``axis`` by the odd, centred taps ``weights``, with ``x`` extended by ``jnp.pad``'s
    ``mode`` (``"symmetric"`` is scipy.ndimage's "reflect": d c b a | a b c d; ``"edge"`` repeats the last value).

    One fused pass of shifted slices, the shared form of the Gaussian prefilter and the cubic B-spline's (2D and 3D).
    """
    reach = len(weights) // 2
    widths = [(0, 0)] * x.ndim
    widths[axis] = (reach, reach)
    padded = jnp.pad(x, widths, mode=mode)
    size = x.shape[axis]
    out = None
    for k, weight in enumerate(weights):
        term = float(weight) * lax.slice_in_dim(padded, k, k + size, axis=axis)
        out = term if out is None else out + term
    return out


def _axis(x: jax.Array, weights: np.ndarray, axis: int) -> jax.Array:
    return fir_along(x, weights, axis, mode="symmetric")


@partial(jax.jit, static_argnames=("sigma",))
def smooth_frames(x: jax.Array, *, sigma: float) -> jax.Array:
    """Every frame of ``x`` (its last two axes) smoothed by a Gaussian of ``sigma`` px, borders mirrored as
    ``scipy.ndimage.gaussian_filter(frame, sigma)`` (``mode="reflect"``) does; ``x``'s shape and float dtype.
    A non-finite value spreads over the filter's reach (and so poisons exactly the vectors that see it).

    When only img1 is interpolated between pixels, its noise is averaged differently at every fractional position
    (least at whole pixels, most near half pixels), and the correlation prefers the positions where it was averaged
    most: the refined displacement is pulled towards half pixels, more with more noise. On 8-bit speckle pairs with 3%
    noise the B-spline refinement overestimates a 0.1 px field by 50% and a rigid shift by up to 0.06 px; a Gaussian
    of 0.8 px applied to both images first leaves 0.002 px (``benchmarks/bench_dic.py``, bias section). A rigid
    shift commutes with the filter, so the displacement it measures is unchanged.

    References
    ----------
    B. Pan, "Bias error reduction of digital image correlation using Gaussian pre-filtering", Opt. Lasers Eng.
    51(10), 1161-1167 (2013).
    H. W. Schreier, J. R. Braasch, M. A. Sutton, "Systematic errors in digital image correlation caused by
    intensity interpolation", Opt. Eng. 39(11), 2915-2921 (2000).
    """
    if sigma <= 0:
        return x
    weights = taps(sigma)
    if x.shape[-2] > 1:
        x = _axis(x, weights, x.ndim - 2)
    if x.shape[-1] > 1:
        x = _axis(x, weights, x.ndim - 1)
    return x
