"""The "Correlation map" dock widget."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from magicgui.widgets import CheckBox, ComboBox, FloatSpinBox, SpinBox
from napari.layers import Image, Vectors

from napari_gridmip._jobs import Job, JobResult
from napari_gridmip._jobs.correlation import CorrelationRequest, make_correlation_job
from napari_gridmip._placement import Frame
from napari_gridmip._provenance import KEY
from napari_gridmip._widgets._base import JobWidget, require_layer
from napari_gridmip.core._options import PRECISIONS, SUBPIXEL_METHODS

if TYPE_CHECKING:
    import napari

ROLE_KEY = "gridmip_role"  # layer.metadata entry ("img1" / "img2") that the speckle sample sets


class CorrelationWidget(JobWidget):
    """Windowed Pearson correlation between two K-stacks, and the displacement field at its peaks."""

    settings_key = "correlation"
    persisted = ("window_rows", "window_cols", "subpixel", "precision", "spacing", "vector_scale", "full_map")

    def __init__(self, napari_viewer: napari.viewer.Viewer) -> None:
        super().__init__(napari_viewer)
        self.img1 = self.layer_combo("img1", "img1 (K, M, N)", (Image,))
        self.img2 = self.layer_combo("img2", "img2 (K, M, N)", (Image,))
        self.window_rows = SpinBox(name="window_rows", label="Window rows (odd)", value=9, min=1, max=201, step=2)
        self.window_cols = SpinBox(name="window_cols", label="Window cols (odd)", value=9, min=1, max=201, step=2)
        self.subpixel = ComboBox(name="subpixel", label="Sub-pixel", choices=list(SUBPIXEL_METHODS), value="hessian")
        self.precision = ComboBox(name="precision", label="Precision", choices=list(PRECISIONS), value="float32")
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
        self.full_map = CheckBox(name="full_map", text="Also add the full 4D map", value=False)
        self._finish(
            [
                self.img1,
                self.img2,
                self.window_rows,
                self.window_cols,
                self.subpixel,
                self.precision,
                self.spacing,
                self.vector_scale,
                self.full_map,
            ]
        )
        self._vectors: Any = None  # weak reference to the last vectors layer
        self.vector_scale.changed.connect(self._rescale_vectors)

    def _layers_changed(self) -> None:
        """Fill img1 and img2 while they are empty or the same layer; never override a choice the user made.

        From the layers' roles (as the speckle sample sets them), else the newest two stacks of one shape;
        never this plugin's own results.
        """
        if self.img1.value is not None and self.img2.value is not None and self.img1.value is not self.img2.value:
            return
        stacks = [
            layer
            for layer in reversed(self._viewer.layers)
            if isinstance(layer, Image) and layer.ndim >= 3 and KEY not in layer.metadata and not layer.rgb
        ]
        by_role = {layer.metadata.get(ROLE_KEY): layer for layer in stacks}
        if "img1" in by_role and "img2" in by_role:
            self.img1.value, self.img2.value = by_role["img1"], by_role["img2"]
            return
        for i, newer in enumerate(stacks):
            older = next((layer for layer in stacks[i + 1 :] if layer.data.shape == newer.data.shape), None)
            if older is not None:
                self.img1.value, self.img2.value = older, newer
                return

    def make_job(self) -> Job:
        layer1 = require_layer(self.img1, "img1, an Image layer of K frames")
        layer2 = require_layer(self.img2, "img2, an Image layer of K frames")
        if layer1 is layer2:
            raise ValueError(f"img1 and img2 are the same layer ({layer1.name!r}): choose the two stacks to compare")
        for layer in (layer1, layer2):
            if layer.multiscale or layer.rgb or layer.ndim < 3:
                raise ValueError(f"layer {layer.name!r} must be a plain (K, M, N) stack; got shape {layer.data.shape}")
        request = CorrelationRequest(
            name1=layer1.name,
            name2=layer2.name,
            data1=layer1.data,
            data2=layer2.data,
            frame=Frame.of(layer2),
            window=(int(self.window_rows.value), int(self.window_cols.value)),
            subpixel=self.subpixel.value,
            dtype=self.precision.value,
            spacing=int(self.spacing.value),
            vector_scale=float(self.vector_scale.value),
            full_map=bool(self.full_map.value),
        )
        return make_correlation_job(request)

    def show_result(self, result: JobResult, added: list) -> None:
        vectors = [layer for layer in added if isinstance(layer, Vectors)]
        self._vectors = weakref.ref(vectors[-1]) if vectors else None

    def _rescale_vectors(self, value: float) -> None:
        layer = self._vectors() if self._vectors is not None else None
        if layer is not None and layer in self._viewer.layers:
            layer.length = value if value > 0 else layer.metadata.get("gridmip_auto_length", 1.0)
