"""The merge engine of patch stacks: patch origins, blend windows, the dtype policy and the compiled overlap-add.

A leaf: :func:`~napari_gridmip.merge_patches` (which validates) and its dask twin
(:mod:`napari_gridmip.core.patches._chunked`, one kernel call per output chunk) both use it; it imports neither.
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

from napari_gridmip.core import validate
from napari_gridmip.core.options import WEIGHTED_BLENDS
from napari_gridmip.core.runtime.precision import precision_scope
from napari_gridmip.core.runtime.transfer import to_device

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


def _merge_kernel(
    patches: np.ndarray,
    image_shape: tuple[int, ...],
    *,
    stride: tuple[int, ...],
    blend: str,
    sigma_scale: float,
    compute: np.dtype,
    result: np.dtype,
) -> jax.Array:
    """:func:`merge_patches` of a validated (sub-)grid of patches: the dask twin's kernel."""
    with precision_scope(compute):
        return _merge_jit(to_device(patches), image_shape, stride, blend, sigma_scale, compute.name, result.name)


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
    if validate.is_float(dtype):  # float16, bfloat16, float32
        return np.dtype(np.float32), dtype
    return np.dtype(np.float32), np.dtype(np.float32)
