"""Questions an occupancy pyramid answers fast: where is anything, is this box empty, which chunks hold data.

Answers are in level-0 voxel index space, half-open boxes ``[lo, hi)`` per axis ``(z, y, x)``; the pyramid is a
list of bool levels of one 3D volume, level 0 first, as :func:`~napari_gridmip.occupancy_mipmap` returns them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from napari_gridmip.core import validate
from napari_gridmip.core.occupancy import _bbox, _flat
from napari_gridmip.core.occupancy._bbox import BoundingBox
from napari_gridmip.core.occupancy.pyramid import check_pyramid
from napari_gridmip.core.runtime.precision import precision_scope

__all__ = ["is_empty", "occupied_bbox", "occupied_chunks"]


def occupied_bbox(levels: Sequence[Any]) -> BoundingBox | None:
    """The tight bounding box of the occupied voxels, read from the pyramid top down.

    Parameters
    ----------
    levels
        Bool occupancy pyramid of one 3D volume, every level (level 0 first),
        as from :func:`~napari_gridmip.occupancy_mipmap`: NumPy, JAX, or
        dask/Zarr (then only the slabs the search needs are read).

    Returns
    -------
    BoundingBox or None
        ``BoundingBox(lo, hi)``, tuples of Python ints in level-0 voxel index
        order ``(z, y, x)``, half-open: every occupied voxel has
        ``lo <= index < hi``, and each face of the box touches one. ``None``
        when nothing is occupied (an empty volume has no box).

    Raises
    ------
    ValueError
        If ``levels`` is empty, not bool, not 3D, or not a whole pyramid
        (shapes other than ``mipmap_shapes(levels[0].shape)``).
    TypeError
        If ``levels`` is not a sequence of arrays.

    Notes
    -----
    Each bound descends from the top: at level ``k`` only the two children of
    the slab found at level ``k + 1`` can hold the first occupied slab, so one
    slab per level is reduced, about ``1.3 (HW + DW + DH)`` cells per bound
    pair instead of the ``DHW`` of a scan.

    Examples
    --------
    >>> import numpy as np
    >>> from napari_gridmip import occupancy_mipmap, occupied_bbox
    >>> volume = np.zeros((5, 6, 7)); volume[1, 2:4, 6] = 1
    >>> occupied_bbox(occupancy_mipmap(volume))
    BoundingBox(lo=(1, 2, 6), hi=(2, 4, 7))
    """
    return _bbox.bbox(check_pyramid("levels", levels))


# ---------------------------------------------------------------------------------------------------------------------
# is_empty


def _empty_search(flat: _flat.FlatPyramid, top: jax.Array, lo: jax.Array, hi: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Depth-first search of the occupied cells that meet ``[lo, hi)``: (is the box empty, cells visited).

    A popped cell that is empty is dropped; one that is occupied and lies
    inside the box ends the search (not empty); one that straddles the box's
    boundary pushes its children that meet the box. The stack never holds more
    than ``7 * top + 1`` cells (its room: ``8 * MAX_LEVELS``). ``lo``/``hi`` are clipped to the volume and non-empty.
    """
    kind = flat.offsets.dtype
    size = 8 * _flat.MAX_LEVELS
    offsets = jnp.array([[(i >> 2) & 1, (i >> 1) & 1, i & 1] for i in range(8)], kind)
    shapes = flat.shapes
    stack = jnp.zeros((size, 4), kind).at[0, 0].set(top)

    def cond(state):
        _, count, found, _ = state
        return (count > 0) & ~found

    def body(state):
        stack, count, found, visited = state
        entry = stack[count - 1]
        count = count - 1
        k, cell = entry[0], entry[1:]
        occupied = _flat.lookup(flat, k, cell)
        start = cell << k
        end = jnp.minimum((cell + 1) << k, shapes[0])
        inside = jnp.all((start >= lo) & (end <= hi))
        found = occupied & inside
        children = 2 * cell[None, :] + offsets  # (8, 3) at level k - 1
        child_start = children << (k - 1)
        child_end = jnp.minimum((children + 1) << (k - 1), shapes[0])
        valid = (
            occupied
            & ~inside
            & (k > 0)
            & jnp.all(children < shapes[jnp.maximum(k - 1, 0)], axis=1)
            & jnp.all((child_start < hi) & (child_end > lo), axis=1)
        )
        slots = count + jnp.cumsum(valid) - 1
        rows = jnp.concatenate([jnp.full((8, 1), k - 1, kind), children], axis=1)
        stack = stack.at[jnp.where(valid, slots, size)].set(rows, mode="drop")
        return stack, count + valid.sum(dtype=count.dtype), found, visited + 1

    _, _, found, visited = lax.while_loop(cond, body, (stack, jnp.array(1, kind), jnp.array(False), jnp.array(0, kind)))
    return ~found, visited


