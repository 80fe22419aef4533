"""The correlation job: the displacement field between two stacks, its layers, and the full map on request."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from napari_gridmip._jobs import (
    DaskProgress,
    Job,
    JobResult,
    LayerDataTuple,
    Output,
    ProgressCallback,
    as_dask,
    is_lazy,
    layer_tuples,
)
from napari_gridmip._placement import Frame, derived_placement
from napari_gridmip._provenance import Call, Source

WIDGET = "correlation"

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


def correlation_calls(request: CorrelationRequest) -> tuple[list[Source], list[Call]]:
    """What the job computes, as public calls: the displacement field, and the full map if asked."""
    sources = [Source("img1", layer=request.name1), Source("img2", layer=request.name2)]
    options = {"subpixel": request.subpixel, "dtype": request.dtype}
    calls = [Call("find_displacement", ("img1", "img2"), (tuple(request.window),), options, result="dy, dx, peak")]
    if request.full_map:
        kwargs = {"dtype": request.dtype, "offsets_first": True}
        calls.append(Call("windowed_pearson", ("img1", "img2"), (tuple(request.window),), kwargs, result="planes"))
    return sources, calls


def map_for_display(planes: Any, batch: int) -> tuple[Any, str]:
    """The offsets-first map ``(*batch, wm, wn, M', N')`` as ``(wm, wn, *batch, 1, M', N')``, and that as code.

    The offsets come first, so their sliders are the map's own, and a length-1 axis stands where the
    inputs have K, so that no slider of the map moves with the inputs' frame slider (napari lines axes
    up from the last one). A view of NumPy or dask data.
    """
    if batch == 0:
        return planes[:, :, None], "planes[:, :, None]"
    moved = np.moveaxis(planes, (batch, batch + 1), (0, 1))[..., None, :, :]
    return moved, f"np.moveaxis(planes, ({batch}, {batch + 1}), (0, 1))[..., None, :, :]"


def _correlation_layers(request: CorrelationRequest, dy, dx, peak, full) -> list[LayerDataTuple]:
    """Bottom to top: peak (hidden), dx (hidden), dy, the 4D map, the vectors."""
    name, window = request.name2, request.window
    placement = output_placement(request.frame, window)
    limits = symmetric_limits(np.concatenate([dy.ravel(), dx.ravel()]))
    diverging = {"colormap": "coolwarm", "contrast_limits": limits, **placement}
    peak_style = {"colormap": "viridis", "contrast_limits": (0, 1), "visible": False}
    outputs = [
        Output(peak, {"name": f"{name} peak", **peak_style, **placement}, "image", "peak", "peak"),
        Output(dx, {"name": f"{name} dx", "visible": False, **diverging}, "image", "dx", "dx"),
        Output(dy, {"name": f"{name} dy", **diverging}, "image", "dy", "dy"),
    ]
    if full is not None:
        m, n = window[0] // 2, window[1] // 2
        batch = dy.ndim - 2
        frame = request.frame
        k_axis = frame.ndim - 3
        frames = request.data2.shape[k_axis]
        # (wm, wn, *batch, 1, M', N'): the offsets in unit steps from -m and -n; the length-1 K axis spans
        # the inputs' K range, whatever frame their slider shows
        k_scale = frames * frame.scale[k_axis]
        k_translate = frame.translate[k_axis] + (frames - 1) / 2 * frame.scale[k_axis]
        scale = np.concatenate([[1.0, 1.0], placement["scale"][:-2], [k_scale], placement["scale"][-2:]])
        translate = np.concatenate([[-m, -n], placement["translate"][:-2], [k_translate], placement["translate"][-2:]])
        labels = frame.axis_labels or tuple(str(i) for i in range(-frame.ndim, 0))
        meta = {
            "name": f"{name} correlation map",
            "scale": scale,
            "translate": translate,
            "axis_labels": ("row offset", "column offset", *labels),
            "contrast_limits": (-1, 1),
            "colormap": "magma",
            "opacity": 0.8,
        }
        shown, expression = map_for_display(full, batch)
        outputs.append(Output(shown, meta, "image", "map", expression))
    if dy.ndim == 2:
        from napari_gridmip.core import displacement_vectors

        length = request.vector_scale or auto_vector_length(dy, dx, request.spacing)
        origin = (window[0] // 2, window[1] // 2)
        vectors = displacement_vectors(dy, dx, spacing=request.spacing, origin=origin)
        vector_placement = derived_placement(request.frame, axes=[request.frame.ndim - 2, request.frame.ndim - 1])
        meta = {
            "name": f"{name} displacement",
            "edge_color": "black",
            "edge_width": max(0.15 * request.spacing, 0.5),
            "length": length,
            "metadata": {"gridmip_auto_length": length},
            **vector_placement,
        }
        expression = f"gm.displacement_vectors(dy, dx, spacing={request.spacing}, origin={origin})"
        outputs.append(Output(vectors, meta, "vectors", "vectors", expression))
    sources, calls = correlation_calls(request)
    return layer_tuples(outputs, widget=WIDGET, sources=sources, calls=calls)


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
