"""Fusing registered tiles into one mosaic.

Tile ``t`` at origin ``p`` (any real numbers) holds the scene at ``p + k`` for
its pixel ``k``. The mosaic samples every tile at the mosaic's integer pixels:
output pixel ``X`` (scene coordinate ``origin + X``) reads tile ``t`` at the
continuous coordinate ``u = origin + X - p``, by separable interpolation:

- ``"linear"`` (default): N-linear, 2 taps per axis;
- ``"cubic"``: Keys cubic convolution (a = -0.5), 4 taps per axis, sharper;
- ``"nearest"``: the tile is placed at ``round(p)``, values copied exactly.

A tile covers the output pixels whose taps (those with a non-zero weight) all
fall inside it: every pixel for an integer position (any interpolation, values
copied exactly), one less at each end per fractional axis for linear, two for
cubic. Pixels no tile covers get ``fill``.

Blends: ``"linear"`` weighs each tile by ``prod_a min(u_a + 1, S_a - u_a)``,
the distance to its nearest edge along every axis, so overlaps cross-fade
linearly and no seam remains; ``"mean"``: equal weights; ``"max"``; and
``"overwrite"``: the highest tile index covering a pixel wins.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from napari_gridmip.core import validate
from napari_gridmip.core.interpolation import TAPS, keys_weights
from napari_gridmip.core.options import FUSE_BLENDS, FUSE_INTERPOLATIONS
from napari_gridmip.core.patches.grid import merge_dtypes
from napari_gridmip.core.runtime.precision import precision_scope

__all__ = ["fuse_tiles"]

ProgressCallback = Callable[[int, int], None]
TILES_PER_CALL = 16  # in-memory fusion: tiles per compiled call (progress and cancel points between calls)
FUSE_CHUNK = 1024  # dask fusion: output chunk along each spatial axis


class Mosaic(NamedTuple):
    """What :func:`fuse_tiles` returns."""

    image: Any
    """``([C,] *shape)``: the mosaic (a JAX array, or a lazy dask array for dask tiles)."""
    origin: np.ndarray
    """``(d,)`` int64: the scene coordinate of ``image``'s pixel 0 (in the positions' frame)."""


def _taps(interpolation: str) -> np.ndarray:
    return {"nearest": np.array([0]), "linear": np.array([0, 1]), "cubic": np.array(TAPS)}[interpolation]


def _tap_weights(phi: jax.Array, interpolation: str) -> jax.Array:
    """Weights of the taps at ``floor(u) + taps`` for the fractional part ``phi`` of ``u``."""
    if interpolation == "nearest":
        return jnp.ones((1,), phi.dtype)
    if interpolation == "linear":
        return jnp.stack([1 - phi, phi])
    return keys_weights(phi, jnp)[0]


def _fuse_tiles_into(canvas, weights, tiles, base, frac, valid, *, blend, interpolation, shape):
    """Add ``tiles`` (k, C, *S) at origins ``base + frac`` (k, d) relative to the window's pixel 0, to its canvas.

    ``base`` is the integer part (int32), ``frac`` in ``[0, 1)`` the rest, computed
    from the absolute positions: every window then resamples a tile with the
    very same weights.

    ``canvas`` is ``(C, *W)``: weighted sums (``"linear"``, ``"mean"``), the
    running max or the last value; ``weights`` is ``(*W,)``: summed weights,
    or the coverage for ``"max"`` and ``"overwrite"``. Each tile touches only
    a block of ``min(S + 3, W)`` pixels per axis around its footprint.
    """
    d = len(shape)
    window = canvas.shape[1:]
    block = tuple(min(s + 3, w) for s, w in zip(shape, window))
    taps = _taps(interpolation)
    dtype = canvas.dtype

    def add(t, carry):
        canvas, weights = carry
        tile, origin, phase, ok = tiles[t].astype(dtype), base[t], frac[t], valid[t]
        start = jnp.clip(origin - 1, 0, jnp.asarray(window, jnp.int32) - jnp.asarray(block, jnp.int32))
        values, inside, ramp = tile, jnp.asarray(ok), jnp.ones((), dtype)
        for axis in range(d):
            whole = start[axis] + jnp.arange(block[axis], dtype=jnp.int32) - origin[axis]  # tile pixel, less frac
            u = whole.astype(dtype) - phase[axis]  # (B,) tile coordinates of the block's pixels
            shifted = phase[axis] > 0
            # u = floor(u) + phi: the same phi = 1 - frac (or 0) for every pixel of the axis
            floor_u = whole - shifted.astype(jnp.int32)
            w = _tap_weights(jnp.where(shifted, 1 - phase[axis], 0), interpolation)
            index = floor_u[:, None] + jnp.asarray(taps, jnp.int32)[None, :]  # (B, taps)
            used = w != 0  # (taps,): a tap of weight 0 needs no pixel (integer positions copy exactly)
            inside_axis = jnp.all(~used | ((index >= 0) & (index < shape[axis])), axis=1)
            gathered = jnp.take(values, jnp.clip(index, 0, shape[axis] - 1), axis=1 + axis)  # (..., B, taps, ...)
            gathered = jnp.moveaxis(gathered, 2 + axis, -1)  # taps last; B stays at 1 + axis
            values = jnp.where(used, gathered * w.astype(dtype), 0).sum(-1)
            shape_1d = [1] * d
            shape_1d[axis] = block[axis]
            inside = inside & inside_axis.reshape(shape_1d)
            if blend == "linear":
                edge = jnp.minimum(u + 1, shape[axis] - u).astype(dtype)
                ramp = ramp * jnp.maximum(edge, 0).reshape(shape_1d)
        starts = (jnp.int32(0), *(start[a] for a in range(d)))
        old = lax.dynamic_slice(canvas, starts, (canvas.shape[0], *block))
        old_w = lax.dynamic_slice(weights, starts[1:], block)
        if blend in ("linear", "mean"):
            w = jnp.where(inside, ramp if blend == "linear" else jnp.ones((), dtype), 0)
            new = old + jnp.where(inside, values * w, 0)
            new_w = old_w + w
        elif blend == "max":
            new = jnp.where(inside, jnp.maximum(old, values), old)
            new_w = jnp.maximum(old_w, inside.astype(dtype))
        else:
            new = jnp.where(inside, values, old)
            new_w = jnp.maximum(old_w, inside.astype(dtype))
        return lax.dynamic_update_slice(canvas, new, starts), lax.dynamic_update_slice(weights, new_w, starts[1:])

    return lax.fori_loop(0, tiles.shape[0], add, (canvas, weights))


@partial(jax.jit, static_argnames=("blend", "interpolation", "shape"), donate_argnums=(0, 1))
def _fuse_step(canvas, weights, tiles, base, frac, valid, *, blend, interpolation, shape):
    options = {"blend": blend, "interpolation": interpolation, "shape": shape}
    return _fuse_tiles_into(canvas, weights, tiles, base, frac, valid, **options)


@partial(jax.jit, static_argnames=("blend", "result", "squeeze"))
def _finish(canvas, weights, fill, *, blend, result, squeeze=False):
    if blend in ("linear", "mean"):
        out = canvas / jnp.where(weights > 0, weights, 1)
    else:
        out = canvas
    out = jnp.where(weights > 0, out, fill.astype(out.dtype)).astype(result)
    return out[0] if squeeze else out


def _empty(blend: str, channels: int, window: tuple[int, ...], dtype: np.dtype) -> tuple[jax.Array, jax.Array]:
    # made on the host and handed over: eager jnp.full/jnp.zeros compile a program each on a first call
    start = -np.inf if blend == "max" else 0
    return jax.device_put((np.full((channels, *window), start, dtype), np.zeros(window, dtype)))


def fuse_window(
    tiles: Any,
    positions: np.ndarray,
    window_origin: np.ndarray,
    window: tuple[int, ...],
    *,
    blend: str,
    interpolation: str,
    compute: np.dtype,
    result: np.dtype,
    fill: float,
    valid: np.ndarray | None = None,
    progress: ProgressCallback | None = None,
    squeeze: bool = False,
) -> jax.Array:
    """The mosaic's window ``[window_origin, window_origin + window)`` from ``tiles`` ``(k, C, *S)`` (validated);
    ``(C, *window)``, or ``window`` with ``squeeze`` (one channel).

    Tiles go through the compiled loop ``TILES_PER_CALL`` at a time (the last
    call padded with invalid tiles), so one program serves any tile count.
    """
    k, channels = tiles.shape[:2]
    shape = tuple(int(s) for s in tiles.shape[2:])
    valid = np.ones(k, bool) if valid is None else valid
    if not isinstance(tiles, jax.Array):
        tiles = np.asarray(tiles)  # read once (a Zarr array would be read again by every call)
    # integer part relative to the window, and the fraction from the absolute position (the same in every window)
    positions = np.asarray(positions, np.float64)
    if interpolation == "nearest":
        positions = np.round(positions)
    whole = np.floor(positions)
    base = (whole - np.asarray(window_origin)).astype(np.int32)
    frac = (positions - whole).astype(compute)
    with precision_scope(compute):
        canvas, weights = _empty(blend, channels, window, compute)
        per_call = min(TILES_PER_CALL, 1 << max(0, math.ceil(math.log2(max(k, 1)))))
        calls = max(1, math.ceil(k / per_call))
        for call in range(calls):
            if progress is not None:
                progress(call, calls)
            index = np.arange(call * per_call, (call + 1) * per_call)
            ok = (index < k) & valid[np.minimum(index, k - 1)]
            index = np.minimum(index, k - 1)
            canvas, weights = _fuse_step(
                canvas,
                weights,
                *jax.device_put((tiles[index], base[index], frac[index], ok)),
                blend=blend,
                interpolation=interpolation,
                shape=shape,
            )
        if progress is not None:
            progress(calls, calls)
        return _finish(
            canvas, weights, np.asarray(fill, compute), blend=blend, result=np.dtype(result).name, squeeze=squeeze
        )


def mosaic_frame(positions: np.ndarray, shape: tuple[int, ...], interpolation: str) -> tuple[np.ndarray, np.ndarray]:
    """The smallest integer frame ``(origin, extent)`` that holds every tile's footprint."""
    if interpolation == "nearest":
        positions = np.round(positions)
    lo = np.floor(positions.min(axis=0)).astype(np.int64)
    hi = np.ceil((positions + np.asarray(shape)).max(axis=0)).astype(np.int64)
    return lo, hi - lo


