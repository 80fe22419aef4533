"""Ready for napari's next release: the widgets reach napari through its public API only.

napari 0.9 hands a plugin's widget its viewer behind a proxy that warns (FutureWarning) on each private attribute,
which napari 0.10 is to refuse, and deprecates viewer attributes (DeprecationWarning: ``viewer.camera`` for
``viewer.scene.camera``, ...). Here the widgets are docked as napari docks a plugin's widgets, and run, with both
kinds of warning made errors; and the package's source is searched for napari's private Qt objects.
"""

import re
import threading
from pathlib import Path

import numpy as np
import pytest

import napari_gridmip
from napari_gridmip.cli import WIDGET_NAMES

# napari's deprecations as errors: those of napari's own code, and those our calls into napari cause, which napari
# attributes to its caller (its stacklevel): a module of napari_gridmip. A filter's module is a regular expression
# matched at the start of the module's name, so "napari" covers both (and napari's other packages). The marks hold
# through each test's set-up and teardown too (the viewer made and closed, the widgets released), and for our
# worker threads (Python's warning filters are the process's).
pytestmark = [
    pytest.mark.filterwarnings("error::FutureWarning:napari"),
    pytest.mark.filterwarnings("error::DeprecationWarning:napari"),
]

PACKAGE = Path(napari_gridmip.__file__).parent
# napari's Qt window and viewer (``Window._qt_window``, ``Window._qt_viewer``), any private attribute of its
# ``Window``, and its private modules (napari._qt, napari._vispy, ...)
PRIVATE_NAPARI = re.compile(r"_qt_window|_qt_viewer|window\._|\bnapari\._")


def test_the_package_names_no_private_napari_object():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if PRIVATE_NAPARI.search(line):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert not found, "private napari objects named in the package:\n" + "\n".join(found)


@pytest.fixture
def plugin_docks(make_napari_viewer, qtbot):
    """``(viewer, dock)``, ``dock(name)`` -> the widget named ``name`` in napari.yaml, docked as napari's Plugins
    menu docks it: made by napari, with the viewer napari hands plugins (the proxy that warns on private access).
    At the end each widget is released as closing its dock does, and its jobs waited for."""
    viewer = make_napari_viewer(show=True)
    widgets = []

    def dock(name):
        _, widget = viewer.window.add_plugin_dock_widget("napari-gridmip", name)
        widgets.append(widget)
        return widget

    yield viewer, dock
    for widget in widgets:
        widget.release()
        qtbot.waitUntil(lambda w=widget: not w.runner.busy and not w.runner.prefetching, timeout=120_000)


def _run(widget, qtbot, *, button=None, timeout=180_000):
    (button or widget.run_button).native.click()
    qtbot.waitUntil(lambda: not widget.runner.busy, timeout=timeout)
    assert widget.status.value.startswith("Done"), widget.status.value


def test_the_filters_catch_what_the_package_did_before(make_napari_viewer):
    """What the package did before, from a module of ours through the viewer napari hands its widget, is an error
    here: a private attribute of napari's window read, the deprecated ``viewer.camera`` read."""
    viewer = make_napari_viewer()
    _, widget = viewer.window.add_plugin_dock_widget("napari-gridmip", "Occupancy mipmap")
    ours = {"__name__": "napari_gridmip._widgets._old", "viewer": widget._viewer}
    with pytest.raises(FutureWarning, match="Private attribute access"):
        exec("hasattr(viewer.window, '_qt_window')", ours)
    with pytest.raises(DeprecationWarning, match="viewer.scene.camera"):
        exec("viewer.camera", ours)


def test_the_widgets_run_with_napari_deprecations_as_errors(plugin_docks, qtbot, monkeypatch, tmp_path):
    """Every widget docked through napari's plugin path; the Correlation map run on the DIC pair sample and the
    Occupancy mipmap on the occupancy sample, its render from the 3D camera and its full-resolution 3D view too."""
    from napari_gridmip._sample_data import _cache, dic

    monkeypatch.setattr(dic, "DIC_SHAPE", (128, 144))  # seconds, not a minute (the sample and its stand-in)
    monkeypatch.setattr(_cache, "_folder", lambda: tmp_path / "samples")  # not the session's cache of full samples
    viewer, dock = plugin_docks
    widgets = {name: dock(name) for name in WIDGET_NAMES}
    for widget in widgets.values():
        # napari's proxy, not the viewer itself: private access from the widget would warn
        assert widget._viewer == viewer and type(widget._viewer) is not type(viewer)

    correlation = widgets["Correlation map"]
    viewer.open_sample("napari-gridmip", "dic")
    assert correlation.mode.value == "single pair, subset"  # the sample's DIC settings
    _run(correlation, qtbot)
    assert "DIC reference (img2) dy" in viewer.layers

    mipmap = widgets["Occupancy mipmap"]
    viewer.open_sample("napari-gridmip", "occupancy")
    mipmap.layer.value = viewer.layers["occupancy volume"]
    _run(mipmap, qtbot)
    viewer.dims.ndisplay = 3
    viewer.scene.camera.angles = (10.0, -20.0, 30.0)
    _run(mipmap, qtbot, button=mipmap.render_button)  # reads the camera and the canvas size
    assert "occupancy volume render (MIP)" in viewer.layers
    mipmap.live_3d.native.click()  # follows the camera, the canvas size and the window's closing
    qtbot.waitUntil(lambda: any(p.final for p in mipmap._live.pictures), timeout=120_000)
    assert mipmap._live.pictures[-1].rgba.shape[:2] == tuple(viewer.canvas.size)
    mipmap.live_3d.native.click()
    assert mipmap._live is None


def test_a_plugin_widget_sees_its_viewer_close(make_napari_viewer, qtbot):
    """The viewer closed while the widget's job runs, seen through the viewer napari hands the widget (public API
    only): the result adds nothing to the closed viewer, before and after Qt deletes the dock."""
    from napari_gridmip._jobs import Job, JobResult
    from napari_gridmip._widgets.runner import viewer_closed

    viewer = make_napari_viewer()
    _, widget = viewer.window.add_plugin_dock_widget("napari-gridmip", "Correlation map")
    proxy, runner = widget._viewer, widget.runner
    assert not viewer_closed(proxy)
    release = threading.Event()

    def work(progress):
        release.wait(10)
        return JobResult(layers=[(np.zeros((4, 4)), {"name": "late"}, "image")], summary="late")

    runner.start(Job("late", work))
    viewer.close()
    assert viewer_closed(proxy) and viewer_closed(viewer)  # at once, before Qt deletes the window and the dock
    release.set()
    qtbot.waitUntil(lambda: not runner.busy, timeout=20_000)
    qtbot.wait(50)
    assert runner._detached and "late" not in [layer.name for layer in viewer.layers]
    assert viewer_closed(proxy)  # and once Qt has deleted the window
