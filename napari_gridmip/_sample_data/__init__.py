"""Sample data under File > Open Sample.

Every sample is generated from code in this package (deterministic seeds), or
read from data bundled with an installed package, so it loads from a wheel as
well as from the source tree. ``sample_data/README.md`` documents them.
"""

from __future__ import annotations

import numpy as np

from napari_gridmip._sample_data._cache import on_disk

OCCUPANCY_SHAPE = (160, 144, 136)


def stand_in_image(shape: tuple[int, ...], dtype: np.dtype | type, *, seed: int = 0) -> np.ndarray:
    """A textured image of ``shape`` and ``dtype`` (uniform noise over the dtype's range, or [0, 1) for floats)
    that stands in for a sample while the sample is made: a first Run's programs depend on the inputs' shapes,
    dtypes and options only, and on this input every subset has variance (no flat subset, no NaN)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind in "ui":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return rng.random(shape).astype(dtype)


def _add_ball(volume: np.ndarray, center, radius: float, value: float, *, shell: float = 0.0) -> None:
    """Paint a ball (or a shell of thickness ``shell``) into ``volume``, in place, on its bounding box."""
    lo = [max(int(np.floor(c - radius)), 0) for c in center]
    hi = [min(int(np.ceil(c + radius)) + 1, n) for c, n in zip(center, volume.shape)]
    if any(b <= a for a, b in zip(lo, hi)):
        return
    grids = np.ogrid[tuple(slice(a, b) for a, b in zip(lo, hi))]
    dist = np.sqrt(sum((g - c) ** 2 for g, c in zip(grids, center)))
    inside = dist <= radius
    if shell > 0:
        inside &= dist >= radius - shell
    box = volume[tuple(slice(a, b) for a, b in zip(lo, hi))]
    box[inside] = np.maximum(box[inside], value)


def make_occupancy_volume(shape: tuple[int, int, int] = OCCUPANCY_SHAPE, seed: int = 0) -> np.ndarray:
    """A sparse float32 density volume with structure at several scales.

    Empty space is exactly 0; occupied voxels hold densities in (0, 1]: two
    large hollow shells, a helix-shaped tube, a dozen medium blobs and a few
    hundred single-voxel to 2-voxel specks. Its shape is not a power of two, so
    the pyramid's edge handling shows. About 2.4% of the voxels are occupied.
    """
    rng = np.random.default_rng(seed)
    volume = np.zeros(shape, dtype=np.float32)
    d, h, w = shape
    _add_ball(volume, (0.35 * d, 0.4 * h, 0.35 * w), 0.22 * min(shape), 0.9, shell=3)
    _add_ball(volume, (0.7 * d, 0.65 * h, 0.7 * w), 0.15 * min(shape), 0.8, shell=2)
    # A helix: a tube of radius 3 voxels along a parametric curve.
    for t in np.linspace(0, 6 * np.pi, 900):
        center = (d * (0.1 + 0.8 * t / (6 * np.pi)), h * (0.5 + 0.3 * np.cos(t)), w * (0.5 + 0.3 * np.sin(t)))
        _add_ball(volume, center, 3.0, 0.6)
    for _ in range(12):
        center = rng.uniform(0, 1, 3) * shape
        _add_ball(volume, center, rng.uniform(4, 9), float(rng.uniform(0.3, 1.0)))
    for _ in range(400):
        center = rng.uniform(0, 1, 3) * shape
        _add_ball(volume, center, rng.uniform(0, 1.2), float(rng.uniform(0.05, 1.0)))
    return volume


def occupancy_sample() -> list[tuple]:
    """File > Open Sample > Occupancy volume."""
    return [
        (
            make_occupancy_volume(),
            {"name": "occupancy volume", "colormap": "magma", "rendering": "mip", "contrast_limits": (0, 1)},
            "image",
        )
    ]


TILES_PATCH = (128, 128)
TILES_STRIDE = (100, 100)  # does not divide 512 - 128: the last patches sit flush with the edge


def make_image_tiles() -> tuple[np.ndarray, dict]:
    """scikit-image's bundled astronaut photograph (512x512 RGB, public domain, NASA), channels first,
    cut into 128x128 tiles with stride 100: patches of shape (5, 5, 3, 128, 128), uint8.

    Returns the patches and the tiling (image shape, patch size, stride) that reassembles them.
    """
    # skimage.data takes 0.35 s to import, and the patches' module JAX: only this sample loads them
    from skimage import data  # bundled with scikit-image, which napari requires

    from napari_gridmip.core.patches.grid import patch_origins

    image = np.ascontiguousarray(data.astronaut().transpose(2, 0, 1))  # (3, 512, 512)
    origins = [patch_origins(n, p, s) for n, p, s in zip(image.shape[1:], TILES_PATCH, TILES_STRIDE)]
    patches = np.stack(
        [np.stack([image[:, y : y + TILES_PATCH[0], x : x + TILES_PATCH[1]] for x in origins[1]]) for y in origins[0]]
    )
    tiling = {"image_shape": image.shape, "patch_size": TILES_PATCH, "stride": TILES_STRIDE}
    return patches, tiling


@on_disk
def tiles_sample() -> list[tuple]:
    """File > Open Sample > Image tiles: a patch stack the Reassemble patches widget takes as is."""
    patches, tiling = make_image_tiles()
    return [(patches, {"name": "astronaut tiles", "metadata": {"gridmip_tiling": tiling}}, "image")]


SPECKLE_FRAMES = 12
SPECKLE_SHAPE = (256, 256)
SPECKLE_PUPIL = 0.08  # pupil radius as a fraction of the sampling frequency: speckle grains about 6 px


def speckle_field(shape: tuple[int, int] = SPECKLE_SHAPE) -> tuple[np.ndarray, np.ndarray]:
    """The known smooth displacement ``(dy, dx)`` of the speckle sample at every pixel, in pixels.

    ``dy = 1.6 sin(2 pi x / W) cos(pi y / H)`` and ``dx = -1.2 cos(2 pi y / H) + 0.4``,
    at most about 1.6 px, so a 9x9 window (m = n = 4) holds every peak.
    """
    rows, cols = shape
    y, x = np.meshgrid(np.arange(rows, dtype=np.float64), np.arange(cols, dtype=np.float64), indexing="ij")
    dy = 1.6 * np.sin(2 * np.pi * x / cols) * np.cos(np.pi * y / rows)
    dx = -1.2 * np.cos(2 * np.pi * y / rows) + 0.4
    return dy, dx


def make_speckle_pair(
    frames: int = SPECKLE_FRAMES, shape: tuple[int, int] = SPECKLE_SHAPE, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """A speckle reference stack and the same stack displaced by the known field.

    Each frame is an independent fully developed speckle pattern: the intensity
    of a complex Gaussian field low-passed by a circular pupil (as a diffuser
    moved between exposures gives). ``reference`` is img2; ``sample`` is img1
    with ``sample[y + dy, x + dx] = reference[y, x]`` for the field of
    :func:`speckle_field` (found by fixed-point inversion, resampled with a
    quintic spline). Returns ``(sample, reference, (dy, dx))``, float32 stacks of
    shape ``(frames, *shape)``.
    """
    from scipy import ndimage  # 0.3 s to import: only the samples that blur load it

    rng = np.random.default_rng(seed)
    rows, cols = shape
    fy = np.fft.fftfreq(rows)[:, None]
    fx = np.fft.fftfreq(cols)[None, :]
    pupil = (fy**2 + fx**2) <= SPECKLE_PUPIL**2
    noise = rng.normal(size=(frames, rows, cols)) + 1j * rng.normal(size=(frames, rows, cols))
    field = np.fft.ifft2(np.fft.fft2(noise) * pupil)
    reference = np.abs(field) ** 2
    reference /= reference.mean()
    dy, dx = speckle_field(shape)
    _, _, py, px = _reference_positions(shape)
    coords = np.stack([py, px])
    sample = np.stack([ndimage.map_coordinates(f, coords, order=5, mode="reflect") for f in reference])
    return sample.astype(np.float32), reference.astype(np.float32), (dy, dx)


# the Correlation widget's settings for the speckle pair (its defaults): a sample sets every option its workflow uses,
# or the options remembered from another sample's last Run apply (the DIC pair's subset and refine made the pair's
# first Run in a new process 3.3 s instead of 1.7 s, compiling programs of those options: docs/benchmarks.md, "First
# calls")
SPECKLE_SETTINGS = {"mode": "stacks", "window": [9, 9], "subpixel": "hessian", "outputs": [], "spacing": 8}


@on_disk
def speckle_sample() -> list[tuple]:
    """File > Open Sample > Speckle pair: two K-frame stacks, img1 first (the Correlation map's order)."""
    sample, reference, (dy, dx) = make_speckle_pair()
    truth = {"true_dy": dy.astype(np.float32), "true_dx": dx.astype(np.float32)}
    return [
        (
            sample,
            {
                "name": "speckle sample (img1)",
                "colormap": "gray",
                "metadata": {"gridmip_role": "img1", "gridmip_correlation": SPECKLE_SETTINGS, **truth},
            },
            "image",
        ),
        (
            reference,
            {"name": "speckle reference (img2)", "colormap": "gray", "metadata": {"gridmip_role": "img2"}},
            "image",
        ),
    ]


def _reference_positions(shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(qy, qx, py, px)``: each sample pixel ``q`` and the reference position ``p`` its speckle came from, with
    ``q = p + d(p)`` for :func:`speckle_field`'s ``d``, solved as ``p = q - d(p)`` by fixed-point iteration."""
    from scipy import ndimage  # 0.3 s to import: only the samples that blur load it

    rows, cols = shape
    dy, dx = speckle_field(shape)
    qy, qx = np.meshgrid(np.arange(rows, dtype=np.float64), np.arange(cols, dtype=np.float64), indexing="ij")
    py, px = qy.copy(), qx.copy()
    for _ in range(8):
        at = np.stack([py, px])
        py = qy - ndimage.map_coordinates(dy, at, order=3, mode="nearest")
        px = qx - ndimage.map_coordinates(dx, at, order=3, mode="nearest")
    return qy, qx, py, px


def _sample_grid_field(shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The speckle sample's displacement on the *sample's* grid: the speckle seen at sample pixel ``q`` came
    from reference position ``q - d``, found by the same fixed-point inversion as :func:`make_speckle_pair`."""
    qy, qx, py, px = _reference_positions(shape)
    return qy - py, qx - px


def contrast_maps(shape: tuple[int, int] = SPECKLE_SHAPE) -> tuple[np.ndarray, np.ndarray]:
    """Known transmission and dark-field maps for the speckle sample: a soft-edged ball seen in projection.

    ``T = exp(-0.7 t)`` and ``D = exp(-0.6 t)`` for the ball's normalised thickness ``t`` in [0, 1], smoothed
    by a Gaussian of 2 px so that both change little across a subset: T from 1 down to 0.50, D to 0.55.
    """
    from scipy import ndimage  # 0.3 s to import: only the samples that blur load it

    rows, cols = shape
    y, x = np.meshgrid(np.arange(rows, dtype=np.float64), np.arange(cols, dtype=np.float64), indexing="ij")
    radius = 0.3 * min(rows, cols)
    r2 = ((y - 0.5 * rows) ** 2 + (x - 0.55 * cols) ** 2) / radius**2
    thickness = ndimage.gaussian_filter(np.sqrt(np.clip(1 - r2, 0, None)), 2.0)
    return np.exp(-0.7 * thickness), np.exp(-0.6 * thickness)


def make_speckle_pair_with_contrast(
    frames: int = SPECKLE_FRAMES, shape: tuple[int, int] = SPECKLE_SHAPE, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, dict]:
    """The speckle pair of :func:`make_speckle_pair` with a sample that also absorbs and scatters.

    The sample follows UMPA's model exactly: ``sample = T (Im + D (moved - Im))``, where ``moved`` is
    :func:`make_speckle_pair`'s displaced stack (unchanged), ``Im`` the reference's mean, and ``T``, ``D``
    the maps of :func:`contrast_maps`. Returns ``(sample, reference, truth)``: float32 stacks
    ``(frames, *shape)`` and a dict of float64 maps on the sample's grid, ``dy``, ``dx`` (the speckle's
    displacement from the reference to the sample, as :func:`napari_gridmip.track_speckles` reports it),
    ``transmission`` and ``dark_field``.
    """
    moved, reference, _ = make_speckle_pair(frames, shape, seed)
    transmission, dark_field = contrast_maps(shape)
    mean = float(reference.mean(dtype=np.float64))
    sample = transmission * (mean + dark_field * (moved.astype(np.float64) - mean))
    dy, dx = _sample_grid_field(shape)
    truth = {"dy": dy, "dx": dx, "transmission": transmission, "dark_field": dark_field}
    return sample.astype(np.float32), reference, truth


SPECKLE_CONTRAST_SETTINGS = {
    "mode": "single pair, subset",
    "window": [9, 9],
    "subset": [3, 3],
    "step": 1,
    "subpixel": "refine",
    "outputs": ["transmission", "dark_field", "phase"],
    "spacing": 12,
}


@on_disk
def speckle_contrast_sample() -> list[tuple]:
    """File > Open Sample > Speckle pair with transmission and dark-field: sample first, then the reference."""
    # the module's sizes, read now (speckle_contrast_stand_in's too)
    sample, reference, truth = make_speckle_pair_with_contrast(SPECKLE_FRAMES, SPECKLE_SHAPE)
    metadata = {f"true_{k}": v.astype(np.float32) for k, v in truth.items()}
    return _speckle_contrast_layers(sample, reference, metadata)


def speckle_contrast_stand_in() -> list[tuple]:
    """Layers as :func:`speckle_contrast_sample`'s (``SPECKLE_FRAMES`` float32 frames of ``SPECKLE_SHAPE``, the
    names, the suggested settings), a textured stand-in stack twice and no truth: the sample's first Run on them
    makes that Run's programs ahead of it (:mod:`napari_gridmip._sample_data.ahead`)."""
    stack = stand_in_image((SPECKLE_FRAMES, *SPECKLE_SHAPE), np.float32)
    return _speckle_contrast_layers(stack, stack, {})


def _speckle_contrast_layers(sample: np.ndarray, reference: np.ndarray, metadata: dict) -> list[tuple]:
    """The speckle pair with contrast as napari layer data (the sample first), ``metadata`` in the sample's."""
    metadata = {**metadata, "gridmip_correlation": SPECKLE_CONTRAST_SETTINGS}  # the Correlation widget's options
    return [
        (sample, {"name": "speckle sample", "colormap": "gray", "metadata": {"gridmip_role": "sample", **metadata}},
         "image"),
        (reference, {"name": "speckle reference", "colormap": "gray", "metadata": {"gridmip_role": "reference"}},
         "image"),
    ]  # fmt: skip
