"""The correlation job: the displacement field between two stacks or images (dense, or with a subset and a
step), the outputs derived from it (transmission, dark-field, phase, strain, uncertainty), the full map on
request. One plan (:func:`correlation_plan`) serves the widget's job and ``napari-gridmip correlate``.

The time series' job is in :mod:`~napari_gridmip._jobs.timeseries`, one pixel's surface in
:mod:`~napari_gridmip._jobs.surface`."""

from __future__ import annotations

import atexit
import math
import os
import shutil
import tempfile
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
    staged,
)
from napari_gridmip._jobs.device_layers import DeviceInput, resolve, runs_on_device
from napari_gridmip._jobs.plan import Call, Plan, Ref, Source
from napari_gridmip._jobs.world import Frame, derived_placement
from napari_gridmip.core.correlation.status import Status  # a leaf: no JAX

WIDGET = "correlation"

EAGER_MAP_BYTES = 512 * 2**20  # larger full correlation maps go to a temporary Zarr store, band by band
MAP_BAND_ROWS = 64  # output rows per band of a full map written to disk


@dataclass(frozen=True)
class CorrelationRequest:
    """Two (..., K, M, N) stacks, the window and the output options, captured on the GUI thread. ``devices``: where
    the job takes ``data1`` and ``data2`` from their layers' device copies
    (:mod:`napari_gridmip._jobs.device_layers`)."""

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
    shape: str = "translation"  # the subsets' shape function: "affine" fits each subset's gradients too (IC-GN)
    devices: tuple[DeviceInput | None, DeviceInput | None] = (None, None)

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
# every output a plan can make (the command line also writes track_speckles' residual): name -> its arrays
PARTS = {**OUTPUTS, "residual": ("residual",)}
# parts of track_speckles' result: asking for one makes the field track_speckles'
TRACKING_OUTPUTS = ("transmission", "dark_field", "residual", "uncertainty")


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


def median_magnitude(dy: np.ndarray, dx: np.ndarray) -> float:
    """The median of ``|d|`` over the finite displacements (NaN where none is)."""
    magnitude = np.hypot(dy, dx)
    return float(np.nanmedian(magnitude)) if np.isfinite(magnitude).any() else float("nan")


def auto_vector_length(dy: np.ndarray, dx: np.ndarray, spacing: int, *, median: float | None = None) -> float:
    """A length multiplier that draws the median displacement at 80% of the grid spacing (``median``: the
    :func:`median_magnitude` of ``dy``, ``dx`` where the caller has it: a pass over the field saved)."""
    median = median_magnitude(dy, dx) if median is None else median
    return 0.8 * spacing / median if median > 0 else 1.0


def symmetric_limits(values: np.ndarray) -> tuple[float, float]:
    """Contrast limits ``(-c, c)`` with ``c`` the 99th percentile of ``|values|`` (ignoring NaN)."""
    finite = np.abs(values[np.isfinite(values)])
    c = float(np.percentile(finite, 99)) if finite.size else 0.0
    c = c if c > 0 else 1.0
    return -c, c


def correlation_summary(dy: np.ndarray, dx: np.ndarray, *, median: float | None = None) -> str:
    """E.g. ``'median |d| 1.42 px; 3.1% NaN (peak on the window edge)'`` (``median``: as for
    :func:`auto_vector_length`)."""
    magnitude = np.hypot(dy, dx)
    nan_share = 100 * float(np.mean(~np.isfinite(magnitude))) if magnitude.size else 0.0
    median = median_magnitude(dy, dx) if median is None else median
    return f"median |d| {median:.3g} px; {nan_share:.2g}% NaN (peak on the window edge)"


def _indexed(data: Any, index: str) -> Any:
    """``data`` with the request's index applied (only ``""`` and ``"[None]"`` occur)."""
    return data[None] if index == "[None]" else data


