"""World-coordinate placement of layers derived from an input layer.

A derived array whose element ``j`` (per axis) stands for the input's data
coordinate ``offset + step * j`` (a coarse voxel over a block of ``step``
input voxels has ``offset = (step - 1) / 2``: the block's centre) gets the
scale and translate below, so that it lines up with the input in world
coordinates whatever the input's scale, translate, rotate and shear.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def derived_placement(
    layer: Any,
    *,
    step: Sequence[float] | float = 1.0,
    offset: Sequence[float] | float = 0.0,
    axes: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Layer keyword arguments (scale, translate, rotate, shear, affine, units).

    Parameters
    ----------
    layer
        The input napari layer.
    step, offset
        Per derived axis: the derived grid's spacing and origin, in the
        input's data (pixel) coordinates.
    axes
        Which of the input's axes the derived array keeps, in order (default:
        all of them). Rotate and shear are carried only when all axes are kept.
    """
    ndim = layer.ndim
    axes = list(range(ndim)) if axes is None else [a % ndim for a in axes]
    n = len(axes)
    step_arr = np.broadcast_to(np.asarray(step, dtype=float), (n,))
    offset_arr = np.broadcast_to(np.asarray(offset, dtype=float), (n,))
    scale = np.asarray(layer.scale, dtype=float)[axes]
    translate = np.asarray(layer.translate, dtype=float)[axes]
    placement: dict[str, Any] = {"scale": scale * step_arr}
    if n == ndim and layer.rotate is not None and not _is_identity(layer.rotate, layer.shear):
        # physical = R @ Sh @ diag(scale) @ data + translate, so an offset in data
        # coordinates moves the origin by the whole linear part.
        linear = np.asarray(layer.rotate) @ _shear_matrix(layer.shear, ndim)
        placement["translate"] = translate + linear @ (scale * offset_arr)
        placement["rotate"] = np.asarray(layer.rotate)
        placement["shear"] = np.asarray(layer.shear)
    else:
        placement["translate"] = translate + scale * offset_arr
    if n == ndim:
        placement["affine"] = layer.affine.affine_matrix
    units = getattr(layer, "units", None)
    if units is not None:
        placement["units"] = tuple(np.asarray(units, dtype=object)[axes])
    return placement


def _shear_matrix(shear: Any, ndim: int) -> np.ndarray:
    shear = np.asarray(shear, dtype=float)
    if shear.ndim == 2:
        return shear
    out = np.eye(ndim)
    out[np.triu_indices(ndim, 1)] = shear  # napari's upper-triangular convention
    return out


def _is_identity(rotate: Any, shear: Any) -> bool:
    rotate = np.asarray(rotate, dtype=float)
    shear = np.asarray(shear, dtype=float)
    off_diag = shear if shear.ndim == 1 else shear - np.eye(len(shear))
    return bool(np.allclose(rotate, np.eye(len(rotate))) and np.allclose(off_diag, 0))
