"""Speckle tracking, the public API: :func:`track_speckles` and what it returns (:class:`SpeckleTracking`).

The search and the fit run in the subset kernel (:mod:`.subsets`); this module checks the call once, hands the
kernel to the dask twin for dask stacks, and turns the kernel's outputs into the result, the displacement flipped
from the reference's position in the sample to the pattern's motion.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from napari_gridmip.core import validate
from napari_gridmip.core.correlation import subsets
from napari_gridmip.core.correlation._checks import check_dtypes, check_pair, check_subset
from napari_gridmip.core.correlation.prefilter import DEFAULT_SIGMA, check_prefilter
from napari_gridmip.core.options import SUBPIXEL_METHODS

__all__ = ["track_speckles"]

ProgressCallback = Callable[[int, int], None]


@dataclass(frozen=True)
class SpeckleTracking:
    """What :func:`track_speckles` returns: arrays of one shape ``(..., rows, cols)``.

    Each pixel is the sample's pixel ``(y, x) = (i s + m + hs, j s + n + hw)``; its speckle came from the
    reference's position ``(y - dy, x - dx)``.
    """

    dy: Any
    """Row displacement (px) of the speckle pattern from the reference to the sample; NaN where the peak lies on
    the window's edge (the true peak may lie outside), never clipped."""
    dx: Any
    """Column displacement (px), NaN where ``dy`` is."""
    peak: Any
    """The correlation at the integer peak, in [-1, 1]: a confidence."""
    transmission: Any
    """``T`` of UMPA's model ``sample ~ T (mean(ref) + D (ref_shifted - mean(ref)))``: the sample's intensity
    over the reference's (1 = no absorption)."""
    dark_field: Any
    """``D``: the speckle visibility kept through the sample (1 = none lost, smaller = scattering)."""
    residual: Any
    """Root mean square of ``sample - model`` over the pixel's vector, in the sample's units."""
    sigma_dy: Any
    """Estimated standard deviation of ``dy`` (px), from the correlation's curvature and noise level (see
    :func:`track_speckles`)."""
    sigma_dx: Any
    """Estimated standard deviation of ``dx`` (px)."""


# the tracking outputs, in the kernel's order: SpeckleTracking's fields are the one list (the kernel is asked for
# them by name, and the jobs, the command line and the dask twin read it from here)
TRACK_OUTPUTS = tuple(f.name for f in dataclasses.fields(SpeckleTracking))


