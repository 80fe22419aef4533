"""Occupancy mipmaps of 3D volumes.

Level 0 is ``volume > threshold``; level ``k + 1`` is ``any()`` over each
2x2x2 block of level ``k``. Each axis of length ``n`` becomes ``ceil(n / 2)``,
a block that reaches past the edge counts only its in-bounds voxels, and the
pyramid ends at shape ``(1, 1, 1)``. Level counts use integer arithmetic, never
a floating-point ``log2``.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from napari_gridmip.core import _validate
from napari_gridmip.core._precision import precision_scope
from napari_gridmip.core._transfer import aligned_empty, owned_to_device

__all__ = ["mipmap_shapes", "occupancy_mipmap"]


def mipmap_shapes(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Shapes of every level for a volume of ``shape``, level 0 first.

    >>> mipmap_shapes((5, 2, 1))
    [(5, 2, 1), (3, 1, 1), (2, 1, 1), (1, 1, 1)]
    """
    shapes = [tuple(int(n) for n in shape)]
    while any(n > 1 for n in shapes[-1]):
        shapes.append(tuple((n + 1) // 2 for n in shapes[-1]))
    return shapes


def halve_occupancy(level: jax.Array) -> jax.Array:
    """``any()`` over the 2x2x2 blocks of a bool ``(D, H, W)`` array.

    Returns a bool array of shape ``(ceil(D/2), ceil(H/2), ceil(W/2))``.
    """
    pad = [(0, n % 2) for n in level.shape]
    if any(p for _, p in pad):
        level = jnp.pad(level, pad)  # False padding: XLA fuses it into the ORs below
    d, h, w = level.shape
    # OR the depth and row pairs first (plain slices, which XLA's CPU backend
    # vectorises), then reduce the column pairs of a quarter of the data. A
    # reshape-and-any over all three pair axes, or an 8-way OR of strided slices,
    # is 7-13x slower there. The column step must stay a reduce: written as two
    # slices, XLA fuses it into the next level and reads level 0 twice (6x slower).
    x = level.reshape(d // 2, 2, h // 2, 2, w)
    x = (x[:, 0, :, 0] | x[:, 0, :, 1]) | (x[:, 1, :, 0] | x[:, 1, :, 1])
    return x.reshape(d // 2, h // 2, w // 2, 2).any(axis=-1)


def occupancy_levels(occupied: jax.Array) -> list[jax.Array]:
    """All levels of the pyramid of a bool ``(D, H, W)`` occupancy, level 0 first.

    Pure and traceable: jit it as a whole to get one program for all levels.
    """
    levels = [occupied]
    while any(n > 1 for n in levels[-1].shape):
        levels.append(halve_occupancy(levels[-1]))
    return levels


def _compare(volume: jax.Array, threshold: jax.Array) -> jax.Array:
    """``volume > threshold`` with ``threshold`` already in the comparison dtype (see :func:`_threshold_for`)."""
    return volume.astype(threshold.dtype) > threshold  # NaN > t is False: NaN counts as empty


def _compare_dtype(dtype: np.dtype) -> np.dtype:
    """Floats compare in float32 (float16, bfloat16, float32: exact widening) or float64; integers in their own."""
    if _validate.is_float(dtype):
        return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)
    return dtype


def _threshold_for(dtype: np.dtype, threshold: float) -> np.generic:
    """The threshold as a scalar of the comparison dtype, rounded so that the comparison stays exact.

    For a value ``v`` of that dtype, ``v > t`` holds exactly when ``v > t_c``, ``t_c``
    the largest value of the dtype at or below ``t``: no value lies between
    ``t_c`` and the next one up. Integers take ``floor(t)`` (within the dtype's
    range: :func:`_constant_occupancy` settles thresholds outside it). Both the
    NumPy and the JAX paths compare against this one scalar, so they agree bit for bit.
    """
    compare = _compare_dtype(dtype)
    if np.issubdtype(compare, np.integer) or compare == np.bool_:
        return compare.type(math.floor(threshold))
    with np.errstate(over="ignore"):  # a threshold beyond the dtype's range becomes +-inf, then its max
        rounded = compare.type(threshold)
    if float(rounded) > threshold:
        rounded = np.nextafter(rounded, compare.type(-np.inf))
    return rounded


@jax.jit
def _levels_from_occupied(occupied: jax.Array) -> list[jax.Array]:
    return occupancy_levels(occupied)[1:]


@jax.jit
def _levels_from_values(volume: jax.Array, threshold: jax.Array) -> list[jax.Array]:
    return occupancy_levels(_compare(volume, threshold))


def _constant_occupancy(dtype: np.dtype, threshold: float) -> bool | None:
    """For bool and integer volumes, ``True``/``False`` when the threshold decides
    every voxel (below the dtype's range / at or above its maximum), else ``None``."""
    if dtype == np.bool_:
        lo, hi = 0, 1
    elif np.issubdtype(dtype, np.integer):
        lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    else:
        return None
    if threshold < lo:
        return True
    if threshold >= hi:
        return False
    return None


def threshold_block(block: np.ndarray, threshold: float) -> np.ndarray:
    """Level 0 of a NumPy block, in NumPy alone (no JAX): for lazy level-0 views that napari reads itself."""
    constant = _constant_occupancy(block.dtype, threshold)
    if constant is not None:
        return np.full(block.shape, constant)
    return _host_occupancy(block, threshold)


def _host_occupancy(volume: np.ndarray, threshold: float) -> np.ndarray:
    """Level 0 of a NumPy volume, written once into an aligned buffer we own."""
    out = aligned_empty(volume.shape, np.bool_)
    if volume.dtype == np.bool_:
        np.copyto(out, volume)  # 0 <= threshold < 1 here: the volume is its own occupancy
        return out
    scalar = _threshold_for(volume.dtype, threshold)
    if volume.dtype != scalar.dtype:  # float16 and bfloat16 widen to float32, as on the JAX path
        volume = volume.astype(scalar.dtype)
    np.greater(volume, scalar, out=out)  # NaN > t is False: NaN counts as empty
    return out


def occupancy_mipmap(volume: Any, *, threshold: float = 0.0) -> list[Any]:
    """Occupancy pyramid of a 3D volume, or of each 3D volume of a stack.

    Parameters
    ----------
    volume
        Array of shape ``(..., D, H, W)``: the last three axes are reduced, any
        leading axes (time, channels) are carried, one pyramid per leading
        index. Any sizes >= 1 (non-cubic, odd, not powers of two); dtype bool,
        any integer or any real float (float16 and bfloat16 included). A
        NumPy array, a JAX array, or a dask array (then computed block by
        block, lazily: see Returns).
    threshold
        A voxel is occupied when ``volume > threshold``, compared exactly
        (the threshold is never rounded into a different answer, whatever the
        dtype). NaN is never occupied.

    Returns
    -------
    list of jax.Array, or of dask.array.Array for a dask input
        Bool arrays, level 0 first, with shapes ``(..., *s)`` for ``s`` in
        ``mipmap_shapes(volume.shape[-3:])``: each axis halves rounding up,
        down to ``(1, 1, 1)``. Level ``k``'s voxel ``(z, y, x)`` covers the
        level-0 block ``[z*2**k, (z+1)*2**k)`` (and so on per axis), clipped
        to the volume. A dask input gives dask levels and computes nothing
        yet; each task reads one ``2**b``-aligned block of the volume (``b``
        up to 7) and makes that block's levels, and the few coarsest levels
        are reduced from level ``b``. They equal the in-memory levels exactly.

    Raises
    ------
    ValueError
        If ``volume`` has fewer than 3 axes or a zero-length axis, or a
        complex or non-numeric dtype, or if ``threshold`` is not finite.
    TypeError
        If ``threshold`` is not a real number (text such as ``"0.5"``, a bool, None).

    Notes
    -----
    All levels come from one compiled program per 3D shape and dtype. A
    NumPy volume is thresholded on the host straight into a buffer that JAX's
    CPU backend aliases, so the volume crosses to the device once, as bools.
    """
    volume = _validate.as_array("volume", volume)
    dtype = _validate.check_real("volume", volume)
    shape = _validate.check_ndim("volume", volume, min_ndim=3)
    _validate.check_nonempty("volume", shape)
    threshold = _validate.check_finite_scalar("threshold", threshold)
    if _validate.is_dask(volume):
        from napari_gridmip.core.occupancy import _chunked

        return _chunked.occupancy_mipmap(volume, threshold)
    if len(shape) == 3:
        return _volume_levels(volume, dtype, threshold)
    # one pyramid per leading index: the same compiled program for each
    lead = shape[:-3]
    stacked = volume.reshape((-1, *shape[-3:]))
    pyramids = [_volume_levels(stacked[i], dtype, threshold) for i in range(stacked.shape[0])]
    return [jnp.stack(levels).reshape(lead + levels[0].shape) for levels in zip(*pyramids)]


def _volume_levels(volume: Any, dtype: np.dtype, threshold: float) -> list[jax.Array]:
    """The pyramid of one 3D volume (validated)."""
    shape = tuple(volume.shape)
    constant = _constant_occupancy(dtype, threshold)
    if constant is not None:
        occupied = jnp.full(shape, constant, dtype=bool)
        return [occupied, *_levels_from_occupied(occupied)]
    if isinstance(volume, jax.Array):
        if dtype == np.bool_:  # 0 <= threshold < 1: the volume is its own level 0
            return [volume, *_levels_from_occupied(volume)]
        scalar = _threshold_for(dtype, threshold)
        with precision_scope(scalar.dtype):  # a 64-bit volume (made under x64) compares in 64 bits
            return list(_levels_from_values(volume, jnp.asarray(scalar)))
    occupied = owned_to_device(_host_occupancy(np.asarray(volume), threshold))
    return [occupied, *_levels_from_occupied(occupied)]
