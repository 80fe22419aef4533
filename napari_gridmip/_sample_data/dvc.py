"""A digital volume correlation (DVC) pair with its known displacement field: a micro-CT-like texture (smoothed
random blobs, quantised) and the same texture carried by a known affine map, for the tests, the benchmarks and
the sample menu.

The deformed volume is not the reference resampled by the method under test: it samples a fifth-order spline of
the reference (``scipy.ndimage.map_coordinates``, order 5) at the positions the inverse map gives, so that a
tricubic matcher's own interpolation error is not built into the truth.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import ndimage


def micro_ct_texture(shape: tuple[int, int, int], *, blob: float = 1.6, seed: int = 0) -> np.ndarray:
    """A float32 volume in ``[0, 1]`` that looks like a micro-CT of a granular material: random blobs of about
    ``blob`` voxels (a Gaussian-smoothed noise pushed towards two phases, then blurred by a point spread
    function of 0.8 voxel), so that every subset has texture at the scale DVC needs."""
    rng = np.random.default_rng(seed)
    field = ndimage.gaussian_filter(rng.standard_normal(shape).astype(np.float32), blob, mode="wrap")
    field /= field.std()
    phases = np.tanh(1.5 * field)  # two phases (grains, pores) with soft interfaces
    out = ndimage.gaussian_filter(phases, 0.8)
    out -= out.min()
    return (out / out.max()).astype(np.float32)


def affine_map(
    strain: float | tuple[float, float, float] = 0.01,
    shear: float = 0.004,
    rotation: float = 0.0,
) -> np.ndarray:
    """The ``(3, 3)`` linear part ``A`` of a map ``x -> A (x - c) + c + t`` in ``(z, y, x)`` order: normal strains
    ``strain`` along z, y, x (one number: ``(s, -s/2, s/2)``, a stretch with some contraction), the engineering
    shear ``shear`` split over the three planes, and a rotation of ``rotation`` degrees about the z axis."""
    if np.ndim(strain) == 0:
        strain = (float(strain), -float(strain) / 2, float(strain) / 2)
    gradient = np.diag(np.asarray(strain, np.float64))
    gradient[0, 1] = gradient[1, 0] = shear / 2  # zy
    gradient[1, 2] = gradient[2, 1] = shear / 2  # yx
    gradient[0, 2] = gradient[2, 0] = shear / 4  # zx
    angle = np.deg2rad(rotation)
    turn = np.array([[1, 0, 0], [0, np.cos(angle), -np.sin(angle)], [0, np.sin(angle), np.cos(angle)]])
    return turn @ (np.eye(3) + gradient)


def true_displacement(truth: dict[str, Any], z: np.ndarray, y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The known displacement ``(3, P, R, C)`` (dz, dy, dx) at the grid ``z`` ``(P,)``, ``y`` ``(R,)``, ``x``
    ``(C,)`` of reference voxel coordinates: ``(A - I) (X - c) + t``."""
    points = np.stack(np.meshgrid(z, y, x, indexing="ij"), -1).astype(np.float64)
    moved = np.einsum("ij,...j->...i", truth["matrix"] - np.eye(3), points - truth["centre"]) + truth["translation"]
    return np.moveaxis(moved, -1, 0)


def make_dvc_pair(
    shape: tuple[int, int, int] = (96, 96, 96),
    *,
    strain: float | tuple[float, float, float] = 0.01,
    shear: float = 0.004,
    rotation: float = 0.0,
    translation: tuple[float, float, float] = (0.4, -0.3, 0.25),
    noise: float = 0.01,
    dtype: Any = np.uint8,
    blob: float = 1.6,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """A reference volume, the deformed volume and the known field.

    The deformed volume holds at ``A (X - c) + c + t`` what the reference holds at ``X`` (``c`` the volume's
    centre), so that ``correlate_volumes`` should find ``(A - I) (X - c) + t`` at each reference point ``X``.

    Parameters
    ----------
    shape
        The volumes' ``(Z, Y, X)``.
    strain, shear, rotation
        The linear part, as :func:`affine_map` makes it (rotation in degrees, about z).
    translation
        ``t`` in voxels ``(dz, dy, dx)``.
    noise
        The standard deviation of the Gaussian noise added to each volume (independently), as a share of the
        full range, before quantising.
    dtype
        uint8 or uint16 (quantised to the dtype's range less a margin), or a float dtype (no quantisation).
    blob
        The texture's grain size in voxels (:func:`micro_ct_texture`).
    seed
        The random seed (the texture's and the noise's).

    Returns
    -------
    tuple
        ``(reference, deformed, truth)``; ``truth`` holds ``matrix`` ``A`` ``(3, 3)``, ``translation`` ``t``
        ``(3,)`` and ``centre`` ``c`` ``(3,)`` (float64); :func:`true_displacement` evaluates the field.
    """
    shape = tuple(int(n) for n in shape)
    matrix = affine_map(strain, shear, rotation)
    centre = (np.asarray(shape, np.float64) - 1) / 2
    shift = np.asarray(translation, np.float64)
    texture = micro_ct_texture(shape, blob=blob, seed=seed)
    # the deformed volume at Y samples the reference at A^-1 (Y - c - t) + c
    inverse = np.linalg.inv(matrix)
    offset = centre - inverse @ (centre + shift)
    deformed = ndimage.affine_transform(texture, inverse, offset=offset, order=5, mode="mirror", output=np.float32)
    rng = np.random.default_rng(seed + 1)
    dtype = np.dtype(dtype)
    out = []
    for volume in (texture, deformed):
        volume = volume + noise * rng.standard_normal(shape).astype(np.float32)
        if dtype.kind in "ui":
            top = np.iinfo(dtype).max
            volume = np.clip(np.rint(top * (0.1 + 0.8 * volume)), 0, top).astype(dtype)
        else:
            volume = volume.astype(dtype)
        out.append(volume)
    return out[0], out[1], {"matrix": matrix, "translation": shift, "centre": centre}


SAMPLE_SHAPE = (96, 96, 96)  # File > Open Sample's pair: 512 points of a 21-voxel subset every 10 voxels


def dvc_sample() -> list[tuple]:
    """File > Open Sample > DVC pair: the reference and deformed volumes of :func:`make_dvc_pair` (``SAMPLE_SHAPE``,
    uint8), the known map in both layers' metadata (``true_matrix``, ``true_translation``, ``true_centre``: the
    displacement at reference voxel ``X`` is ``(A - I) (X - c) + t``, :func:`true_displacement`)."""
    reference, deformed, truth = make_dvc_pair(SAMPLE_SHAPE)
    known = {f"true_{key}": value for key, value in truth.items()}
    style = {"colormap": "gray", "rendering": "mip", "blending": "additive"}
    return [
        (reference, {"name": "DVC reference", **style, "metadata": {"gridmip_role": "reference", **known}}, "image"),
        (deformed, {"name": "DVC deformed", **style, "visible": False,
                    "metadata": {"gridmip_role": "deformed", **known}}, "image"),
    ]  # fmt: skip
