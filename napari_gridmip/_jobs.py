"""Qt-free jobs: what each widget computes, as plain data and functions.

The model of the widget layer, in the manner of napari-animation's ``Animation``:

1. On the GUI thread a widget captures a *request*: the arrays (never read
   there), the input layer's transform (:class:`~napari_gridmip._placement.Frame`),
   the names and the parameters. Capturing reads layers; nothing later does.
2. ``make_*_job(request)`` turns it into a :class:`Job`: a description and a
   callable ``run(progress) -> JobResult``, which the widget's runner calls in a
   napari thread worker. JAX runs only there.
3. The :class:`JobResult` holds napari layer-data tuples, in the order they are
   added (bottom first), and a one-line summary. The runner adds the layers on
   the GUI thread, all or none.

``progress(done, total)`` may raise (the runner's Cancel does), which stops a
job between steps; every job reports several steps.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from napari_gridmip._placement import Frame, derived_placement

ProgressCallback = Callable[[int, int], None]
LayerDataTuple = tuple[Any, dict, str]

MAX_BLOCKS = 4096  # the default level shown is the finest with at most this many occupied cells
EAGER_MAP_BYTES = 512 * 2**20  # larger full correlation maps go to a temporary Zarr store, band by band
MAP_BAND_ROWS = 64  # output rows per band of a full map written to disk
OCCUPANCY_COLOR = "cyan"


@dataclass(frozen=True)
class JobResult:
    """What a job hands back: layers to add (bottom first), a one-line summary and extra values for the widget."""

    layers: list[LayerDataTuple]
    summary: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Job:
    """A description for the status line and activity dock, and the work itself."""

    description: str
    run: Callable[[ProgressCallback], JobResult]


# -- JAX set-up, run in the worker -------------------------------------------------------


def prepare_jax() -> str:
    """Turn on JAX's persistent compilation cache (unless the user chose one) and name the device.

    Runs in a worker before the first job: compiled programs then survive
    napari restarts, so a second session skips the compile (docs/benchmarks.md,
    "Compile once"). Returns e.g. ``'JAX device: cpu (cpu, 1 available)'``.
    """
    import jax

    if not os.environ.get("JAX_COMPILATION_CACHE_DIR") and not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", str(compile_cache_dir()))
        # JAX caches only programs that took over 1 s to compile by default; ours take 0.1-1 s each,
        # and a first run compiles several (bench_first_run.py)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.05)
    device = jax.devices()[0]
    return f"JAX device: {device.platform} ({device.device_kind}, {len(jax.devices())} available)"


def compile_cache_dir() -> os.PathLike:
    """Per-user cache folder for compiled programs (``NAPARI_GRIDMIP_CACHE_DIR`` overrides it)."""
    from pathlib import Path

    override = os.environ.get("NAPARI_GRIDMIP_CACHE_DIR")
    if override:
        return Path(override) / "jax"
    import platformdirs

    return Path(platformdirs.user_cache_dir("napari-gridmip")) / "jax"


# -- occupancy mipmap ---------------------------------------------------------------------


@dataclass(frozen=True)
class MipmapRequest:
    """The inputs of an occupancy-mipmap run, captured on the GUI thread.

    ``data`` is the volume ``(..., Z, Y, X)``: one time point of a 4D+ layer
    (then ``frame`` is the layer's transform restricted to its last three
    axes), or all of them (one pyramid per leading index).
    """

    name: str
    data: Any
    frame: Frame
    threshold: float
    per_level: bool = False


def level_placement(frame: Frame, level: int) -> dict[str, Any]:
    """Placement of mipmap level ``level``: each voxel covers a ``2**level`` block of the input's last three
    axes; leading (time, channel) axes keep their steps."""
    factor = 2**level
    lead = frame.ndim - 3
    return derived_placement(frame, step=[1] * lead + [factor] * 3, offset=[0] * lead + [(factor - 1) / 2] * 3)


def default_level(counts: Sequence[int], max_blocks: int = MAX_BLOCKS) -> int:
    """The finest level above 0 with at most ``max_blocks`` occupied cells (level 0 is the data itself)."""
    for k in range(1, len(counts)):
        if counts[k] <= max_blocks:
            return k
    return len(counts) - 1


def as_labels(level: Any) -> Any:
    """A bool level as Labels data (uint8): a view in memory, a lazy cast for a dask level."""
    return level.view(np.uint8) if isinstance(level, np.ndarray) else level.astype(np.uint8)


def occupancy_layer(name: str, level_data: Any, frame: Frame, level: int) -> LayerDataTuple:
    """The Labels layer that shows one level's occupied cells as translucent blocks."""
    colormap = {None: "transparent", 0: "transparent", 1: OCCUPANCY_COLOR}  # napari: a direct label colormap
    meta = {
        "name": f"{name} occupancy",
        "opacity": 0.45,
        "colormap": colormap,
        "metadata": {"gridmip_level": level},
        **level_placement(frame, level),
    }
    return as_labels(level_data), meta, "labels"


