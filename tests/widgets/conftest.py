import pytest


@pytest.fixture
def wait_idle(qtbot):
    """Wait until a widget's background job is over (its worker has finished)."""

    def wait(widget, timeout=60_000):
        qtbot.waitUntil(lambda: not widget.runner.busy, timeout=timeout)

    return wait


@pytest.fixture
def docked(make_napari_viewer):
    """``docked(WidgetClass)`` -> ``(viewer, widget)``: a real viewer with the widget docked in it."""

    def make(widget_class):
        viewer = make_napari_viewer()
        widget = widget_class(viewer)
        viewer.window.add_dock_widget(widget)
        return viewer, widget

    return make
