"""Digital image correlation (DIC) samples: an 8-bit speckle image and its deformed copy, with the known field.

Both images are rendered from the same analytic speckle pattern (Gaussian dots), the deformed one at the
exactly inverted deformation, so the known displacement carries no interpolation error; then a camera's
shot and read noise, and 8-bit quantisation.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from napari_gridmip._sample_data import stand_in_image
from napari_gridmip._sample_data._cache import on_disk

DIC_SHAPE = (512, 512)
DOT_RADIUS = 2.0  # px, the Gaussian dots' standard deviation: speckles about 4-5 px across
DOT_DENSITY = 0.045  # dots per pixel (about 55% of the surface covered at half height)
FULL_WELL = 4000.0  # photo-electrons at 255
READ_NOISE = 8.0  # electrons RMS


def dic_field(shape: tuple[int, int] = DIC_SHAPE) -> dict[str, np.ndarray]:
    """The sample's known displacement (px, on the reference's grid) and its small-strain tensor.

    A specimen stretched along x and sheared, with a smooth bulge::

        u_x = 0.004 (x - cx) + 0.002 (y - cy) + 1.5 exp(-r^2 / (2 (W / 5)^2))
        u_y = -0.0015 (y - cy) + 1.2 sin(2 pi x / W)

    Returns ``dy, dx`` (``u_y``, ``u_x``) and ``exx``, ``eyy``, ``exy`` (the tensor's shear component,
    ``(du_x/dy + du_y/dx) / 2``; the engineering shear is twice it). At most about 3 px and 0.5%.
    """
    rows, cols = shape
    y, x = np.meshgrid(np.arange(rows, dtype=np.float64), np.arange(cols, dtype=np.float64), indexing="ij")
    cy, cx, width = (rows - 1) / 2, (cols - 1) / 2, cols / 5
    uy, ux = _sample_displacement(y, x, shape)
    bump = 1.5 * np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * width**2))
    dux_dx = 0.004 - bump * (x - cx) / width**2
    dux_dy = 0.002 - bump * (y - cy) / width**2
    duy_dx = 1.2 * 2 * np.pi / cols * np.cos(2 * np.pi * x / cols)
    duy_dy = np.full(shape, -0.0015)
    return {"dy": uy, "dx": ux, "exx": dux_dx, "eyy": duy_dy, "exy": 0.5 * (dux_dy + duy_dx)}


def _sample_displacement(y: np.ndarray, x: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`dic_field`'s ``u_y, u_x`` at any positions ``(y, x)`` (px, float64 arrays of one shape), from its
    formula: what :func:`make_dic_pair` inverts, at no interpolation."""
    rows, cols = shape
    cy, cx, width = (rows - 1) / 2, (cols - 1) / 2, cols / 5
    bump = 1.5 * np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * width**2))
    ux = 0.004 * (x - cx) + 0.002 * (y - cy) + bump
    uy = -0.0015 * (y - cy) + 1.2 * np.sin(2 * np.pi * x / cols)
    return uy, ux


def _dots(shape: tuple[int, int], rng: np.random.Generator, margin: float) -> tuple[np.ndarray, np.ndarray]:
    rows, cols = shape
    count = int(DOT_DENSITY * (rows + 2 * margin) * (cols + 2 * margin))
    centres = rng.uniform((-margin, -margin), (rows + margin, cols + margin), size=(count, 2))
    return centres, rng.uniform(0.6, 1.0, count)