def make_mipmap_job(request: MipmapRequest) -> Job:
    """The levels (in memory or block by block), the Labels layer of the default level, and per-level images
    if asked."""
    _validate_volume(request.name, request.data)

    def run(progress: ProgressCallback) -> JobResult:
        if is_lazy(request.data):
            levels, counts = _lazy_levels(request, progress)
        else:
            levels, counts = _levels_in_memory(request, progress)
        shown = default_level(counts)
        layers: list[LayerDataTuple] = []
        if request.per_level:
            common = {"contrast_limits": (0, 1), "colormap": "gray", "blending": "additive", "visible": False}
            layers += [
                (
                    level,
                    {"name": f"{request.name} mipmap level {k}", **common, **level_placement(request.frame, k)},
                    "image",
                )
                for k, level in enumerate(levels)
            ]
        layers.append(occupancy_layer(request.name, levels[shown], request.frame, shown))
        summary = mipmap_summary(levels, counts, shown)
        return JobResult(layers, summary, {"levels": levels, "counts": counts, "level": shown, "frame": request.frame})

    return Job(f"Occupancy mipmap of {request.name!r}", run)


def is_lazy(data: Any) -> bool:
    """A dask or Zarr array (napari's lazy layers): read block by block, never whole."""
    return not isinstance(data, np.ndarray) and hasattr(data, "chunks") and not hasattr(data, "device")


def _levels_in_memory(request: MipmapRequest, progress: ProgressCallback) -> tuple[list, list[int]]:
    """Threshold and reduce on the device; then fetch and count each level (one progress step each)."""
    from napari_gridmip.core import mipmap_shapes, occupancy_mipmap

    total = len(mipmap_shapes(tuple(request.data.shape[-3:]))) + 1
    progress(0, total)
    device_levels = occupancy_mipmap(np.asarray(request.data), threshold=request.threshold)
    levels, counts = [], []
    for k, level in enumerate(device_levels):
        progress(k + 1, total)
        levels.append(np.asarray(level))  # views of JAX's buffers on the CPU
        counts.append(int(np.count_nonzero(levels[-1])))
    progress(total, total)
    return levels, counts


def _lazy_levels(request: MipmapRequest, progress: ProgressCallback) -> tuple[list, list[int]]:
    """A dask/Zarr volume, block by block: levels 1 and up in memory (an eighth of the voxels, and less), level 0
    left lazy as a NumPy-only threshold (napari reads its slices without JAX), and one progress step per task.

    Memory stays at a few 2**7-voxel blocks plus the coarse levels; Cancel stops between tasks.
    """
    import dask
    import dask.array as da

    from napari_gridmip.core import occupancy_mipmap
    from napari_gridmip.core.mipmap import threshold_block

    volume = _as_dask(request.data)
    levels = occupancy_mipmap(volume, threshold=request.threshold)
    wanted = [*levels[1:], *(da.count_nonzero(level) for level in levels)]
    with _DaskProgress(progress):
        computed = dask.compute(*wanted, scheduler="threads")
    coarse, counts = list(computed[: len(levels) - 1]), [int(c) for c in computed[len(levels) - 1 :]]
    level0 = volume.map_blocks(threshold_block, request.threshold, dtype=bool)
    return [level0, *coarse], counts


def _as_dask(data: Any) -> Any:
    """A dask view of a dask or Zarr array (its stored chunks), or of a NumPy array beside one."""
    import dask.array as da

    if hasattr(data, "dask"):
        return data
    return da.from_array(data, chunks=getattr(data, "chunks", "auto"))


