"""Cutting images into patches and putting them back together.

The last ``d`` axes of an image (``d = len(patch_size)``, 1 to 3) are tiled;
leading axes such as channels are carried whole. Patches have shape
``(g_1, ..., g_d, *leading, p_1, ..., p_d)``.

Patch origins (one rule, used by both functions): along an axis of length
``n`` with patch size ``p`` and stride ``s``, the origins are ``0, s, 2s, ...``
as long as the patch fits (``o + p <= n``), and, when the last of those does
not reach the edge, one more patch flush with the edge at ``n - p``. Any
image size is covered, without padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from napari_gridmip.core import validate
from napari_gridmip.core.options import BLEND_MODES
from napari_gridmip.core.patches._merge import (  # the merge engine, shared with the dask twin
    _merge_kernel,
    blend_window,  # noqa: F401 - tiled, stitch and the tests read it here
    merge_dtypes,
    patch_grid,
    patch_origins,
)
from napari_gridmip.core.runtime.precision import precision_scope
from napari_gridmip.core.runtime.transfer import to_device

__all__ = ["extract_patches", "merge_patches"]


def _check_tiling(
    image_shape: Sequence[int], patch_size: Any, stride: Any, *, image_name: str = "image"
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Validate patch_size and stride against the image's shape; return them as tuples."""
    patch_size = validate.int_tuple("patch_size", patch_size)
    if not 1 <= len(patch_size) <= 3:
        raise ValueError(f"patch_size must tile 1 to 3 axes; got {patch_size}")
    d = len(patch_size)
    stride = validate.int_tuple("stride", stride, d)
    image_shape = tuple(int(n) for n in image_shape)
    if len(image_shape) < d:
        raise ValueError(f"{image_name} has shape {image_shape}, fewer axes than patch_size {patch_size} tiles")
    validate.check_nonempty(image_name, image_shape)
    tiled = image_shape[len(image_shape) - d :]
    if any(p > n for p, n in zip(patch_size, tiled)):
        raise ValueError(f"patch_size {patch_size} is larger than the {image_name}'s tiled axes {tiled}")
    if any(s > p for s, p in zip(stride, patch_size)):
        raise ValueError(f"stride {stride} must not exceed patch_size {patch_size} (gaps would leave pixels unseen)")
    return patch_size, stride


# -- extraction ---------------------------------------------------------------


