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


@pytest.fixture(autouse=True)
def _runs_ahead_end(qtbot):
    """A sample's run ahead (napari_gridmip._sample_data.ahead) belongs to no widget: it ends before the next test,
    which would otherwise share the cores with it."""
    yield
    from napari_gridmip._sample_data.ahead import running_ahead

    qtbot.waitUntil(lambda: not running_ahead(), timeout=120_000)


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


@pytest.fixture
def small_samples(monkeypatch, tmp_path):
    """The correlation samples at test size (the same recipes: only the sizes change, and the requests carry the
    options): seconds, not minutes. Kept on disk in this test's own folder: in the session's sample cache, keyed by
    the recipe's source alone, a small pair was read back as the full-size sample by a later test
    (test_full_size_samples_against_their_truth, run after the others: a median dy error of 0.094 px against its
    0.03)."""
    from functools import partial

    import napari_gridmip._sample_data as samples
    from napari_gridmip._sample_data import _cache, calcium, dic

    monkeypatch.setattr(_cache, "_folder", lambda: tmp_path / "samples")
    # the sizes the samples and their stand-ins (napari_gridmip._sample_data.ahead) read as they are made
    monkeypatch.setattr(dic, "DIC_SHAPE", (128, 144))
    monkeypatch.setattr(samples, "SPECKLE_FRAMES", 6)
    monkeypatch.setattr(samples, "SPECKLE_SHAPE", (64, 72))
    monkeypatch.setattr(calcium, "make_calcium_movie", partial(calcium.make_calcium_movie, 120, (40, 48), 5))
