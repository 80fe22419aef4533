"""The "Stitch tiles" dock widget: a mosaic from tiles at roughly known stage positions."""

from __future__ import annotations

import dataclasses
import math
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from magicgui.widgets import CheckBox, ComboBox, FileEdit, FloatSpinBox, LineEdit, PushButton, SpinBox
from napari.layers import Image

from napari_gridmip._jobs import Job, JobResult
from napari_gridmip._jobs.plan import KEY, Source
from napari_gridmip._jobs.stitch import (
    ExportRequest,
    StitchRequest,
    export_targets,
    make_export_job,
    make_stitch_job,
    tile_files_of,
)
from napari_gridmip._jobs.world import Frame
from napari_gridmip._widgets.base import JobWidget, narrow, require_layer, wrapping_label
from napari_gridmip._widgets.runner import notify_error
from napari_gridmip.core.options import FUSE_BLENDS, GRID_ORDERS
from napari_gridmip.core.validate import parse_ints

if TYPE_CHECKING:
    import napari

FROM_LAYER = "a tile stack layer"
FROM_FOLDER = "a folder of TIFF tiles"
FROM_FILE = "a microscope file (OME-TIFF, OME-Zarr, TileConfiguration)"
# layer.metadata entry of a tile stack: the mosaic sample sets it, and so do the mosaic readers (io/_napari.py:
# Fiji's TileConfiguration, OME-TIFF series, OME-Zarr collections), with stage_positions but no grid
MOSAIC_KEY = "gridmip_mosaic"
MICROMETRE = "micrometer"  # the unit of read_mosaic's pixel size, as napari (pint) names it
# a file picked inside an OME-Zarr folder stands for the folder (Qt's file dialog picks files or folders, not both)
ZARR_MARKERS = ("zarr.json", ".zgroup", ".zattrs")
FILE_FILTER = "Mosaics (*.ome.tif *.ome.tiff *.txt zarr.json .zgroup .zattrs);;All files (*)"


def choose_folder(parent: Any, caption: str, start: str = "") -> str:
    """A folder chosen in Qt's dialog, or ``""`` when cancelled (one function, which tests replace)."""
    from qtpy.QtWidgets import QFileDialog

    return QFileDialog.getExistingDirectory(parent, caption, start)


def confirm_replace(parent: Any, text: str) -> bool:
    """Whether the user agrees to replace the files that ``text`` names (one function, which tests replace)."""
    from qtpy.QtWidgets import QMessageBox

    buttons = QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No
    answer = QMessageBox.question(parent, "Replace files?", text, buttons, QMessageBox.StandardButton.No)
    return answer == QMessageBox.StandardButton.Yes


@dataclass(frozen=True)
class _RunTiles:
    """What an export needs of a run's tiles, carried with its result."""

    pixel_size: tuple[float, ...] | None  # micrometres, or None where unknown
    tile_files: list[Path] | None  # each tile's image file, where they are files of their own
    tiles: Any  # a lazy array (from files), or a weak reference to the tile stack layer


