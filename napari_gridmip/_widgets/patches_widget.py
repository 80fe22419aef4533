"""The "Reassemble patches" dock widget: a layer of patches (a tile grid, as extracted by
:func:`napari_gridmip.extract_patches`) merged back into one image with the chosen blend, so that a tiled result can be
looked at whole."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from magicgui.widgets import ComboBox, LineEdit, SpinBox
from napari.layers import Image

from napari_gridmip._jobs import Job
from napari_gridmip._jobs.patches import MergeRequest, infer_image_shape, make_merge_job
from napari_gridmip._jobs.world import Frame
from napari_gridmip._widgets.base import JobWidget, require_layer
from napari_gridmip.core.options import BLEND_MODES
from napari_gridmip.core.validate import parse_ints

if TYPE_CHECKING:
    import napari

GRID_FIRST = "grid axes first"
FLAT_STACK = "flat stack of patches"
TILING_KEY = "gridmip_tiling"  # layer.metadata entry that describes a patch stack (the tiles sample sets it)


class PatchesWidget(JobWidget):
    """Merge an Image layer holding a patch stack back into one image."""

    settings_key = "patches"
    persisted = ("layout_choice", "tiled_axes", "blend")

    def __init__(self, napari_viewer: napari.viewer.Viewer) -> None:
        super().__init__(napari_viewer)
        self.layer = self.layer_combo("layer", "Patches", (Image,))
        self.layout_choice = ComboBox(name="layout", label="Layout", choices=[GRID_FIRST, FLAT_STACK], value=GRID_FIRST)
        self.tiled_axes = SpinBox(name="tiled_axes", label="Tiled axes (d)", value=2, min=1, max=3)
        self.grid_shape = LineEdit(
            name="grid_shape",
            label="Grid shape",
            value="",
            tooltip="For a flat stack (N, ..., p1, ..., pd): the grid, e.g. '4, 5'",
        )
        self.stride = LineEdit(
            name="stride",
            label="Stride",
            value="",
            tooltip="One integer per tiled axis, e.g. '96, 96'; empty = patch size (no overlap)",
        )
        self.image_shape = LineEdit(
            name="image_shape",
            label="Image shape",
            value="",
            tooltip="Empty: inferred (from the layer's tiling metadata, else the grid)",
        )
        self.blend = ComboBox(name="blend", label="Blend", choices=list(BLEND_MODES), value="mean")
        self._finish(
            [
                self.layer,
                self.layout_choice,
                self.tiled_axes,
                self.grid_shape,
                self.stride,
                self.blend,
            ],
            advanced=[self.image_shape],
        )
        self.layer.changed.connect(self._fill_from_metadata)
        self.layout_choice.changed.connect(self._show_layout)
        self._fill_from_metadata()
        self._show_layout()

    def _show_layout(self, *_: Any) -> None:
        """The grid shape is asked for only where the layer does not hold it: a flat stack of patches."""
        self.show_fields({self.grid_shape: self.layout_choice.value == FLAT_STACK})

    def _fill_from_metadata(self, *_: Any) -> None:
        """Take the tiling of a layer that describes it (as the tiles sample does)."""
        layer = self.layer.value
        tiling = getattr(layer, "metadata", {}).get(TILING_KEY) if layer is not None else None
        if not tiling:
            return
        self.tiled_axes.value = len(tiling["stride"])
        self.stride.value = ", ".join(map(str, tiling["stride"]))
        self.image_shape.value = ", ".join(map(str, tiling["image_shape"]))
        self.layout_choice.value = GRID_FIRST

    def read_tiling(self, data_shape: tuple[int, ...]) -> dict[str, Any]:
        """Turn the fields and the layer's shape into merge arguments (raises ValueError on bad input)."""
        d = int(self.tiled_axes.value)
        if self.layout_choice.value == FLAT_STACK:
            grid = parse_ints("grid shape", self.grid_shape.value)
            if len(grid) != d:
                raise ValueError(f"grid shape must have {d} entries for {d} tiled axes; got {self.grid_shape.value!r}")
            if not data_shape or data_shape[0] != math.prod(grid):
                raise ValueError(
                    f"a flat stack of shape {data_shape} needs {math.prod(grid)} patches for grid {grid}; "
                    f"got {data_shape[0] if data_shape else 0}"
                )
            shape = grid + tuple(data_shape[1:])
        else:
            shape = tuple(data_shape)
        if len(shape) < 2 * d:
            raise ValueError(f"a patch stack with {d} tiled axes needs at least {2 * d} axes; got shape {data_shape}")
        grid, lead, patch = shape[:d], shape[d : len(shape) - d], shape[len(shape) - d :]
        stride = parse_ints("stride", self.stride.value) or patch
        if len(stride) != d:
            raise ValueError(f"stride must have {d} entries; got {self.stride.value!r}")
        image_shape = parse_ints("image shape", self.image_shape.value) or infer_image_shape(grid, lead, patch, stride)
        return {"patch_shape": shape, "image_shape": image_shape, "stride": stride, "lead": len(lead)}

    def make_job(self) -> Job:
        layer = require_layer(self.layer, "an Image layer holding patches")
        if layer.multiscale or layer.rgb:
            raise ValueError(f"layer {layer.name!r} must be a plain (not RGB, not multiscale) patch stack")
        data = layer.data
        tiling = self.read_tiling(tuple(data.shape))
        d = len(tiling["stride"])
        request = MergeRequest(
            name=layer.name,
            patches=data.reshape(tiling["patch_shape"]),  # a flat stack becomes a grid (a view, nothing loaded)
            index="" if tiling["patch_shape"] == tuple(data.shape) else f".reshape{tuple(tiling['patch_shape'])}",
            image_shape=tiling["image_shape"],
            stride=tiling["stride"],
            blend=self.blend.value,
            frame=Frame.of(layer),
            # the merged image keeps the patch stack's leading and pixel axes
            placement_axes=tuple(range(layer.ndim - d - tiling["lead"], layer.ndim)),
        )
        return make_merge_job(request)