def render_speckle(
    y: np.ndarray, x: np.ndarray, centres: np.ndarray, amplitudes: np.ndarray, landing: np.ndarray
) -> np.ndarray:
    """The speckle pattern's intensity in [0, 1) at the surface positions ``(y, x)`` seen by each pixel
    (arrays of the image's shape): a sum of Gaussian dots, saturating like paint (``1 - exp(-1.6 sum)``).

    Each dot is evaluated on the pixels around ``landing`` (where it appears in this image, ``(count, 2)``),
    far enough to reach 4 radii whatever the local strain.
    """
    rows, cols = y.shape
    reach = int(np.ceil(4 * DOT_RADIUS)) + 2
    offsets = np.arange(-reach, reach + 1)
    total = np.zeros(rows * cols)
    for first in range(0, len(centres), 4096):
        part = slice(first, first + 4096)
        qy = np.round(landing[part, 0]).astype(np.int64)[:, None, None] + offsets[None, :, None]
        qx = np.round(landing[part, 1]).astype(np.int64)[:, None, None] + offsets[None, None, :]
        inside = (qy >= 0) & (qy < rows) & (qx >= 0) & (qx < cols)
        qy, qx = np.clip(qy, 0, rows - 1), np.clip(qx, 0, cols - 1)
        cy, cx = centres[part, 0][:, None, None], centres[part, 1][:, None, None]
        d2 = (y[qy, qx] - cy) ** 2 + (x[qy, qx] - cx) ** 2
        weight = np.where(inside, amplitudes[part][:, None, None] * np.exp(-d2 / (2 * DOT_RADIUS**2)), 0)
        total += np.bincount((qy * cols + qx).ravel(), weights=weight.ravel(), minlength=rows * cols)
    return 1 - np.exp(-1.6 * total.reshape(rows, cols))


def camera(intensity: np.ndarray, rng: np.random.Generator, noise: float | None = None) -> np.ndarray:
    """An 8-bit camera image of ``intensity`` in [0, 1]: shot noise (Poisson, ``FULL_WELL`` electrons at
    full scale), read noise (``READ_NOISE`` electrons), an offset of 10 levels, rounding and clipping.

    ``noise``: instead of the camera's own, Gaussian noise of this fraction of the 8-bit range (0.015: 3.8
    grey levels), the way DIC papers state a noise level."""
    if noise is not None:
        levels = 10 + 235 * intensity + noise * 255 * rng.standard_normal(intensity.shape)
        return np.clip(np.round(levels), 0, 255).astype(np.uint8)
    electrons = rng.poisson(np.clip(intensity, 0, None) * 0.92 * FULL_WELL).astype(np.float64)
    electrons += READ_NOISE * rng.standard_normal(intensity.shape)
    levels = 10 + electrons * (245 / FULL_WELL)
    return np.clip(np.round(levels), 0, 255).astype(np.uint8)


