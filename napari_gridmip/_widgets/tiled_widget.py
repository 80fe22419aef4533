"""The "Process in tiles" dock widget: a named filter, or your own function, on an image layer, tile by tile."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from magicgui.widgets import CheckBox, ComboBox, Container, FloatSpinBox, LineEdit, SpinBox
from napari.layers import Image

from napari_gridmip._jobs import Job
from napari_gridmip._jobs.tiled import CUSTOM, TiledRequest, make_tiled_job, parse_keywords
from napari_gridmip._jobs.world import Frame
from napari_gridmip._widgets.base import JobWidget, labels_above, require_layer
from napari_gridmip.core.options import WEIGHTED_BLENDS

if TYPE_CHECKING:
    import napari

HALO_TIP = (
    "Halo: pixels of context read around each tile and cut away after your function ran: its reach (a "
    "filter's radius). With the right halo the tiled result equals the untiled one exactly. The named "
    "filters set their own."
)
OVERLAP_TIP = (
    "Overlap: pixels that the kept parts of neighbouring tiles share, blended with the weights below. "
    "For functions whose output differs from tile to tile (a network); an exact filter needs none."
)


class TiledWidget(JobWidget):
    """Run a filter on an Image layer in tiles (lazily for dask or Zarr layers)."""

    settings_key = "tiled"
    persisted = ("filter", "tile", "tiled_axes", "overlap", "blend")

    def __init__(self, napari_viewer: napari.viewer.Viewer) -> None:
        from napari_gridmip.core.patches.tiled_filters import TILED_FILTER_NAMES

        super().__init__(napari_viewer)
        self.layer = self.layer_combo("layer", "Image", (Image,))
        self.filter = ComboBox(
            name="filter",
            label="Filter",
            choices=[*TILED_FILTER_NAMES, CUSTOM],
            value=TILED_FILTER_NAMES[0],
            tooltip="A named filter (its halo is set for you), or your own function by its import path",
        )
        self.parameters = Container(name="parameters", label="Parameters", labels=True)
        self.parameters.margins = (0, 0, 0, 0)
        self.import_path = LineEdit(
            name="import_path",
            label="Function",
            value="",
            tooltip="package.module:function, called on each tile (an array) and returning an array of its size",
        )
        self.arguments = LineEdit(
            name="arguments",
            label="Arguments",
            value="",
            tooltip="Keywords for the function, e.g. size=5, mode='nearest'",
        )
        self.halo = SpinBox(name="halo", label="Halo (px)", value=0, min=0, max=4096, tooltip=HALO_TIP)
        self.labels_out = CheckBox(
            name="labels_out",
            text="Returns labels",
            value=False,
            tooltip="The function returns labels (integers): the result is a Labels layer",
        )
        self.tiled_axes = SpinBox(
            name="tiled_axes",
            label="Tiled axes",
            value=2,
            min=1,
            max=3,
            tooltip="How many of the last axes are tiled and filtered (2: each plane; 3: the volume)",
        )
        self.tile = SpinBox(name="tile", label="Tile (px)", value=256, min=8, max=8192, step=32)
        self.overlap = SpinBox(name="overlap", label="Overlap (px)", value=0, min=0, max=4096, tooltip=OVERLAP_TIP)
        self.blend = ComboBox(
            name="blend",
            label="Blend",
            choices=[*WEIGHTED_BLENDS, "crop"],
            value="gaussian",
            tooltip="How overlapping tiles merge: weighted means, or 'crop' (each pixel from the tile that owns it)",
        )
        self._finish(
            [
                self.layer,
                self.filter,
                self.parameters,
                self.import_path,
                self.arguments,
                self.halo,
                self.labels_out,
                self.tiled_axes,
            ],
            advanced=[self.tile, self.overlap, self.blend],
        )
        self.filter.changed.connect(self._filter_changed)
        self.overlap.changed.connect(self._overlap_changed)
        self._filter_changed()
        self._overlap_changed()

    def _overlap_changed(self, *_: Any) -> None:
        """The blend only matters where tiles overlap."""
        self.show_fields({self.blend: int(self.overlap.value) > 0})

    def _filter_changed(self, *_: Any) -> None:
        """Show the chosen filter's own parameters (or the function's fields)."""
        from napari_gridmip.core.patches.tiled_filters import TILED_FILTERS

        custom = self.filter.value == CUSTOM
        fields = (self.import_path, self.arguments, self.halo, self.labels_out)
        self.show_fields({**{field: custom for field in fields}, self.parameters: not custom})
        self.parameters.clear()
        if custom:
            return
        spec = TILED_FILTERS[self.filter.value]
        self.filter.tooltip = spec.description
        for parameter in spec.parameters:
            if parameter.kind is str:
                field = ComboBox(name=parameter.name, choices=list(parameter.choices), value=parameter.default)
            elif parameter.kind is int:
                low = int(parameter.minimum) if parameter.minimum is not None else -(10**6)
                field = SpinBox(name=parameter.name, value=parameter.default, min=low, max=10**6)
            else:
                low = parameter.minimum if parameter.minimum is not None else -1e12
                field = FloatSpinBox(name=parameter.name, value=parameter.default, min=low, max=1e12, step=0.5)
            field.tooltip = parameter.tooltip
            self.parameters.append(field)
        labels_above(self.parameters)

    def make_job(self) -> Job:
        layer = require_layer(self.layer, "an Image layer")
        if layer.rgb or layer.multiscale:
            raise ValueError(f"layer {layer.name!r} must be a plain image (not RGB, not multiscale)")
        d = int(self.tiled_axes.value)
        if layer.ndim < d:
            raise ValueError(f"layer {layer.name!r} has {layer.ndim} axes; it cannot be tiled along {d}")
        custom = self.filter.value == CUSTOM
        parameters = (
            parse_keywords(self.arguments.value) if custom else {field.name: field.value for field in self.parameters}
        )
        request = TiledRequest(
            name=layer.name,
            data=layer.data,
            frame=Frame.of(layer),
            filter=self.filter.value,
            tile=(int(self.tile.value),) * d,
            parameters=parameters,
            overlap=int(self.overlap.value),
            blend=self.blend.value,
            import_path=self.import_path.value if custom else "",
            halo=int(self.halo.value),
            labels=bool(self.labels_out.value),
        )
        return make_tiled_job(request)
