"""Occupancy levels packed 8 cells to a byte, in C order or in Morton order of 2x2x2 blocks.

The Morton layout is instant-ngp's density bitfield generalised to any shape:
each byte is one 2x2x2 block, and the bytes follow the Morton (Z-order) curve
of the blocks, so that neighbouring cells share bytes and cache lines.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from napari_gridmip.core import validate

__all__ = ["pack_occupancy", "unpack_occupancy"]

ORDERS = ("c", "morton")


def packed_size(shape: tuple[int, ...], order: str) -> int:
    """Bytes of a packed level of ``shape``: ``ceil(D*H*W / 8)`` in C order, one per 2x2x2 block in Morton order."""
    if order == "c":
        return -(-int(np.prod(shape, dtype=np.int64)) // 8)
    return int(np.prod([-(-n // 2) for n in shape], dtype=np.int64))


@functools.lru_cache(maxsize=4)
def morton_permutation(blocks: tuple[int, int, int]) -> np.ndarray:
    """C-order index of each block of a ``blocks`` grid, in Morton order of the blocks (a cached table).

    The grid is padded to a power of two per axis, split into one axis per
    coordinate bit, and transposed so that the bits run from the most
    significant down, interleaved z, y, x at each bit (x lowest, as in
    ``morton3D(x, y, z)``); padding blocks are then dropped. No sort.
    """
    bits = [max(int(n) - 1, 0).bit_length() for n in blocks]
    padded = np.full([1 << b for b in bits], -1, dtype=np.int64)
    padded[: blocks[0], : blocks[1], : blocks[2]] = np.arange(int(np.prod(blocks)), dtype=np.int64).reshape(blocks)
    split = padded.reshape((2,) * sum(bits)) if sum(bits) else padded.reshape(1)
    start = np.concatenate([[0], np.cumsum(bits)])
    axes = []
    for j in range(max(bits) - 1, -1, -1):
        for a in range(3):
            if j < bits[a]:
                axes.append(int(start[a] + bits[a] - 1 - j))  # axis of bit j of coordinate a (MSB first)
    order = np.transpose(split, axes).ravel() if axes else split.ravel()
    table = order[order >= 0]
    return table.astype(np.int32 if table.size < 2**31 else np.int64)


_BLOCK_WEIGHTS = np.array([[[1 << (4 * z + 2 * y + x) for x in range(2)] for y in range(2)] for z in range(2)])


@functools.partial(jax.jit, static_argnames="order")
def _pack(level: jax.Array, table: jax.Array | None, order: str) -> jax.Array:
    if order == "c":
        bits = level.ravel()
        bits = jnp.pad(bits, (0, -bits.size % 8))
        weights = jnp.left_shift(jnp.uint8(1), jnp.arange(8, dtype=jnp.uint8))
        return (bits.reshape(-1, 8).astype(jnp.uint8) * weights).sum(axis=1, dtype=jnp.uint8)
    level = jnp.pad(level, [(0, n % 2) for n in level.shape])
    d, h, w = (n // 2 for n in level.shape)
    blocks = level.reshape(d, 2, h, 2, w, 2).transpose(0, 2, 4, 1, 3, 5).astype(jnp.uint8)
    weights = jnp.asarray(_BLOCK_WEIGHTS, jnp.uint8)
    values = (blocks * weights).reshape(d, h, w, 8).sum(axis=-1, dtype=jnp.uint8)
    return jnp.take(values.ravel(), table)


@functools.partial(jax.jit, static_argnames=("shape", "order"))
def _unpack(data: jax.Array, table: jax.Array | None, shape: tuple[int, int, int], order: str) -> jax.Array:
    if order == "c":
        bits = (data[:, None] >> jnp.arange(8, dtype=jnp.uint8)) & jnp.uint8(1)
        return bits.ravel()[: int(np.prod(shape))].astype(bool).reshape(shape)
    d, h, w = (-(-n // 2) for n in shape)
    values = jnp.zeros(d * h * w, jnp.uint8).at[table].set(data, unique_indices=True).reshape(d, h, w)
    weights = jnp.asarray(_BLOCK_WEIGHTS, jnp.uint8)
    bits = (values[:, :, :, None, None, None] & weights) != 0  # (d, h, w, 2, 2, 2)
    full = bits.transpose(0, 3, 1, 4, 2, 5).reshape(2 * d, 2 * h, 2 * w)
    return full[: shape[0], : shape[1], : shape[2]]


def pack_occupancy(level: Any, *, order: str = "morton") -> jax.Array:
    """Pack a bool level 8 cells to a byte: 1/8 of its memory, for export or fast lookups.

    Parameters
    ----------
    level
        Bool array of shape ``(D, H, W)``, any sizes >= 1 (a level of
        :func:`~napari_gridmip.occupancy_mipmap`); NumPy or JAX.
    order
        ``"morton"`` (default): each byte is one 2x2x2 block, the cell
        ``(z, y, x)`` its bit ``4*(z % 2) + 2*(y % 2) + (x % 2)`` (bit 0 the
        least significant); the bytes follow the Morton order of the blocks
        ``(z//2, y//2, x//2)``, whose code interleaves their bits as
        ``... z1 y1 x1 z0 y0 x0`` (x lowest, like ``morton3D(x, y, z)``),
        blocks outside the grid skipped. For a cubic power-of-two grid (e.g.
        instant-ngp's 128^3) the byte index is the code itself, so cell
        ``(z, y, x)`` is bit ``m % 8`` of byte ``m // 8``, ``m = morton3D(x, y, z)``:
        instant-ngp's bitfield layout.
        ``"c"``: the cells in C order, cell ``i`` of ``level.ravel()`` bit
        ``i % 8`` of byte ``i // 8`` (``np.packbits(level.ravel(), bitorder="little")``).
        Odd sizes are padded with empty cells (in Morton order, to even sizes).

    Returns
    -------
    jax.Array
        uint8, 1D: ``ceil(D*H*W / 8)`` bytes in C order,
        ``ceil(D/2) * ceil(H/2) * ceil(W/2)`` in Morton order.
        :func:`unpack_occupancy` with the same shape and order gives the level back.

    Raises
    ------
    ValueError
        If ``level`` is not a 3D bool array with every size >= 1, or
        ``order`` is not ``"morton"`` or ``"c"``.

    References
    ----------
    T. Müller et al., "Instant neural graphics primitives with a multiresolution
    hash encoding", ACM Trans. Graph. 41(4), 2022 (its occupancy bitfield).

    Examples
    --------
    >>> import numpy as np
    >>> from napari_gridmip import pack_occupancy
    >>> level = np.zeros((2, 2, 4), bool); level[1, 0, 3] = True
    >>> pack_occupancy(level).tolist()  # block (0, 0, 1), cell (1, 0, 1) of it: bit 4 + 1
    [0, 32]
    >>> pack_occupancy(level, order="c").tolist()  # cell 11 in C order: byte 1, bit 3
    [0, 8]
    """
    order = validate.check_choice("order", order, ORDERS)
    level = validate.as_array("level", level)
    shape = _check_level_shape("level", validate.shape_of(level))
    if validate.dtype_of(level) != np.bool_:
        raise ValueError(f"level must be a bool occupancy level; got dtype {validate.dtype_of(level)}")
    table = None
    if order == "morton":
        table = jnp.asarray(morton_permutation(tuple(-(-n // 2) for n in shape)))
    return _pack(jnp.asarray(level), table, order)


def unpack_occupancy(bits: Any, shape: Any, *, order: str = "morton") -> jax.Array:
    """The bool level that :func:`pack_occupancy` packed, exactly.

    Parameters
    ----------
    bits
        uint8 1D array from :func:`pack_occupancy` (NumPy, JAX, or read back
        from a file), of the length that ``shape`` and ``order`` give.
    shape
        The level's shape ``(D, H, W)``.
    order
        The order it was packed in: ``"morton"`` (default) or ``"c"``; see
        :func:`pack_occupancy` for both layouts.

    Returns
    -------
    jax.Array
        Bool, shape ``shape``; the padding cells are dropped.

    Raises
    ------
    ValueError
        If ``bits`` is not a 1D uint8 array of the expected length, ``shape``
        is not 3 sizes >= 1, or ``order`` is not one of the two.
    """
    order = validate.check_choice("order", order, ORDERS)
    shape = _check_level_shape("shape", validate.int_tuple("shape", shape, 3) if np.ndim(shape) else shape)
    bits = validate.as_array("bits", bits)
    dtype = validate.dtype_of(bits)
    size = packed_size(shape, order)
    if dtype != np.uint8 or len(validate.shape_of(bits)) != 1 or validate.shape_of(bits)[0] != size:
        raise ValueError(
            f"bits must be a 1D uint8 array of {size} bytes for shape {shape} in {order!r} order; "
            f"got dtype {dtype}, shape {validate.shape_of(bits)}"
        )
    table = None
    if order == "morton":
        table = jnp.asarray(morton_permutation(tuple(-(-n // 2) for n in shape)))
    return _unpack(jnp.asarray(bits), table, shape, order)


def _check_level_shape(name: str, shape: Any) -> tuple[int, int, int]:
    if np.ndim(shape) == 0 or len(shape) != 3:
        raise ValueError(f"{name} must be 3D (D, H, W); got shape {shape}")
    validate.check_nonempty(name, shape)
    return tuple(int(n) for n in shape)
