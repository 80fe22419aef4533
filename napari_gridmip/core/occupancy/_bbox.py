"""The occupied bounding box of a validated pyramid: a leaf that :mod:`~napari_gridmip.core.occupancy.queries`
(the public :func:`~napari_gridmip.occupied_bbox`) and :mod:`~napari_gridmip.core.occupancy._flat` (the flat
pyramid's box) both read."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


class BoundingBox(NamedTuple):
    """A half-open box of level-0 voxels: ``lo[a] <= index[a] < hi[a]`` along each axis ``(z, y, x)``."""

    lo: tuple[int, int, int]
    hi: tuple[int, int, int]

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(h - low for low, h in zip(self.lo, self.hi))

    @property
    def slices(self) -> tuple[slice, slice, slice]:
        """``volume[box.slices]`` is the box's part of the volume."""
        return tuple(slice(low, h) for low, h in zip(self.lo, self.hi))


def _descend(levels: list[Any], axis: int, last: bool, slab_any) -> int:
    """Index along ``axis`` of the first (or ``last``) occupied level-0 slab, from the top down.

    At each level the candidate slabs are the two children of the one found a
    level up; all slabs before them (after them, for ``last``) are empty. So
    one slab per level is read: about ``1.3 * D*H*W / n_axis`` cells in all.
    """
    index = 0
    for k in range(len(levels) - 2, -1, -1):
        n = levels[k].shape[axis]
        first, second = 2 * index, 2 * index + 1
        if last:
            index = second if second < n and slab_any(levels[k], axis, second) else first
        else:
            index = first if slab_any(levels[k], axis, first) else second
    return index


def _jax_slab_any(level: jax.Array, axis: int, index: Any) -> jax.Array:
    return lax.dynamic_index_in_dim(level, index, axis, keepdims=False).any()


@jax.jit
def _bbox_device(levels: list[jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array]:
    def descend(axis: int, last: bool) -> jax.Array:
        index = jnp.int32(0)
        for k in range(len(levels) - 2, -1, -1):
            n = levels[k].shape[axis]
            first, second = 2 * index, 2 * index + 1
            if last:
                valid = second < n
                hit = valid & _jax_slab_any(levels[k], axis, jnp.minimum(second, n - 1))
                index = jnp.where(hit, second, first)
            else:
                index = jnp.where(_jax_slab_any(levels[k], axis, first), first, second)
        return index

    lo = jnp.stack([descend(a, False) for a in range(3)])
    hi = jnp.stack([descend(a, True) for a in range(3)]) + 1
    return levels[-1].any(), lo, hi


def bbox(levels: list[Any]) -> BoundingBox | None:
    """:func:`~napari_gridmip.occupied_bbox` of validated levels: NumPy and JAX levels by one compiled descent,
    dask or Zarr ones by reading the slabs themselves, nothing more."""
    if not all(isinstance(level, (np.ndarray, jax.Array)) for level in levels):
        return _bbox_host(levels)
    occupied, lo, hi = jax.device_get(_bbox_device([jnp.asarray(level) for level in levels]))
    if not occupied:
        return None
    return BoundingBox(tuple(int(v) for v in lo), tuple(int(v) for v in hi))


def bbox_of(levels: list[Any]) -> BoundingBox | None:
    """:func:`occupied_bbox` of validated levels: on the device for JAX arrays off the CPU, else on the host."""
    if all(isinstance(level, np.ndarray) for level in levels):
        return _bbox_host(levels)  # a NumPy slab reduction costs less than a compiled program's launch
    return bbox(levels)


def _bbox_host(levels: list[Any]) -> BoundingBox | None:
    """The same descent on sliceable arrays (NumPy, dask, Zarr), one small read per slab."""

    def slab_any(level: Any, axis: int, index: int) -> bool:
        key = [slice(None)] * 3
        key[axis] = index
        return bool(np.asarray(level[tuple(key)]).any())

    if not bool(np.asarray(levels[-1]).any()):
        return None
    lo = tuple(_descend(levels, a, False, slab_any) for a in range(3))
    hi = tuple(_descend(levels, a, True, slab_any) + 1 for a in range(3))
    return BoundingBox(lo, hi)
