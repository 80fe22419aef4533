"""The correlation jobs: the displacement field between two stacks or images (dense, or with a subset and a
step), the outputs derived from it (transmission, dark-field, phase, strain, uncertainty), the full map on
request; the local correlation image of a movie; and one pixel's correlation surface."""

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
    subset: tuple[int, int] = (1, 1)
    step: int = 1
    outputs: tuple[str, ...] = ()  # of OUTPUTS: tracking outputs make the field track_speckles'
    frame1: Frame | None = None  # img1's transform: tracking results are placed on img1's pixels
    index: str = ""  # applied to both arrays: "[None]" makes two 2D images stacks of one frame
    strain_window: int = 11  # odd, in output pixels
    physics: tuple[float, float, float] | None = None  # (pixel_size, distance, wavelength) in metres: phase in rad

    @property
    def tracking(self) -> bool:
        """Whether the field comes from :func:`~napari_gridmip.track_speckles` (on img1's grid)."""
        return any(name in TRACKING_OUTPUTS for name in self.outputs)

    @property
    def grid_name(self) -> str:
        """The layer whose pixels the results sit on (their names start with it)."""
        return self.name1 if self.tracking else self.name2

    @property
    def grid_frame(self) -> Frame:
        return (self.frame1 or self.frame) if self.tracking else self.frame


# the outputs beyond dy, dx, peak and the vectors, in the widget's order: name -> its layers' roles
OUTPUTS = {
    "transmission": ("transmission",),
    "dark_field": ("dark_field",),
    "phase": ("phase",),
    "strain": ("exx", "eyy", "exy"),
    "uncertainty": ("sigma_dy", "sigma_dx"),
}
TRACKING_OUTPUTS = ("transmission", "dark_field", "uncertainty")  # parts of track_speckles' result


