"""Occupancy and max mipmaps of 3D volumes.

Level 0 is ``volume > threshold``; level ``k + 1`` is ``any()`` over each 2x2x2 block of level ``k``, each axis
``n`` becoming ``ceil(n / 2)`` down to ``(1, 1, 1)``. The max pyramid is the same reduction with a NaN-ignoring
maximum: thresholding it (:func:`threshold_mipmap`) gives the occupancy pyramid of any threshold without rebuilding.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from napari_gridmip.core import validate
from napari_gridmip.core.occupancy import _chunked
from napari_gridmip.core.occupancy._shapes import mipmap_shapes
from napari_gridmip.core.runtime import rates as _rates
from napari_gridmip.core.runtime import strategy
from napari_gridmip.core.runtime.precision import precision_scope
from napari_gridmip.core.runtime.sharding import spread_blocks
from napari_gridmip.core.runtime.transfer import aligned_empty, owned_to_device, to_device

__all__ = ["max_mipmap", "mipmap_shapes", "occupancy_mipmap", "threshold_mipmap"]

BLOCK_LEVELS = _chunked.BLOCK_LEVELS
"""The levels a dask volume's pyramid makes block by block (blocks of ``2**BLOCK_LEVELS`` voxels a side); the
Zarr writer (:func:`napari_gridmip.write_mipmap`) stores its blocks' levels with the same blocks."""


class Reduction(NamedTuple):
    """How 2x2x2 blocks combine: ``pair`` joins two arrays elementwise, ``last`` reduces a trailing
    axis of length 2, and ``pad`` is the identity that fills a block reaching past the edge."""

    pair: Callable[[jax.Array, jax.Array], jax.Array]
    last: Callable[[jax.Array], jax.Array]
    pad: Any


ANY = Reduction(operator.or_, lambda x: x.any(axis=-1), False)


def _pair_last(pair: Callable) -> Callable:
    """Reduce a trailing axis of length 2 with ``pair`` as two slices (XLA's CPU backend prefers this to a
    reduce for 1-byte integers, by up to 10x; for wider integers the reduce is faster)."""
    return lambda x: pair(x[..., 0], x[..., 1])


def max_reduction(dtype: np.dtype) -> Reduction:
    """The maximum of each block of an integer (or bool) array: ``maximum``, padded with the dtype's minimum.

    Float volumes are maximised through their order keys (:func:`float_key`), so that
    NaN (the lowest key) is ignored unless a block holds only NaN, and subnormals stay exact.
    """
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return ANY
    last = _pair_last(jnp.maximum) if dtype.itemsize == 1 else (lambda x: x.max(axis=-1))
    return Reduction(jnp.maximum, last, np.iinfo(dtype).min)