def _extract(image: jax.Array, patch_size: tuple[int, ...], stride: tuple[int, ...]) -> jax.Array:
    d = len(patch_size)
    lead = image.ndim - d
    x = image
    for k, (n, p, s) in enumerate(zip(image.shape[lead:], patch_size, stride)):
        axis = lead + 2 * k  # earlier tiled axes are already split into (g, p)
        origins = patch_origins(n, p, s)
        if s == p and n % p == 0:  # a plain grid: no data movement needed
            x = x.reshape(x.shape[:axis] + (n // p, p) + x.shape[axis + 1 :])
        else:
            index = (origins[:, None] + np.arange(p)).ravel()
            x = jnp.take(x, index, axis=axis, mode="clip")  # static indices, all in bounds
            x = x.reshape(x.shape[:axis] + (len(origins), p) + x.shape[axis + 1 :])
    # (*lead, g1, p1, ..., gd, pd) -> (g1, ..., gd, *lead, p1, ..., pd)
    grid_axes = [lead + 2 * k for k in range(d)]
    patch_axes = [lead + 2 * k + 1 for k in range(d)]
    return x.transpose(grid_axes + list(range(lead)) + patch_axes)


_extract_jit = jax.jit(_extract, static_argnums=(1, 2))


def extract_patches(image: Any, patch_size: Sequence[int], stride: Sequence[int]) -> jax.Array:
    """Cut the last ``d`` axes of ``image`` into patches.

    Parameters
    ----------
    image
        Array of shape ``(*leading, n_1, ..., n_d)``: bool, any integer, any
        float (bfloat16 included) or complex. 64-bit dtypes are kept (JAX's x64
        mode is switched on for this call only).
    patch_size
        ``(p_1, ..., p_d)``, ``1 <= d <= 3``, each ``p_k <= n_k``.
    stride
        ``(s_1, ..., s_d)``, ``1 <= s_k <= p_k``.

    Returns
    -------
    jax.Array
        Shape ``(g_1, ..., g_d, *leading, p_1, ..., p_d)``, exactly the image's
        dtype and values, with the origins of :func:`patch_origins` along each
        tiled axis.

    Raises
    ------
    ValueError
        When a patch is larger than the image, a stride is below 1 or larger
        than the patch, the lengths of ``patch_size`` and ``stride`` differ,
        the image has a zero-length axis, or its dtype is not a number
        (object, text).
    """
    image = validate.as_array("image", image)
    dtype = validate.check_numeric("image", image)
    patch_size, stride = _check_tiling(validate.shape_of(image), patch_size, stride)
    with precision_scope(dtype):  # 64-bit data stays 64-bit: patches are moved, never rounded
        return _extract_jit(to_device(image), patch_size, stride)


def merge_patches(
    patches: Any,
    image_shape: Sequence[int],
    stride: Sequence[int],
    *,
    blend: str = "mean",
    sigma_scale: float = 0.125,
) -> jax.Array:
    """Put patches back into one image.

    Parameters
    ----------
    patches
        Shape ``(g_1, ..., g_d, *leading, p_1, ..., p_d)`` as from
        :func:`extract_patches`, where ``d = len(stride)``. A NumPy, JAX or
        dask array; a dask stack gives a lazy dask image, made output chunk by
        output chunk (1024 pixels a side) from the patches that touch each
        chunk, equal to the in-memory merge.
    image_shape
        ``(*leading, n_1, ..., n_d)``; the grid must be the one that
        :func:`patch_origins` gives for it.
    stride
        ``(s_1, ..., s_d)``, ``1 <= s_k <= p_k``.
    blend
        How overlapping pixels combine: ``"mean"`` (equal weights),
        ``"gaussian"`` (a Gaussian window, sigma = ``sigma_scale`` x patch size),
        ``"hann"`` (a Hann window), ``"max"``, or ``"overwrite"`` (later
        patches in C order win; deterministic). Weighted modes divide by the
        summed weights, which are positive everywhere, so
        ``merge_patches(extract_patches(x, p, s), x.shape, s)`` gives back ``x``
        to float rounding for every mode.
    sigma_scale
        The Gaussian's sigma as a fraction of the patch size (``"gaussian"`` only).

    Returns
    -------
    jax.Array, or dask.array.Array for a dask stack
        Shape ``image_shape``. ``"max"`` and ``"overwrite"`` keep the patches'
        dtype and values exactly (64-bit included). Weighted modes sum in
        float32 and return float32 for bool, 8/16-bit integers and float32;
        float16 and bfloat16 sum in float32 and come back in their own dtype;
        int32, uint32, int64, uint64 and float64 sum and return in float64
        (JAX's x64 mode is switched on for that call only).

    Raises
    ------
    ValueError
        When the shapes disagree, the stride is below 1 or larger than the
        patch, a patch is larger than the image, or ``blend`` is unknown.
    """
    blend = validate.check_choice("blend", blend, BLEND_MODES)
    sigma_scale = validate.check_finite_scalar("sigma_scale", sigma_scale)
    if sigma_scale <= 0:
        raise ValueError(f"sigma_scale must be > 0; got {sigma_scale}")
    patches = validate.as_array("patches", patches)
    dtype = validate.check_real("patches", patches)
    stride = validate.int_tuple("stride", stride)
    d = len(stride)
    shape = validate.shape_of(patches)
    image_shape = validate.int_tuple("image_shape", image_shape)
    lead = len(image_shape) - d
    if lead < 0 or len(shape) != 2 * d + lead:
        raise ValueError(
            f"patches of shape {shape} do not fit image_shape {image_shape} with a {d}D stride {stride}: "
            f"expected {d} grid axes, {max(lead, 0)} leading axes and {d} patch axes"
        )
    patch_size = shape[len(shape) - d :]
    patch_size, stride = _check_tiling(image_shape, patch_size, stride, image_name="image_shape")
    expected = patch_grid(image_shape, patch_size, stride) + image_shape[:lead] + patch_size
    if shape != expected:
        raise ValueError(
            f"patches have shape {shape}; image_shape {image_shape} with patch_size {patch_size} and stride "
            f"{stride} needs {expected}"
        )
    compute, result = merge_dtypes(dtype, blend)
    if validate.is_dask(patches):  # output chunk by output chunk, each by the merge engine's kernel
        from napari_gridmip.core.patches import _chunked_merge

        return _chunked_merge.merge_patches(
            patches, image_shape, stride, blend=blend, sigma_scale=float(sigma_scale), result_dtype=result
        )
    # 64-bit data, or a float64 sum
    return _merge_kernel(
        patches, image_shape, stride=stride, blend=blend, sigma_scale=float(sigma_scale), compute=compute, result=result
    )
