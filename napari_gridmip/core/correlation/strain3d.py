"""Strain of a digital volume correlation: Green-Lagrange and small-strain tensors, their volumetric and deviatoric
parts and principal values, from the subsets' own displacement gradients or from a smoothed displacement field.

The subsets' gradients (``method="subsets"``) are each point's first-order warp: local, noisier, but free of
any smoothing across points. The smoothed field (``method="smoothed"``) differentiates the displacements across the
grid (a Gaussian over ``smoothing`` grid steps, NaN-aware, then central differences): the usual DVC strain, whose
resolution is the smoothing's.

References
----------
B. Pan, "Digital image correlation for surface deformation measurement: historical developments, recent advances
and future goals", Meas. Sci. Technol. 29, 082001 (2018) (strain from displacement fields).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from scipy import ndimage

from napari_gridmip.core import validate

STRAIN_METHODS = ("subsets", "smoothed")
COMPONENTS = ("zz", "yy", "xx", "zy", "zx", "yx")
"""The order of the 6 tensor components (tensor shears, not engineering: half the angle change)."""
_PAIRS = ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2))


@dataclasses.dataclass(frozen=True)
class VolumeStrain:
    """What :func:`volume_strain` returns, on the correlation's ``(P, R, C)`` grid (``(T, P, R, C)`` for a time
    lapse: each volume's strain from volume 0); NaN where the displacement (or a neighbour the smoothing needs)
    is."""

    green_lagrange: np.ndarray
    """``(P, R, C, 6)`` float64: ``E = (F'F - I) / 2``, ``F = I + grad u``, components in :data:`COMPONENTS`
    order."""
    small: np.ndarray
    """``(P, R, C, 6)`` float64: the small-strain tensor ``(grad u + grad u') / 2``."""
    volumetric: np.ndarray
    """``(P, R, C)`` float64: the volume change ``det F - 1``."""
    deviatoric: np.ndarray
    """``(P, R, C)`` float64: the equivalent deviatoric strain ``sqrt(2/3 e:e)``, ``e`` the Green-Lagrange
    tensor less a third of its trace."""
    principal: np.ndarray
    """``(P, R, C, 3)`` float64: the Green-Lagrange tensor's eigenvalues, largest first."""
    gradient: np.ndarray
    """``(P, R, C, 3, 3)`` float64: the displacement gradient the strains come from (``d u_i / d x_j``)."""
    method: str
    """``"subsets"`` or ``"smoothed"``: where the gradient came from."""


def _tensor_components(tensor: np.ndarray) -> np.ndarray:
    return np.stack([tensor[..., i, j] for i, j in _PAIRS], -1)


def volume_strain(result: Any, *, method: str = "subsets", smoothing: float = 1.0) -> VolumeStrain:
    """Green-Lagrange and small strain of a :func:`correlate_volumes` or :func:`correlate_volume_series` result.

    Parameters
    ----------
    result
        What :func:`~napari_gridmip.correlate_volumes` returned (its ``dz``, ``dy``, ``dx``, ``gradient``,
        ``step``), or :func:`~napari_gridmip.correlate_volume_series` (the same with a leading time axis: each
        volume's displacement from volume 0, so each volume's strain from volume 0; ``"smoothed"`` smooths each
        volume's grid on its own).
    method
        ``"subsets"`` (default): each point's own warp gradient (``shape="affine"`` results only).
        ``"smoothed"``: the displacement field smoothed by a Gaussian of ``smoothing`` grid steps (NaN-aware:
        missing points neither count nor spread) and differentiated across the grid by central differences
        (one-sided at its edges).
    smoothing
        The Gaussian's standard deviation in grid steps for ``"smoothed"`` (0: none); default 1.

    Returns
    -------
    VolumeStrain
        ``green_lagrange`` and ``small`` ``(P, R, C, 6)``, ``volumetric``, ``deviatoric`` ``(P, R, C)``,
        ``principal`` ``(P, R, C, 3)``, ``gradient`` ``(P, R, C, 3, 3)`` and the ``method`` (each with a leading
        ``T`` for a time lapse).

    Raises
    ------
    ValueError
        If ``method`` is unknown, ``smoothing`` negative, or ``"subsets"`` is asked of a translation-only result.
    TypeError
        If ``result`` is not a volume correlation.

    References
    ----------
    B. Pan, Meas. Sci. Technol. 29, 082001 (2018).
    """
    if not all(hasattr(result, name) for name in ("dz", "dy", "dx", "gradient", "step")):
        raise TypeError(f"result must be what correlate_volumes returns; got {type(result).__name__}")
    if not isinstance(method, str):
        raise TypeError(f"method must be one of {STRAIN_METHODS}; got {method!r} ({type(method).__name__})")
    validate.check_choice("method", method, STRAIN_METHODS)
    smoothing = validate.check_finite_scalar("smoothing", smoothing)
    if smoothing < 0:
        raise ValueError(f"smoothing must be >= 0 (grid steps); got {smoothing}")
    if method == "subsets":
        if getattr(result, "shape", "affine") != "affine":
            raise ValueError("method='subsets' needs the subsets' gradients: correlate with shape='affine', or use "
                             "method='smoothed'")  # fmt: skip
        gradient = np.asarray(result.gradient, np.float64)
    else:
        field = np.stack([np.asarray(result.dz), np.asarray(result.dy), np.asarray(result.dx)], -1).astype(np.float64)
        if field.ndim == 5:  # a time lapse (T, P, R, C): each volume's grid on its own
            gradient = np.stack([_smoothed_gradient(f, float(result.step), smoothing) for f in field])
        else:
            gradient = _smoothed_gradient(field, float(result.step), smoothing)
    identity = np.eye(3)
    deformation = identity + gradient
    green = 0.5 * (np.einsum("...ki,...kj->...ij", deformation, deformation) - identity)
    small = 0.5 * (gradient + np.swapaxes(gradient, -1, -2))
    finite = np.all(np.isfinite(gradient), (-2, -1))
    safe = np.where(finite[..., None, None], green, 0)
    principal = np.where(finite[..., None], np.linalg.eigvalsh(safe)[..., ::-1], np.nan)
    deviator = green - np.trace(green, axis1=-2, axis2=-1)[..., None, None] * identity / 3
    deviatoric = np.sqrt(2 / 3 * np.sum(deviator * deviator, (-2, -1)))
    return VolumeStrain(
        green_lagrange=_tensor_components(green), small=_tensor_components(small),
        volumetric=np.where(finite, np.linalg.det(np.where(finite[..., None, None], deformation, identity)) - 1,
                            np.nan),
        deviatoric=deviatoric, principal=principal, gradient=gradient, method=method,
    )  # fmt: skip


def _smoothed_gradient(field: np.ndarray, step: float, smoothing: float) -> np.ndarray:
    """The gradient ``(..., 3, 3)`` of a displacement field ``(P, R, C, 3)`` across its grid (``step`` voxels
    apart): at each point, the slope of the plane fitted by least squares to its found neighbours within
    ``ceil(2 smoothing)`` grid steps, weighted by a Gaussian of ``smoothing`` steps (a first-order
    Savitzky-Golay derivative: exact for a linear field, edges included, and blind to the missing points);
    central differences for ``smoothing`` 0. NaN where the point is NaN or its neighbours fix no plane."""
    finite = np.all(np.isfinite(field), -1)
    out = np.full((*field.shape[:3], 3, 3), np.nan)
    if smoothing == 0:
        for axis in range(3):
            if field.shape[axis] > 1:
                out[..., :, axis] = np.gradient(field, step, axis=axis)
        return out
    reach = max(1, int(np.ceil(2 * smoothing)))
    d = np.mgrid[-reach : reach + 1, -reach : reach + 1, -reach : reach + 1].astype(np.float64)
    weight = np.exp(-np.sum(d * d, 0) / (2 * smoothing**2))
    basis = [weight] + [weight * d[a] for a in range(3)]  # the kernels of 1, dz, dy, dx

    def moment(values, kernel):
        return ndimage.correlate(values, kernel, mode="constant", cval=0.0)

    mask = finite.astype(np.float64)
    normal = np.empty((*field.shape[:3], 4, 4))
    for i in range(4):
        for j in range(i, 4):
            kernel = basis[i] * (d[j - 1] if j else 1.0)
            normal[..., i, j] = normal[..., j, i] = moment(mask, kernel)
    filled = np.where(finite[..., None], field, 0.0)
    right = np.stack([np.stack([moment(filled[..., c], basis[i]) for i in range(4)], -1) for c in range(3)], -1)
    # a plane needs 4 points not on one plane: a well-conditioned system (relative to its largest entry)
    scale = np.max(np.abs(normal), (-2, -1), keepdims=True)
    scale = np.where(scale > 0, scale, 1.0)
    safe = normal / scale
    solvable = finite & (np.abs(np.linalg.det(safe)) > 1e-9)
    system = np.where(solvable[..., None, None], safe, np.eye(4))
    solution = np.linalg.solve(system, right / scale)  # (..., 4, 3): the value and the 3 slopes of each component
    out = np.swapaxes(solution[..., 1:, :], -1, -2) / step  # d u_c / d x_a
    return np.where(solvable[..., None, None], out, np.nan)