def halve(level: jax.Array, reduction: Reduction = ANY) -> jax.Array:
    """Reduce the 2x2x2 blocks of a ``(D, H, W)`` array with ``reduction``.

    Returns an array of the same dtype and shape ``(ceil(D/2), ceil(H/2), ceil(W/2))``;
    a block that reaches past the edge counts only its in-bounds cells.
    """
    pad = [(0, n % 2) for n in level.shape]
    if any(p for _, p in pad):
        # the identity as padding (False, NaN or the integer minimum): XLA fuses it into the reduction below
        level = jnp.pad(level, pad, constant_values=jnp.array(reduction.pad, level.dtype))
    d, h, w = level.shape
    # Combine the depth and row pairs first (plain slices, which XLA's CPU backend
    # vectorises), then reduce the column pairs of a quarter of the data. A
    # reshape-and-any over all three pair axes, or an 8-way OR of strided slices,
    # is 7-13x slower there. The column step must stay a reduce: written as two
    # slices, XLA fuses it into the next level and reads level 0 twice (6x slower).
    x = level.reshape(d // 2, 2, h // 2, 2, w)
    pair = reduction.pair
    x = pair(pair(x[:, 0, :, 0], x[:, 0, :, 1]), pair(x[:, 1, :, 0], x[:, 1, :, 1]))
    return reduction.last(x.reshape(d // 2, h // 2, w // 2, 2))


def halve_occupancy(level: jax.Array) -> jax.Array:
    """``any()`` over the 2x2x2 blocks of a bool ``(D, H, W)`` array.

    Returns a bool array of shape ``(ceil(D/2), ceil(H/2), ceil(W/2))``.
    """
    return halve(level, ANY)


def pyramid_levels(level0: jax.Array, reduction: Reduction = ANY) -> list[jax.Array]:
    """All levels from ``level0`` down to ``(1, 1, 1)``, each the ``reduction`` of the one before.

    Pure and traceable: jit it as a whole to get one program for all levels.
    """
    levels = [level0]
    while any(n > 1 for n in levels[-1].shape):
        levels.append(halve(levels[-1], reduction))
    return levels


def occupancy_levels(occupied: jax.Array) -> list[jax.Array]:
    """All levels of the pyramid of a bool ``(D, H, W)`` occupancy, level 0 first.

    Pure and traceable: jit it as a whole to get one program for all levels.
    """
    return pyramid_levels(occupied, ANY)


# Floats are compared and maximised through their order keys: integers in the float's own width
# whose order is the floats' order (both zeros one key, NaN the lowest key, below -inf). XLA's
# CPU and GPU backends flush subnormal floats to zero in comparisons and maxima (1e-40 > 0 is
# False there); integer arithmetic is exact on every backend.


def _key_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype({2: np.int16, 4: np.int32, 8: np.int64}[np.dtype(dtype).itemsize])


def _key_constants(dtype: np.dtype) -> tuple[int, int, int]:
    """(magnitude mask, magnitude bits of +inf, the NaN key) for a float dtype."""
    dtype = np.dtype(dtype)
    bits = 8 * dtype.itemsize
    inf = int(np.array(np.inf, dtype).view(_key_dtype(dtype)))
    return (1 << (bits - 1)) - 1, inf, -(1 << (bits - 1))


def float_key(x: jax.Array) -> jax.Array:
    """Order keys of a float array: ``key(a) > key(b)`` exactly when ``a > b``; NaN gets the lowest key."""
    mask, inf, nan_key = _key_constants(x.dtype)
    key = _key_dtype(x.dtype)
    bits = lax.bitcast_convert_type(x, key)
    magnitude = bits & jnp.array(mask, key)
    signed = jnp.where(bits < 0, -magnitude, magnitude)
    return jnp.where(magnitude > jnp.array(inf, key), jnp.array(nan_key, key), signed)


def from_float_key(key: jax.Array, dtype: np.dtype) -> jax.Array:
    """The floats of order keys (the NaN key gives NaN, key 0 gives +0.0)."""
    mask, _, nan_key = _key_constants(dtype)
    kind = key.dtype
    nan_bits = int(np.array(np.nan, dtype).view(_key_dtype(dtype)))
    bits = jnp.where(key < 0, (-key) | jnp.array(nan_key, kind), key)  # nan_key is the sign bit alone
    bits = jnp.where(key == jnp.array(nan_key, kind), jnp.array(nan_bits, kind), bits)
    return lax.bitcast_convert_type(bits, dtype)


def _host_float_key(value: np.ndarray) -> int:
    """:func:`float_key` of one NumPy float (any float dtype, bfloat16 included)."""
    mask, inf, nan_key = _key_constants(value.dtype)
    bits = int(value.view(_key_dtype(value.dtype)))
    magnitude = bits & mask
    if magnitude > inf:
        return nan_key
    return -magnitude if bits < 0 else magnitude


def _threshold_key(dtype: np.dtype, threshold: float) -> np.generic:
    """The key of the largest ``dtype`` value at or below ``threshold``: ``v > threshold`` exactly when
    ``float_key(v) >`` this key (no value of the dtype lies between that value and the next one up)."""
    with np.errstate(over="ignore"):  # beyond the range: +-inf, then the largest finite value below
        rounded = np.asarray(threshold).astype(dtype)
    key = _host_float_key(rounded)
    if float(rounded) > threshold:
        key -= 1  # keys are consecutive integers: one down is the next value down (across zero too)
    return _key_dtype(dtype).type(key)


def _device_threshold(dtype: np.dtype, threshold: float) -> np.generic:
    """What :func:`_compare` compares a JAX volume of ``dtype`` against: a float key, or ``floor(t)``."""
    if validate.is_float(dtype):
        return _threshold_key(dtype, threshold)
    return _threshold_for(dtype, threshold)


def _compare(volume: jax.Array, threshold: jax.Array) -> jax.Array:
    """``volume > threshold`` exactly, ``threshold`` from :func:`_device_threshold`; NaN counts as empty."""
    if validate.is_float(np.dtype(volume.dtype)):
        return float_key(volume) > threshold
    return volume.astype(threshold.dtype) > threshold


def _compare_dtype(dtype: np.dtype) -> np.dtype:
    """Floats compare in float32 (float16, bfloat16, float32: exact widening) or float64; integers in their own."""
    if validate.is_float(dtype):
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


@_rates.probe("any")
def _any_probe() -> tuple[Callable, Callable[[float], np.ndarray]]:
    """The occupancy pyramid's work for the placement's rates (:mod:`.runtime.rates`): a 2x2x2 ``any`` of 16 MiB
    of bools."""
    return (lambda x: halve(x, ANY)), (lambda scale: np.ones(_rates.cube_shape(scale, 16 * 2**20), bool))


@_rates.probe("max")
def _max_probe() -> tuple[Callable, Callable[[float], np.ndarray]]:
    """The max pyramid's work for the placement's rates: a 2x2x2 maximum of 32 MiB of float32 by order keys."""

    def program(x: jax.Array) -> jax.Array:
        return halve(float_key(x), max_reduction(np.dtype(np.int32)))

    return program, lambda scale: np.ones(_rates.cube_shape(scale, 8 * 2**20), np.float32)


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
    volume = validate.as_array("volume", volume)
    dtype = validate.check_real("volume", volume)
    shape = validate.check_ndim("volume", volume, min_ndim=3)
    validate.check_nonempty("volume", shape)
    threshold = validate.check_finite_scalar("threshold", threshold)
    # where this machine's rates say the call finishes first (core.runtime.rates): a link can be slower than the host's
    # pass
    with strategy.memory_bound_place(volume, kernel="occupancy_mipmap"):
        return _occupancy_mipmap(volume, shape, dtype, threshold)


def _occupancy_mipmap(volume: Any, shape: tuple[int, ...], dtype: np.dtype, threshold: float) -> list[Any]:
    if validate.is_dask(volume):  # block by block, each block by the validated kernel
        # the blocks run in dask's threads, later: where memory_bound_place put this call
        # (core.runtime.strategy.keep_place)
        # and on every local device, block by block in turn (core.runtime.sharding.spread_blocks)
        kernel = spread_blocks(strategy.keep_place(functools.partial(_occupancy_kernel, threshold=threshold)))
        # a bool level with threshold 0.5 is its own level 0: the coarsest levels come from level b that way
        coarse = spread_blocks(strategy.keep_place(functools.partial(_occupancy_kernel, threshold=0.5)))
        return _chunked.pyramid(volume, kernel, coarse, np.dtype(bool))
    if len(shape) == 3:
        return _volume_levels(volume, dtype, threshold)
    # one pyramid per leading index: the same compiled program for each
    lead = shape[:-3]
    stacked = volume.reshape((-1, *shape[-3:]))
    pyramids = [_volume_levels(stacked[i], dtype, threshold) for i in range(stacked.shape[0])]
    return [jnp.stack(levels).reshape(lead + levels[0].shape) for levels in zip(*pyramids)]


def _occupancy_kernel(block: np.ndarray, *, threshold: float) -> list[jax.Array]:
    """:func:`occupancy_mipmap` of one 3D NumPy block of a validated volume (the dask twin's kernel)."""
    return _volume_levels(block, validate.dtype_of(block), threshold)


def _max_kernel(block: np.ndarray) -> list[jax.Array]:
    """:func:`max_mipmap` of one 3D NumPy block of a validated volume (the dask twin's kernel)."""

    with precision_scope(validate.dtype_of(block)):
        level0 = to_device(block)
        return [level0, *_max_levels(level0)]


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
        scalar = _device_threshold(dtype, threshold)
        with precision_scope(scalar.dtype):  # a 64-bit volume (made under x64) compares in 64 bits
            return list(_levels_from_values(volume, jnp.asarray(scalar)))
    occupied = owned_to_device(_host_occupancy(np.asarray(volume), threshold))
    return [occupied, *_levels_from_occupied(occupied)]


def max_levels(volume: jax.Array) -> list[jax.Array]:
    """All levels of the max pyramid of a ``(D, H, W)`` array, level 0 (the volume) first. Pure and traceable."""
    dtype = np.dtype(volume.dtype)
    if not validate.is_float(dtype):
        return pyramid_levels(volume, max_reduction(dtype))
    keys = pyramid_levels(float_key(volume), max_reduction(_key_dtype(dtype)))
    return [volume] + [from_float_key(level, dtype) for level in keys[1:]]


@jax.jit
def _max_levels(volume: jax.Array) -> list[jax.Array]:
    """Levels 1 and up (level 0 is the volume itself, returned as is: JAX arrays are immutable)."""
    return max_levels(volume)[1:]


def max_mipmap(volume: Any) -> list[Any]:
    """Max pyramid of a 3D volume (or of each 3D volume of a stack): one pyramid for every threshold.

    Level 0 is the volume; each next level keeps the maximum of each 2x2x2
    block of the one before, with the same shapes and block rule as
    :func:`occupancy_mipmap`. So ``threshold_mipmap(max_mipmap(v), threshold=t)``
    equals ``occupancy_mipmap(v, threshold=t)`` for every ``t``, bit for bit,
    while the pyramid is built once.

    Parameters
    ----------
    volume
        Array of shape ``(..., D, H, W)``, any sizes >= 1; leading axes are
        carried (one pyramid per leading index). dtype bool, any integer, or
        float16, bfloat16, float32, float64. NumPy, JAX or dask (lazy).

    Returns
    -------
    list of jax.Array, or of dask.array.Array for a dask input
        Levels in the volume's dtype, level 0 first, shapes ``(..., *s)`` for
        ``s`` in ``mipmap_shapes(volume.shape[-3:])``. Level ``k``'s voxel
        ``(z, y, x)`` holds the maximum of the level-0 block
        ``[z*2**k, (z+1)*2**k)`` (and so on per axis, clipped to the volume).
        NaN counts as empty: it is ignored, and a block that holds only NaN
        stays NaN. A bool volume gives its any-pyramid. A dask input gives
        lazy dask levels (nothing computed yet), equal to the in-memory ones.

    Raises
    ------
    ValueError
        If ``volume`` has fewer than 3 axes, a zero-length axis, or a complex
        or non-numeric dtype.

    Notes
    -----
    The any-pyramid and the max pyramid are one reduction (``halve``) with two
    operators: OR, and the maximum. Floats are maximised as integer order keys
    in their own width (the float's bits, sign-magnitude folded; NaN the
    lowest key), which is exact where XLA's float maximum is not: its CPU
    and GPU backends flush subnormals to zero. NaN payloads are not kept (a
    block of NaN gives the canonical NaN) and ``-0.0`` becomes ``0.0`` above
    level 0. 64-bit volumes keep their precision (x64 for that call only).

    Examples
    --------
    >>> import numpy as np
    >>> from napari_gridmip import max_mipmap, threshold_mipmap
    >>> levels = max_mipmap(np.arange(8.0).reshape(2, 2, 2))
    >>> float(levels[1][0, 0, 0])
    7.0
    >>> [bool(level.any()) for level in threshold_mipmap(levels, threshold=6.5)]
    [True, True]
    """
    volume = validate.as_array("volume", volume)
    dtype = validate.check_real("volume", volume)
    shape = validate.check_ndim("volume", volume, min_ndim=3)
    validate.check_nonempty("volume", shape)
    # where this machine's rates say the call finishes first (core.runtime.rates): a link can be slower than the host's
    # pass
    with strategy.memory_bound_place(volume, kernel="max_mipmap"):
        return _max_mipmap(volume, shape, dtype)


def _max_mipmap(volume: Any, shape: tuple[int, ...], dtype: np.dtype) -> list[Any]:
    if validate.is_dask(volume):  # block by block, each block by the validated kernel
        # where memory_bound_place put this call, in dask's threads too, on every local device in turn
        kernel = spread_blocks(strategy.keep_place(_max_kernel))
        return _chunked.pyramid(volume, kernel, kernel, volume.dtype)

    with precision_scope(dtype):
        if len(shape) == 3:
            level0 = to_device(volume)
            return [level0, *_max_levels(level0)]
        stacked = volume.reshape((-1, *shape[-3:]))
        pyramids = []
        for i in range(stacked.shape[0]):
            level0 = to_device(stacked[i])
            pyramids.append([level0, *_max_levels(level0)])
        return [jnp.stack(levels).reshape(shape[:-3] + levels[0].shape) for levels in zip(*pyramids)]


@jax.jit
def _compare_levels(levels: list[jax.Array], threshold: jax.Array) -> list[jax.Array]:
    return [_compare(level, threshold) for level in levels]


def threshold_mipmap(max_levels: Sequence[Any], *, threshold: float = 0.0) -> list[Any]:
    """The occupancy pyramid at ``threshold`` from a max pyramid: each level ``> threshold``, exactly.

    Parameters
    ----------
    max_levels
        Levels from :func:`max_mipmap` (all of them, or only those you need,
        e.g. ``[levels[k]]`` for the one level a viewer shows), each of any
        shape; NumPy, JAX or dask, all of one dtype (bool, integer or real float).
    threshold
        A cell is occupied when its maximum is ``> threshold``, compared as
        real numbers: the threshold is never rounded into a different answer
        (a Python float compared with a float16 array by NumPy is rounded to
        float16 first; here it is not). NaN is never occupied.

    Returns
    -------
    list of jax.Array, or of dask.array.Array for dask levels
        Bool arrays of the levels' shapes. For a max pyramid ``m`` of
        ``volume``, ``threshold_mipmap(m, threshold=t)[k]`` equals
        ``occupancy_mipmap(volume, threshold=t)[k]`` for every ``t`` and ``k``.
        Dask levels stay lazy.

    Raises
    ------
    ValueError
        If ``max_levels`` is empty, its levels differ in dtype, or one has a
        complex or non-numeric dtype; if ``threshold`` is not finite.
    TypeError
        If ``max_levels`` is not a sequence of arrays, or ``threshold`` is not a real number.

    Examples
    --------
    >>> import numpy as np
    >>> from napari_gridmip import max_mipmap, occupancy_mipmap, threshold_mipmap
    >>> volume = np.random.default_rng(0).random((5, 6, 7)).astype(np.float16)
    >>> levels = max_mipmap(volume)
    >>> all(bool((a == b).all()) for a, b in zip(threshold_mipmap(levels, threshold=0.9),
    ...                                          occupancy_mipmap(volume, threshold=0.9)))
    True
    """
    if isinstance(max_levels, (str, bytes)) or not isinstance(max_levels, Sequence):
        raise TypeError(f"max_levels must be a list of arrays (from max_mipmap); got {type(max_levels).__name__}")
    if len(max_levels) == 0:
        raise ValueError("max_levels must hold at least one level; got an empty list")
    levels = [validate.as_array(f"max_levels[{k}]", level) for k, level in enumerate(max_levels)]
    dtypes = {validate.check_real(f"max_levels[{k}]", level) for k, level in enumerate(levels)}
    if len(dtypes) > 1:
        raise ValueError(f"max_levels must all have one dtype; got {', '.join(sorted(d.name for d in dtypes))}")
    (dtype,) = dtypes
    threshold = validate.check_finite_scalar("threshold", threshold)
    constant = _constant_occupancy(dtype, threshold)
    if any(validate.is_dask(level) for level in levels):
        import dask.array as da  # only dask input needs it: dask.array takes 0.5 s to import

        return [da.asarray(level).map_blocks(threshold_block, threshold, dtype=bool) for level in levels]
    if constant is not None:
        return [jnp.full(validate.shape_of(level), constant, dtype=bool) for level in levels]
    if all(isinstance(level, np.ndarray) for level in levels):
        return [owned_to_device(_host_occupancy(level, threshold)) for level in levels]
    if dtype == np.bool_:  # 0 <= threshold < 1: each level is its own occupancy
        return [jnp.asarray(level) for level in levels]
    scalar = _device_threshold(dtype, threshold)
    with precision_scope(scalar.dtype):
        return list(_compare_levels([jnp.asarray(level) for level in levels], jnp.asarray(scalar)))


def _reject_dask(name: str, levels: list[Any], *, first: int = 0) -> None:
    """TypeError if a level is a dask array (``levels`` are ``name[first:]``)."""
    for k, level in enumerate(levels, start=first):
        if validate.is_dask(level):
            raise TypeError(f"{name}[{k}] is a dask array: compute the levels first (they are small next to the data)")


def check_pyramid(name: str, levels: Any, *, allow_dask: bool = True) -> list[Any]:
    """Validate a bool occupancy pyramid of one 3D volume: all levels, level 0 first, with
    :func:`mipmap_shapes`' shapes. Returns the levels as a list (arrays untouched)."""
    if isinstance(levels, (str, bytes)) or not isinstance(levels, Sequence):
        raise TypeError(
            f"{name} must be a list of bool arrays (from occupancy_mipmap or threshold_mipmap); "
            f"got {type(levels).__name__}"
        )
    if len(levels) == 0:
        raise ValueError(f"{name} must hold at least one level; got an empty list")
    out = [validate.as_array(f"{name}[{k}]", level) for k, level in enumerate(levels)]
    for k, level in enumerate(out):
        dtype = validate.dtype_of(level)
        if dtype != np.bool_:
            raise ValueError(
                f"{name}[{k}] must be a bool occupancy level (from occupancy_mipmap or threshold_mipmap); "
                f"got dtype {dtype}"
            )
        if not allow_dask:
            _reject_dask(name, out[k : k + 1], first=k)
    shape = validate.shape_of(out[0])
    if len(shape) != 3:
        raise ValueError(
            f"{name} must be the pyramid of one 3D volume; level 0 has shape {shape} "
            "(index a stack's leading axes first, e.g. [level[t, c] for level in levels])"
        )
    validate.check_nonempty(f"{name}[0]", shape)
    expected = mipmap_shapes(shape)
    got = [tuple(validate.shape_of(level)) for level in out]
    if got != expected:
        raise ValueError(f"{name} must hold every level of a pyramid, shapes {expected}; got shapes {got}")
    return out
