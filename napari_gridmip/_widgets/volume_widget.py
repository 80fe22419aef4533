"""The "Digital volume correlation" dock widget: the displacement of a grid of points of a reference volume in a
deformed one (or through the time points of a 4D series), its strain, and one clicked point's quality."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
from magicgui.widgets import ComboBox, FloatSpinBox, SpinBox
from napari.layers import Image, Labels, Vectors

from napari_gridmip._jobs import Job, JobResult
from napari_gridmip._jobs.plan import KEY, Source
from napari_gridmip._jobs.volumes import (
    REFERENCES,
    SHAPES,
    STRAIN_KINDS,
    STRAIN_METHODS,
    VolumeRequest,
    check_request,
    make_volume_job,
)
from napari_gridmip._jobs.world import Frame
from napari_gridmip._widgets.base import JobWidget, click_callback, require_layer, wrapping_label
from napari_gridmip.core.correlation.status import Status  # a leaf: no JAX

if TYPE_CHECKING:
    import napari

ROLE_KEY = "gridmip_role"  # a sample's layers say which volume they are: "reference" or "deformed"
CLICK_HINT = "select a result layer (the arrows) and click a grid point to see its ZNCC, uncertainty and status"
PICK_RADIUS = 0.75  # grid steps: how far from the clicked ray (or position) a grid point may be


class VolumeWidget(JobWidget):
    """Digital volume correlation (:func:`~napari_gridmip.correlate_volumes`, :func:`~napari_gridmip.volume_strain`):
    arrows over the volume, the displacement, ZNCC, status and strain on the grid's points, and a clicked point's
    values."""

    settings_key = "volumes"
    persisted = ("subset", "step", "subset_shape", "strain_method", "strain_kind", "reference_policy", "smoothing")

    def __init__(self, napari_viewer: napari.viewer.Viewer) -> None:
        super().__init__(napari_viewer)
        self.volumes = self.layer_combo("volumes", "Reference or 4D series", (Image,))
        self.volumes.tooltip = (
            "The reference volume (Z, Y, X), matched against the deformed one; or a 4D layer (T, Z, Y, X), a time "
            "lapse: a grid of points on time point 0 followed through every later one (see Reference)"
        )
        self.deformed = self.layer_combo("deformed", "Deformed volume", (Image,), nullable=True)
        self.reference_policy = ComboBox(
            name="reference_policy",
            label="Reference",
            choices=list(REFERENCES),
            value="accumulated",
            tooltip="The volume each point is matched against. accumulated: time point 0 (no drift; large "
            "deformation lowers the match). incremental: the last time point the point was found in (any "
            "deformation; the increments' errors add up). auto: time point 0 until the match with it weakens (ZNCC "
            "under 0.95), and back to it where it matches again. The displacement is always from time point 0.",
        )
        self.roi = self.layer_combo("roi", "Region of interest", (Labels, Image), nullable=True)
        self.roi.tooltip = (
            "Optional: a Labels or Image layer of the reference's shape, nonzero inside; subsets use only its voxels"
        )
        self.subset = SpinBox(name="subset", label="Subset (voxels, odd)", value=21, min=5, max=201, step=2,
                              tooltip="The side of each point's cube; 15 to 41 voxels in most scans")  # fmt: skip
        self.step = SpinBox(name="step", label="Step (voxels)", value=10, min=1, max=256,
                            tooltip="The grid's spacing: one point every step voxels along each axis")  # fmt: skip
        self.subset_shape = ComboBox(
            name="subset_shape", label="Subset shape", choices=list(SHAPES), value="affine",
            tooltip="affine: each subset also stretches, shears and turns (12 parameters); translation: 3",
        )  # fmt: skip
        self.strain_method = ComboBox(
            name="strain_method", label="Strain from", choices=list(STRAIN_METHODS), value="subsets",
            tooltip="subsets: each point's own affine gradient (local). smoothed: the displacement field fitted by "
            "planes over its neighbours (smoothing in grid steps; the usual DVC strain)",
        )  # fmt: skip
        self.strain_kind = ComboBox(
            name="strain_kind", label="Strain tensor", choices=list(STRAIN_KINDS), value="small",
            tooltip="The 6 components shown: the small-strain tensor, or Green-Lagrange (rotations leave it at 0)",
        )  # fmt: skip
        self.smoothing = FloatSpinBox(name="smoothing", label="Smoothing (grid steps)", value=1.0, min=0.0, max=10.0,
                                      step=0.5, tooltip="The smoothed strain's Gaussian, in grid steps")  # fmt: skip
        self.vector_scale = FloatSpinBox(
            name="vector_scale", label="Vector length x", value=0.0, min=0.0, max=1e4, step=0.5,
            tooltip="Drawn length = displacement x this. 0: automatic (the median displacement spans 80% of a grid "
            "step). Changing it updates the last arrows.",
        )  # fmt: skip
        self.point_info = wrapping_label("point_info", "Clicked point", CLICK_HINT)
        self._by_role: dict[str, weakref.ref] = {}  # the last run's layers, by role
        self._sigma: np.ndarray | None = None  # the last run's uncertainty (..., 3), beside its layers
        self._grid: dict[str, Any] | None = None  # the last run's subset and step
        self._pending: dict[str, Any] | None = None  # those of the run being made
        self._clicked: list[weakref.ref] = []  # the layers the click callback is on
        self._seen: weakref.WeakSet = weakref.WeakSet()
        self._auto = True  # the inputs follow the layer list until the user picks one
        self._choosing = False  # set while the widget itself sets the inputs
        self._finish(
            [self.volumes, self.deformed, self.reference_policy, self.roi, self.subset, self.step],
            [self.point_info],
            advanced=[self.subset_shape, self.strain_method, self.strain_kind, self.smoothing, self.vector_scale],
        )
        for combo in (self.volumes, self.deformed):
            combo.changed.connect(self._picked)
        self.strain_method.changed.connect(self._show_inputs)
        self.vector_scale.changed.connect(self._rescale_vectors)
        on_click = click_callback(
            self,
            lambda widget, event: widget.show_point(
                event.position, getattr(event, "view_direction", None), getattr(event, "dims_displayed", None)
            ),
        )
        self._on_click = on_click
        self._show_inputs()

    # -- inputs -----------------------------------------------------------------------------
    def _picked(self, *_: Any) -> None:
        if not self._following_layers and not self._choosing:
            self._auto = False  # the user's choice: never overridden
        self._show_inputs()

    def _show_inputs(self, *_: Any) -> None:
        layer = self.volumes.value
        series = layer is not None and layer.ndim == 4
        self.show_fields({self.deformed: not series, self.reference_policy: series,
                          self.smoothing: self.strain_method.value == "smoothed"})  # fmt: skip

    def _candidates(self) -> list[Any]:
        """The viewer's plain 3D and 4D Image layers, oldest first; never this plugin's own results."""
        return [layer for layer in self._viewer.layers if isinstance(layer, Image) and layer.ndim in (3, 4)
                and KEY not in layer.metadata and not layer.rgb and not layer.multiscale]  # fmt: skip

    def _layers_changed(self) -> None:
        """Take a sample's reference and deformed layers when they arrive; else, until the user picks, the newest
        4D layer, or the two newest 3D layers of one shape (the older the reference)."""
        new = [layer for layer in self._viewer.layers if layer not in self._seen]
        self._seen.update(new)
        roles: dict[str, Any] = {}
        if any(isinstance(layer, Image) and layer.metadata.get(ROLE_KEY) in ("reference", "deformed") for layer in new):
            # a sample's layers arrive one by one: the newest of each role, once both are there
            roles = {layer.metadata.get(ROLE_KEY): layer for layer in self._viewer.layers
                     if isinstance(layer, Image) and KEY not in layer.metadata}  # fmt: skip
        pick = None
        if "reference" in roles and "deformed" in roles:
            pick = (roles["reference"], roles["deformed"])
            self._auto = True  # a sample opened: its pair, taken once and then left as it is
        elif self._auto:
            candidates = self._candidates()
            series = [layer for layer in candidates if layer.ndim == 4]
            volumes = [layer for layer in candidates if layer.ndim == 3]
            if series:
                pick = (series[-1], None)
            elif len(volumes) >= 2:
                newest = volumes[-1]
                same = [layer for layer in volumes[:-1] if layer.data.shape == newest.data.shape]
                if same:
                    pick = (same[-1], newest)
        if pick is not None and self._auto:
            self._choosing = True
            try:
                self.volumes.value = pick[0]
                if pick[1] is not None:
                    self.deformed.value = pick[1]
            finally:
                self._choosing = False
            if "reference" in roles:  # a later layer (an Image ROI of the volume's shape) must not displace them
                self._auto = False
        self._show_inputs()

    def _roi_source(self, shape: tuple[int, ...], volumes: Any) -> tuple[Source | None, Any]:
        """The ROI's source (how the script binds it) and its mask, a copy read here on the GUI thread."""
        layer = self.roi.value
        if layer is None:
            return None, None
        if tuple(layer.data.shape) != shape or layer.ndim != 3:
            raise ValueError(f"the ROI must be a 3D layer of the reference's shape {shape}; layer {layer.name!r} has "
                             f"shape {layer.data.shape}")  # fmt: skip
        placed = (np.asarray(layer.scale), np.asarray(layer.translate))
        if not all(np.allclose(a, b[-3:]) for a, b in zip(placed, (volumes.scale, volumes.translate))):
            raise ValueError(f"the ROI {layer.name!r} must lie on the reference's voxels (its scale and translate)")
        source = Source("roi", layer=layer.name, index="" if isinstance(layer, Labels) else " > 0")
        mask = np.array(source.take(np.asarray(layer.data)), copy=True)  # a copy: painting goes on during the run
        if not np.any(mask):
            raise ValueError(f"the ROI {layer.name!r} is empty: paint the region of interest, or choose none")
        return source, mask

    def make_job(self) -> Job:
        layer = require_layer(self.volumes, "the reference volume, a 3D Image layer (or a 4D series)")
        if layer.multiscale or layer.rgb or layer.ndim not in (3, 4):
            raise ValueError(f"the reference must be a volume (Z, Y, X) or a series (T, Z, Y, X); layer {layer.name!r} "
                             f"has shape {layer.data.shape}")  # fmt: skip
        deformed = None
        if layer.ndim == 3:
            deformed = require_layer(self.deformed, "the deformed volume, a 3D Image layer")
            if deformed is layer:
                raise ValueError(f"the reference and the deformed volume are the same layer ({layer.name!r})")
            if deformed.multiscale or deformed.rgb:
                raise ValueError(f"layer {deformed.name!r} must be a plain volume, not RGB or multiscale")
        roi, roi_data = self._roi_source(tuple(layer.data.shape[-3:]), layer)
        request = VolumeRequest(
            name=layer.name,
            data=layer.data,
            frame=Frame.of(layer),
            deformed_name=None if deformed is None else deformed.name,
            deformed_data=None if deformed is None else deformed.data,
            reference=self.reference_policy.value,
            roi=roi,
            roi_data=roi_data,
            subset=int(self.subset.value),
            step=int(self.step.value),
            shape=self.subset_shape.value,
            strain_method=self.strain_method.value,
            strain_kind=self.strain_kind.value,
            smoothing=float(self.smoothing.value),
            vector_scale=float(self.vector_scale.value),
        )
        check_request(request)
        self._pending = {"subset": request.subset, "step": request.step, "series": request.series}
        return make_volume_job(request)

    # -- results ----------------------------------------------------------------------------
    def show_result(self, result: JobResult, added: list) -> None:
        self._detach_clicks()
        self._by_role = {layer.metadata.get(KEY, {}).get("role"): weakref.ref(layer) for layer in added}
        self._sigma = result.details.get("sigma")
        self._grid = self._pending
        for layer in added:
            if self._on_click not in layer.mouse_drag_callbacks:
                layer.mouse_drag_callbacks.append(self._on_click)
        self._clicked = [weakref.ref(layer) for layer in added]
        self.point_info.value = CLICK_HINT
        vectors = self._layer("vectors")
        if isinstance(vectors, Vectors):
            self._onto_grid_plane(vectors)

    def _onto_grid_plane(self, vectors: Any) -> None:
        """In a 2D view, move the sliders to the plane of grid points nearest to the one shown: napari draws a 3D
        arrow only in the plane of its point, so on any other plane the run would seem to show nothing."""
        dims = self._viewer.dims
        if dims.ndisplay != 2 or not len(vectors.data) or vectors.ndim != dims.ndim:
            return
        hidden = list(dims.not_displayed)
        positions = np.asarray(vectors.data[:, 0], dtype=float)
        world = positions * np.asarray(vectors.scale) + np.asarray(vectors.translate)  # near enough to choose by
        current = np.asarray(dims.point, dtype=float)
        nearest = positions[np.argmin(np.abs(world[:, hidden] - current[hidden]).sum(1))]
        exact = np.asarray(vectors.data_to_world(nearest), dtype=float)
        for axis in hidden:
            dims.set_point(axis, exact[axis])

    def _layer(self, role: str) -> Any:
        ref = self._by_role.get(role)
        layer = ref() if ref is not None else None
        return layer if layer is not None and layer in self._viewer.layers else None

    def _rescale_vectors(self, value: float) -> None:
        layer = self._layer("vectors")
        if isinstance(layer, Vectors):
            layer.length = value if value > 0 else layer.metadata.get("gridmip_auto_length", 1.0)

    def point_at(self, position: Any, view_direction: Any = None, dims_displayed: Any = None) -> tuple[int, ...] | None:
        """The index into the last run's grid arrays of the point at world ``position``: in a 2D view the nearest
        point of the slice; in 3D (``view_direction`` given) the front one of the points within
        :data:`PICK_RADIUS` grid steps of the clicked ray. None when there is none."""
        grid = self._layer("dz")
        if grid is None:
            return None
        shape = np.asarray(grid.data.shape)
        here = np.asarray(grid.world_to_data(np.asarray(position, dtype=float)), dtype=float)
        lead = len(shape) - 3  # a series' time axis
        index = [int(round(c)) for c in here[:lead]]
        if any(not 0 <= i < n for i, n in zip(index, shape[:lead])):
            return None
        spatial = here[lead:]
        displayed = list(dims_displayed) if dims_displayed is not None else []
        if view_direction is None or len(displayed) < 3:
            point = [int(round(c)) for c in spatial]
            if all(0 <= p < n for p, n in zip(point, shape[lead:])) and np.all(np.abs(spatial - point) <= PICK_RADIUS):
                return (*index, *point)
            return None
        ahead = np.asarray(grid.world_to_data(np.asarray(position, float) + np.asarray(view_direction, float)), float)
        direction = ahead[lead:] - spatial
        norm = float(np.linalg.norm(direction))
        if norm == 0:
            return None
        direction /= norm
        points = np.stack(np.meshgrid(*(np.arange(n) for n in shape[lead:]), indexing="ij"), -1).reshape(-1, 3)
        along = (points - spatial) @ direction
        off = np.linalg.norm(points - spatial - along[:, None] * direction, axis=1)
        near = np.flatnonzero(off <= PICK_RADIUS)
        if not len(near):
            return None
        front = near[np.argmin(along[near])]
        return (*index, *(int(c) for c in points[front]))

    def show_point(self, position: Any, view_direction: Any = None, dims_displayed: Any = None) -> str | None:
        """Show the clicked grid point's displacement, ZNCC (and its residual 1 - ZNCC), uncertainty and status in
        the widget and napari's status bar; the text, or None when no point is there."""
        at = self.point_at(position, view_direction, dims_displayed)
        if at is None:
            return None
        layers = {role: self._layer(role) for role in ("dz", "dy", "dx", "zncc", "status")}
        if any(layer is None for layer in layers.values()):
            return None
        dz, dy, dx, zncc = (float(layers[r].data[at]) for r in ("dz", "dy", "dx", "zncc"))
        status = Status(int(layers["status"].data[at]))
        grid = self._grid or {"subset": 1, "step": 1, "series": False}
        half, step = grid["subset"] // 2, grid["step"]
        voxel = tuple(half + step * i for i in at[-3:])
        where = f"time point {at[0]}, " if len(at) == 4 else ""
        lines = [f"{where}voxel (z, y, x) = {voxel}: status {status.name}"]
        if status == Status.ok:
            lines.append(f"d (z, y, x) = ({dz:.3f}, {dy:.3f}, {dx:.3f}) vox")
            if self._sigma is not None and self._sigma.shape[:-1] == layers["dz"].data.shape:
                sigma = self._sigma[at]
                lines.append(f"sigma = ({sigma[0]:.2g}, {sigma[1]:.2g}, {sigma[2]:.2g}) vox")
        if np.isfinite(zncc):
            lines.append(f"ZNCC {zncc:.4f} (residual 1 - ZNCC {1 - zncc:.2g})")
        # a line each in the widget (a paragraph of numbers reads badly), one line in the status bar
        self.point_info.value = "\n".join(lines)
        self.point_info.tooltip = self.point_info.value
        self._viewer.status = "; ".join(lines)
        return self.point_info.value

    def _detach_clicks(self) -> None:
        for ref in self._clicked:
            layer = ref()
            if layer is not None and self._on_click in layer.mouse_drag_callbacks:
                layer.mouse_drag_callbacks.remove(self._on_click)
        self._clicked = []

    def release(self) -> None:
        """Also take the click callback off the result layers."""
        if not self.released:
            self._detach_clicks()
        super().release()
