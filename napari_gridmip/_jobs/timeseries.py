"""The time-series job: the local correlation image of a movie (CaImAn's correlation image), one plan
(:func:`timeseries_plan`) for the widget's job and ``napari-gridmip corrimage``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from napari_gridmip._jobs import Job, JobResult, Output, ProgressCallback, as_dask, is_lazy, layer_tuples, staged
from napari_gridmip._jobs.correlation import WIDGET, output_placement
from napari_gridmip._jobs.device_layers import DeviceInput, resolve, runs_on_device
from napari_gridmip._jobs.plan import Call, Plan, Source
from napari_gridmip._jobs.world import Frame


@dataclass(frozen=True)
class TimeSeriesRequest:
    """A movie ``(..., T, Y, X)`` and the options of :func:`~napari_gridmip.local_correlation_image`."""

    name: str
    data: Any
    frame: Frame
    neighbours: int = 8
    dtype: str = "float32"
    chunk_frames: int | None = None  # frames per task of a lazy movie (default: its chunks)
    device: DeviceInput | None = None  # the movie from its layer's device copy (napari_gridmip._jobs.device_layers)


def timeseries_plan(request: TimeSeriesRequest, *, source: Source | None = None) -> Plan:
    """``local_correlation_image(movie, neighbours=, dtype=)``; output ``"correlation image"``."""
    kwargs: dict[str, Any] = {"neighbours": request.neighbours, "dtype": request.dtype}
    if request.chunk_frames is not None:
        kwargs["chunk_frames"] = request.chunk_frames
    call = Call("local_correlation_image", ("movie",), (), kwargs, result="image")
    return Plan([source or Source("movie", layer=request.name)], [call], {"correlation image": "image"})


def make_timeseries_job(request: TimeSeriesRequest) -> Job:
    plan = timeseries_plan(request)

    def run(progress: ProgressCallback) -> JobResult:
        lazy = is_lazy(request.data)
        if lazy:
            movie = as_dask(request.data)
        else:  # the layer's device copy where the kernel runs on an accelerator: sent once, kept between runs
            movie = resolve(request.device, np.asarray(request.data), "movie", wanted=runs_on_device(request.dtype))
        steps = staged(plan, progress, {"image": 100}, pass_progress=not lazy)
        image = np.asarray(plan.run({"movie": movie}, **steps)["correlation image"])
        placement = output_placement(request.frame, (1, 1))
        meta = {"name": f"{request.name} correlation image", "colormap": "magma", "contrast_limits": (0.0, 1.0)}
        outputs = [Output(image, {**meta, **placement}, "image", "correlation image")]
        finite = image[np.isfinite(image)]
        median, top = np.percentile(finite, (50, 99)) if finite.size else (np.nan, np.nan)
        summary = (
            f"local correlation image ({request.neighbours} neighbours): median {median:.2f}, 99th percentile {top:.2f}"
        )
        return JobResult(layer_tuples(outputs, widget=WIDGET, plan=plan), summary)

    return Job(f"Local correlation image of {request.name!r}", run)
