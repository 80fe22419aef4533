"""The "Correlation map" dock widget: stacks, a single pair with a subset, a movie's time series, or a DIC
series (a grid of points followed through a sequence of frames)."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
from magicgui.widgets import CheckBox, ComboBox, Container, FloatSpinBox, SpinBox
from napari.layers import Image, Labels, Shapes, Vectors

from napari_gridmip._jobs import Job, JobResult
from napari_gridmip._jobs.correlation import (
    SERIES_MAX_SIGMA,
    SERIES_REFERENCES,
    SERIES_REFRESH_ZNCC,
    SERIES_SHAPES,
    CorrelationRequest,
    SeriesRequest,
    make_correlation_job,
    make_series_job,
)
from napari_gridmip._jobs.plan import KEY, Source, call_from_record, script_from_layers
from napari_gridmip._jobs.surface import SurfaceRequest, crop_index, make_surface_job
from napari_gridmip._jobs.timeseries import TimeSeriesRequest, make_timeseries_job
from napari_gridmip._jobs.world import Frame, derived_placement
from napari_gridmip._widgets.base import JobWidget, click_callback, require_layer, wrapping_label
from napari_gridmip._widgets.runner import notify_error
from napari_gridmip.core.options import PRECISIONS, SUBPIXEL_METHODS

if TYPE_CHECKING:
    import napari

ROLE_KEY = "gridmip_role"  # layer.metadata entry ("img1"/"img2", "sample"/"reference", "movie", "frames"/"roi")
SUGGESTION_KEY = "gridmip_correlation"  # a sample's suggested mode and parameters, applied when it is opened
STACKS, PAIR, TIME_SERIES, SERIES = "stacks", "single pair, subset", "time series", "DIC series (image sequence)"
MODES = (STACKS, PAIR, TIME_SERIES, SERIES)
FIRST_ROLES, SECOND_ROLES = ("img1", "sample"), ("img2", "reference")
PHASE_TOOLTIP = (
    "Phase: the displacement integrated (integrate_gradient, least squares), in px^2 units (displacement in px "
    "integrated over px) unless pixel size, distance and wavelength are all given: then phase_from_displacement, "
    "in radians. Up to a constant (mean 0)."
)


def _odd_spin(name: str, label: str, value: int, *, low: int = 1, tooltip: str = "") -> SpinBox:
    return SpinBox(name=name, label=label, value=value, min=low, max=201, step=2, tooltip=tooltip)


class CorrelationWidget(JobWidget):
    """Windowed Pearson correlation: the displacement field between two stacks or two images (with a subset and
    a step), what follows from it (transmission, dark-field, phase, strain, uncertainty), and a movie's local
    correlation image. Clicking a result pixel shows its correlation surface."""

    settings_key = "correlation"
    persisted = (
        "mode", "window_rows", "window_cols", "subset_rows", "subset_cols", "step", "subpixel", "subset_shape",
        "precision",
        "neighbours", "out_transmission", "out_dark_field", "out_phase", "out_strain", "out_uncertainty",
        "strain_window", "pixel_size", "distance", "wavelength", "spacing", "vector_scale", "full_map",
        "show_surface", "reference_policy", "series_shape", "max_sigma", "refresh_zncc",
    )  # fmt: skip

    def __init__(self, napari_viewer: napari.viewer.Viewer) -> None:
        super().__init__(napari_viewer)
        self.mode = ComboBox(
            name="mode",
            label="Mode",
            choices=list(MODES),
            value=STACKS,
            tooltip="stacks: two K-frame stacks, each pixel's K values compared. single pair, subset: two images "
            "(DIC) or two stacks (speckle tracking), each pixel's subset around it compared, on every step-th "
            "pixel. time series: one movie (T, Y, X), each pixel's trace against its neighbours'. DIC series (image "
            "sequence): a grid of points on frame 0 followed through every frame of a (T, Y, X) layer.",
        )
        self.img1 = self.layer_combo("img1", "img1 (K, M, N)", (Image,))
        self.img2 = self.layer_combo("img2", "img2 (K, M, N)", (Image,))
        self.movie = self.layer_combo("movie", "Movie (T, Y, X)", (Image,))
        self.frames = self.layer_combo("frames", "Frames (T, Y, X)", (Image,))
        self.frames.tooltip = "The image sequence; its frame 0 is the reference unless a reference image is chosen"
        # "(optional)" in the tooltips, not the labels: the dock's column is narrower than those labels were, and
        # an empty choice ("-----") says it already
        self.first_frame = self.layer_combo("first_frame", "Reference image", (Image,), nullable=True)
        self.first_frame.tooltip = "Optional: a 2D image (Y, X) taken before the frames: the reference, put before them"
        self.roi = self.layer_combo("roi", "Region of interest", (Labels, Shapes), nullable=True)
        self.roi.tooltip = (
            "Optional: a Labels layer (nonzero inside; a (T, Y, X) one counts what is painted on any frame) or a "
            "Shapes layer (its shapes filled), on the reference: subsets use only the pixels inside it"
        )
        self.reference_policy = ComboBox(
            name="reference_policy",
            label="Reference",
            choices=list(SERIES_REFERENCES),
            value="accumulated",
            tooltip="accumulated: every frame against frame 0 (no drift). incremental: each point against the last "
            "frame it was found in (large deformation, errors add up). auto: a point's reference moves on when its "
            "match with the old one weakens",
        )
        # the DIC series' advanced options: its subset's warp and the two thresholds (correlate_series')
        self.series_shape = ComboBox(
            name="series_shape",
            label="Subset shape",
            choices=list(SERIES_SHAPES),
            value="affine",
            tooltip="The warp each subset is fitted with. affine: translation, stretch, shear and rotation (6 "
            "parameters; follows deformation). rigid: translation and rotation only (3 parameters): less noise on "
            "parts that move without deforming; their strain is then 0",
        )
        self.max_sigma = FloatSpinBox(
            name="max_sigma",
            label="Max. sigma (px)",
            value=SERIES_MAX_SIGMA,
            min=0.001,
            max=10.0,
            step=0.01,
            tooltip="px: a point is kept only where its subset's texture (within the region of interest) predicts a "
            "displacement standard deviation within this; others are lost as not_significant. Larger keeps more "
            "points along the ROI's edges and on faint speckle, less precise ones",
        )
        self.max_sigma.native.setDecimals(3)  # 0.1 px by default; a few hundredths are common
        self.refresh_zncc = FloatSpinBox(
            name="refresh_zncc",
            label="Refresh ZNCC",
            value=SERIES_REFRESH_ZNCC,
            min=0.0,
            max=1.0,
            step=0.01,
            tooltip="ZNCC, 0 to 1 (incremental and auto references). auto: a point's reference moves to the "
            "current frame when its match with the old one falls under this. Both: a point goes back to frame 0 "
            "where its match with frame 0 reaches this (no drift while frame 0 still matches); 1: never back",
        )
        self.window_rows = _odd_spin("window_rows", "Window rows (odd)", 9)
        self.window_cols = _odd_spin("window_cols", "Window cols (odd)", 9)
        subset_tip = "Odd: each pixel's vector spans its K frames over this many pixels around it (DIC: 21 to 41)"
        self.subset_rows = _odd_spin("subset_rows", "Subset rows (odd)", 21, tooltip=subset_tip)
        self.subset_cols = _odd_spin("subset_cols", "Subset cols (odd)", 21, tooltip=subset_tip)
        self.step = SpinBox(
            name="step",
            label="Step (px)",
            value=2,
            min=1,
            max=256,
            tooltip="Results on every step-th pixel only; each output pixel then covers step x step input pixels",
        )
        self.subpixel = ComboBox(name="subpixel", label="Sub-pixel", choices=list(SUBPIXEL_METHODS), value="hessian")
        self.subset_shape = ComboBox(
            name="subset_shape", label="Subset shape", choices=["translation", "affine"], value="translation"
        )
        self.subset_shape.tooltip = (
            "affine: each subset also stretches, shears and rotates (first-order subsets, IC-GN as DICe and ncorr; "
            "needs Sub-pixel refine); strain then comes from the subsets' own gradients"
        )
        self.precision = ComboBox(name="precision", label="Precision", choices=list(PRECISIONS), value="float32")
        self.neighbours = ComboBox(
            name="neighbours",
            label="Neighbours",
            choices=[8, 4],
            value=8,
            tooltip="8: the 3x3 neighbourhood; 4: the pixels sharing a side",
        )
        tracking = "(track_speckles: img1 is the sample, img2 the reference; results on img1's pixels)"
        self.out_transmission = CheckBox(
            name="out_transmission", text="transmission", tooltip=f"UMPA's transmission T, gray {tracking}"
        )
        self.out_dark_field = CheckBox(
            name="out_dark_field", text="dark-field", tooltip=f"UMPA's dark-field D (visibility kept), gray {tracking}"
        )
        self.out_phase = CheckBox(name="out_phase", text="phase", tooltip=PHASE_TOOLTIP)
        self.out_strain = CheckBox(
            name="out_strain",
            text="strain",
            tooltip="exx, eyy, exy (tensor shear) from local plane fits (strain_field), in a diverging colormap "
            "symmetric about 0",
        )
        self.out_uncertainty = CheckBox(
            name="out_uncertainty",
            text="uncertainty",
            tooltip=f"Estimated standard deviation of dy and dx, px {tracking}",
        )
        self.outputs = Container(
            name="outputs",
            label="Outputs",
            widgets=[
                self.out_transmission, self.out_dark_field, self.out_phase, self.out_strain, self.out_uncertainty
            ],
            labels=False,
        )  # fmt: skip
        self.outputs.margins = (0, 0, 0, 0)
        self.strain_window = _odd_spin(
            "strain_window", "Strain window (odd)", 11, low=3, tooltip="Output pixels each plane fit spans"
        )
        self.pixel_size = FloatSpinBox(
            name="pixel_size", label="Pixel size (um)", value=0.0, min=0.0, max=1e4, step=0.1, tooltip=PHASE_TOOLTIP
        )
        self.distance = FloatSpinBox(
            name="distance", label="Distance (mm)", value=0.0, min=0.0, max=1e6, step=10.0, tooltip=PHASE_TOOLTIP
        )
        self.wavelength = FloatSpinBox(
            name="wavelength", label="Wavelength (A)", value=0.0, min=0.0, max=100.0, step=0.1, tooltip=PHASE_TOOLTIP
        )
        self.spacing = SpinBox(name="spacing", label="Vector spacing (px)", value=8, min=1, max=512)
        self.vector_scale = FloatSpinBox(
            name="vector_scale",
            label="Vector length x",
            value=0.0,
            min=0.0,
            max=1e4,
            step=0.5,
            tooltip="Drawn length = displacement x this. 0: automatic (the median displacement spans 80% of the "
            "spacing). Changing it updates the last vectors layer.",
        )
        self.full_map = CheckBox(name="full_map", text="Add the full 4D map", value=False)
        self.show_surface = CheckBox(
            name="show_surface",
            text="Surface on click",
            value=True,
            tooltip="Click a result pixel (pan/zoom tool; a drag still pans): that pixel's correlation over the "
            "window's offsets appears beside the data, the fitted sub-pixel peak marked with a cross",
        )
        self.surface_info = wrapping_label("surface_info", "Clicked")
        self._vectors: Any = None  # weak reference to the last vectors layer
        self._by_role: dict[str, weakref.ref] = {}  # the last pair run's layers, by role
        self._run: dict[str, Any] | None = None  # the last pair run's parameters (for the clicked surface)
        self._pending: dict[str, Any] | None = None
        self._surface: list[weakref.ref] = []  # the surface layers of the last click
        self._seen: weakref.WeakSet = weakref.WeakSet()
        self._prefer_roles = False  # a sample was just opened: take its layers when they are all there
        self._finish(
            [
                self.mode,
                self.img1,
                self.img2,
                self.movie,
                self.frames,
                self.first_frame,
                self.roi,
                self.window_rows,
                self.window_cols,
                self.subset_rows,
                self.subset_cols,
                self.step,
                self.reference_policy,
                self.neighbours,
                self.outputs,
                self.strain_window,
                self.pixel_size,
                self.distance,
                self.wavelength,
            ],
            [self.show_surface, self.surface_info],
            advanced=[
                self.subpixel,
                self.subset_shape,
                self.series_shape,
                self.max_sigma,
                self.refresh_zncc,
                self.precision,
                self.spacing,
                self.vector_scale,
                self.full_map,
            ],
        )
        self.vector_scale.changed.connect(self._rescale_vectors)
        self.mode.changed.connect(self._show_mode)
        self.reference_policy.changed.connect(self._show_mode)
        self.out_strain.changed.connect(self._show_mode)
        self.out_phase.changed.connect(self._show_mode)
        self._show_mode()
        on_click = click_callback(self, lambda widget, event: widget.surface_at(event.position))
        self._on_click = on_click
        napari_viewer.mouse_drag_callbacks.append(on_click)

    # -- the fields of each mode -------------------------------------------------------------
    def _show_mode(self, *_: Any) -> None:
        mode = self.mode.value
        pair = mode in (STACKS, PAIR)
        series = mode == SERIES
        shown = {
            self.img1: pair,
            self.img2: pair,
            self.movie: mode == TIME_SERIES,
            self.frames: series,
            self.first_frame: series,
            self.roi: series,
            self.reference_policy: series,
            self.window_rows: pair,
            self.window_cols: pair,
            self.subset_rows: mode == PAIR or series,
            self.subset_cols: mode == PAIR or series,
            self.step: mode == PAIR or series,
            self.subpixel: pair,
            self.subset_shape: mode == PAIR,
            self.series_shape: series,
            self.max_sigma: series,
            self.refresh_zncc: series and self.reference_policy.value != "accumulated",  # unused by accumulated
            self.neighbours: mode == TIME_SERIES,
            self.precision: not series,  # correlate_series computes in float32
            self.outputs: pair,
            self.strain_window: pair and self.out_strain.value,
            self.pixel_size: pair and self.out_phase.value,
            self.distance: pair and self.out_phase.value,
            self.wavelength: pair and self.out_phase.value,
            self.spacing: pair or series,
            self.vector_scale: pair or series,
            self.full_map: mode == STACKS,
            self.show_surface: pair,
            self.surface_info: pair,
        }
        self.show_fields(shown)
        if mode == STACKS:
            self.img1.label, self.img2.label = "img1 (K, M, N)", "img2 (K, M, N)"
        else:
            self.img1.label, self.img2.label = "img1 (sample)", "img2 (reference)"
        if self._ready:
            self._layers_changed()

    def _candidates(self, mode: str) -> list[Any]:
        """The viewer's layers that can be inputs of ``mode``, newest first; never this plugin's own results."""
        low = 2 if mode == PAIR else 3
        return [
            layer
            for layer in reversed(self._viewer.layers)
            if isinstance(layer, Image)
            and layer.ndim >= low
            and KEY not in layer.metadata
            and not layer.rgb
            and not layer.multiscale
        ]

    def _layers_changed(self) -> None:
        """Open a sample's suggestion (mode and parameters) once, when its layer arrives; then fill the inputs
        while they are empty or the same layer, never overriding a choice the user made.

        From the layers' roles (as the samples set them), else the newest two layers of one shape.
        """
        for layer in list(self._viewer.layers):
            if layer in self._seen:
                continue
            self._seen.add(layer)
            suggestion = layer.metadata.get(SUGGESTION_KEY) if KEY not in layer.metadata else None
            if isinstance(suggestion, dict):
                self._apply(suggestion)
        mode = self.mode.value
        layers = self._candidates(mode)
        if mode == SERIES:
            self._follow_series(layers)
            return
        if mode == TIME_SERIES:
            by_role = {layer.metadata.get(ROLE_KEY): layer for layer in layers}
            if "movie" in by_role and (self._prefer_roles or self.movie.value is None):
                self.movie.value = by_role["movie"]
                self._prefer_roles = False
            return
        by_role = {}
        for layer in layers:
            role = layer.metadata.get(ROLE_KEY)
            by_role.setdefault("img1" if role in FIRST_ROLES else "img2" if role in SECOND_ROLES else None, layer)
        if "img1" in by_role and "img2" in by_role and self._prefer_roles:
            self.img1.value, self.img2.value = by_role["img1"], by_role["img2"]
            self._prefer_roles = False
            return
        if self.img1.value is not None and self.img2.value is not None and self.img1.value is not self.img2.value:
            return
        if "img1" in by_role and "img2" in by_role:
            self.img1.value, self.img2.value = by_role["img1"], by_role["img2"]
            return
        for i, newer in enumerate(layers):
            older = next((layer for layer in layers[i + 1 :] if layer.data.shape == newer.data.shape), None)
            if older is not None:
                self.img1.value, self.img2.value = older, newer
                return

    def _follow_series(self, layers: list[Any]) -> None:
        """The DIC series' inputs: the frames (by role, else the newest (T, Y, X) image) and, once a sample was
        opened, its frames and ROI as they arrive (one layer at a time)."""
        layers = [layer for layer in layers if layer.ndim == 3]
        by_role = {layer.metadata.get(ROLE_KEY): layer for layer in layers}
        if "frames" in by_role and (self._prefer_roles or self.frames.value is None):
            self.frames.value = by_role["frames"]
        elif self.frames.value is None and layers:
            self.frames.value = layers[0]
        if self._prefer_roles:
            rois = [layer for layer in self._viewer.layers
                    if isinstance(layer, (Labels, Shapes)) and layer.metadata.get(ROLE_KEY) == "roi"]  # fmt: skip
            if rois:
                self.roi.value = rois[-1]
            self._prefer_roles = not ("frames" in by_role and rois)  # until both of the sample's are in

    def _apply(self, suggestion: dict[str, Any]) -> None:
        """A sample's mode and parameters (``{"mode": ..., "window": [wm, wn], "subset": ..., "step": ...,
        "outputs": [...], "spacing": ..., "neighbours": ...}``)."""
        if suggestion.get("mode") in MODES:
            self.mode.value = suggestion["mode"]
        pairs = {"window": (self.window_rows, self.window_cols), "subset": (self.subset_rows, self.subset_cols)}
        for key, (rows, cols) in pairs.items():
            if key in suggestion:
                rows.value, cols.value = (int(v) for v in suggestion[key])
        for key in ("step", "spacing", "neighbours", "subpixel", "strain_window"):
            if key in suggestion:
                getattr(self, key).value = suggestion[key]
        if "reference" in suggestion:
            self.reference_policy.value = suggestion["reference"]
        if "outputs" in suggestion:
            for name in ("transmission", "dark_field", "phase", "strain", "uncertainty"):
                getattr(self, f"out_{name}").value = name in suggestion["outputs"]
        self._prefer_roles = True

    # -- running -----------------------------------------------------------------------------
    def chosen_outputs(self) -> tuple[str, ...]:
        names = ("transmission", "dark_field", "phase", "strain", "uncertainty")
        return tuple(name for name in names if getattr(self, f"out_{name}").value)

    def _physics(self) -> tuple[float, float, float] | None:
        values = (float(self.pixel_size.value), float(self.distance.value), float(self.wavelength.value))
        if not any(values):
            return None
        if not all(values):
            raise ValueError(
                "give all three of pixel size, distance and wavelength for the phase in radians, or none of them "
                f"(phase in px^2); got {values[0]} um, {values[1]} mm, {values[2]} A"
            )
        return values[0] * 1e-6, values[1] * 1e-3, values[2] * 1e-10

    def make_job(self) -> Job:
        mode = self.mode.value
        if mode == SERIES:
            self._pending = None
            return make_series_job(self.series_request())
        if mode == TIME_SERIES:
            layer = require_layer(self.movie, "a movie, an Image layer (T, Y, X)")
            if layer.multiscale or layer.rgb or layer.ndim < 3:
                raise ValueError(
                    f"time series mode needs a movie (T, Y, X); layer {layer.name!r} has shape {layer.data.shape}"
                )
            self._pending = None
            request = TimeSeriesRequest(
                layer.name, layer.data, Frame.of(layer), int(self.neighbours.value), self.precision.value,
                device=self.device_input(layer, layer.data),
            )  # fmt: skip
            return make_timeseries_job(request)
        layer1 = require_layer(self.img1, "img1, an Image layer")
        layer2 = require_layer(self.img2, "img2, an Image layer")
        if layer1 is layer2:
            raise ValueError(f"img1 and img2 are the same layer ({layer1.name!r}): choose the two to compare")
        window = (int(self.window_rows.value), int(self.window_cols.value))
        subset, step, index = (1, 1), 1, ""
        for layer in (layer1, layer2):
            if layer.multiscale or layer.rgb:
                raise ValueError(f"layer {layer.name!r} must be a plain image or stack, not RGB or multiscale")
        if mode == STACKS:
            for layer in (layer1, layer2):
                if layer.ndim < 3:
                    raise ValueError(
                        f"stacks mode compares two (K, M, N) stacks; layer {layer.name!r} is a 2D image of shape "
                        f"{layer.data.shape}: choose the mode 'single pair, subset' for two images"
                    )
        else:
            subset = (int(self.subset_rows.value), int(self.subset_cols.value))
            if any(s % 2 == 0 for s in subset):
                raise ValueError(f"the subset must be odd (sh x sw); got {subset[0]} x {subset[1]}")
            step = int(self.step.value)
            if layer1.ndim != layer2.ndim:
                raise ValueError(
                    f"img1 and img2 must both be images or both be stacks; got shapes {layer1.data.shape} and "
                    f"{layer2.data.shape}"
                )
            if layer1.ndim == 2:
                index = "[None]"  # one frame each
                if subset == (1, 1):
                    raise ValueError("two single images need a subset larger than 1 x 1 (DIC: 21 x 21 to 41 x 41)")
        if any(w % 2 == 0 for w in window):
            raise ValueError(f"the window must be odd; got {window[0]} x {window[1]}")
        outputs = self.chosen_outputs()
        request = CorrelationRequest(
            name1=layer1.name,
            name2=layer2.name,
            data1=layer1.data,
            data2=layer2.data,
            frame=Frame.of(layer2),
            window=window,
            subpixel=self.subpixel.value,
            dtype=self.precision.value,
            spacing=int(self.spacing.value),
            vector_scale=float(self.vector_scale.value),
            full_map=bool(self.full_map.value) and mode == STACKS,
            subset=subset,
            step=step,
            outputs=outputs,
            frame1=Frame.of(layer1),
            index=index,
            strain_window=int(self.strain_window.value),
            physics=self._physics() if "phase" in outputs else None,
            shape=self.subset_shape.value if mode == PAIR else "translation",
            devices=(self.device_input(layer1, layer1.data), self.device_input(layer2, layer2.data)),
        )
        self._pending = {
            "name1": layer1.name,
            "name2": layer2.name,
            "window": window,
            "subset": subset,
            "step": step,
            "dtype": request.dtype,
            "tracking": request.tracking,
            "frames_axis": index != "[None]",
            "grid_name": request.grid_name,
        }
        return make_correlation_job(request)

    def series_request(self) -> SeriesRequest:
        """The DIC series mode's request: the frames (a reference image before them), the ROI, the options."""
        layer = require_layer(self.frames, "the frames, an Image layer (T, Y, X)")
        if layer.multiscale or layer.rgb or layer.ndim != 3:
            raise ValueError(
                f"the DIC series mode needs frames (T, Y, X); layer {layer.name!r} has shape {layer.data.shape}"
            )
        subset = (int(self.subset_rows.value), int(self.subset_cols.value))
        if any(s % 2 == 0 for s in subset):
            raise ValueError(f"the subset must be odd (sh x sw); got {subset[0]} x {subset[1]}")
        shape = tuple(int(n) for n in layer.data.shape[-2:])
        reference = self.first_frame.value
        if reference is not None:
            if reference is layer:
                raise ValueError(f"the reference image and the frames are the same layer ({layer.name!r})")
            if reference.multiscale or reference.rgb or reference.ndim != 2 or reference.data.shape != shape:
                raise ValueError(
                    f"the reference image must be one frame {shape} of the frames {layer.name!r}; layer "
                    f"{reference.name!r} has shape {reference.data.shape}"
                )
        roi, roi_data = self._roi_source(shape, layer)
        return SeriesRequest(
            name=layer.name,
            data=layer.data,
            frame=Frame.of(layer),
            subset=subset,
            step=int(self.step.value),
            reference=self.reference_policy.value,
            reference_name=None if reference is None else reference.name,
            reference_data=None if reference is None else reference.data,
            roi=roi,
            roi_data=roi_data,
            spacing=int(self.spacing.value),
            vector_scale=float(self.vector_scale.value),
            shape=self.series_shape.value,
            max_sigma=float(self.max_sigma.value),
            refresh_zncc=float(self.refresh_zncc.value),
        )

    def _roi_source(self, shape: tuple[int, int], frames: Any) -> tuple[Source | None, Any]:
        """The ROI's source (how the script binds it) and its mask, read here on the GUI thread: a Labels layer
        (Y, X) as it is, a (T, Y, X) one as what is painted on any frame, a Shapes layer filled (``to_labels``)."""
        layer = self.roi.value
        if layer is None:
            return None, None
        placed = (np.asarray(layer.scale)[-2:], np.asarray(layer.translate)[-2:])
        if not all(np.allclose(a, b) for a, b in zip(placed, (frames.scale[-2:], frames.translate[-2:]))):
            raise ValueError(
                f"the ROI {layer.name!r} must lie on the frames' pixels (the same scale and translate as "
                f"{frames.name!r} along Y and X)"
            )
        if isinstance(layer, Shapes):
            if not len(layer.data):
                raise ValueError(f"the ROI {layer.name!r} has no shape: draw the region of interest, or choose none")
            code = f"viewer.layers[{layer.name!r}].to_labels(labels_shape={shape})"
            source = Source("roi", expression=code)
            mask = layer.to_labels(labels_shape=shape)
        else:
            if layer.data.shape[-2:] != shape or layer.ndim not in (2, 3):
                raise ValueError(
                    f"the ROI must be a Labels layer of the frames' (Y, X) = {shape} (or (T, Y, X)); layer "
                    f"{layer.name!r} has shape {layer.data.shape}"
                )
            source = Source("roi", layer=layer.name, index=".any(axis=0)" if layer.ndim == 3 else "")
            mask = np.asarray(source.take(np.asarray(layer.data)))
        if not np.any(mask):
            raise ValueError(f"the ROI {layer.name!r} is empty: paint or draw the region of interest, or choose none")
        return source, np.array(mask, copy=True)  # a copy: painting on goes on while the run reads it

    def show_result(self, result: JobResult, added: list) -> None:
        vectors = [layer for layer in added if isinstance(layer, Vectors)]
        self._vectors = weakref.ref(vectors[-1]) if vectors else None
        roles = {layer.metadata.get(KEY, {}).get("role"): layer for layer in added}
        if self._pending is not None and "dy" in roles:
            self._run, self._pending = self._pending, None
            self._by_role = {role: weakref.ref(layer) for role, layer in roles.items()}
            self._surface = []  # an earlier click's surface belongs to the earlier run
            self.surface_info.value = "click a result pixel (pan/zoom tool) to see its correlation surface"

    def _rescale_vectors(self, value: float) -> None:
        layer = self._vectors() if self._vectors is not None else None
        if layer is not None and layer in self._viewer.layers:
            step = layer.metadata.get("gridmip_step", 1)
            layer.length = value / step if value > 0 else layer.metadata.get("gridmip_auto_length", 1.0)

    # -- a clicked pixel's correlation surface -------------------------------------------------
    def _layer(self, role: str) -> Any:
        ref = self._by_role.get(role)
        layer = ref() if ref is not None else None
        return layer if layer is not None and layer in self._viewer.layers else None

    def surface_at(self, position: Any) -> bool:
        """Show the correlation surface of the last result's pixel at world ``position`` (a click); False
        when there is nothing to show there (no result, outside it, another tool in use, busy)."""
        if not self.show_surface.value or self.mode.value in (TIME_SERIES, SERIES) or self._run is None:
            return False
        active = self._viewer.layers.selection.active
        if active is not None and str(getattr(active, "mode", "pan_zoom")) != "pan_zoom":
            return False  # the user is painting, adding points, ...
        grid, dx_layer = self._layer("dy"), self._layer("dx")
        if grid is None or dx_layer is None:
            return False
        pixel = tuple(int(round(float(c))) for c in grid.world_to_data(np.asarray(position, dtype=float)))
        if any(not 0 <= c < n for c, n in zip(pixel, grid.data.shape)):
            return False
        if self.runner.busy:
            self.surface_info.value = "busy: click again once the run is over"
            return False
        run = self._run
        missing = [name for name in (run["name1"], run["name2"]) if name not in self._viewer.layers]
        if missing:
            notify_error(f"the input layer {missing[0]!r} of the last run is gone: run again")
            return False
        try:
            request = self._surface_request(run, grid, dx_layer, pixel)
        except ValueError as error:
            notify_error(str(error))
            return False
        self.runner.start(make_surface_job(request), on_done=self._surface_done, replace=True)
        return True

    def _surface_request(self, run: dict[str, Any], grid: Any, dx_layer: Any, pixel: tuple[int, ...]) -> Any:
        layer1, layer2 = self._viewer.layers[run["name1"]], self._viewer.layers[run["name2"]]
        (wm, wn), (sh, sw), step = run["window"], run["subset"], run["step"]
        half = (wm // 2 + sh // 2, wn // 2 + sw // 2)
        centre = (pixel[-2] * step + half[0], pixel[-1] * step + half[1])
        code, key = crop_index(pixel, centre, half, frames_axis=run["frames_axis"])
        shape = layer1.data.shape
        fits = centre[0] + half[0] < shape[-2] and centre[1] + half[1] < shape[-1]
        if shape != layer2.data.shape or not fits:
            raise ValueError(f"the inputs {layer1.name!r} and {layer2.name!r} changed since the run: run again")
        record = grid.metadata[KEY]
        search = record["calls"][0]
        sources = tuple(Source(**s) for s in record["sources"])
        calls = (call_from_record(search),)
        at = ", ".join(map(str, pixel))
        fitted = (float(grid.data[pixel]), float(dx_layer.data[pixel]))
        fitted_code = (f"{record['expression']}[{at}]", f"{dx_layer.metadata[KEY]['expression']}[{at}]")
        # beside the data, right of the inputs and the result: half as tall as the result, its cells square
        extent = np.asarray(grid.extent.world, dtype=float)[:, -2:]
        height, width = extent[1] - extent[0]
        cell = 0.5 * height / wm
        right = max(float(np.asarray(layer.extent.world)[1, -1]) for layer in (grid, layer1, layer2))
        top, right = extent[0][0], right + 0.05 * width
        surface_placement = {"scale": (cell, cell), "translate": (top + cell / 2, right + cell / 2)}
        grid_placement = derived_placement(Frame.of(grid))
        return SurfaceRequest(
            name1=layer1.name,
            name2=layer2.name,
            data1=layer1.data,
            data2=layer2.data,
            crop=code,
            window=(wm, wn),
            subset=(sh, sw),
            dtype=run["dtype"],
            tracking=run["tracking"],
            pixel=pixel,
            fitted=fitted,
            fitted_code=fitted_code,
            grid_name=run["grid_name"],
            sources=sources,
            calls=calls,
            surface_placement=surface_placement,
            grid_placement=grid_placement,
            crop_key=key,
            marker_size=max(2.0, 0.04 * max(grid.data.shape[-2:])),
        )

    def _surface_done(self, result: JobResult, added: list) -> None:
        self._surface = [weakref.ref(layer) for layer in added]
        self.surface_info.value = result.summary
        self.surface_info.tooltip = result.summary
        self.copy_button.enabled = True

    def python_script(self) -> str:
        """The script that remakes the last run's layers and the last clicked surface's, still in the viewer."""
        layers = [ref() for ref in [*self._results, *self._surface]]
        return script_from_layers([layer for layer in layers if layer is not None and layer in self._viewer.layers])

    def release(self) -> None:
        """Also take the click callback off the viewer."""
        if not self.released:
            try:
                self._viewer.mouse_drag_callbacks.remove(self._on_click)
            except ValueError:
                pass
        super().release()