class StitchWidget(JobWidget):
    """Register, place and fuse tiles into a mosaic, showing how sure each tile's placement is."""

    settings_key = "stitch"
    persisted = ("source", "pattern", "overlap", "order", "max_shift", "blend", "flat_field")

    def __init__(self, napari_viewer: napari.viewer.Viewer) -> None:
        super().__init__(napari_viewer)
        self.source = ComboBox(
            name="source", label="Tiles from", choices=[FROM_LAYER, FROM_FOLDER, FROM_FILE], value=FROM_LAYER
        )
        self.layer = self.layer_combo("layer", "Tiles (n, [C,] Y, X)", (Image,))
        self.folder = FileEdit(name="folder", label="Folder", mode="d")
        self.microscope_file = FileEdit(name="microscope_file", label="Microscope file", mode="r", filter=FILE_FILTER)
        self.microscope_file.tooltip = (
            "An OME-TIFF whose series are the tiles, Fiji's TileConfiguration.txt, or an OME-Zarr collection "
            "folder (type its path, pick the zarr.json inside it, or use the button below): each tile is placed at "
            "its stage position from the file"
        )
        for edit in (self.folder, self.microscope_file):  # the path and a short button fit the dock's column
            _compact(edit)
        self.zarr_button = PushButton(name="choose_zarr", text="OME-Zarr folder...")
        self.zarr_button.tooltip = "Pick an OME-Zarr collection (a folder whose images are the tiles)"
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
        self.export_button = PushButton(name="export", text="Export...", enabled=False)
        self.export_button.tooltip = (
            "Write the last result into a folder: the registered positions as Fiji's "
            "TileConfiguration.registered.txt (with the tiles as TIFF files where they are no files of their own) "
            "and the mosaic as mosaic.ome.zarr, with its pixel size"
        )
        self._export: dict[str, Any] | None = None  # the last result: registration, origin, its tiles, mosaic layer
        self._finish(
            [
                self.source,
                self.layer,
                self.folder,
                self.microscope_file,
                self.zarr_button,
                self.pattern,
                self.grid_shape,
                self.overlap,
                self.stage_note,
                self.flat_field,
            ],
            outputs=[self.export_button],
            advanced=[self.order, self.max_shift, self.blend],
        )
        self.source.changed.connect(self._source_changed)
        self.layer.changed.connect(self._fill_from_metadata)
        self.zarr_button.changed.connect(self._choose_zarr)
        self.export_button.changed.connect(self.export)
        self.runner.on_idle.append(self._update_export)
        self._source_changed()

    # -- fields --------------------------------------------------------------------------
    def _source_changed(self, *_: Any) -> None:
        self._fill_from_metadata()

    def _stage_positions(self) -> np.ndarray | None:
        layer = self.layer.value
        if self.source.value != FROM_LAYER or layer is None:
            return None
        positions = layer.metadata.get(MOSAIC_KEY, {}).get("stage_positions")
        return None if positions is None else np.asarray(positions, dtype=float)

    def _fill_from_metadata(self, *_: Any) -> None:
        """Take the grid and overlap of a layer that describes its tiles (as the mosaic sample does); show the grid's
        fields only where no stage positions place the tiles (a file's, or a reader's layer's)."""
        source = self.source.value
        layer = self.layer.value if source == FROM_LAYER else None
        mosaic = getattr(layer, "metadata", {}).get(MOSAIC_KEY) if layer is not None else None
        if mosaic and "grid_shape" in mosaic:
            self.grid_shape.value = ", ".join(map(str, mosaic["grid_shape"]))
        if mosaic and "overlap" in mosaic:
            self.overlap.value = float(mosaic["overlap"])
        from_layer, from_folder, from_file = (source == s for s in (FROM_LAYER, FROM_FOLDER, FROM_FILE))
        placed = from_file or self._stage_positions() is not None
        if from_file:
            self.stage_note.value = "positions from the file"
        else:
            self.stage_note.value = "positions from the layer's metadata" if placed else "positions from the grid"
        grid = not placed
        self.show_fields({
            self.layer: from_layer, self.folder: from_folder, self.pattern: from_folder,
            self.microscope_file: from_file, self.zarr_button: from_file,
            self.grid_shape: grid, self.overlap: grid, self.order: grid,
        })  # fmt: skip

    def _choose_zarr(self, *_: Any) -> None:
        value = self.microscope_file.line_edit.value
        start = str(Path(value).parent) if value else ""
        chosen = choose_folder(self.native, "Choose an OME-Zarr collection", start)
        if chosen:
            self.microscope_file.value = chosen

    def _mosaic_path(self) -> Path:
        """The microscope file chosen (a file picked inside an OME-Zarr folder: the folder)."""
        text = self.microscope_file.line_edit.value.strip()
        if not text:
            raise ValueError("choose a microscope file first: an OME-TIFF, a TileConfiguration or an OME-Zarr folder")
        path = Path(text).expanduser().absolute()
        return path.parent if path.name in ZARR_MARKERS else path

    def _prefetch(self) -> None:
        # tiles from files are lazy (read when Run asks, never before): only a layer's are computed early
        if self.source.value == FROM_LAYER:
            super()._prefetch()

    # -- running -------------------------------------------------------------------------
    def run(self) -> None:
        super().run()
        self._update_export()

    def make_job(self) -> Job:
        options = {  # read here, on the GUI thread
            "overlap": float(self.overlap.value),
            "order": self.order.value,
            "max_shift": int(self.max_shift.value) or "auto",
            "blend": self.blend.value,
            "flat_field": bool(self.flat_field.value),
        }
        if self.source.value == FROM_FILE:
            path = self._mosaic_path()
            if not path.exists():
                raise ValueError(f"{str(path)!r} does not exist")

            def run_file(progress: Any) -> JobResult:
                # read in the worker: the OME-XML parser's first import alone takes a second, and a
                # TileConfiguration opens every tile's header; a bad file is the run's error notification
                request, run_tiles = file_request(path, options)
                return _with_tiles(make_stitch_job(request).run(progress), run_tiles)

            return Job(f"Stitching {_file_title(path)!r}", run_file)
        if self.source.value == FROM_LAYER:
            layer = require_layer(self.layer, "an Image layer holding a stack of tiles")
            tiles, name = layer.data, layer.name
            source = Source("tiles", layer=layer.name)
            positions = self._stage_positions()
            code = f"viewer.layers[{layer.name!r}].metadata[{MOSAIC_KEY!r}]['stage_positions']"
            if positions is not None:  # placed by its positions: the grid only says how many spatial axes
                grid = (len(positions),) + (1,) * (positions.shape[-1] - 1)
            else:
                grid = _checked_grid(parse_ints("grid", self.grid_shape.value), self.grid_shape.value)
            stage = layer.metadata.get(MOSAIC_KEY, {})
            pixel_size, frame = _layer_pixel_size(layer, stage.get("pixel_size"), len(grid))
            files = tile_files_of(stage.get("source"), stage.get("names"))  # a TileConfiguration's tiles
            run_tiles = _RunTiles(pixel_size, files, weakref.ref(layer))
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
            run_tiles = _RunTiles(None, [Path(p).absolute() for p in found.paths], tiles)
        grid = _checked_grid(grid, self.grid_shape.value)
        if positions is None and math.prod(grid) != tiles.shape[0]:
            raise ValueError(f"a grid of {grid} holds {math.prod(grid)} tiles; the stack has {tiles.shape[0]}")
        request = StitchRequest(
            name=name, tiles=tiles, frame=frame, grid_shape=tuple(grid), positions=positions, source=source,
            positions_code=code, **options,
        )  # fmt: skip
        job = make_stitch_job(request)
        return Job(job.description, lambda progress: _with_tiles(job.run(progress), run_tiles))

    def show_result(self, result: JobResult, added: list) -> None:
        mosaic = next((layer for layer in added if layer.metadata.get(KEY, {}).get("role") == "mosaic"), None)
        details = result.details
        if mosaic is None or "registration" not in details:
            return
        self._export = {
            "positions": np.asarray(details["registration"].positions, dtype=float),
            "origin": np.asarray(details["origin"], dtype=float),
            "run_tiles": details["tiles"],
            "mosaic": weakref.ref(mosaic),
        }

    # -- export --------------------------------------------------------------------------
    def _export_layer(self) -> Any:
        """The last result's mosaic layer, while it is in the viewer (else None: nothing to export)."""
        layer = self._export["mosaic"]() if self._export else None
        return layer if layer is not None and layer in self._viewer.layers else None

    def _update_export(self) -> None:
        if not self.released:
            self.export_button.enabled = not self.runner.busy and self._export_layer() is not None

    def _layers_changed(self) -> None:
        self._update_export()  # the mosaic layer removed: nothing to export

    def export(self, *_: Any) -> None:
        """Ask for a folder and write the last result there (in the background): the registered positions as
        ``TileConfiguration.registered.txt`` (the tiles beside it where they are no files) and ``mosaic.ome.zarr``."""
        layer = self._export_layer()
        if self.runner.busy or self.released or layer is None:
            return
        state = self._export
        run_tiles: _RunTiles = state["run_tiles"]
        chosen = choose_folder(self.native, "Export the mosaic and its TileConfiguration to", "")
        if not chosen:
            return
        folder = Path(chosen).absolute()
        tiles = run_tiles.tiles
        if isinstance(tiles, weakref.ref):  # the tile stack layer, if it is still there
            tile_layer = tiles()
            tiles = None if tile_layer is None or tile_layer not in self._viewer.layers else tile_layer.data
        positions = state["positions"]
        targets = export_targets(folder, len(positions), run_tiles.tile_files, mosaic=True)
        if len(targets) > 2 and tiles is None:  # the tiles must be written, and their layer is gone
            notify_error("Export: the tiles' layer was removed; run again to export its tiles with the mosaic")
            return
        existing = [path.name for path in targets if path.exists()]
        if existing:
            shown = ", ".join(existing[:3]) + (f" and {len(existing) - 3} more" if len(existing) > 3 else "")
            if not confirm_replace(self.native, f"{shown} already in {folder}. Replace?"):
                return
        provenance = layer.metadata.get(KEY)
        request = ExportRequest(
            folder=folder,
            positions=positions,
            mosaic=layer.data,
            origin=state["origin"],
            pixel_size=run_tiles.pixel_size,
            tiles=tiles,
            tile_files=run_tiles.tile_files,
            name=layer.name,
            attributes={KEY: provenance} if _json_ready(provenance) else None,
            overwrite=True,  # replacing what is there was agreed above
        )
        self.export_button.enabled = False
        self.runner.start(make_export_job(request), on_done=self._exported)

    def _exported(self, result: JobResult, added: list) -> None:
        self.summary.value = result.summary
        self.summary.tooltip = result.summary

    def release(self) -> None:
        super().release()
        self._export = None  # the last result's arrays go with the dock