class _DaskProgress:
    """Reports each finished dask task as ``progress(done, total)``; an exception from it stops the compute."""

    def __init__(self, progress: ProgressCallback) -> None:
        from dask.callbacks import Callback

        outer = self

        class _Callback(Callback):
            def _start_state(self, dsk: Any, state: Any) -> None:
                outer.total = len(state["ready"]) + len(state["waiting"]) + len(state["running"])
                outer.done = 0
                progress(0, outer.total)

            def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
                outer.done += 1
                progress(outer.done, outer.total)

        self.total = self.done = 0
        self._callback = _Callback()

    def __enter__(self) -> _DaskProgress:
        self._callback.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._callback.__exit__(*exc)


def mipmap_summary(levels: Sequence[np.ndarray], counts: Sequence[int], shown: int) -> str:
    """E.g. ``'level 3 (20, 18, 17): 412 of 6120 cells occupied (6.7%)'``."""
    level = levels[shown]
    return (
        f"level {shown} {tuple(level.shape)}: {counts[shown]} of {level.size} cells occupied "
        f"({100 * counts[shown] / level.size:.3g}%)"
    )


def _validate_volume(name: str, data: Any) -> None:
    if len(data.shape) < 3:
        raise ValueError(f"layer {name!r} must be 3D, or a 4D+ stack of volumes; got shape {tuple(data.shape)}")


# -- patches ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MergeRequest:
    """The inputs of a merge: the patch stack reshaped to the grid-first layout, and the tiling."""

    name: str
    patches: Any  # (g_1, ..., g_d, *leading, p_1, ..., p_d), a view of the layer's data
    image_shape: tuple[int, ...]
    stride: tuple[int, ...]
    blend: str
    frame: Frame
    placement_axes: tuple[int, ...]  # the patch layer's axes that the merged image keeps, in order


def infer_image_shape(grid: tuple[int, ...], lead: tuple[int, ...], patch: tuple[int, ...], stride: tuple[int, ...]):
    """The smallest image the grid covers with no flush patch: ``(g - 1) * s + p`` per tiled axis."""
    return lead + tuple((g - 1) * s + p for g, p, s in zip(grid, patch, stride))


def is_colour(image_shape: Sequence[int], tiled_axes: int) -> bool:
    """A merged 2D picture with a leading axis of 3 or 4 channels (RGB or RGBA)."""
    return tiled_axes == 2 and len(image_shape) == 3 and image_shape[0] in (3, 4)


def make_merge_job(request: MergeRequest) -> Job:
    d = len(request.stride)

    def run(progress: ProgressCallback) -> JobResult:
        from napari_gridmip.core import merge_patches

        if is_lazy(request.patches):  # output chunk by output chunk, one progress step per task
            import dask

            patches = _as_dask(request.patches)
            lazy = merge_patches(patches, request.image_shape, request.stride, blend=request.blend)
            with _DaskProgress(progress):
                (merged,) = dask.compute(lazy, scheduler="threads")
        else:
            progress(0, 3)
            patches = np.asarray(request.patches)
            progress(1, 3)
            merged = merge_patches(patches, request.image_shape, request.stride, blend=request.blend)
            progress(2, 3)
            merged = np.asarray(merged)
            progress(3, 3)
        meta: dict[str, Any] = {"name": f"{request.name} merged"}
        if is_colour(request.image_shape, d):
            # channels last with rgb=True: a colour picture, placed by its two pixel axes
            merged = np.moveaxis(merged, 0, -1)
            meta.update(derived_placement(request.frame, axes=request.placement_axes[1:]), rgb=True)
            meta["contrast_limits"] = _rgb_limits(patches.dtype, merged)
        else:
            meta.update(derived_placement(request.frame, axes=request.placement_axes))
        summary = f"merged {patches.shape} into {tuple(request.image_shape)} ({request.blend})"
        return JobResult([(merged, meta, "image")], summary)

    return Job(f"Reassembling {request.name!r} ({request.blend})", run)


def _rgb_limits(source_dtype: np.dtype, merged: np.ndarray) -> tuple[float, float]:
    """Integer pictures keep their dtype's full range (a blended uint8 image is float 0..255)."""
    if np.issubdtype(source_dtype, np.integer):
        info = np.iinfo(source_dtype)
        return float(max(info.min, 0)), float(info.max)
    finite = merged[np.isfinite(merged)]
    return (
        (0.0, 1.0)
        if finite.size == 0 or (finite.min() >= 0 and finite.max() <= 1)
        else (
            float(finite.min()),
            float(finite.max()),
        )
    )


# -- correlation ------------------------------------------------------------------------


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
            img1, img2 = _as_dask(request.data1), _as_dask(request.data2)
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
            with _DaskProgress(search_progress):
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
        with _DaskProgress(progress):
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
