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


# -- subsets, steps and speckle tracking (core/correlation/subsets.py) --------------------------------
#
# Row bands of the output, each one task: the stacks' rows that the band's vectors use (the window plus the
# subset, less one, as the halo) plus a few more real rows where the in-memory kernel would pad img1 (the
# ring of offsets and the Gram planes of the refinement), aligned to the step; the extra output rows are
# trimmed. All K frames and columns whole. Every band subtracts the same means (the whole stacks', a lazy
# reduction), as the in-memory call does.

SUBSET_BAND_ROWS = 256  # output rows per band when the input's own row chunks say nothing better


def _means(img: Any) -> Any:
    """Each batch item's mean over its finite values, lazily: a dask array of the batch shape."""
    import dask.array as da

    x = da.asarray(img)
    if np.issubdtype(x.dtype, np.floating):
        x = da.where(da.isfinite(x), x, np.nan)
        return da.nanmean(x.astype(np.float64), axis=(-3, -2, -1))
    return x.astype(np.float64).mean(axis=(-3, -2, -1))


def _subset_bands(
    img1: Any, img2: Any, window, subset, step, *, extra: int, outputs: int, trailing: tuple[int, ...], dtype, run
):
    """Assemble ``run(block1, block2, centres)`` over output row bands: a tuple of ``outputs`` dask arrays of
    shape ``(..., rows, cols, *trailing)``; ``run`` returns the outputs of its block."""
    import dask
    import dask.array as da

    img1, img2 = da.asarray(img1), da.asarray(img2)
    lead = img1.ndim - 3
    rows = img1.shape[-2]
    (wm, wn), (sh, sw), s = window, subset, step
    out_rows = -(-(rows - (wm - 1) - (sh - 1)) // s)
    out_cols = -(-(img1.shape[-1] - (wn - 1) - (sw - 1)) // s)
    chunk = max(img1.chunks[-2]) if len(img1.chunks[-2]) > 1 else SUBSET_BAND_ROWS * s
    band = max(1, min(out_rows, chunk // s))
    halo = -(-extra // s) * s  # extra real rows on each side, a whole number of steps
    layout = {**{a: img1.chunks[a] for a in range(lead)}, lead: -1, lead + 1: -1, lead + 2: -1}
    centres = da.stack([_means(img1), _means(img2)], axis=-1).rechunk(
        {**{a: img1.chunks[a] for a in range(lead)}, lead: -1}
    )
    grid = list(np.ndindex(*img1.numblocks[:lead]))
    columns = {index: [] for index in grid}  # each batch block's bands, top to bottom
    for start in range(0, out_rows, band):
        stop = min(start + band, out_rows)
        first = max(0, start * s - halo)  # a multiple of the step: the block's own output grid lines up
        last = min(rows, (stop - 1) * s + (wm - 1) + (sh - 1) + 1 + halo)
        skip = (start * s - first) // s
        b1 = img1[..., first:last, :].rechunk(layout)
        b2 = img2[..., first:last, :].rechunk(layout)
        for index in grid:
            parts = (b1.blocks[index], b2.blocks[index], centres.blocks[index]) if lead else (b1, b2, centres)
            size = tuple(img1.chunks[a][i] for a, i in enumerate(index))

            def task(a, b, c, skip=skip, keep=stop - start):
                stacked = np.stack([np.asarray(p) for p in run(a, b, c)])
                return stacked[(slice(None),) * (1 + lead) + (slice(skip, skip + keep),)]

            shape = (outputs, *size, stop - start, out_cols, *trailing)
            columns[index].append(da.from_delayed(dask.delayed(task)(*parts), shape=shape, dtype=dtype))
    joined = {index: da.concatenate(bands, axis=1 + lead) for index, bands in columns.items()}

    def along(axis: int, prefix: tuple[int, ...]) -> Any:
        if axis == lead:
            return joined[prefix]
        return da.concatenate([along(axis + 1, prefix + (i,)) for i in range(img1.numblocks[axis])], axis=1 + axis)

    stacked = along(0, ())
    return tuple(stacked[i] for i in range(outputs))


def _extra(subpixel: str, track: bool) -> int:
    """Real rows beyond a band where the kernel would pad: the ring, the Gram planes and the B-spline prefilter."""
    from napari_gridmip.core.correlation.subsets import GRAM_ROWS, SPLINE_REACH

    return (2 + GRAM_ROWS + SPLINE_REACH) if (track or subpixel == "refine") else 0


def subset_map(img1: Any, img2: Any, window, subset, step, dtype, *, offsets_first: bool = False) -> Any:
    """:func:`napari_gridmip.windowed_pearson` with a subset or a step, for dask stacks (lazy)."""
    from napari_gridmip.core.correlation import subsets

    def run(a, b, c):
        (out,) = subsets.run(a, b, window, subset, step, method="map", track=False, dtype=dtype, centres=c)
        return (out,)

    (out,) = _subset_bands(
        img1, img2, window, subset, step, extra=0, outputs=1, trailing=tuple(window), dtype=dtype, run=run
    )
    return da_moveaxis_offsets_first(out) if offsets_first else out


def da_moveaxis_offsets_first(full_map: Any) -> Any:
    import dask.array as da

    return da.moveaxis(full_map, (-2, -1), (-4, -3))


def subset_displacement(img1: Any, img2: Any, window, subset, step, subpixel: str, dtype) -> tuple:
    """``(dy, dx, peak)`` with a subset or a step, for dask stacks (lazy)."""
    from napari_gridmip.core.correlation import subsets

    def run(a, b, c):
        return subsets.run(a, b, window, subset, step, method=subpixel, track=False, dtype=dtype, centres=c)

    return _subset_bands(
        img1, img2, window, subset, step, extra=_extra(subpixel, False), outputs=3, trailing=(), dtype=dtype, run=run
    )


def track_speckles(reference: Any, sample: Any, window, subset, step, subpixel: str, dtype) -> tuple:
    """The outputs of :func:`napari_gridmip.track_speckles` (in ``subsets.TRACK_OUTPUTS`` order, img1's signs)
    for dask stacks, lazily."""
    from napari_gridmip.core.correlation import subsets

    def run(a, b, c):
        return subsets.run(a, b, window, subset, step, method=subpixel, track=True, dtype=dtype, centres=c)

    return _subset_bands(
        reference, sample, window, subset, step, extra=_extra(subpixel, True), outputs=len(subsets.TRACK_OUTPUTS),
        trailing=(), dtype=dtype, run=run,
    )  # fmt: skip