def file_request(path: Path, options: dict[str, Any]) -> tuple[StitchRequest, _RunTiles]:
    """The stitching request of a microscope file (read lazily: metadata and headers only), the tiles placed by
    its stage positions and the results scaled by its pixel size; ``options`` are the request's settings."""
    mosaic = read_microscope_file(path)
    tiles, positions = mosaic.tiles, mosaic.positions
    d = positions.shape[1]
    frame = Frame.unit(tiles.ndim)
    if mosaic.pixel_size is not None:
        frame = _in_micrometres(frame, mosaic.pixel_size, d)
    request = StitchRequest(
        name=_file_title(path), tiles=tiles, frame=frame, grid_shape=(len(positions),) + (1,) * (d - 1),
        positions=positions, source=Source("tiles", expression=f"gm.read_mosaic({str(path)!r}).tiles"),
        positions_code=f"gm.read_mosaic({str(path)!r}).positions", **options,
    )  # fmt: skip
    return request, _RunTiles(mosaic.pixel_size, tile_files_of(path, mosaic.names), tiles)


def _with_tiles(result: JobResult, run_tiles: _RunTiles) -> JobResult:
    """The run's tiles ride with its result, for Export."""
    return dataclasses.replace(result, details={**result.details, "tiles": run_tiles})


