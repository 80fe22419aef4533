"""The merge job: a patch stack back into one image (in colour for 3- or 4-channel pictures); one plan
(:func:`merge_plan`) for the widget's job and ``napari-gridmip merge``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from napari_gridmip._jobs import Job, JobResult, Output, ProgressCallback, as_dask, is_lazy, layer_tuples, staged
from napari_gridmip._jobs.plan import Call, Plan, Source
from napari_gridmip._jobs.world import Frame, derived_placement

WIDGET = "patches"


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
    index: str = ""  # how ``patches`` comes from the layer's data, as code (a flat stack's reshape)


def infer_image_shape(grid: tuple[int, ...], lead: tuple[int, ...], patch: tuple[int, ...], stride: tuple[int, ...]):
    """The smallest image the grid covers with no flush patch: ``(g - 1) * s + p`` per tiled axis."""
    return lead + tuple((g - 1) * s + p for g, p, s in zip(grid, patch, stride))


def is_colour(image_shape: Sequence[int], tiled_axes: int) -> bool:
    """A merged 2D picture with a leading axis of 3 or 4 channels (RGB or RGBA)."""
    return tiled_axes == 2 and len(image_shape) == 3 and image_shape[0] in (3, 4)


def merge_plan(request: MergeRequest, *, source: Source | None = None, display: bool = True) -> Plan:
    """``merge_patches(patches, image_shape, stride, blend=)``; output ``"merged"`` (channels last for a colour
    picture when ``display``: napari shows RGB(A) that way)."""
    call = Call(
        "merge_patches",
        ("patches",),
        args=(tuple(request.image_shape), tuple(request.stride)),
        kwargs={"blend": request.blend},
        result="merged",
    )
    colour = display and is_colour(request.image_shape, len(request.stride))
    expression = "np.moveaxis(np.asarray(merged), 0, -1)" if colour else "merged"
    return Plan([source or Source("patches", layer=request.name, index=request.index)], [call], {"merged": expression})


def make_merge_job(request: MergeRequest) -> Job:
    d = len(request.stride)
    plan = merge_plan(request)

    def run(progress: ProgressCallback) -> JobResult:
        # a lazy stack: output chunk by output chunk, one progress step per task
        patches = as_dask(request.patches) if is_lazy(request.patches) else np.asarray(request.patches)
        merged = np.asarray(plan.run({"patches": patches}, **staged(plan, progress, {"merged": 3}))["merged"])
        meta: dict[str, Any] = {"name": f"{request.name} merged"}
        if is_colour(request.image_shape, d):
            # channels last with rgb=True: a colour picture, placed by its two pixel axes
            meta.update(derived_placement(request.frame, axes=request.placement_axes[1:]), rgb=True)
            meta["contrast_limits"] = _rgb_limits(patches.dtype, merged)
        else:
            meta.update(derived_placement(request.frame, axes=request.placement_axes))
        layers = layer_tuples([Output(merged, meta, "image", "merged")], widget=WIDGET, plan=plan)
        summary = f"merged {patches.shape} into {tuple(request.image_shape)} ({request.blend})"
        return JobResult(layers, summary)

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
