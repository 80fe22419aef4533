"""Every widget's viewer lifetime: no duplicate connections, nothing left connected after its dock closes,
and its parameters remembered across sessions."""

import numpy as np
import pytest

from napari_gridmip._widgets.correlation_widget import CorrelationWidget
from napari_gridmip._widgets.mipmap_widget import MipmapWidget
from napari_gridmip._widgets.patches_widget import PatchesWidget
from napari_gridmip._widgets.tiled_widget import TiledWidget

WIDGETS = [MipmapWidget, PatchesWidget, TiledWidget, CorrelationWidget]


@pytest.mark.parametrize("widget_class", WIDGETS)
def test_closing_the_dock_disconnects_everything(widget_class, docked, monkeypatch):
    viewer, widget = docked(widget_class)
    calls = []
    # napari keeps (weak reference, method name) pairs and looks the method up at each event,
    # so patching the class counts every refresh that reaches the widget
    original = widget_class.reset_choices
    monkeypatch.setattr(widget_class, "reset_choices", lambda self, *a: (calls.append(a), original(self, *a)))

    viewer.add_image(np.zeros((4, 5, 6)), name="one")
    assert len(calls) == 1  # napari's own connection, not doubled by the widget
    viewer.add_image(np.zeros((4, 5, 6)), name="two")
    viewer.layers.move(0, 2)
    assert len(calls) == 3

    viewer.window.remove_dock_widget(widget.native)  # what the dock's close button does
    assert widget.released
    viewer.add_image(np.zeros((4, 5, 6)), name="three")
    viewer.layers.remove("one")
    viewer.layers.move(0, 2)
    viewer.layers["two"].name = "renamed"
    assert len(calls) == 3  # no callback reaches the closed widget


@pytest.mark.parametrize("widget_class", WIDGETS)
def test_choices_follow_the_layer_list_while_docked(widget_class, docked):
    viewer, widget = docked(widget_class)
    layer = viewer.add_image(np.zeros((4, 5, 6)), name="stack")
    first = getattr(widget, "img1", None) or widget[0]  # the correlation widget's first field is its mode
    assert layer in list(first.choices)


def test_settings_are_remembered_across_sessions(docked):
    _, widget = docked(CorrelationWidget)
    widget.window_rows.value = 15
    widget.subpixel.value = "refine"
    widget.spacing.value = 12
    _, again = docked(CorrelationWidget)  # a new session's widget
    assert (again.window_rows.value, again.subpixel.value, again.spacing.value) == (15, "refine", 12)

    _, mipmap = docked(MipmapWidget)
    mipmap.threshold.value = 0.25
    _, patches = docked(PatchesWidget)
    patches.blend.value = "hann"
    assert docked(MipmapWidget)[1].threshold.value == 0.25
    assert docked(PatchesWidget)[1].blend.value == "hann"
    assert docked(PatchesWidget)[1].layer.value is None  # layer choices are not remembered


def test_a_dock_closed_during_a_run_is_left_alone_and_freed(make_napari_viewer, qtbot):
    """The job ends after the dock is gone, and napari's task list (which keeps every worker for the session)
    does not keep the closed widget, and its result, alive."""
    import gc
    import weakref

    from qtpy.QtCore import QCoreApplication, QEvent

    viewer = make_napari_viewer()
    widget = MipmapWidget(viewer)  # not the docked fixture: it keeps its widgets
    viewer.window.add_dock_widget(widget)
    volume = np.zeros((32, 32, 32), np.float32)
    volume[4:9, 4:9, 4:9] = 1
    viewer.add_image(volume, name="volume")
    widget.reset_choices()
    widget.run_button.native.click()
    assert widget.runner.busy
    runner = widget.runner
    viewer.window.remove_dock_widget(widget.native)  # what the dock's close button does

    for _ in range(12_000):  # Qt deletes the dock's widgets while the job still runs (it compiles first)
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
        if not runner.busy:
            break
        qtbot.wait(5)
    qtbot.wait(20)
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    gone = weakref.ref(widget)
    del widget, runner  # the runner calls the widget back (on_idle)
    gc.collect()
    assert gone() is None


def test_closing_the_viewer_during_a_mipmap_run_touches_no_deleted_button(make_napari_viewer, qtbot):
    """The mipmap widget's Crop and Render buttons follow the runner; the job ends after the viewer (and every
    button) is gone, which raised RuntimeError from a deleted QPushButton before they followed only a docked one."""
    from qtpy.QtCore import QCoreApplication, QEvent

    viewer = make_napari_viewer()
    widget = MipmapWidget(viewer)
    viewer.window.add_dock_widget(widget)
    viewer.add_image(np.ones((64, 64, 64), np.float32), name="volume")
    widget.reset_choices()
    widget.run_button.native.click()
    runner = widget.runner
    viewer.close()

    def deleted_and_idle():
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
        return not runner.busy

    qtbot.waitUntil(deleted_and_idle, timeout=60_000)
    qtbot.wait(20)
    assert widget.released