def read_microscope_file(path: Path) -> Any:
    """:func:`~napari_gridmip.read_mosaic` of ``path``, lazily; whatever goes wrong is a ValueError that names the
    file and says what (the widget shows it as a notification)."""
    from napari_gridmip.io import read_mosaic

    try:
        return read_mosaic(path)
    except Exception as error:  # noqa: BLE001 - the readers' own (TIFF, XML, Zarr) too: one clear line, no traceback
        text = str(error) or type(error).__name__
        if path.name in text:  # read_mosaic's messages name the file and what was expected
            raise ValueError(text) from None
        raise ValueError(f"cannot read {str(path)!r} as a mosaic: {text}") from None


def _file_title(path: Path) -> str:
    """A mosaic's name from its file: ``scan`` for ``scan.ome.tif`` or ``scan.ome.zarr``; for a TileConfiguration
    (or a folder holding one), its folder's name."""
    name, lower = path.name, path.name.lower()
    if lower.endswith(".txt"):
        return path.parent.name or name
    for suffix in (".ome.tiff", ".ome.tif", ".ome.zarr", ".zarr", ".tiff", ".tif"):
        if lower.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def _compact(edit: FileEdit) -> None:
    """A path field whose button says "..." (its tooltip says what it opens) and whose path box may shrink: magicgui's
    "Select file" and "Choose directory" buttons made the row wider than the dock, which cut the button off."""
    edit.choose_btn.text = "..."
    edit.choose_btn.tooltip = "Choose a folder" if edit.mode.value == "d" else "Choose a file"
    edit.choose_btn.native.setMaximumWidth(32)
    narrow(edit.line_edit)


def _checked_grid(grid: tuple[int, ...], text: str) -> tuple[int, ...]:
    if len(grid) not in (2, 3):
        raise ValueError(f"the grid must be 2 or 3 numbers (rows, cols), e.g. '3, 4'; got {text!r}")
    return tuple(grid)


def _in_micrometres(frame: Frame, pixel_size: Any, d: int) -> Frame:
    """``frame`` with its last ``d`` axes scaled by ``pixel_size`` in micrometres (the result layers' scale bar
    then reads micrometres)."""
    scale = np.array(frame.scale, dtype=float)
    scale[-d:] = np.asarray(pixel_size, dtype=float)[-d:]
    units = [str(u) for u in frame.units] if frame.units is not None else ["pixel"] * frame.ndim
    units[-d:] = [MICROMETRE] * d
    return dataclasses.replace(frame, scale=scale, units=tuple(units))


def _layer_pixel_size(layer: Any, stated: Any, d: int) -> tuple[tuple[float, ...] | None, Frame]:
    """The tiles' pixel size in micrometres (None where unknown) and the frame of the results.

    A layer in units of length (a reader's, or one the user gave units) is already in physical units: its scale is
    the pixel size. A layer in pixels whose metadata states a pixel size (the mosaic readers' ``pixel_size``) gets
    its results in micrometres."""
    import pint

    frame = Frame.of(layer)
    units = list(getattr(layer, "units", None) or [])[-d:]
    registry = pint.get_application_registry()
    length = registry("micrometer").dimensionality
    if len(units) == d and all(getattr(u, "dimensionality", None) == length for u in units):
        factors = [float((1 * u).to(MICROMETRE).magnitude) for u in units]
        return tuple(float(s) * f for s, f in zip(frame.scale[-d:], factors)), frame
    if stated is not None and len(stated) == d:
        return tuple(float(s) for s in stated), _in_micrometres(frame, stated, d)
    return None, frame


def _json_ready(value: Any) -> bool:
    import json

    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return value is not None