@jax.jit
def _empty_boxes(flat: _flat.FlatPyramid, lo: jax.Array, hi: jax.Array) -> tuple[jax.Array, jax.Array]:
    top = _flat.top_level(flat)
    lo = jnp.maximum(lo, 0)
    hi = jnp.minimum(hi, flat.shapes[0])
    nothing = jnp.any(hi <= lo, axis=-1)

    def one(lo, hi, nothing):
        empty, visited = _empty_search(flat, top, lo, jnp.where(nothing, lo + 1, hi))
        return empty | nothing, jnp.where(nothing, 0, visited)

    return jax.vmap(one)(lo, hi, nothing)


def _box_argument(name: str, value: Any) -> np.ndarray:
    array = np.asarray(validate.as_array(name, value))
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        if array.dtype.kind == "f" and np.all(np.isfinite(array)) and np.all(array == np.round(array)):
            array = array.astype(np.int64)
        else:
            raise ValueError(f"{name} must hold integer voxel indices; got {value!r}")
    if array.ndim == 0 or array.shape[-1] != 3:
        raise ValueError(f"{name} must have shape (3,) or (n, 3): (z, y, x) voxel indices; got shape {array.shape}")
    return array


def empty_search(levels: Sequence[Any], lo: Any, hi: Any) -> tuple[np.ndarray, np.ndarray]:
    """:func:`is_empty` with the number of cells each search visited: (empty, visited), NumPy arrays."""
    levels = check_pyramid("levels", levels, allow_dask=False)
    lo, hi = _box_argument("lo", lo), _box_argument("hi", hi)
    if lo.shape != hi.shape:
        raise ValueError(f"lo and hi must have one shape; got {lo.shape} and {hi.shape}")
    shapes = [tuple(level.shape) for level in levels]
    kind = _flat.index_dtype(shapes)
    big = np.iinfo(kind).max // 2  # boxes reaching past the volume are clipped; keep the clip exact
    count = int(np.prod(lo.shape[:-1], dtype=np.int64))
    padded = _flat.bucket(count, 8)  # box counts share compiled programs too
    lo2 = np.zeros((padded, 3), kind)
    hi2 = np.zeros((padded, 3), kind)
    lo2[:count] = np.clip(lo.reshape(-1, 3), -big, big)
    hi2[:count] = np.clip(hi.reshape(-1, 3), -big, big)
    with precision_scope(kind):
        flat = _flat.flatten(levels)
        empty, visited = jax.device_get(_empty_boxes(flat, jnp.asarray(lo2), jnp.asarray(hi2)))
    return empty[:count].reshape(lo.shape[:-1]), visited[:count].reshape(lo.shape[:-1])


def is_empty(levels: Sequence[Any], lo: Any, hi: Any) -> Any:
    """Whether the box ``[lo, hi)`` holds no occupied voxel, searching only occupied cells from the top.

    Parameters
    ----------
    levels
        Bool occupancy pyramid of one 3D volume, every level (level 0 first),
        NumPy or JAX, as from :func:`~napari_gridmip.occupancy_mipmap`.
    lo, hi
        The box's corners in level-0 voxel indices ``(z, y, x)``, half-open:
        shape ``(3,)`` for one box, or ``(..., 3)`` for many (searched in one
        vectorised program). Parts outside the volume hold nothing; a box with
        ``hi <= lo`` along an axis is empty.

    Returns
    -------
    bool or numpy.ndarray of bool
        ``True`` where the box holds no occupied voxel; a bool for one box,
        an array of shape ``lo.shape[:-1]`` for many.

    Raises
    ------
    ValueError
        If ``levels`` is not a whole bool pyramid of one 3D volume, or ``lo``/
        ``hi`` do not hold integer ``(z, y, x)`` indices of one shape.
    TypeError
        If ``levels`` is not a sequence of NumPy/JAX arrays (compute dask levels first).

    Notes
    -----
    A depth-first search from the top cell: an empty cell ends its branch,
    an occupied cell inside the box answers "not empty" at once, and only
    occupied cells that straddle the box's boundary are opened (their
    children that meet the box are searched). So the cells visited number at
    most ``1 + 8 P``, ``P`` the occupied cells of all levels that straddle the
    boundary, however large the box: a huge box in empty space is settled
    near the top.

    Examples
    --------
    >>> import numpy as np
    >>> from napari_gridmip import is_empty, occupancy_mipmap
    >>> volume = np.zeros((64, 64, 64), bool); volume[40, 40, 40] = True
    >>> levels = occupancy_mipmap(volume)
    >>> is_empty(levels, (0, 0, 0), (40, 64, 64)), is_empty(levels, (0, 0, 0), (41, 41, 41))
    (True, False)
    """
    empty, _ = empty_search(levels, lo, hi)
    return bool(empty) if empty.ndim == 0 else empty


# ---------------------------------------------------------------------------------------------------------------------
# occupied_chunks


