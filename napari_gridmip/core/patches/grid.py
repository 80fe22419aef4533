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

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from napari_gridmip.core import _validate
from napari_gridmip.core._options import BLEND_MODES, WEIGHTED_BLENDS
from napari_gridmip.core._precision import precision_scope
from napari_gridmip.core._transfer import to_device

__all__ = ["extract_patches", "merge_patches"]

_WEIGHTED = WEIGHTED_BLENDS
_MIN_WEIGHT = 1e-6  # windows are clipped here, so a pixel seen by one patch only still comes back


def patch_origins(n: int, patch: int, stride: int) -> np.ndarray:
    """Origins along one axis: ``0, s, 2s, ...`` while the patch fits, then one flush with the edge if needed.

    >>> patch_origins(10, 4, 3).tolist()
    [0, 3, 6]
    >>> patch_origins(11, 4, 3).tolist()
    [0, 3, 6, 7]
    """
    regular = np.arange(0, n - patch + 1, stride)
    if regular[-1] + patch < n:
        return np.append(regular, n - patch)
    return regular


def patch_grid(image_shape: Sequence[int], patch_size: Sequence[int], stride: Sequence[int]) -> tuple[int, ...]:
    """The grid shape ``(g_1, ..., g_d)`` for the image's last ``d`` axes (after :func:`_check_tiling`)."""
    tiled = tuple(image_shape)[len(image_shape) - len(patch_size) :]
    return tuple(len(patch_origins(n, p, s)) for n, p, s in zip(tiled, patch_size, stride))


def blend_window(patch: int, blend: str, *, sigma_scale: float = 0.125) -> np.ndarray:
    """The 1D weights of one patch axis for a weighted blend mode (float64, all > 0).

    ``"mean"``: ones. ``"gaussian"``: ``exp(-x**2 / (2 (sigma_scale * patch)**2))``
    around the patch centre. ``"hann"``: ``sin(pi * (i + 0.5) / patch)**2``,
    the Hann window sampled between its zeros. The n-D window is the outer
    product of the 1D ones; all are clipped below at 1e-6 so that pixels seen
    by one patch only are still divided by a positive weight.
    """
    i = np.arange(patch, dtype=np.float64)
    if blend == "mean":
        return np.ones(patch)
    if blend == "gaussian":
        sigma = sigma_scale * patch
        window = np.exp(-0.5 * ((i - (patch - 1) / 2) / sigma) ** 2)
    elif blend == "hann":
        window = np.sin(np.pi * (i + 0.5) / patch) ** 2
    else:
        raise ValueError(f"blend {blend!r} has no window; weighted modes are {', '.join(_WEIGHTED)}")
    return np.maximum(window, _MIN_WEIGHT)


