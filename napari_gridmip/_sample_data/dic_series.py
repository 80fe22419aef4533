"""DIC sequences with their known motion: a reference and frames, rendered from one analytic speckle pattern, in the
four cases of the DIC Challenge's sequences (:data:`KINDS`; :func:`make_dic_series` says how).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from napari_gridmip._sample_data._cache import on_disk
from napari_gridmip._sample_data.dic import _dots, camera, render_speckle

KINDS = ("translation", "rotation", "hole", "strain")
SERIES_SHAPE = (256, 256)
Map = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def _translation_path(frames: int, shape: tuple[int, int]) -> list[tuple[float, float]]:
    """A drift out of view and back: up to 0.45 of the frame from the reference, steps up to half the frame."""
    rows, cols = shape
    path = [(0.0, 0.0), (0.1 * rows, 0.45 * cols), (-0.2 * rows, 0.3 * cols), (0.05 * rows, -0.4 * cols),
            (0.3 * rows, 0.1 * cols), (-0.1 * rows, 0.05 * cols),
            (0.02 * rows + 0.37, -0.03 * cols + 0.61)]  # fmt: skip
    return [(dy + 0.13 * i, dx - 0.29 * i) for i, (dy, dx) in enumerate(path[:frames])]  # fmt: skip


def _kirsch(y: np.ndarray, x: np.ndarray, *, centre: np.ndarray, radius: float, load: float) -> tuple[np.ndarray, ...]:
    """The displacement ``(u_y, u_x)`` (px) of a plate with a hole of ``radius`` under a tension along x whose
    far-field strain is ``load`` (plane stress, Poisson's ratio 0.3), rigid motion removed at the centre."""
    nu = 0.3
    kappa = (3 - nu) / (1 + nu)
    dy, dx = y - centre[0], x - centre[1]
    r = np.maximum(np.hypot(dy, dx), radius * 0.5)  # inside the hole: no material, a smooth stand-in
    theta = np.arctan2(dy, dx)
    a2 = radius * radius
    c = load * (1 + nu) / 2  # sigma / (4 mu) for a far-field strain ``load`` along x
    ur = c * (r * (kappa - 1) / 2 + a2 / r + (r + a2 * (kappa + 1) / r - a2 * a2 / r**3) * np.cos(2 * theta))
    ut = -c * (r + a2 * (kappa - 1) / r + a2 * a2 / r**3) * np.sin(2 * theta)
    ux = ur * np.cos(theta) - ut * np.sin(theta)
    uy = ur * np.sin(theta) + ut * np.cos(theta)
    return uy, ux


def series_maps(kind: str, frames: int, shape: tuple[int, int] = SERIES_SHAPE) -> tuple[list[Map], np.ndarray]:
    """The maps ``phi_t`` (reference ``(y, x)`` -> frame position) of a sequence, and the reference's ROI
    ``(M, N)`` bool."""
    rows, cols = shape
    centre = np.array([(rows - 1) / 2, (cols - 1) / 2])
    roi = np.ones(shape, bool)
    yy, xx = np.mgrid[:rows, :cols]
    if kind == "translation":
        maps = [(lambda y, x, s=s: (y + s[0], x + s[1])) for s in _translation_path(frames, shape)]
    elif kind == "rotation":
        radius = 0.42 * min(shape)
        roi = (yy - centre[0]) ** 2 + (xx - centre[1]) ** 2 <= (radius - 3) ** 2
        maps = []
        for t in range(frames):
            a = np.deg2rad(20.0 * t)
            c, s = np.cos(a), np.sin(a)
            maps.append(lambda y, x, c=c, s=s: (centre[0] + c * (y - centre[0]) + s * (x - centre[1]),
                                                 centre[1] - s * (y - centre[0]) + c * (x - centre[1])))  # fmt: skip
    elif kind == "hole":
        hole = 0.12 * min(shape)
        roi = (yy - centre[0]) ** 2 + (xx - centre[1]) ** 2 > (hole + 2) ** 2
        maps = []
        for t in range(frames):
            load = 0.004 * t

            def moved(y, x, load=load):
                uy, ux = _kirsch(y, x, centre=centre, radius=hole, load=load)
                return y + uy, x + ux

            maps.append(moved)
    elif kind == "strain":
        maps = []
        for t in range(frames):
            e = 0.25 * t / max(frames - 1, 1)
            maps.append(lambda y, x, e=e: (centre[0] + (y - centre[0]) * (1 - 0.3 * e),
                                           centre[1] + (x - centre[1]) * (1 + e)))  # fmt: skip
    else:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    return maps, roi


def _inverse(phi: Map, qy: np.ndarray, qx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``phi^-1`` at the pixels ``(qy, qx)`` by Newton's method with the map's numerical Jacobian (to 1e-10 px;
    a plain fixed-point iteration diverges for rotations beyond 60 degrees)."""
    py, px = qy.copy(), qx.copy()
    h = 1e-4
    for _ in range(50):
        my, mx = phi(py, px)
        ey, ex = qy - my, qx - mx
        if max(np.abs(ey).max(), np.abs(ex).max()) < 1e-10:
            break
        ay, ax = phi(py + h, px)
        by, bx = phi(py, px + h)
        j00, j10, j01, j11 = (ay - my) / h, (ax - mx) / h, (by - my) / h, (bx - mx) / h
        det = j00 * j11 - j01 * j10
        py, px = py + (j11 * ey - j01 * ex) / det, px + (-j10 * ey + j00 * ex) / det
    return py, px


def make_dic_series(
    kind: str = "rotation", *, frames: int | None = None, shape: tuple[int, int] = SERIES_SHAPE, seed: int = 0,
    noise: float | None = None,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:  # fmt: skip
    """A DIC sequence with its truth: ``(frames (T, M, N) uint8, truth)``.

    ``truth`` holds ``"roi"`` (the reference's ``(M, N)`` bool region of interest), and the functions' values
    under ``"maps"``: a list of callables ``phi_t(y, x) -> (y', x')``; :func:`true_displacement` evaluates them
    on a grid. ``frames``: default 7 for ``"translation"``, 19 (a full turn) for ``"rotation"``, 8 for the
    others. ``noise``: see :func:`~napari_gridmip._sample_data.dic.camera`.

    Each frame shows the surface moved by a known map ``phi_t`` (reference position -> position in frame ``t``):
    its pixel ``q`` shows the material point ``phi_t^-1(q)`` (exact for the rigid and homogeneous maps; by
    fixed-point iteration for the plate with a hole), so the truth carries no interpolation error; then the same
    camera as the DIC pair (shot and read noise, 8 bits). Four kinds, the cases of the DIC Challenge's sequences:

    - ``"translation"``: a rigid drift that takes part of the specimen out of view and brings it back, up to half
      the frame between two frames;
    - ``"rotation"``: a speckled disk on a black background turning a full turn in 20 degree steps, with its
      mask as the region of interest;
    - ``"hole"``: a plate with a central hole under increasing tension (Kirsch's elastic solution), the hole and
      the background outside the ROI;
    - ``"strain"``: a homogeneous stretch growing to 25% along x (with the Poisson contraction along y).

    References
    ----------
    P. L. Reu et al., "DIC Challenge 2.0: developing images and guidelines for evaluating accuracy and resolution
    of 2D analyses", Exp. Mech. 62, 639-654 (2022).
    G. Kirsch, "Die Theorie der Elastizitat und die Bedurfnisse der Festigkeitslehre", Z. Ver. Dtsch. Ing. 42,
    797-807 (1898).
    """
    count = frames if frames is not None else {"translation": 7, "rotation": 19}.get(kind, 8)
    maps, roi = series_maps(kind, count, shape)
    rng = np.random.default_rng(seed)
    rows, cols = shape
    margin = max(rows, cols)  # dots beyond the frame: a drift brings them into view
    centres, amplitudes = _dots(shape, rng, margin=float(margin))
    qy, qx = np.meshgrid(np.arange(rows, dtype=np.float64), np.arange(cols, dtype=np.float64), indexing="ij")
    if kind == "rotation":  # a disk of speckles on black
        keep = np.hypot(centres[:, 0] - (rows - 1) / 2, centres[:, 1] - (cols - 1) / 2) <= 0.42 * min(shape) - 2
        centres, amplitudes = centres[keep], amplitudes[keep]
    out = []
    for phi in maps:
        py, px = _inverse(phi, qy, qx)
        landing = np.stack(phi(centres[:, 0], centres[:, 1]), axis=1)
        intensity = render_speckle(py, px, centres, amplitudes, landing)
        if kind == "hole":  # the hole shows the black background
            inside_hole = np.hypot(py - (rows - 1) / 2, px - (cols - 1) / 2) <= 0.12 * min(shape)
            intensity = np.where(inside_hole, 0.0, intensity)
        out.append(camera(intensity, rng, noise))
    return np.stack(out), {"roi": roi, "maps": maps}


def true_displacement(maps: list[Map], y: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The true ``(dy, dx)`` ``(T, R, C)`` of the grid ``y`` ``(R,)``, ``x`` ``(C,)`` under each map."""
    gy, gx = np.meshgrid(y, x, indexing="ij")
    moved = [phi(gy, gx) for phi in maps]
    return np.stack([m[0] - gy for m in moved]), np.stack([m[1] - gx for m in moved])


# the Correlation widget's mode and options for the rotation series (napari_gridmip._widgets.correlation_widget's
# SERIES mode): the subset and step of the truth below, an arrow every 4th point
SERIES_SETTINGS = {"mode": "DIC series (image sequence)", "subset": [31, 31], "step": 8, "reference": "accumulated",
                   "spacing": 32}  # fmt: skip


@on_disk
def dic_series_sample() -> list[tuple]:
    """File > Open Sample > DIC series (rotation): a speckled disk turning a full turn in 20 degree steps, the
    frames ``(T, Y, X)`` uint8 and the disk as a Labels layer (the region of interest).

    The truth on the grid of the suggested subset and step (``correlate_series``' grid) is in the frames' metadata:
    ``true_dy``, ``true_dx`` ``(T, R, C)`` at the reference points ``true_y`` ``(R,)``, ``true_x`` ``(C,)``, and
    each frame's angle ``true_angle_deg``.
    """
    frames, truth = make_dic_series("rotation")
    half, step = SERIES_SETTINGS["subset"][0] // 2, SERIES_SETTINGS["step"]
    rows, cols = frames.shape[1:]
    y = np.arange(half, rows - half, step, dtype=np.float64)
    x = np.arange(half, cols - half, step, dtype=np.float64)
    dy, dx = true_displacement(truth["maps"], y, x)
    metadata = {
        "gridmip_role": "frames",
        "gridmip_correlation": SERIES_SETTINGS,
        "true_dy": dy.astype(np.float32),
        "true_dx": dx.astype(np.float32),
        "true_y": y,
        "true_x": x,
        "true_angle_deg": 20.0 * np.arange(len(frames)),
    }
    roi = {"name": "DIC series ROI", "opacity": 0.2, "metadata": {"gridmip_role": "roi"}}
    return [
        (frames, {"name": "DIC series (rotation)", "colormap": "gray", "metadata": metadata}, "image"),
        (truth["roi"].astype(np.uint8), roi, "labels"),
    ]
