"""The occupancy-mipmap job: the pyramid of one volume (or one per time point), and its occupancy layer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from napari_gridmip._jobs import (
    DaskProgress,
    Job,
    JobResult,
    Output,
    ProgressCallback,
    as_dask,
    is_lazy,
    layer_tuples,
)
from napari_gridmip._placement import Frame, derived_placement
from napari_gridmip._provenance import Call, Source

WIDGET = "mipmap"
MAX_BLOCKS = 4096  # the default level shown is the finest with at most this many occupied cells
OCCUPANCY_COLOR = "cyan"


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
    index: str = ""  # how ``data`` comes from the layer's data, as code (e.g. "[3]" for time point 3)


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


def occupancy_output(name: str, level_data: Any, frame: Frame, level: int) -> Output:
    """The Labels layer that shows one level's occupied cells as translucent blocks."""
    colormap = {None: "transparent", 0: "transparent", 1: OCCUPANCY_COLOR}  # napari: a direct label colormap
    meta = {
        "name": f"{name} occupancy",
        "opacity": 0.45,
        "colormap": colormap,
        "metadata": {"gridmip_level": level},
        **level_placement(frame, level),
    }
    return Output(as_labels(level_data), meta, "labels", "occupancy", level_expression(level))


def level_expression(level: int) -> str:
    """The occupancy layer's data as code over the script's ``levels``."""
    return f"levels[{level}]"


def mipmap_call(request: MipmapRequest) -> tuple[list[Source], list[Call]]:
    """What the job computes, as public calls: the pyramid of the layer's volume."""
    sources = [Source("volume", layer=request.name, index=request.index)]
    return sources, [Call("occupancy_mipmap", ("volume",), kwargs={"threshold": request.threshold}, result="levels")]


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
        outputs: list[Output] = []
        if request.per_level:
            common = {"contrast_limits": (0, 1), "colormap": "gray", "blending": "additive", "visible": False}
            outputs += [
                Output(
                    level,
                    {"name": f"{request.name} mipmap level {k}", **common, **level_placement(request.frame, k)},
                    "image",
                    f"level {k}",
                    f"levels[{k}]",
                )
                for k, level in enumerate(levels)
            ]
        outputs.append(occupancy_output(request.name, levels[shown], request.frame, shown))
        sources, calls = mipmap_call(request)
        layers = layer_tuples(outputs, widget=WIDGET, sources=sources, calls=calls)
        summary = mipmap_summary(levels, counts, shown)
        return JobResult(layers, summary, {"levels": levels, "counts": counts, "level": shown, "frame": request.frame})

    return Job(f"Occupancy mipmap of {request.name!r}", run)


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
    from napari_gridmip.core.occupancy.pyramid import threshold_block

    volume = as_dask(request.data)
    levels = occupancy_mipmap(volume, threshold=request.threshold)
    wanted = [*levels[1:], *(da.count_nonzero(level) for level in levels)]
    with DaskProgress(progress):
        computed = dask.compute(*wanted, scheduler="threads")
    coarse, counts = list(computed[: len(levels) - 1]), [int(c) for c in computed[len(levels) - 1 :]]
    level0 = volume.map_blocks(threshold_block, request.threshold, dtype=bool)
    return [level0, *coarse], counts


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
