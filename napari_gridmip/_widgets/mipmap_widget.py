"""The "Occupancy mipmap" dock widget: a 3D layer's occupancy pyramid at a threshold, shown as layers, and the
"Full resolution in 3D" switch (:mod:`.live_render`) that renders the camera's view from the chunks its rays
enter, for volumes larger than napari's own 3D view shows at full resolution."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from magicgui.widgets import CheckBox, ComboBox, Container, FloatSlider, FloatSpinBox, PushButton, SpinBox
from napari.layers import Image, Labels

from napari_gridmip._jobs import Job, JobResult
from napari_gridmip._jobs.mipmap import (
    RENDER_MODES,
    Camera,
    MipmapRequest,
    Pyramid,
    as_labels,
    level_expression,
    level_placement,
    make_crop_job,
    make_mipmap_job,
    make_render_job,
)
from napari_gridmip._jobs.plan import KEY, script_from_layers
from napari_gridmip._jobs.world import Frame
from napari_gridmip._widgets.base import JobWidget, require_layer, wrapping_label
from napari_gridmip._widgets.runner import notify_error

if TYPE_CHECKING:
    import napari

SLIDER_STEPS = 1000  # the slider's resolution over the data's range


class MipmapWidget(JobWidget):
    """Compute the occupancy pyramid of a 3D Image or Labels layer and show one level's cells as blocks.

    Run builds the volume's max pyramid once (in the worker); the threshold (its spin box, and the slider beside
    it over the data's range) then re-thresholds the level shown with NumPy on the GUI thread, without a new run.
    "Crop to occupied" and "Render full-resolution view" work from the same pyramid, in the worker.
    """

    settings_key = "mipmap"
    persisted = ("threshold", "per_level", "all_time_points", "render_mode")

    def __init__(self, napari_viewer: napari.viewer.Viewer) -> None:
        super().__init__(napari_viewer)
        # the last result: its pyramid, level and layers (weakly), and the input layer (weakly)
        self._shown: dict[str, Any] = {}
        self._extra: list[weakref.ref] = []  # crops and renders made from the last result
        self._camera_state: dict[str, Any] | None = None  # the camera a render started from
        self.layer = self.layer_combo("layer", "Volume", (Image, Labels))
        self.threshold = FloatSpinBox(
            name="threshold",
            label="Threshold",
            value=0.0,
            min=-1e12,
            max=1e12,
            step=0.1,
            tooltip="A voxel is occupied when its value is greater than this; NaN is empty. After a run, changing "
            "it re-thresholds the level shown at once (no new run).",
        )
        self.threshold_slider = FloatSlider(
            name="threshold_slider",
            label="",
            value=0.0,
            min=0.0,
            max=1.0,
            step=1.0 / SLIDER_STEPS,
            readout=False,
            tracking=True,
            tooltip="The threshold over the data's range (minimum to maximum): moving it updates the blocks shown "
            "from the max pyramid, without recomputing",
        )
        self.per_level = CheckBox(
            name="per_level",
            text="One layer per level",
            value=False,
            tooltip="Also add one image layer per level of the pyramid, each level's occupied cells (hidden at first)",
        )
        self.all_time_points = CheckBox(
            name="all_time_points",
            text="All time points",
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
        self.crop_button = PushButton(name="crop", text="Crop to occupied", enabled=False)
        self.crop_button.tooltip = (
            "Add the input cut to the bounding box of its voxels above the threshold, placed over the input"
        )
        self.render_mode = ComboBox(
            name="render_mode",
            label="Render",
            choices=list(RENDER_MODES),
            value="MIP",
            tooltip="MIP: the largest value along each ray. Depth: the distance to the first voxel above the "
            "threshold (world units from the plane through the camera's centre; near is dark).",
        )
        self.render_button = PushButton(name="render", text="Render", enabled=False)
        self.render_button.tooltip = (
            "Ray-march the input from the current 3D camera at the canvas resolution (at most 1024 px on the long "
            "side), skipping empty space with the pyramid. The picture is a 2D layer: switch to 2D to see it "
            "face on."
        )
        self.live_3d = CheckBox(
            name="live_3d",
            text="Full resolution in 3D",
            value=False,
            tooltip="Follow the 3D camera: when it rests, the chosen layer's view is rendered from its full-resolution "
            "data (reading only the chunks the rays need) and shown in the canvas over napari's coarse view.",
        )
        self._live: Any = None  # the LiveRender while the switch is on (see _widgets/live_render.py)
        self._ahead: Any = None  # the live view's early warm-up (a WarmAhead) of the chosen layer, before the switch
        self._warmed_ahead: set[tuple] = set()  # the keys warmed up early already (see _warm_live_ahead)
        self.view_info = wrapping_label("view_info", "Made")
        self.threshold_box = Container(
            layout="horizontal", widgets=[self.threshold, self.threshold_slider], labels=False
        )
        self.threshold_box.label = "Threshold"
        self.threshold_box.margins = (0, 0, 0, 0)
        # the spin box's range (+-1e12) would ask for a wide box: the row takes the dock's width instead
        from qtpy.QtWidgets import QSizePolicy

        self.threshold.native.setMinimumWidth(80)
        self.threshold.native.setMaximumWidth(120)
        self.threshold_slider.native.setMinimumWidth(60)
        self.threshold_box.native.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.threshold_box.native.setMinimumWidth(0)
        # the render's mode and its button on one row
        self.render_row = Container(layout="horizontal", widgets=[self.render_mode, self.render_button], labels=False)
        self.render_row.label = "Full-resolution render"
        self.render_row.margins = (0, 0, 0, 0)
        outputs = [self.level, self.crop_button, self.render_row, self.live_3d, self.view_info]
        self._finish([self.layer, self.threshold_box, self.all_time_points], outputs, advanced=[self.per_level])
        self.view_info.visible = False  # an empty "Made" line until a crop, render or live view says something
        self.level.changed.connect(self._show_level)
        self.threshold.changed.connect(self._threshold_changed)
        self.threshold_slider.changed.connect(self._slider_moved)
        self.crop_button.changed.connect(self.crop)
        self.render_button.changed.connect(self.render)
        self.live_3d.changed.connect(self._live_switched)
        self.layer.changed.connect(self._live_switched)
        self.layer.changed.connect(self._show_time_points)
        self._show_time_points()
        self.runner.on_idle.append(self._busy_changed)
        self._sync_slider()

    def _show_time_points(self, *_: Any) -> None:
        """Show "All time points" only for a layer that has them (4D+)."""
        layer = self.layer.value
        self.show_fields({self.all_time_points: layer is not None and layer.ndim > 3})

    # -- Run ---------------------------------------------------------------------------------------------------------
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
            device=self.device_input(layer, data, index=code),
        )
        job = make_mipmap_job(request)
        self._pending_input = weakref.ref(layer)
        return job

    def run(self) -> None:
        super().run()
        self._busy_changed()

    def show_result(self, result: JobResult, added: list) -> None:
        pyramid: Pyramid = result.details["pyramid"]
        shown = result.details["level"]
        occupancy = added[-1]  # the occupancy layer is added last, on top
        per_level = {int(layer.metadata[KEY]["role"].split()[-1]): weakref.ref(layer) for layer in added[:-1]}
        self._shown = {
            "pyramid": pyramid,
            "layer": weakref.ref(occupancy),
            "per_level": per_level,
            "input": getattr(self, "_pending_input", lambda: None),
            "threshold": result.details["threshold"],
        }
        self._extra = []
        with self.level.changed.blocked():
            self.level.max = len(pyramid.max_levels) - 1
            self.level.value = shown
        self.level.enabled = True
        self._sync_slider()
        self._busy_changed()
        if float(self.threshold.value) != self._shown["threshold"]:  # moved while the run was going
            self._apply_threshold(float(self.threshold.value))

    # -- the threshold: one value, the spin box; the slider follows it ---------------------------------------------
    def _value_range(self) -> tuple[float, float]:
        if self._shown:
            return self._shown["pyramid"].value_range
        layer = self.layer.value if self._ready else None
        limits = getattr(layer, "contrast_limits_range", None) if isinstance(layer, Image) else None
        if limits is not None and limits[1] > limits[0]:
            return float(limits[0]), float(limits[1])
        return 0.0, 1.0

    def _sync_slider(self) -> None:
        low, high = self._value_range()
        value = min(max(float(self.threshold.value), low), high)
        with self.threshold_slider.changed.blocked():
            if low > self.threshold_slider.max:  # in an order that never leaves min above max
                self.threshold_slider.max = high
                self.threshold_slider.min = low
            else:
                self.threshold_slider.min = low
                self.threshold_slider.max = high
            self.threshold_slider.step = (high - low) / SLIDER_STEPS
            # the slider rounds its limits to its decimals: clamp to the limits it kept
            self.threshold_slider.value = min(max(value, self.threshold_slider.min), self.threshold_slider.max)

    def _layers_changed(self) -> None:
        if not self._shown:
            self._sync_slider()  # before a run: the chosen layer's range

    # -- Full resolution in 3D (the controller lives in live_render.py) ---------------------------------------------
    def _live_switched(self, *_: Any) -> None:
        """The switch or the chosen layer changed: stop the live view, and start it again for the layer if on (its
        quad layer kept from one source layer to the next)."""
        layer = self.layer.value if self._ready else None
        wanted = self.live_3d.value and not self.released
        usable = _live_usable(layer)
        overlay = None
        if self._live is not None:
            overlay = self._live.stop(keep_overlay=wanted and usable)
            self._live = None
            self._drop_ahead()  # its source was the live view's: freed with it
        if not wanted:
            return
        if not usable:
            notify_error("Full resolution in 3D: choose a 3D (or 4D+) Image layer")
            return
        from napari_gridmip._widgets.live_render import LiveRender

        def status(text: str) -> None:
            if not self.released:
                self._made(text)

        if self._ahead is not None and self._ahead.task.waiting:
            self._drop_ahead()  # not started yet: the live view's own warm-up does the same
        self._live = LiveRender(
            self._viewer, layer, threshold=float(self.threshold.value), on_status=status, overlay=overlay,
            ahead=self._ahead,
        )  # fmt: skip

    def _prefetch(self) -> None:
        super()._prefetch()
        self._warm_live_ahead()

    def _warm_live_ahead(self) -> None:
        """With the switch off, make the chosen layer's live-view source and compile its render programs in the
        background (:class:`~._widgets.live_render.WarmAhead`), as the other early work (only where early starts
        are on, and not beside a Run), where the layer's occupancy cells are stored with it: the switch's first
        view then waits for neither. Called, like that work, once the inputs have been still a moment. Once per
        layer, data, placement and threshold: the programs stay compiled after the switch is turned off, whose
        stop frees the source (its chunk caches) as before."""
        from napari_gridmip._jobs.live_render import has_stored_cells
        from napari_gridmip._widgets.base import prefetch_enabled
        from napari_gridmip._widgets.live_render import WarmAhead, source_key

        layer = self.layer.value if self._ready else None
        threshold = float(self.threshold.value)
        if self._ahead is not None and (layer is None or not self._ahead.serves(layer, threshold)):
            self._drop_ahead()
        usable = _live_usable(layer) and layer.ndim == 3 and has_stored_cells(layer, threshold)
        key = (*source_key(layer, (), threshold), id(layer.data)) if usable else None
        if (
            usable and self._ahead is None and key not in self._warmed_ahead and self._live is None
            and not self.released and not self.runner.busy and prefetch_enabled()
        ):  # fmt: skip
            self._ahead = WarmAhead(self._viewer, layer, threshold)
            self._warmed_ahead.add(key)

    def _drop_ahead(self) -> None:
        """Cancel the early warm-up and let its source go (a live view that adopted it keeps its own reference)."""
        if self._ahead is not None:
            self._ahead.cancel()
            self._ahead = None

    def release(self) -> None:
        self._drop_ahead()
        if self._live is not None:
            self._live.stop()
            self._live = None
        super().release()

    def _slider_moved(self, value: float) -> None:
        self.threshold.value = float(value)  # the spin box is the value; it updates what is shown

    def _threshold_changed(self, value: float) -> None:
        slider = self.threshold_slider
        with slider.changed.blocked():  # the slider's own limits: it rounds the value range to its decimals
            slider.value = min(max(float(value), slider.min), slider.max)
        self._apply_threshold(float(value))
        if self._live is not None:
            self._live.set_threshold(float(value))

    def _result_layers(self) -> list[tuple[int | None, Any]]:
        """(level or None for the occupancy layer, layer) of the last run still in the viewer."""
        out = []
        for k, ref in self._shown.get("per_level", {}).items():
            layer = ref()
            if layer is not None and layer in self._viewer.layers:
                out.append((k, layer))
        layer = self._shown["layer"]() if self._shown else None
        if layer is not None and layer in self._viewer.layers:
            out.append((None, layer))
        return out

    def _apply_threshold(self, threshold: float) -> None:
        """Re-threshold the last result's layers from its max pyramid (NumPy, here on the GUI thread): the level
        shown, the per-level images, the summary and each layer's provenance. Nothing runs in a worker."""
        if not self._shown or self.released:
            return
        pyramid: Pyramid = self._shown["pyramid"]
        self._shown["threshold"] = threshold
        shown = int(self.level.value)
        count = None
        for k, layer in self._result_layers():
            level = pyramid.level(shown if k is None else k, threshold)
            if k is None:
                count = pyramid.count(shown, threshold, level)
                layer.data = as_labels(level)
            else:
                layer.data = level
            _set_threshold(layer, threshold)
        self.summary.value = pyramid.summary(shown, threshold, count)
        self.summary.tooltip = self.summary.value

    def _show_level(self, level: int) -> None:
        """Swap the occupancy layer's data and placement to ``level`` (the pyramid is kept, nothing recomputed)."""
        layer = self._shown["layer"]() if self._shown else None
        if layer is None or layer not in self._viewer.layers:
            return
        pyramid: Pyramid = self._shown["pyramid"]
        threshold = self._shown["threshold"]
        data = pyramid.level(level, threshold)
        placement = level_placement(pyramid.frame, level)
        layer.data = as_labels(data)
        layer.scale, layer.translate = placement["scale"], placement["translate"]
        provenance = dict(layer.metadata.get(KEY, {}), expression=level_expression(level))
        layer.metadata = {**layer.metadata, "gridmip_level": level, KEY: provenance}
        self.summary.value = pyramid.summary(level, threshold, pyramid.count(level, threshold, data))

    # -- crop and render ---------------------------------------------------------------------------------------------
    def _input(self, what: str) -> tuple[Pyramid, Any] | None:
        """The last result's pyramid and its input layer, or None after a notification."""
        if not self._shown:
            notify_error(f"{what}: press Run first (it builds the pyramid)")
            return None
        layer = self._shown["input"]()
        if layer is None or layer not in self._viewer.layers:
            notify_error(f"{what}: the input layer {self._shown['pyramid'].name!r} is gone; Run again")
            return None
        return self._shown["pyramid"], layer

    def crop(self) -> None:
        """Add the input cropped to its occupied box at the current threshold (in the worker)."""
        found = self._input("Crop to occupied")
        if found is None or self.runner.busy:
            return
        pyramid, layer = found
        threshold = float(self.threshold.value)
        top = pyramid.count(len(pyramid.max_levels) - 1, threshold)
        if top == 0:
            notify_error(f"Crop to occupied: nothing in {pyramid.name!r} is above the threshold {threshold:g}")
            return
        kind = "labels" if isinstance(layer, Labels) else "image"
        self._start(lambda: make_crop_job(pyramid, threshold, kind=kind, display=_display(layer)))

    def render(self) -> None:
        """Render the input from the viewer's 3D camera (in the worker) and add the picture as a 2D layer."""
        found = self._input("Render full-resolution view")
        if found is None or self.runner.busy:
            return
        pyramid, layer = found
        if self._viewer.dims.ndisplay != 3:
            notify_error("Render full-resolution view follows the 3D camera: switch the viewer to 3D first")
            return
        world = self._viewer.dims.ndim
        if tuple(self._viewer.dims.displayed) != tuple(range(world - 3, world)):
            notify_error("Render full-resolution view needs the last three axes displayed, in order (Transpose back)")
            return
        camera = Camera.of(self._viewer)
        threshold = float(self.threshold.value)
        mode = self.render_mode.value
        view = self._viewer.scene.camera  # viewer.camera: deprecated since napari 0.9
        self._camera_state = {"center": view.center, "zoom": view.zoom, "angles": view.angles}
        self._start(lambda: make_render_job(pyramid, threshold, camera, mode=mode, display=_display(layer)))

    def _start(self, make: Any) -> None:
        try:
            job = make()
        except ValueError as error:
            self.runner._set_status(f"Failed: {error}")
            notify_error(str(error))
            return
        self.runner.start(job, on_done=self._extra_done, replace=not self.keep_previous.value)
        self._busy_changed()

    def _extra_done(self, result: JobResult, added: list) -> None:
        state, self._camera_state = self._camera_state, None
        if state is not None:
            # the picture covers the canvas, more than the data's extent, and the runner resets the view for a
            # result outside it: put the user's camera back once it has (the next turn of the event loop)
            from qtpy.QtCore import QTimer

            viewer = self._viewer
            QTimer.singleShot(0, lambda: viewer.scene.camera.update(state))
        self._extra = [ref for ref in self._extra if ref() is not None and all(ref() is not a for a in added)]
        self._extra += [weakref.ref(layer) for layer in added]
        self._made(result.summary)

    def _made(self, text: str) -> None:
        """Say what the last crop, render or live view made (the full text in the tooltip)."""
        self.view_info.value = text
        self.view_info.tooltip = text
        self.view_info.visible = True

    def _busy_changed(self, *_: Any) -> None:
        """Crop and Render are enabled when a result exists and no job runs (Run is the runner's)."""
        if self.released:  # the dock was closed: its buttons may be deleted already
            return
        ready = bool(self._shown) and not self.runner.busy
        self.crop_button.enabled = ready
        self.render_button.enabled = ready

    def python_script(self) -> str:
        """The script that remakes the last run's layers and the crops and renders made from it."""
        layers = [ref() for ref in [*self._results, *self._extra]]
        return script_from_layers([layer for layer in layers if layer is not None and layer in self._viewer.layers])


def _live_usable(layer: Any) -> bool:
    """Whether the live view can show ``layer``: a 3D (or 4D+) Image layer, not RGB."""
    return isinstance(layer, Image) and layer.ndim >= 3 and not layer.rgb


def _set_threshold(layer: Any, threshold: float) -> None:
    """The layer's provenance now says the threshold it shows."""
    provenance = dict(layer.metadata.get(KEY, {}))
    calls = [dict(c) for c in provenance.get("calls", [])]
    for call in calls:
        if call["function"] == "napari_gridmip.occupancy_mipmap":
            call["kwargs"] = {**call["kwargs"], "threshold": threshold}
    provenance["calls"] = calls
    layer.metadata = {**layer.metadata, KEY: provenance}


def _display(layer: Any) -> dict[str, Any]:
    """The input's colormap and contrast (for the crop and the MIP render); Labels keep napari's defaults."""
    if isinstance(layer, Labels):
        return {}
    return {
        "colormap": layer.colormap.name,
        "contrast_limits": tuple(float(v) for v in layer.contrast_limits),
        "gamma": float(layer.gamma),
    }
