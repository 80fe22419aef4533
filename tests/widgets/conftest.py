import pytest


@pytest.fixture
def wait_idle(qtbot):
    """Wait until a widget's background job is over (its worker has finished)."""

    def wait(widget, timeout=60_000):
        qtbot.waitUntil(lambda: not widget.runner.busy, timeout=timeout)

    return wait


@pytest.fixture
def docked(make_napari_viewer, qtbot):
    """``docked(WidgetClass, show=False)`` -> ``(viewer, widget)``: a real viewer (shown with ``show``) with
    the widget docked in it.

    At the end the widget is released as closing its dock does (its job and any job started early
    cancelled, a live view stopped) and its workers are waited for, so that none outlives its viewer.
    """
    widgets = []

    def make(widget_class, *, show=False):
        viewer = make_napari_viewer(show=show)
        widget = widget_class(viewer)
        viewer.window.add_dock_widget(widget)
        widgets.append(widget)
        return viewer, widget

    yield make
    for widget in widgets:
        widget.release()
        qtbot.waitUntil(lambda w=widget: not w.runner.busy and not w.runner.prefetching, timeout=120_000)


class _Clipboard:
    """This test process's own clipboard: pytest-xdist's workers share one X display, and so the system
    clipboard, where one worker's "Copy as Python" could overwrite another's between click and read."""

    def __init__(self) -> None:
        self._text = ""

    def setText(self, text, *args):  # noqa: N802 - Qt's name
        self._text = text

    def text(self, *args):
        return self._text


@pytest.fixture(autouse=True)
def _private_clipboard(monkeypatch):
    from qtpy.QtWidgets import QApplication

    board = _Clipboard()
    monkeypatch.setattr(QApplication, "clipboard", staticmethod(lambda: board))
    return board