def _check_tiling(
    image_shape: Sequence[int], patch_size: Any, stride: Any, *, image_name: str = "image"
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Validate patch_size and stride against the image's shape; return them as tuples."""
    patch_size = _validate.int_tuple("patch_size", patch_size)
    if not 1 <= len(patch_size) <= 3:
        raise ValueError(f"patch_size must tile 1 to 3 axes; got {patch_size}")
    d = len(patch_size)
    stride = _validate.int_tuple("stride", stride, d)
    image_shape = tuple(int(n) for n in image_shape)
    if len(image_shape) < d:
        raise ValueError(f"{image_name} has shape {image_shape}, fewer axes than patch_size {patch_size} tiles")
    _validate.check_nonempty(image_name, image_shape)
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
    image = _validate.as_array("image", image)
    dtype = _validate.check_numeric("image", image)
    patch_size, stride = _check_tiling(_validate.shape_of(image), patch_size, stride)
    with precision_scope(dtype):  # 64-bit data stays 64-bit: patches are moved, never rounded
        return _extract_jit(to_device(image), patch_size, stride)


# -- merging -------------------------------------------------------------------


def _identity(dtype: Any, blend: str) -> Any:
    """The value that leaves a pixel unchanged under the blend's combine."""
    if blend != "max":
        return np.zeros((), dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return np.array(-np.inf, dtype)
    if dtype == jnp.bool_:
        return np.array(False)
    return np.array(jnp.iinfo(dtype).min, dtype)


@dataclass(frozen=True)
class _Piece:
    """One dense piece of the overlap-add along one axis: which patch data, and where it lands.

    ``kind`` is ``"blocks"`` (block ``index`` of every regular patch, strided by
    ``step`` blocks of ``q`` pixels), ``"patch"`` (regular patch ``index`` whole) or
    ``"flush"`` (the last patch, flush with the edge). ``mask`` marks the pixels
    of the axis that the piece sets.
    """

    kind: str
    index: int
    mask: np.ndarray = field(compare=False)


def _axis_pieces(n: int, patch: int, stride: int) -> tuple[list[_Piece], dict[str, int]]:
    """The pieces of one axis, ordered so that later patches come later at every pixel.

    With ``q = gcd(stride, patch)``, patch ``i``'s block ``j`` (of ``q`` pixels)
    lands on block ``i * stride / q + j``: the patches' ``j``-th blocks together
    form one strided piece, ``patch / q`` pieces in all (just ``patch / stride``
    shifted copies when the stride divides the patch). With fewer patches than
    that, each patch is its own piece instead. The flush patch is one more.
    """
    origins = patch_origins(n, patch, stride)
    flush = len(origins) > 1 and origins[-1] - origins[-2] != stride
    g = len(origins) - int(flush)
    q = math.gcd(stride, patch)
    step, blocks_per_patch = stride // q, patch // q
    geometry = {
        "g": g,
        "q": q,
        "step": step,
        "blocks_per_patch": blocks_per_patch,
        "n": n,
        "patch": patch,
        "stride": stride,
        "length": (g - 1) * stride + patch,
    }
    pieces = []
    if blocks_per_patch <= g:
        for j in range(blocks_per_patch - 1, -1, -1):  # at a given block, smaller j = later patch
            mask = np.zeros(n, bool)
            for i in range(g):
                start = (i * step + j) * q
                mask[start : start + q] = True
            pieces.append(_Piece("blocks", j, mask))
    else:
        for i in range(g):
            mask = np.zeros(n, bool)
            mask[i * stride : i * stride + patch] = True
            pieces.append(_Piece("patch", i, mask))
    if flush:
        mask = np.zeros(n, bool)
        mask[n - patch :] = True
        pieces.append(_Piece("flush", len(origins) - 1, mask))
    return pieces, geometry


def _select_piece(x: jax.Array, axis: int, piece: _Piece, geo: dict[str, int]) -> jax.Array:
    """Slice ``piece``'s data out of the ``(g, p)`` axis pair at ``axis``, keeping two axes ``(g', w)``."""
    if piece.kind in ("flush", "patch"):
        return lax.slice_in_dim(x, piece.index, piece.index + 1, axis=axis)  # (1, p)
    g, q = geo["g"], geo["q"]
    before, rest = x.shape[:axis], x.shape[axis + 2 :]
    blocks = lax.slice_in_dim(x, 0, g, axis=axis).reshape(before + (g, geo["blocks_per_patch"], q) + rest)
    return lax.index_in_dim(blocks, piece.index, axis + 1, keepdims=False)  # (g, q)


def _pad_piece(y: jax.Array, axis: int, piece: _Piece, geo: dict[str, int], fill: Any) -> jax.Array:
    """Pad a selected piece's ``(g', w)`` axis pair into one axis of length ``n``, ``fill`` off its mask."""
    before, rest = y.shape[:axis], y.shape[axis + 2 :]

    def pad(z: jax.Array, lo: int, hi: int, interior: int = 0) -> jax.Array:
        config = [(0, 0, 0)] * z.ndim
        config[axis] = (lo, hi, interior)
        return lax.pad(z, fill, config)

    n, g, step = geo["n"], geo["g"], geo["step"]
    if piece.kind in ("flush", "patch"):
        start = n - geo["patch"] if piece.kind == "flush" else piece.index * geo["stride"]
        return pad(y.reshape(before + (geo["patch"],) + rest), start, n - start - geo["patch"])
    n_blocks = (g - 1) * step + geo["blocks_per_patch"]
    y = pad(y, piece.index, n_blocks - piece.index - (g - 1) * step - 1, step - 1)
    y = y.reshape(before + (n_blocks * geo["q"],) + rest)
    return pad(y, 0, n - geo["length"])


def _place_piece(x: jax.Array, axes: list[int], pieces: tuple[_Piece, ...], geos: list[dict], fill: Any) -> jax.Array:
    """Place one n-D piece: slice its data along every axis first, then pad.

    Slicing first gives every n-D piece its own expression, so XLA fuses them
    all into the final combine instead of materialising shared partial pieces.
    Axis pairs are handled last-first so that earlier axis indices stay valid.
    """
    y = x
    for axis, piece, geo in zip(axes, pieces, geos):
        y = _select_piece(y, axis, piece, geo)
    for axis, piece, geo in reversed(list(zip(axes, pieces, geos))):
        y = _pad_piece(y, axis, piece, geo, fill)
    return y


_MAX_FUSED_PIECES = 16  # up to this many n-D pieces go into one fused expression


def _overlap_combine(
    x: jax.Array, lead: int, tiled: tuple[int, ...], patch_size: tuple[int, ...], stride: tuple[int, ...], blend: str
) -> jax.Array:
    """Combine ``(*lead, g1, p1, ..., gd, pd)`` into ``(*lead, n1, ..., nd)``: sum, max or overwrite.

    When the pieces of all axes together are few (the usual case: 2^d for a
    stride of half the patch) every n-D piece is placed directly and all are
    combined in one fused expression, reading each patch once. Otherwise the
    axes are folded one after another.
    """
    identity = _identity(x.dtype, blend)
    axes = [_axis_pieces(n, p, s) for n, p, s in zip(tiled, patch_size, stride)]

    def combine(acc: jax.Array | None, y: jax.Array, mask: np.ndarray) -> jax.Array:
        if blend == "overwrite":
            return jnp.where(mask, y, identity if acc is None else acc)
        if acc is None:
            return y
        return jnp.maximum(acc, y) if blend == "max" else acc + y

    def broadcast_mask(mask_1d: np.ndarray, axis: int, ndim: int) -> np.ndarray:
        shape = [1] * ndim
        shape[axis] = -1
        return mask_1d.reshape(shape)

    if math.prod(len(pieces) for pieces, _ in axes) <= _MAX_FUSED_PIECES:
        out = None
        ndim = lead + len(tiled)
        for combo in itertools.product(*(pieces for pieces, _ in axes)):
            axis_positions = [lead + 2 * k for k in range(len(tiled))]  # the (g, p) pairs in x
            y = _place_piece(x, axis_positions, combo, [geo for _, geo in axes], identity)
            mask = np.ones((1,) * ndim, bool)
            for k, piece in enumerate(combo):
                mask = mask & broadcast_mask(piece.mask, lead + k, ndim)
            out = combine(out, y, mask)
        return out
    for k, (pieces, geo) in enumerate(axes):
        out = None
        for piece in pieces:
            y = _place_piece(x, [lead + k], (piece,), [geo], identity)
            out = combine(out, y, broadcast_mask(piece.mask, lead + k, y.ndim))
        x = out
    return x


def _merge(
    patches: jax.Array,
    image_shape: tuple[int, ...],
    stride: tuple[int, ...],
    blend: str,
    sigma_scale: float,
    compute: str,
    result: str,
) -> jax.Array:
    d = len(stride)
    patch_size = patches.shape[patches.ndim - d :]
    tiled = image_shape[len(image_shape) - d :]
    lead = len(image_shape) - d
    x = patches
    if blend in _WEIGHTED:
        out_dtype = np.dtype(compute)
        x = x.astype(out_dtype)
        windows = [blend_window(p, blend, sigma_scale=sigma_scale) for p in patch_size]
        if blend != "mean":
            weight = windows[0]
            for w in windows[1:]:
                weight = np.multiply.outer(weight, w)
            x = x * weight.astype(out_dtype)
    # (g1..gd, *lead, p1..pd) -> (*lead, g1, p1, ..., gd, pd)
    order = list(range(d, d + lead))
    for k in range(d):
        order += [k, d + lead + k]
    x = x.transpose(order)
    x = _overlap_combine(x, lead, tiled, patch_size, stride, blend)
    if blend in _WEIGHTED:
        total = np.ones(())
        for n, p, s, w in zip(tiled, patch_size, stride, windows):
            # the summed weight along this axis: fold the window over every patch position
            axis_total = np.zeros(n)
            for o in patch_origins(n, p, s):
                axis_total[o : o + p] += w
            total = np.multiply.outer(total, axis_total)
        x = x / total.astype(x.dtype)
    return x.astype(result)


_merge_jit = jax.jit(_merge, static_argnums=(1, 2, 3, 4, 5, 6))


def merge_dtypes(dtype: np.dtype, blend: str) -> tuple[np.dtype, np.dtype]:
    """(compute, result) dtypes of a merge: the dtype policy in one place.

    Weighted blends sum in float32, or in float64 where float32 would round the
    data (int32 and wider integers, float64). float16 and bfloat16 sum in
    float32 and come back in their own dtype; other integers and bools come
    back as float32 (or float64 as above). ``"max"`` and ``"overwrite"`` keep
    the dtype exactly.
    """
    if blend not in _WEIGHTED:
        return dtype, dtype
    if dtype == np.float64 or (np.issubdtype(dtype, np.integer) and dtype.itemsize >= 4):
        return np.dtype(np.float64), np.dtype(np.float64)
    if _validate.is_float(dtype):  # float16, bfloat16, float32
        return np.dtype(np.float32), dtype
    return np.dtype(np.float32), np.dtype(np.float32)


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
    blend = _validate.check_choice("blend", blend, BLEND_MODES)
    sigma_scale = _validate.check_finite_scalar("sigma_scale", sigma_scale)
    if sigma_scale <= 0:
        raise ValueError(f"sigma_scale must be > 0; got {sigma_scale}")
    patches = _validate.as_array("patches", patches)
    dtype = _validate.check_real("patches", patches)
    stride = _validate.int_tuple("stride", stride)
    d = len(stride)
    shape = _validate.shape_of(patches)
    image_shape = _validate.int_tuple("image_shape", image_shape)
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
    if _validate.is_dask(patches):
        from napari_gridmip.core.patches import _chunked

        return _chunked.merge_patches(
            patches, image_shape, stride, blend=blend, sigma_scale=float(sigma_scale), result_dtype=result
        )
    with precision_scope(compute):  # 64-bit data, or a float64 sum
        return _merge_jit(to_device(patches), image_shape, stride, blend, float(sigma_scale), compute.name, result.name)