def output_placement(
    frame: Frame, window: tuple[int, int], *, subset: tuple[int, int] = (1, 1), step: int = 1, frames_axis: bool = True
) -> dict[str, Any]:
    """Placement of a result: output pixel (i, j) is the input's pixel ``(i s + m + hs, j s + n + hw)``.

    ``frames_axis``: the input layer has the K axis (third from last), which the result drops; a 2D image
    (one frame) has none. With a step ``s`` each output pixel covers ``s`` input pixels along each axis.
    """
    ndim = frame.ndim
    axes = [a for a in range(ndim) if a != ndim - 3] if frames_axis else list(range(ndim))
    lead = len(axes) - 2
    offset = [0.0] * lead + [window[0] // 2 + subset[0] // 2, window[1] // 2 + subset[1] // 2]
    return derived_placement(frame, axes=axes, step=[1.0] * lead + [step, step], offset=offset)


def percentile_limits(values: np.ndarray, low: float = 1.0, high: float = 99.0) -> tuple[float, float]:
    """Contrast limits from the 1st to the 99th percentile of the finite values (never an empty range)."""
    finite = values[np.isfinite(values)]
    if not finite.size:
        return 0.0, 1.0
    lo, hi = (float(v) for v in np.percentile(finite, (low, high)))
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    return lo, hi


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


def _indexed(data: Any, index: str) -> Any:
    """``data`` with the request's index applied (only ``""`` and ``"[None]"`` occur)."""
    return data[None] if index == "[None]" else data


def make_correlation_job(request: CorrelationRequest) -> Job:
    window = request.window

    def run(progress: ProgressCallback) -> JobResult:
        from napari_gridmip.core import find_displacement, track_speckles

        lazy = is_lazy(request.data1) or is_lazy(request.data2)
        if lazy:  # row band by row band, with a halo: the stacks are never loaded whole
            img1, img2 = as_dask(request.data1), as_dask(request.data2)
        else:
            img1, img2 = np.asarray(request.data1), np.asarray(request.data2)
        img1, img2 = _indexed(img1, request.index), _indexed(img2, request.index)
        search_steps = 100
        derived_steps = 10 * sum(name in request.outputs for name in ("phase", "strain"))
        with_map = request.full_map
        total = search_steps + derived_steps + (search_steps if with_map else 0)

        def search_progress(done: int, steps: int) -> None:
            progress(round(search_steps * done / max(steps, 1)), total)

        options = search_options(request)
        extras: dict[str, np.ndarray] = {}
        if request.tracking:
            tracked = track_speckles(img1, img2, window, **options, **({} if lazy else {"progress": search_progress}))
            names = ("dy", "dx", "peak", "transmission", "dark_field", "sigma_dy", "sigma_dx")
            parts = [getattr(tracked, name) for name in names]
            if lazy:
                import dask

                with DaskProgress(search_progress):
                    parts = dask.compute(*parts, scheduler="threads")
            arrays = dict(zip(names, (np.asarray(part) for part in parts)))
            dy, dx, peak = arrays.pop("dy"), arrays.pop("dx"), arrays.pop("peak")
            chosen = {role for name in request.outputs for role in OUTPUTS[name]}
            extras.update({role: array for role, array in arrays.items() if role in chosen})
        elif lazy:
            import dask

            fields = find_displacement(img1, img2, window, **options)
            with DaskProgress(search_progress):
                dy, dx, peak = dask.compute(*fields, scheduler="threads")
        else:
            fields = find_displacement(img1, img2, window, **options, progress=search_progress)
            dy, dx, peak = (np.asarray(r) for r in fields)
        done = search_steps
        progress(done, total)
        if "phase" in request.outputs:
            extras["phase"] = np.asarray(_phase(request, dy, dx))
            done += 10
            progress(done, total)
        if "strain" in request.outputs:
            from napari_gridmip.core import strain_field

            strain = strain_field(dy, dx, window=request.strain_window, spacing=request.step, dtype=request.dtype)
            extras.update({name: np.asarray(getattr(strain, name)) for name in ("exx", "eyy", "exy")})
            done += 10
            progress(done, total)
        full = None
        if with_map:

            def map_progress(step_done: int, steps: int) -> None:
                progress(done + round(search_steps * step_done / max(steps, 1)), total)

            full = full_map(img1, img2, window, request.dtype, progress=map_progress, map_dir=request.map_dir)
        summary = correlation_summary(dy, dx)
        if request.tracking:
            summary += "; by track_speckles"
        return JobResult(_correlation_layers(request, dy, dx, peak, full, extras), summary)

    return Job(f"Correlating {request.name1!r} with {request.name2!r}", run)


def search_options(request: CorrelationRequest) -> dict[str, Any]:
    """The keyword options of the search call (subset and step only where they are not the defaults)."""
    options: dict[str, Any] = {}
    if tuple(request.subset) != (1, 1) or request.step != 1:
        options.update(subset=tuple(request.subset), step=int(request.step))
    return {**options, "subpixel": request.subpixel, "dtype": request.dtype}


def _phase_call(request: CorrelationRequest, dy: str, dx: str) -> Call:
    """Phase from the displacement: ``phase_from_displacement`` with physical lengths (radians), else
    ``integrate_gradient`` (px^2: displacement in px integrated over px). With a step ``s`` the samples
    are ``s`` pixels apart (``spacing=s``, or a magnification of ``1 / s``)."""
    if request.physics is not None:
        pixel_size, distance, wavelength = request.physics
        kwargs: dict[str, Any] = {"pixel_size": pixel_size, "distance": distance, "wavelength": wavelength}
        if request.step != 1:
            kwargs["magnification"] = 1.0 / request.step
        return Call("phase_from_displacement", (dy, dx), (), {**kwargs, "dtype": request.dtype}, result="phase")
    kwargs = {"spacing": request.step} if request.step != 1 else {}
    return Call("integrate_gradient", (dy, dx), (), {**kwargs, "dtype": request.dtype}, result="phase")


def _phase(request: CorrelationRequest, dy: np.ndarray, dx: np.ndarray) -> Any:
    import napari_gridmip.core as core

    call = _phase_call(request, "dy", "dx")
    return getattr(core, call.function)(dy, dx, **call.kwargs)


def correlation_calls(request: CorrelationRequest) -> tuple[list[Source], list[Call], dict[str, str]]:
    """What the job computes, as public calls, and each output's data as code over their results."""
    index = request.index
    sources = [Source("img1", layer=request.name1, index=index), Source("img2", layer=request.name2, index=index)]
    options = search_options(request)
    window = (tuple(request.window),)
    if request.tracking:
        calls = [Call("track_speckles", ("img1", "img2"), window, options, result="tracked")]
        names = ("dy", "dx", "peak", "transmission", "dark_field", "sigma_dy", "sigma_dx")
        expressions = {name: f"tracked.{name}" for name in names}
    else:
        calls = [Call("find_displacement", ("img1", "img2"), window, options, result="dy, dx, peak")]
        expressions = {name: name for name in ("dy", "dx", "peak")}
    dy, dx = expressions["dy"], expressions["dx"]
    if "phase" in request.outputs:
        calls.append(_phase_call(request, dy, dx))
        expressions["phase"] = "phase"
    if "strain" in request.outputs:
        kwargs = {"window": request.strain_window, "spacing": request.step, "dtype": request.dtype}
        calls.append(Call("strain_field", (dy, dx), (), kwargs, result="strain"))
        expressions.update({name: f"strain.{name}" for name in ("exx", "eyy", "exy")})
    if request.full_map:
        kwargs = {"dtype": request.dtype, "offsets_first": True}
        calls.append(Call("windowed_pearson", ("img1", "img2"), window, kwargs, result="planes"))
    return sources, calls, expressions


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


# how each output reads at a glance: (colormap, how its contrast limits are chosen, its name's suffix)
STYLES = {
    "transmission": ("gray", "percentile", "transmission"),
    "dark_field": ("gray", "percentile", "dark-field"),
    "phase": ("gray", "percentile", "phase"),
    "exx": ("coolwarm", "symmetric", "exx"),
    "eyy": ("coolwarm", "symmetric", "eyy"),
    "exy": ("coolwarm", "symmetric", "exy"),
    "sigma_dy": ("magma", "from zero", "sigma dy"),
    "sigma_dx": ("magma", "from zero", "sigma dx"),
}
LAYER_ORDER = ("sigma_dx", "sigma_dy", "dark_field", "transmission", "phase", "exy", "eyy", "exx")  # bottom first


def _limits(values: np.ndarray, how: str) -> tuple[float, float]:
    if how == "symmetric":
        return symmetric_limits(values)
    if how == "from zero":
        return 0.0, percentile_limits(values)[1]
    return percentile_limits(values)


def _correlation_layers(request: CorrelationRequest, dy, dx, peak, full, extras=None) -> list[LayerDataTuple]:
    """Bottom to top: peak (hidden), dx (hidden), dy, the derived outputs, the 4D map, the vectors.

    Of peak, dx, dy and the derived outputs only the topmost is visible (the others are a click away).
    """
    extras = extras or {}
    name, window, step = request.grid_name, request.window, request.step
    frame = request.grid_frame
    frames_axis = request.index != "[None]"
    placement = output_placement(frame, window, subset=request.subset, step=step, frames_axis=frames_axis)
    sources, calls, expressions = correlation_calls(request)
    limits = symmetric_limits(np.concatenate([dy.ravel(), dx.ravel()]))
    diverging = {"colormap": "coolwarm", "contrast_limits": limits, **placement}
    peak_style = {"colormap": "viridis", "contrast_limits": (0, 1), "visible": False}
    outputs = [
        Output(peak, {"name": f"{name} peak", **peak_style, **placement}, "image", "peak", expressions["peak"]),
        Output(dx, {"name": f"{name} dx", "visible": False, **diverging}, "image", "dx", expressions["dx"]),
        Output(dy, {"name": f"{name} dy", **diverging}, "image", "dy", expressions["dy"]),
    ]
    derived = [role for role in LAYER_ORDER if role in extras]
    for role in derived:
        colormap, how, suffix = STYLES[role]
        meta = {"name": f"{name} {suffix}", "colormap": colormap, "contrast_limits": _limits(extras[role], how)}
        if role == "phase":
            meta["metadata"] = {"gridmip_unit": "rad" if request.physics is not None else "px^2"}
        outputs.append(Output(extras[role], {**meta, **placement}, "image", role, expressions[role]))
    if derived:  # the topmost field is the one shown
        for out in outputs[:-1]:
            out.meta["visible"] = False
    if full is not None:
        m, n = window[0] // 2, window[1] // 2
        batch = dy.ndim - 2
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

        # the spacing is in input pixels; with a step the arrows are drawn on every (spacing / step)-th output
        # pixel, in the output grid's coordinates (each s input pixels), so napari's length is divided by s
        every = max(1, round(request.spacing / step))
        auto = auto_vector_length(dy, dx, every)
        length = (request.vector_scale / step) if request.vector_scale else auto
        half = (window[0] // 2 + request.subset[0] // 2, window[1] // 2 + request.subset[1] // 2)
        origin = (half[0] / step, half[1] / step) if step != 1 else half
        vectors = displacement_vectors(dy, dx, spacing=every, origin=origin)
        vector_placement = derived_placement(frame, axes=[frame.ndim - 2, frame.ndim - 1], step=step)
        meta = {
            "name": f"{name} displacement",
            "edge_color": "black",
            "edge_width": max(0.15 * every, 0.5 / step),
            "length": length,
            "metadata": {"gridmip_auto_length": auto, "gridmip_step": step},
            **vector_placement,
        }
        expression = (
            f"gm.displacement_vectors({expressions['dy']}, {expressions['dx']}, spacing={every}, origin={origin})"
        )
        outputs.append(Output(vectors, meta, "vectors", "vectors", expression))
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


# -- time series: the local correlation image -------------------------------------------------------


@dataclass(frozen=True)
class TimeSeriesRequest:
    """A movie ``(..., T, Y, X)`` and the options of :func:`~napari_gridmip.local_correlation_image`."""

    name: str
    data: Any
    frame: Frame
    neighbours: int = 8
    dtype: str = "float32"


def make_timeseries_job(request: TimeSeriesRequest) -> Job:
    def run(progress: ProgressCallback) -> JobResult:
        from napari_gridmip.core import local_correlation_image

        kwargs = {"neighbours": request.neighbours, "dtype": request.dtype}
        if is_lazy(request.data):
            import dask

            graph = local_correlation_image(as_dask(request.data), **kwargs)
            with DaskProgress(progress):
                (image,) = dask.compute(graph, scheduler="threads")
        else:
            image = local_correlation_image(np.asarray(request.data), **kwargs, progress=progress)
        image = np.asarray(image)
        placement = output_placement(request.frame, (1, 1))
        meta = {"name": f"{request.name} correlation image", "colormap": "magma", "contrast_limits": (0.0, 1.0)}
        sources = [Source("movie", layer=request.name)]
        calls = [Call("local_correlation_image", ("movie",), (), kwargs, result="image")]
        outputs = [Output(image, {**meta, **placement}, "image", "correlation image", "image")]
        finite = image[np.isfinite(image)]
        median, top = np.percentile(finite, (50, 99)) if finite.size else (np.nan, np.nan)
        summary = (
            f"local correlation image ({request.neighbours} neighbours): median {median:.2f}, 99th percentile {top:.2f}"
        )
        return JobResult(layer_tuples(outputs, widget=WIDGET, sources=sources, calls=calls), summary)

    return Job(f"Local correlation image of {request.name!r}", run)


# -- one pixel's correlation surface ------------------------------------------------------------------


@dataclass(frozen=True)
class SurfaceRequest:
    """One output pixel of a correlation run, captured on the GUI thread when the user clicks it.

    ``pixel`` is the output pixel's index (batch axes first); ``crop`` the input's index (Python code, e.g.
    ``"[:, 40:61, 12:33]"``) around its input pixel, window plus subset wide, applied to both inputs.
    ``fitted`` the run's sub-pixel ``(dy, dx)`` there (layer values), ``fitted_code`` the same as code over the
    run's results. ``sources`` and ``calls`` are the run's (from its layers' provenance), so that the
    surface's layers say everything that made them. ``surface_placement`` puts the surface beside the data;
    ``grid_placement`` is the result layers' (for the marker of the clicked pixel).
    """

    name1: str
    name2: str
    data1: Any
    data2: Any
    crop: str
    window: tuple[int, int]
    subset: tuple[int, int]
    dtype: str
    tracking: bool  # the run was track_speckles': the surface is windowed_pearson(img2, img1), flipped
    pixel: tuple[int, ...]
    fitted: tuple[float, float]
    fitted_code: tuple[str, str]
    grid_name: str
    sources: tuple[Source, ...]
    calls: tuple[Call, ...]
    surface_placement: dict
    grid_placement: dict
    crop_key: tuple = ()  # the same index as ``crop``, as a key
    marker_size: float = 3.0  # the clicked pixel's ring, in output pixels


def crop_index(
    pixel: tuple[int, ...], centre: tuple[int, int], half: tuple[int, int], *, frames_axis: bool
) -> tuple[str, tuple]:
    """The input's index of the ``(2 half + 1)``-wide crop around ``centre``, at the batch index of ``pixel``:
    as code, ``"[b, :, y0:y1, x0:x1]"`` (``"[None, y0:y1, x0:x1]"`` for a 2D image), and as a key."""
    (y, x), (hy, hx) = centre, half
    rows, cols = slice(y - hy, y + hy + 1), slice(x - hx, x + hx + 1)
    lead = [int(i) for i in pixel[:-2]]
    key = (*lead, slice(None), rows, cols) if frames_axis else (None, rows, cols)
    parts = [*map(str, lead), ":"] if frames_axis else ["None"]
    code = f"[{', '.join([*parts, f'{rows.start}:{rows.stop}', f'{cols.start}:{cols.stop}'])}]"
    return code, key


def make_surface_job(request: SurfaceRequest) -> Job:
    """The clicked pixel's correlation over the window's offsets (a ``windowed_pearson`` of the small crops
    around it), as an image beside the data with the fitted peak marked, and the clicked pixel marked."""
    wm, wn = request.window
    m, n = wm // 2, wn // 2

    def run(progress: ProgressCallback) -> JobResult:
        from napari_gridmip.core import windowed_pearson

        progress(0, 2)
        crops = {}
        for variable, data in (("pixel1", request.data1), ("pixel2", request.data2)):
            crops[variable] = np.asarray(data[request.crop_key])
        first, second = ("pixel2", "pixel1") if request.tracking else ("pixel1", "pixel2")
        kwargs: dict[str, Any] = {"subset": tuple(request.subset)} if tuple(request.subset) != (1, 1) else {}
        kwargs["dtype"] = request.dtype
        planes = np.asarray(windowed_pearson(crops[first], crops[second], (wm, wn), **kwargs))
        progress(1, 2)
        # the surface over the displacement (dy, dx) in the run's convention: pixel (k, l) is (k - m, l - n);
        # track_speckles' displacement is minus find_displacement's of (reference, sample): flipped
        expression = "surface[0, 0, ::-1, ::-1]" if request.tracking else "surface[0, 0]"
        surface = planes[0, 0, ::-1, ::-1] if request.tracking else planes[0, 0]
        finite = surface[np.isfinite(surface)]
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        if high <= low:
            low, high = low - 0.5, high + 0.5
        fy, fx = request.fitted
        label = f"peak dy {fy:.2f}, dx {fx:.2f}"
        above = [-(fy + m) - 0.7, -(fx + n) - 0.5] if np.isfinite([fy, fx]).all() else [0.0, 0.0]  # the corner
        dy_code, dx_code = request.fitted_code
        if np.isfinite([fy, fx]).all():
            peak = np.array([[fy + m, fx + n]])
            peak_code = f"np.array([[float({dy_code}) + {m}, float({dx_code}) + {n}]])"
            labels = [label]
        else:  # the peak lies on the window's edge: no fitted position to mark
            peak, peak_code, labels = np.empty((0, 2)), "np.empty((0, 2))", []
        pixel = np.array([request.pixel], dtype=float)
        sources = [*request.sources, Source("pixel1", layer=request.name1, index=request.crop),
                   Source("pixel2", layer=request.name2, index=request.crop)]  # fmt: skip
        calls = [*request.calls, Call("windowed_pearson", (first, second), ((wm, wn),), kwargs, result="surface")]
        name = request.grid_name
        size, grid = request.marker_size, request.grid_placement
        outputs = [
            Output(
                surface,
                {"name": f"{name} correlation surface", "colormap": "magma", "contrast_limits": (low, high),
                 "interpolation2d": "nearest", **request.surface_placement},
                "image", "surface", expression,
            ),
            Output(
                peak,
                {"name": f"{name} surface peak", "symbol": "cross", "face_color": "cyan", "size": 0.8,
                 "features": {"label": labels}, **request.surface_placement,
                 "text": {"string": "{label}", "color": "white", "size": 10, "anchor": "lower_left",
                          "translation": above}},
                "points", "surface peak", peak_code,
            ),
            Output(
                pixel,
                {"name": f"{name} clicked pixel", "symbol": "ring", "face_color": "cyan", "size": size, **grid},
                "points", "clicked pixel", f"np.array([{list(map(float, request.pixel))}])",
            ),
        ]  # fmt: skip
        progress(2, 2)
        at = ", ".join(map(str, request.pixel))
        iy, ix = np.unravel_index(np.nanargmax(surface), surface.shape) if finite.size else (m, n)
        summary = (
            f"pixel ({at}): fitted dy {fy:.3f}, dx {fx:.3f} px; the surface's highest value "
            f"{high:.3f} at ({iy - m}, {ix - n})"
        )
        layers = layer_tuples(outputs, widget=WIDGET, sources=sources, calls=calls)
        return JobResult(layers, summary, {"surface": surface, "peak": (fy, fx)})

    return Job(f"Correlation surface at pixel {request.pixel}", run)