FLAT_FIELD_SAMPLE = 64  # tiles read (evenly spaced) to estimate the flat field
FLAT_FIELD_SMOOTH = 8  # its Gaussian's sigma: the tile's smaller side over this


def estimate_flat_field(tiles: Any, *, has_channels: bool, d: int) -> np.ndarray:
    """The illumination profile shared by all tiles, estimated from the tiles themselves: ``([C,] *shape)`` float32.

    BaSiC's idea (Peng et al. 2017) in its simplest form: the specimen
    differs from tile to tile but the optics' fall-off (vignetting, uneven
    light) does not, so the per-pixel median over many tiles follows the
    profile; a wide Gaussian (sigma: the tile's smaller side over
    ``FLAT_FIELD_SMOOTH``) removes what is left of the specimen; the profile
    is scaled to mean 1 so that dividing by it keeps the intensities' level.
    Each channel gets its own. Up to ``FLAT_FIELD_SAMPLE`` tiles are read,
    evenly spaced (a lazy stack reads only those).

    References
    ----------
    Peng, T. et al. "A BaSiC tool for background and shading correction of
    optical microscopy images", Nat. Commun. 8, 14836 (2017).
    """
    from scipy import ndimage

    n = int(tiles.shape[0])
    picks = np.unique(np.linspace(0, n - 1, min(n, FLAT_FIELD_SAMPLE)).round().astype(int))
    sample = np.stack([np.asarray(tiles[int(t)], np.float32) for t in picks])
    if not has_channels:
        sample = sample[:, None]
    median = np.median(sample, axis=0)  # (C, *shape)
    sigma = max(min(median.shape[1:]) / FLAT_FIELD_SMOOTH, 1.0)
    smooth = np.stack([ndimage.gaussian_filter(m, sigma, mode="nearest") for m in median])
    smooth = np.maximum(smooth, 1e-6 * max(float(np.abs(smooth).max()), 1e-30))
    flat = (smooth / smooth.reshape(len(smooth), -1).mean(axis=1).reshape((-1,) + (1,) * d)).astype(np.float32)
    return flat if has_channels else flat[0]


