"""The one check of a correlated pair, of its compute dtype and of the subset and step options, for the dense
maps (:mod:`.maps`), the subsets (:mod:`.subsets`) and :func:`~napari_gridmip.track_speckles`
(:mod:`.tracking`), and of the dense maps' dask blocks once computed (:mod:`._chunked`). A leaf: it imports
none of them."""

from __future__ import annotations

from typing import Any

import numpy as np

from napari_gridmip.core import validate
from napari_gridmip.core.runtime.precision import compute_dtype, precision_scope


def check_pair(
    img1: Any, img2: Any, window: Any, subset: tuple[int, int] | None = None, names=("img1", "img2")
) -> tuple[tuple[int, ...], tuple[int, int]]:
    """Shapes, window and subset of a pair: ``(shape, window)``. Without a subset (the dense correlation over K)
    a vector needs 2 frames and the window must fit; with one (any, ``(1, 1)`` with a step included), 2 values
    and the window plus the subset."""
    for name, img in zip(names, (img1, img2)):
        validate.check_real(name, img)
        validate.check_ndim(name, img, min_ndim=3)
    shape1, shape2 = validate.shape_of(img1), validate.shape_of(img2)
    if shape1 != shape2:
        raise ValueError(
            f"{names[0]} and {names[1]} must have the same shape (..., K, M, N); got {shape1} and {shape2}"
        )
    window = validate.int_tuple("window", window, 2)
    if any(w % 2 == 0 for w in window):
        raise ValueError(f"window sizes must be odd (2m + 1, 2n + 1); got {window}")
    validate.check_nonempty(names[0], shape1)
    k, rows, cols = shape1[-3:]
    if subset is None:
        if k < 2:
            raise ValueError(f"{names[0]} and {names[1]} need at least 2 frames along K (axis -3); got shape {shape1}")
        if window[0] > rows or window[1] > cols:
            raise ValueError(f"window {window} is larger than the images' (M, N) = ({rows}, {cols})")
        return shape1, window
    if k * subset[0] * subset[1] < 2:
        raise ValueError(
            f"{names[0]} and {names[1]} need at least 2 values per vector: 2 frames along K (axis -3), or a subset "
            f"larger than (1, 1); got shape {shape1} and subset {subset}"
        )
    if window[0] + subset[0] - 1 > rows or window[1] + subset[1] - 1 > cols:
        raise ValueError(
            f"window {window} plus subset {subset} (window + subset - 1 pixels per axis) is larger than the "
            f"images' (M, N) = ({rows}, {cols})"
        )
    return shape1, window


def check_dtypes(named: dict[str, Any], dtype: Any) -> np.dtype:
    """The compute dtype; integers it cannot hold exactly are refused with what to do instead.

    (A dask stack is checked block by block when it is computed: scanning it here would compute it.)
    """
    dtype = compute_dtype(dtype)
    for name, img in named.items():
        if validate.is_dask(img):
            continue
        with precision_scope(validate.dtype_of(img)):  # a JAX int64 array's min/max, not truncated ones
            validate.check_exact_integers(name, img, dtype)
    return dtype


def check_subset(subset: Any, step: Any) -> tuple[tuple[int, int], int]:
    """The ``subset`` (odd sizes) and ``step`` (a positive integer) options, checked."""
    subset = validate.int_tuple("subset", subset, 2)
    if any(v % 2 == 0 for v in subset):
        raise ValueError(f"subset sizes must be odd (2hs + 1, 2hw + 1); got {subset}")
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)):
        raise TypeError(f"step must be a positive integer; got {step!r} ({type(step).__name__})")
    if step < 1:
        raise ValueError(f"step must be a positive integer; got {step}")
    return subset, int(step)