def _chunk_bounds(chunks: Any, shape: tuple[int, ...]) -> list[np.ndarray]:
    """Chunk boundaries per axis ``[0, b1, ..., n]`` from a dask-style chunks tuple or a chunk shape."""
    if isinstance(chunks, (str, bytes)) or not isinstance(chunks, Sequence) or len(chunks) != 3:
        raise ValueError(
            "chunks must give the 3 spatial axes: a chunk shape such as (64, 64, 64), or dask-style "
            f"((64, 64, 8), (100, 28), (128,)); got {chunks!r} (for a stack's chunks pass chunks[-3:])"
        )
    bounds = []
    for axis, (entry, n) in enumerate(zip(chunks, shape)):
        if np.ndim(entry) == 0:
            (size,) = validate.int_tuple(f"chunks[{axis}]", (entry,))
            sizes = [size] * (n // size) + ([n % size] if n % size else [])
        else:
            sizes = list(validate.int_tuple(f"chunks[{axis}]", entry, minimum=0))
            if sum(sizes) != n:
                raise ValueError(f"chunks[{axis}] must add up to the volume's {n} voxels on that axis; got {entry!r}")
        bounds.append(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))
    return bounds


def _aligned_level(bounds: list[np.ndarray], top: int) -> int:
    """The coarsest level whose cells never straddle a chunk boundary (every inner boundary a multiple of 2**m)."""
    inner = np.concatenate([b[1:-1] for b in bounds])
    inner = inner[inner > 0]
    m = top
    while m > 0 and np.any(inner % (1 << m)):
        m -= 1
    return m


def _segment_any(level: jax.Array, axis: int, starts: np.ndarray, ends: np.ndarray) -> jax.Array:
    """``any()`` over the cell ranges ``[starts[j], ends[j])`` along ``axis`` (ranges may be empty)."""
    lengths = ends - starts
    width = max(int(lengths.max()), 1)
    index = starts[:, None] + np.arange(width)[None, :]
    valid = np.arange(width)[None, :] < lengths[:, None]
    index = np.where(valid, index, 0).reshape(-1)
    picked = jnp.take(level, jnp.asarray(index, jnp.int32), axis=axis)
    shape = list(level.shape)
    shape[axis : axis + 1] = [len(starts), width]
    picked = picked.reshape(shape)
    mask_shape = [1] * len(shape)
    mask_shape[axis : axis + 2] = [len(starts), width]
    return (picked & jnp.asarray(valid.reshape(mask_shape))).any(axis=axis + 1)


def occupied_chunks(levels: Sequence[Any], chunks: Any) -> np.ndarray:
    """Which chunks of a chunk grid (dask or Zarr) hold an occupied voxel.

    Parameters
    ----------
    levels
        Bool occupancy pyramid of one 3D volume, every level (level 0 first):
        NumPy, JAX or dask/Zarr (only the one level needed is read).
    chunks
        The volume's chunk grid: a chunk shape ``(cz, cy, cx)`` (Zarr's
        ``array.chunks``; the last chunk of an axis may be shorter), or
        dask-style sizes per axis ``((64, 64, 8), (100, 28), (128,))``
        (``dask_array.chunks``). Any sizes.

    Returns
    -------
    numpy.ndarray of bool
        Shape: the number of chunks along each axis. ``True`` where the chunk
        holds at least one occupied voxel; a chunk of size 0 is ``False``.

    Raises
    ------
    ValueError
        If ``levels`` is not a whole bool pyramid of one 3D volume, or
        ``chunks`` does not describe 3 axes that add up to level 0's shape.
    TypeError
        If ``levels`` is not a sequence of arrays.

    Notes
    -----
    The answer is read from the coarsest level ``m`` whose cells never
    straddle a chunk boundary (``2**m`` divides every inner boundary): with
    chunks of 64 that is level 6, 1/262144 of the voxels; chunks of 100 give
    level 2. Each chunk is then an ``any()`` over its range of level-``m`` cells.

    Examples
    --------
    >>> import numpy as np
    >>> from napari_gridmip import occupancy_mipmap, occupied_chunks
    >>> volume = np.zeros((100, 100, 100), bool); volume[70, 5, 99] = True
    >>> np.argwhere(occupied_chunks(occupancy_mipmap(volume), (64, 64, 64))).tolist()
    [[1, 0, 1]]
    """
    levels = check_pyramid("levels", levels)
    shape = tuple(int(n) for n in validate.shape_of(levels[0]))
    bounds = _chunk_bounds(chunks, shape)
    m = _aligned_level(bounds, len(levels) - 1)
    level = levels[m]
    if not isinstance(level, (np.ndarray, jax.Array)):
        level = np.asarray(level)  # dask or Zarr: this one level is read
    result = jnp.asarray(level)
    for axis, b in enumerate(bounds):
        starts = b[:-1] >> m
        ends = -(-b[1:] // (1 << m))  # a chunk's last cell may be clipped at the volume's edge
        ends = np.where(b[1:] == b[:-1], starts, ends)  # a zero-size chunk covers no cell
        result = _segment_any(result, axis, starts, ends)
    return np.asarray(result)