def fuse_tiles(
    tiles: Any,
    positions: Any,
    *,
    blend: str = "linear",
    interpolation: str = "linear",
    fill: float = 0.0,
    flat_field: Any = False,
    chunk: int = FUSE_CHUNK,
    progress: ProgressCallback | None = None,
) -> Mosaic:
    """Fuse tiles at given origins into one mosaic.

    Parameters
    ----------
    tiles
        ``(n, [C,] *shape)``, 2 or 3 spatial axes, an optional channel axis;
        NumPy, JAX, dask or Zarr; any real dtype. A dask stack gives a lazy
        mosaic, made output chunk by output chunk from the tiles that touch
        each chunk, equal to the in-memory mosaic.
    positions
        ``(n, d)`` origins in pixels (real numbers), e.g.
        ``register_tiles(...).positions``.
    blend
        ``"linear"`` (default): weights falling off linearly towards each
        tile's edges, no seams; ``"mean"``; ``"max"``; ``"overwrite"`` (later
        tiles win). See the module docstring.
    interpolation
        How a tile at a fractional position is resampled: ``"linear"``
        (default), ``"cubic"`` (Keys) or ``"nearest"`` (rounded positions,
        exact values). Integer positions copy values exactly with any of them.
    fill
        The value of pixels no tile covers (NaN allowed; an integer result
        casts it).
    flat_field
        Correct uneven illumination (vignetting) before fusing, so that the
        seams it makes vanish: ``True`` estimates the profile from the tiles
        themselves (the per-pixel median over the tiles, smoothed, mean 1;
        see :func:`estimate_flat_field`); an array ``([C,] *shape)`` gives it;
        ``False`` (default) fuses the tiles as they are. Each tile is divided
        by the profile (the result is then floating point, as the weighted
        blends').
    chunk
        Dask tiles: the output chunk along each spatial axis (channels whole).
    progress
        Optional ``progress(done, total)``, called between groups of tiles
        (in memory); it may raise to stop.

    Returns
    -------
    Mosaic
        ``image`` ``([C,] *extent)`` and ``origin`` ``(d,)`` int64, with
        ``image[..., k]`` at scene coordinate ``origin + k``: the smallest
        integer frame holding every tile. dtype: ``"linear"`` and ``"mean"``
        follow :func:`merge_patches` (float32, float64 for 32/64-bit
        integers and float64, float16/bfloat16 kept); ``"max"`` and
        ``"overwrite"`` keep the tiles' dtype when values are copied exactly
        (integer positions or ``"nearest"``), else as the weighted blends.

    Raises
    ------
    ValueError
        If the shapes disagree (``(n, [C,] *shape)`` against ``(n, d)``, d = 2
        or 3), a position is not finite, or an option is not one of its
        choices.
    TypeError
        If an argument has the wrong type.
    """
    from napari_gridmip.core.patches.stitch import _check_tiles

    blend = validate.check_choice("blend", blend, FUSE_BLENDS)
    interpolation = validate.check_choice("interpolation", interpolation, FUSE_INTERPOLATIONS)
    fill = fill if isinstance(fill, float) and np.isnan(fill) else validate.check_finite_scalar("fill", fill)
    chunk = validate.int_tuple("chunk", [chunk])[0]
    tiles = validate.as_array("tiles", tiles)
    stage, n, shape, has_channels = _check_tiles(tiles, positions)
    tiles = _flat_fielded(tiles, flat_field, has_channels, shape)
    dtype = validate.dtype_of(tiles)
    compute, weighted_result = merge_dtypes(dtype, "mean")
    exact = interpolation == "nearest" or bool(np.all(stage == np.round(stage)))
    result = dtype if blend in ("max", "overwrite") and exact else weighted_result
    origin, extent = mosaic_frame(stage, shape, interpolation)
    if validate.is_dask(tiles):
        from napari_gridmip.core.patches import _chunked

        image = _chunked.fuse_tiles(
            tiles, stage, origin, tuple(int(e) for e in extent), has_channels=has_channels, blend=blend,
            interpolation=interpolation, compute=compute, result=result, fill=fill, chunk=chunk,
            kernel=fuse_window,
        )  # fmt: skip
        return Mosaic(image, origin)
    stack = tiles if has_channels else tiles[:, None]
    out = fuse_window(
        stack,
        stage,
        origin,
        tuple(int(e) for e in extent),
        blend=blend,
        interpolation=interpolation,
        compute=compute,
        result=result,
        fill=fill,
        progress=progress,
        squeeze=not has_channels,
    )
    return Mosaic(out, origin)


def _flat_fielded(tiles: Any, flat_field: Any, has_channels: bool, shape: tuple[int, ...]) -> Any:
    """The tiles divided by the flat field (lazily for dask), or the tiles themselves for ``False``."""
    if isinstance(flat_field, (bool, np.bool_)):
        if not flat_field:
            return tiles
        flat = estimate_flat_field(tiles, has_channels=has_channels, d=len(shape))
    else:
        flat = np.asarray(validate.as_array("flat_field", flat_field), np.float32)
        expected = ((int(tiles.shape[1]),) if has_channels else ()) + shape
        if flat.shape not in (expected, shape):
            raise ValueError(f"flat_field must have shape {expected} (or {shape}); got {flat.shape}")
        if not np.all(np.isfinite(flat)) or np.any(flat <= 0):
            raise ValueError("flat_field must be finite and positive")
    if has_channels and flat.ndim == len(shape):
        flat = np.broadcast_to(flat, (int(tiles.shape[1]), *shape))
    if validate.is_dask(tiles):
        return tiles.astype(np.float32) / flat
    return np.asarray(tiles, np.float32) / flat
