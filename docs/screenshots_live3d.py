"""Screenshots of 'Full resolution in 3D': napari's coarse view against ours from the same camera, two views.

    xvfb-run -a --server-args="-screen 0 1600x1000x24" python docs/screenshots_live3d.py [--size 2048]

A real viewer with the Occupancy mipmap widget docked opens File > Open Sample > "Sparse volume (large)" (written
into the per-user cache on first use), turns on the switch by clicking it, sets the camera, waits for the
full-resolution picture, grabs the canvas, hides the picture (napari's own coarse view of the same camera shows)
and grabs it again. Each image is the two canvases side by side: napari's coarse view left, ours right.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from screenshots import OUT, canvas_picture, save_picture  # noqa: E402

WINDOW = (1400, 900)
VIEWS = {
    # name: (angles, zoom relative to the fitted view, centre as a fraction of the volume, perspective)
    "live3d_overview": ((-20.0, 30.0, 145.0), 1.0, (0.5, 0.5, 0.5), 0.0),
    "live3d_closeup": ((-35.0, 15.0, 120.0), 5.0, (0.5, 0.55, 0.45), 30.0),
}


def wait_final(app, widget, timeout_s: float = 600.0, shown: list | None = None):
    """Wait for the full-resolution picture; ``shown`` gets the time (``perf_counter``) a picture first shows."""
    start = time.perf_counter()
    live = widget._live
    while not (live._final_state is not None and live.worker is None and live.overlay is not None):
        app.processEvents()
        if shown is not None and not shown and live._shown_state is not None:
            shown.append(time.perf_counter())
        time.sleep(0.02)
        if time.perf_counter() - start > timeout_s:
            raise TimeoutError("no full-resolution picture")
    for _ in range(20):
        app.processEvents()
    return [p for p in live.pictures if p.final][-1]


def main() -> None:
    import os
    import tempfile

    import napari
    from qtpy.QtWidgets import QApplication

    from napari_gridmip._widgets.mipmap_widget import MipmapWidget

    os.environ.setdefault("NAPARI_GRIDMIP_CONFIG_DIR", tempfile.mkdtemp())
    size = int(sys.argv[sys.argv.index("--size") + 1]) if "--size" in sys.argv else 2048
    OUT.mkdir(exist_ok=True)
    app = QApplication.instance() or QApplication([])
    viewer = napari.Viewer(title="napari-gridmip", show=True)
    viewer.window._qt_window.resize(*WINDOW)
    widget = MipmapWidget(viewer)
    viewer.window.add_dock_widget(widget, name="Occupancy mipmap")
    # what File > Open Sample > "Sparse volume (large)" calls (napari.yaml's sample_sparse_volume command)
    from napari_gridmip._sample_data.sparse import sparse_volume_sample

    [(data, kwargs, _)] = sparse_volume_sample(size)
    viewer.add_image(data, **kwargs)
    layer = viewer.layers[-1]
    widget.layer.value = layer
    viewer.dims.ndisplay = 3
    viewer.reset_view()
    for _ in range(20):
        app.processEvents()
    fitted = viewer.scene.camera.zoom
    widget.live_3d.native.click()
    for name, (angles, zoom, center, perspective) in VIEWS.items():
        camera = viewer.scene.camera
        camera.angles = angles
        camera.zoom = fitted * zoom * 0.9
        camera.center = tuple(np.asarray(center) * np.asarray(layer.data[0].shape))
        camera.perspective = perspective
        picture = wait_final(app, widget)
        ours = canvas_picture(viewer, app)
        widget._live.overlay.visible = False  # napari's own view, same camera
        coarse = canvas_picture(viewer, app)
        widget._live.overlay.visible = True
        gap = np.full((coarse.shape[0], 8, 3), 255, np.uint8)
        save_picture(np.concatenate([coarse, gap, ours], axis=1), name)
        print(f"{name}: {widget.view_info.value} (full resolution in {picture.seconds:.1f} s)")
    widget.live_3d.native.click()
    viewer.close()


if __name__ == "__main__":
    main()
