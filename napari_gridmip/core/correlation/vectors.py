"""A displacement field as arrows: positions and displacements on a regular grid of its pixels (NumPy only)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from napari_gridmip.core import validate

__all__ = ["displacement_vectors"]


def displacement_vectors(dy: Any, dx: Any, *, spacing: int = 8, origin: Sequence[float] = (0.0, 0.0)) -> np.ndarray:
    """Arrows ``(P, 2, 2)`` of a 2D displacement field on every ``spacing``-th pixel: napari's Vectors layout.

    Parameters
    ----------
    dy, dx
        2D displacement components ``(rows, cols)``, NumPy, JAX or dask (computed here).
    spacing
        Grid step in pixels along both axes (>= 1); the grid starts at pixel (0, 0).
    origin
        Added to the positions: where pixel (0, 0) of the field sits in the image the arrows are drawn
        on. For :func:`find_displacement`'s output that is ``(m, n)``, the window's half-sizes.

    Returns
    -------
    numpy.ndarray
        ``float32`` of shape ``(P, 2, 2)``: ``[:, 0]`` the positions ``(row + origin[0], col + origin[1])``,
        ``[:, 1]`` the displacements ``(dy, dx)`` there, in C order of the grid. Pixels where either
        component is NaN are left out.

    Raises
    ------
    ValueError
        If ``dy`` and ``dx`` are not 2D arrays of one shape, ``spacing`` is below 1 or ``origin`` does
        not have two entries.
    """
    dy = np.asarray(validate.as_array("dy", dy))
    dx = np.asarray(validate.as_array("dx", dx))
    if dy.ndim != 2 or dy.shape != dx.shape:
        raise ValueError(f"dy and dx must be 2D arrays of one shape; got {dy.shape} and {dx.shape}")
    (step,) = validate.int_tuple("spacing", spacing, 1)
    if len(origin) != 2:
        raise ValueError(f"origin must have two entries (row, column); got {origin!r}")
    i, j = np.meshgrid(np.arange(0, dy.shape[0], step), np.arange(0, dy.shape[1], step), indexing="ij")
    vy, vx = dy[i, j], dx[i, j]
    keep = np.isfinite(vy) & np.isfinite(vx)
    positions = np.stack([i[keep] + origin[0], j[keep] + origin[1]], axis=-1)
    return np.stack([positions, np.stack([vy[keep], vx[keep]], axis=-1)], axis=1).astype(np.float32)
