"""The "Stitch tiles" dock widget: a mosaic from tiles at roughly known stage positions."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from magicgui.widgets import CheckBox, ComboBox, FileEdit, FloatSpinBox, LineEdit, SpinBox
from napari.layers import Image

from napari_gridmip._jobs import Job
from napari_gridmip._jobs.stitch import StitchRequest, make_stitch_job
from napari_gridmip._placement import Frame
from napari_gridmip._provenance import Source
from napari_gridmip._widgets._base import JobWidget, require_layer, wrapping_label
from napari_gridmip.core._options import FUSE_BLENDS, GRID_ORDERS
from napari_gridmip.core._validate import parse_ints

if TYPE_CHECKING:
    import napari

FROM_LAYER = "a tile stack layer"
FROM_FOLDER = "a folder of TIFF tiles"
# layer.metadata entry of a tile stack: the mosaic sample sets it, and so do the mosaic readers (io/_napari.py:
# Fiji's TileConfiguration, OME-TIFF series, OME-Zarr collections), with stage_positions but no grid
MOSAIC_KEY = "gridmip_mosaic"


class StitchWidget(JobWidget):
    """Register, place and fuse tiles into a mosaic, showing how sure each tile's placement is."""

    settings_key = "stitch"
    persisted = ("source", "pattern", "overlap", "order", "max_shift", "blend", "flat_field")

    def __init__(self, napari_viewer: napari.viewer.Viewer) -> None:
        super().__init__(napari_viewer)
        self.source = ComboBox(name="source", label="Tiles from", choices=[FROM_LAYER, FROM_FOLDER], value=FROM_LAYER)
        self.layer = self.layer_combo("layer", "Tiles (n, [C,] Y, X)", (Image,))
        self.folder = FileEdit(name="folder", label="Folder", mode="d")
        self.pattern = LineEdit(
            name="pattern",
            label="File names",
            value="tile_{row}_{col}.tif",
            tooltip="{row} and {col} (and {plane}) from 0 or 1, or one acquisition {index}, e.g. img_{index:03}.tif",
        )
        self.grid_shape = LineEdit(
            name="grid_shape", label="Grid (rows, cols)", value="", tooltip="Tiles along each axis, e.g. '3, 4'"
        )
        self.overlap = FloatSpinBox(
            name="overlap",
            label="Overlap",
            value=0.1,
            min=0.0,
            max=0.9,
            step=0.01,
            tooltip="The nominal overlap of neighbours, as a fraction of the tile",
        )
        self.order = ComboBox(name="order", label="Order", choices=list(GRID_ORDERS), value=GRID_ORDERS[0])
        self.order.tooltip = "The acquisition order of the tiles (when the stage positions are not known)"
        self.max_shift = SpinBox(
            name="max_shift",
            label="Max shift (px)",
            value=0,
            min=0,
            max=4096,
            tooltip="The largest stage error to search for, per axis; 0: auto, from the tiles' overlap (3/4 of its "
            "width: register_tiles' max_shift='auto')",
        )
        self.blend = ComboBox(name="blend", label="Blend", choices=list(FUSE_BLENDS), value=FUSE_BLENDS[0])
        self.blend.tooltip = "linear: weights falling off towards each tile's edges (no seams)"
        self.flat_field = CheckBox(name="flat_field", label="Flat-field correction", value=False)
        self.flat_field.tooltip = (
            "Estimate the illumination profile (vignetting) from the tiles and divide it out before fusing: "
            "no seams from uneven light"
        )
        self.stage_note = wrapping_label("stage_note", "Stage", "positions from the grid")
        self._finish(
            [
                self.source,
                self.layer,
                self.folder,
                self.pattern,
                self.grid_shape,
                self.overlap,
                self.stage_note,
                self.flat_field,
            ],
            advanced=[self.order, self.max_shift, self.blend],
        )
        self.source.changed.connect(self._source_changed)
        self.layer.changed.connect(self._fill_from_metadata)
        self._source_changed()
        self._fill_from_metadata()

    def _source_changed(self, *_: Any) -> None:
        from_layer = self.source.value == FROM_LAYER
        self.show_fields({self.layer: from_layer, self.folder: not from_layer, self.pattern: not from_layer})
        self._fill_from_metadata()

    def _stage_positions(self) -> np.ndarray | None:
        layer = self.layer.value
        if self.source.value != FROM_LAYER or layer is None:
            return None
        positions = layer.metadata.get(MOSAIC_KEY, {}).get("stage_positions")
        return None if positions is None else np.asarray(positions, dtype=float)

    def _fill_from_metadata(self, *_: Any) -> None:
        """Take the grid and overlap of a layer that describes its tiles (as the mosaic sample does)."""
        layer = self.layer.value if self.source.value == FROM_LAYER else None
        mosaic = getattr(layer, "metadata", {}).get(MOSAIC_KEY) if layer is not None else None
        if mosaic and "grid_shape" in mosaic:
            self.grid_shape.value = ", ".join(map(str, mosaic["grid_shape"]))
        if mosaic and "overlap" in mosaic:
            self.overlap.value = float(mosaic["overlap"])
        known = self._stage_positions() is not None
        self.stage_note.value = "positions from the layer's metadata" if known else "positions from the grid"

    def make_job(self) -> Job:
        if self.source.value == FROM_LAYER:
            layer = require_layer(self.layer, "an Image layer holding a stack of tiles")
            tiles, name, frame = layer.data, layer.name, Frame.of(layer)
            source = Source("tiles", layer=layer.name)
            positions = self._stage_positions()
            code = f"viewer.layers[{layer.name!r}].metadata[{MOSAIC_KEY!r}]['stage_positions']"
            grid = parse_ints("grid", self.grid_shape.value)
            if positions is not None and len(grid) != positions.shape[-1]:
                # placed by its positions: the grid only says how many spatial axes (a reader's layer has none)
                grid = (len(positions),) + (1,) * (positions.shape[-1] - 1)
        else:
            from napari_gridmip.io import read_tiles

            folder = str(self.folder.value)
            found = read_tiles(folder, self.pattern.value)  # a clear error now, on the GUI thread: it reads no pixels
            tiles, name = found.tiles, Path(folder).name or str(folder)
            frame = Frame.unit(tiles.ndim)
            source = Source("tiles", expression=f"gm.read_tiles({folder!r}, {self.pattern.value!r}).tiles")
            positions, code = None, None
            if found.grid_index is not None:  # a grid pattern names each tile's place
                grid = tuple(int(n) for n in found.grid_index.max(axis=0) + 1)
                step = np.asarray(tiles.shape[-len(grid) :], float) * (1 - float(self.overlap.value))
                positions = found.grid_index * step
                code = f"gm.read_tiles({folder!r}, {self.pattern.value!r}).grid_index * np.array({step.tolist()})"
            else:
                grid = parse_ints("grid", self.grid_shape.value)
        if len(grid) not in (2, 3):
            raise ValueError(
                f"the grid must be 2 or 3 numbers (rows, cols), e.g. '3, 4'; got {self.grid_shape.value!r}"
            )
        if positions is None and math.prod(grid) != tiles.shape[0]:
            raise ValueError(f"a grid of {grid} holds {math.prod(grid)} tiles; the stack has {tiles.shape[0]}")
        request = StitchRequest(
            name=name,
            tiles=tiles,
            frame=frame,
            grid_shape=tuple(grid),
            overlap=float(self.overlap.value),
            order=self.order.value,
            positions=positions,
            max_shift=int(self.max_shift.value) or "auto",
            blend=self.blend.value,
            flat_field=bool(self.flat_field.value),
            source=source,
            positions_code=code,
        )
        return make_stitch_job(request)
