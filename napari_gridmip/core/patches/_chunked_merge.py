"""The dask twin of :func:`~napari_gridmip.merge_patches`: the merged image, output chunk by output chunk.

Each output chunk is made from the patches that touch it by the merge engine's kernel
(:mod:`~napari_gridmip.core.patches._merge`); nothing here imports the public function back. Max and overwrite
merges equal the in-memory result bit for bit; weighted merges (mean, gaussian, hann) agree within 2 ulp, since a
chunk's sub-grid sums its patches in another order (tests/core/test_chunked.py states it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from napari_gridmip.core.patches._merge import _merge_kernel, merge_dtypes, patch_origins

MERGE_CHUNK = 1024  # output chunk of a merge along each tiled axis, unless the caller gives one


def merge_patches(
    patches: Any,
    image_shape: tuple[int, ...],
    stride: tuple[int, ...],
    *,
    blend: str,
    sigma_scale: float,
    result_dtype: np.dtype,
    chunk: int = MERGE_CHUNK,
) -> Any:
    """The merged image of a dask patch stack, one task per output chunk (validated by the caller).

    Each block is merged by the engine's kernel (:mod:`~napari_gridmip.core.patches._merge`), never the public
    function again: the validation ran once, and nothing here imports back. Each output chunk merges only the
    patches that touch it, as a sub-grid with the same origin rule (its first patch at 0, its last one flush with
    its end when the whole grid's is), so each pixel sums the same patches with the same weights as the whole
    merge.
    """
    import dask
    import dask.array as da

    d = len(stride)
    patch_size = patches.shape[patches.ndim - d :]
    lead = image_shape[: len(image_shape) - d]
    tiled = image_shape[len(image_shape) - d :]
    origins = [patch_origins(n, p, s) for n, p, s in zip(tiled, patch_size, stride)]
    bounds = [[(start, min(start + chunk, n)) for start in range(0, n, chunk)] for n in tiled]
    compute = merge_dtypes(np.dtype(patches.dtype), blend)[0]
    options = {"stride": tuple(stride), "blend": blend, "sigma_scale": sigma_scale, "compute": compute}

    def merged_block(sub_patches: np.ndarray, sub_shape: tuple[int, ...], crop: tuple[slice, ...]) -> np.ndarray:
        out = np.asarray(_merge_kernel(np.asarray(sub_patches), sub_shape, **options, result=np.dtype(result_dtype)))
        return out[(Ellipsis, *crop)]

    def block_at(index: tuple[int, ...]) -> Any:
        grid_slices, sub_tiled, crop = [], [], []
        for axis, i in enumerate(index):
            start, stop = bounds[axis][i]
            o = origins[axis]
            first = int(np.searchsorted(o + patch_size[axis], start, side="right"))  # first patch ending past start
            last = int(np.searchsorted(o, stop, side="left")) - 1  # last patch starting before stop
            grid_slices.append(slice(first, last + 1))
            sub_tiled.append(int(o[last] + patch_size[axis] - o[first]))
            crop.append(slice(start - int(o[first]), stop - int(o[first])))
        sub = patches[tuple(grid_slices)]
        shape = tuple(stop - start for start, stop in (bounds[axis][i] for axis, i in enumerate(index)))
        task = dask.delayed(merged_block, pure=True)(sub, lead + tuple(sub_tiled), tuple(crop))
        return da.from_delayed(task, shape=lead + shape, dtype=result_dtype)

    def nest(prefix: tuple[int, ...]) -> Any:
        axis = len(prefix)
        if axis == d:
            return block_at(prefix)
        return [nest((*prefix, i)) for i in range(len(bounds[axis]))]

    # da.block joins the nested list along the last d axes
    return da.block(nest(()))
