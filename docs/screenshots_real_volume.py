"""Screenshots of a real sparse volume: napari's own 3D view against 'Full resolution in 3D', same cameras.

    xvfb-run -a --server-args="-screen 0 1600x1000x24" python docs/screenshots_real_volume.py neurons_5um.ome.zarr

The OME-Zarr is the occupancy pyramid the command line writes (docs/occupancy.md, "A real sparse volume": 20 mouse
neurons drawn at 5 um by tools/swc_to_volume.py, then ``napari-gridmip mipmap``). A real viewer, 1400 x 900, with
the Occupancy mipmap widget docked opens it with this plugin's reader (File > Open), switches to 3D and turns on the
switch by clicking it. For each camera: the camera is set, the script waits for the full-resolution picture and
grabs the canvas, hides the picture (napari's own view of the same camera and layer shows: its coarsest level) and
grabs it again; each image is the two canvases side by side, napari's left, ours right. A last camera (the overview
turned 10 degrees) is timed only. With ``--napari-level 1`` napari's own view is then locked to level 1 for the
overview's camera (``layer.locked_data_level``), timed, and put between the two in the overview's image. Printed: per
camera the seconds from the camera's change to the full-resolution picture (the widget waits 0.3 s for the camera to
rest), the render's own seconds and chunks; the process's resident memory (sampled every 5 ms) after opening the
layer in 3D, its peak while our pictures were made, and its peak while napari showed the locked level.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from screenshots import OUT, canvas_picture, save_picture  # noqa: E402
from screenshots_live3d import wait_final  # noqa: E402

WINDOW = (1400, 900)
VIEWS = {
    # name: (angles, zoom relative to the fitted view, centre as a fraction of the volume, perspective)
    "real_volume_overview": ((-20.0, 30.0, 145.0), 1.1, (0.5, 0.5, 0.5), 0.0),
    # the densest arbor (the 32^3-voxel cells of level 5, smoothed over 5 cells, peak there), 4x
    "real_volume_arbor": ((-20.0, 30.0, 145.0), 4.0, (0.25, 0.24, 0.33), 0.0),
    "real_volume_closeup": ((-35.0, 15.0, 120.0), 6.0, (0.5, 0.55, 0.45), 30.0),
}
# timed only: the overview turned by 10 degrees, its chunks already read (a rotation, as one makes in the viewer)
REVISIT = ((-30.0, 30.0, 145.0), 1.1, (0.5, 0.5, 0.5), 0.0)


class Resident:
    """The process's resident memory, sampled every 5 ms in a thread: now, and the peak since ``reset``."""

    def __init__(self) -> None:
        import os

        self._page = os.sysconf("SC_PAGE_SIZE")
        self.peak = self.now()
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def now(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self._page

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(0.005)

    def reset(self) -> None:
        self.peak = self.now()

    def stop(self) -> None:
        self._stop.set()


def set_camera(viewer, layer, fitted: float, angles, zoom: float, center, perspective: float) -> None:
    camera = viewer.scene.camera
    camera.angles = angles
    camera.zoom = fitted * zoom
    camera.center = tuple(np.asarray(center) * np.asarray(layer.data[0].shape) * np.asarray(layer.scale))
    camera.perspective = perspective


def main() -> None:
    import argparse
    import os
    import resource
    import tempfile

    import napari
    from qtpy.QtWidgets import QApplication

    from napari_gridmip._widgets.mipmap_widget import MipmapWidget

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="the OME-Zarr occupancy pyramid")
    parser.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="seconds between the layer shown in 3D and the switch's click (default 0: at once)",
    )
    parser.add_argument(
        "--napari-level", type=int, default=None,
        help="then lock napari's own 3D view at this level (layer.locked_data_level) for the overview's camera: "
        "its draw is timed, its memory reported, and its canvas made the middle of the overview's picture",
    )  # fmt: skip
    args = parser.parse_args()
    os.environ.setdefault("NAPARI_GRIDMIP_CONFIG_DIR", tempfile.mkdtemp())
    gib = 2**30
    memory = Resident()
    OUT.mkdir(exist_ok=True)
    app = QApplication.instance() or QApplication([])
    viewer = napari.Viewer(title="napari-gridmip", show=True)
    viewer.window._qt_window.resize(*WINDOW)
    widget = MipmapWidget(viewer)
    viewer.window.add_dock_widget(widget, name="Occupancy mipmap")
    start = time.perf_counter()
    (layer,) = viewer.open(args.path, plugin="napari-gridmip")  # File > Open with this plugin's reader
    widget.layer.value = layer
    viewer.dims.ndisplay = 3
    viewer.reset_view()
    for _ in range(20):
        app.processEvents()
    print(
        f"opened {layer.name!r} in 3D in {time.perf_counter() - start:.1f} s: levels {[d.shape for d in layer.data]}, "
        f"napari shows level {layer.data_level}; resident {memory.now() / gib:.2f} GiB"
    )
    fitted = viewer.scene.camera.zoom
    if args.pause:  # a user looking at napari's own view before turning the switch on
        until = time.perf_counter() + args.pause
        while time.perf_counter() < until:
            app.processEvents()
            time.sleep(0.01)
    memory.reset()
    pictures = {}
    moved = time.perf_counter()
    widget.live_3d.native.click()  # the first view counts from the switch's click
    for name, view in [*VIEWS.items(), ("overview turned 10 degrees (timed only)", REVISIT)]:
        set_camera(viewer, layer, fitted, *view)
        shown: list[float] = []
        wait_final(app, widget, shown=shown)
        since = time.perf_counter() - moved
        passes = ", ".join(f"level {p.level} {p.seconds:.2f} s" for p in list(widget._live.pictures)[-2:])
        print(f"{name}: full resolution {since:.1f} s after the camera's change, first picture "
              f"{shown[0] - moved:.1f} s (renders: {passes}); {widget.view_info.value}")  # fmt: skip
        if name in VIEWS:
            ours = canvas_picture(viewer, app)
            widget._live.overlay.visible = False  # napari's own view, same camera
            pictures[name] = [canvas_picture(viewer, app), ours]
            widget._live.overlay.visible = True
        moved = time.perf_counter()
    widget.live_3d.native.click()
    print(f"peak resident while the pictures were made: {memory.peak / gib:.2f} GiB")
    if args.napari_level is not None:
        name = next(iter(VIEWS))
        set_camera(viewer, layer, fitted, *VIEWS[name])
        canvas_picture(viewer, app)
        memory.reset()
        start = time.perf_counter()
        layer.locked_data_level = args.napari_level
        finest = canvas_picture(viewer, app)
        seconds = time.perf_counter() - start
        set_camera(viewer, layer, fitted, *REVISIT)
        start = time.perf_counter()
        canvas_picture(viewer, app)
        redraw = time.perf_counter() - start
        print(
            f"napari's own view locked at level {args.napari_level} {layer.data[args.napari_level].shape}: drawn in "
            f"{seconds:.1f} s, redrawn after a rotation in {redraw:.1f} s; peak resident {memory.peak / gib:.2f} GiB"
        )
        pictures[name].insert(1, finest)
    for name, canvases in pictures.items():
        gap = np.full((canvases[0].shape[0], 8, 3), 255, np.uint8)
        save_picture(np.concatenate([part for canvas in canvases for part in (gap, canvas)][1:], axis=1), name)
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"peak resident of the process (ru_maxrss): {maxrss:.2f} GiB")
    memory.stop()
    viewer.close()


if __name__ == "__main__":
    main()
