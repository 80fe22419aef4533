"""Correlation maps and displacement fields of dask stacks: lazily, row band by row band.

Both stacks are read in row bands with the window's half-size as a halo
(``dask.array.overlap``), all K frames and all columns in one chunk; each
task runs the in-memory kernel on NumPy blocks and returns NumPy. Displacements
equal the in-memory ones bit for bit; correlation values agree within 2 ulp
(XLA's vectorised loops round a few values differently with the block's shape;
tests/core/test_chunked.py states the tolerance).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _halo_blocks(img1: Any, img2: Any, window: tuple[int, int]) -> tuple[Any, Any, list[tuple[int, ...]]]:
    """Both stacks in row bands (K and the columns whole), the same chunks, and a halo of the window's half-size.

    Returns the overlapped stacks and the output chunks along M and N: the
    outer blocks lose the half-window that has no neighbour.
    """
    import dask.array as da

    m, n = window[0] // 2, window[1] // 2
    k_axis = img1.ndim - 3
    chunks = list(img1.chunks)
    chunks[k_axis] = (img1.shape[k_axis],)
    chunks[-2] = _at_least(img1.shape[-2], chunks[-2], 2 * m + 1)
    # whole rows: XLA vectorises along the columns, and narrower blocks round more values differently
    # (2 ulp against 1 ulp for row bands, measured on a 70x53 stack)
    chunks[-1] = (img1.shape[-1],)
    img1, img2 = da.asarray(img1).rechunk(tuple(chunks)), da.asarray(img2).rechunk(tuple(chunks))
    depth = {img1.ndim - 2: m, img1.ndim - 1: n}
    ov1 = da.overlap.overlap(img1, depth=depth, boundary="none")
    ov2 = da.overlap.overlap(img2, depth=depth, boundary="none")
    out = []
    for axis, half in ((img1.ndim - 2, m), (img1.ndim - 1, n)):
        sizes = list(img1.chunks[axis])
        sizes[0] -= half
        sizes[-1] -= half
        out.append(tuple(sizes))
    return ov1, ov2, out


def _at_least(n: int, chunks: tuple[int, ...], minimum: int) -> tuple[int, ...]:
    """Chunks of ``n`` none smaller than ``minimum`` (merging small ones), as close to the input's as can be."""
    if min(chunks) >= minimum or len(chunks) == 1:
        return chunks
    step = max(max(chunks), minimum)
    out = [min(step, n - start) for start in range(0, n, step)]
    if len(out) > 1 and out[-1] < minimum:
        out[-2] += out.pop()
    return tuple(out)


def windowed_pearson(
    img1: Any, img2: Any, window: tuple[int, int], dtype: np.dtype, *, offsets_first: bool = False
) -> Any:
    """The full map of dask stacks as a dask array ``(..., M - 2m, N - 2n, wm, wn)``
    (``(..., wm, wn, M - 2m, N - 2n)`` with ``offsets_first``)."""
    import dask.array as da

    ov1, ov2, (rows, cols) = _halo_blocks(img1, img2, window)
    lead = ov1.ndim - 3

    def block(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        from napari_gridmip.core.correlation.maps import windowed_pearson as in_memory

        return np.asarray(in_memory(a, b, window, dtype=dtype, offsets_first=offsets_first))

    offsets = ((window[0],), (window[1],))
    if offsets_first:
        chunks, new_axis = (*ov1.chunks[:lead], *offsets, rows, cols), [lead, lead + 1]
    else:
        chunks, new_axis = (*ov1.chunks[:lead], rows, cols, *offsets), [lead + 2, lead + 3]
    return da.map_blocks(block, ov1, ov2, dtype=dtype, chunks=chunks, drop_axis=[lead], new_axis=new_axis)


def find_displacement(img1: Any, img2: Any, window: tuple[int, int], subpixel: str, dtype: np.dtype) -> tuple:
    """``(dy, dx, peak)`` of dask stacks, each a dask array ``(..., M - 2m, N - 2n)`` computed block by block."""
    import dask.array as da

    ov1, ov2, (rows, cols) = _halo_blocks(img1, img2, window)
    lead = ov1.ndim - 3

    def block(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        from napari_gridmip.core.correlation.maps import find_displacement as in_memory

        return np.stack([np.asarray(r) for r in in_memory(a, b, window, subpixel=subpixel, dtype=dtype)])

    chunks = ((3,), *ov1.chunks[:lead], rows, cols)
    # one task per block computes all three; each output is a view of the stacked block
    stacked = da.map_blocks(block, ov1, ov2, dtype=dtype, chunks=chunks, drop_axis=[lead], new_axis=[0])
    return stacked[0], stacked[1], stacked[2]
