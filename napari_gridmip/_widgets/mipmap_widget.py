"""The "Occupancy mipmap" dock widget."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from magicgui.widgets import CheckBox, FloatSpinBox, SpinBox
from napari.layers import Image, Labels

from napari_gridmip._jobs import Job, JobResult
from napari_gridmip._jobs.mipmap import (
    MipmapRequest,
    as_labels,
    level_expression,
    level_placement,
    make_mipmap_job,
    mipmap_summary,
)
from napari_gridmip._placement import Frame
from napari_gridmip._provenance import KEY
from napari_gridmip._widgets._base import JobWidget, require_layer

if TYPE_CHECKING:
    import napari


class MipmapWidget(JobWidget):
    """Compute the occupancy pyramid of a 3D Image or Labels layer and show one level's cells as blocks."""

    settings_key = "mipmap"
    persisted = ("threshold", "per_level", "all_time_points")

    def __init__(self, napari_viewer: napari.viewer.Viewer) -> None:
        super().__init__(napari_viewer)
        self.layer = self.layer_combo("layer", "Volume", (Image, Labels))
        self.threshold = FloatSpinBox(
            name="threshold",
            label="Threshold",
            value=0.0,
            min=-1e12,
            max=1e12,
            step=0.1,
            tooltip="A voxel is occupied when its value is greater than this; NaN is empty.",
        )
        self.per_level = CheckBox(name="per_level", text="Also add one image layer per level", value=False)
        self.all_time_points = CheckBox(
            name="all_time_points",
            text="All time points (4D+ layers)",
            value=False,
            tooltip="Off: the time point the sliders show. On: one pyramid per time point (and channel).",
        )
        self.level = SpinBox(
            name="level",
            label="Level shown",
            value=0,
            min=0,
            max=0,
            enabled=False,
            tooltip="Which level's occupied cells the occupancy layer shows (no recomputation)",
        )
        self._finish([self.layer, self.threshold, self.all_time_points, self.per_level], [self.level])
        self.level.changed.connect(self._show_level)
        self._shown: dict[str, Any] = {}  # the last result: levels, counts, frame and its layer (weakly)

    def make_job(self) -> Job:
        layer = require_layer(self.layer, "a 3D (or 4D+) Image or Labels layer")
        data = layer.data[0] if layer.multiscale else layer.data
        code = "[0]" if layer.multiscale else ""  # how the volume comes from the layer's data, for the script
        frame = Frame.of(layer)
        if data.ndim > 3 and not self.all_time_points.value:
            # a time series (or channels): the time point shown by the dims sliders, as a lazy view
            index = tuple(int(i) for i in self._viewer.dims.current_step[: data.ndim - 3])
            data = data[index]
            code += f"[{', '.join(map(str, index))}]"
            frame = frame.last_axes(3)
        request = MipmapRequest(
            name=layer.name,
            data=data,
            frame=frame,
            threshold=float(self.threshold.value),
            per_level=bool(self.per_level.value),
            index=code,
        )
        return make_mipmap_job(request)

    def show_result(self, result: JobResult, added: list) -> None:
        levels, shown = result.details["levels"], result.details["level"]
        occupancy = added[-1]  # the occupancy layer is added last, on top
        self._shown = {
            "levels": levels,
            "counts": result.details["counts"],
            "frame": result.details["frame"],
            "layer": weakref.ref(occupancy),
        }
        with self.level.changed.blocked():
            self.level.max = len(levels) - 1
            self.level.value = shown
        self.level.enabled = True

    def _show_level(self, level: int) -> None:
        """Swap the occupancy layer's data and placement to ``level`` (the pyramid is kept, nothing recomputed)."""
        layer = self._shown["layer"]() if self._shown else None
        if layer is None or layer not in self._viewer.layers:
            return
        levels, frame = self._shown["levels"], self._shown["frame"]
        placement = level_placement(frame, level)
        layer.data = as_labels(levels[level])
        layer.scale, layer.translate = placement["scale"], placement["translate"]
        provenance = dict(layer.metadata.get(KEY, {}), expression=level_expression(level))
        layer.metadata = {**layer.metadata, "gridmip_level": level, KEY: provenance}
        self.summary.value = mipmap_summary(levels, self._shown["counts"], level)
