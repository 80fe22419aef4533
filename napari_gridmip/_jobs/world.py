"""World-coordinate placement of layers derived from an input layer, so that they line up with it whatever its
scale, translate, rotate and shear.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Frame:
    """A layer's data-to-world transform, copied on the GUI thread so that workers never read the layer."""

    ndim: int
    scale: np.ndarray
    translate: np.ndarray
    rotate: np.ndarray
    shear: np.ndarray
    affine: np.ndarray
    units: tuple | None = None
    axis_labels: tuple[str, ...] | None = None  # None: napari's defaults ("-3", "-2", "-1"), nothing to carry

    @classmethod
    def of(cls, layer: Any) -> Frame:
        """Copy ``layer``'s transform (call on the GUI thread)."""
        units = getattr(layer, "units", None)
        labels = tuple(str(label) for label in getattr(layer, "axis_labels", ()) or ())
        defaults = tuple(str(i) for i in range(-int(layer.ndim), 0))
        return cls(
            ndim=int(layer.ndim),
            scale=np.array(layer.scale, dtype=float),
            translate=np.array(layer.translate, dtype=float),
            rotate=np.array(layer.rotate, dtype=float),
            shear=np.array(layer.shear, dtype=float),
            affine=np.array(layer.affine.affine_matrix, dtype=float),
            units=None if units is None else tuple(units),
            axis_labels=labels if labels and labels != defaults else None,
        )

    @classmethod
    def unit(cls, ndim: int) -> Frame:
        """Unit pixels at the origin: the frame of data that comes from no layer (files)."""
        return cls(
            ndim, np.ones(ndim), np.zeros(ndim), np.eye(ndim), np.zeros(ndim * (ndim - 1) // 2), np.eye(ndim + 1)
        )

    def last_axes(self, n: int) -> Frame:
        """The transform of the last ``n`` axes alone (e.g. one time point of a (T, Z, Y, X) layer)."""
        keep = slice(self.ndim - n, self.ndim)
        affine = np.eye(n + 1)
        affine[:n, :n] = self.affine[keep, keep]
        affine[:n, n] = self.affine[keep, -1]
        shear = _shear_matrix(self.shear, self.ndim)[keep, keep]
        return Frame(
            ndim=n,
            scale=self.scale[keep],
            translate=self.translate[keep],
            rotate=self.rotate[keep, keep],
            shear=shear[np.triu_indices(n, 1)],
            affine=affine,
            units=None if self.units is None else self.units[keep],
            axis_labels=None if self.axis_labels is None else self.axis_labels[keep],
        )


def derived_placement(
    frame: Frame,
    *,
    step: Sequence[float] | float = 1.0,
    offset: Sequence[float] | float = 0.0,
    axes: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Layer keyword arguments (scale, translate, rotate, shear, affine, units).

    Parameters
    ----------
    frame
        The input layer's transform, from :meth:`Frame.of`.
    step, offset
        Per derived axis: the derived grid's spacing and origin, in the
        input's data (pixel) coordinates.
    axes
        Which of the input's axes the derived array keeps, in order (default:
        all of them). Rotate and shear are carried only when all axes are kept.

    Notes
    -----
    A derived array whose element ``j`` (per axis) stands for the input's data
    coordinate ``offset + step * j`` (a coarse voxel over a block of ``step``
    input voxels has ``offset = (step - 1) / 2``: the block's centre) gets the
    scale and translate returned, so that it lines up with the input in world
    coordinates whatever the input's scale, translate, rotate and shear.
    """
    ndim = frame.ndim
    axes = list(range(ndim)) if axes is None else [a % ndim for a in axes]
    n = len(axes)
    step_arr = np.broadcast_to(np.asarray(step, dtype=float), (n,))
    offset_arr = np.broadcast_to(np.asarray(offset, dtype=float), (n,))
    scale = frame.scale[axes]
    translate = frame.translate[axes]
    placement: dict[str, Any] = {"scale": scale * step_arr}
    if n == ndim and not _is_identity(frame.rotate, frame.shear):
        # physical = R @ Sh @ diag(scale) @ data + translate, so an offset in data
        # coordinates moves the origin by the whole linear part.
        linear = frame.rotate @ _shear_matrix(frame.shear, ndim)
        placement["translate"] = translate + linear @ (scale * offset_arr)
        placement["rotate"] = frame.rotate
        placement["shear"] = frame.shear
    else:
        placement["translate"] = translate + scale * offset_arr
    if n == ndim:
        placement["affine"] = frame.affine
    if frame.units is not None:
        placement["units"] = tuple(np.asarray(frame.units, dtype=object)[axes])
    if frame.axis_labels is not None:
        placement["axis_labels"] = tuple(frame.axis_labels[a] for a in axes)
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
