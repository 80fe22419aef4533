"""The tiled-processing job: a named filter, or a function found by its import path, run on an image in tiles."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from napari_gridmip._jobs import Job, JobResult, Output, ProgressCallback, as_dask, is_lazy, layer_tuples, staged
from napari_gridmip._jobs.plan import Call, Plan, Source
from napari_gridmip._jobs.world import Frame, derived_placement
from napari_gridmip.core.patches.tiled_filters import TILED_FILTERS, load_callable

WIDGET = "tiled"
CUSTOM = "function (import path)"  # the filter choice that runs the user's own function


@dataclass(frozen=True)
class TiledRequest:
    """One tiled run, captured on the GUI thread: the image, the filter (or function) and the tiling."""

    name: str
    data: Any
    frame: Frame
    filter: str  # a name of TILED_FILTERS, or CUSTOM
    tile: tuple[int, ...]
    parameters: dict[str, Any] = field(default_factory=dict)  # the filter's, or the function's keywords
    overlap: int = 0
    blend: str = "gaussian"
    import_path: str = ""  # CUSTOM: "package.module:function"
    halo: int = 0  # CUSTOM: the function's reach in pixels
    labels: bool = False  # CUSTOM: the function returns label images


def parse_keywords(text: str) -> dict[str, Any]:
    """``"size=5, mode='nearest'"`` -> ``{"size": 5, "mode": "nearest"}``: Python literals only."""
    text = text.strip()
    if not text:
        return {}
    try:
        call = ast.parse(f"f({text})", mode="eval").body
        if not isinstance(call, ast.Call) or call.args:
            raise SyntaxError("positional arguments")
        return {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg is not None}
    except (SyntaxError, ValueError) as error:
        raise ValueError(
            f"arguments must be keywords with literal values, such as \"size=5, mode='nearest'\"; got {text!r} "
            f"({error})"
        ) from None


def _split_path(path: str) -> tuple[str, str]:
    module, _, name = path.partition(":") if ":" in path else path.rpartition(".")
    return module, name


def _placement(frame: Frame, ndim: int) -> dict[str, Any]:
    """The input's placement for a result of ``ndim`` axes: the pixel axes line up; leading axes that the
    function added (channels) get unit steps."""
    if ndim <= frame.ndim:
        return derived_placement(frame, axes=list(range(frame.ndim - ndim, frame.ndim)))
    placement = derived_placement(frame, axes=list(range(frame.ndim)))
    extra = ndim - frame.ndim
    out = {key: placement[key] for key in ("scale", "translate", "units", "axis_labels") if key in placement}
    out["scale"] = np.concatenate([np.ones(extra), out["scale"]])
    out["translate"] = np.concatenate([np.zeros(extra), out["translate"]])
    if "units" in out:
        out["units"] = ("pixel",) * extra + tuple(out["units"])
    if "axis_labels" in out:
        out["axis_labels"] = tuple(f"output {i}" for i in range(extra)) + tuple(out["axis_labels"])
    return out


def tiled_plan(request: TiledRequest, *, source: Source | None = None) -> Plan:
    """``filter_tiled(image, tile, name=, ...)``, or ``apply_tiled(fn, image, tile, ...)`` with the user's function
    bound by its import path (and its keywords, by ``functools.partial``); output ``"result"``."""
    image = source or Source("image", layer=request.name)
    if request.filter == CUSTOM:
        labels = request.labels
        options: dict[str, Any] = {"halo": request.halo, "overlap": request.overlap, "blend": request.blend}
        if labels:
            options = {"halo": request.halo, "overlap": max(request.overlap, 1), "labels": True}
        module, name = _split_path(request.import_path)
        fn_code = f"__import__({module!r}, fromlist=[{name.split('.')[0]!r}]).{name}"
        if request.parameters:
            keywords = ", ".join(f"{k}={v!r}" for k, v in request.parameters.items())
            fn_code = f"__import__('functools').partial({fn_code}, {keywords})"
        sources = [Source("fn", expression=fn_code), image]
        call = Call("apply_tiled", ("fn", "image"), (request.tile,), {**options, "backend": "numpy"}, "result")
    else:
        TILED_FILTERS[request.filter].values(**request.parameters)  # checks the parameters
        options = {"name": request.filter, "overlap": request.overlap, "blend": request.blend}
        sources = [image]
        call = Call("filter_tiled", ("image",), (request.tile,), {**options, **request.parameters}, "result")
    return Plan(sources, [call], {"result": "result"})


def make_tiled_job(request: TiledRequest) -> Job:
    d = len(request.tile)
    if len(request.data.shape) < d:
        raise ValueError(f"layer {request.name!r} has {len(request.data.shape)} axes, fewer than the {d} to tile")
    custom = request.filter == CUSTOM
    if custom:
        load_callable(request.import_path)  # a clear error now, on the GUI thread, not in the worker
        labels = request.labels
    else:
        labels = TILED_FILTERS[request.filter].labels
    plan = tiled_plan(request)  # checks a named filter's parameters
    lazy = is_lazy(request.data)

    def run(progress: ProgressCallback) -> JobResult:
        image = as_dask(request.data) if lazy else np.asarray(request.data)
        # a dask result stays lazy: napari computes what it shows
        steps = staged(plan, progress, {"result": 100}, pass_progress=not lazy, keep=("result",) if lazy else ())
        result = plan.run({"image": image}, **steps)["result"]
        if not lazy:
            result = np.asarray(result)
        title = _split_path(request.import_path)[1].split(".")[-1] if custom else request.filter
        placement = _placement(request.frame, len(result.shape))
        meta = {"name": f"{request.name} {title}", **placement}
        kind = "labels" if labels else "image"
        layers = layer_tuples([Output(result, meta, kind, "result")], widget=WIDGET, plan=plan)
        what = "lazily (napari computes the tiles it shows)" if lazy else f"in tiles of {request.tile}"
        return JobResult(layers, f"{title} of {tuple(request.data.shape)} {what}")

    return Job(f"{request.filter if not custom else request.import_path} on {request.name!r} in tiles", run)