def correlation_plan(
    request: CorrelationRequest, *, sources: tuple[Source, Source] | None = None, display: bool = True
) -> Plan:
    """The job as public calls: the search (``find_displacement``, or ``track_speckles`` when a tracking output is
    asked for), phase and strain from its field, the full map; outputs by role (``"dy"``, ``"exx"``, ``"map"``).

    ``sources`` bind ``img1`` and ``img2`` (the layers by default; the command line's files); ``display`` adds
    the widget's own outputs (the map laid out for napari's sliders, the displacement vectors).
    """
    index = request.index
    if sources is None:
        sources = (Source("img1", layer=request.name1, index=index), Source("img2", layer=request.name2, index=index))
    options = search_options(request)
    window = (tuple(request.window),)
    chosen = [part for name in PARTS if name in request.outputs for part in PARTS[name]]
    if request.shape == "affine" and request.tracking:
        raise ValueError(
            "affine subsets give the displacement, phase and strain; transmission, dark-field, residual and "
            f"uncertainty come from track_speckles, whose subsets translate only: got outputs {request.outputs}"
        )
    if request.tracking:
        calls = [Call("track_speckles", ("img1", "img2"), window, options, result="tracked")]
        parts = ("dy", "dx", "peak", *(p for p in chosen if p in ("transmission", "dark_field", "residual",
                                                                      "sigma_dy", "sigma_dx")))  # fmt: skip
        outputs = {name: f"tracked.{name}" for name in parts}
    elif request.shape == "affine":
        calls = [Call("find_displacement", ("img1", "img2"), window, options, result="field")]
        outputs = {name: f"field.{name}" for name in ("dy", "dx", "peak")}
    else:
        calls = [Call("find_displacement", ("img1", "img2"), window, options, result="dy, dx, peak")]
        outputs = {name: name for name in ("dy", "dx", "peak")}
    dy, dx = outputs["dy"], outputs["dx"]
    if "phase" in request.outputs:
        calls.append(_phase_call(request, dy, dx))
        outputs["phase"] = "phase"
    if "strain" in request.outputs:
        # with a step the samples are ``step`` pixels apart: the gradients are per pixel only with ``spacing``
        kwargs = {"window": request.strain_window, "spacing": request.step, "dtype": request.dtype}
        if request.shape == "affine":  # the subsets' own gradients: no plane fit, no second differentiation
            gradients = Ref("(field.dy_y, field.dy_x, field.dx_y, field.dx_x)")
            kwargs = {"gradients": gradients, "dtype": request.dtype}
        calls.append(Call("strain_field", (dy, dx), (), kwargs, result="strain"))
        outputs.update({name: f"strain.{name}" for name in ("exx", "eyy", "exy")})
    ndim = len(request.data2.shape) + index.count("None")  # the stacks' axes, (..., K, M, N)
    if request.full_map:
        kwargs = {"dtype": request.dtype, "offsets_first": True}
        calls.append(Call("windowed_pearson", ("img1", "img2"), window, kwargs, result="planes"))
        outputs["map"] = map_code(ndim - 3) if display else "planes"
    if display and ndim == 3:  # one field (M', N'): arrows on it
        every, origin = _vector_grid(request)
        outputs["vectors"] = f"gm.displacement_vectors({dy}, {dx}, spacing={every}, origin={origin})"
    return Plan(sources, calls, outputs)


