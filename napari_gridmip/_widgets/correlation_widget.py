"""The "Correlation map" dock widget."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from magicgui.widgets import CheckBox, ComboBox, SpinBox
from napari.layers import Image

from napari_gridmip._widgets._base import JobWidget, require_layer
from napari_gridmip._widgets._placement import derived_placement

if TYPE_CHECKING:
    import napari

SUBPIXEL_METHODS = ("hessian", "paraboloid", "refine", "none")  # core.correlation.SUBPIXEL_METHODS
ROLE_KEY = "gridmip_role"  # layer.metadata entry ("img1" / "img2") that the speckle sample sets
EAGER_MAP_BYTES = 512 * 2**20  # larger full maps are computed lazily, band by band, as napari shows them


def output_placement(layer: Any, window: tuple[int, int]) -> dict[str, Any]:
    """Placement of an ``(..., M - 2m, N - 2n)`` result: output pixel (i, j) is img2's pixel (i + m, j + n)."""
    ndim = layer.ndim
    axes = [a for a in range(ndim) if a != ndim - 3]  # every axis but K
    offset = [0.0] * (len(axes) - 2) + [window[0] // 2, window[1] // 2]
    return derived_placement(layer, axes=axes, offset=offset)


def displacement_vectors(dy: np.ndarray, dx: np.ndarray, window: tuple[int, int], spacing: int) -> np.ndarray:
    """napari Vectors data ``(P, 2, 2)`` on a grid of every ``spacing``-th output pixel, in img2's pixels.

    Positions are img2 pixel coordinates ``(i + m, j + n)``; NaN displacements are left out.
    """
    m, n = window[0] // 2, window[1] // 2
    i, j = np.meshgrid(np.arange(0, dy.shape[0], spacing), np.arange(0, dy.shape[1], spacing), indexing="ij")
    vy, vx = dy[i, j], dx[i, j]
    keep = np.isfinite(vy) & np.isfinite(vx)
    positions = np.stack([i[keep] + m, j[keep] + n], axis=-1).astype(np.float32)
    return np.stack([positions, np.stack([vy[keep], vx[keep]], axis=-1)], axis=1)


def lazy_map(img1: np.ndarray, img2: np.ndarray, window: tuple[int, int], dtype: str, band_rows: int = 64):
    """The full map as a dask array ``(wm, wn, M - 2m, N - 2n)``, each row band computed on demand."""
    import dask.array as da

    from napari_gridmip.core import windowed_pearson

    m, n = window[0] // 2, window[1] // 2
    rows, cols = img1.shape[-2] - 2 * m, img1.shape[-1] - 2 * n
    starts = list(range(0, rows, band_rows))

    def band(start: int) -> np.ndarray:
        stop = min(start + band_rows, rows)
        out = windowed_pearson(img1[:, start : stop + 2 * m], img2[:, start : stop + 2 * m], window, dtype=dtype)
        return np.asarray(out).transpose(2, 3, 0, 1)

    blocks = [
        da.from_delayed(_delayed(band, s), shape=(*window, min(s + band_rows, rows) - s, cols), dtype=np.dtype(dtype))
        for s in starts
    ]
    return da.concatenate(blocks, axis=2)


def _delayed(fn, *args):
    import dask

    return dask.delayed(fn, pure=True)(*args)


class CorrelationWidget(JobWidget):
    """Windowed Pearson correlation between two K-stacks, and the displacement field at its peaks."""

    def __init__(self, napari_viewer: napari.viewer.Viewer) -> None:
        super().__init__(napari_viewer)
        self.img1 = self.layer_combo("img1", "img1 (K, M, N)", (Image,))
        self.img2 = self.layer_combo("img2", "img2 (K, M, N)", (Image,))
        self.window_rows = SpinBox(name="window_rows", label="Window rows (odd)", value=9, min=1, max=201, step=2)
        self.window_cols = SpinBox(name="window_cols", label="Window cols (odd)", value=9, min=1, max=201, step=2)
        self.subpixel = ComboBox(name="subpixel", label="Sub-pixel", choices=list(SUBPIXEL_METHODS), value="hessian")
        self.precision = ComboBox(name="precision", label="Precision", choices=["float32", "float64"], value="float32")
        self.spacing = SpinBox(name="spacing", label="Vector spacing (px)", value=8, min=1, max=512)
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
                self.full_map,
            ]
        )
        self._pick_defaults()
        viewer = self._viewer
        viewer.layers.events.inserted.connect(self._pick_defaults)

    def _pick_defaults(self, *_: Any) -> None:
        """img1 and img2 from the layers' roles (as the speckle sample sets them), else the two newest stacks."""
        stacks = [layer for layer in reversed(self._viewer.layers) if isinstance(layer, Image) and layer.ndim >= 3]
        by_role = {layer.metadata.get(ROLE_KEY): layer for layer in stacks}
        if "img1" in by_role and "img2" in by_role:
            self.img1.value, self.img2.value = by_role["img1"], by_role["img2"]
        elif len(stacks) >= 2 and self.img1.value is self.img2.value:
            self.img1.value, self.img2.value = stacks[1], stacks[0]

    def _make_job(self):
        layer1 = require_layer(self.img1, "img1, an Image layer of K frames")
        layer2 = require_layer(self.img2, "img2, an Image layer of K frames")
        for layer in (layer1, layer2):
            if layer.multiscale or layer.rgb or layer.ndim < 3:
                raise ValueError(f"layer {layer.name!r} must be a plain (K, M, N) stack; got shape {layer.data.shape}")
        data1, data2 = layer1.data, layer2.data
        window = (int(self.window_rows.value), int(self.window_cols.value))
        subpixel, dtype = self.subpixel.value, self.precision.value
        spacing, with_map = int(self.spacing.value), bool(self.full_map.value)
        name = layer2.name
        placement = output_placement(layer2, window)
        vector_placement = derived_placement(layer2, axes=[layer2.ndim - 2, layer2.ndim - 1])

        def job(progress):
            from napari_gridmip.core import find_displacement, windowed_pearson

            img1, img2 = np.asarray(data1), np.asarray(data2)
            dy, dx, peak = (
                np.asarray(r)
                for r in find_displacement(img1, img2, window, subpixel=subpixel, dtype=dtype, progress=progress)
            )
            full = None
            if with_map:
                m, n = window[0] // 2, window[1] // 2
                size = np.dtype(dtype).itemsize * window[0] * window[1] * (img1.shape[-2] - 2 * m)
                if img1.ndim == 3 and size * (img1.shape[-1] - 2 * n) > EAGER_MAP_BYTES:
                    full = lazy_map(img1, img2, window, dtype)
                else:
                    full = np.asarray(windowed_pearson(img1, img2, window, dtype=dtype, progress=progress))
                    full = np.moveaxis(full, (-2, -1), (-4, -3))  # offsets first: each plane is one offset
            return dy, dx, peak, full

        def to_layers(result):
            dy, dx, peak, full = result
            layers = [
                (dy, {"name": f"{name} dy", "colormap": "coolwarm", **placement}, "image"),
                (dx, {"name": f"{name} dx", "colormap": "coolwarm", **placement}, "image"),
                (
                    peak,
                    {"name": f"{name} peak", "colormap": "viridis", "contrast_limits": (0, 1), **placement},
                    "image",
                ),
            ]
            if dy.ndim == 2:
                vectors = displacement_vectors(dy, dx, window, spacing)
                layers.append(
                    (
                        vectors,
                        {
                            "name": f"{name} displacement",
                            "edge_color": "yellow",
                            "edge_width": 0.5,
                            "length": 4.0,
                            **vector_placement,
                        },
                        "vectors",
                    )
                )
            if full is not None:
                m, n = window[0] // 2, window[1] // 2
                # axes (..., wm, wn, M - 2m, N - 2n): the offsets get unit steps from -m and -n
                scale = np.concatenate([placement["scale"][:-2], [1.0, 1.0], placement["scale"][-2:]])
                translate = np.concatenate([placement["translate"][:-2], [-m, -n], placement["translate"][-2:]])
                layers.append(
                    (
                        full,
                        {
                            "name": f"{name} correlation map",
                            "scale": scale,
                            "translate": translate,
                            "contrast_limits": (-1, 1),
                            "colormap": "magma",
                        },
                        "image",
                    )
                )
            return layers

        return job, to_layers, f"Correlating {layer1.name!r} with {name!r}", None
