"""A segmentation fault of Mesa 22.3's llvmpipe, reproduced with napari alone (no plugin code).

    xvfb-run -a python -X faulthandler benchmarks/probes/repro_llvmpipe_crash.py

Two image layers; one is deleted (vispy deletes its GL program), then the canvas changes size (the
window is resized, or the dims slider goes away because only 2D layers are left): the next draw
crashes inside ``glDrawArrays``. Found by benchmarks/probes/soak.py ("delete the input during a run" on the
patches widget). Measured here (Debian 12, Xvfb, napari 0.9.2, vispy 0.16.2 and 0.17.0, PyQt5 and
PyQt6): Mesa 22.3.6 crashes every time; Mesa 25.0.7 (bookworm-backports) does not; skipping vispy's
GL ``DELETE`` of programs alone (textures and buffers still deleted) also avoids it. Exit status 0
when the process survives.
"""

import time

import numpy as np


def main() -> None:
    import napari
    from qtpy.QtWidgets import QApplication

    def run_events(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            QApplication.processEvents()
            time.sleep(0.002)

    viewer = napari.Viewer()
    viewer.add_image(np.random.default_rng(0).random((32, 32), np.float32), name="deleted")
    run_events(0.5)
    viewer.add_image(np.random.default_rng(1).random((64, 64), np.float32), name="kept")
    run_events(0.5)
    viewer.layers.remove("deleted")
    run_events(0.3)
    window = viewer.window._qt_window
    window.resize(window.width() + 80, window.height() + 60)
    run_events(1.0)
    viewer.close()
    print("survived: this OpenGL driver does not have the crash")


if __name__ == "__main__":
    main()
