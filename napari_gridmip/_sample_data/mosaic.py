"""A microscope-like mosaic: tiles cut from a known picture at known positions, with stage errors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from scipy import ndimage

from napari_gridmip.core.patches.stitch import grid_positions

MOSAIC_GRID = (3, 4)
MOSAIC_TILE = (192, 192)
MOSAIC_OVERLAP = 0.15
MOSAIC_ERROR = 8.0


class MosaicSample(NamedTuple):
    """What :func:`make_mosaic` returns."""

    tiles: np.ndarray
    """``(n, [C,] *tile_shape)`` float32 tiles in row-major grid order."""
    true_positions: np.ndarray
    """``(n, d)`` float64: where each tile really is (its pixel 0) in ``image``."""
    stage_positions: np.ndarray
    """``(n, d)`` float64: where the stage says it is (the regular grid, shifted to ``true``'s frame)."""
    grid_shape: tuple[int, ...]
    overlap: float
    """The nominal overlap, a fraction of the tile."""
    image: np.ndarray
    """``([C,] *shape)`` float32: the picture the tiles were cut from, without noise."""
    blank: np.ndarray
    """``(n,)`` bool: tiles whose every overlap lies in the blank region (nothing to register on)."""


def texture(shape: Sequence[int], seed: int = 0) -> np.ndarray:
    """A fluorescence-like picture of any size and dimension: blobs and fibres at several scales, in [0, 1]."""
    rng = np.random.default_rng(seed)
    shape = tuple(int(s) for s in shape)
    out = np.zeros(shape, np.float64)
    for sigma, weight in ((1.5, 0.5), (4.0, 1.0), (12.0, 1.0)):
        layer = ndimage.gaussian_filter(rng.standard_normal(shape), sigma, mode="wrap")
        out += weight * layer / layer.std()
    out = np.exp(0.8 * out / out.std())  # positive, skewed like fluorescence
    out -= out.min()
    return (out / out.max()).astype(np.float32)


def make_mosaic(
    *,
    grid_shape: Sequence[int] = MOSAIC_GRID,
    tile_shape: Sequence[int] = MOSAIC_TILE,
    overlap: float = MOSAIC_OVERLAP,
    stage_error: float = MOSAIC_ERROR,
    noise: float = 0.01,
    blank_corner: bool = False,
    channels: int | None = None,
    picture: Any = None,
    subpixel: bool = True,
    seed: int = 0,
) -> MosaicSample:
    """Cut a mosaic out of a known picture, with stage errors and noise.

    Parameters
    ----------
    grid_shape, tile_shape, overlap
        The grid (2 or 3 axes), the tiles' spatial shape and the nominal
        overlap (a fraction of the tile).
    stage_error
        True positions are the grid's plus independent uniform errors in
        ``[-stage_error, stage_error]`` per axis (fractional unless ``subpixel``
        is False).
    noise
        Standard deviation of the Gaussian noise added to each tile
        independently, relative to the picture's range (0 to 1).
    blank_corner
        Blank out (set to the background, 0) the region around the last
        tile, so that its overlaps hold nothing but noise: pairs there must
        be rejected and the tile placed from the stage.
    channels
        None: tiles ``(n, *tile_shape)``. An integer C: ``(n, C, *tile_shape)``,
        each channel its own texture.
    picture
        The picture to cut from (2D or 3D, at least the mosaic's size plus
        ``2 * stage_error + 8``); default a generated texture (:func:`texture`).
    subpixel
        Fractional true positions (tiles resampled with a cubic spline), or
        integer ones (tiles cut exactly).
    seed
        Seeds the positions, the noise and the texture.

    Returns
    -------
    MosaicSample

    Notes
    -----
    The truth is known exactly: tile ``t`` is the picture sampled at ``true_positions[t] + k`` (cubic spline
    interpolation for fractional positions), plus noise. The stage reports the regular grid instead
    (``stage_positions``, from :func:`~napari_gridmip.grid_positions`), off by up to ``stage_error`` pixels per axis.
    """
    grid_shape = tuple(int(g) for g in grid_shape)
    tile_shape = tuple(int(t) for t in tile_shape)
    d = len(tile_shape)
    rng = np.random.default_rng(seed)
    nominal = grid_positions(grid_shape, tile_shape, overlap)
    margin = int(np.ceil(stage_error)) + 4
    errors = rng.uniform(-stage_error, stage_error, nominal.shape)
    true = nominal + margin + errors
    if not subpixel:
        true = np.round(true)
    stage = nominal + margin
    extent = tuple(int(np.ceil(true[:, k].max())) + tile_shape[k] + margin for k in range(d))
    if picture is None:
        layers = [texture(extent, seed=seed + 1 + c) for c in range(channels or 1)]
        image = np.stack(layers) if channels else layers[0]
    else:
        image = np.asarray(picture, dtype=np.float32)
        image = (image - image.min()) / max(float(np.ptp(image)), 1e-12)
        if channels:
            image = np.stack([image] * channels)
        if any(n < e for n, e in zip(image.shape[-d:], extent)):
            raise ValueError(f"picture of shape {image.shape} is smaller than the mosaic needs, {extent}")
    blank = np.zeros(len(true), bool)
    if blank_corner:
        lo = np.floor(true[-1] - stage_error - 2).astype(int)
        image = image.copy()
        image[(Ellipsis, *(slice(max(int(a), 0), None) for a in lo))] = 0
        blank[-1] = True
    tiles = []
    for origin in true:
        base = np.floor(origin).astype(int) - 2
        frac = origin - np.floor(origin)
        box = tuple(slice(int(b), int(b) + t + 5) for b, t in zip(base, tile_shape))
        crop = image[(Ellipsis, *box)].astype(np.float64)
        if subpixel and np.any(frac > 0):
            shift = (0,) * (crop.ndim - d) + tuple(-frac)
            crop = ndimage.shift(crop, shift, order=3, mode="nearest")
        tile = crop[(Ellipsis, *(slice(2, 2 + t) for t in tile_shape))]
        tiles.append(tile + noise * rng.standard_normal(tile.shape))
    return MosaicSample(
        tiles=np.stack(tiles).astype(np.float32),
        true_positions=true,
        stage_positions=stage,
        grid_shape=grid_shape,
        overlap=float(overlap),
        image=image.astype(np.float32),
        blank=blank,
    )


def microscope_tiles(
    sample: MosaicSample,
    *,
    photons: float = 400.0,
    dark: float = 100.0,
    vignetting: float = 0.6,
    flat_offset: Sequence[float] | None = None,
    seed: int = 0,
) -> np.ndarray:
    """The tiles of ``sample`` as a camera records them: vignetted, unevenly lit, shot noise, uint16.

    Each tile becomes ``Poisson(photons * flat * (0.05 + tile)) + dark`` with
    ``flat`` a cos^4 fall-off (``cos(theta)^4``, ``tan(theta) = vignetting * r``
    for ``r`` the distance to the optical centre over the half diagonal) whose
    centre sits ``flat_offset`` (a fraction of the tile per axis; default
    ``0.15`` along every axis) off the tile's centre, so that the
    illumination is uneven as well as vignetted: the same on every tile, as
    the optics are. ``0.05`` is the specimen's background (autofluorescence):
    blank regions hold shot noise only.

    Parameters
    ----------
    sample
        From :func:`make_mosaic` (its tiles in ``[0, 1]``, noise-free preferably: ``noise=0``).
    photons
        Photo-electrons at the picture's maximum, before vignetting (shot noise ``~1/sqrt(photons)``).
    dark
        The camera's offset, counts.
    vignetting
        ``tan(theta)`` at the half diagonal from the optical centre: 0.6 keeps about 55% in the corners.
    flat_offset
        Where the optical centre is, relative to the tile's centre, as a fraction of the tile per axis.
    seed
        Seeds the shot noise.

    Returns
    -------
    numpy.ndarray
        uint16, the shape of ``sample.tiles``.
    """
    rng = np.random.default_rng(seed)
    tiles = np.clip(np.asarray(sample.tiles, np.float64), 0, None)
    flat = flat_field(tiles.shape[-len(sample.grid_shape) :], vignetting=vignetting, offset=flat_offset)
    return (rng.poisson(photons * flat * (0.05 + tiles)) + dark).astype(np.uint16)


def flat_field(
    tile_shape: Sequence[int], *, vignetting: float = 0.6, offset: Sequence[float] | None = None
) -> np.ndarray:
    """The cos^4 illumination profile :func:`microscope_tiles` applies, maximum 1, float64 ``tile_shape``."""
    tile_shape = tuple(int(t) for t in tile_shape)
    offset = (0.15,) * len(tile_shape) if offset is None else tuple(offset)
    grids = np.meshgrid(*(np.arange(n) - (n - 1) / 2 - f * n for n, f in zip(tile_shape, offset)), indexing="ij")
    r = np.sqrt(sum(g**2 for g in grids)) / (np.sqrt(sum(n**2 for n in tile_shape)) / 2)
    return np.cos(np.arctan(vignetting * r)) ** 4


def lattice_picture(
    shape: Sequence[int], *, period: float = 18.0, textured: float = 0.45, features: int = 0, seed: int = 0
) -> np.ndarray:
    """A repetitive picture (2D): "L" marks on a square lattice, as ruled paper, a counting grid or regular tissue.

    Each cell of ``period`` px holds a vertical bar and a horizontal one from
    its foot (an "L": no symmetry under a 180-degree turn, so that the
    significance test's turned templates do not match it). The fluorescence
    texture of :func:`texture` covers the picture up to ``textured`` of its
    height or of its width (softened over 4 px); the lower right part beyond
    both holds the lattice alone (``textured=0``: all of it). ``features``
    bright spots (Gaussian, 2 px) at random places are its only unique marks
    there. Values about ``[0, 1]``, float32.
    """
    shape = tuple(int(s) for s in shape)
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[: shape[0], : shape[1]].astype(np.float64)
    u, v = y % period, x % period
    bars = ((np.abs(v - period * 0.22) < 1.0) & (u > period * 0.17) & (u < period * 0.72)) | (
        (np.abs(u - period * 0.67) < 1.0) & (v > period * 0.22) & (v < period * 0.61)
    )
    lattice = ndimage.gaussian_filter(bars.astype(np.float64), 0.7)
    mask = np.ones(shape)
    mask[int(shape[0] * textured) :, int(shape[1] * textured) :] = 0
    mask = ndimage.gaussian_filter(mask, 4.0) if textured > 0 else np.zeros(shape)
    out = texture(shape, seed=seed) * mask + lattice * (1 - mask)
    for cy, cx in rng.uniform(0, 1, (int(features), 2)) * np.asarray(shape):
        out += np.exp(-0.5 * ((y - cy) ** 2 + (x - cx) ** 2) / 2.0**2)
    return out.astype(np.float32)


def cut_mosaic(
    picture: Any,
    *,
    grid_shape: Sequence[int],
    tile_shape: Sequence[int],
    overlap: float,
    errors: Any,
    noise: float = 0.01,
    seed: int = 0,
) -> MosaicSample:
    """Tiles cut exactly from ``picture`` where the stage grid plus given ``errors`` puts them (integer truth).

    :func:`make_mosaic` draws its stage errors; here they are chosen (a
    worst case: a tile moved away from all its neighbours). The stage is
    :func:`~napari_gridmip.grid_positions` shifted by ``ceil(max |errors|) + 1``;
    the true origins are the stage's plus ``errors`` ``(n, d)``, rounded.
    ``picture`` must hold the mosaic (a ``ValueError`` says so otherwise).
    Gaussian ``noise`` (relative to the picture's range) is added per tile.
    """
    picture = np.asarray(picture, dtype=np.float32)
    grid_shape = tuple(int(g) for g in grid_shape)
    tile_shape = tuple(int(t) for t in tile_shape)
    errors = np.asarray(errors, dtype=np.float64)
    stage = grid_positions(grid_shape, tile_shape, overlap) + int(np.ceil(np.abs(errors).max(initial=0))) + 1
    true = np.round(stage + errors)
    if np.any(true.max(axis=0) + tile_shape > picture.shape):
        raise ValueError(f"picture of shape {picture.shape} is smaller than the mosaic needs")
    rng = np.random.default_rng(seed)
    span = max(float(np.ptp(picture)), 1e-12)
    tiles = [
        picture[tuple(slice(int(o), int(o) + t) for o, t in zip(origin, tile_shape))]
        + noise * span * rng.standard_normal(tile_shape)
        for origin in true
    ]
    return MosaicSample(
        tiles=np.stack(tiles).astype(np.float32),
        true_positions=true,
        stage_positions=stage,
        grid_shape=grid_shape,
        overlap=float(overlap),
        image=picture,
        blank=np.zeros(len(true), bool),
    )


def mosaic_sample() -> list[tuple]:
    """File > Open Sample > Mosaic tiles: a 3x4 mosaic with stage errors; the truth rides in the metadata."""
    sample = make_mosaic(blank_corner=True)
    metadata = {
        "gridmip_mosaic": {
            "grid_shape": sample.grid_shape,
            "overlap": sample.overlap,
            "stage_positions": sample.stage_positions,
            "true_positions": sample.true_positions,
        }
    }
    return [(sample.tiles, {"name": "mosaic tiles", "colormap": "gray", "metadata": metadata}, "image")]
