"""A Zarr array whose basic indexing is lazy: what napari's multiscale slicing needs to read only the plane it shows.

napari slices a multiscale level in 2D as ``np.asarray(level[displayed region][dims point])``: it takes every
non-displayed axis whole first. A Zarr array reads at the first index, so a 3D level read the whole depth of the
view (all of level 1 of the 2048^3 sample, 2 GiB, kept while the slice was shown; 3.3 GiB at the peak as the layer
was added). :class:`LazyLevel` composes the indexing and reads at ``np.asarray``: the plane's chunks only. It is not
a dask array on purpose: napari keeps the chunks of dask layers in its opportunistic cache (a quarter of the
machine's memory by default), which grew by 66 MiB at every switch to 3D with the sample's coarsest level.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np


class LazyLevel:
    """A view of a Zarr (or any sliceable) array: basic indexing (integers, slices, ``...``) makes another view,
    ``np.asarray`` reads it; any other index reads the view first.

    ``stored_array``: the array itself when the view is all of it (the live view then reads its chunk files
    directly: :func:`~napari_gridmip.core.occupancy.chunk_files.zarr_behind`).
    """

    def __init__(self, array: Any, index: tuple[range | int, ...] | None = None) -> None:
        self._array = array
        self._index = tuple(range(int(n)) for n in array.shape) if index is None else index

    @property
    def stored_array(self) -> Any:
        whole = all(isinstance(r, range) and r == range(int(n)) for r, n in zip(self._index, self._array.shape))
        return self._array if whole else None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(r) for r in self._index if isinstance(r, range))

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._array.dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def chunks(self) -> tuple[int, ...]:
        """The stored chunks along the view's axes (a view's own grid is aligned with them where it starts at 0)."""
        kept = [c for r, c in zip(self._index, self._array.chunks) if isinstance(r, range)]
        return tuple(min(int(c), max(n, 1)) for c, n in zip(kept, self.shape))

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d view")
        return self.shape[0]

    def __getitem__(self, key: Any) -> Any:
        key = key if isinstance(key, tuple) else (key,)
        if any(k is Ellipsis for k in key):
            at = next(i for i, k in enumerate(key) if k is Ellipsis)
            rest = [k for k in key if k is not Ellipsis]
            key = (*key[:at], *[slice(None)] * (self.ndim - len(rest)), *key[at + 1 :])
            key = tuple(k for k in key if k is not Ellipsis)
        try:
            key = tuple(k if isinstance(k, slice) else operator.index(k) for k in key)
        except TypeError:  # fancy indexing, None, a mask: read the view, then index it
            return np.asarray(self)[key]
        if len(key) > self.ndim:
            raise IndexError(f"too many indices: {len(key)} for a view of {self.ndim} dimensions")
        index, keys = [], iter(key)
        for r in self._index:
            index.append(r[next(keys, slice(None))] if isinstance(r, range) else r)
        return LazyLevel(self._array, tuple(index))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        selection, flip, axis = [], [], 0
        for r in self._index:
            if not isinstance(r, range):
                selection.append(r)
                continue
            if len(r) == 0:
                selection.append(slice(0, 0))
            elif r.step > 0:
                selection.append(slice(r[0], r[-1] + 1, r.step))
            else:  # read upwards, then reverse
                selection.append(slice(r[-1], r[0] + 1, -r.step))
                flip.append(axis)
            axis += 1
        out = np.asarray(self._array[tuple(selection)])
        if flip:
            out = out[tuple(slice(None, None, -1) if axis in flip else slice(None) for axis in range(out.ndim))]
        return out if dtype is None else out.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"LazyLevel(shape={self.shape}, dtype={self.dtype}, of {self._array!r})"


def is_lazy(data: Any) -> bool:
    """A dask or Zarr array (napari's lazy layers): read block by block, never whole."""
    return not isinstance(data, np.ndarray) and hasattr(data, "chunks") and not hasattr(data, "device")


def as_dask(data: Any) -> Any:
    """A dask view of a dask or Zarr array (its stored chunks), or of a NumPy array beside one."""
    import dask.array as da

    if hasattr(data, "dask"):
        return data
    return da.from_array(data, chunks=getattr(data, "chunks", "auto"))
