"""A napari session that froze napari for good before our work left Qt's global thread pool, run as
its own process by ``tests/widgets/test_no_hang.py`` under an outside watchdog: a deadlock that holds the GIL
stops every thread of the process, a watchdog thread in it included.

    python -m tests.widgets.hang_session [--pool N] [--rounds R]

The session: Qt's global pool limited to ``N`` threads (its default is the core count: 2 on the machine where
the freeze was seen), the Occupancy mipmap and Correlation map widgets docked with their samples, and each
Run followed, while the job runs, by what napari's activity dialog does on the GUI thread: a smooth scaling and a
format conversion of a large image, which Qt splits into tasks of its global pool and waits for while the
GUI thread holds the GIL. Prints "OK" and exits 0 when every run has finished, no thread of Qt's global pool
was ever busy (sampled every 5 ms), and the viewer is closed.
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pool", type=int, default=1, help="Qt's global pool's thread count")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)

    import napari
    import qtpy
    from qtpy.QtCore import QThreadPool, QTimer
    from qtpy.QtGui import QImage
    from qtpy.QtWidgets import QApplication

    from napari_gridmip._sample_data import occupancy_sample, speckle_sample
    from napari_gridmip._widgets.correlation_widget import CorrelationWidget
    from napari_gridmip._widgets.mipmap_widget import MipmapWidget

    print("binding", qtpy.API_NAME, flush=True)
    pool = QThreadPool.globalInstance()
    pool.setMaxThreadCount(args.pool)
    busiest = {"threads": 0}

    def sample() -> None:
        busiest["threads"] = max(busiest["threads"], pool.activeThreadCount())

    sampler = QTimer()
    sampler.timeout.connect(sample)
    sampler.start(5)
    viewer = napari.Viewer(show=True)
    app = QApplication.instance()

    def wait(condition, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while not condition():
            if time.monotonic() > end:
                return False
            app.processEvents()
            time.sleep(0.005)
        return True

    def qt_pool_work() -> None:
        """What napari's activity dialog's busy animation does on the GUI thread (QMovie scaling its frame):
        Qt runs it as tasks of its global pool and waits for them."""
        image = QImage(1600, 1600, QImage.Format.Format_ARGB32)
        image.fill(0xFF336699)
        image.scaled(1200, 1200, transformMode=qtpy.QtCore.Qt.TransformationMode.SmoothTransformation)
        image.convertToFormat(QImage.Format.Format_RGB888)

    for data, meta, kind in occupancy_sample() + speckle_sample():
        getattr(viewer, f"add_{kind}")(data, **meta)
    widgets = [MipmapWidget(viewer), CorrelationWidget(viewer)]
    for widget in widgets:
        viewer.window.add_dock_widget(widget)
    for _ in range(args.rounds):
        for widget in widgets:
            if not wait(lambda w=widget: w.run_button.enabled, 120):
                print("Run never became enabled", flush=True)
                return 1
            widget.run_button.native.click()
            for delay in (0, 30, 100, 300):
                QTimer.singleShot(delay, qt_pool_work)
            if not wait(lambda w=widget: not w.runner.busy, 120):
                print("a run never finished", flush=True)
                return 1
    for widget in widgets:
        widget.release()
    viewer.close()
    wait(lambda: False, 0.5)
    sampler.stop()
    # Qt's global pool is Qt's and napari's: none of our work may take one of its threads
    print(f"global pool threads busy at most: {busiest['threads']}", flush=True)
    if busiest["threads"]:
        return 1
    print("OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