def _vector_grid(request: CorrelationRequest) -> tuple[int, tuple]:
    """The arrows' spacing in output pixels and the output grid's origin in its own units.

    The spacing is in input pixels; with a step the arrows are drawn on every (spacing / step)-th output pixel,
    in the output grid's coordinates (each ``step`` input pixels).
    """
    step = request.step
    every = max(1, round(request.spacing / step))
    half = (request.window[0] // 2 + request.subset[0] // 2, request.window[1] // 2 + request.subset[1] // 2)
    origin = (half[0] / step, half[1] / step) if step != 1 else half
    return every, origin


def make_correlation_job(request: CorrelationRequest) -> Job:
    plan = correlation_plan(request)

    def run(progress: ProgressCallback) -> JobResult:
        lazy = is_lazy(request.data1) or is_lazy(request.data2)
        if lazy:  # row band by row band, with a halo: the stacks are never loaded whole
            img1, img2 = as_dask(request.data1), as_dask(request.data2)
        else:  # the layers' device copies where the kernels run on an accelerator: sent once, kept between runs
            wanted = runs_on_device(request.dtype)
            img1, img2 = (
                resolve(handle, np.asarray(data), name, wanted=wanted)
                for handle, data, name in zip(request.devices, (request.data1, request.data2), ("img1", "img2"))
            )
        first, second = plan.sources
        inputs = {"img1": first.take(img1), "img2": second.take(img2)}
        search = plan.calls[0].result
        weights = {search: 100, "phase": 10, "strain": 10, "planes": 100}

        def map_evaluator(call: Call, namespace: dict, runtime: dict) -> Any:
            """The planned ``windowed_pearson`` (its recorded window and dtype), band by band where it is large."""
            window, dtype = call.args[0], call.kwargs["dtype"]
            return full_map(
                namespace["img1"], namespace["img2"], window, dtype, progress=runtime["progress"],
                map_dir=request.map_dir,
            )  # fmt: skip

        steps = staged(plan, progress, weights, pass_progress=not lazy, always=("planes",), keep=("planes",))
        values = plan.run(inputs, **steps, evaluators={"planes": map_evaluator})
        # once for the summary and the arrows: a second Run on kept copies is ~0.1 s, a pass over the field counts
        median = median_magnitude(np.asarray(values["dy"]), np.asarray(values["dx"]))
        summary = correlation_summary(values["dy"], values["dx"], median=median)
        if request.tracking:
            summary += "; by track_speckles"
        return JobResult(_correlation_layers(request, values, plan, median=median), summary)

    return Job(f"Correlating {request.name1!r} with {request.name2!r}", run)


def search_options(request: CorrelationRequest) -> dict[str, Any]:
    """The keyword options of the search call (subset and step only where they are not the defaults)."""
    options: dict[str, Any] = {}
    if tuple(request.subset) != (1, 1) or request.step != 1:
        options.update(subset=tuple(request.subset), step=int(request.step))
    options = {**options, "subpixel": request.subpixel, "dtype": request.dtype}
    if request.shape != "translation":
        options["shape"] = request.shape
    dic = tuple(request.subset) != (1, 1) and request.subpixel == "refine"
    if request.tracking and dic and not {"transmission", "dark_field"} & set(request.outputs):
        # a DIC field with its uncertainty: the same prefiltered field find_displacement gives without it
        # (track_speckles leaves the prefilter off for the dark-field's sake)
        options["prefilter"] = "auto"
    return options


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


def map_for_display(planes: Any, batch: int) -> tuple[Any, str]:
    """The offsets-first map ``(*batch, wm, wn, M', N')`` as ``(wm, wn, *batch, 1, M', N')``, and that as code.

    The offsets come first, so their sliders are the map's own, and a length-1 axis stands where the
    inputs have K, so that no slider of the map moves with the inputs' frame slider (napari lines axes
    up from the last one). A view of NumPy or dask data.
    """
    code = map_code(batch)
    return eval(code, {"np": np}, {"planes": planes}), code  # noqa: S307 - the code above


def map_code(batch: int) -> str:
    """:func:`map_for_display` as code over ``planes``."""
    return (
        "planes[:, :, None]" if batch == 0 else f"np.moveaxis(planes, ({batch}, {batch + 1}), (0, 1))[..., None, :, :]"
    )


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


def contrast_limits(values: np.ndarray, how: str) -> tuple[float, float]:
    """A field's contrast limits by the rule its style names: ``"symmetric"`` about 0, ``"from zero"`` (a size or
    an uncertainty), ``"zncc"`` (1 at the top: the good matches read alike, the weaker ones stand out), else the
    1st to 99th percentile."""
    if how == "symmetric":
        return symmetric_limits(values)
    if how == "from zero":
        return 0.0, percentile_limits(values)[1]
    if how == "zncc":
        return min(percentile_limits(values)[0], 0.99), 1.0
    return percentile_limits(values)


def _correlation_layers(
    request: CorrelationRequest, values: dict[str, Any], plan: Plan, *, median: float | None = None
) -> list[LayerDataTuple]:
    """Bottom to top: peak (hidden), dx (hidden), dy, the derived outputs, the 4D map, the vectors.

    Of peak, dx, dy and the derived outputs only the topmost is visible (the others are a click away).
    ``values`` are the plan's outputs; ``median`` the field's :func:`median_magnitude`, where known.
    """
    dy, dx, peak = (np.asarray(values[name]) for name in ("dy", "dx", "peak"))
    name, window, step = request.grid_name, request.window, request.step
    frame = request.grid_frame
    frames_axis = request.index != "[None]"
    placement = output_placement(frame, window, subset=request.subset, step=step, frames_axis=frames_axis)
    limits = symmetric_limits(np.concatenate([dy.ravel(), dx.ravel()]))
    diverging = {"colormap": "coolwarm", "contrast_limits": limits, **placement}
    peak_style = {"colormap": "viridis", "contrast_limits": (0, 1), "visible": False}
    outputs = [
        Output(peak, {"name": f"{name} peak", **peak_style, **placement}, "image", "peak"),
        Output(dx, {"name": f"{name} dx", "visible": False, **diverging}, "image", "dx"),
        Output(dy, {"name": f"{name} dy", **diverging}, "image", "dy"),
    ]
    derived = [role for role in LAYER_ORDER if role in values]
    for role in derived:
        colormap, how, suffix = STYLES[role]
        data = np.asarray(values[role])
        meta = {"name": f"{name} {suffix}", "colormap": colormap, "contrast_limits": contrast_limits(data, how)}
        if role == "phase":
            meta["metadata"] = {"gridmip_unit": "rad" if request.physics is not None else "px^2"}
        outputs.append(Output(data, {**meta, **placement}, "image", role))
    if derived:  # the topmost field is the one shown
        for out in outputs[:-1]:
            out.meta["visible"] = False
    if "map" in values:
        m, n = window[0] // 2, window[1] // 2
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
        outputs.append(Output(values["map"], meta, "image", "map"))
    if "vectors" in values:
        every, _ = _vector_grid(request)
        auto = auto_vector_length(dy, dx, every, median=median)
        length = (request.vector_scale / step) if request.vector_scale else auto
        vector_placement = derived_placement(frame, axes=[frame.ndim - 2, frame.ndim - 1], step=step)
        meta = {
            "name": f"{name} displacement",
            "edge_color": "black",
            "edge_width": max(0.15 * every, 0.5 / step),
            "length": length,
            "metadata": {"gridmip_auto_length": auto, "gridmip_step": step},
            **vector_placement,
        }
        outputs.append(Output(np.asarray(values["vectors"]), meta, "vectors", "vectors"))
    return layer_tuples(outputs, widget=WIDGET, plan=plan)


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
    from napari_gridmip.core import windowed_pearson  # imports JAX: in the worker, not as the widgets load

    m, n = window[0] // 2, window[1] // 2
    rows, cols = img1.shape[-2] - 2 * m, img1.shape[-1] - 2 * n
    lead = img1.shape[:-3]
    nbytes = np.dtype(dtype).itemsize * math.prod(lead) * window[0] * window[1] * rows * cols
    if hasattr(img1, "dask"):  # lazy stacks: band by band into the store, one progress step per task
        import dask.array as da  # lazy stacks: dask is loaded already

        graph = windowed_pearson(img1, img2, window, dtype=dtype, offsets_first=True)
        path = os.path.join(map_dir or _temporary_folder(), "map.zarr")
        with DaskProgress(progress):
            graph.to_zarr(path, overwrite=True)
        return da.from_zarr(path)
    if nbytes <= EAGER_MAP_BYTES:
        return np.asarray(windowed_pearson(img1, img2, window, dtype=dtype, offsets_first=True, progress=progress))
    # a large map only: dask.array and zarr take 0.5 and 0.2 s to import
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
    folder = tempfile.mkdtemp(prefix="napari-gridmip-map-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


# -- the DIC series: a grid of reference points followed through a sequence of frames --------------------------

SERIES_REFERENCES = ("accumulated", "incremental", "auto")  # correlate_series' reference policies
SERIES_SHAPES = ("affine", "rigid")  # correlate_series' subset warps: 6 parameters, or translation and rotation (3)
# correlate_series' defaults of the options the request carries (the widget's and the command line's too)
SERIES_MAX_SIGMA = 0.1  # px: the largest predicted standard deviation of a kept point's displacement
SERIES_REFRESH_ZNCC = 0.95  # the ZNCC under which "auto" moves a point's key frame, at which frame 0 is taken back
STRAIN_KINDS = ("green-lagrange", "small")  # strain_field's kinds; Green-Lagrange ignores rigid rotation
# the plan's outputs, each (T, R, C): the field, why a point was lost, the match, the uncertainty, the strain
SERIES_OUTPUTS = ("dy", "dx", "status", "zncc", "sigma_dy", "sigma_dx", "exx", "eyy", "exy")
# the status layer's colours by code (Status: ok, out_of_view, not_significant, ambiguous, no_guess, outside_roi):
# a lost point says why; a found one, and one never asked for (outside the ROI), is transparent
STATUS_COLOURS = {None: "transparent", 0: "transparent", 1: "deepskyblue", 2: "orange", 3: "magenta", 4: "red",
                  5: "transparent"}  # fmt: skip


@dataclass(frozen=True)
class SeriesRequest:
    """A sequence of frames (frame 0 the reference), its region of interest and :func:`~napari_gridmip.
    correlate_series`' options, captured on the GUI thread."""

    name: str  # the frames layer (T, Y, X); with ``reference_name``, the frames that follow the reference
    data: Any
    frame: Frame  # the frames layer's transform: the results are placed on its pixels
    subset: tuple[int, int] = (31, 31)
    step: int = 8
    reference: str = "accumulated"  # the policy, of SERIES_REFERENCES
    reference_name: str | None = None  # a reference image layer (Y, X), put before the frames
    reference_data: Any = None
    roi: Source | None = None  # how the script binds the region of interest (variable "roi")
    roi_data: Any = None  # its value, captured with the request (a Labels layer's mask, a Shapes layer rasterised)
    spacing: int = 8  # px between the arrows
    vector_scale: float = 0.0  # drawn length = displacement x this; 0: automatic, never shorter than the displacement
    strain_kind: str = "green-lagrange"
    shape: str = "affine"  # the subset's warp, of SERIES_SHAPES
    max_sigma: float = SERIES_MAX_SIGMA  # px
    refresh_zncc: float = SERIES_REFRESH_ZNCC

    @property
    def count(self) -> int:
        """The number of frames, the reference included."""
        return int(self.data.shape[0]) + (self.reference_name is not None)


def series_plan(request: SeriesRequest, *, sources: list[Source] | None = None, display: bool = True) -> Plan:
    """``correlate_series`` over the frames and ``strain_field`` of its field with the points' own gradients, frame
    by frame; outputs :data:`SERIES_OUTPUTS` (``(T, R, C)`` each), and with ``display`` the arrows of every frame
    (napari's vectors ``(n, 2, 3)``, ``t`` first, on the grid's own pixels).

    ``sources`` bind ``frames`` (and ``roi`` if there is one); by default the request's layers: the frames layer, or
    a reference image layer and the frames after it, concatenated.
    """
    if sources is None:
        if request.reference_name is None:
            sources = [Source("frames", layer=request.name)]
        else:
            sources = [Source("reference", layer=request.reference_name), Source("stack", layer=request.name),
                       Source("frames", expression="np.concatenate([reference[None], stack])")]  # fmt: skip
        if request.roi is not None:
            sources.append(request.roi)
    subset = tuple(int(s) for s in request.subset)
    options: dict[str, Any] = {"subset": subset[0] if subset[0] == subset[1] else subset, "step": int(request.step)}
    if any(source.variable == "roi" for source in sources):
        options["roi"] = Ref("roi")
    options["reference"] = request.reference
    # always written out, defaults too: the script reproduces the run whatever a later version's defaults
    options["shape"] = request.shape
    options["max_sigma"] = float(request.max_sigma)
    options["refresh_zncc"] = float(request.refresh_zncc)
    gradients = Ref("(series.dy_y, series.dy_x, series.dx_y, series.dx_x)")
    calls = [
        Call("correlate_series", ("frames",), (), options, result="series"),
        Call("strain_field", ("series.dy", "series.dx"), (), {"kind": request.strain_kind, "gradients": gradients},
             result="strain"),
    ]  # fmt: skip
    outputs = {name: f"{'strain' if name in ('exx', 'eyy', 'exy') else 'series'}.{name}" for name in SERIES_OUTPUTS}
    if display:
        every = _series_every(request)
        outputs["vectors"] = (
            f"np.concatenate([np.insert(gm.displacement_vectors(series.dy[t], series.dx[t], spacing={every}), 0, "
            "(t, 0), axis=2) for t in range(len(series.dy))])"
        )
    return Plan(sources, calls, outputs)


def _series_every(request: SeriesRequest) -> int:
    """The arrows' spacing in grid points (``spacing`` px over a grid ``step`` px apart)."""
    return max(1, round(request.spacing / request.step))


def make_series_job(request: SeriesRequest) -> Job:
    plan = series_plan(request)

    def run(progress: ProgressCallback) -> JobResult:
        if request.reference_name is not None:
            inputs = {"reference": np.asarray(request.reference_data), "stack": request.data}
        else:
            inputs = {"frames": request.data}  # read frame by frame where it is lazy
        if request.roi is not None:
            inputs["roi"] = request.roi_data
        # one progress step per frame (correlate_series reports each), one for the strain
        steps = staged(plan, progress, {"series": request.count, "strain": 1})
        values = plan.run(inputs, **steps)
        return JobResult(_series_layers(request, values, plan), series_summary(values["status"]))

    return Job(f"Following {request.name!r} (DIC series, {request.count} frames)", run)


def series_summary(status: np.ndarray) -> str:
    """E.g. ``'19 frames, 487 points in the ROI: 100% found in the last frame (worst 97%); lost point-frames: 3
    not_significant'``."""
    status = np.asarray(status)
    inside = status[0] != Status.outside_roi
    points = int(inside.sum())
    if not points:
        return f"{len(status)} frames: no point of the grid is inside the ROI"
    found = [(status[t][inside] == Status.ok).mean() for t in range(len(status))]
    lost = {s.name: int((status[:, inside] == s).sum()) for s in Status if s != Status.ok}  # of the points inside
    why = ", ".join(f"{n} {name}" for name, n in lost.items() if n) or "none"
    return (
        f"{len(status)} frames, {points} points in the ROI: {100 * found[-1]:.0f}% found in the last frame "
        f"(worst {100 * min(found):.0f}%); lost point-frames: {why}"
    )


def _series_layers(request: SeriesRequest, values: dict[str, Any], plan: Plan) -> list[LayerDataTuple]:
    """Bottom to top: the strains (hidden), dx (hidden), dy, the status (lost points by why), the arrows; each
    ``(T, R, C)`` on the frames' pixels (scale ``(1, step, step)``, the grid's first point as translate), so
    that napari's time slider steps through the frames' fields."""
    name, step = request.name, request.step
    offset = [0.0, request.subset[0] // 2, request.subset[1] // 2]
    placement = derived_placement(request.frame, step=[1.0, step, step], offset=offset)
    dy, dx = (np.asarray(values[part]) for part in ("dy", "dx"))
    translucent = {"opacity": 0.7}  # the frame shows through
    limits = symmetric_limits(np.concatenate([dy.ravel(), dx.ravel()]))
    diverging = {"colormap": "coolwarm", "contrast_limits": limits, **translucent}
    outputs = []
    for role in ("exy", "eyy", "exx"):
        data = np.asarray(values[role])
        meta = {"name": f"{name} {role}", "colormap": "coolwarm", "contrast_limits": symmetric_limits(data)}
        outputs.append(Output(data, {**meta, "visible": False, **translucent, **placement}, "image", role))
    outputs.append(Output(dx, {"name": f"{name} dx", "visible": False, **diverging, **placement}, "image", "dx"))
    outputs.append(Output(dy, {"name": f"{name} dy", **diverging, **placement}, "image", "dy"))
    features = {"index": np.arange(len(Status)), "status": [s.name for s in Status]}
    status_meta = {"name": f"{name} status", "colormap": STATUS_COLOURS, "features": features, **placement}
    outputs.append(Output(np.asarray(values["status"]), status_meta, "labels", "status"))
    if "vectors" in values:
        every = _series_every(request)
        # from the frames after the reference (whose field is 0), and at least the true length: the arrows' tips on
        # the points' positions in the frame
        moved = slice(1, None) if len(dy) > 1 else slice(None)
        auto = max(auto_vector_length(dy[moved], dx[moved], every), 1.0 / step)
        length = request.vector_scale / step if request.vector_scale else auto
        meta = {
            "name": f"{name} displacement",
            "edge_color": "black",
            "edge_width": max(0.25, 1.0 / step),  # 2 px on an 8 px grid
            "vector_style": "arrow",  # the head on the point's position in the frame
            "length": length,
            "metadata": {"gridmip_auto_length": auto, "gridmip_step": step},
            **placement,
        }
        outputs.append(Output(np.asarray(values["vectors"], np.float32), meta, "vectors", "vectors"))
    return layer_tuples(outputs, widget=WIDGET, plan=plan)