def track_speckles(
    sample: Any,
    reference: Any,
    window: Sequence[int],
    *,
    subset: Sequence[int] = (1, 1),
    step: int = 1,
    subpixel: str = "refine",
    prefilter: float | str | None = None,
    dtype: Any = None,
    progress: ProgressCallback | None = None,
) -> SpeckleTracking:
    """Speckle tracking (X-ray speckle imaging, DIC): displacement, transmission, dark-field and uncertainty.

    Each sample pixel's vector (its K frames over the ``sh x sw`` subset around it) is matched to the
    reference's vectors around the same place by zero-normalised cross-correlation, as
    :func:`find_displacement` does with ``img1 = reference`` and ``img2 = sample``. At the tracked sub-pixel
    position, UMPA's model is fitted by linear least squares over the vector::

        sample ~ T * (mean(ref) + D * (ref_shifted - mean(ref)))

    ``ref_shifted`` is the reference's vector interpolated (cubic B-spline) at the tracked position, ``mean(ref)`` the
    reference's mean intensity (over all its frames and pixels, as UMPA's ``Im``), ``T`` the transmission and
    ``D`` the dark-field (the fraction of the speckle visibility that survives). A pair with ``sample`` equal
    to the reference gives ``T = D = 1`` and no displacement.

    Sign convention, worked: if ``sample = scipy.ndimage.shift(reference, (0, 1.3, -0.7))`` (the pattern moved
    down 1.3 px and left 0.7 px), then ``dy`` is about 1.3 and ``dx`` about -0.7: the displacement of the
    speckle pattern from the reference to the sample, ``sample[y, x] ~ reference[y - dy, x - dx]``.
    :func:`find_displacement(reference, sample, ...) <find_displacement>` finds the same match with the
    opposite sign (its ``img1[y + dy, x + dx]`` matches ``img2[y, x]``).

    Parameters
    ----------
    sample, reference
        Stacks ``(..., K, M, N)`` of the same shape (any leading batch axes): the frames with the sample in the
        beam, and the same diffuser positions without it. Real dtypes as for :func:`windowed_pearson`; the
        reference's mean intensity must be positive for ``transmission``.
    window
        ``(wm, wn)``, odd: the search window; displacements up to ``wm // 2 - 1`` px are found.
    subset
        ``(sh, sw)``, odd, default ``(1, 1)``: the pixels each vector spans around its pixel. ``K = 1`` (one
        image each, as in DIC) needs a subset larger than one pixel.
    step
        Results on every ``step``-th pixel only (``[::step, ::step]`` of the dense result), computed without
        evaluating the pixels between.
    subpixel
        ``"refine"`` (default): Newton's method on the correlation of the interpolated reference;
        ``"hessian"``, ``"paraboloid"``: 3x3 fits of the integer map; ``"none"``: integer displacements. The
        model's fit and the uncertainty are evaluated at the position found.
    prefilter
        The standard deviation (px) of a Gaussian that smooths every frame of both stacks first, ``None``
        (default, none) or ``"auto"`` (0.8 px where ``subpixel="refine"``, as :func:`find_displacement`
        does by default with a subset): it removes the bias that noise gives the refinement (see
        :func:`find_displacement`). Speckle tracking leaves it off by default, since smoothing blurs the
        speckle whose visibility the dark-field measures; for DIC with uncertainty, pass ``"auto"``.
    dtype
        ``float32`` (default) or ``float64``.
    progress
        Optional ``progress(done, total)`` between row bands; it may raise to stop.

    Returns
    -------
    SpeckleTracking
        Frozen dataclass of ``dy, dx, peak, transmission, dark_field, residual, sigma_dy, sigma_dx``, jax.Arrays
        of shape ``(..., ceil(Mo / step), ceil(No / step))`` with ``Mo = M - 2m - (sh - 1)`` (the same margin
        on both sides: the window's half-size plus the subset's), ``dtype``; dask arrays (lazy) for dask
        inputs. All but ``peak`` are NaN where the peak lies on the window's edge. ``sigma_dy``/``sigma_dx``
        estimate the standard deviation of the displacement from the correlation ``r`` at the peak and its
        Hessian ``H`` there (of ``r`` in the displacement)::

            sigma^2 = 2 (1 - r) / (n - 4) * diag(inv(-H)),    n = K * sh * sw values per vector

        (white noise in both stacks; ``1 - r`` includes any mismatch of the model, such as strain within the
        subset, so the estimate errs on the large side there). ``benchmarks/bench_dic.py`` compares it with
        measured spreads.

    Raises
    ------
    ValueError
        If the shapes differ, a window or subset size is even, the window plus the subset does not fit in the
        image, a vector holds fewer than 2 values, ``step`` is below 1, ``subpixel`` is unknown, or for the
        dtype problems :func:`windowed_pearson` refuses.
    TypeError
        If ``step`` is not an integer, or an input is not an array.

    References
    ----------
    M.-C. Zdora et al., Phys. Rev. Lett. 118, 203903 (2017) (UMPA); B. Pan et al., Appl. Opt. 49, 5501 (2010)
    (ZNCC in DIC); H. W. Schreier et al., Opt. Eng. 39, 2915 (2000) (B-spline interpolation in DIC).

    Examples
    --------
    >>> import numpy as np, scipy.ndimage as ndi
    >>> rng = np.random.default_rng(0)
    >>> reference = 1 + ndi.gaussian_filter(rng.standard_normal((4, 64, 64)), (0, 2, 2))
    >>> sample = 0.8 * ndi.shift(reference, (0, 1.3, -0.7), order=3)
    >>> out = track_speckles(sample, reference, (7, 7), subset=(5, 5))
    >>> inner = (slice(8, -8), slice(8, -8))
    >>> [round(float(np.median(np.asarray(a)[inner])), 2) for a in (out.dy, out.dx, out.transmission)]
    [1.3, -0.7, 0.8]
    """
    sample, reference = validate.as_array("sample", sample), validate.as_array("reference", reference)
    subset, step = check_subset(subset, step)
    shape, window = check_pair(sample, reference, window, subset, names=("sample", "reference"))
    subpixel = validate.check_choice("subpixel", subpixel, SUBPIXEL_METHODS)
    sigma = check_prefilter(prefilter, default=DEFAULT_SIGMA if subpixel == "refine" else 0.0)
    dtype = check_dtypes({"sample": sample, "reference": reference}, dtype)
    if validate.is_dask(sample) or validate.is_dask(reference):
        from napari_gridmip.core.correlation import _chunked  # the dask twin: dask.array takes 0.5 s to import

        kernel = partial(
            subsets.run, window=window, subset=subset, step=step, method=subpixel, track=TRACK_OUTPUTS,
            dtype=dtype, prefilter=sigma,
        )  # fmt: skip
        parts = _chunked.track_speckles(
            reference, sample, window, subset, step, subpixel, dtype, kernel, prefilter=sigma,
            reach=subsets.DASK_REACH, outputs=len(TRACK_OUTPUTS),
        )  # fmt: skip
    else:
        # the kernel's displacement is the reference's (img1's) position in the sample's: the pattern moved the
        # other way
        flip = (TRACK_OUTPUTS.index("dy"), TRACK_OUTPUTS.index("dx"))
        parts = subsets.run(
            reference, sample, window, subset, step, method=subpixel, track=TRACK_OUTPUTS, dtype=dtype,
            progress=progress, prefilter=sigma, negate=flip,
        )  # fmt: skip
        return SpeckleTracking(*parts)
    out = dict(zip(TRACK_OUTPUTS, parts))
    return SpeckleTracking(**{**out, "dy": -out["dy"], "dx": -out["dx"]})