def make_dic_pair(
    shape: tuple[int, int] = DIC_SHAPE,
    *,
    field: dict[str, np.ndarray] | None = None,
    seed: int = 0,
    noise: float | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """A reference speckle image and the image of the same surface deformed by ``field`` (default
    :func:`dic_field`): ``(reference, deformed, field)``, uint8 ``shape`` images.

    A material point at ``p`` in the reference is at ``p + u(p)`` in the deformed image, so
    ``napari_gridmip.find_displacement(deformed[None], reference[None], ...)`` (img1 = deformed) returns
    ``dy = u_y``, ``dx = u_x`` on the reference's grid, DIC's convention. The deformed image's pixel ``q``
    shows the point ``p`` with ``p + u(p) = q``, found by fixed-point iteration. ``field`` maps ``"dy"``,
    ``"dx"`` to arrays of ``shape`` (or scalars, for a rigid shift). ``noise``: see :func:`camera`.
    """
    rng = np.random.default_rng(seed)
    displacement_at = _displacement_function(field, shape)
    field = dic_field(shape) if field is None else field
    rows, cols = shape
    uy = np.broadcast_to(np.asarray(field["dy"], np.float64), shape)
    ux = np.broadcast_to(np.asarray(field["dx"], np.float64), shape)
    centres, amplitudes = _dots(shape, rng, margin=float(np.abs(uy).max() + np.abs(ux).max() + 10))
    qy, qx = np.meshgrid(np.arange(rows, dtype=np.float64), np.arange(cols, dtype=np.float64), indexing="ij")
    py, px = qy - uy, qx - ux
    for _ in range(8):  # converges as |grad u|**k: 1e-12 px for strains of a few percent
        at_y, at_x = displacement_at(py, px)
        py, px = qy - at_y, qx - at_x
    # where each dot lands in the deformed image: its centre moved by the field there
    inside = np.clip(centres[:, 0], 0, rows - 1), np.clip(centres[:, 1], 0, cols - 1)
    moved = centres + np.stack(displacement_at(*inside), axis=1)
    reference = camera(render_speckle(qy, qx, centres, amplitudes, centres), rng, noise)
    deformed = camera(render_speckle(py, px, centres, amplitudes, moved), rng, noise)
    return reference, deformed, dict(field)


def _displacement_function(
    field: dict[str, np.ndarray] | None, shape: tuple[int, int]
) -> Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """``(y, x) -> (u_y, u_x)`` at any positions for :func:`make_dic_pair`'s ``field``: the sample's own from its
    formula (no SciPy: File > Open Sample makes it on napari's GUI thread, 0.69 -> 0.29 s with the import), constants
    as they are, else the arrays' cubic splines (also where the dots land: linear interpolation before)."""
    if field is None:
        return lambda y, x: _sample_displacement(y, x, shape)
    uy, ux = (np.asarray(field[k], np.float64) for k in ("dy", "dx"))
    if uy.ndim == 0 and ux.ndim == 0:
        return lambda y, x: (np.full(y.shape, float(uy)), np.full(x.shape, float(ux)))
    from scipy import ndimage  # 0.3 s to import: only the samples that blur load it

    splines = [ndimage.spline_filter(np.broadcast_to(f, shape), order=3, mode="nearest") for f in (uy, ux)]

    def at(y: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        points = np.stack([y, x])
        return tuple(ndimage.map_coordinates(c, points, order=3, mode="nearest", prefilter=False) for c in splines)

    return at


DIC_SETTINGS = {
    "mode": "single pair, subset",
    "window": [11, 11],
    "subset": [31, 31],
    "step": 4,
    "subpixel": "refine",
    "outputs": ["strain"],
    "strain_window": 11,
    "spacing": 32,
}


@on_disk
def dic_sample() -> list[tuple]:
    """File > Open Sample > DIC pair: the deformed image first (img1), then the reference (img2), each 2D uint8;
    the known field and strain in the deformed layer's metadata (``true_dy`` ...)."""
    reference, deformed, field = make_dic_pair(DIC_SHAPE)  # the module's shape, read now (dic_stand_in's too)
    return _dic_layers(deformed, reference, {f"true_{k}": np.asarray(v, np.float32) for k, v in field.items()})


def dic_stand_in() -> list[tuple]:
    """Layers as :func:`dic_sample`'s (uint8 images of ``DIC_SHAPE``, the names, the suggested settings), a textured
    stand-in image twice and no truth: the sample's first Run on them makes that Run's programs ahead of it
    (:mod:`napari_gridmip._sample_data.ahead`)."""
    image = stand_in_image(DIC_SHAPE, np.uint8)
    return _dic_layers(image, image, {})


def _dic_layers(deformed: np.ndarray, reference: np.ndarray, truth: dict) -> list[tuple]:
    """The DIC pair's napari layer data (img1, the deformed image, first), ``truth`` in img1's metadata."""
    truth = {**truth, "gridmip_correlation": DIC_SETTINGS}  # the Correlation widget's mode and parameters
    return [
        (deformed, {"name": "DIC deformed (img1)", "colormap": "gray",
                    "metadata": {"gridmip_role": "img1", **truth}}, "image"),
        (reference, {"name": "DIC reference (img2)", "colormap": "gray", "metadata": {"gridmip_role": "img2"}},
         "image"),
    ]  # fmt: skip
