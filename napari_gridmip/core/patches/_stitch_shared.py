"""What both pair engines of :mod:`.stitch` share (the NumPy one, :mod:`._stitch_numpy`, and the JAX one,
:mod:`._stitch_jax`): constants and the band-pass filter's pieces. A leaf: it imports neither engine nor
:mod:`.stitch`, which imports it."""

from __future__ import annotations

import math

import numpy as np

MARGIN = 3  # extra search beyond max_shift: the quadratic fit's neighbours, cubic taps and refinement room
GN_ITERATIONS = 5  # Gauss-Newton steps of the refinement (converged to 1e-4 px after 3 on the tests' mosaics)
MAX_REFINE_STEP = 1.5  # the refinement may move at most this far (px, per axis) from the integer peak
CACHE_BYTES = 256 * 2**20  # tile regions (or band-passed tiles) kept in memory, at most, per pass
MIN_FRACTION = 0.5  # a shift is a candidate while it keeps more than this fraction of the template on the data
RIVAL_SEPARATION = 3  # a rival peak lies more than this many px (per axis, at least one) from the best one


Band = float | tuple[float, float]
"""A band-pass filter: ``sigma`` (a float) is the octave band ``G_sigma - G_2sigma``; ``(lo, hi)`` is
``G_lo - G_hi`` (the broad band of :func:`.stitch.register_tiles`' second search). 0: no filter."""


def band_widths(sigma: Band, low_only: bool = False) -> tuple[float, ...]:
    """The band's Gaussian widths: ``(lo, hi)``, or ``(lo,)`` for its low-pass alone (the refinement's)."""
    lo, hi = (float(sigma[0]), float(sigma[1])) if isinstance(sigma, tuple) else (float(sigma), 2.0 * float(sigma))
    return (lo,) if low_only else (lo, hi)


def filters(sigma: Band) -> bool:
    """Whether ``sigma`` filters at all (``0``: the raw intensities are matched)."""
    return band_widths(sigma)[0] > 0


def filter_halo(sigma: Band, low_only: bool = False) -> int:
    """The halo a region needs for the filter of ``sigma`` (4 standard deviations of its widest Gaussian; 0: none)."""
    return int(math.ceil(4 * max(band_widths(sigma, low_only)))) if filters(sigma) else 0


def _gaussian_spectrum(shape: tuple[int, ...], sigma: float, radius: int) -> np.ndarray:
    """The real FFT of a normalised Gaussian (truncated at ``radius``) centred on pixel 0 of ``shape``, wrapped."""
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    taps = np.exp(-0.5 * (x / sigma) ** 2)
    taps /= taps.sum()
    kernel = np.ones((1,) * len(shape))
    for axis, n in enumerate(shape):
        line = np.zeros(n)
        line[np.arange(-radius, radius + 1) % n] += taps
        kernel = kernel * line.reshape([-1 if k == axis else 1 for k in range(len(shape))])
    return np.fft.rfftn(kernel).astype(np.complex64)
