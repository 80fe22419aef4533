"""Correlation maps and displacement fields of dask stacks: lazily, row band by row band.

Both stacks are read in row bands with the window's half-size as a halo (``dask.array.overlap``), all K frames and
all columns in one chunk; each task runs the in-memory kernel that the public function hands in on NumPy blocks.
Displacements equal the in-memory ones bit for bit; correlation values agree within 2 ulp (XLA's vectorised loops
round a few values differently with the block's shape; tests/core/test_chunked.py states the tolerance).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import dask
import dask.array as da
import numpy as np

from napari_gridmip.core.correlation._checks import check_dtypes
from napari_gridmip.core.correlation.prefilter import radius, smooth_frames

# the in-memory kernel a public function hands in, its options bound (checked once, by that function): the
# twins here call it on NumPy blocks and import nothing back from the public functions' modules
Kernel = Callable[..., Any]


def _halo_blocks(img1: Any, img2: Any, window: tuple[int, int]) -> tuple[Any, Any, list[tuple[int, ...]]]:
    """Both stacks in row bands (K and the columns whole), the same chunks, and a halo of the window's half-size.

    Returns the overlapped stacks and the output chunks along M and N: the
    outer blocks lose the half-window that has no neighbour.
    """
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


def _checked(a: np.ndarray, b: np.ndarray, dtype: np.dtype) -> None:
    """A block's integers checked against ``dtype``'s exact range: the caller's check skipped the dask stacks,
    whose values are only known here (the same error as for in-memory stacks)."""
    check_dtypes({"img1": a, "img2": b}, dtype)


def windowed_pearson(
    img1: Any, img2: Any, window: tuple[int, int], dtype: np.dtype, kernel: Kernel, *, offsets_first: bool = False
) -> Any:
    """The full map of dask stacks as a dask array ``(..., M - 2m, N - 2n, wm, wn)``
    (``(..., wm, wn, M - 2m, N - 2n)`` with ``offsets_first``); ``kernel(a, b)`` is the in-memory map of two
    blocks."""
    ov1, ov2, (rows, cols) = _halo_blocks(img1, img2, window)
    lead = ov1.ndim - 3

    def block(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        _checked(a, b, dtype)
        return np.asarray(kernel(a, b))

    offsets = ((window[0],), (window[1],))
    if offsets_first:
        chunks, new_axis = (*ov1.chunks[:lead], *offsets, rows, cols), [lead, lead + 1]
    else:
        chunks, new_axis = (*ov1.chunks[:lead], rows, cols, *offsets), [lead + 2, lead + 3]
    return da.map_blocks(block, ov1, ov2, dtype=dtype, chunks=chunks, drop_axis=[lead], new_axis=new_axis)


def find_displacement(img1: Any, img2: Any, window: tuple[int, int], dtype: np.dtype, kernel: Kernel) -> tuple:
    """``(dy, dx, peak)`` of dask stacks, each a dask array ``(..., M - 2m, N - 2n)`` computed block by block;
    ``kernel(a, b)`` is the in-memory ``(dy, dx, peak)`` of two blocks."""
    ov1, ov2, (rows, cols) = _halo_blocks(img1, img2, window)
    lead = ov1.ndim - 3

    def block(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        _checked(a, b, dtype)
        return np.stack([np.asarray(r) for r in kernel(a, b)])

    chunks = ((3,), *ov1.chunks[:lead], rows, cols)
    # one task per block computes all three; each output is a view of the stacked block
    stacked = da.map_blocks(block, ov1, ov2, dtype=dtype, chunks=chunks, drop_axis=[lead], new_axis=[0])
    return stacked[0], stacked[1], stacked[2]


def prefiltered(img: Any, sigma: float, dtype: np.dtype) -> Any:
    """Every frame of a dask stack smoothed by the Gaussian prefilter (``dtype``), block by block with a halo of
    its reach; borders mirrored as in memory (dask's ``"reflect"`` boundary is NumPy's ``"symmetric"``)."""

    def block(b: np.ndarray) -> np.ndarray:
        return np.asarray(smooth_frames(np.asarray(b, dtype), sigma=sigma))

    img = da.asarray(img)
    reach = radius(sigma)
    depth = {axis: (reach if img.shape[axis] > 1 else 0) for axis in range(img.ndim)}
    depth = {axis: (d if axis >= img.ndim - 2 else 0) for axis, d in depth.items()}
    return da.map_overlap(block, img, depth=depth, boundary="reflect", dtype=dtype)


# -- fields (correlation/fields.py): integrate_gradient and strain_field on dask arrays ---------------------
#
# Kept in a section of their own: the correlation maps above are another helper's.


def _whole_images(array: Any) -> Any:
    """``array`` as a dask array whose blocks hold whole images (the last two axes unsplit)."""
    array = da.asarray(array)
    return array.rechunk(array.chunks[:-2] + ((array.shape[-2],), (array.shape[-1],)))


def integrate_gradient(gy: Any, gx: Any, dtype: np.dtype, kernel: Kernel) -> Any:
    """The surface of dask gradients: lazily, one task per block of whole images (a Poisson solve is global);
    ``kernel(a, b)`` is the in-memory surface of a block's gradients."""
    gy = _whole_images(gy)
    gx = _whole_images(gx).rechunk(gy.chunks)

    def block(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.asarray(kernel(a, b))

    return da.map_blocks(block, gy, gx, dtype=dtype, meta=np.empty((0,) * gy.ndim, dtype))


def strain_field(dy: Any, dx: Any, window: tuple[int, int], dtype: np.dtype, kernel: Kernel) -> tuple:
    """``(exx, eyy, exy)`` of dask displacements: lazily, block by block with the half-window as a halo;
    ``kernel(a, b)`` is the in-memory ``(exx, eyy, exy)`` of a block's displacements for that ``window``.

    The blocks' outer edges are the image's (``boundary="none"``): the kernel treats what lies
    beyond a block as outside the image, which is right there and, inside, covered by the halo.
    """
    half = (window[0] // 2, window[1] // 2)
    dy = da.asarray(dy)
    chunks = list(dy.chunks)
    for axis, h in zip((-2, -1), half):
        chunks[axis] = _at_least(dy.shape[axis], chunks[axis], h + 1)
    dy = dy.rechunk(tuple(chunks))
    dx = da.asarray(dx).rechunk(dy.chunks)

    def block(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.stack([np.asarray(part) for part in kernel(a, b)])

    depth = {dy.ndim - 2: half[0], dy.ndim - 1: half[1]}
    ov_y = da.overlap.overlap(dy, depth=depth, boundary="none")
    ov_x = da.overlap.overlap(dx, depth=depth, boundary="none")
    stacked = da.map_blocks(block, ov_y, ov_x, dtype=dtype, new_axis=[0], chunks=((3,), *ov_y.chunks))
    trimmed = da.overlap.trim_internal(stacked, {0: 0, **{k + 1: v for k, v in depth.items()}}, boundary="none")
    return trimmed[0], trimmed[1], trimmed[2]


# -- timeseries (correlation/timeseries.py): the local correlation image of a dask movie -------------------


def local_correlation_image(
    movie: Any,
    offsets: tuple,
    dtype: np.dtype,
    chunk_frames: int | None,
    progress: Any,
    *,
    default_frames: int,
    largest: int,
    moments_of: Kernel,
    image_of: Kernel,
) -> Any:
    """The local correlation image of a dask movie ``(..., T, Y, X)``, lazily.

    One task per chunk of frames (whole images, the batch axes one item at a time) computes its
    float64 moments relative to the movie's first frame; dask's tree sum merges them and a last
    task turns them into the image. Memory: a few chunks and a few images of sums.

    The caller's kernels: ``moments_of(chunk, first, frames)``, the moments of a chunk ``(1, n, Y, X)``
    minus the first frame ``(1, Y, X)``, padded to ``frames``, with a ``packed()`` ``(2 + offsets, 1, Y,
    X)`` float64 to sum; ``image_of(packed, T)``, the ``(1, Y, X)`` image of the summed ones. The movie's
    own chunks along T are kept unless one item's exceed ``largest`` bytes of ``dtype`` (then
    ``default_frames`` each), or ``chunk_frames`` is given.
    """
    movie = da.asarray(movie)
    lead = movie.ndim - 3
    frames_total, rows, cols = movie.shape[-3:]
    t_chunks: Any = movie.chunks[-3]
    if chunk_frames is not None:
        t_chunks = min(chunk_frames, frames_total)
    elif max(t_chunks) * rows * cols * dtype.itemsize > largest:  # one item's frames
        t_chunks = min(default_frames, frames_total)
    movie = movie.rechunk(tuple((1,) * n for n in movie.shape[:lead]) + (t_chunks, (rows,), (cols,)))
    frames = max(movie.chunks[-3])
    reference = movie[..., 0, :, :]
    n_parts = 2 + len(offsets)
    total = len(movie.chunks[-3])
    lock = threading.Lock()
    finished = [0]

    def block(chunk: np.ndarray, first: np.ndarray) -> np.ndarray:
        count = chunk.shape[-3]
        sums = moments_of(chunk.reshape(1, count, rows, cols), first.reshape(1, rows, cols), frames)
        if progress is not None:
            with lock:
                finished[0] += 1
                done = finished[0]
            progress(done, total)
        return sums.packed().reshape((n_parts,) + (1,) * lead + (1, rows, cols))

    index = tuple(f"b{k}" for k in range(lead))
    parts = da.blockwise(
        block,
        ("p", *index, "t", "y", "x"),
        movie,
        (*index, "t", "y", "x"),
        reference,
        (*index, "y", "x"),
        new_axes={"p": n_parts},
        adjust_chunks={"t": 1},
        dtype=np.float64,
        meta=np.empty((0,) * (movie.ndim + 1)),
    )
    summed = parts.sum(axis=1 + lead)  # (parts, ..., Y, X), a tree reduction over the chunks

    def image(packed: np.ndarray) -> np.ndarray:
        flat = packed.reshape(n_parts, 1, rows, cols)
        return image_of(flat, frames_total).reshape(packed.shape[1:]).astype(dtype)

    return da.map_blocks(image, summed, dtype=dtype, drop_axis=[0], chunks=summed.chunks[1:])


# -- subsets, steps and speckle tracking (core/correlation/subsets.py, tracking.py) ----------------------
#
# Row bands of the output, each one task: the stacks' rows that the band's vectors use (the window plus the
# subset, less one, as the halo) plus a few more real rows where the in-memory kernel would pad img1 (the
# ring of offsets and the Gram planes of the refinement), aligned to the step; the extra output rows are
# trimmed. All K frames and columns whole. Every band subtracts the same means (the whole stacks', a lazy
# reduction), as the in-memory call does. The kernel is ``subsets.run`` with the call's options bound, handed
# in as ``kernel(block1, block2, centres=...)``, and ``reach`` the rows it pads img1 by where it refines.

SUBSET_BAND_ROWS = 256  # output rows per band when the input's own row chunks say nothing better


def _means(img: Any) -> Any:
    """Each batch item's mean over its finite values, lazily: a dask array of the batch shape."""
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


def _extra(subpixel: str, track: bool, prefilter: float, reach: int) -> int:
    """Real rows beyond a band where the kernel would pad: ``reach`` (the ring, the Gram planes and the B-spline
    prefilter) where it refines, and beyond those the Gaussian prefilter's reach (the rows they read must be
    filtered as in the whole image)."""
    return (reach if (track or subpixel == "refine") else 0) + radius(prefilter)


def subset_map(
    img1: Any, img2: Any, window, subset, step, dtype, kernel: Kernel, *, offsets_first: bool = False
) -> Any:
    """:func:`napari_gridmip.windowed_pearson` with a subset or a step, for dask stacks (lazy)."""

    def run(a, b, c):
        (out,) = kernel(a, b, centres=c)
        return (out,)

    (out,) = _subset_bands(
        img1, img2, window, subset, step, extra=0, outputs=1, trailing=tuple(window), dtype=dtype, run=run
    )
    return da_moveaxis_offsets_first(out) if offsets_first else out


def da_moveaxis_offsets_first(full_map: Any) -> Any:
    return da.moveaxis(full_map, (-2, -1), (-4, -3))


def subset_displacement(
    img1: Any, img2: Any, window, subset, step, subpixel: str, dtype, kernel: Kernel, *, prefilter: float = 0.0,
    shape="translation", reach: int,
) -> tuple:  # fmt: skip
    """``(dy, dx, peak)`` with a subset or a step (and the four gradients for ``shape="affine"``), for dask stacks
    (lazy)."""

    def run(a, b, c):
        return kernel(a, b, centres=c)

    # an affine subset's warped pixels reach past its box by its gradients times its half-size: 4 px allows 0.25
    extra = _extra(subpixel, False, prefilter, reach) + (4 if shape == "affine" else 0)
    outputs = 7 if shape == "affine" else 3
    return _subset_bands(
        img1, img2, window, subset, step, extra=extra, outputs=outputs, trailing=(), dtype=dtype, run=run
    )


def track_speckles(
    reference: Any, sample: Any, window, subset, step, subpixel: str, dtype, kernel: Kernel, *,
    prefilter: float = 0.0, reach: int, outputs: int,
) -> tuple:  # fmt: skip
    """The ``outputs`` outputs of :func:`napari_gridmip.track_speckles` (in ``tracking.TRACK_OUTPUTS`` order,
    img1's signs) for dask stacks, lazily."""

    def run(a, b, c):
        return kernel(a, b, centres=c)

    return _subset_bands(
        reference, sample, window, subset, step, extra=_extra(subpixel, True, prefilter, reach),
        outputs=outputs, trailing=(), dtype=dtype, run=run,
    )  # fmt: skip
