"""The correlation job: the displacement field between two stacks, its layers, and the full map on request."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from napari_gridmip._jobs import DaskProgress, Job, JobResult, LayerDataTuple, ProgressCallback, as_dask, is_lazy
from napari_gridmip._placement import Frame, derived_placement

EAGER_MAP_BYTES = 512 * 2**20  # larger full correlation maps go to a temporary Zarr store, band by band
MAP_BAND_ROWS = 64  # output rows per band of a full map written to disk


@dataclass(frozen=True)
class CorrelationRequest:
    """Two (..., K, M, N) stacks, the window and the output options, captured on the GUI thread."""

    name1: str
    name2: str
    data1: Any
    data2: Any
    frame: Frame  # img2's transform: the results are placed on img2's pixels
    window: tuple[int, int]
    subpixel: str = "hessian"
    dtype: str = "float32"
    spacing: int = 8
    vector_scale: float = 0.0  # 0: automatic, so that the median displacement spans most of a grid cell
    full_map: bool = False
    map_dir: str | None = None  # where a large full map is written (default: a new temporary folder)


def output_placement(frame: Frame, window: tuple[int, int]) -> dict[str, Any]:
    """Placement of an ``(..., M - 2m, N - 2n)`` result: output pixel (i, j) is img2's pixel (i + m, j + n)."""
    ndim = frame.ndim
    axes = [a for a in range(ndim) if a != ndim - 3]  # every axis but K
    offset = [0.0] * (len(axes) - 2) + [window[0] // 2, window[1] // 2]
    return derived_placement(frame, axes=axes, offset=offset)


def displacement_vectors(dy: np.ndarray, dx: np.ndarray, window: tuple[int, int], spacing: int) -> np.ndarray:
    """napari Vectors data ``(P, 2, 2)`` on a grid of every ``spacing``-th output pixel, in img2's pixels.

    Positions are img2 pixel coordinates ``(i + m, j + n)``; NaN displacements are left out.
    """
    m, n = window[0] // 2, window[1] // 2
    i, j = np.meshgrid(np.arange(0, dy.shape[0], spacing), np.arange(0, dy.shape[1], spacing), indexing="ij")
    vy, vx = dy[i, j], dx[i, j]
    keep = np.isfinite(vy) & np.isfinite(vx)
    positions = np.stack([i[keep] + m, j[keep] + n], axis=-1).astype(np.float32)
    return np.stack([positions, np.stack([vy[keep], vx[keep]], axis=-1)], axis=1)


def auto_vector_length(dy: np.ndarray, dx: np.ndarray, spacing: int) -> float:
    """A length multiplier that draws the median displacement at 80% of the grid spacing."""
    magnitude = np.hypot(dy, dx)
    median = float(np.nanmedian(magnitude)) if np.isfinite(magnitude).any() else 0.0
    return 0.8 * spacing / median if median > 0 else 1.0


def symmetric_limits(values: np.ndarray) -> tuple[float, float]:
    """Contrast limits ``(-c, c)`` with ``c`` the 99th percentile of ``|values|`` (ignoring NaN)."""
    finite = np.abs(values[np.isfinite(values)])
    c = float(np.percentile(finite, 99)) if finite.size else 0.0
    c = c if c > 0 else 1.0
    return -c, c


def correlation_summary(dy: np.ndarray, dx: np.ndarray) -> str:
    """E.g. ``'median |d| 1.42 px; 3.1% NaN (peak on the window edge)'``."""
    magnitude = np.hypot(dy, dx)
    nan_share = 100 * float(np.mean(~np.isfinite(magnitude))) if magnitude.size else 0.0
    median = float(np.nanmedian(magnitude)) if np.isfinite(magnitude).any() else float("nan")
    return f"median |d| {median:.3g} px; {nan_share:.2g}% NaN (peak on the window edge)"


def make_correlation_job(request: CorrelationRequest) -> Job:
    window = request.window

    def run(progress: ProgressCallback) -> JobResult:
        from napari_gridmip.core import find_displacement

        lazy = is_lazy(request.data1) or is_lazy(request.data2)
        if lazy:  # row band by row band, with a halo: the stacks are never loaded whole
            img1, img2 = as_dask(request.data1), as_dask(request.data2)
        else:
            img1, img2 = np.asarray(request.data1), np.asarray(request.data2)
        search_steps = 100
        with_map = request.full_map
        total = 2 * search_steps if with_map else search_steps

        def search_progress(done: int, steps: int) -> None:
            progress(round(search_steps * done / max(steps, 1)), total)

        if lazy:
            import dask

            fields = find_displacement(img1, img2, window, subpixel=request.subpixel, dtype=request.dtype)
            with DaskProgress(search_progress):
                dy, dx, peak = dask.compute(*fields, scheduler="threads")
        else:
            fields = find_displacement(
                img1, img2, window, subpixel=request.subpixel, dtype=request.dtype, progress=search_progress
            )
            dy, dx, peak = (np.asarray(r) for r in fields)
        full = None
        if with_map:

            def map_progress(done: int, steps: int) -> None:
                progress(search_steps + round(search_steps * done / max(steps, 1)), total)

            full = full_map(img1, img2, window, request.dtype, progress=map_progress, map_dir=request.map_dir)
        return JobResult(_correlation_layers(request, dy, dx, peak, full), correlation_summary(dy, dx))

    return Job(f"Correlating {request.name1!r} with {request.name2!r}", run)


def _correlation_layers(request: CorrelationRequest, dy, dx, peak, full) -> list[LayerDataTuple]:
    """Bottom to top: peak (hidden), dx (hidden), dy, the 4D map, the vectors."""
    name, window = request.name2, request.window
    placement = output_placement(request.frame, window)
    limits = symmetric_limits(np.concatenate([dy.ravel(), dx.ravel()]))
    diverging = {"colormap": "coolwarm", "contrast_limits": limits, **placement}
    layers: list[LayerDataTuple] = [
        (
            peak,
            {"name": f"{name} peak", "colormap": "viridis", "contrast_limits": (0, 1), "visible": False, **placement},
            "image",
        ),
        (dx, {"name": f"{name} dx", "visible": False, **diverging}, "image"),
        (dy, {"name": f"{name} dy", **diverging}, "image"),
    ]
    if full is not None:
        m, n = window[0] // 2, window[1] // 2
        # axes (..., wm, wn, M - 2m, N - 2n): the offsets get unit steps from -m and -n
        scale = np.concatenate([placement["scale"][:-2], [1.0, 1.0], placement["scale"][-2:]])
        translate = np.concatenate([placement["translate"][:-2], [-m, -n], placement["translate"][-2:]])
        meta = {"name": f"{name} correlation map", "scale": scale, "translate": translate}
        layers.append((full, {**meta, "contrast_limits": (-1, 1), "colormap": "magma", "opacity": 0.8}, "image"))
    if dy.ndim == 2:
        length = request.vector_scale or auto_vector_length(dy, dx, request.spacing)
        vectors = displacement_vectors(dy, dx, window, request.spacing)
        vector_placement = derived_placement(request.frame, axes=[request.frame.ndim - 2, request.frame.ndim - 1])
        meta = {
            "name": f"{name} displacement",
            "edge_color": "black",
            "edge_width": max(0.15 * request.spacing, 0.5),
            "length": length,
            "metadata": {"gridmip_auto_length": length},
            **vector_placement,
        }
        layers.append((vectors, meta, "vectors"))
    return layers


def full_map(
    img1: np.ndarray,
    img2: np.ndarray,
    window: tuple[int, int],
    dtype: str,
    *,
    progress: ProgressCallback,
    map_dir: str | None = None,
) -> Any:
    """The full map, offsets first ``(..., wm, wn, M - 2m, N - 2n)``, computed here in the worker.

    Up to ``EAGER_MAP_BYTES`` it is a NumPy array. A larger one is written band
    by band into a Zarr store (in ``map_dir``, default a new temporary folder)
    and returned as a lazy dask array over it: napari then only reads the
    file, and no JAX work ever happens on the GUI thread.
    """
    from napari_gridmip.core import windowed_pearson

    m, n = window[0] // 2, window[1] // 2
    rows, cols = img1.shape[-2] - 2 * m, img1.shape[-1] - 2 * n
    lead = img1.shape[:-3]
    nbytes = np.dtype(dtype).itemsize * math.prod(lead) * window[0] * window[1] * rows * cols
    if hasattr(img1, "dask"):  # lazy stacks: band by band into the store, one progress step per task
        import dask.array as da

        graph = windowed_pearson(img1, img2, window, dtype=dtype, offsets_first=True)
        path = os.path.join(map_dir or _temporary_folder(), "map.zarr")
        with DaskProgress(progress):
            graph.to_zarr(path, overwrite=True)
        return da.from_zarr(path)
    if nbytes <= EAGER_MAP_BYTES:
        return np.asarray(windowed_pearson(img1, img2, window, dtype=dtype, offsets_first=True, progress=progress))
    import dask.array as da
    import zarr

    folder = map_dir or _temporary_folder()
    shape = (*lead, *window, rows, cols)
    chunks = (*([1] * len(lead)), 1, 1, min(MAP_BAND_ROWS, rows), cols)
    store = zarr.open_array(os.path.join(folder, "map.zarr"), mode="w", shape=shape, chunks=chunks, dtype=dtype)
    starts = list(range(0, rows, MAP_BAND_ROWS))
    for done, start in enumerate(starts):
        progress(done, len(starts))
        stop = min(start + MAP_BAND_ROWS, rows)
        rows_in = slice(start, stop + 2 * m)
        band = windowed_pearson(img1[..., rows_in, :], img2[..., rows_in, :], window, dtype=dtype, offsets_first=True)
        store[..., start:stop, :] = np.asarray(band)
    progress(len(starts), len(starts))
    return da.from_zarr(store)


def _temporary_folder() -> str:
    """A folder removed when the Python process exits."""
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="napari-gridmip-map-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder
