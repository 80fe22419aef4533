"""The "Occupancy mipmap" dock widget."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from magicgui.widgets import CheckBox, FloatSpinBox, Label
from napari.layers import Image, Labels

from napari_gridmip._widgets._base import JobWidget, jax_device_text, require_layer
from napari_gridmip._widgets._placement import derived_placement

if TYPE_CHECKING:
    import napari


def level_placement(layer: Any, level: int) -> dict[str, Any]:
    """Placement of mipmap level ``level``: each voxel covers a 2**level block of the input."""
    factor = 2**level
    return derived_placement(layer, step=factor, offset=(factor - 1) / 2)


class MipmapWidget(JobWidget):
    """Compute the occupancy pyramid of a 3D Image or Labels layer."""

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
        self.per_level = CheckBox(name="per_level", text="Also add one layer per level", value=False)
        self.device = Label(name="device", label="Device", value=jax_device_text())
        self.fractions = Label(name="fractions", label="Occupied", value="")
        self._finish([self.layer, self.threshold, self.per_level, self.device])
        self.append(self.fractions)

    def _make_job(self):
        layer = require_layer(self.layer, "a 3D Image or Labels layer")
        data = layer.data[0] if layer.multiscale else layer.data
        if data.ndim != 3:
            raise ValueError(f"layer {layer.name!r} must be 3D; got shape {tuple(data.shape)}")
        threshold = float(self.threshold.value)
        per_level = bool(self.per_level.value)
        name = layer.name

        def job(progress):
            from napari_gridmip.core import occupancy_mipmap

            progress(0, 1)
            levels = occupancy_mipmap(np.asarray(data), threshold)
            levels = [np.asarray(level) for level in levels]  # views of JAX's buffers on the CPU
            fractions = [np.count_nonzero(level) / level.size for level in levels]
            progress(1, 1)
            return levels, fractions

        def to_layers(result):
            levels, _ = result
            common = {"contrast_limits": (0, 1), "colormap": "gray", "blending": "additive"}
            out = [
                (levels, {"name": f"{name} mipmap", "multiscale": True, **common, **level_placement(layer, 0)}, "image")
            ]
            if per_level:
                out += [
                    (
                        level,
                        {"name": f"{name} mipmap level {k}", "visible": False, **common, **level_placement(layer, k)},
                        "image",
                    )
                    for k, level in enumerate(levels)
                ]
            return out

        def on_done(result) -> None:
            levels, fractions = result
            self.fractions.value = "\n".join(
                f"level {k} {level.shape}: {100 * fraction:.3g}% occupied"
                for k, (level, fraction) in enumerate(zip(levels, fractions))
            )

        return job, to_layers, f"Occupancy mipmap of {name!r}", on_done
