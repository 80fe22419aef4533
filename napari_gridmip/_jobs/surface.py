"""One pixel's correlation surface: the clicked output pixel's correlation over the window's offsets, beside the
data, with the fitted peak marked. Its plan is the run's plan (from the run's layers) plus the surface's call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from napari_gridmip._jobs import Job, JobResult, Output, ProgressCallback, layer_tuples
from napari_gridmip._jobs.correlation import WIDGET
from napari_gridmip._jobs.plan import Call, Plan, Source


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


def surface_plan(request: SurfaceRequest, *, peak_code: str, pixel_code: str) -> Plan:
    """The run's sources and calls, then the crops around the pixel and their ``windowed_pearson``; outputs
    ``"surface"`` (over the displacement in the run's convention: pixel (k, l) is (k - m, l - n);
    track_speckles' displacement is minus find_displacement's of (reference, sample): flipped), and the marks."""
    first, second = ("pixel2", "pixel1") if request.tracking else ("pixel1", "pixel2")
    kwargs: dict[str, Any] = {"subset": tuple(request.subset)} if tuple(request.subset) != (1, 1) else {}
    kwargs["dtype"] = request.dtype
    sources = [*request.sources, Source("pixel1", layer=request.name1, index=request.crop),
               Source("pixel2", layer=request.name2, index=request.crop)]  # fmt: skip
    call = Call("windowed_pearson", (first, second), (tuple(request.window),), kwargs, result="surface")
    expression = "surface[0, 0, ::-1, ::-1]" if request.tracking else "surface[0, 0]"
    outputs = {"surface": expression, "surface peak": peak_code, "clicked pixel": pixel_code}
    return Plan(sources, [*request.calls, call], outputs)


def make_surface_job(request: SurfaceRequest) -> Job:
    """The clicked pixel's correlation over the window's offsets (a ``windowed_pearson`` of the small crops
    around it), as an image beside the data with the fitted peak marked, and the clicked pixel marked."""
    wm, wn = request.window
    m, n = wm // 2, wn // 2

    def run(progress: ProgressCallback) -> JobResult:
        progress(0, 2)
        plan = surface_plan(request, peak_code="", pixel_code="")
        crops = plan.sources[-2:]
        inputs = {s.variable: np.asarray(s.take(data)) for s, data in zip(crops, (request.data1, request.data2))}
        surface = np.asarray(Plan(crops, plan.calls[-1:], {"surface": plan.outputs["surface"]}).run(inputs)["surface"])
        progress(1, 2)
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
        plan = surface_plan(request, peak_code=peak_code, pixel_code=f"np.array([{list(map(float, request.pixel))}])")
        name = request.grid_name
        size, grid = request.marker_size, request.grid_placement
        outputs = [
            Output(
                surface,
                {"name": f"{name} correlation surface", "colormap": "magma", "contrast_limits": (low, high),
                 "interpolation2d": "nearest", **request.surface_placement},
                "image", "surface",
            ),
            Output(
                peak,
                {"name": f"{name} surface peak", "symbol": "cross", "face_color": "cyan", "size": 0.8,
                 "features": {"label": labels}, **request.surface_placement,
                 "text": {"string": "{label}", "color": "white", "size": 10, "anchor": "lower_left",
                          "translation": above}},
                "points", "surface peak",
            ),
            Output(
                pixel,
                {"name": f"{name} clicked pixel", "symbol": "ring", "face_color": "cyan", "size": size, **grid},
                "points", "clicked pixel",
            ),
        ]  # fmt: skip
        progress(2, 2)
        at = ", ".join(map(str, request.pixel))
        iy, ix = np.unravel_index(np.nanargmax(surface), surface.shape) if finite.size else (m, n)
        summary = (
            f"pixel ({at}): fitted dy {fy:.3f}, dx {fx:.3f} px; the surface's highest value "
            f"{high:.3f} at ({iy - m}, {ix - n})"
        )
        layers = layer_tuples(outputs, widget=WIDGET, plan=plan)
        return JobResult(layers, summary, {"surface": surface, "peak": (fy, fx)})

    return Job(f"Correlation surface at pixel {request.pixel}", run)
